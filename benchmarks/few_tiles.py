"""Forward time of calls with few query tiles and long keys (decoding, chunked prefill).

Such calls have fewer query tiles than the GPU has SMs, so the Hopper path splits every tile's
key range over several CTAs and merges the pieces. The grid benchmark (`python -m
flashcute.bench`) never gets there. Times are GPU times: 20 calls captured in a CUDA graph,
replayed, median of 7 replays, so host overhead does not count. SDPA's flash and cuDNN backends
run in the same process.

    python benchmarks/few_tiles.py [--dtype bf16] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashcute

# (batch, seqlen_q, seqlen_k, nheads, nheads_kv, headdim)
SHAPES = [
    (1, 1, 4096, 16, 16, 128), (1, 1, 32768, 8, 8, 128), (1, 1, 16384, 32, 32, 64),
    (1, 1, 30000, 8, 2, 128), (1, 16, 65536, 4, 4, 64), (1, 64, 16384, 4, 4, 256),
    (1, 100, 20000, 2, 2, 128), (1, 128, 8192, 8, 8, 128), (2, 256, 4096, 4, 4, 64),
    (1, 333, 9000, 3, 3, 128), (4, 1, 8192, 32, 8, 128), (1, 4, 16384, 64, 8, 128),
    (8, 1, 4096, 16, 2, 64), (2, 1, 16384, 16, 2, 256),
]
CALLS_PER_GRAPH = 20


def graph_us(fn: Callable[[], object]) -> float:
    """Median GPU time of one call, in microseconds, from CUDA-graph replays."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS_PER_GRAPH):
            fn()
    graph.replay()
    times = []
    for _ in range(7):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / CALLS_PER_GRAPH)
    return statistics.median(times)


def run_shape(shape: tuple[int, ...], dtype: torch.dtype) -> dict[str, float]:
    b, sq, sk, h, hkv, d = shape
    q = torch.randn(b, sq, h, d, device="cuda", dtype=dtype)
    k, v = (torch.randn(b, sk, hkv, d, device="cuda", dtype=dtype) for _ in range(2))
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    ref = F.scaled_dot_product_attention(qt.float(), kt.float(), vt.float(), enable_gqa=h != hkv)
    err = (flashcute.attention(q, k, v).float() - ref.transpose(1, 2)).abs().max().item()
    times = {"flashcute": graph_us(lambda: flashcute.attention(q, k, v))}
    for name, backend in (("sdpa-flash", SDPBackend.FLASH_ATTENTION),
                          ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION)):
        try:
            with sdpa_kernel([backend]):
                times[name] = graph_us(
                    lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=h != hkv))
        except RuntimeError:  # the backend does not take this shape (GQA, say)
            times[name] = float("nan")
    return {"max_abs_err": err, **{f"{n}_us": t for n, t in times.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    parser.add_argument("--json", metavar="PATH", help="write results as JSON")
    args = parser.parse_args()
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    torch.manual_seed(0)
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  "
          f"flashcute {flashcute.__version__}  {args.dtype}; GPU us per call (CUDA graph)")
    print("batch seqlen_q seqlen_k nheads nheads_kv hdim | flashcute sdpa-flash sdpa-cudnn us "
          "| flashcute TFLOP/s | vs flash vs cudnn | max err")
    rows = []
    for shape in SHAPES:
        r = run_shape(shape, dtype)
        b, sq, sk, h, _, d = shape
        fc, fl, cd = r["flashcute_us"], r["sdpa-flash_us"], r["sdpa-cudnn_us"]
        tflops = 4 * b * h * sq * sk * d / fc / 1e6
        print(f"{' '.join(map(str, shape))} | {fc:.1f} {fl:.1f} {cd:.1f} | {tflops:.0f} | "
              f"{fl / fc:.2f}x {cd / fc:.2f}x | {r['max_abs_err']:.1e}", flush=True)
        rows.append({"shape": shape, "flashcute_tflops": tflops, **r})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "dtype": args.dtype, "rows": rows}, f,
                      indent=1)


if __name__ == "__main__":
    main()
