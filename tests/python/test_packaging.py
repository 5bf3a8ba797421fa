"""pyproject.toml describes the package CMake builds: the same version, the
same component, a backend that drives this CMake project."""

from __future__ import annotations

import pathlib
import re

import pytest

import gpuverbs as gv

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_pyproject_builds_the_cmake_component_with_the_same_version():
    tomllib = pytest.importorskip("tomllib", reason="tomllib needs Python 3.11")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["build-system"]["build-backend"] == "scikit_build_core.build"
    assert project["project"]["name"] == "gpuverbs"
    assert project["project"]["version"] == gv.__version__
    cmake_version = re.search(r"project\(gpuverbs\s+VERSION (\S+)", (ROOT / "CMakeLists.txt").read_text()).group(1)
    assert cmake_version == gv.__version__
    assert project["tool"]["scikit-build"]["install"]["components"] == ["python"]
    assert project["tool"]["scikit-build"]["cmake"]["define"]["GPUVERBS_WITH_PYTHON"] == "ON"


def test_the_package_is_typed_and_ships_its_stubs():
    package = pathlib.Path(gv.__file__).parent
    assert (package / "py.typed").exists()
    assert (package / "_core.pyi").exists()
    stub = (package / "_core.pyi").read_text()
    for name in gv.__all__:
        if name in {"Access", "doctor", "connect_tcp", "device_queue_include_dir", "async_drive",
                    *[n for n in dir(gv.errors) if n[0].isupper()]}:
            continue
        assert re.search(rf"^(class|def) {name}\b", stub, re.M), f"{name} has no type in _core.pyi"
