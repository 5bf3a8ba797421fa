"""The Python package against the C++ it binds, without a device.

- gpuverbs/_core.pyi against the compiled module: mypy's stubtest (every name,
  property and class), and the argument lists pybind11 writes in each
  docstring (names, kinds, defaults, types), which stubtest cannot read.
- Every C++ struct the binding turns into a dict or an object carries all its
  members: each struct's members, read from its header, against what the
  binding's own converter makes of it (_core._struct_fields) or the class's
  attributes.
- The enums: gpuverbs.Errc and gpuverbs.Access against their C++ enumerators.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest

import gpuverbs
from gpuverbs import _core

ROOT = Path(__file__).resolve().parents[2]
HEADERS = ROOT / "include" / "gpuverbs"
# The package as built: the module, and the build's copy of src/python/gpuverbs (stubs included).
PACKAGE = Path(gpuverbs.__file__).resolve().parent
ALLOWLIST = Path(__file__).with_name("stubtest-allowlist.txt")

# --- the stubs against the module: stubtest ---------------------------------


def stubtest(package: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """mypy's stubtest over the gpuverbs._core of `package` (a gpuverbs folder: the module and its stubs)."""
    pytest.importorskip("mypy", reason="mypy is not installed for this interpreter")
    allowlists = ["--allowlist", str(ALLOWLIST)]
    build_dependent = tmp_path / "allowlist-this-build.txt"
    if _core.have_rdma_cm:
        # The same reason as the allowlist's other __init__ entries.
        build_dependent.write_text("gpuverbs._core.CmConnection.__init__\n")
    else:
        # Built without rdma_cm, the module has none of its names; the stubs declare them for builds with it.
        names = ("CmConnection", "CmListener", "cm_resolve")
        build_dependent.write_text("".join(f"gpuverbs._core.{name}\n" for name in names))
    allowlists += ["--allowlist", str(build_dependent)]
    # The same folder for both: mypy then reads the package as installed (it checks only the stubs).
    env = dict(os.environ, PYTHONPATH=str(package.parent), MYPYPATH=str(package.parent))
    # Run in tmp_path: mypy leaves its cache in the working folder.
    return subprocess.run([sys.executable, "-m", "mypy.stubtest", "--concise", *allowlists, "gpuverbs._core"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, check=False)


def test_stubtest_finds_no_drift(tmp_path):
    out = stubtest(PACKAGE, tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr


def test_stubtest_catches_a_drifted_stub(tmp_path):
    package = tmp_path / "drifted" / "gpuverbs"
    shutil.copytree(PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    stub = package / "_core.pyi"
    fileno = "    def fileno(self) -> int: ...\n"
    text = stub.read_text().replace(fileno, fileno + "    def no_such(self) -> int: ...\n", 1)  # in Context
    stub.write_text(text.replace("    @property\n    def qp_num(self) -> int: ...\n", "", 1))  # in Endpoint
    out = stubtest(package, tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "gpuverbs._core.Context.no_such is not present at runtime" in out.stdout, out.stdout
    assert "gpuverbs._core.Endpoint.qp_num is not present in stub" in out.stdout, out.stdout


# --- the stubs against the module: pybind11's signatures -----------------------

Parameter = Tuple[str, str, Optional[ast.expr], Optional[ast.expr]]  # name, kind, annotation, default


def parameters(args: ast.arguments) -> List[Parameter]:
    out: List[Parameter] = []
    positional = args.posonlyargs + args.args
    defaults: List[Optional[ast.expr]] = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    out += [(a.arg, "positional", a.annotation, d) for a, d in zip(positional, defaults)]
    if args.vararg:
        out.append((args.vararg.arg, "*args", args.vararg.annotation, None))
    out += [(a.arg, "keyword", a.annotation, d) for a, d in zip(args.kwonlyargs, args.kw_defaults)]
    if args.kwarg:
        out.append((args.kwarg.arg, "**kwargs", args.kwarg.annotation, None))
    return out


def pybind11_signatures(obj: Any) -> List[Tuple[List[Parameter], Optional[ast.expr]]]:
    """The signatures pybind11 wrote at the top of a function's docstring (one per overload)."""
    name = obj.__name__
    lines = (obj.__doc__ or "").splitlines()[:1]
    if lines == [f"{name}(*args, **kwargs)"]:  # overloaded: "1. name(...) -> ..." for each
        lines = [re.sub(r"^\d+\. ", "", line) for line in obj.__doc__.splitlines()
                 if re.match(rf"\d+\. {name}\(", line)]
    out = []
    for line in lines:
        if not line.startswith(f"{name}("):
            continue
        # C++ type names (a class bound after its user) and reprs are no Python: kept as names.
        text = re.sub(r"<[^<>]*>", "...", line).replace("::", "__")
        fn = ast.parse(f"def {text}: ...").body[0]
        assert isinstance(fn, ast.FunctionDef)
        out.append((parameters(fn.args), fn.returns))
    return out


def stub_definitions() -> Iterator[Tuple[str, Any, ast.FunctionDef]]:
    """(qualified name, runtime object, stub definition) for each function of the stubs bound by pybind11."""
    tree = ast.parse((PACKAGE / "_core.pyi").read_text())
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and hasattr(_core, node.name):
            yield node.name, getattr(_core, node.name), node
        elif isinstance(node, ast.ClassDef) and hasattr(_core, node.name):
            cls = getattr(_core, node.name)
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and not any(
                        isinstance(d, ast.Name) and d.id == "property" for d in item.decorator_list):
                    if item.name in vars(cls):
                        yield f"{node.name}.{item.name}", getattr(cls, item.name), item


def is_pybind11(obj: Any) -> bool:
    return type(obj).__name__ in {"builtin_function_or_method", "instancemethod"} and bool(obj.__doc__)


def value(node: Optional[ast.expr]) -> Any:
    """A default's value ([] and () alike: a stub writes an immutable one)."""
    if node is None:
        return None
    v = eval(compile(ast.Expression(node), "<default>", "eval"), {"__builtins__": {}})  # our own stub's literals
    return tuple(v) if isinstance(v, list) else v


# pybind11's name for a type -> the names the stubs may write for it.
# (None: pybind11 says nothing about it: py::object, py::handle, py::buffer, a capsule.)
SAME_TYPE: Dict[str, Optional[set[str]]] = {
    "object": None, "handle": None, "buffer": None, "capsule": None, "dict": {"Dict"}, "list": {"List", "array"},
    "tuple": {"Tuple"}, "List": {"List", "Sequence"}, "sequence": {"Sequence", "List"}}


def names_in(node: Optional[ast.expr]) -> set[str]:
    if node is None:
        return set()
    out = set()
    for n in ast.walk(node):
        if isinstance(n, (ast.Name, ast.Attribute)):
            out.add(n.id if isinstance(n, ast.Name) else n.attr)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str):  # a forward reference
            out |= names_in(ast.parse(n.value, mode="eval").body)
        elif isinstance(n, ast.Constant) and n.value is None:
            out.add("None")
    return out


def aliases(tree: ast.Module) -> Dict[str, set[str]]:
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            out[node.targets[0].id] = names_in(node.value)
    return out


def type_differs(runtime: Optional[ast.expr], stub: Optional[ast.expr], alias: Dict[str, set[str]]) -> bool:
    """Whether the stub's annotation leaves out the type pybind11 names (only where pybind11 names one)."""
    if runtime is None:
        return False
    runtime_name = ast.unparse(runtime)
    outer = runtime_name.split("[")[0].split(".")[-1]
    accepted = SAME_TYPE.get(outer, {outer})
    if accepted is None:
        return False
    written = names_in(stub)
    for name in list(written):
        written |= alias.get(name, set())
    if "Any" in written:
        return False
    return not accepted & written


def runtime_functions() -> Iterator[Tuple[str, Any]]:
    """Every function pybind11 made: the module's, the classes' methods and their properties' getters."""
    for name, obj in vars(_core).items():
        if is_pybind11(obj):
            yield name, obj
        for attribute, member in vars(obj).items() if isinstance(obj, type) else ():
            function = member.fget if isinstance(member, property) else getattr(obj, attribute)
            if is_pybind11(function):
                yield f"{name}.{attribute}", function


def test_the_bindings_name_every_type():
    leaked = [f"{name}: {f.__doc__.splitlines()[0]}" for name, f in runtime_functions()
              if "::" in f.__doc__.splitlines()[0]]
    assert len(list(runtime_functions())) > 100
    assert not leaked, "a C++ type in a signature (bind the class before its users: binding.hpp):\n" + "\n".join(leaked)


def test_the_stubs_have_the_bindings_signatures():
    tree = ast.parse((PACKAGE / "_core.pyi").read_text())
    alias = aliases(tree)
    problems = []
    checked = 0
    for qualified, obj, definition in stub_definitions():
        if not is_pybind11(obj):
            continue  # the package's Python (gpuverbs/__init__.py): stubtest reads its signatures itself
        signatures = pybind11_signatures(obj)
        assert signatures, f"{qualified}: no pybind11 signature in {obj.__doc__!r}"
        stub = parameters(definition.args)
        for runtime, returns in signatures:
            checked += 1
            where = f"{qualified}: pybind11 {[(p[0], p[1]) for p in runtime]}, stub {[(p[0], p[1]) for p in stub]}"
            if [(p[0], p[1]) for p in runtime] != [(p[0], p[1]) for p in stub]:
                problems.append(f"{where}: not the same arguments")
                continue
            for (name, _, r_type, r_default), (_, _, s_type, s_default) in zip(runtime, stub):
                if (r_default is None) != (s_default is None):
                    problems.append(f"{qualified}({name}): a default on one side only")
                elif s_default is not None and not (isinstance(s_default, ast.Constant) and s_default.value is ...):
                    if value(r_default) != value(s_default):
                        problems.append(f"{qualified}({name}): default {ast.unparse(r_default)} at runtime, "
                                        f"{ast.unparse(s_default)} in the stub")
                if name != "self" and type_differs(r_type, s_type, alias):
                    problems.append(f"{qualified}({name}): {ast.unparse(r_type)} at runtime, "
                                    f"{ast.unparse(s_type) if s_type else 'nothing'} in the stub")
            if type_differs(returns, definition.returns, alias):
                problems.append(f"{qualified}: returns {ast.unparse(returns)} at runtime, "
                                f"{ast.unparse(definition.returns) if definition.returns else 'nothing'} in the stub")
    assert checked > 50, f"only {checked} signatures read: did pybind11 change its docstrings?"
    assert not problems, "\n".join(problems)


# --- every struct's members in its Python form -----------------------------------


def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def braced(text: str, start: int) -> str:
    """What lies between the brace at `start` and the one that closes it."""
    depth = 0
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start + 1:i]
    raise ValueError("unbalanced braces")


def struct_body(text: str, name: str) -> Optional[str]:
    match = re.search(rf"\b(?:struct|class)\s+{name}\s*(?::[^{{;]*)?\{{", text)
    return braced(text, match.end() - 1) if match else None


def cpp_members(struct: str) -> List[str]:
    """The data members of a public header's struct ("Outer::Inner" for a nested one), in order."""
    outer, *inner = struct.split("::")
    bodies = []
    for header in sorted(HEADERS.rglob("*.hpp")):
        if "detail" in header.relative_to(HEADERS).parts:
            continue
        body = struct_body(strip_comments(header.read_text()), outer)
        if body is not None:
            bodies.append(body)
    assert len(bodies) == 1, f"struct {outer}: {len(bodies)} definitions in include/gpuverbs"
    body = bodies[0]
    for name in inner:
        found = struct_body(body, name)
        assert found is not None, f"struct {struct} not found"
        body = found
    members = []
    statement, depth = "", 0
    for ch in body:
        statement += ch
        depth += {"{": 1, "}": -1, "(": 1, ")": -1}.get(ch, 0)
        ended = depth == 0 and (ch == ";" or (ch == "}" and "(" in statement))  # a member or an inline function
        if not ended:
            continue
        s = re.sub(r"^\s*(public|private|protected)\s*:", "", statement).strip()
        statement = ""
        if not s.endswith(";") or re.match(r"(using|friend|static|struct|class|enum|template|typedef)\b", s):
            continue
        declaration = re.split(r"[={]", s[:-1], maxsplit=1)[0]
        if "(" in declaration:
            continue  # a function
        member = re.search(r"(\w+)\s*(\[[^]]*\])?\s*$", declaration)
        assert member, f"struct {struct}: cannot read {s!r}"
        members.append(member.group(1))
    return members


# How a Python form differs from its struct, each with why.
OMITTED = {("PortAttributes", "native"): "the raw ibv_port_attr: Python has no type for it"}
RENAMED = {("TransferReport::Rail", "busy"): "busy_seconds", ("RailHealth", "busy"): "busy_seconds"}  # a duration, as a float of seconds
ADDED = {("DeviceEvent", "description"), ("CmEvent", "description"), ("QueuePairFailure", "description")}  # what describe() says
FLATTENED = {("GpuRegistrationExplanation", "plan"): "GpuRegistrationPlan"}  # the plan's members, in the same dict

# Structs bound as classes of the same name (their members are attributes) rather than turned into dicts.
CLASSES = ("Endpoint", "Received", "RemoteMemory", "TransferReport", "Notification", "LeasedBlockList", "MeshPeer")
# A struct whose list is bound as one class: one attribute per member, each a sequence over the list.
LISTS = {"RemoteBlock": "RemoteBlocks"}


def python_names(struct: str) -> set[str]:
    """What the struct's Python form should carry."""
    out = set()
    for member in cpp_members(struct):
        if (struct, member) in OMITTED:
            continue
        if (struct, member) in FLATTENED:
            out |= python_names(FLATTENED[(struct, member)])
            continue
        out.add(RENAMED.get((struct, member), member))
    return out | {name for (s, name) in ADDED if s == struct}


def attributes(cls: type) -> set[str]:
    return {name for name, v in vars(cls).items() if not name.startswith("_") and isinstance(v, property)}


def test_every_struct_member_reaches_its_dict():
    forms = _core._struct_fields
    expected = {"PortAttributes", "DeviceInfo", "GidEntry", "DeviceEvent", "AsyncStatistics",
                "RegistrationCacheStatistics", "TransferReport::Rail", "GpuMemory", "Check", "GpuDirectProbes",
                "GpuRegistrationExplanation", "NotificationInbox::Statistics", "BlockLeasesStatistics", "RailHealth", "QueuePairFailure",
                "DeviceQueueProxyCounters", "DeviceQueueRailState"} | ({"CmEvent", "CmRejection"} if _core.have_rdma_cm else set())
    assert set(forms) == expected
    wrong = {s: (sorted(python_names(s) - set(keys)), sorted(set(keys) - python_names(s)))
             for s, keys in forms.items() if set(keys) != python_names(s)}
    assert not wrong, "struct: (members missing from its dict, keys that are no member): " + repr(wrong)


def test_the_cq_statistics_carry_waited_and_empty_polls():
    assert {"waited", "empty_polls"} <= set(_core._struct_fields["AsyncStatistics"])


def test_every_struct_member_reaches_its_class():
    for struct in CLASSES:
        assert attributes(getattr(_core, struct)) == python_names(struct), struct
    for struct, name in LISTS.items():
        plural = {m[:-1] + "ies" if m.endswith("y") else m + "s" for m in python_names(struct)}
        assert plural <= attributes(getattr(_core, name)), struct


def test_rejections_are_method_reason_tuples():
    # MemoryRegion.reasons, GpuDirectUnavailable.rejections and the explanation's "rejected" are (method, reason).
    assert cpp_members("Rejection") == ["method", "reason"]


def test_the_header_reader_sees_what_the_compiler_sees():
    assert cpp_members("TransferReport::Rail") == ["bytes", "error", "failure", "cause", "taken_over", "took_over", "busy"]
    assert cpp_members("Check") == ["ok", "reason"]  # its inline functions are no members
    assert "native" in cpp_members("PortAttributes")


# --- enum names from C++ -----------------------------------------------------------


def cpp_enumerators(name: str, header: str) -> Dict[str, Optional[int]]:
    """The enumerators of `enum class name` and their values where they are plain numbers (counting on)."""
    text = strip_comments((HEADERS / header).read_text())
    match = re.search(rf"\benum\s+class\s+{name}\b[^{{;]*\{{", text)
    assert match, f"enum class {name} not in {header}"
    out: Dict[str, Optional[int]] = {}
    next_value: Optional[int] = 0
    for item in filter(None, (i.strip() for i in braced(text, match.end() - 1).split(","))):
        enumerator, _, given = (part.strip() for part in item.partition("="))
        if given:
            next_value = int(given, 0) if re.fullmatch(r"\d+|0x[0-9a-fA-F]+", given) else None
        out[enumerator] = next_value
        next_value = None if next_value is None else next_value + 1
    return out


def test_errc_is_the_cpp_enum():
    cpp = cpp_enumerators("errc", "error.hpp")
    assert {name: int(member) for name, member in _core.Errc.__members__.items()} == cpp


def test_access_is_the_cpp_enum():
    cpp = cpp_enumerators("Access", "verbs/memory_region.hpp")
    assert list(_core._access_flags) == list(cpp)
    assert {name: int(m) for name, m in gpuverbs.Access.__members__.items()} == _core._access_flags
