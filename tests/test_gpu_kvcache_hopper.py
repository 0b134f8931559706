"""``attention_with_kvcache`` prefill on the Hopper path (sm90): contiguous caches and paged
ones whose pages its TMA boxes read (multiples of 16 keys), against the float64 reference, with
test_gpu_kvcache.py's checks (NaN-poisoned slots and outputs, the cache after the append);
long prefills copy pages shorter than 64 keys (any size) into a contiguous workspace first.

Calls pass backend="hopper" so that every page size and shape here runs that path; the
library's own choice (prefill from 128 query rows per sequence) runs the same calls again with
backend=None.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

import flashcute  # noqa: E402
from test_gpu_forward import SUPPORT  # noqa: E402
from test_gpu_kvcache import (  # noqa: E402,F401
    DEVICE, Cache, _int32, _new, _randn, capture, check_call, gen, replay_rounds)

from flashcute._torch_kvcache import forward_plan  # noqa: E402
from flashcute._validate import kernel_window  # noqa: E402

_HOPPER = SUPPORT.get("hopper", ([], []))


def _on_sm90() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not _on_sm90() or not _HOPPER[0], reason="needs the Hopper path on an sm90 GPU"),
]

DTYPE = "bfloat16" if "bfloat16" in _HOPPER[1] else (_HOPPER[1] or ["bfloat16"])[0]


def _kernel(headdim: int) -> int:
    return min((d for d in _HOPPER[0] if d >= headdim), default=0)


def _need(headdim: int) -> None:
    if not _kernel(headdim):
        pytest.skip(f"no Hopper-path kernel of head dim >= {headdim} in this build")


PAGES = [None, 16, 64, 256]


@pytest.mark.parametrize("page_size", PAGES, ids=lambda p: f"page{p or 'less'}")
@pytest.mark.parametrize("heads", [(8, 2), (4, 1)], ids=["gqa4", "mqa"])
@pytest.mark.parametrize("causal", [False, True])
def test_prefill_with_appends(gen, page_size, heads, causal):
    """130 query rows and 130 appended keys per sequence (crossing pages), against caches
    from empty to full, on both the explicit and the chosen path."""
    _need(128)
    nheads, nheads_kv = heads
    seqlen_q = 130
    cache = Cache(gen, 5, 700, nheads_kv, 128, DTYPE, page_size)
    top, step = cache.capacity - seqlen_q, page_size or 16
    lengths = [0, step - 1, top // 2, top - 1, top]
    q = _randn(gen, 5, seqlen_q, nheads, 128, dtype=DTYPE)
    for backend in ("hopper", None):
        k_new, v_new = _new(gen, 5, seqlen_q, nheads_kv, dtype=DTYPE)
        check_call(cache, q, lengths, k_new=k_new, v_new=v_new, causal=causal, backend=backend)


@pytest.mark.parametrize("page_size", [None, 16, 48, 256], ids=lambda p: f"page{p or 'less'}")
@pytest.mark.parametrize("headdim", [64, 112, 128, 192, 256, 96])
def test_head_dims(gen, page_size, headdim):
    """Every kernel head dim, one rounded up (112 on 128), pages of 48 keys (boxes of 16 rows,
    blocks across pages); head dim 96 contiguous only (paged, it runs on the Ampere path)."""
    _need(headdim)
    if page_size is not None and (_kernel(headdim) % 64 != 0):
        pytest.skip("paged caches of this kernel run on the Ampere path")
    cache = Cache(gen, 3, 520, 2, headdim, DTYPE, page_size)
    q = _randn(gen, 3, 197, 6, headdim, dtype=DTYPE)
    check_call(cache, q, [0, 261, cache.capacity], causal=True, backend="hopper",
               softmax_scale=0.7 / math.sqrt(headdim))
    fresh = Cache(gen, 3, 520, 2, headdim, DTYPE, page_size)  # the first call left NaN behind
    check_call(fresh, q, [fresh.capacity, 5, 300], backend="hopper")


@pytest.mark.parametrize("page_size", [None, 16], ids=lambda p: f"page{p or 'less'}")
@pytest.mark.parametrize("mask", [
    dict(causal=True, window=(100, 0)), dict(window=(60, 30)), dict(softcap=30.0),
    dict(causal=True, window=(150, 0), softcap=15.0),
], ids=["causal_window", "window_both_sides", "softcap", "causal_window_softcap"])
def test_window_and_softcap(gen, page_size, mask):
    _need(128)
    cache = Cache(gen, 4, 600, 2, 128, DTYPE, page_size)
    q = _randn(gen, 4, 150, 8, 128, dtype=DTYPE)
    k_new, v_new = _new(gen, 4, 20, 2, dtype=DTYPE)
    check_call(cache, q, [0, 17, 400, cache.capacity - 20], k_new=k_new, v_new=v_new,
               backend="hopper", **mask)


@pytest.mark.parametrize("causal", [False, True])
def test_alibi(gen, causal):
    _need(128)
    cache = Cache(gen, 3, 512, 2, 128, DTYPE, 64)
    slopes = torch.rand(3, 8, generator=gen, device=DEVICE) * 0.3
    q = _randn(gen, 3, 140, 8, 128, dtype=DTYPE)
    check_call(cache, q, [150, 0, 512], causal=causal, alibi_slopes=slopes, backend="hopper")


@pytest.mark.parametrize("page_size", [None, 16, 64], ids=lambda p: f"page{p or 'less'}")
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_chunked_prefill(gen, page_size, causal):
    """Chunks of 1, 237, 0, 130 and 5 queries whose keys are already in the cache."""
    _need(128)
    chunks = [1, 237, 0, 130, 5]
    lengths = [1, 237 + 200, 64, 130, 5 + 511]
    cache = Cache(gen, len(chunks), 520, 2, 128, DTYPE, page_size)
    offsets = [0]
    for n in chunks:
        offsets.append(offsets[-1] + n)
    q = _randn(gen, offsets[-1], 8, 128, dtype=DTYPE)
    for backend in ("hopper", None):
        check_call(cache, q, lengths, cu_seqlens_q=_int32(offsets), max_seqlen_q=max(chunks),
                   causal=causal, backend=backend)


def _copy_bytes(cache: Cache, q, seqlens, k_new=None, v_new=None, causal=False, backend=None) -> int:
    """The workspace the library plans for the call: a paged cache's contiguous copy, or 0."""
    plan = forward_plan(q, cache.k, cache.v, seqlens, cache.table, k_new, v_new, None, None, None,
                        causal, None, kernel_window((-1, -1)), 0.0, None, 0, backend)
    return plan.workspace_bytes


def _full_copy(cache: Cache, heads_kv: int, headdim: int) -> int:
    """Bytes of K and V for every sequence's whole capacity (K's part rounded up to 256)."""
    k_bytes = cache.batch * cache.capacity * heads_kv * headdim * 2
    return -(-k_bytes // 256) * 256 + k_bytes


@pytest.mark.parametrize("page_size", [1, 5, 16, 48], ids=lambda p: f"page{p}")
@pytest.mark.parametrize("heads", [(8, 2), (4, 1)], ids=["gqa4", "mqa"])
@pytest.mark.parametrize("causal", [False, True])
def test_long_prefill_copies_short_pages(gen, page_size, heads, causal):
    """520 query rows and 520 appended keys per sequence, 4 query heads per K/V head (2080 rows
    per K/V head): the library copies pages shorter than a 64-key block into a contiguous
    workspace (its plan asks for exactly that copy) and the Hopper path reads the copy; caches
    from empty to full, NaN in every slot past the keys."""
    _need(128)
    nheads, nheads_kv = heads
    seqlen_q = 520
    cache = Cache(gen, 3, 1100, nheads_kv, 128, DTYPE, page_size)
    q = _randn(gen, 3, seqlen_q, nheads, 128, dtype=DTYPE)
    lengths = [0, cache.capacity - seqlen_q, 301]
    for backend in (None, "hopper"):
        k_new, v_new = _new(gen, 3, seqlen_q, nheads_kv, dtype=DTYPE)
        planned = _copy_bytes(cache, q, _int32(lengths), k_new, v_new, causal, backend)
        assert planned == _full_copy(cache, nheads_kv, 128)
        check_call(cache, q, lengths, k_new=k_new, v_new=v_new, causal=causal, backend=backend)


@pytest.mark.parametrize("headdim", [64, 112, 256])
@pytest.mark.parametrize("page_size", [5, 64])
def test_copied_pages_per_kernel_key_block(gen, headdim, page_size):
    """Whether pages are copied follows the kernel's key block: pages of 64 are read in place by
    the hd 64 kernel (128-key blocks, 64-row boxes) and copied for hd 256 (80-key blocks, 16-row
    boxes); pages of 5 are always copied. 112 runs the hd 128 kernel on its first 112 columns."""
    _need(headdim)
    cache = Cache(gen, 2, 700, 2, headdim, DTYPE, page_size)
    q = _randn(gen, 2, 520, 8, headdim, dtype=DTYPE)
    copied = not (page_size == 64 and _kernel(headdim) in (64, 128))
    planned = _copy_bytes(cache, q, _int32([0, 0]), causal=True)
    assert planned == (_full_copy(cache, 2, headdim) if copied else 0)
    check_call(cache, q, [cache.capacity, 333], causal=True, softmax_scale=0.6 / math.sqrt(headdim))


def test_cuda_graph_replay_of_a_copied_prefill(gen):
    """A prefill chunk with appends on pages of 16 that the library copies (the copy, then the
    forward as its programmatic dependent), captured once and replayed with new cache_seqlens,
    page table, q, appended keys and cache contents: each replay matches its own reference."""
    _need(128)
    batch, seqlen_q, nheads, nheads_kv, capacity = 2, 300, 8, 2, 900
    cache = Cache(gen, batch, capacity, nheads_kv, 128, DTYPE, 16)
    static = dict(q=_randn(gen, batch, seqlen_q, nheads, 128, dtype=DTYPE), seqlens=_int32([0, 500]),
                  table=cache.table.clone())
    k_new, v_new = _new(gen, batch, seqlen_q, nheads_kv, dtype=DTYPE)
    assert _copy_bytes(cache, static["q"], static["seqlens"], k_new, v_new, True) > 0

    def step():
        return flashcute.attention_with_kvcache(
            static["q"], cache.k, cache.v, cache_seqlens=static["seqlens"], page_table=static["table"],
            k_new=k_new, v_new=v_new, causal=True, return_lse=True)

    graph, outs = capture(step)
    replay_rounds(graph, static, cache, (k_new, v_new), outs,
                  [[600, 17], [0, 0], [cache.capacity - seqlen_q, 333]],
                  lambda: Cache(gen, batch, capacity, nheads_kv, 128, DTYPE, 16),
                  lambda: (_randn(gen, batch, seqlen_q, nheads, 128, dtype=DTYPE),
                           *_new(gen, batch, seqlen_q, nheads_kv, dtype=DTYPE)),
                  causal=True)


@pytest.mark.parametrize("mask", [dict(causal=True, window=(300, 0), softcap=20.0), dict(window=(200, 90))],
                         ids=["causal_window_softcap", "window_both_sides"])
def test_copied_pages_with_masks_and_packed_queries(gen, mask):
    """The copy under a window and softcap, and chunked prefill (packed queries) read through it."""
    _need(128)
    cache = Cache(gen, 2, 900, 2, 128, DTYPE, 16)
    q = _randn(gen, 2, 600, 8, 128, dtype=DTYPE)
    assert _copy_bytes(cache, q, _int32([0, 0])) > 0
    check_call(cache, q, [250, cache.capacity], **mask)
    chunks, lengths = [600, 0, 530], [cache.capacity, 40, 530 + 300]
    packed = Cache(gen, 3, 900, 2, 128, DTYPE, 16)
    offsets = [0, 600, 600, 1130]
    qp = _randn(gen, offsets[-1], 8, 128, dtype=DTYPE)
    check_call(packed, qp, lengths, cu_seqlens_q=_int32(offsets), max_seqlen_q=max(chunks), causal=True)


def test_pages_the_hopper_loads_cannot_read_without_a_workspace_are_refused(gen):
    """An explicit 'hopper' on pages of 12 keys reads them through the copy; where no
    workspace may be allocated (numpy arrays, out= given) the call is refused, naming
    page_table; the library's own choice for short chunks is the Ampere path."""
    _need(128)
    cache = Cache(gen, 2, 64, 2, 128, DTYPE, 12)
    q = _randn(gen, 2, 128, 4, 128, dtype=DTYPE)
    check_call(cache, q, [3, 60], backend="hopper")
    ext = flashcute._C
    with pytest.raises(ValueError, match=r"^page_table: the Hopper path reads pages of a multiple of 16"):
        ext.kvcache_plan(2, 128, 4, 2, 128, 128, cache.capacity, 0, -1, "bfloat16", False,
                         *kernel_window((-1, -1)), False, 0, ext.BACKEND_HOPPER, 12, copy_pages=False)
    check_call(cache, q, [3, 60])  # the library's choice: the Ampere path
