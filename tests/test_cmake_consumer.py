"""A downstream CMake project builds against the installed C++ package and runs without a GPU.

tests/cmake_consumer does ``find_package(flashcute CONFIG REQUIRED)`` with
``CMAKE_PREFIX_PATH=flashcute.cmake_prefix_path()``, links ``flashcute::flashcute``, and its
binary checks argument validation (forward and backward), the backward's workspace size and
the no-device path of the library.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

flashcute = pytest.importorskip("flashcute")

CONSUMER_DIR = Path(__file__).resolve().parent / "cmake_consumer"


def _run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout
    )


def _check(result: subprocess.CompletedProcess, what: str) -> None:
    assert result.returncode == 0, (
        f"{what} failed with exit code {result.returncode}:\n"
        f"$ {' '.join(map(str, result.args))}\n{result.stdout}"
    )


def test_cmake_consumer(tmp_path):
    cmake = shutil.which("cmake")
    if cmake is None:
        pytest.skip("cmake is not on PATH")
    prefix = flashcute.cmake_prefix_path()
    config = Path(prefix, "lib", "cmake", "flashcute", "flashcuteConfig.cmake")
    if not config.is_file():
        pytest.skip(f"the flashcute C++ package is not installed ({config} is missing)")
    pytest.importorskip("flashcute._C")
    version = flashcute.build_info()["version"]

    build = tmp_path / "build"
    configure = [cmake, "-S", str(CONSUMER_DIR), "-B", str(build), f"-DCMAKE_PREFIX_PATH={prefix}",
                 "-DCMAKE_BUILD_TYPE=Release"]
    if shutil.which("ninja"):
        configure += ["-G", "Ninja"]
    _check(_run(configure, timeout=300), "configuring the consumer")
    _check(_run([cmake, "--build", str(build)], timeout=300), "building the consumer")

    exe = build / ("consumer.exe" if os.name == "nt" else "consumer")
    assert exe.is_file(), f"the consumer binary is not at {exe}"
    result = _run([str(exe)], timeout=60)
    _check(result, "running the consumer")
    assert f"flashcute version: {version}" in result.stdout, result.stdout
    assert "invalid call rejected:" in result.stdout, result.stdout
    assert "invalid alibi slopes rejected" in result.stdout, result.stdout
    assert (
        "backward workspace: 66560 bytes (deterministic: 1024); invalid backward rejected:"
        in result.stdout
    ), result.stdout
    assert "device 0: sm" in result.stdout or "no device:" in result.stdout, result.stdout
