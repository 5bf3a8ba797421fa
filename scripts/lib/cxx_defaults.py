"""The defaults the C++ headers write, read from their text (no compiler).

Used by tests/python/test_defaults.py (every Python default against its C++
source) and scripts/check-doc-values (every default the docs state against
the headers). A struct's member initializers (`int retry_count = 6;`,
`std::chrono::milliseconds ttl{10000};`, `std::size_t max_bytes =
std::size_t{4} << 30;`), members of struct type followed to their struct
(`MeshOptions.connect.retry_count`) and namespace constants (`inline
constexpr std::chrono::milliseconds default_bootstrap_timeout{30000};`).
Durations come back in seconds.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

ROOT = Path(__file__).resolve().parents[2]
HEADERS = ROOT / "include" / "gpuverbs"

DURATIONS = {"nanoseconds": 1e-9, "microseconds": 1e-6, "milliseconds": 1e-3, "seconds": 1.0}


def header_text() -> str:
    return "\n".join(p.read_text() for p in sorted(HEADERS.rglob("*.hpp")))


def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def evaluate(type_: str, init: str) -> Any:
    """A C++ initializer as the Python value the binding must show (a duration in seconds)."""
    init = init.strip()
    unit = re.search(r"chrono::(\w+)$", type_.strip())
    if unit and unit.group(1) in DURATIONS:
        return float(evaluate("long", init)) * DURATIONS[unit.group(1)]
    if init in ("true", "false"):
        return init == "true"
    if init.startswith('"'):
        return init.strip('"')
    expr = re.sub(r"std::(?:size_t|uint\d+_t|int\d+_t)\{([^}]*)\}", r"(\1)", init)
    expr = re.sub(r"(\d)(?:ULL|ull|UL|ul|U|u|LL|ll)\b", r"\1", expr)
    if not re.fullmatch(r"[\d\s.()<>+*-]+", expr):
        raise ValueError(f"cannot evaluate the C++ initializer {init!r}")
    return eval(expr, {"__builtins__": {}})  # digits and operators only (checked above)


def struct_members(text: str) -> Dict[str, Dict[str, Tuple[str, Optional[str]]]]:
    """struct/class name -> member -> (type, initializer or None), members at the body's top level."""
    out: Dict[str, Dict[str, Tuple[str, Optional[str]]]] = {}
    for m in re.finditer(r"\b(?:struct|class)\s+(\w+)\s*(?:final\s*)?(?::[^{;()]*)?\{", text):
        depth, i, statement, pieces, body = 1, m.end(), [], [], False
        while i < len(text) and depth > 0:
            c = text[i]
            i += 1
            if c == "{":
                if depth == 1:
                    # A function's body or a nested type's, or a brace initializer (`x{5}`, `T{4} << 30`).
                    so_far = "".join(statement)
                    body = "(" in so_far or bool(re.match(r"\s*(?:(?:public|private|protected):\s*)*"
                                                         r"(?:struct|class|enum|union)\b", so_far))
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 1:
                    if body:
                        statement = []  # what a body held is no member
                    else:
                        statement.append(c)
                    continue
            if depth >= 1:
                statement.append(c)
            if depth == 1 and c == ";":
                pieces.append("".join(statement))
                statement = []
        members = out.setdefault(m.group(1), {})
        for piece in pieces:
            s = " ".join(piece.split()).rstrip(";").strip()
            s = re.sub(r"^(?:(?:public|private|protected):\s*)+", "", s)
            if "(" in s.split("{")[0].split("=")[0] or s.startswith(("using", "friend", "enum", "template")):
                continue
            d = re.fullmatch(r"(?:static\s+constexpr\s+|inline\s+)*([\w:<>,\s]+?)\s+(\w+)\s*(?:=\s*(.+)|\{(.*)\})?", s)
            if d:
                members[d.group(2)] = (d.group(1), d.group(3) if d.group(3) is not None else d.group(4))
    return out


def constants(text: str) -> Dict[str, Tuple[str, str]]:
    """Namespace-level `inline constexpr TYPE NAME{V}` / `= V`."""
    return {m.group(2): (m.group(1), m.group(3) or m.group(4))
            for m in re.finditer(r"inline\s+constexpr\s+([\w:]+)\s+(\w+)\s*(?:=\s*([^;]+)|\{([^}]*)\});", text)}


TEXT = strip_comments(header_text())
STRUCTS = struct_members(TEXT)
CONSTANTS = constants(TEXT)


def cxx_default(source: str) -> Any:
    """`Struct.member[.member…]` (a member's initializer, a member of struct type followed to its
    struct) or `=name` (a namespace constant)."""
    if source.startswith("="):
        type_, init = CONSTANTS[source[1:]]
        return evaluate(type_, init)
    struct, *path = source.split(".")
    for k, member in enumerate(path):
        type_, init = STRUCTS[struct][member]
        if k + 1 < len(path):
            struct = type_.split("::")[-1]
            continue
        if init is None and type_ == "std::string":
            return ""  # a string member with no initializer starts empty
        if init is None:
            raise ValueError(f"{source}: the header gives no initializer")
        return evaluate(type_, init)
    raise ValueError(source)


