"""Compare bench JSON runs of two builds (A/B): per cell, the new build's TFLOP/s over the old
build's, directly and through the SDPA cuDNN time measured in the same process.

    python benchmarks/ab_compare.py --old old1.json old2.json --new new1.json new2.json

Runs of each build are combined by the median per cell. A cell is (hdim, causal, seqlen, pass).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict

Cell = tuple[int, bool, int, str]


def _cells(paths: list[str], impl: str, reference: str) -> dict[Cell, tuple[list[float], list[float]]]:
    """Per cell: the impl's TFLOP/s and its ratio to the reference of the same run."""
    found: dict[Cell, tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    for path in paths:
        with open(path) as f:
            rows = json.load(f)["rows"]
        by_key: dict[tuple[int, bool, int, str], dict[str, float]] = defaultdict(dict)
        for row in rows:
            for kind in ("fwd", "bwd"):
                value = row.get(f"{kind}_tflops")
                if value:
                    by_key[(row["hdim"], row["causal"], row["seqlen"], kind)][row["impl"]] = value
        for cell, impls in by_key.items():
            if impl in impls:
                found[cell][0].append(impls[impl])
                if reference in impls:
                    found[cell][1].append(impls[impl] / impls[reference])
    return found


def main() -> None:
    """Print the per-cell table and the worst cells."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", nargs="+", required=True)
    parser.add_argument("--new", nargs="+", required=True)
    parser.add_argument("--impl", default="flashcute-hopper")
    parser.add_argument("--reference", default="sdpa-cudnn")
    args = parser.parse_args()
    old = _cells(args.old, args.impl, args.reference)
    new = _cells(args.new, args.impl, args.reference)
    print("| pass | hd | mask | seqlen | old TFLOP/s | new TFLOP/s | new/old | new/old via cuDNN |")
    print("|---|---|---|---|---|---|---|---|")
    worst: list[tuple[float, Cell]] = []
    for cell in sorted(set(old) & set(new), key=lambda c: (c[3], c[0], c[1], c[2])):
        hd, causal, seqlen, kind = cell
        o, n = statistics.median(old[cell][0]), statistics.median(new[cell][0])
        via = (statistics.median(new[cell][1]) / statistics.median(old[cell][1])
               if old[cell][1] and new[cell][1] else float("nan"))
        worst.append((n / o, cell))
        print(f"| {kind} | {hd} | {'c' if causal else 'n'} | {seqlen} | {o:.0f} | {n:.0f} | "
              f"{n / o:.3f} | {via:.3f} |")
    worst.sort()
    print("worst new/old:", ", ".join(f"{c[3]} hd{c[0]} {'c' if c[1] else 'n'}{c[2]} {r:.3f}"
                                      for r, c in worst[:5]))


if __name__ == "__main__":
    main()
