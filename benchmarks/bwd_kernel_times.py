"""GPU time per kernel of one backward call: flashcute's passes against SDPA cuDNN's.

For each shape of the benchmark grid given (bf16, batch·seqlen 16k, hidden 2048), the wall
time of back-to-back calls (CUDA events) and, under torch.profiler, the time of every kernel
the call launches: flashcute's prepare pass, dq_accum memset, dK/dV kernel and dQ conversion
(a programmatic dependent of the dK/dV kernel, so its duration includes its wait), and cuDNN's
counterparts. The wall time is what the passes that do not overlap add up to.

    python benchmarks/bwd_kernel_times.py [--shapes 128n2048,128c4096,64n2048] [--calls 10]
"""

from __future__ import annotations

import argparse
import collections
import re
from typing import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

import flashcute


def parse_shape(text: str) -> tuple[int, bool, int]:
    """'128c4096' -> (head dim 128, causal, seqlen 4096); 'n' for non-causal."""
    match = re.fullmatch(r"(\d+)([nc])(\d+)", text)
    if match is None:
        raise argparse.ArgumentTypeError(f"shape {text!r}: expected HEADDIM{{n|c}}SEQLEN, e.g. 128n2048")
    return int(match[1]), match[2] == "c", int(match[3])


def wall_us(fn: Callable[[], None], calls: int) -> float:
    """Mean GPU time per call of `calls` back-to-back calls, after five warm-up calls."""
    for _ in range(5):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls * 1e3


def kernel_us(fn: Callable[[], None], calls: int) -> dict[str, float]:
    """GPU time per call of every kernel (and memset) `fn` launches, by name."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    times: dict[str, float] = collections.defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            times[event.name[:70]] += event.device_time / calls
    return dict(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="128n2048,128n4096,128c4096,128n16384,64n2048",
                        type=lambda s: [parse_shape(x) for x in s.split(",")])
    parser.add_argument("--calls", type=int, default=10)
    args = parser.parse_args()
    for hd, causal, seqlen in args.shapes:
        batch, heads = 16384 // seqlen, 2048 // hd
        q, k, v = (torch.randn(batch, seqlen, heads, hd, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        out, lse = flashcute.attention(q, k, v, causal=causal, return_lse=True)
        dout = torch.randn_like(out)
        qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_(True) for x in (q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            sdpa_out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

        def flashcute_bwd() -> None:
            flashcute.attention_backward(dout, q, k, v, out, lse, causal=causal)

        def cudnn_bwd() -> None:
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                torch.autograd.grad(sdpa_out, (qt, kt, vt), dout.transpose(1, 2), retain_graph=True)

        flops = 2.5 * 4 * batch * heads * seqlen * seqlen * hd / (2 if causal else 1)
        for name, fn in (("flashcute", flashcute_bwd), ("sdpa-cudnn", cudnn_bwd)):
            wall = wall_us(fn, args.calls)
            print(f"hd {hd} {'causal' if causal else 'non-causal'} {seqlen} {name}: "
                  f"{wall:.1f} us per call ({flops / wall / 1e6:.0f} TFLOP/s)")
            for kernel, us in sorted(kernel_us(fn, args.calls).items(), key=lambda item: -item[1]):
                print(f"    {us:9.1f} us  {kernel}")


if __name__ == "__main__":
    main()
