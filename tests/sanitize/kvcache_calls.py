"""KV-cache calls for compute-sanitizer (``run.sh kvcache``, or ``python calls.py kvcache``).

    python tests/sanitize/kvcache_calls.py

Small ``attention_with_kvcache`` calls, well-formed ones first (head dims 64, 72 and 128, the
last also on the narrow split-KV tile of sm90; page sizes 1, 16 and 64 and a contiguous cache,
appends across page boundaries, GQA and MQA, causal, window, softcap, ALiBi, packed queries,
split-KV with 1, 3, 64 and the heuristic's splits; on sm90, prefill on the Hopper path with
its paged TMA loads and with pages copied to a workspace), then a fuzzed corpus of the values the
host never reads and the kernels must clamp: page ids below 0, at or beyond num_pages and
near 2^31; cache_seqlens below 0, beyond the table's capacity and near 2^31, with and without
appends (which must not write outside the cache); packed-query offsets that break the rules.
Then ``merge_attention_states`` on rows empty in one or both states, batched and packed.
The calls only have to complete: memcheck and the other tools report what they touched.
"""

from __future__ import annotations

import random
from typing import Any, Optional

import torch

import flashcute

_BIG = 2**31 - 1
_SMALL = -(2**31)
NHEADS_KV = 2
BATCH = 3
NUM_PAGES = 7
CAPACITY = 130  # keys per sequence, rounded up to whole pages


def _cache(page_size: Optional[int], headdim: int, dtype: torch.dtype, gen: torch.Generator
           ) -> tuple[torch.Tensor, torch.Tensor, Optional[int]]:
    """(k_cache, v_cache, max_pages): paged over NUM_PAGES pages (the table may name each
    several times), or contiguous (max_pages None)."""
    if page_size is None:
        shape, max_pages = (BATCH, CAPACITY), None
    else:
        max_pages = -(-CAPACITY // page_size)
        shape = (NUM_PAGES, page_size)
    k = torch.randn(*shape, NHEADS_KV, headdim, device="cuda", dtype=dtype, generator=gen)
    v = torch.randn(*shape, NHEADS_KV, headdim, device="cuda", dtype=dtype, generator=gen)
    return k, v, max_pages


def _well_formed_table(max_pages: int, rng: random.Random) -> list[list[int]]:
    return [[rng.randrange(NUM_PAGES) for _ in range(max_pages)] for _ in range(BATCH)]


def _fuzzed_table(max_pages: int, rng: random.Random) -> list[list[int]]:
    pool = [-1, -5, NUM_PAGES, NUM_PAGES + 1, 1000, _BIG, _SMALL, 0]
    return [[rng.choice(pool) if rng.random() < 0.5 else rng.randrange(NUM_PAGES)
             for _ in range(max_pages)] for _ in range(BATCH)]


def seqlens_corpus(capacity: int, seqlen_new: int) -> list[list[int]]:
    """cache_seqlens cases: well-formed, then negative, beyond the capacity (also once the
    append is added), near 2^31 and -2^31."""
    top = capacity - seqlen_new
    return [
        [0, 1, top],
        [top, top // 2, 3],
        [-1, 5, top + 1],                  # negative; the append runs past the end
        [capacity, capacity + 7, 10_000],  # beyond the table
        [_BIG, _BIG - seqlen_new, 0],      # near 2^31: the append's positions overflow
        [_SMALL, -seqlen_new, _SMALL + 1],
    ]


def _launch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seqlens: list[int],
            table: Optional[list[list[int]]], new: Optional[tuple[torch.Tensor, torch.Tensor]],
            **kwargs: Any) -> None:
    flashcute.attention_with_kvcache(
        q, k, v, cache_seqlens=torch.tensor(seqlens, dtype=torch.int32, device="cuda"),
        page_table=None if table is None else torch.tensor(table, dtype=torch.int32, device="cuda"),
        k_new=None if new is None else new[0], v_new=None if new is None else new[1],
        return_lse=True, **kwargs)


MASKS = ({}, {"causal": True}, {"causal": True, "window": (20, 0), "softcap": 10.0},
         {"window": (9, 4), "alibi": True})


def _mask(mask: dict, nheads: int, gen: torch.Generator) -> dict:
    mask = dict(mask)
    if mask.pop("alibi", False):
        mask["alibi_slopes"] = torch.rand(BATCH, nheads, device="cuda", generator=gen)
    return mask


def kvcache_calls(seed: int = 0) -> int:
    """The corpus; returns the number of calls."""
    rng = random.Random(seed)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    count = 0
    dtypes = [torch.bfloat16, torch.float16]
    for dtype in dtypes:
        for headdim in (64, 72, 128):
            for page_size in (1, 16, 64, None):
                for nheads in (4, 2 * 8):  # GQA 2:1 and 8:1
                    k, v, max_pages = _cache(page_size, headdim, dtype, gen)
                    capacity = CAPACITY if max_pages is None else max_pages * page_size
                    for seqlen_q, seqlen_new in ((1, 1), (5, 5), (3, 0)):
                        q = torch.randn(BATCH, seqlen_q, nheads, headdim, device="cuda",
                                        dtype=dtype, generator=gen)
                        new = None
                        if seqlen_new:
                            new = tuple(torch.randn(BATCH, seqlen_new, NHEADS_KV, headdim,
                                                    device="cuda", dtype=dtype, generator=gen)
                                        for _ in range(2))
                        for i, seqlens in enumerate(seqlens_corpus(capacity, seqlen_new)):
                            table = None
                            if max_pages is not None:
                                table = (_well_formed_table(max_pages, rng) if i < 2
                                         else _fuzzed_table(max_pages, rng))
                            mask = _mask(MASKS[count % len(MASKS)], nheads, gen)
                            splits = (0, 1, 3, 64)[count % 4]
                            _launch(q, k, v, seqlens, table, new, num_splits=splits, **mask)
                            count += 1
                    if max_pages is not None:  # a fuzzed table beside good lengths, appending
                        q = torch.randn(BATCH, 1, nheads, headdim, device="cuda", dtype=dtype,
                                        generator=gen)
                        new = tuple(torch.randn(BATCH, 2, NHEADS_KV, headdim, device="cuda",
                                                dtype=dtype, generator=gen) for _ in range(2))
                        for _ in range(3):
                            _launch(q, k, v, [rng.randrange(capacity - 1) for _ in range(BATCH)],
                                    _fuzzed_table(max_pages, rng), new, num_splits=rng.choice((0, 2)))
                            count += 1
        count += _varlen_calls(dtype, rng, gen)
        count += _hopper_prefill_calls(dtype, rng, gen)
    count += _merge_calls(gen)
    torch.cuda.synchronize()
    return count


def _varlen_calls(dtype: torch.dtype, rng: random.Random, gen: torch.Generator) -> int:
    """Packed queries (chunked prefill) against a paged cache of 16-key pages: well-formed
    offsets, then offsets that decrease, run past the rows or sit near 2^31, beside fuzzed
    lengths and page ids."""
    total_q = 40
    k, v, max_pages = _cache(16, 64, dtype, gen)
    assert max_pages is not None
    q = torch.randn(total_q, 4, 64, device="cuda", dtype=dtype, generator=gen)
    corpus = [
        ([0, 10, 10, 40], [20, 5, 100], 30),
        ([0, 30, 20, 40], [30, 20, 10], 30),        # decreasing
        ([0, 10, 60, 500], [10, 50, 500], 460),     # beyond total_q
        ([-20, 10, 20, 40], [-3, 10, 20], 30),      # negative
        ([0, _BIG, _SMALL, _BIG], [_BIG, 0, _SMALL], 40),
        ([0, 10, 20, 40], [5, 5, 5], 3),            # max_seqlen_q below the real lengths
    ]
    count = 0
    for offsets, seqlens, max_q in corpus:
        for causal in (False, True):
            table = _well_formed_table(max_pages, rng) if count < 2 else _fuzzed_table(max_pages, rng)
            flashcute.attention_with_kvcache(
                q, k, v, cache_seqlens=torch.tensor(seqlens, dtype=torch.int32, device="cuda"),
                page_table=torch.tensor(table, dtype=torch.int32, device="cuda"),
                cu_seqlens_q=torch.tensor(offsets, dtype=torch.int32, device="cuda"),
                max_seqlen_q=max_q, causal=causal, num_splits=(0, 3)[count % 2], return_lse=True)
            count += 1
    return count


def _hopper_prefill_calls(dtype: torch.dtype, rng: random.Random, gen: torch.Generator) -> int:
    """Prefill on the Hopper path (sm90 builds with it only): 130 query rows with and without
    appends against contiguous caches and pages of 16 and 64 keys (TMA boxes from the table's
    pages), and pages of 1 and 5 keys and 512 rows on pages of 16 (the pages copied into a
    contiguous workspace first), head dims 64, 128 and 256, over the fuzzed lengths and page ids."""
    if torch.cuda.get_device_capability() != (9, 0):
        return 0
    hopper = flashcute.build_info()["backends"]["hopper"]
    count = 0
    for headdim in (64, 128, 256):
        if headdim not in hopper["head_dims"] or str(dtype).split(".")[-1] not in hopper["dtypes"]:
            continue
        for page_size, seqlen_q in ((16, 130), (64, 130), (None, 130), (1, 130), (5, 130), (16, 512)):
            k, v, max_pages = _cache(page_size, headdim, dtype, gen)
            capacity = CAPACITY if max_pages is None else max_pages * page_size
            q = torch.randn(BATCH, seqlen_q, 4, headdim, device="cuda", dtype=dtype, generator=gen)
            for seqlen_new in (0, 3):
                new = None
                if seqlen_new:
                    new = tuple(torch.randn(BATCH, seqlen_new, NHEADS_KV, headdim, device="cuda",
                                            dtype=dtype, generator=gen) for _ in range(2))
                for i, seqlens in enumerate(seqlens_corpus(capacity, seqlen_new)):
                    table = None
                    if max_pages is not None:
                        table = _well_formed_table(max_pages, rng) if i < 2 else _fuzzed_table(max_pages, rng)
                    mask = _mask(MASKS[count % len(MASKS)], 4, gen)
                    _launch(q, k, v, seqlens, table, new, backend="hopper", **mask)
                    count += 1
    return count


def _merge_calls(gen: torch.Generator) -> int:
    """Merges of batched and packed states in each dtype, with rows empty in one state, in
    both, and rows with +inf and NaN lse."""
    count = 0
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for shape, lse_shape in (((2, 37, 3, 64), (2, 3, 37)), ((53, 3, 128), (3, 53)),
                                 ((1, 1, 1, 8), (1, 1, 1))):
            outs = [torch.randn(shape, device="cuda", dtype=dtype, generator=gen) for _ in range(2)]
            lses = [torch.randn(lse_shape, device="cuda", generator=gen) for _ in range(2)]
            flat = [x.view(-1) for x in lses]
            flat[0][::3] = float("-inf")
            flat[1][::5] = float("-inf")
            flat[1][1::7] = float("inf")
            flat[0][2::11] = float("nan")
            flashcute.merge_attention_states(outs[0], lses[0], outs[1], lses[1])
            count += 1
    return count


def main() -> None:
    print(f"kvcache: {kvcache_calls()} calls")


if __name__ == "__main__":
    main()
