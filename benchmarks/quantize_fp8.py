"""flashcute.quantize_fp8's bandwidth against a device-to-device copy: bytes read (x) plus bytes
written (x_fp8, descale) per second, and the fraction of what a copy of x's bytes
(``dst.copy_(src)``: x's size read and written) sustains, per shape and mode (per head or per
block, with or without the Hadamard transform).

Two timings per case, each after warm-up:
  - stream: the median over --reps calls of each call's own time (CUDA events around it), with
    L2 flushed before each call and the calls queued behind a sleep kernel, so that host-side
    overhead (Python, argument checks) is not in the times while launch latency is;
  - graph: a CUDA graph of 20 back-to-back calls, replayed, per call (median over --reps / 10
    replays): launches without host overhead and without gaps; consecutive calls may find part
    of x in L2.
Needs torch and flashcute only.

    python benchmarks/quantize_fp8.py [--dtype bfloat16] [--reps 100]
"""

from __future__ import annotations

import argparse
import statistics

import torch

SHAPES = [(4, 8192, 32, 128), (1, 65536, 8, 128), (4, 8192, 32, 64), (4, 8192, 32, 256),
          (1, 65536, 8, 64), (1, 65536, 8, 256)]
GRAPH_CALLS = 20


class Timer:
    def __init__(self, warmup: int, reps: int):
        self.warmup, self.reps = warmup, reps
        self.flush = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")  # > any L2

    def stream_ms(self, fn) -> float:
        """Median over reps of one call's time, L2 flushed before each, calls queued ahead."""
        for _ in range(self.warmup):
            fn()
        torch.cuda.synchronize()
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(self.reps)]
        torch.cuda._sleep(int(2e7))  # ~10 ms: the host enqueues everything before the GPU gets there
        for start, end in events:
            self.flush.zero_()
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        return statistics.median(start.elapsed_time(end) for start, end in events)

    def graph_ms(self, fn) -> float | None:
        """Per-call time in a CUDA graph of GRAPH_CALLS calls (median over replays); None where
        the calls cannot be captured."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up outside the capture (allocator, host caches)
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                for _ in range(GRAPH_CALLS):
                    fn()
        except RuntimeError as err:
            print(f"    (no CUDA graph: {err})")
            return None
        for _ in range(max(1, self.warmup // 5)):
            graph.replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(max(5, self.reps // 10)):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / GRAPH_CALLS)
        return statistics.median(times)


def main() -> None:
    import flashcute

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["float16", "bfloat16"])
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--reps", type=int, default=100, help="calls timed per case (at least 50)")
    parser.add_argument("--no-graph", action="store_true", help="skip the CUDA graph timings")
    args = parser.parse_args()
    args.reps = max(args.reps, 50)
    dtype = getattr(torch, args.dtype)
    timer = Timer(args.warmup, args.reps)
    print(f"{torch.cuda.get_device_name()}, x {args.dtype}; GB/s = (x + x_fp8 + descale bytes) / time; "
          f"stream: median of {args.reps} calls, L2 flushed; graph: {GRAPH_CALLS} calls per graph")
    print(f"{'shape':>20} {'mode':>14} | {'ms':>7} {'GB/s':>6} {'copy':>6} {'of copy':>7} | "
          f"{'graph ms':>8} {'GB/s':>6} {'copy':>6} {'of copy':>7}")
    for shape in SHAPES:
        x = torch.randn(shape, device="cuda", dtype=dtype)
        src = x.view(torch.uint8).flatten()
        dst = torch.empty_like(src)
        copy = lambda: dst.copy_(src)  # noqa: E731
        copy_gbs = 2 * src.numel() / (timer.stream_ms(copy) * 1e-3) / 1e9
        copy_graph_ms = None if args.no_graph else timer.graph_ms(copy)
        copy_graph_gbs = copy_graph_ms and 2 * src.numel() / (copy_graph_ms * 1e-3) / 1e9
        for block in (False, True):
            for hadamard in (False, True):
                call = lambda: flashcute.quantize_fp8(x, block=block, hadamard=hadamard, seed=1)  # noqa: E731
                x_fp8, descale = call()
                nbytes = x.numel() * x.element_size() + x_fp8.numel() + descale.numel() * 4
                ms = timer.stream_ms(call)
                gbs = nbytes / (ms * 1e-3) / 1e9
                mode = ("block" if block else "head") + (" hadamard" if hadamard else "")
                line = f"{str(shape):>20} {mode:>14} | {ms:7.3f} {gbs:6.0f} {copy_gbs:6.0f} {gbs / copy_gbs:7.1%} | "
                graph_ms = None if args.no_graph else timer.graph_ms(call)
                if graph_ms and copy_graph_gbs:
                    graph_gbs = nbytes / (graph_ms * 1e-3) / 1e9
                    line += f"{graph_ms:8.3f} {graph_gbs:6.0f} {copy_graph_gbs:6.0f} {graph_gbs / copy_graph_gbs:7.1%}"
                print(line, flush=True)
        del x, src, dst


if __name__ == "__main__":
    main()
