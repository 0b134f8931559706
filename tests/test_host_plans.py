"""The host-side launch plans of the Hopper path, compiled and run without a GPU.

``tests/host_plans/bwd_order.cpp`` includes ``cpp/bwd_tail_split.h`` (the plans are plain C++
so that the host API can size workspaces from them) and checks the backward's CTA order.
``tests/host_plans/fwd_schedule.cu`` checks the forward's unit decode
(``cpp/hopper/tile_scheduler.h``) and ``tests/host_plans/fp8_transpose.cu`` the FP8 V
transpose's unit addresses (``cpp/hopper/fwd_v_transpose_units.h``) as host code, and
``tests/host_plans/gmma_shapes.cu`` the WGMMA instructions of the default tiles without CuTe's
extended shapes (``cpp/hopper/gmma_extra_shapes.h``), ``tests/host_plans/gmma_smem_atom.cu`` the
shared-memory atoms of ``cpp/hopper/gmma_smem_atom.h`` against CUTLASS's selector: they need nvcc
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
    generated = _empty_tile_overrides(tmp_path)
    _run_cuda_host_check(tmp_path, "fp8_transpose", ["--expt-relaxed-constexpr", f"-I{generated}"])


def _empty_tile_overrides(tmp_path: Path) -> Path:
    """The tile headers CMake generates, empty: the default tiles."""
    generated = tmp_path / "generated"
    generated.mkdir(exist_ok=True)
    for header in ("hopper_tile_overrides.h", "hopper_fp8_tile_overrides.h", "hopper_bwd_tile_overrides.h"):
        (generated / header).write_text("#pragma once\n")
    return generated


def test_default_tiles_need_no_extended_gmma_shapes(tmp_path):
    # As the default build compiles the Hopper units: without CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED.
    generated = _empty_tile_overrides(tmp_path)
    _run_cuda_host_check(tmp_path, "gmma_shapes", ["--expt-relaxed-constexpr", f"-I{generated}"])


def test_smem_atoms_match_cutlass_selector(tmp_path):
    _run_cuda_host_check(tmp_path, "gmma_smem_atom", ["--expt-relaxed-constexpr"])


def test_tile_override_needing_extended_shapes_is_refused_without_them(tmp_path):
    # A 144-key block has no WGMMA of that N without CuTe's extended shapes: the traits' assert
    # stops the build (CMake defines the switch whenever tile overrides are given).
    nvcc, cutlass = _nvcc(), _cutlass_include()
    if nvcc is None or cutlass is None:
        pytest.skip("needs nvcc and the CUTLASS headers (pip install nvidia-cutlass==4.2.0.0)")
    generated = _empty_tile_overrides(tmp_path)
    (generated / "hopper_tile_overrides.h").write_text("#pragma once\n#define FLASHCUTE_HOPPER_TILE_128 144, 2, 2\n")
    build = subprocess.run(
        [nvcc, "-std=c++17", "--expt-relaxed-constexpr", f"-I{generated}", f"-I{ROOT / 'cpp'}", f"-I{cutlass}",
         "-c", str(ROOT / "tests/host_plans/gmma_shapes.cu"), "-o", str(tmp_path / "x.o")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300,
    )
    assert build.returncode != 0 and "one WGMMA spans each GEMM's N" in build.stdout, build.stdout[-2000:]


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
