"""gpuverbs.doctor() gives what gpuverbs-doctor --json gives, as dicts."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

import gpuverbs as gv


def test_doctor_has_the_same_findings_as_the_command():
    ours = gv.doctor()
    assert ours["schema"].startswith("gpuverbs-doctor/")
    assert ours["checks"] and all({"id", "status", "found", "advice"} <= c.keys() for c in ours["checks"])
    command = os.environ.get("GPUVERBS_DOCTOR")
    if not command:
        pytest.skip("GPUVERBS_DOCTOR names no gpuverbs-doctor to compare with")
    theirs = json.loads(subprocess.run([command, "--json"], capture_output=True, text=True, check=False).stdout)
    strip = lambda report: [(c["id"], c["status"], c["found"]) for c in report["checks"]]  # noqa: E731
    assert strip(ours) == strip(theirs)
    assert ours["worst"] == theirs["worst"]


def test_devices_lists_the_rig_and_opening_an_unknown_name_says_which_there_are():
    names = [d["name"] for d in gv.devices()]
    if not names:
        with pytest.raises(gv.Error) as caught:
            gv.Device.open_first()
        assert caught.value.code == gv.Errc.no_rdma_device
        return
    with pytest.raises(gv.Error) as caught:
        gv.Device.open("no_such_device")
    assert caught.value.code == gv.Errc.device_not_found
    assert names[0] in str(caught.value)
