"""Prefill against a KV cache: flashcute.attention_with_kvcache on a contiguous and on paged
caches (shuffled pages), beside flashcute.attention on both paths, in TFLOP/s (4·b·h·s²·d,
÷2 causal).

    python benchmarks/kvcache_prefill.py
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decode import paged, time_ms  # noqa: E402


def main() -> None:
    import flashcute

    gen = torch.Generator().manual_seed(0)
    for b, s, h, hk in ((2, 4096, 32, 8), (1, 16384, 32, 8)):
        for causal in (False, True):
            d = 128
            q = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(b, s, hk, d, device="cuda", dtype=torch.bfloat16)
            v = torch.randn_like(k)
            seqlens = torch.full((b,), s, dtype=torch.int32, device="cuda")
            flops = 4 * b * h * s * s * d / (2 if causal else 1)
            calls = {
                "attention ampere": lambda: flashcute.attention(q, k, v, causal=causal, backend="ampere"),
                "attention": lambda: flashcute.attention(q, k, v, causal=causal),
                "kvcache contiguous": lambda: flashcute.attention_with_kvcache(
                    q, k, v, cache_seqlens=seqlens, causal=causal),
            }
            for page in (16, 256):
                kc, vc, table = paged(k, v, page, gen)
                calls[f"kvcache paged {page}"] = (
                    lambda kc=kc, vc=vc, table=table: flashcute.attention_with_kvcache(
                        q, kc, vc, cache_seqlens=seqlens, page_table=table, causal=causal))
            cells = []
            for name, fn in calls.items():
                ms = time_ms(fn, iters=10, graph=False)
                cells.append(f"{name} {flops / (ms * 1e-3) / 1e12:.0f}")
            print(f"b{b} s{s} h{h}:{hk} causal={causal}: " + ", ".join(cells) + " TFLOP/s", flush=True)


if __name__ == "__main__":
    main()
