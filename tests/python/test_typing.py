"""The package's types (gpuverbs/_core.pyi, the annotations) check the example with mypy."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import gpuverbs


def test_mypy_accepts_the_example_against_the_stubs():
    pytest.importorskip("mypy", reason="mypy is not installed for this interpreter")
    package = os.path.dirname(os.path.dirname(gpuverbs.__file__))
    env = dict(os.environ, MYPYPATH=package)
    out = subprocess.run([sys.executable, "-m", "mypy", "--ignore-missing-imports", "--no-incremental",
                          "--cache-dir", "/dev/null", "examples/python/kv_cache_transfer.py",
                          "examples/python/kv_connector.py"],
                         capture_output=True, text=True, env=env, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_misuse_is_caught_by_the_stubs(tmp_path):
    pytest.importorskip("mypy", reason="mypy is not installed for this interpreter")
    wrong = tmp_path / "wrong.py"
    wrong.write_text("import gpuverbs as gv\nqp: gv.QueuePair\nqp.write(b'x', 5)\n")
    package = os.path.dirname(os.path.dirname(gpuverbs.__file__))
    out = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", "/dev/null", str(wrong)], capture_output=True,
                         text=True, env=dict(os.environ, MYPYPATH=package), check=False)
    assert out.returncode == 1 and "write" in out.stdout, out.stdout
