"""flashcute.build_info() and the package surface that needs no GPU."""

from __future__ import annotations

import os
import sys

import pytest

import flashcute

SUPPORTED_HEAD_DIMS = {32, 64, 96, 128, 192, 256}


def test_package_surface():
    assert isinstance(flashcute.__version__, str) and flashcute.__version__
    assert callable(flashcute.attention)
    assert flashcute.reference.attention is not None
    prefix = flashcute.cmake_prefix_path()
    assert os.path.isdir(prefix)
    assert os.path.samefile(prefix, os.path.dirname(flashcute.__file__))


def test_build_info_keys_and_types():
    pytest.importorskip("flashcute._C")
    info = flashcute.build_info()
    assert set(info) == {"version", "cuda_archs", "cuda_runtime_version", "backends"}
    assert isinstance(info["version"], str) and info["version"]
    assert isinstance(info["cuda_archs"], list)
    assert all(isinstance(arch, str) and arch for arch in info["cuda_archs"])
    assert isinstance(info["cuda_runtime_version"], int)
    assert set(info["backends"]) == {"ampere", "hopper"}
    for backend in info["backends"].values():
        assert set(backend) == {"head_dims", "backward_head_dims", "dtypes"}
        assert all(isinstance(d, int) for d in backend["head_dims"])
        assert set(backend["head_dims"]) <= SUPPORTED_HEAD_DIMS
        assert set(backend["backward_head_dims"]) <= set(backend["head_dims"])
        assert set(backend["dtypes"]) <= {"float16", "bfloat16"}


def test_ampere_backend_is_built():
    pytest.importorskip("flashcute._C")
    ampere = flashcute.build_info()["backends"]["ampere"]
    assert ampere["head_dims"], "the Ampere path should always be built"
    assert set(ampere["head_dims"]) <= SUPPORTED_HEAD_DIMS


def test_build_info_returns_a_copy():
    pytest.importorskip("flashcute._C")
    info = flashcute.build_info()
    info["backends"]["ampere"]["head_dims"].clear()
    assert flashcute.build_info()["backends"]["ampere"]["head_dims"]


def test_missing_extension_is_reported(monkeypatch):
    torch = pytest.importorskip("torch")
    from flashcute import _build_info

    monkeypatch.setitem(sys.modules, "flashcute._C", None)  # makes the import fail
    monkeypatch.setattr(_build_info, "_extension", None)  # forget an earlier successful load
    _build_info._cached_build_info.cache_clear()
    try:
        with pytest.raises(ImportError, match=r"flashcute\._C is missing.*pip install \."):
            flashcute.build_info()
        q = torch.zeros(1, 2, 1, 64, dtype=torch.float16)
        with pytest.raises(ImportError, match=r"pip install \."):
            flashcute.attention(q, q, q)
    finally:
        _build_info._cached_build_info.cache_clear()


def test_backward_workspace_reserves_split_sums_only_without_causal():
    """The Hopper path's workspace: without causal masking, room for the fp32 dK/dV sums of up
    to an eighth of the key-block CTAs (the last wave may run split); causal calls need none."""
    ext = pytest.importorskip("flashcute._C")
    if 64 not in flashcute.build_info()["backends"]["hopper"]["backward_head_dims"]:
        pytest.skip("no Hopper-path backward for hd 64 in this build")
    # 2 batches × 6 kv heads × 12 key blocks of 128 = 144 CTAs: room for 18 split tiles.
    args = (2, 1500, 1500, 12, 6, 64, "bfloat16", False, ext.BACKEND_HOPPER)
    full = ext.backward_workspace_size(*args, causal=False)
    causal = ext.backward_workspace_size(*args, causal=True)
    counters = 80  # 18 int32 counters, padded to 16 bytes
    assert full - causal == counters + 18 * 2 * 128 * 64 * 4
    ampere = args[:-1] + (ext.BACKEND_AMPERE,)
    assert ext.backward_workspace_size(*ampere, causal=False) == ext.backward_workspace_size(
        *ampere, causal=True
    )
