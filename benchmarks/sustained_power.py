"""Throughput and energy per FLOP under the board's power limit (sustained back-to-back calls).

`python -m flashcute.bench` times 100 ms windows, in which the card is still settling onto
its power limit. Long attention jobs run at the limit, where the clock drops until the board
draws its cap, so there throughput is the work done per joule. This script runs each
implementation back to back for a few seconds per grid point (after the card has idled for
a second), reads the board's energy counter and SM clock through NVML, and prints
TFLOP/s, watts, mean SM clock, TFLOP per joule, and the ratios flashcute (its Hopper path) /
SDPA cuDNN.
Rounds alternate the order of the implementations.

    python benchmarks/sustained_power.py [--points 256n4096,128n2048] [--seconds 3]
        [--rounds 2] [--backward] [--json PATH]

A point is head dim, ``n`` or ``c`` (causal), seqlen, on the grid of `flashcute.bench`
(batch·seqlen 16384, nheads·hdim 2048, bf16). NVML comes from the driver
(``libnvidia-ml.so.1``), read through ctypes.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import re
import statistics
import time
from typing import Any, Callable

import torch

from flashcute.bench.grid import BenchConfig, attention_flops, build_grid
from flashcute.bench.impls import impl_context, make_backward_fn, make_forward_fn
from flashcute.bench.timing import make_inputs

IMPLS = ("flashcute-hopper", "sdpa-cudnn")
DEFAULT_POINTS = "64n2048,128n2048,128n16384,256n2048,256n4096,256c2048"
NVML_CLOCK_SM = 1
HEADER = ("hd", "mask", "seqlen", "fc TFLOP/s", "cuDNN TFLOP/s", "fc / cuDNN", "fc W", "cuDNN W",
          "fc MHz", "cuDNN MHz", "fc TFLOP/J", "cuDNN TFLOP/J", "fc / cuDNN TFLOP/J")


class Nvml:
    """The few NVML counters this script reads, for GPU 0."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        if self.lib.nvmlInit_v2() != 0:
            raise RuntimeError("nvmlInit_v2 failed")
        self.handle = ctypes.c_void_p()
        if self.lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(self.handle)) != 0:
            raise RuntimeError("nvmlDeviceGetHandleByIndex_v2(0) failed")

    def energy_joules(self) -> float:
        """Energy the board has used since the driver loaded."""
        millijoules = ctypes.c_ulonglong()
        if self.lib.nvmlDeviceGetTotalEnergyConsumption(self.handle, ctypes.byref(millijoules)) != 0:
            raise RuntimeError("nvmlDeviceGetTotalEnergyConsumption failed (needs Volta or newer)")
        return millijoules.value / 1e3

    def sm_clock_mhz(self) -> int:
        """The SM clock now."""
        mhz = ctypes.c_uint()
        self.lib.nvmlDeviceGetClockInfo(self.handle, NVML_CLOCK_SM, ctypes.byref(mhz))
        return mhz.value


def parse_point(text: str) -> BenchConfig:
    """``256n4096`` -> the grid's configuration for hd 256, non-causal, seqlen 4096."""
    match = re.fullmatch(r"(\d+)([nc])(\d+)", text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"a point is <hdim><n|c><seqlen>, e.g. 256n4096; got {text!r}")
    hdim, mask, seqlen = int(match[1]), match[2], int(match[3])
    try:
        (cfg,) = build_grid([hdim], [seqlen], [mask == "c"])
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    return cfg


def sustained(fn: Callable[[], Any], nvml: Nvml, seconds: float, flops: float) -> dict[str, float]:
    """Run ``fn`` back to back for ``seconds`` from an idle card; throughput and energy."""
    time.sleep(1.0)  # every implementation starts from the same idle, cool card
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    calls, clocks = 0, []
    joules0, start = nvml.energy_joules(), time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(10):
            fn()
        calls += 10
        torch.cuda.synchronize()
        clocks.append(nvml.sm_clock_mhz())
    elapsed, joules = time.perf_counter() - start, nvml.energy_joules() - joules0
    settled = clocks[len(clocks) // 3 :] or clocks  # past the first third: at the power limit
    return {
        "tflops": flops * calls / elapsed / 1e12,
        "watts": joules / elapsed,
        "sm_mhz": statistics.mean(settled),
        "tflop_per_joule": flops * calls / joules / 1e12,
    }


def measure(cfg: BenchConfig, nvml: Nvml, seconds: float, rounds: int, backward: bool) -> dict[str, Any]:
    """Median over ``rounds`` of :func:`sustained` for each implementation on ``cfg``."""
    q, k, v = make_inputs(cfg)
    flops = attention_flops(
        cfg.batch, cfg.nheads, cfg.seqlen, cfg.seqlen, cfg.hdim, cfg.causal, backward=backward
    )
    runs: dict[str, list[dict[str, float]]] = {impl: [] for impl in IMPLS}
    for r in range(rounds):
        for impl in IMPLS if r % 2 == 0 else IMPLS[::-1]:
            with impl_context(impl):
                make = make_backward_fn if backward else make_forward_fn
                fn = make(impl, q, k, v, cfg.causal)
                runs[impl].append(sustained(fn, nvml, seconds, flops))
            del fn
    return {
        impl: {key: statistics.median(run[key] for run in rs) for key in rs[0]}
        for impl, rs in runs.items()
    }


def format_row(cfg: BenchConfig, fc: dict[str, float], cu: dict[str, float]) -> str:
    """One table row: flashcute (fc) and cuDNN (cu) under the same header."""
    values = (
        cfg.hdim, "c" if cfg.causal else "n", cfg.seqlen,
        f"{fc['tflops']:.1f}", f"{cu['tflops']:.1f}", f"{fc['tflops'] / cu['tflops']:.2f}",
        f"{fc['watts']:.0f}", f"{cu['watts']:.0f}", f"{fc['sm_mhz']:.0f}", f"{cu['sm_mhz']:.0f}",
        f"{fc['tflop_per_joule']:.3f}", f"{cu['tflop_per_joule']:.3f}",
        f"{fc['tflop_per_joule'] / cu['tflop_per_joule']:.2f}",
    )
    return "  ".join(f"{value:>{len(name)}}" for value, name in zip(values, HEADER))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", default=DEFAULT_POINTS,
                        type=lambda text: [parse_point(p) for p in text.split(",")])
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds of back-to-back calls per run")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--backward", action="store_true",
                        help="time the backward pass (2.5x the forward FLOPs)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        parser.error("needs an sm90 GPU (H100/H200): it times flashcute's Hopper path")
    nvml = Nvml()
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  "
          f"{'backward' if args.backward else 'forward'}: {args.seconds:g} s of back-to-back calls "
          f"per run, median of {args.rounds} alternating rounds")
    print("  ".join(HEADER))
    results = []
    for cfg in args.points:
        res = measure(cfg, nvml, args.seconds, args.rounds, args.backward)
        results.append({"hdim": cfg.hdim, "causal": cfg.causal, "seqlen": cfg.seqlen, **res})
        print(format_row(cfg, res["flashcute-hopper"], res["sdpa-cudnn"]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "backward": args.backward,
                       "seconds": args.seconds, "rounds": args.rounds, "points": results},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
