"""The host-side launch plans of the Hopper path, compiled as plain C++ and run without a GPU.

``tests/host_plans/bwd_order.cpp`` includes ``cpp/bwd_tail_split.h`` (the plans are plain C++
so that the host API can size workspaces from them) and checks the backward's CTA order.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _compiler() -> str | None:
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return name
    return None


def test_backward_cta_order(tmp_path):
    cxx = _compiler()
    if cxx is None:
        pytest.skip("no C++ compiler on PATH")
    exe = tmp_path / "bwd_order"
    build = subprocess.run(
        [cxx, "-std=c++17", "-O1", f"-I{ROOT / 'cpp'}", str(ROOT / "tests/host_plans/bwd_order.cpp"), "-o", str(exe)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120,
    )
    assert build.returncode == 0, f"compiling bwd_order.cpp failed:\n{build.stdout}"
    run = subprocess.run([str(exe)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stdout
