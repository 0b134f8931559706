"""Shared pytest configuration: the ``gpu`` marker and its automatic skip."""

from __future__ import annotations

import functools

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped when none is usable)")


@functools.lru_cache(maxsize=1)
def gpu_capability() -> int | None:
    """Compute capability of CUDA device 0, or None without the extension, a driver or a GPU."""
    try:
        from flashcute import _C
    except ImportError:
        return None
    try:
        return int(_C.device_capability(0))
    except RuntimeError:
        return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items or gpu_capability() is not None:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU and the compiled extension flashcute._C")
    for item in gpu_items:
        item.add_marker(skip)
