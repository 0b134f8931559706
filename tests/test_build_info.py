"""flashcute.build_info() and the package surface that needs no GPU."""

from __future__ import annotations

import math
import os
import sys

import pytest

import flashcute

SUPPORTED_HEAD_DIMS = {32, 64, 96, 128, 192, 256}


def test_package_surface():
    assert isinstance(flashcute.__version__, str) and flashcute.__version__
    assert callable(flashcute.attention)
    prefix = flashcute.cmake_prefix_path()
    assert os.path.isdir(prefix)
    assert os.path.samefile(prefix, os.path.dirname(flashcute.__file__))


def test_reference_is_importable_on_request():
    pytest.importorskip("torch")  # flashcute.reference is plain PyTorch
    assert flashcute.reference.attention is not None


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
        assert set(backend) == {"head_dims", "backward_head_dims", "dtypes", "head_dim_pairs", "fp8_head_dims",
                                "sm90_head_dims"}
        assert set(backend["sm90_head_dims"]) <= set(backend["head_dims"])
        assert all(len(pair) == 2 and all(isinstance(d, int) for d in pair)
                   for pair in backend["head_dim_pairs"])
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


def test_extension_with_names_the_missing_feature(monkeypatch):
    import types

    from flashcute import _build_info, kvcache, quantize

    monkeypatch.setattr(_build_info, "_extension", types.SimpleNamespace(kvcache_forward=None, merge_states=None))
    assert kvcache.merge_extension() is _build_info._extension
    with pytest.raises(ImportError, match=r"has no KV-cache attention \(kvcache_forward\); reinstall"):
        kvcache.kvcache_extension()  # kvcache_plan is missing
    with pytest.raises(ImportError, match=r"has no quantize_fp8; reinstall the package with `pip install \.`"):
        quantize.quantize_extension()


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


@pytest.mark.parametrize(
    "units, key_blocks, sms",
    [(2048, 128, 132), (2048, 64, 132), (1024, 205, 132), (64, 128, 132), (36, 40, 132),
     (2, 157, 132), (400, 100, 114), (97, 1000, 78), (2, 114, 132), (10, 20, 132), (3, 60, 132),
     (8, 235, 132), (16, 24, 132)],
)
def test_forward_split_plan_covers_every_key_block_once(units, key_blocks, sms):
    """The forward's last wave shared by all CTAs: whole units are a multiple of the grid, the
    CTAs' ranges cover the split tiles' key blocks end to end with no gap or overlap, none is
    longer than a tile (so a CTA runs at most two pieces), every range is at least two blocks,
    and the pieces of a tile leave their states in distinct slots (2 per CTA). Fewer tiles than
    SMs with fewer than two blocks per SM run on one CTA per two blocks, and fewer tiles than SMs
    get at most ceil(sqrt(key blocks)) pieces each (their merge reads the pieces in turn)."""
    ext = pytest.importorskip("flashcute._C")
    whole, tiles, ctas, begins, slots = ext._forward_split_plan(units, key_blocks, sms)
    assert tiles > 0, "these shapes leave SMs idle for most of a tile: the plan must split"
    if units < sms:  # tiles that do not fill the GPU are split even when some are partial
        assert ext._forward_split_plan(units, key_blocks, sms, True)[1] == tiles
    assert whole + tiles == units
    blocks = tiles * key_blocks
    expected = sms if blocks >= 2 * sms else blocks // 2
    if units < sms:
        expected = min(expected, units * (math.isqrt(key_blocks - 1) + 1))
    assert ctas == expected and ctas > tiles
    assert whole % ctas == 0 and tiles == units % sms
    assert begins[0] == 0 and begins[-1] == tiles * key_blocks and len(begins) == ctas + 1
    lengths = [b - a for a, b in zip(begins, begins[1:])]
    assert min(lengths) >= 2 and max(lengths) <= key_blocks
    seen = set()
    for tile, tile_slots in enumerate(slots):
        lo, hi = tile * key_blocks, (tile + 1) * key_blocks
        touching = [c for c in range(ctas) if begins[c] < hi and begins[c + 1] > lo]
        assert len(tile_slots) == len(touching) >= 1
        for cta, slot in zip(touching, tile_slots):
            assert slot // 2 == cta and (slot % 2 == 0) == (begins[cta] >= lo)
            assert slot not in seen
            seen.add(slot)


@pytest.mark.parametrize(
    "units, key_blocks, sms, pieces",
    [(2, 171, 132, 33), (4, 205, 132, 17), (8, 187, 132, 14), (16, 32, 132, 6), (2, 40, 132, 20),
     (3, 60, 132, 22), (32, 47, 132, 7)],
)
def test_forward_split_plan_few_rows(units, key_blocks, sms, pieces):
    """Tiles with few query rows merge a batch of pieces per L2 round trip, so fewer tiles than
    SMs get ceil(sqrt(key blocks)) pieces or enough to fill half the SMs, whichever is more,
    and at most one per two key blocks; the grid is the tiles' pieces, up to the SM count."""
    ext = pytest.importorskip("flashcute._C")
    whole, tiles, ctas, begins, slots = ext._forward_split_plan(units, key_blocks, sms, False, True)
    assert whole == 0 and tiles == units
    assert ctas == min(sms, units * pieces)
    lengths = [b - a for a, b in zip(begins, begins[1:])]
    assert min(lengths) >= 2


@pytest.mark.parametrize(
    "units, key_blocks, sms, partial",
    [(2048, 16, 132, False), (2048, 8, 132, False), (1024, 26, 132, False), (1024, 103, 132, False),
     (88, 32, 132, False), (128, 256, 132, False), (2048, 128, 132, True), (1056, 64, 132, False),
     (10, 3, 132, False), (1, 1, 132, False), (133, 1, 132, False), (0, 10, 132, False),
     (100, 0, 132, False)],
)
def test_forward_split_plan_keeps_short_or_even_waves_whole(units, key_blocks, sms, partial):
    """No split where it would not save a fifth of a tile: few key blocks per tile (hd 128 at
    2k and 1k, hd 256 at 2k), a last wave that is already most of the SMs (hd 256 at 8k: 100 of
    132), tiles that nearly fill the GPU; nor with more tiles than SMs when some are partial
    (they run last), a tile count that is a multiple of the SM count, too few key blocks for two
    per CTA, or none."""
    ext = pytest.importorskip("flashcute._C")
    whole, tiles, ctas, begins, slots = ext._forward_split_plan(units, key_blocks, sms, partial)
    assert (whole, tiles, begins, slots) == (units, 0, [], [])


@pytest.mark.parametrize(
    "headdim, seqlen_q, seqlen_k, causal, tile",
    [(128, 1024, 8192, False, (64, 3)), (128, 1, 100000, False, (64, 3)),
     (128, 1024, 8191, False, (64, 3)), (128, 16384, 16384, True, (64, 3)),
     (128, 16384, 16383, True, (64, 3)), (128, 700, 9000, True, (64, 3)),
     (128, 20000, 8192, True, (64, 3)), (64, 1, 100000, False, (128, 3)),
     (256, 1, 100000, False, (80, 2)), (96, 1, 100000, True, (64, 3)),
     (64, 512, 512, True, (64, 3)), (64, 1024, 1024, True, (64, 3)), (64, 1026, 1026, True, (128, 3)),
     (64, 1, 512, True, (64, 3)), (64, 1, 513, True, (128, 3)), (64, 3000, 1000, True, (64, 3)),
     (64, 512, 512, False, (128, 3)), (128, 512, 512, True, (64, 3)), (256, 512, 512, True, (80, 2))],
)
def test_forward_second_tile(headdim, seqlen_q, seqlen_k, causal, tile):
    """Causal hd 64 takes its 64-key tile while its rows see at most 512 keys on average (causal
    rows see seqlen_k - seqlen_q / 2); other head dims keep one tile, hd 128 at every key range."""
    ext = pytest.importorskip("flashcute._C")
    assert tuple(ext._forward_tile(headdim, seqlen_q, seqlen_k, causal)) == tile


@pytest.mark.parametrize(
    "nheads, nheads_kv, seqlen_q, seqlen_k, headdim, causal, packed",
    [(32, 8, 1, 30000, 128, False, 4), (8, 2, 1, 333, 128, True, 4), (64, 1, 1, 17, 64, True, 64),
     (16, 2, 5, 1000, 256, False, 8), (12, 3, 40, 700, 128, False, 4), (8, 4, 40, 700, 128, False, 2),
     (8, 2, 100, 700, 128, False, 4), (8, 2, 150, 700, 128, False, 1),
     (8, 2, 100, 700, 64, False, 4), (6, 2, 3, 5000, 128, False, 1),
     (32, 2, 7, 4000, 128, True, 1), (32, 8, 1, 4000, 96, False, 1), (128, 1, 1, 4000, 128, False, 1),
     (16, 16, 1, 4000, 128, False, 1)],
)
def test_forward_packs_query_heads(nheads, nheads_kv, seqlen_q, seqlen_k, headdim, causal, packed):
    """The Hopper forward packs a group's G query heads into a tile's rows only where G divides
    64, the head dim is a multiple of 64, no causal mask applies (or one query row), and packing
    needs fewer query tiles (hd 64 and 128 tiles hold 192 rows, hd 256 tiles 128)."""
    ext = pytest.importorskip("flashcute._C")
    assert ext._forward_packed_heads(nheads, nheads_kv, seqlen_q, seqlen_k, headdim, causal) == packed


def test_forward_workspace_is_zero_without_a_hopper_gpu_or_with_causal():
    """The forward's optional workspace: only the Hopper path on an sm90 device asks for one,
    and never with causal masking."""
    ext = pytest.importorskip("flashcute._C")
    args = (1, 700, 5000, 6, 2, 128, "bfloat16")
    assert ext.forward_workspace_size(*args, True, ext.BACKEND_HOPPER, -1) == 0
    assert ext.forward_workspace_size(*args, False, ext.BACKEND_AMPERE, -1) == 0
    try:
        capability = ext.device_capability(-1)
    except RuntimeError:
        capability = None
    if capability != 90:
        assert ext.forward_workspace_size(*args, False, ext.BACKEND_HOPPER, -1) == 0
