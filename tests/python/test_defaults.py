"""Every Python default against its one source, the C++ option structs.

The bindings take their defaults from the C++ structs (`py::arg("retry_count")
= ConnectOptions{}.retry_count`), never from literals; this test holds them to
it without trusting the binding: it reads each default from the headers'
text (a struct member's initializer, a named constant) and compares it with
the default pybind11 wrote in the function's signature. Every default of the
module must be in SOURCES (its C++ source) or in PYTHON_ONLY (a parameter C++
does not default, with the reason): a new literal default fails here until it
is given a source.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Dict, Iterator

import pytest

from gpuverbs import _core
from test_stubs import pybind11_signatures, value

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "lib"))
from cxx_defaults import cxx_default  # noqa: E402  (the headers' reader, shared with scripts/check-doc-values)


# --- where each Python default comes from -------------------------------------

QP = {f: f"QueuePairOptions.{f}" for f in ("max_send_wr", "max_recv_wr", "max_send_sge", "max_recv_sge",
                                           "max_inline_data")}
SOURCES: Dict[str, Dict[str, str]] = {
    "PreparedQueuePair.__init__": {**QP, "port": "QueuePairOptions.port"},
    "PreparedQueuePair.connect": {f: f"ConnectOptions.{f}" for f in ("timeout", "retry_count", "rnr_retry_count")},
    "CmConnection.create_qp": QP,
    "CmConnection.accept": {"timeout": "=default_cm_timeout", "retry_count": "CmOptions.retry_count",
                            "rnr_retry_count": "CmOptions.rnr_retry_count"},
    "CmConnection.connect": {"timeout": "=default_cm_timeout", "retry_count": "CmOptions.retry_count",
                             "rnr_retry_count": "CmOptions.rnr_retry_count"},
    "CmListener.accept": {"timeout": "=default_cm_timeout"},
    "cm_resolve": {"timeout": "=default_cm_timeout"},
    "TcpChannel.exchange": {"timeout": "=default_bootstrap_timeout"},
    "TcpChannel.send": {"timeout": "=default_bootstrap_timeout"},
    "TcpChannel.receive": {"timeout": "=default_bootstrap_timeout"},
    "TcpListener.accept": {"timeout": "=default_bootstrap_timeout"},
    "tcp_connect": {"timeout": "=default_bootstrap_timeout"},
    "NotificationInbox.wait": {"timeout": "=default_bootstrap_timeout"},
    "NotificationInbox.__init__": {"slots": "NotificationInbox.default_slots"},
    "Mesh.__init__": {"name": "MeshOptions.name", "timeout": "MeshOptions.timeout",
                      **{f: f"MeshOptions.queue_pair.{f}" for f in QP},
                      "retry_count": "MeshOptions.connect.retry_count",
                      "rnr_retry_count": "MeshOptions.connect.rnr_retry_count"},
    "RedisRendezvous.__init__": {f: f"RedisOptions.{f}" for f in ("host", "port", "service", "ttl", "poll_interval",
                                                                  "command_timeout", "user")},
    "RedisRendezvous.fence": {"timeout": "MeshOptions.timeout"},
    "RedisRendezvous.lookup": {"timeout": "MeshOptions.timeout"},
    "PmixRendezvous.fence": {"timeout": "MeshOptions.timeout"},
    "PmixRendezvous.lookup": {"timeout": "MeshOptions.timeout"},
    "BlockLeases.__init__": {"ttl": "BlockLeasesOptions.ttl", "grace": "BlockLeasesOptions.grace"},
    "DeviceQueueProxy.__init__": {"batch": "DeviceQueueProxyOptions.batch",
                                  "request_timeout": "DeviceQueueProxyOptions.request_timeout"},
    "DeviceQueueProxy.drive_passes": {"passes": "DeviceQueueDriveOptions.passes"},
    "RailGroup.__init__": {f: f"RailGroupOptions.{f}" for f in ("cooldown", "smoothing", "min_measured_bytes",
                                                                "stripe_by_health")},
    "RegistrationCache.__init__": {"max_regions": "RegistrationCacheOptions.max_regions",
                                   "max_bytes": "RegistrationCacheOptions.max_bytes"},
    "GpuBuffer.__init__": {"gpu": "GpuBufferOptions.gpu"},
    "KvLayout.per_layer": {"halves": "KvLayout.halves"},
    "KvLayout.blocks_first": {"halves": "KvLayout.halves"},
    "KvLayout.one_tensor": {"halves": "KvLayout.halves"},
    "transfer": {"failover": "TransferOptions.failover", "doorbell_batch": "TransferOptions.doorbell_batch",
                 "notification_timeout": "TransferOptions.notification_timeout"},
    "Device.query_port": {"port": "QueuePairOptions.port"},
    "Device.gid_table": {"port": "QueuePairOptions.port"},
}

# Defaults C++ does not have (a parameter it requires, or one only Python takes), each with its reason.
PYTHON_ONLY: Dict[str, Dict[str, str]] = {
    "Context.__init__": {"polled": "selects AsyncOptions::mode; False is its default, event_driven"},
    "Context.run_one": {"timeout": "Python's own poll step; C++ runs an io_context"},
    "TcpChannel.receive": {"max_size": "Python's cap on one incoming record; C++ receive_record requires it"},
    "TcpListener.__init__": {"port": "0: the system picks one (as the C++ constructor)",
                             "address": "every interface (as the C++ constructor)"},
    "CmListener.__init__": {"port": "0: the system picks one (as the C++ constructor)"},
    "cm_resolve": {"source": "no source address (as the C++ function)"},
    "DeviceQueue.push": {"timeout": "C++ push takes an absolute deadline, which has no default",
                         "*": "a request's fields: positions and values, 0 or put, not options"},
    "DeviceQueue.quiet": {"timeout": "C++ quiet takes an absolute deadline, which has no default"},
    "PrometheusText.add_port": {"port": "the first port, as the C++ add_port"},
    "KvPool.describe": {"lease_ttl": "0: no lease (as the C++ describe)"},
    "_doctor_json": {"live": "DoctorOptions::live's default (true)"},
    "*": {"offset": "a position, not an option", "remote_offset": "a position, not an option",
          "access": "the access flags' default, spelled as ... in the stubs",
          "via": "GpuRegistration::automatic, by its Python name", "policy": "GpuRegistration::automatic, by its Python name"},
}


def bound_functions() -> Iterator[Tuple[str, Any]]:
    """(qualified name, object) of every function and method the module binds with pybind11."""
    for name, obj in vars(_core).items():
        if type(obj).__name__ == "builtin_function_or_method" and obj.__doc__:
            yield name, obj
        elif isinstance(obj, type):
            for attr, member in vars(obj).items():
                if type(member).__name__ in {"instancemethod", "builtin_function_or_method"} and member.__doc__:
                    yield f"{name}.{attr}", member
                elif isinstance(member, staticmethod) and getattr(member.__func__, "__doc__", None):
                    yield f"{name}.{attr}", member.__func__


def python_defaults() -> Dict[str, Dict[str, Any]]:
    """qualified name -> parameter -> its default as pybind11 wrote it (None, [] and () left out)."""
    out: Dict[str, Dict[str, Any]] = {}
    for qualified, obj in bound_functions():
        for params, _ in pybind11_signatures(obj):
            for name, _kind, _annotation, default in params:
                if default is None:
                    continue
                try:
                    v = value(default)
                except Exception:  # a C++ repr pybind11 could not turn into Python (an enum's): not a number
                    continue
                if v is None or v in ((), b""):
                    continue
                out.setdefault(qualified, {})[name] = v
    return out


PY = python_defaults()


def test_the_module_has_defaults_to_check():
    assert len(PY) > 20, PY  # else the signatures were not read and nothing below proves anything


@pytest.mark.parametrize("qualified,param,source",
                         [(q, p, s) for q, params in sorted(SOURCES.items()) for p, s in sorted(params.items())])
def test_a_python_default_is_its_cxx_default(qualified, param, source):
    if qualified.startswith("Cm") or qualified == "cm_resolve":
        if not _core.have_rdma_cm:
            pytest.skip("built without rdma_cm: the module has no CmConnection")
    if qualified.startswith("PmixRendezvous") and not hasattr(_core, "PmixRendezvous"):
        pytest.skip("built without PMIx")
    assert qualified in PY, f"{qualified} has no defaults in its signature (renamed? SOURCES must follow)"
    assert param in PY[qualified], f"{qualified}({param}=…) has no default in Python: C++ gives {source}"
    want = cxx_default(source)
    got = PY[qualified][param]
    if isinstance(want, float) or isinstance(got, float):
        assert got == pytest.approx(want), f"{qualified}({param}={got!r}) but C++ {source} is {want!r}"
    else:
        assert got == want and type(got) is type(want), f"{qualified}({param}={got!r}) but C++ {source} is {want!r}"


def test_every_python_default_has_a_cxx_source_or_a_reason():
    unexplained = []
    for qualified, params in sorted(PY.items()):
        for param in params:
            if param in SOURCES.get(qualified, {}):
                continue
            if param in PYTHON_ONLY.get(qualified, {}) or "*" in PYTHON_ONLY.get(qualified, {}):
                continue
            if param in PYTHON_ONLY["*"]:
                continue
            unexplained.append(f"{qualified}({param}={params[param]!r})")
    assert not unexplained, ("defaults with no C++ source in SOURCES and no reason in PYTHON_ONLY "
                             "(take them from the C++ option struct): " + ", ".join(unexplained))


def test_the_header_reader_reads_what_the_headers_say():
    # The reader itself: values a regression would misread (durations, shifts, nested structs, constants).
    assert cxx_default("ConnectOptions.retry_count") == 6
    assert cxx_default("TransferOptions.notification_timeout") == pytest.approx(5.0)
    assert cxx_default("RegistrationCacheOptions.max_bytes") == 4 << 30
    assert cxx_default("MeshOptions.connect.retry_count") == cxx_default("ConnectOptions.retry_count")
    assert cxx_default("=default_bootstrap_timeout") == pytest.approx(30.0)
    assert cxx_default("RedisOptions.host") == "127.0.0.1"
