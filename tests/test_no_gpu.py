"""Behaviour on a machine without a CUDA driver or GPU (CI); skipped where a GPU exists."""

from __future__ import annotations

import pytest

_C = pytest.importorskip("flashcute._C")


def _has_gpu() -> bool:
    try:
        _C.device_capability(0)
    except RuntimeError:
        return False
    return True


pytestmark = pytest.mark.skipif(_has_gpu(), reason="a CUDA GPU is present")


def test_device_capability_raises_runtime_error():
    with pytest.raises(RuntimeError, match="CUDA"):
        _C.device_capability(0)


def test_default_backend_needs_no_gpu():
    assert _C.default_backend(80) == "ampere"
    assert _C.default_backend(86) == "ampere"
    assert _C.default_backend(90) in ("ampere", "hopper")


def test_choose_backend_needs_no_gpu():
    import flashcute
    from flashcute._dispatch import choose_backend

    ampere = flashcute.build_info()["backends"]["ampere"]
    with pytest.raises(RuntimeError, match="sm80 or newer"):
        choose_backend(None, 75)
    with pytest.raises(ValueError, match=r"backend='hopper'"):
        choose_backend("hopper", 86)
    headdim, dtype = ampere["head_dims"][0], ampere["dtypes"][0]
    assert choose_backend("ampere", 86, headdim=headdim, dtype=dtype) == _C.BACKEND_AMPERE
