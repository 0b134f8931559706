"""``attention_with_kvcache`` and ``merge_attention_states`` on a GPU, against the float64
references (``flashcute.reference.attention_with_kvcache``: the pages gathered into a
contiguous cache, the append applied, then ``reference.attention`` per sequence).

Accuracy rule, as in test_gpu_forward.py: the output may differ from float64 by at most twice
PyTorch's own error at the input precision (the reference computed in the inputs' dtype) plus
a tiny floor; lse within a fixed tolerance. Every input is fresh random data; every output
buffer starts NaN-filled, and every cache slot that no sequence uses (past each sequence's
keys, and whole pages that no table row uses) holds NaN: no result may see them, and the
call must leave them as they were. After a call with appends the cache must equal the
reference's updated copy exactly.

Skipped without a GPU or without a build whose binding has ``kvcache_forward``.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

import flashcute  # noqa: E402
from flashcute import reference  # noqa: E402

from test_gpu_forward import LSE_ATOL, LSE_RTOL, OUT_ABS_FLOOR, SUPPORT, _seed  # noqa: E402

DEVICE = "cuda"


def _has_kvcache() -> bool:
    try:
        from flashcute import _C
    except ImportError:
        return False
    return hasattr(_C, "kvcache_forward") and hasattr(_C, "merge_states")


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not _has_kvcache(), reason="this build of flashcute._C has no kvcache_forward"),
]

# Decoding runs the Ampere path's kernels (sm80 and newer, H100/H200 included); prefill on
# sm90 the Hopper path's (test_gpu_kvcache_hopper.py).
_AMPERE = SUPPORT.get("ampere", ([], []))
DTYPES = [d for d in ("float16", "bfloat16") if d in _AMPERE[1]] or ["bfloat16"]
DTYPE = "bfloat16" if "bfloat16" in DTYPES else DTYPES[0]


@pytest.fixture
def gen(request):
    """A generator seeded from the test id: fresh but reproducible inputs per test."""
    return torch.Generator(device=DEVICE).manual_seed(_seed(request))


def _runs(headdim: int) -> bool:
    return any(d >= headdim for d in _AMPERE[0])


def _head_dim() -> int:
    return 128 if _runs(128) else max(_AMPERE[0] or [128])


HEADDIM = _head_dim()


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


class Cache:
    """A random key/value cache, contiguous or paged with a shuffled page table over more
    pages than the table uses. ``poison(lengths)`` fills every slot past each sequence's
    keys, and the pages no row of the table uses, with NaN."""

    def __init__(self, gen, batch, capacity, nheads_kv, headdim, dtype, page_size=None,
                 spare_pages=3):
        dtype = _dtype(dtype) if isinstance(dtype, str) else dtype
        self.batch, self.page_size = batch, page_size
        if page_size is None:
            shape, self.table = (batch, capacity), None
            self.capacity = capacity
        else:
            max_pages = -(-capacity // page_size)
            self.capacity = max_pages * page_size
            num_pages = batch * max_pages + spare_pages
            shape = (num_pages, page_size)
            order = torch.randperm(num_pages, generator=gen, device=DEVICE)
            self.table = order[:batch * max_pages].view(batch, max_pages).to(torch.int32)
        self.k = torch.randn(*shape, nheads_kv, headdim, generator=gen, device=DEVICE, dtype=dtype)
        self.v = torch.randn(*shape, nheads_kv, headdim, generator=gen, device=DEVICE, dtype=dtype)

    def slots(self, b: int, start: int, stop: int):
        """Indices into k and v of sequence b's keys start..stop-1."""
        positions = torch.arange(start, stop, device=DEVICE)
        if self.table is None:
            return torch.full_like(positions, b), positions
        return self.table[b].long()[positions // self.page_size], positions % self.page_size

    def unused_pages(self) -> list[int]:
        if self.table is None:
            return []
        return sorted(set(range(self.k.shape[0])) - set(self.table.flatten().tolist()))

    def poison(self, used):
        """NaN in every slot past ``used[b]`` keys of sequence b, and in the unused pages."""
        for b, n in enumerate(used):
            slot = self.slots(b, n, self.capacity)
            self.k[slot] = math.nan
            self.v[slot] = math.nan
        for page in self.unused_pages():
            self.k[page] = math.nan
            self.v[page] = math.nan


def _int32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


def _randn(gen, *shape, dtype=DTYPE):
    return torch.randn(*shape, generator=gen, device=DEVICE, dtype=_dtype(dtype))


def _same_nan(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality that treats NaN as equal to NaN (the poisoned slots)."""
    return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())


def check_call(cache: Cache, q, lengths, *, k_new=None, v_new=None, cu_seqlens_q=None,
               max_seqlen_q=None, num_splits=0, return_lse=True, backend=None, **mask):
    """Run attention_with_kvcache into a NaN-filled out= and check out, lse and the cache
    against the float64 reference. ``mask``: causal, window, softcap, alibi_slopes,
    softmax_scale. Returns (out, lse)."""
    seqlens = _int32(lengths)
    # NaN from each sequence's key count on: the append's slots too, so that attention that
    # reads a slot before the append has written it shows.
    cache.poison(lengths)
    ref_args = dict(cache_seqlens=seqlens, page_table=cache.table, k_new=k_new, v_new=v_new,
                    cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q, **mask)
    ref = reference.attention_with_kvcache(q, cache.k, cache.v, dtype=torch.float64, **ref_args)
    low = reference.attention_with_kvcache(q, cache.k, cache.v, dtype=q.dtype, **ref_args)
    out = torch.full(ref.out.shape, math.nan, dtype=q.dtype, device=DEVICE)
    result = flashcute.attention_with_kvcache(
        q, cache.k, cache.v, cache_seqlens=seqlens, page_table=cache.table, k_new=k_new,
        v_new=v_new, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q,
        num_splits=num_splits, return_lse=return_lse, out=out, backend=backend, **mask)
    torch.cuda.synchronize()
    result, lse = result if return_lse else (result, None)
    assert result is out
    # The cache: the appended keys written where the reference writes them, every other slot
    # (NaN-poisoned ones and unused pages included) as it was.
    assert _same_nan(cache.k, ref.k_cache), "k_cache differs from the reference's append"
    assert _same_nan(cache.v, ref.v_cache), "v_cache differs from the reference's append"
    check_out(out, lse, ref, low, softcap=mask.get("softcap", 0.0))
    return out, lse


def check_out(out, lse, ref, low, *, softcap=0.0):
    """out and lse against the float64 reference ``ref`` and PyTorch's error ``low``."""
    assert torch.isfinite(out).all(), "output has non-finite elements (unwritten, or NaN read)"
    # Rows without a visible key: the reference's lse is -inf; out exactly 0.
    empty = torch.isneginf(ref.lse)
    rows_empty = empty.transpose(-1, -2) if out.dim() == 3 else empty.transpose(1, 2)
    assert (out[rows_empty] == 0).all(), "rows with no visible key must be exactly 0"
    if out.numel():
        err = (out.double() - ref.out).abs().max().item()
        torch_err = (low.out.double() - ref.out).abs().max().item()
        assert err <= 2 * torch_err + OUT_ABS_FLOOR, (
            f"max |flashcute - float64| = {err:.3g} > 2 * torch's {out.dtype} error "
            f"{torch_err:.3g} + {OUT_ABS_FLOOR}")
    if lse is None:
        return
    assert lse.dtype == torch.float32 and lse.shape == ref.lse.shape
    assert not torch.isnan(lse).any(), "lse has NaN (unwritten, or NaN read)"
    assert torch.isneginf(lse[empty]).all(), "rows with no visible key need lse -inf"
    got, want = lse[~empty].double(), ref.lse[~empty]
    assert torch.isfinite(got).all()
    if got.numel():
        err = (got - want).abs()
        tol = LSE_ATOL + LSE_RTOL * want.abs() + softcap * 2.0**-10
        worst = (err - tol).argmax()
        assert (err <= tol).all(), (
            f"lse: |flashcute - float64| = {err.flatten()[worst].item():.3g} exceeds "
            f"{tol.flatten()[worst].item():.3g}")


def _lengths(capacity: int, page_size, seqlen_new: int) -> list[int]:
    """Key counts from 0 to the most that leaves room for the append, across page
    boundaries: 0, 1, around each of the first pages' ends, the middle, the maximum."""
    top = capacity - seqlen_new
    step = page_size or 16
    picks = [0, 1, step - 1, step, step + 1, 2 * step - 1, capacity // 2, top - 1, top]
    return sorted({min(max(n, 0), top) for n in picks})


def _new(gen, batch, seqlen_new, nheads_kv, headdim=HEADDIM, dtype=DTYPE):
    if seqlen_new == 0:
        return None, None
    return (_randn(gen, batch, seqlen_new, nheads_kv, headdim, dtype=dtype),
            _randn(gen, batch, seqlen_new, nheads_kv, headdim, dtype=dtype))


# ---------------------------------------------------------------------------------------------
# Decoding: page sizes, key counts, appends, GQA and MQA, both dtypes.


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("page_size", [1, 16, 64, 256, None], ids=lambda p: f"page{p or 'less'}")
@pytest.mark.parametrize("heads", [(16, 2), (8, 1)], ids=["gqa8", "mqa"])
def test_decode(gen, dtype, page_size, heads):
    """One query row per sequence and one appended key, against caches of every key count
    from 0 to full (the append fills the last slot)."""
    nheads, nheads_kv = heads
    capacity = 700 if page_size != 256 else 768
    lengths = _lengths(capacity if page_size is None else -(-capacity // page_size) * page_size,
                       page_size, 1)
    batch = len(lengths)
    cache = Cache(gen, batch, capacity, nheads_kv, HEADDIM, dtype, page_size)
    assert max(lengths) + 1 == cache.capacity
    q = _randn(gen, batch, 1, nheads, HEADDIM, dtype=dtype)
    k_new, v_new = _new(gen, batch, 1, nheads_kv, dtype=dtype)
    check_call(cache, q, lengths, k_new=k_new, v_new=v_new)


@pytest.mark.parametrize("page_size", [1, 16, 64, None], ids=lambda p: f"page{p or 'less'}")
@pytest.mark.parametrize("seqlen_q", [1, 2, 4, 5, 8])
def test_speculative_rows_with_appends(gen, page_size, seqlen_q):
    """seqlen_q new tokens per sequence appended (across page boundaries) and attended
    causally, as in speculative decoding; also without causal."""
    nheads, nheads_kv = 8, 2
    step = page_size or 16
    for causal in (True, False):
        cache = Cache(gen, 5, 200, nheads_kv, HEADDIM, DTYPE, page_size)
        top = cache.capacity - seqlen_q
        # Appends that start just before a page's end and cross into the next page (or
        # pages), from an empty cache, and one that fills the cache.
        picks = (0, step - 1, 2 * step - seqlen_q // 2 - 1, 100, top)
        lengths = [min(max(n, 0), top) for n in picks]
        q = _randn(gen, 5, seqlen_q, nheads, HEADDIM)
        k_new, v_new = _new(gen, 5, seqlen_q, nheads_kv)
        check_call(cache, q, lengths, k_new=k_new, v_new=v_new, causal=causal)


@pytest.mark.parametrize("page_size", [1, 16, None], ids=lambda p: f"page{p or 'less'}")
@pytest.mark.parametrize("mask", [
    dict(window=(37, 0)), dict(causal=True, window=(64, 0)), dict(window=(20, 5)),
    dict(softcap=30.0), dict(causal=True, window=(50, 0), softcap=15.0),
], ids=["window", "causal_window", "window_both_sides", "softcap", "causal_window_softcap"])
def test_window_and_softcap(gen, page_size, mask):
    cache = Cache(gen, 4, 300, 2, HEADDIM, DTYPE, page_size)
    lengths = [0, 17, 150, cache.capacity - 3]
    q = _randn(gen, 4, 3, 8, HEADDIM)
    k_new, v_new = _new(gen, 4, 3, 2)
    check_call(cache, q, lengths, k_new=k_new, v_new=v_new, **mask)


@pytest.mark.parametrize("per_sequence", [False, True], ids=["per_head", "per_sequence"])
@pytest.mark.parametrize("causal", [False, True])
def test_alibi(gen, per_sequence, causal):
    cache = Cache(gen, 3, 256, 2, HEADDIM, DTYPE, 16)
    shape = (3, 8) if per_sequence else (8,)
    slopes = torch.rand(*shape, generator=gen, device=DEVICE) * 0.3
    q = _randn(gen, 3, 4, 8, HEADDIM)
    k_new, v_new = _new(gen, 3, 4, 2)
    check_call(cache, q, [5, 0, 200], k_new=k_new, v_new=v_new, causal=causal,
               window=(40, 0) if causal else (-1, -1), alibi_slopes=slopes)


@pytest.mark.parametrize("headdim", [64, 128, 80])
@pytest.mark.parametrize("dtype", DTYPES)
def test_head_dims(gen, headdim, dtype):
    """Compiled head dims and one that runs on the next larger kernel (80 on 96)."""
    if not _runs(headdim):
        pytest.skip(f"no Ampere-path kernel of head dim >= {headdim} in this build")
    cache = Cache(gen, 3, 320, 2, headdim, dtype, 16)
    q = _randn(gen, 3, 2, 8, headdim, dtype=dtype)
    k_new, v_new = _new(gen, 3, 2, 2, headdim=headdim, dtype=dtype)
    check_call(cache, q, [0, 33, 318], k_new=k_new, v_new=v_new, causal=True,
               softmax_scale=0.7 / math.sqrt(headdim))


@pytest.mark.parametrize("num_splits", [1, 3, 0, 64])
@pytest.mark.parametrize("page_size", [16, None], ids=lambda p: f"page{p or 'less'}")
def test_num_splits(gen, num_splits, page_size):
    """Split-KV: any number of splits gives the same attention (the merge over lse), also
    more splits than key blocks, and sequences with few or no keys beside long ones."""
    cache = Cache(gen, 4, 4096, 2, HEADDIM, DTYPE, page_size)
    q = _randn(gen, 4, 1, 16, HEADDIM)
    k_new, v_new = _new(gen, 4, 1, 2)
    check_call(cache, q, [4095, 0, 9, 2000], k_new=k_new, v_new=v_new, num_splits=num_splits)
    fresh = Cache(gen, 4, 4096, 2, HEADDIM, DTYPE, page_size)
    check_call(fresh, _randn(gen, 4, 4, 16, HEADDIM), [3000, 1, 4096, 700], causal=True,
               window=(1000, 0), num_splits=num_splits)


@pytest.mark.parametrize("headdim", [64, 256])
def test_more_splits_than_one_merge_batch(gen, headdim):
    """More splits than one chunk of the merge's 32 states (the lanes' LSEs): 40 splits,
    some of them empty for the shorter sequence, at the merge's smallest and largest columns
    per lane."""
    if not _runs(headdim):
        pytest.skip(f"no Ampere-path kernel of head dim >= {headdim} in this build")
    cache = Cache(gen, 2, 3000, 2, headdim, DTYPE, 16)
    check_call(cache, _randn(gen, 2, 1, 8, headdim), [2999, 1700], num_splits=40,
               softmax_scale=0.7 / math.sqrt(headdim))


@pytest.mark.parametrize("num_splits", [2, 5, 8, 24])
@pytest.mark.parametrize("headdim", [128, 112])
@pytest.mark.parametrize("page_size", [16, None], ids=lambda p: f"page{p or 'less'}")
def test_split_counts_with_packed_rows(gen, num_splits, headdim, page_size):
    """Split-KV at even and odd split counts against packed GQA rows (one and three query rows
    per sequence), a sequence without keys, short ones whose later splits are empty, and a head
    dim below the kernel's (112 on 128: the splits' parts and the merge write 112 of the 128
    columns)."""
    if not _runs(headdim):
        pytest.skip(f"no Ampere-path kernel of head dim >= {headdim} in this build")
    cache = Cache(gen, 4, 2048, 2, headdim, DTYPE, page_size)
    for rows in (1, 3):
        check_call(cache, _randn(gen, 4, rows, 8, headdim), [2047, 0, 70, 1500], num_splits=num_splits,
                   softmax_scale=0.7 / math.sqrt(headdim))


def test_return_lse_false_and_allocated_out(gen):
    cache = Cache(gen, 2, 128, 2, HEADDIM, DTYPE, 16)
    q = _randn(gen, 2, 1, 8, HEADDIM)
    check_call(cache, q, [100, 7], return_lse=False)
    out = flashcute.attention_with_kvcache(q, cache.k, cache.v, cache_seqlens=_int32([100, 7]),
                                           page_table=cache.table)
    assert out.shape == q.shape and out.dtype == q.dtype and torch.isfinite(out).all()


# ---------------------------------------------------------------------------------------------
# Chunked prefill: packed queries against a paged cache.


@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_chunked_prefill(gen, page_size, causal):
    """Chunks of 1, 37, 0, 130 and 5 queries whose keys are already in the cache (each
    sequence's cache_seqlens counts its chunk): masks align to each sequence's keys."""
    chunks = [1, 37, 0, 130, 5]
    lengths = [1, 37 + 200, 64, 130, 5 + 511]
    cache = Cache(gen, len(chunks), 520, 2, HEADDIM, DTYPE, page_size)
    offsets = [0]
    for n in chunks:
        offsets.append(offsets[-1] + n)
    q = _randn(gen, offsets[-1], 8, HEADDIM)
    for num_splits in (0, 1):
        check_call(cache, q, lengths, cu_seqlens_q=_int32(offsets), max_seqlen_q=max(chunks),
                   causal=causal, num_splits=num_splits)
    check_call(cache, q, lengths, cu_seqlens_q=_int32(offsets), max_seqlen_q=max(chunks),
               causal=True, window=(90, 0), softcap=20.0)


# ---------------------------------------------------------------------------------------------
# CUDA graphs, torch.compile, streams, cupy


@pytest.mark.parametrize("page_size", [16, 1])
def test_cuda_graph_replay_with_new_metadata(gen, page_size):
    """A decode step with appends, captured once (attention_with_kvcache called directly in
    the capture after a warm-up on a side stream), replayed with new cache_seqlens, a new
    shuffled page table and new q, k_new, v_new, cache contents: each replay matches the
    reference of its own inputs."""
    batch, nheads, nheads_kv, capacity = 4, 16, 2, 512
    cache = Cache(gen, batch, capacity, nheads_kv, HEADDIM, DTYPE, page_size)
    static = dict(q=_randn(gen, batch, 1, nheads, HEADDIM), seqlens=_int32([3, 0, 100, 511]),
                  table=cache.table.clone())
    k_new, v_new = _new(gen, batch, 1, nheads_kv)

    def step():
        return flashcute.attention_with_kvcache(
            static["q"], cache.k, cache.v, cache_seqlens=static["seqlens"],
            page_table=static["table"], k_new=k_new, v_new=v_new, return_lse=True)

    graph, outs = capture(step)
    replay_rounds(graph, static, cache, (k_new, v_new), outs,
                  [[511, 255, 0, 16], [0, 1, 2, 3], [300, 511, 15, 64]],
                  lambda: Cache(gen, batch, capacity, nheads_kv, HEADDIM, DTYPE, page_size),
                  lambda: (_randn(gen, batch, 1, nheads, HEADDIM), *_new(gen, batch, 1, nheads_kv)))


def capture(step):
    """(graph, step's outputs): the step warmed up on a side stream, then captured once."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step()
    return graph, outs


def replay_rounds(graph, static, cache: Cache, new, outs, rounds, fresh_cache, fresh_inputs, **mask):
    """Replays a captured step once per key counts in ``rounds``: a fresh cache's contents and
    shuffled table, and fresh (q, k_new, v_new), copied into the captured tensors (``static``
    holds q, seqlens and table; ``new`` k_new and v_new); each replay's cache, out and lse
    checked against the reference of its own inputs."""
    static_out, static_lse = outs
    for lengths in rounds:
        fresh = fresh_cache()
        fresh.poison(lengths)
        k_before, v_before = fresh.k.clone(), fresh.v.clone()
        q, new_k, new_v = fresh_inputs()
        ref_args = dict(cache_seqlens=_int32(lengths), page_table=fresh.table, k_new=new_k,
                        v_new=new_v, **mask)
        ref = reference.attention_with_kvcache(q, k_before, v_before, dtype=torch.float64, **ref_args)
        low = reference.attention_with_kvcache(q, k_before, v_before, dtype=q.dtype, **ref_args)
        for name, value in (("q", q), ("seqlens", _int32(lengths)), ("table", fresh.table)):
            static[name].copy_(value)
        cache.k.copy_(k_before)
        cache.v.copy_(v_before)
        new[0].copy_(new_k)
        new[1].copy_(new_v)
        static_out.fill_(math.nan)
        static_lse.fill_(math.nan)
        graph.replay()
        torch.cuda.synchronize()
        assert _same_nan(cache.k, ref.k_cache) and _same_nan(cache.v, ref.v_cache)
        check_out(static_out, static_lse, ref, low)


def test_compiled_decode_step(gen):
    """torch.compile(fullgraph=True) of a step that appends, attends and uses the result:
    the caller's cache holds the appends afterwards."""
    cache = Cache(gen, 3, 256, 2, HEADDIM, DTYPE, 16)
    lengths = _int32([0, 100, 255])

    def step(q, k_cache, v_cache, seqlens, table, k_new, v_new):
        out, lse = flashcute.attention_with_kvcache(
            q, k_cache, v_cache, cache_seqlens=seqlens, page_table=table, k_new=k_new,
            v_new=v_new, causal=True, return_lse=True)
        return out.float() * 2, lse

    compiled = torch.compile(step, fullgraph=True)
    for _ in range(2):
        cache = Cache(gen, 3, 256, 2, HEADDIM, DTYPE, 16)
        cache.poison([0, 100, 255])
        q = _randn(gen, 3, 1, 8, HEADDIM)
        k_new, v_new = _new(gen, 3, 1, 2)
        args = dict(cache_seqlens=lengths, page_table=cache.table, k_new=k_new, v_new=v_new,
                    causal=True)
        ref = reference.attention_with_kvcache(q, cache.k, cache.v, **args)
        low = reference.attention_with_kvcache(q, cache.k, cache.v, dtype=q.dtype, **args)
        out2, lse = compiled(q, cache.k, cache.v, lengths, cache.table, k_new, v_new)
        torch.cuda.synchronize()
        assert _same_nan(cache.k, ref.k_cache) and _same_nan(cache.v, ref.v_cache)
        check_out((out2 / 2).to(q.dtype), lse, ref, low)


def test_runs_on_the_current_stream(gen):
    """The kernels join the caller's current stream: a q written on a side stream just
    before the call (after a long sleep there) is the q they read."""
    cache = Cache(gen, 2, 1024, 2, HEADDIM, DTYPE, 16)
    q = _randn(gen, 2, 1, 8, HEADDIM)
    seqlens = _int32([1000, 24])
    ref = reference.attention_with_kvcache(q, cache.k, cache.v, cache_seqlens=seqlens,
                                           page_table=cache.table)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        sleep = getattr(torch.cuda, "_sleep", None)
        if sleep is not None:
            sleep(50_000_000)
        late = q.clone()
        out = flashcute.attention_with_kvcache(late, cache.k, cache.v, cache_seqlens=seqlens,
                                               page_table=cache.table)
    torch.cuda.synchronize()
    low = reference.attention_with_kvcache(q, cache.k, cache.v, cache_seqlens=seqlens,
                                           page_table=cache.table, dtype=q.dtype)
    check_out(out, None, ref, low)


def test_cupy_arrays(gen):
    cupy = pytest.importorskip("cupy")
    if "float16" not in DTYPES:
        pytest.skip("cupy has no bfloat16 and this build has no float16 kernels")
    cache = Cache(gen, 2, 128, 2, HEADDIM, "float16", 16)
    q = _randn(gen, 2, 2, 8, HEADDIM, dtype="float16")
    k_new, v_new = _new(gen, 2, 2, 2, dtype="float16")
    seqlens = _int32([30, 0])
    cache.poison([32, 2])
    ref = reference.attention_with_kvcache(q, cache.k, cache.v, cache_seqlens=seqlens,
                                           page_table=cache.table, k_new=k_new, v_new=v_new,
                                           causal=True)
    low = reference.attention_with_kvcache(q, cache.k, cache.v, cache_seqlens=seqlens,
                                           page_table=cache.table, k_new=k_new, v_new=v_new,
                                           causal=True, dtype=q.dtype)
    torch.cuda.synchronize()
    as_cupy = {name: cupy.from_dlpack(x) for name, x in dict(
        q=q, k_cache=cache.k, v_cache=cache.v, cache_seqlens=seqlens, page_table=cache.table,
        k_new=k_new, v_new=v_new).items()}
    out, lse = flashcute.attention_with_kvcache(**as_cupy, causal=True, return_lse=True)
    assert isinstance(out, cupy.ndarray) and isinstance(lse, cupy.ndarray)
    cupy.cuda.get_current_stream().synchronize()
    assert _same_nan(cache.k, ref.k_cache) and _same_nan(cache.v, ref.v_cache)
    check_out(torch.from_dlpack(out), torch.from_dlpack(lse), ref, low)
    merged, merged_lse = flashcute.merge_attention_states(out, lse, out, lse)
    cupy.cuda.get_current_stream().synchronize()
    torch.testing.assert_close(torch.from_dlpack(merged), torch.from_dlpack(out))
    finite = torch.from_dlpack(lse)
    torch.testing.assert_close(torch.from_dlpack(merged_lse), finite + math.log(2))


# ---------------------------------------------------------------------------------------------
# merge_attention_states


def _check_merge(out, lse, states, dtype):
    want, want_lse = reference.merge_attention_states(*states)
    low = reference.merge_attention_states(*states, dtype=torch.float32)[0].to(dtype)
    assert out.dtype == dtype and out.shape == states[0].shape
    assert lse.dtype == torch.float32 and lse.shape == states[1].shape
    assert torch.isfinite(out).all() and not torch.isnan(lse).any()
    empty = torch.isneginf(want_lse)
    assert torch.equal(torch.isneginf(lse), empty)
    err = (out.double() - want).abs().max().item()
    torch_err = (low.double() - want).abs().max().item()
    assert err <= 2 * torch_err + OUT_ABS_FLOOR, (err, torch_err)
    got = lse[~empty].double()
    assert ((got - want_lse[~empty]).abs() <= LSE_ATOL + LSE_RTOL * want_lse[~empty].abs()).all()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("packed", [False, True], ids=["batched", "packed"])
def test_merge_states(gen, dtype, packed):
    """Random states with rows empty in one state or in both (lse -inf, output 0)."""
    shape = (333, 6, 128) if packed else (3, 111, 6, 128)
    lse_shape = (6, 333) if packed else (3, 6, 111)
    out_a, out_b = _randn(gen, *shape, dtype=dtype), _randn(gen, *shape, dtype=dtype)
    lse_a = torch.randn(*lse_shape, generator=gen, device=DEVICE) * 5
    lse_b = torch.randn(*lse_shape, generator=gen, device=DEVICE) * 5
    rows = torch.rand(*lse_shape, generator=gen, device=DEVICE)
    lse_a[rows < 0.2] = -math.inf
    lse_b[(rows > 0.1) & (rows < 0.3)] = -math.inf  # 0.1-0.2: empty in both
    for o, lse in ((out_a, lse_a), (out_b, lse_b)):
        o[(torch.isneginf(lse).transpose(-1, -2) if packed else torch.isneginf(lse).transpose(1, 2))] = 0
    states = (out_a, lse_a, out_b, lse_b)
    out, lse = flashcute.merge_attention_states(*states)
    torch.cuda.synchronize()
    _check_merge(out, lse, states, _dtype(dtype))


def test_merge_of_split_keys_is_attention_over_all_keys(gen):
    """Cascade inference: attention over a shared prefix and over each sequence's own keys,
    merged, is attention over both."""
    q = _randn(gen, 2, 4, 8, HEADDIM)
    k, v = _randn(gen, 2, 700, 2, HEADDIM), _randn(gen, 2, 700, 2, HEADDIM)
    a, lse_a = flashcute.attention(q, k[:, :300], v[:, :300], return_lse=True)
    b, lse_b = flashcute.attention(q, k[:, 300:], v[:, 300:], return_lse=True)
    out, lse = flashcute.merge_attention_states(a, lse_a, b, lse_b)
    ref, ref_lse = reference.attention(q, k, v, return_lse=True)
    low = reference.attention(q, k, v, dtype=q.dtype)
    torch.cuda.synchronize()
    err = (out.double() - ref).abs().max().item()
    torch_err = (low.double() - ref).abs().max().item()
    assert err <= 3 * torch_err + OUT_ABS_FLOOR, (err, torch_err)  # two roundings of out
    assert ((lse.double() - ref_lse).abs() <= LSE_ATOL + LSE_RTOL * ref_lse.abs()).all()


def test_merge_takes_out_as_layout_and_captures(gen):
    q = _randn(gen, 2, 5, 4, 64)
    states = [_randn(gen, 2, 4, 5, 64).transpose(1, 2),  # SDPA's layout, as a view
              torch.randn(2, 4, 5, generator=gen, device=DEVICE),
              _randn(gen, 2, 5, 4, 64), torch.randn(2, 4, 5, generator=gen, device=DEVICE)]
    out, lse = flashcute.merge_attention_states(*states)
    assert out.stride() == states[0].stride()
    torch.cuda.synchronize()
    _check_merge(out, lse, states, q.dtype)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        flashcute.merge_attention_states(*states)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out, static_lse = flashcute.merge_attention_states(*states)
    for x in states:
        x.copy_(torch.randn(x.shape, generator=gen, device=DEVICE).to(x.dtype))
    graph.replay()
    torch.cuda.synchronize()
    _check_merge(static_out, static_lse, states, q.dtype)
