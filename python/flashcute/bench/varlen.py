"""``--varlen``: flashcute's variable-length (packed) batches against its own fixed-length calls.

Two modes, each on ``TOTAL_TOKENS`` tokens with ``nheads = 2048 // hdim``:

* ``equal``: ``16384 // seqlen`` sequences of one length, packed, against the fixed-length
  call of the same batch (the cost of the packed layout).
* ``packed``: lengths drawn from ``[128, 8192]`` (seeded) that sum to 16384, against the
  fixed-length call at their mean length with as many sequences.

FLOPs count the (query, key) pairs each sequence really has (causal: ``s(s+1)/2`` per
sequence; the fixed-length line uses the same rule), so the columns compare throughput on
equal terms. Every JSON row names its ``feature``: ``varlen`` or ``dense``.

Pure Python down to :func:`run_varlen`, which imports torch and flashcute when called.
"""

from __future__ import annotations

import dataclasses
import random
import statistics
from collections.abc import Sequence
from typing import Any, Callable

from .grid import BWD_FLOPS_FACTOR, TOTAL_TOKENS, Notes, grid_nheads, short_impl, tflops_from_ms

VARLEN_MODES: tuple[str, ...] = ("equal", "packed")
PACKED_MIN, PACKED_MAX = 128, 8192


def packed_lengths(seed: int = 0, total: int = TOTAL_TOKENS, low: int = PACKED_MIN,
                   high: int = PACKED_MAX) -> list[int]:
    """Sequence lengths drawn uniformly from ``[low, high]`` that sum to ``total``: draws stop
    once the rest is at most ``high``; a rest shorter than ``low`` joins the previous length
    where that stays within ``high``, else stands as the last one."""
    rng = random.Random(seed)
    lengths: list[int] = []
    rest = total
    while rest > high:
        n = rng.randint(low, min(high, rest - low))
        lengths.append(n)
        rest -= n
    if rest:
        if rest < low and lengths and lengths[-1] + rest <= high:
            lengths[-1] += rest
        else:
            lengths.append(rest)
    return lengths


def pairs(lengths: Sequence[int], causal: bool) -> int:
    """(query, key) pairs of sequences of these lengths (seqlen_q = seqlen_k each)."""
    return sum(n * (n + 1) // 2 if causal else n * n for n in lengths)


def flops(lengths: Sequence[int], nheads: int, hdim: int, causal: bool, *, backward: bool = False) -> float:
    """FLOPs of one pass over the sequences: 4·hdim per pair and head, 2.5x for the backward."""
    f = 4.0 * nheads * hdim * pairs(lengths, causal)
    return f * BWD_FLOPS_FACTOR if backward else f


@dataclasses.dataclass(frozen=True)
class VarlenCase:
    """One comparison: the packed lengths and the fixed-length batch beside them."""

    mode: str
    dtype: str
    hdim: int
    causal: bool
    lengths: tuple[int, ...]

    @property
    def nheads(self) -> int:
        return grid_nheads(self.hdim)

    @property
    def dense_seqlen(self) -> int:
        """The fixed-length line's sequence length: the mean, rounded."""
        return max(1, round(sum(self.lengths) / len(self.lengths)))

    @property
    def dense_lengths(self) -> tuple[int, ...]:
        return (self.dense_seqlen,) * len(self.lengths)

    @property
    def label(self) -> str:
        spread = (f"{len(self.lengths)}x{self.lengths[0]}" if len(set(self.lengths)) == 1
                  else f"{len(self.lengths)} seqs {min(self.lengths)}..{max(self.lengths)}")
        return f"{self.mode} {self.dtype} hdim={self.hdim} {'causal' if self.causal else 'full'} {spread}"


def build_cases(modes: Sequence[str], hdims: Sequence[int], seqlens: Sequence[int],
                causals: Sequence[bool], dtype: str, seed: int = 0) -> list[VarlenCase]:
    """``equal`` cases per (hdim, causal, seqlen) with ``seqlen`` dividing 16384 and at most
    8192; ``packed`` cases per (hdim, causal), one seeded draw of lengths for all."""
    cases = []
    drawn = tuple(packed_lengths(seed))
    for hdim in hdims:
        for causal in causals:
            if "equal" in modes:
                for seqlen in seqlens:
                    if seqlen <= PACKED_MAX and TOTAL_TOKENS % seqlen == 0:
                        cases.append(VarlenCase("equal", dtype, hdim, causal,
                                                (seqlen,) * (TOTAL_TOKENS // seqlen)))
            if "packed" in modes:
                cases.append(VarlenCase("packed", dtype, hdim, causal, drawn))
    return cases


@dataclasses.dataclass
class VarlenRow:
    """One implementation on one case: packed and fixed-length TFLOP/s (backward optional)."""

    impl: str
    case: VarlenCase
    varlen_tflops: float
    dense_tflops: float | None
    varlen_bwd_tflops: float | None = None
    dense_bwd_tflops: float | None = None

    def to_dicts(self) -> list[dict[str, Any]]:
        """JSON rows: the packed one (feature ``varlen``) and its fixed-length one (``dense``)."""
        c = self.case
        common = {"impl": self.impl, "dtype": c.dtype, "hdim": c.hdim, "causal": c.causal,
                  "nheads": c.nheads, "nheads_kv": c.nheads, "varlen_mode": c.mode}
        varlen = {**common, "feature": "varlen", "batch": len(c.lengths),
                  "seqlens": list(c.lengths), "tokens": sum(c.lengths),
                  "fwd_tflops": self.varlen_tflops}
        if self.varlen_bwd_tflops is not None:
            varlen["bwd_tflops"] = self.varlen_bwd_tflops
        rows = [varlen]
        if self.dense_tflops is not None:
            dense = {**common, "feature": "dense", "batch": len(c.lengths),
                     "seqlen": c.dense_seqlen, "seqlen_q": c.dense_seqlen,
                     "seqlen_k": c.dense_seqlen, "fwd_tflops": self.dense_tflops}
            if self.dense_bwd_tflops is not None:
                dense["bwd_tflops"] = self.dense_bwd_tflops
            rows.append(dense)
        return rows


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a is not None and b else "-"


def _tf(x: float | None) -> str:
    return f"{x:.1f}" if x is not None else "-"


def format_varlen_table(rows: Sequence[VarlenRow]) -> str:
    """Fixed-width table: per implementation and case, packed and fixed-length TFLOP/s and
    their ratio (and the same for the backward where timed)."""
    bwd = any(r.varlen_bwd_tflops is not None for r in rows)
    headers = ["impl", "mode", "hdim", "causal", "seqs", "lengths", "dense len", "varlen",
               "dense", "varlen/dense"]
    if bwd:
        headers += ["varlen bwd", "dense bwd", "varlen/dense bwd"]
    body = []
    for r in rows:
        c = r.case
        lengths = (str(c.lengths[0]) if len(set(c.lengths)) == 1
                   else f"{min(c.lengths)}..{max(c.lengths)}")
        cells = [short_impl(r.impl), c.mode, str(c.hdim), "yes" if c.causal else "no",
                 str(len(c.lengths)), lengths, str(c.dense_seqlen), _tf(r.varlen_tflops),
                 _tf(r.dense_tflops), _ratio(r.varlen_tflops, r.dense_tflops)]
        if bwd:
            cells += [_tf(r.varlen_bwd_tflops), _tf(r.dense_bwd_tflops),
                      _ratio(r.varlen_bwd_tflops, r.dense_bwd_tflops)]
        body.append(cells)
    widths = [max(map(len, col)) for col in zip(headers, *body)] if body else [len(h) for h in headers]
    line = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    out = [line(headers), "  ".join("-" * w for w in widths)]
    out += [line(cells) for cells in body] or ["(no results)"]
    return "\n".join(out)


def _median_time(time_fn: Callable[..., float], fn: Callable[[], Any], rounds: int, **timing: float) -> float:
    return statistics.median(time_fn(fn, **timing) for _ in range(rounds))


def run_varlen(cases: Sequence[VarlenCase], impls: Sequence[str], *, warmup_ms: float,
               rep_ms: float, rounds: int, bwd: bool, seed: int, notes: Notes) -> list[VarlenRow]:
    """Time flashcute's packed call and its fixed-length call on every case, in one process
    (alternating rounds, medians), for each flashcute implementation given."""
    import torch  # noqa: PLC0415

    import flashcute  # noqa: PLC0415

    from .timing import time_fn  # noqa: PLC0415

    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
    rows = []
    for case in cases:
        gen = torch.Generator(device="cuda").manual_seed(seed)
        total, h, d = sum(case.lengths), case.nheads, case.hdim
        dtype = dtypes[case.dtype]
        q, k, v = (torch.randn(total, h, d, device="cuda", dtype=dtype, generator=gen)
                   for _ in range(3))
        offsets = [0]
        for n in case.lengths:
            offsets.append(offsets[-1] + n)
        cu = torch.tensor(offsets, dtype=torch.int32, device="cuda")
        max_len = max(case.lengths)
        batch, seqlen = len(case.lengths), case.dense_seqlen
        dq_, dk_, dv_ = (torch.randn(batch, seqlen, h, d, device="cuda", dtype=dtype, generator=gen)
                         for _ in range(3))
        for impl in impls:
            backend = short_impl(impl)

            def varlen_fn(q=q, k=k, v=v, backend=backend):
                return flashcute.attention_varlen(q, k, v, cu, cu, max_len, max_len,
                                                  causal=case.causal, backend=backend)

            def dense_fn(q=dq_, k=dk_, v=dv_, backend=backend):
                return flashcute.attention(q, k, v, causal=case.causal, backend=backend)

            timing = dict(warmup_ms=warmup_ms, rep_ms=rep_ms)
            try:
                times = {"varlen": [], "dense": []}
                for _ in range(rounds):
                    times["varlen"].append(time_fn(varlen_fn, **timing))
                    times["dense"].append(time_fn(dense_fn, **timing))
                row = VarlenRow(
                    impl, case,
                    tflops_from_ms(flops(case.lengths, h, d, case.causal), statistics.median(times["varlen"])),
                    tflops_from_ms(flops(case.dense_lengths, h, d, case.causal), statistics.median(times["dense"])),
                )
                if bwd:
                    row.varlen_bwd_tflops, row.dense_bwd_tflops = (
                        tflops_from_ms(flops(lengths, h, d, case.causal, backward=True),
                                       _median_time(time_fn, _backward(fn, inputs), rounds, **timing))
                        for fn, inputs, lengths in ((varlen_fn, (q, k, v), case.lengths),
                                                    (dense_fn, (dq_, dk_, dv_), case.dense_lengths))
                    )
            except Exception as exc:  # noqa: BLE001 - a failed case is noted, the run goes on
                notes.add(f"{impl} failed on {case.label}: {type(exc).__name__}: {exc}")
                continue
            rows.append(row)
        del q, k, v, dq_, dk_, dv_
        torch.cuda.empty_cache()
    return rows


def _backward(fn: Callable[..., Any], inputs: tuple[Any, ...]) -> Callable[[], Any]:
    """The backward pass of ``fn`` on ``inputs`` (forward run once here), repeatable."""
    import torch  # noqa: PLC0415

    leaves = [x.detach().requires_grad_(True) for x in inputs]
    out = fn(*leaves)
    dout = torch.randn_like(out)
    return lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True)
