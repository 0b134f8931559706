"""FP8 (e4m3) attention forward: speed beside FlashAttention-3's e4m3 forward and cuDNN bf16, and
accuracy per quantization mode against float64 and against the exact emulation of its roundings.

Speed: the grid batch · seqlen = 16k, nheads · headdim = 2048, causal and not, with per-(batch,
head) descales and with block descales; FLOPs counted as for bf16 (4 · b · h · s² · d, halved
causal). FlashAttention-3 is timed in the same process where it is importable; SDPA (cuDNN,
bf16) always. The calls of a cell alternate (``time_interleaved``).

Accuracy (the FlashAttention-3 paper's inputs: standard normal, 0.1 % of entries × 10): RMSE,
cosine similarity and relative L1 of the kernel's output against float64 attention of the
unquantized inputs, for (a) per-tensor scales, (b) per-block scales and (c) per-block scales
after the random-sign Hadamard transform (``flashcute.quantize_fp8``), each beside the exact
float64 emulation of the same mode (``flashcute.reference_fp8``).

    python benchmarks/fp8.py --out benchmarks/results/h100-fp8.json
"""

from __future__ import annotations

import argparse
import json
import math
import platform
from typing import Any, Callable

import numpy as np
import torch

import flashcute
from flashcute import reference_fp8 as ref

try:
    from flash_attn_interface import flash_attn_func as fa3_func
except ImportError:  # the benchmark runs without FlashAttention-3
    fa3_func = None


def time_interleaved(fns: dict[str, Callable[[], Any]], reps: int = 40, warmup: int = 5) -> dict[str, float]:
    """Median CUDA-event time of one call of each function. The calls alternate, in reversed
    order every other round, so that no function always runs on a GPU its predecessor warmed
    (the large cells run at the power cap)."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    torch.cuda.synchronize()
    events = {name: [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                     for _ in range(reps)] for name in fns}
    for i in range(reps):
        for name in (list(fns) if i % 2 == 0 else list(reversed(fns))):
            start, end = events[name][i]
            start.record()
            fns[name]()
            end.record()
    torch.cuda.synchronize()
    return {name: float(np.median([s.elapsed_time(e) for s, e in pairs])) for name, pairs in events.items()}


def speed(headdims: list[int], seqlens: list[int]) -> list[dict[str, Any]]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rows = []
    for d in headdims:
        for s in seqlens:
            for causal in (False, True):
                b, h = max(1, 16384 // s), 2048 // d
                x = [torch.randn(b, s, h, d, device="cuda") for _ in range(3)]
                q8, k8, v8 = (t.to(torch.float8_e4m3fn) for t in x)
                ones = torch.ones(b, h, device="cuda")
                blocks = torch.ones(b, h, -(-s // flashcute.FP8_BLOCK), device="cuda")
                qb, kb, vb = (t.to(torch.bfloat16).transpose(1, 2) for t in x)
                flops = 4 * b * h * s * s * d / (2 if causal else 1)

                def cudnn() -> torch.Tensor:
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        return torch.nn.functional.scaled_dot_product_attention(qb, kb, vb, is_causal=causal)

                fns: dict[str, Callable[[], Any]] = {
                    "flashcute/head": lambda: flashcute.attention(
                        q8, k8, v8, causal=causal, q_descale=ones, k_descale=ones, v_descale=ones),
                    "flashcute/block": lambda: flashcute.attention(
                        q8, k8, v8, causal=causal, q_descale=blocks, k_descale=blocks, v_descale=blocks),
                    "cudnn/-": cudnn,
                }
                if fa3_func is not None:
                    fns["fa3/head"] = lambda: fa3_func(
                        q8, k8, v8, causal=causal, q_descale=ones, k_descale=ones, v_descale=ones)
                for key, ms in time_interleaved(fns).items():
                    impl, scales = key.split("/")
                    rows.append({"headdim": d, "seqlen": s, "batch": b, "nheads": h, "causal": causal,
                                 "feature": "fp8", "dtype": "bf16" if impl == "cudnn" else "e4m3",
                                 "impl": impl, "scales": scales, "ms": ms, "tflops": flops / ms / 1e9})
                del x, q8, k8, v8, qb, kb, vb
    return rows


def _per_tensor(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 x, (b, h) descale) with one scale for the whole tensor."""
    descale = (x.abs().amax().clamp_min(1e-30) / ref.E4M3_MAX).float()
    x8 = (x / descale).to(torch.float8_e4m3fn)
    return x8, descale.expand(x.shape[0], x.shape[2]).contiguous()


def accuracy(seqlen: int, heads: int, headdim: int, causal: bool, seed: int = 7) -> list[dict[str, Any]]:
    shape = (1, seqlen, heads, headdim)
    q, k, v = (ref.outlier_inputs(shape, i) for i in range(3))
    exact = ref.attention(q, k, v, causal=causal)
    qt, kt, vt = (torch.from_numpy(x).to("cuda", torch.bfloat16) for x in (q, k, v))
    rows = []
    for mode, granularity, hadamard in (("(a) per tensor", "tensor", False), ("(b) per block", "block", False),
                                        ("(c) per block + Hadamard", "block", True)):
        if granularity == "tensor":
            (q8, qd), (k8, kd), (v8, vd) = (_per_tensor(x) for x in (qt, kt, vt))
        else:
            q8, qd = flashcute.quantize_fp8(qt, block=True, hadamard=hadamard, seed=seed)
            k8, kd = flashcute.quantize_fp8(kt, block=True, hadamard=hadamard, seed=seed)
            v8, vd = flashcute.quantize_fp8(vt, block=True)
        out = flashcute.attention(q8, k8, v8, causal=causal, q_descale=qd, k_descale=kd, v_descale=vd)
        got = ref.errors(out.double().cpu().numpy(), exact)
        # The emulation quantizes the bf16 inputs the kernel saw.
        q64, k64, v64 = (x.double().cpu().numpy() for x in (qt, kt, vt))
        emulated = ref.errors(ref.attention_fp8(q64, k64, v64, granularity=granularity,
                                                hadamard_seed=seed if hadamard else None, causal=causal), exact)
        rows.append({"feature": "fp8_accuracy", "dtype": "e4m3", "mode": mode, "seqlen": seqlen, "nheads": heads,
                     "headdim": headdim, "causal": causal, **{f"kernel_{n}": x for n, x in got.items()},
                     **{f"emulation_{n}": x for n, x in emulated.items()},
                     "kernel_over_emulation_rmse": got["rmse"] / emulated["rmse"]})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--headdims", default="64,128,256")
    parser.add_argument("--seqlens", default="512,1024,2048,4096,8192,16384")
    parser.add_argument("--out", default=None, help="JSON file for the rows")
    parser.add_argument("--no-speed", action="store_true")
    parser.add_argument("--no-accuracy", action="store_true")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    if not args.no_speed:
        rows += speed([int(d) for d in args.headdims.split(",")], [int(s) for s in args.seqlens.split(",")])
        by_cell: dict[tuple, dict[str, float]] = {}
        for r in rows:
            by_cell.setdefault((r["headdim"], r["seqlen"], r["causal"]), {})[f"{r['impl']}/{r['scales']}"] = r["tflops"]
        print("| hd | seqlen | causal | flashcute TFLOP/s | block scales | FA3 e4m3 | ÷ FA3 | cuDNN bf16 | ÷ cuDNN |")
        print("|---|---|---|---|---|---|---|---|---|")
        for (d, s, causal), t in by_cell.items():
            fc, fa3, cudnn = t["flashcute/head"], t.get("fa3/head"), t["cudnn/-"]
            print(f"| {d} | {s} | {int(causal)} | {fc:.0f} | {t['flashcute/block']:.0f} "
                  f"({t['flashcute/block'] / fc:.3f}) | {fa3 or float('nan'):.0f} | "
                  f"{fc / fa3 if fa3 else float('nan'):.3f} | {cudnn:.0f} | {fc / cudnn:.2f} |")
    if not args.no_accuracy:
        acc = accuracy(1024, 4, 128, False) + accuracy(1024, 4, 128, True)
        print("\n| mode | causal | RMSE | cosine | rel L1 | emulation RMSE | kernel ÷ emulation |")
        print("|---|---|---|---|---|---|---|")
        for r in acc:
            print(f"| {r['mode']} | {int(r['causal'])} | {r['kernel_rmse']:.5f} | {r['kernel_cosine']:.6f} | "
                  f"{r['kernel_rel_l1']:.5f} | {r['emulation_rmse']:.5f} | {r['kernel_over_emulation_rmse']:.3f} |")
        rows += acc
    if args.out:
        meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "python": platform.python_version(),
                "fa3": fa3_func is not None}
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
