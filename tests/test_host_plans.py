"""The host-side launch plans of the Hopper path, compiled and run without a GPU.

``tests/host_plans/bwd_order.cpp`` includes ``cpp/bwd_tail_split.h`` (the plans are plain C++
so that the host API can size workspaces from them) and checks the backward's CTA order.
``tests/host_plans/fwd_schedule.cu`` checks the forward's unit decode
(``cpp/hopper/tile_scheduler.h``) and ``tests/host_plans/fp8_transpose.cu`` the FP8 V
transpose's unit addresses (``cpp/hopper/fwd_v_transpose_units.h``) as host code: they need nvcc
and the CUTLASS headers (the nvidia-cutlass package, or ``CUTLASS_DIR``) and are skipped without
them.
"""

from __future__ import annotations

import importlib.util
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


def _nvcc() -> str | None:
    for candidate in (shutil.which("nvcc"), os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")):
        if candidate and os.path.isfile(candidate):
            return candidate
    return None


def _cutlass_include() -> Path | None:
    """CUTLASS's include directory, found as the build finds it (cmake/FlashcuteCutlass.cmake)."""
    roots = [Path(os.environ["CUTLASS_DIR"])] if os.environ.get("CUTLASS_DIR") else []
    spec = importlib.util.find_spec("cutlass_library")
    if spec is not None and spec.submodule_search_locations:
        roots.append(Path(list(spec.submodule_search_locations)[0]) / "source")
    for root in roots:
        if (root / "include" / "cute" / "tensor.hpp").is_file():
            return root / "include"
    return None


def _run_cuda_host_check(tmp_path: Path, name: str, extra_flags: list[str]) -> None:
    """Compiles tests/host_plans/<name>.cu as host code and expects it to print "ok"."""
    nvcc, cutlass = _nvcc(), _cutlass_include()
    if nvcc is None or cutlass is None:
        pytest.skip("needs nvcc and the CUTLASS headers (pip install nvidia-cutlass==4.2.0.0)")
    exe = tmp_path / name
    build = subprocess.run(
        [nvcc, "-std=c++17", *extra_flags, f"-I{ROOT / 'cpp'}", f"-I{cutlass}",
         str(ROOT / f"tests/host_plans/{name}.cu"), "-o", str(exe)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300,
    )
    assert build.returncode == 0, f"compiling {name}.cu failed:\n{build.stdout}"
    run = subprocess.run([str(exe)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stdout


def test_forward_unit_decode(tmp_path):
    _run_cuda_host_check(tmp_path, "fwd_schedule", [])


def test_fp8_transpose_addresses(tmp_path):
    # The tile headers CMake generates, empty: the default tiles.
    generated = tmp_path / "generated"
    generated.mkdir()
    for header in ("hopper_tile_overrides.h", "hopper_fp8_tile_overrides.h"):
        (generated / header).write_text("#pragma once\n")
    _run_cuda_host_check(tmp_path, "fp8_transpose", ["--expt-relaxed-constexpr", f"-I{generated}"])


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
