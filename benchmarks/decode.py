"""Decoding against a KV cache: bandwidth of flashcute.attention_with_kvcache beside SDPA.

Every cell reads K and V of `cache` keys per sequence (all sequences full); its HBM fraction is
those bytes over the kernel time, divided by the bandwidth a device-to-device copy measures on
the same GPU ((read + write) bytes / time). Layouts: a contiguous cache, and paged caches with
shuffled page tables. SDPA (cuDNN or flash, whichever torch picks; GQA through enable_gqa) runs
on the contiguous cache in the same process.

    python benchmarks/decode.py --out benchmarks/results/h100-decode.json
"""

from __future__ import annotations

import argparse
import json
import math
import platform
from typing import Any, Callable, Dict, List, Optional

import torch


def time_ms(fn: Callable[[], Any], iters: int = 50, warmup: int = 5, rounds: int = 3, graph: bool = True) -> float:
    """Median over `rounds` of the mean CUDA-event time of `iters` back-to-back calls, replayed
    from one CUDA graph (as servers run decode steps) so that host time does not count."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    run = fn
    if graph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(iters):
                fn()
        run = g.replay
    results = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        if graph:
            run()
        else:
            for _ in range(iters):
                run()
        end.record()
        torch.cuda.synchronize()
        results.append(start.elapsed_time(end) / iters)
    return sorted(results)[len(results) // 2]


def copy_bandwidth(gib: float = 4.0) -> float:
    """Bytes per second a device-to-device copy moves (read + write)."""
    n = int(gib * 2**30)
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), iters=10, graph=False)
    del src, dst
    return 2 * n / (ms * 1e-3)


def paged(k: torch.Tensor, v: torch.Tensor, page: int, gen: torch.Generator, shuffled: bool = True):
    """The contiguous caches (batch, S, hk, d) as pages (shuffled, or in order), and their page table."""
    b, s, hk, d = k.shape
    pages_per_seq = (s + page - 1) // page
    n = b * pages_per_seq
    perm = (torch.randperm(n, generator=gen, device="cpu") if shuffled else torch.arange(n)).to(k.device)
    table = perm.view(b, pages_per_seq).to(torch.int32)
    pad = pages_per_seq * page - s
    kp = torch.nn.functional.pad(k, (0, 0, 0, 0, 0, pad)).view(n, page, hk, d)
    vp = torch.nn.functional.pad(v, (0, 0, 0, 0, 0, pad)).view(n, page, hk, d)
    k_pages = torch.empty_like(kp)
    v_pages = torch.empty_like(vp)
    k_pages[perm] = kp
    v_pages[perm] = vp
    return k_pages, v_pages, table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,4,16,64,128")
    ap.add_argument("--caches", default="1024,8192,32768,131072")
    ap.add_argument("--seqlen-q", default="1,4")
    ap.add_argument("--heads", default="32:8,64:8")
    ap.add_argument("--headdim", type=int, default=128)
    ap.add_argument("--pages", default="0,16,1", help="page sizes; 0 = contiguous cache")
    ap.add_argument("--page-order", choices=("shuffled", "ordered"), default="shuffled",
                    help="page tables: a random permutation of the pages, or pages in order")
    ap.add_argument("--max-tokens", type=int, default=4 << 20, help="skip cells with more cached keys in all")
    ap.add_argument("--num-splits", type=int, default=0)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--no-sdpa", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    import flashcute

    dtype = torch.bfloat16
    d = args.headdim
    gen = torch.Generator().manual_seed(0)
    bw = copy_bandwidth()
    device_name = torch.cuda.get_device_name()
    print(f"{device_name}: device-to-device copy {bw / 1e9:.0f} GB/s")
    rows: List[Dict[str, Any]] = []
    for heads in args.heads.split(","):
        h, hk = (int(x) for x in heads.split(":"))
        for sq in (int(x) for x in args.seqlen_q.split(",")):
            for b in (int(x) for x in args.batches.split(",")):
                for s in (int(x) for x in args.caches.split(",")):
                    if b * s > args.max_tokens:
                        continue
                    q = torch.randn(b, sq, h, d, device="cuda", dtype=dtype)
                    k = torch.randn(b, s, hk, d, device="cuda", dtype=dtype)
                    v = torch.randn(b, s, hk, d, device="cuda", dtype=dtype)
                    seqlens = torch.full((b,), s, dtype=torch.int32, device="cuda")
                    kv_bytes = 2 * b * s * hk * d * k.element_size()
                    base: Dict[str, Any] = dict(feature="decode", device=device_name, dtype="bf16", batch=b,
                                                seqlen_q=sq, seqlen_k=s, nheads=h, nheads_kv=hk, headdim=d,
                                                causal=args.causal, copy_gbps=round(bw / 1e9, 1))
                    times: Dict[str, float] = {}
                    for page in (int(x) for x in args.pages.split(",")):
                        if page:
                            kc, vc, table = paged(k, v, page, gen, args.page_order == "shuffled")
                        else:
                            kc, vc, table = k, v, None
                        out = torch.empty_like(q)

                        def call() -> None:
                            flashcute.attention_with_kvcache(q, kc, vc, cache_seqlens=seqlens, page_table=table,
                                                             causal=args.causal, num_splits=args.num_splits,
                                                             out=out)

                        ms = time_ms(call)
                        times[f"page{page}"] = ms
                        layout = "contiguous" if not page else f"paged{page}" + (
                            "" if args.page_order == "shuffled" else "-ordered")
                        row = dict(base, impl="flashcute", layout=layout,
                                   page_size=page, ms=round(ms, 5),
                                   hbm_fraction=round(kv_bytes / (ms * 1e-3) / bw, 3))
                        rows.append(row)
                        del kc, vc, table
                    if not args.no_sdpa:
                        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

                        def sdpa() -> None:
                            torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True,
                                                                             is_causal=False)

                        try:
                            ms = time_ms(sdpa)
                            rows.append(dict(base, impl="sdpa", layout="contiguous", page_size=0, ms=round(ms, 5),
                                             hbm_fraction=round(kv_bytes / (ms * 1e-3) / bw, 3)))
                            times["sdpa"] = ms
                        except RuntimeError as err:  # no SDPA kernel for the shape
                            print(f"sdpa: {err}")
                    cells = " ".join(f"{key} {kv_bytes / (t * 1e-3) / bw:.2f}" for key, t in times.items())
                    print(f"h{h}:{hk} sq{sq} b{b} s{s}: HBM fraction {cells}", flush=True)
                    del q, k, v
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(device=device_name, torch=torch.__version__, python=platform.python_version(),
                           copy_gbps=round(bw / 1e9, 1), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
