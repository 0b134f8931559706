"""Output: the results table, JSON, the PNG plot, notes and the progress bar (tqdm)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from .grid import (
    BASELINE_IMPLS,
    FLASHCUTE_IMPLS,
    IMPLS,
    BenchError,
    BenchRow,
    RowKey,
    dense_key,
    feature_label,
    short_impl,
)


def _ordered_impls(rows: Sequence[BenchRow]) -> list[str]:
    """Implementations present in ``rows``: known ones first, in IMPLS order."""
    present = {r.impl for r in rows}
    return [i for i in IMPLS if i in present] + sorted(present - set(IMPLS))


def _fmt_tflops(row: BenchRow | None, backward: bool = False) -> str:
    value = None if row is None else row.bwd_tflops if backward else row.fwd_tflops
    return "-" if value is None else f"{value:.1f}"


def _ratio(num: BenchRow | None, den: BenchRow | None, backward: bool = False) -> str:
    """``num / den`` TFLOP/s as ``1.23x``, or ``-`` where a side is missing."""
    if num is None or den is None:
        return "-"
    top, bottom = (num.bwd_tflops, den.bwd_tflops) if backward else (num.fwd_tflops,
                                                                      den.fwd_tflops)
    if top is None or not bottom:
        return "-"
    return f"{top / bottom:.2f}x"


def format_table(rows: Sequence[BenchRow], impls: Sequence[str] | None = None) -> str:
    """Render results as a fixed-width text table.

    One line per configuration, in first-seen order; columns are the shape
    (``seqlen_k`` and ``nheads_kv`` only when some row differs from
    ``seqlen``/``nheads``; ``feature`` only when some row has a window,
    softcap or ALiBi), the forward TFLOP/s of each implementation, then the ratios
    ``flashcute-X / Y`` for each flashcute implementation and baseline (SDPA,
    FlashAttention-3), then, when the rows hold both a feature and its dense
    problem (``--with-dense``), ``X/dense``: flashcute-X's TFLOP/s with the
    feature over its own on the dense problem of the same shape; then backward
    TFLOP/s for implementations with backward results and the same ratios of
    backward TFLOP/s where both sides have them.  Missing measurements show as
    ``-``.
    """
    impls = list(impls) if impls is not None else _ordered_impls(rows)
    ratio_pairs = [
        (f, s)
        for f in impls if f in FLASHCUTE_IMPLS
        for s in impls if s in BASELINE_IMPLS
    ]
    bwd_impls = [i for i in impls if any(r.impl == i and r.bwd_tflops is not None for r in rows)]
    bwd_pairs = [(f, s) for f, s in ratio_pairs if f in bwd_impls and s in bwd_impls]
    by_key: dict[RowKey, dict[str, BenchRow]] = {}
    first: dict[RowKey, BenchRow] = {}
    for r in rows:
        by_key.setdefault(r.key, {})[r.impl] = r
        first.setdefault(r.key, r)

    featured = any(r.feature != "dense" for r in rows)
    vs_dense = [f for f in impls if f in FLASHCUTE_IMPLS] if featured and any(
        r.feature == "dense" for r in rows) else []
    bwd_vs_dense = [f for f in vs_dense if f in bwd_impls]
    full_shape = any(r.seqlen_k != r.seqlen or r.nheads_kv != r.nheads for r in rows)
    if full_shape:
        headers = ["dtype", "hdim", "causal", "seqlen_q", "seqlen_k", "batch", "nheads",
                   "nheads_kv"]
    else:
        headers = ["dtype", "hdim", "causal", "seqlen", "batch", "nheads"]
    headers += ["feature"] if featured else []
    headers += impls
    headers += [f"{short_impl(f)}/{short_impl(s)}" for f, s in ratio_pairs]
    headers += [f"{short_impl(f)}/dense" for f in vs_dense]
    headers += [f"{i} bwd" for i in bwd_impls]
    headers += [f"{short_impl(f)}/{short_impl(s)} bwd" for f, s in bwd_pairs]
    headers += [f"{short_impl(f)}/dense bwd" for f in bwd_vs_dense]

    body: list[list[str]] = []
    for key, per_impl in by_key.items():
        m = first[key]
        if full_shape:
            cells = [m.dtype, str(m.hdim), "yes" if m.causal else "no", str(m.seqlen),
                     str(m.seqlen_k), str(m.batch), str(m.nheads), str(m.nheads_kv)]
        else:
            cells = [m.dtype, str(m.hdim), "yes" if m.causal else "no", str(m.seqlen),
                     str(m.batch), str(m.nheads)]
        cells += [feature_label(m.window, m.softcap, m.alibi, m.dropout)] if featured else []
        # The dense line of the same shape; none for a dense line itself.
        dense = by_key.get(dense_key(key), {}) if m.feature != "dense" else {}
        cells += [_fmt_tflops(per_impl.get(i)) for i in impls]
        cells += [_ratio(per_impl.get(f), per_impl.get(s)) for f, s in ratio_pairs]
        cells += [_ratio(per_impl.get(f), dense.get(f)) for f in vs_dense]
        cells += [_fmt_tflops(per_impl.get(i), backward=True) for i in bwd_impls]
        cells += [_ratio(per_impl.get(f), per_impl.get(s), backward=True) for f, s in bwd_pairs]
        cells += [_ratio(per_impl.get(f), dense.get(f), backward=True) for f in bwd_vs_dense]
        body.append(cells)

    widths = [max(map(len, column)) for column in zip(headers, *body)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) for c, w in zip(cells, widths)).rstrip()

    out = [line(headers), "  ".join("-" * w for w in widths)]
    groups = [key[:3] for key in by_key]  # (dtype, hdim, causal): blank line between
    for idx, cells in enumerate(body):
        if idx and groups[idx] != groups[idx - 1]:
            out.append("")
        out.append(line(cells))
    if not body:
        out.append("(no results)")
    return "\n".join(out)


def results_to_json(
    rows: Sequence[BenchRow], *, device: str, torch_version: str,
    flashcute_version: str | None, dtype: str, notes: Sequence[str] = (),
) -> dict[str, Any]:
    """The JSON document written by ``--json``."""
    return {
        "device": device,
        "torch": torch_version,
        "flashcute": flashcute_version,
        "dtype": dtype,
        "rows": [r.to_dict() for r in rows],
        "notes": list(notes),
    }


def _make_parent(path: str | os.PathLike[str]) -> None:
    """Create the parent directory of ``path`` if needed."""
    parent = os.path.dirname(os.fspath(path))
    if parent:
        os.makedirs(parent, exist_ok=True)


def write_json(path: str | os.PathLike[str], document: Mapping[str, Any]) -> None:
    """Write ``document`` to ``path`` (parent directories are created)."""
    _make_parent(path)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(document, fh, indent=2)
        fh.write("\n")


def print_notes(notes: Iterable[str]) -> None:
    """Print collected notes to stderr, one per line."""
    for note in notes:
        print(f"note: {note}", file=sys.stderr)


def import_pyplot() -> Any:
    """Import ``matplotlib.pyplot`` with the Agg backend, or raise BenchError."""
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError as exc:
        raise BenchError(
            "--plot needs matplotlib, which is not installed "
            "(pip install matplotlib), or drop --plot"
        ) from exc
    return plt


def plot_results(
    rows: Sequence[BenchRow], path: str | os.PathLike[str], *, title: str = ""
) -> None:
    """PNG of TFLOP/s vs seqlen: one subplot per (hdim, causal), one line per impl
    (per impl and feature where the rows hold several features).

    Forward results are solid lines; backward results, when present, dashed.
    Meant for the grid (one batch and head count per seqlen and hdim), so
    the command line refuses ``--plot`` with ``--shape``.
    """
    plt = import_pyplot()
    hdims = sorted({r.hdim for r in rows})
    causals = sorted({r.causal for r in rows})
    seqlens = sorted({r.seqlen for r in rows})
    features = list(dict.fromkeys((tuple(r.window), r.softcap, r.alibi, r.dropout) for r in rows))
    lines = [(impl, feature) for impl in _ordered_impls(rows) for feature in features]
    nrows, ncols = max(1, len(hdims)), max(1, len(causals))
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.5 * ncols, 3.8 * nrows), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key().get("color", [None])
    for ri, hdim in enumerate(hdims):
        for ci, causal in enumerate(causals):
            ax = axes[ri][ci]
            for ii, (impl, feature) in enumerate(lines):
                sel = sorted(
                    (r for r in rows if r.impl == impl and r.hdim == hdim and r.causal == causal
                     and (tuple(r.window), r.softcap, r.alibi, r.dropout) == feature),
                    key=lambda r: r.seqlen,
                )
                if not sel:
                    continue
                color = colors[ii % len(colors)]
                name = f"{impl} {feature_label(*feature)}" if len(features) > 1 else impl
                ax.plot([r.seqlen for r in sel], [r.fwd_tflops for r in sel],
                        marker="o", color=color, label=f"{name} fwd")
                bwd = [r for r in sel if r.bwd_tflops is not None]
                if bwd:
                    ax.plot([r.seqlen for r in bwd], [r.bwd_tflops for r in bwd],
                            marker="s", linestyle="--", color=color, label=f"{name} bwd")
            ax.set_xscale("log", base=2)
            if seqlens:
                ax.set_xticks(seqlens)
                ax.set_xticklabels([str(s) for s in seqlens])
            ax.set_title(f"hdim={hdim}, {'causal' if causal else 'non-causal'}")
            ax.set_xlabel("seqlen")
            ax.set_ylabel("TFLOP/s")
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize="small")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    _make_parent(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)


class Progress(Protocol):
    """What the run loop needs from a progress bar (tqdm fits)."""

    def set_postfix_str(self, text: str, /) -> Any: ...  # noqa: D102

    def update(self, n: int = 1) -> Any: ...  # noqa: D102

    def close(self) -> None: ...  # noqa: D102


class _NullProgress:
    """Progress sink that draws nothing (``--no-progress``, or no tqdm)."""

    def set_postfix_str(self, text: str) -> None:
        pass

    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def make_progress(total: int, *, enabled: bool = True) -> Progress:
    """A tqdm progress bar on stderr; one that draws nothing without tqdm or when disabled."""
    if not enabled:
        return _NullProgress()
    try:
        from tqdm import tqdm  # noqa: PLC0415
    except ImportError:
        return _NullProgress()
    bar: Progress = tqdm(total=total, desc="flashcute.bench", file=sys.stderr, leave=False,
                         dynamic_ncols=True)
    return bar
