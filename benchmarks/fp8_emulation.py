"""FP8 attention's error from rounding alone (flashcute.reference_fp8), per quantization mode, on
the FP8 paper's inputs (standard normal, 0.1% of entries x10), against float64 attention.

    python benchmarks/fp8_emulation.py [--seqlen 1024] [--heads 4] [--headdim 128]
"""

from __future__ import annotations

import argparse

from flashcute import reference_fp8 as r

MODES = (("(a) per tensor", "tensor", None), ("per (batch, head)", "head", None),
         ("(b) per block", "block", None), ("(c) per block + Hadamard", "block", 7))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seqlen", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--headdim", type=int, default=128)
    parser.add_argument("--causal", action="store_true")
    args = parser.parse_args()
    shape = (1, args.seqlen, args.heads, args.headdim)
    q, k, v = (r.outlier_inputs(shape, seed) for seed in range(3))
    exact = r.attention(q, k, v, causal=args.causal)
    print(f"shape {shape}, causal={args.causal}")
    print("| mode | RMSE | cosine | rel L1 | RMSE ÷ (c) |\n|---|---|---|---|---|")
    rows = [(name, r.errors(r.attention_fp8(q, k, v, granularity=g, hadamard_seed=h,
                                            causal=args.causal), exact)) for name, g, h in MODES]
    best = rows[-1][1]["rmse"]
    for name, e in rows:
        print(f"| {name} | {e['rmse']:.4f} | {e['cosine']:.5f} | {e['rel_l1']:.4f} | "
              f"{e['rmse'] / best:.2f} |")
    # The same ratio with V or P left exact: the part of it that Q's and K's rounding sets.
    print("\n| rounded | (a) RMSE | (c) RMSE | (a) ÷ (c) |\n|---|---|---|---|")
    for label, round_v, round_p in (("Q, K, V, P", True, True), ("Q, K, V", True, False),
                                    ("Q, K, P", False, True), ("Q, K", False, False)):
        a, c = (r.errors(r.attention_fp8(q, k, v, granularity=g, hadamard_seed=h, causal=args.causal,
                                         round_v=round_v, round_p=round_p), exact)["rmse"]
                for g, h in (("tensor", None), ("block", 7)))
        print(f"| {label} | {a:.4f} | {c:.4f} | {a / c:.2f} |")


if __name__ == "__main__":
    main()
