"""Prefill against a KV cache: flashcute.attention_with_kvcache on a contiguous cache and on
paged ones (shuffled pages), beside flashcute.attention, SDPA (cuDNN) on the contiguous cache
and FlashAttention-3 where it is importable (its dense call: the same attention), in TFLOP/s
(4·b·h·sq·sk·d, ÷2 causal where sq = sk). A second grid times chunks of 64-1024 query rows
against an 8k-key cache on both paths: the library moves KV-cache calls to the Hopper path
from kKvCacheHopperRows (cpp/dispatch_policy.h) rows on, and copies short pages into a
contiguous workspace from kKvCacheCopyRows query rows per K/V head. "boxes" cells read the
pages in place on the Hopper path (its TMA boxes), through the binding with copy_pages=False.
`--grids ratios` times paged ÷ contiguous at the full-prefill shapes in interleaved rounds.

    python benchmarks/kvcache_prefill.py [--json benchmarks/results/h100-kvcache-prefill.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Callable

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decode import paged, time_ms  # noqa: E402


def _fa3() -> Any:
    try:
        from flash_attn_interface import flash_attn_func
    except ImportError:
        return None
    return flash_attn_func


def _sdpa_cudnn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> Callable[[], Any]:
    """SDPA on the cuDNN backend over (b, h, s, d) views, K/V heads repeated for GQA."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    group = q.shape[2] // k.shape[2]
    qt = q.transpose(1, 2)
    kt = k.repeat_interleave(group, dim=2).transpose(1, 2)
    vt = v.repeat_interleave(group, dim=2).transpose(1, 2)

    def call() -> Any:
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    return call


def _in_place(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, seqlens: torch.Tensor,
              table: torch.Tensor, causal: bool) -> Callable[[], Any]:
    """The Hopper path reading the pages where they are (no copy), through the binding."""
    import flashcute._C as ext
    from torch.utils.dlpack import to_dlpack

    out = torch.empty_like(q)
    side = 2**31 - 1  # no window

    def call() -> Any:
        ext.kvcache_forward(
            to_dlpack(q), to_dlpack(kc), to_dlpack(vc), to_dlpack(out), None, to_dlpack(seqlens),
            to_dlpack(table), None, None, None, q.shape[1], q.shape[-1] ** -0.5, causal, side, side,
            0.0, None, 1, None, ext.BACKEND_HOPPER, torch.cuda.current_stream().cuda_stream, False)
        return out
    return call


def _tflops(flops: float, fn: Callable[[], Any]) -> tuple[float, float]:
    ms = time_ms(fn, iters=10, graph=False)
    return ms, flops / (ms * 1e-3) / 1e12


def full_prefill(rows: list[dict], gen: torch.Generator) -> None:
    import flashcute

    fa3 = _fa3()
    for b, s, h, hk in ((2, 4096, 32, 8), (1, 16384, 32, 8)):
        for causal in (False, True):
            d = 128
            q = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(b, s, hk, d, device="cuda", dtype=torch.bfloat16)
            v = torch.randn_like(k)
            seqlens = torch.full((b,), s, dtype=torch.int32, device="cuda")
            flops = 4 * b * h * s * s * d / (2 if causal else 1)
            calls: dict[str, tuple[int, Callable[[], Any]]] = {
                "attention": (0, lambda: flashcute.attention(q, k, v, causal=causal)),
                "kvcache": (0, lambda: flashcute.attention_with_kvcache(q, k, v, cache_seqlens=seqlens, causal=causal)),
                "kvcache ampere": (0, lambda: flashcute.attention_with_kvcache(
                    q, k, v, cache_seqlens=seqlens, causal=causal, backend="ampere")),
            }
            for page in (1, 16, 32, 64, 256):
                kc, vc, table = paged(k, v, page, gen)
                calls[f"kvcache paged {page}"] = (page, lambda kc=kc, vc=vc, table=table: flashcute.attention_with_kvcache(
                    q, kc, vc, cache_seqlens=seqlens, page_table=table, causal=causal))
                if page in (16, 32):
                    calls[f"kvcache paged {page} boxes"] = (page, _in_place(q, kc, vc, seqlens, table, causal))
                if page == 1:
                    calls["kvcache paged 1 ampere"] = (page, lambda kc=kc, vc=vc, table=table: flashcute.attention_with_kvcache(
                        q, kc, vc, cache_seqlens=seqlens, page_table=table, causal=causal, backend="ampere"))
            try:
                sdpa = _sdpa_cudnn(q, k, v, causal)
                sdpa()
                calls["sdpa cudnn"] = (0, sdpa)
            except RuntimeError:
                pass
            if fa3 is not None:
                calls["fa3"] = (0, lambda: fa3(q, k, v, causal=causal))
            cells = []
            for name, (page, fn) in calls.items():
                ms, tf = _tflops(flops, fn)
                cells.append(f"{name} {tf:.0f}")
                rows.append(dict(feature="kvcache_prefill", impl=name, batch=b, seqlen_q=s, seqlen_k=s, nheads=h,
                                 nheads_kv=hk, headdim=d, causal=causal, page_size=page, ms=ms, tflops=tf))
            print(f"b{b} s{s} h{h}:{hk} causal={causal}: " + ", ".join(cells) + " TFLOP/s", flush=True)
            del q, k, v
            torch.cuda.empty_cache()


def chunks(rows: list[dict], gen: torch.Generator) -> None:
    """Chunks of seqlen_q rows appended to sequences of 8k keys (causal), on both paths."""
    import flashcute

    b, cache, h, hk, d = 4, 8192, 32, 8, 128
    k = torch.randn(b, cache, hk, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    kc, vc, table = paged(k, v, 16, gen)
    for sq in (64, 96, 128, 192, 256, 512, 1024):
        q = torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16)
        seqlens = torch.full((b,), cache, dtype=torch.int32, device="cuda")
        flops = 4 * b * h * sq * cache * d  # causal at sq << sk: about every key
        cells = []
        for page in (0, 16):
            for backend in ("ampere", "hopper", None):
                extra = dict(page_table=table) if page else {}
                kk, vv = (kc, vc) if page else (k, v)
                ms, tf = _tflops(flops, lambda: flashcute.attention_with_kvcache(
                    q, kk, vv, cache_seqlens=seqlens, causal=True, backend=backend, **extra))
                name = f"kvcache {backend or 'chosen'}"
                cells.append(f"{name}{' paged 16' if page else ''} {tf:.0f}")
                rows.append(dict(feature="kvcache_chunk", impl=name, batch=b, seqlen_q=sq, seqlen_k=cache, nheads=h,
                                 nheads_kv=hk, headdim=d, causal=True, page_size=page, ms=ms, tflops=tf))
        ms, tf = _tflops(flops, _in_place(q, kc, vc, seqlens, table, True))
        cells.append(f"kvcache hopper paged 16 boxes {tf:.0f}")
        rows.append(dict(feature="kvcache_chunk", impl="kvcache hopper boxes", batch=b, seqlen_q=sq, seqlen_k=cache,
                         nheads=h, nheads_kv=hk, headdim=d, causal=True, page_size=16, ms=ms, tflops=tf))
        print(f"b{b} sq{sq} cache{cache} h{h}:{hk}: " + ", ".join(cells) + " TFLOP/s", flush=True)


def ratios(rows: list[dict], gen: torch.Generator, rounds: int = 6) -> None:
    """Paged ÷ contiguous at the full-prefill shapes, interleaved: per round 10 calls of each of
    the contiguous cache and pages of 1, 16 and 32 keys (the library's choice), so that clock
    drift falls on all alike; medians over the rounds and the per-round range."""
    import statistics

    import flashcute

    for b, s in ((2, 4096), (1, 16384)):
        for causal in (False, True):
            h, hk, d = 32, 8, 128
            q = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(b, s, hk, d, device="cuda", dtype=torch.bfloat16)
            v = torch.randn_like(k)
            seqlens = torch.full((b,), s, dtype=torch.int32, device="cuda")
            calls: dict[int, Callable[[], Any]] = {0: lambda: flashcute.attention_with_kvcache(
                q, k, v, cache_seqlens=seqlens, causal=causal)}
            for page in (1, 16, 32):
                kc, vc, table = paged(k, v, page, gen)
                calls[page] = lambda kc=kc, vc=vc, table=table: flashcute.attention_with_kvcache(
                    q, kc, vc, cache_seqlens=seqlens, page_table=table, causal=causal)
            for fn in calls.values():
                for _ in range(3):
                    fn()
            times: dict[int, list[float]] = {page: [] for page in calls}
            for _ in range(rounds):
                for page, fn in calls.items():
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    for _ in range(10):
                        fn()
                    end.record()
                    torch.cuda.synchronize()
                    times[page].append(start.elapsed_time(end) / 10)
            flops = 4 * b * h * s * s * d / (2 if causal else 1)
            base = statistics.median(times[0])
            cells = [f"contiguous {flops / (base * 1e-3) / 1e12:.0f} TFLOP/s"]
            for page in (1, 16, 32):
                per_round = [c / p for c, p in zip(times[0], times[page])]
                ratio = base / statistics.median(times[page])
                cells.append(f"p{page} {ratio:.3f} ({min(per_round):.3f}-{max(per_round):.3f})")
                rows.append(dict(feature="kvcache_prefill_ratio", batch=b, seqlen_q=s, seqlen_k=s, nheads=h,
                                 nheads_kv=hk, headdim=d, causal=causal, page_size=page, ratio=ratio,
                                 ratio_min=min(per_round), ratio_max=max(per_round)))
            print(f"b{b} s{s} causal={causal}: " + ", ".join(cells), flush=True)
            del q, k, v, calls
            torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--grids", default="full,chunks", help="any of full, chunks, ratios")
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(0)
    rows: list[dict] = []
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    if "full" in args.grids:
        full_prefill(rows, gen)
    if "chunks" in args.grids:
        chunks(rows, gen)
    if "ratios" in args.grids:
        ratios(rows, gen)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
