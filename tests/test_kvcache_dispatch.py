"""Which path runs an ``attention_with_kvcache`` call: the library's dispatch policy
(``_C._choose_kernel_in``) on stand-in builds, without a GPU.

Prefill-sized calls (128 query rows per sequence or more) run on the Hopper path on sm90,
contiguous or with pages that its TMA boxes read (multiples of 16 keys, kernels of head dims that
are multiples of 64); from 1024 query rows per K/V head, pages those boxes read in fewer than 64
rows or cannot read are copied into a contiguous workspace first where one may be allocated (up
to 256 MiB); decoding, other page sizes and other GPUs run the Ampere path's kernels."""

from __future__ import annotations

import pytest

_C = pytest.importorskip("flashcute._C")

BOTH = {
    path: {"head_dims": [64, 96, 128, 192, 256], "backward_head_dims": [64, 128, 256],
           "dtypes": ["float16", "bfloat16"]}
    for path in ("ampere", "hopper")
}
AMPERE, HOPPER, AUTO = _C.BACKEND_AMPERE, _C.BACKEND_HOPPER, _C.BACKEND_AUTO


def choose(build=None, backend=AUTO, capability=90, headdim=128, seqlen_q=1, page_size=0):
    """(path code, kernel head dim) of a bf16 KV-cache call."""
    code, d, _ = _C._choose_kernel_in(build or BOTH, backend, capability, headdim, 0, "bfloat16",
                                      kv_cache=True, kv_seqlen_q=seqlen_q, page_size=page_size)
    return code, d


@pytest.mark.parametrize("page_size", [0, 16, 48, 64, 256, 4096])
def test_prefill_runs_on_the_hopper_path(page_size):
    assert choose(seqlen_q=128, page_size=page_size) == (HOPPER, 128)
    assert choose(seqlen_q=4096, page_size=page_size, headdim=256) == (HOPPER, 256)


@pytest.mark.parametrize("seqlen_q", [1, 4, 8, 127])
def test_decoding_runs_on_the_ampere_path(seqlen_q):
    assert choose(seqlen_q=seqlen_q) == (AMPERE, 128)
    assert choose(seqlen_q=seqlen_q, page_size=16) == (AMPERE, 128)


@pytest.mark.parametrize("page_size", [1, 4, 8, 12, 24, 100])
def test_pages_the_hopper_loads_cannot_read_run_on_the_ampere_path(page_size):
    assert choose(seqlen_q=1024, page_size=page_size) == (AMPERE, 128)
    with pytest.raises(ValueError, match=r"^page_table: the Hopper path reads pages of a multiple of 16"):
        choose(backend=HOPPER, seqlen_q=1024, page_size=page_size)


def test_head_dims_off_the_64_column_slabs_read_pages_on_the_ampere_path():
    assert choose(seqlen_q=1024, headdim=96) == (HOPPER, 96)  # contiguous: any kernel
    assert choose(seqlen_q=1024, headdim=96, page_size=16) == (AMPERE, 96)
    assert choose(seqlen_q=1024, headdim=80, page_size=16) == (AMPERE, 96)
    assert choose(seqlen_q=1024, headdim=112, page_size=16) == (HOPPER, 128)  # rounded on both paths


@pytest.mark.parametrize("capability", [80, 86, 89])
def test_other_gpus_run_the_ampere_path(capability):
    assert choose(capability=capability, seqlen_q=4096) == (AMPERE, 128)
    with pytest.raises(ValueError, match=r"^backend='hopper'.*sm90"):
        choose(capability=capability, backend=HOPPER, seqlen_q=4096)


def test_explicit_paths_are_taken():
    assert choose(backend=HOPPER, seqlen_q=1) == (HOPPER, 128)
    assert choose(backend=HOPPER, seqlen_q=1, page_size=16) == (HOPPER, 128)
    assert choose(backend=AMPERE, seqlen_q=4096) == (AMPERE, 128)


def test_one_path_builds():
    hopper_only = {"ampere": {"head_dims": [], "backward_head_dims": [], "dtypes": []},
                   "hopper": BOTH["hopper"]}
    assert choose(hopper_only, seqlen_q=1) == (HOPPER, 128)
    with pytest.raises(ValueError, match=r"^page_table: .* no Ampere-path kernel"):
        choose(hopper_only, seqlen_q=4096, page_size=1)
    ampere_only = {"ampere": BOTH["ampere"],
                   "hopper": {"head_dims": [], "backward_head_dims": [], "dtypes": []}}
    assert choose(ampere_only, seqlen_q=4096, page_size=16) == (AMPERE, 128)


def test_prefill_stays_on_the_hopper_path_up_to_twice_the_ampere_kernel():
    build = {"ampere": dict(BOTH["ampere"], head_dims=[64, 80, 128]), "hopper": BOTH["hopper"]}
    assert choose(build, seqlen_q=4096, headdim=80) == (HOPPER, 96)
    assert choose(build, seqlen_q=4096, headdim=128) == (HOPPER, 128)
    wide = {"ampere": build["ampere"], "hopper": dict(BOTH["hopper"], head_dims=[256])}
    assert choose(wide, seqlen_q=4096, headdim=80) == (AMPERE, 80)
    assert choose(wide, seqlen_q=4096, headdim=128) == (HOPPER, 256)


def test_decoding_rounds_up_past_sm80_only_head_dims_on_sm90():
    build = dict(BOTH, ampere_sm80_only=[96, 192])
    assert choose(build, seqlen_q=1, headdim=96) == (AMPERE, 128)
    assert choose(build, seqlen_q=1, headdim=96, capability=80) == (AMPERE, 96)
    assert choose(build, seqlen_q=1, headdim=160, page_size=16) == (AMPERE, 256)


MIB = 1 << 20


def copies(backend=AUTO, capability=90, headdim=128, seqlen_q=4096, page_size=16, group=4,
           copy_bytes=64 * MIB, build=None):
    """(path code, kernel head dim, copies_pages) of a bf16 KV-cache call whose pages could be
    copied into copy_bytes of workspace (0: none allowed)."""
    return _C._choose_kvcache_in(build or BOTH, backend, capability, headdim, seqlen_q, page_size,
                                 group, copy_bytes)


@pytest.mark.parametrize("page_size", [1, 5, 16, 32, 48, 100])
def test_long_prefill_copies_pages_shorter_than_a_key_block(page_size):
    assert copies(page_size=page_size) == (HOPPER, 128, True)
    assert copies(page_size=page_size, seqlen_q=256, group=4) == (HOPPER, 128, True)  # 1024 rows per K/V head
    assert copies(page_size=page_size, headdim=96) == (HOPPER, 96, True)  # any kernel reads the copy


@pytest.mark.parametrize("page_size", [0, 64, 128, 256, 4096])
def test_pages_of_whole_key_blocks_and_contiguous_caches_are_read_in_place(page_size):
    assert copies(page_size=page_size) == (HOPPER, 128, False)
    assert copies(page_size=page_size, headdim=64) == (HOPPER, 64, False)  # 128-key blocks: boxes of 64 rows


def test_copies_follow_each_kernels_key_block():
    """Boxes are gcd(page size, keys per block) rows: hd 256's 80-key blocks read pages of 64,
    128 or 256 in 16-row boxes, hd 192's 96-key blocks pages of 64 in 32-row boxes, so those are
    copied; pages of 80 (and contiguous caches) are read in place. The hd 96 kernel's loads read
    no pages: any page size is copied."""
    for page_size in (64, 128, 256):
        assert copies(page_size=page_size, headdim=256) == (HOPPER, 256, True)
    assert copies(page_size=80, headdim=256) == (HOPPER, 256, False)
    assert copies(page_size=0, headdim=256) == (HOPPER, 256, False)
    assert copies(page_size=64, headdim=192) == (HOPPER, 192, True)
    assert copies(page_size=96, headdim=192) == (HOPPER, 192, False)
    assert copies(page_size=64, headdim=96) == (HOPPER, 96, True)
    assert copies(page_size=64, headdim=96, backend=HOPPER, seqlen_q=1) == (HOPPER, 96, True)


def test_copies_need_the_rows_the_workspace_and_the_hopper_path():
    assert copies(seqlen_q=255, group=4) == (HOPPER, 128, False)  # below 1024 rows: TMA boxes
    assert copies(seqlen_q=255, group=4, page_size=1) == (AMPERE, 128, False)  # the Ampere path's gather
    assert copies(copy_bytes=0) == (HOPPER, 128, False)  # no workspace allowed
    assert copies(copy_bytes=256 * MIB + 1) == (HOPPER, 128, False)  # above the bound
    assert copies(copy_bytes=256 * MIB + 1, page_size=1) == (AMPERE, 128, False)
    assert copies(capability=80) == (AMPERE, 128, False)
    assert copies(backend=AMPERE) == (AMPERE, 128, False)
    assert copies(seqlen_q=1) == (AMPERE, 128, False)


def test_explicit_hopper_copies_pages_its_loads_cannot_read():
    assert copies(backend=HOPPER, seqlen_q=1, page_size=1) == (HOPPER, 128, True)
    assert copies(backend=HOPPER, seqlen_q=1, page_size=16) == (HOPPER, 128, False)  # its TMA boxes read them
    assert copies(backend=HOPPER, page_size=16) == (HOPPER, 128, True)
    with pytest.raises(ValueError, match=r"^page_table: the Hopper path reads pages of a multiple of 16"):
        copies(backend=HOPPER, page_size=1, copy_bytes=0)


def test_a_build_without_the_ampere_path_copies_pages_it_cannot_read():
    hopper_only = {"ampere": {"head_dims": [], "backward_head_dims": [], "dtypes": []},
                   "hopper": BOTH["hopper"]}
    assert copies(build=hopper_only, seqlen_q=128, group=1, page_size=1) == (HOPPER, 128, True)
    assert copies(build=hopper_only, seqlen_q=1, group=1, page_size=16) == (HOPPER, 128, False)
    with pytest.raises(ValueError, match=r"^page_table: .* no Ampere-path kernel"):
        copies(build=hopper_only, seqlen_q=128, group=1, page_size=1, copy_bytes=0)
