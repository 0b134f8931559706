"""The command line of ``python -m flashcute.bench``: argument parsing and :func:`main`."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence

from . import grid, impls, report, timing, varlen

_PROG = "python -m flashcute.bench"


def _int_list(text: str) -> list[int]:
    """argparse type: comma-separated positive integers."""
    try:
        values = [int(tok) for tok in text.split(",") if tok.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    if any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"values must be positive, got {text!r}")
    return values


def _shape_list(text: str) -> list[grid.Shape]:
    """argparse type: one or more ``;``-separated ``b,sq,sk,h,hkv,d`` shapes."""
    try:
        return grid.parse_shapes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _window(text: str) -> tuple[int, int]:
    """argparse type: ``L,R``, each side -1 (unbounded) or >= 0."""
    try:
        return grid.parse_window(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _softcap(text: str) -> float:
    """argparse type: a finite float >= 0."""
    try:
        return grid.parse_softcap(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _dropout(text: str) -> float:
    """argparse type: a float in [0, 1)."""
    try:
        return grid.parse_dropout(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _impl_list(text: str) -> list[str]:
    """argparse type: comma-separated implementation names, or ``all``."""
    names = [tok.strip() for tok in text.split(",") if tok.strip()]
    if not names:
        raise argparse.ArgumentTypeError("expected at least one implementation")
    if names == ["all"]:
        return list(grid.IMPLS)
    unknown = [n for n in names if n not in grid.IMPLS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown implementation(s) {', '.join(unknown)}; "
            f"choose from {', '.join(grid.IMPLS)} or 'all'"
        )
    # Canonical order, no duplicates.
    return [impl for impl in grid.IMPLS if impl in names]


def build_parser() -> argparse.ArgumentParser:
    """Create the argument parser of ``python -m flashcute.bench``."""
    parser = argparse.ArgumentParser(
        prog=_PROG,
        description=(
            "Attention TFLOP/s of flashcute vs PyTorch SDPA and FlashAttention-3 on the "
            f"FlashAttention-3 grid (batch*seqlen={grid.TOTAL_TOKENS}, "
            f"nheads*hdim={grid.TOTAL_HIDDEN}), or on the shapes given with --shape."
        ),
    )
    add = parser.add_argument
    for flag, what, default, quick in (
        ("--hdims", "head dims (multiples of 8 up to 256; nheads = 2048 // hdim)",
         grid.DEFAULT_HDIMS, grid.QUICK_HDIMS),
        ("--seqlens", "sequence lengths (divisors of 16384; batch = 16384 // seqlen)",
         grid.DEFAULT_SEQLENS, grid.QUICK_SEQLENS),
    ):
        add(flag, type=_int_list, default=None,
            help=f"grid: comma-separated {what} (default: {','.join(map(str, default))}; "
            f"with --quick: {','.join(map(str, quick))})")
    add("--shape", type=_shape_list, action="append", default=None, metavar=grid.SHAPE_FORMAT,
        help="time exactly this shape instead of the grid: batch, seqlen_q, seqlen_k, nheads, "
        "nheads_kv (GQA: divides nheads), hdim; repeat the flag or separate shapes with ';' "
        "(e.g. --shape '2,1000,3000,16,4,128;1,4096,4096,32,8,64'). Not with --hdims, "
        "--seqlens or --plot; --causal and --dtype apply, --quick only shortens the timing")
    add("--causal", choices=("both", "yes", "no"), default="both",
        help="which masks to run (default: both)")
    add("--window", type=_window, default=grid.NO_WINDOW, metavar=grid.WINDOW_FORMAT,
        help="sliding window for flashcute: query i sees key j iff "
        "i+sk-sq-L <= j <= i+sk-sq+R, -1 leaving a side unbounded; causal sets R=0 "
        "(default: -1,-1, no window). FLOPs count only the visible (query, key) pairs. "
        "SDPA and fa3 are not timed with it (see --with-dense)")
    add("--softcap", type=_softcap, default=0.0, metavar="C",
        help="flashcute's tanh soft cap C*tanh(s/C) of the scaled scores (default: 0, off); "
        "it adds no FLOPs to the count. SDPA and fa3 are not timed with it (see --with-dense)")
    add("--alibi", action="store_true",
        help="ALiBi for flashcute: the score of query i and key j in head h gains "
        "-slope_h*|i+sk-sq-j|, slope_h = 2^(-8(h+1)/nheads); it adds no FLOPs to the count. "
        "SDPA and fa3 are not timed with it (see --with-dense)")
    add("--dropout", type=_dropout, default=0.0, metavar="P",
        help="flashcute's dropout_p on the attention weights (default: 0, off), with a fixed "
        "seed and offset; it adds no FLOPs to the count. SDPA and fa3 are not timed with it "
        "(see --with-dense)")
    add("--with-dense", action="store_true",
        help="with --window, --softcap, --alibi or --dropout: also time each problem without "
        "them, just "
        "before it, for every implementation (SDPA and fa3 on these dense lines only), and add "
        "'X/dense' columns: flashcute-X's TFLOP/s with the feature over its dense TFLOP/s")
    add("--varlen", choices=("equal", "packed", "both"), default=None,
        help="time flashcute's variable-length (packed) batches against its fixed-length "
        "calls in one process: 'equal' packs 16384//seqlen sequences of each --seqlens length "
        "(up to 8192) against the same fixed-length batch; 'packed' packs lengths drawn from "
        "128..8192 (--seed) summing to 16384 against the fixed-length batch at their mean "
        "length. FLOPs count each sequence's own (query, key) pairs. flashcute only; not with "
        "--shape, --window, --softcap, --alibi, --dropout, --check or --plot")
    add("--dtype", choices=grid.DTYPE_CHOICES, default="bf16", help="default: bf16")
    add("--impls", type=_impl_list, default=None,
        help=f"comma-separated subset of {', '.join(grid.IMPLS)} (default: all available)")
    add("--bwd", action="store_true",
        help="also time the backward pass (every implementation through autograd; "
        "flashcute-hopper's backward takes the Hopper path where the build has it for the "
        "head dim, else the Ampere path)")
    add("--check", action="store_true",
        help=f"compare each flashcute config against SDPA first and abort if "
        f"the max abs error exceeds {grid.CHECK_ATOL:g} (fa3 too: a mismatch skips it on "
        f"that config with a note)")
    add("--json", metavar="PATH", help="write results as JSON")
    add("--plot", metavar="PATH",
        help="write a PNG of TFLOP/s vs seqlen (grid only; needs matplotlib)")
    add("--quick", action="store_true",
        help="smoke run: hdim 128, seqlens 512,2048,8192, short timing")
    for flag, what, default_ms, quick_ms in (
        ("--warmup", "warm-up", grid.DEFAULT_WARMUP_MS, grid.QUICK_WARMUP_MS),
        ("--rep", "measurement", grid.DEFAULT_REP_MS, grid.QUICK_REP_MS),
    ):
        add(flag, type=float, default=None, metavar="MS",
            help=f"{what} time per measurement in ms (default: {default_ms:g}, "
            f"--quick: {quick_ms:g})")
    add("--rounds", type=int, default=None,
        help=f"time every implementation this many times, alternating between them, and "
        f"report each one's median (default: {grid.DEFAULT_ROUNDS}, --quick: 1)")
    add("--seed", type=int, default=0, help="RNG seed (default: 0)")
    add("--no-progress", action="store_true",
        help="do not draw the progress bar (drawn with tqdm, when installed)")
    return parser


def _attach_window_values(argv: Sequence[str]) -> list[str]:
    """``--window -1,R`` as ``--window=-1,R``: argparse reads a separate value that starts
    with ``-`` (and is not a plain number) as an option, and would then find no value."""
    out: list[str] = []
    for token in argv:
        if out and out[-1] == "--window" and token[:1] == "-" and token[1:2].isdigit():
            out[-1] = f"--window={token}"
        else:
            out.append(token)
    return out


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse and validate the command line, resolving ``--quick`` defaults.

    After parsing, ``shapes`` is the list of ``--shape`` shapes (empty for the
    grid); for the grid ``hdims``/``seqlens`` are lists of ints (``None`` with
    ``--shape``); ``causals`` is a list of bools, ``impls`` a list of names
    (``None`` meaning "all available"), ``warmup``/``rep`` floats in
    milliseconds, ``window`` a ``(left, right)`` tuple, ``softcap`` a float, ``alibi`` a
    bool and ``dropout`` a float.
    """
    parser = build_parser()
    args = parser.parse_args(_attach_window_values(sys.argv[1:] if argv is None else argv))
    args.shapes = [shape for group in args.shape or () for shape in group]
    if args.shapes:
        given = [flag for flag, value in (("--hdims", args.hdims), ("--seqlens", args.seqlens),
                                          ("--plot", args.plot)) if value is not None]
        if given:
            parser.error(f"--shape times only the given shapes; it cannot be combined with "
                         f"{' or '.join(given)}")
    else:
        for name, default, quick in (
            ("hdims", list(grid.DEFAULT_HDIMS), list(grid.QUICK_HDIMS)),
            ("seqlens", list(grid.DEFAULT_SEQLENS), list(grid.QUICK_SEQLENS)),
        ):
            if getattr(args, name) is None:
                setattr(args, name, quick if args.quick else default)
    for name, default, quick in (
        ("warmup", grid.DEFAULT_WARMUP_MS, grid.QUICK_WARMUP_MS),
        ("rep", grid.DEFAULT_REP_MS, grid.QUICK_REP_MS),
        ("rounds", grid.DEFAULT_ROUNDS, 1),
    ):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else default)
    if args.warmup < 0 or args.rep <= 0:
        parser.error("--warmup must be >= 0 and --rep > 0")
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    args.causals = causal_values(args.causal)
    if args.varlen is not None:
        given = [flag for flag, on in (("--shape", bool(args.shapes)), ("--plot", args.plot),
                                       ("--window", tuple(args.window) != grid.NO_WINDOW),
                                       ("--softcap", args.softcap > 0.0),
                                       ("--alibi", args.alibi),
                                       ("--dropout", args.dropout > 0.0),
                                       ("--with-dense", args.with_dense),
                                       ("--check", args.check)) if on]
        if given:
            parser.error(f"--varlen times packed batches on its own; it cannot be combined "
                         f"with {' or '.join(given)}")
    if args.with_dense and _feature(args) == "dense":
        parser.error("--with-dense adds the dense problem beside a --window, --softcap, "
                     "--alibi or --dropout one; give --window, --softcap, --alibi or --dropout too")
    if not args.shapes:
        try:
            grid.validate_grid(args.hdims, args.seqlens)
        except ValueError as exc:
            parser.error(str(exc))
    return args


def _feature(args: argparse.Namespace) -> str:
    """The ``feature`` of the command line's problems."""
    return grid.feature_name(args.window, args.softcap, args.alibi, args.dropout)


def causal_values(choice: str) -> list[bool]:
    """Map ``--causal both|yes|no`` to the list of causal flags to run."""
    try:
        return {"both": [False, True], "yes": [True], "no": [False]}[choice]
    except KeyError:
        raise ValueError(f"--causal must be one of both|yes|no, got {choice!r}") from None


def _problem(args: argparse.Namespace) -> str:
    """What is timed, for the output header: the grid's rule or the ``--shape`` list."""
    if args.shapes:
        listed = " ".join(",".join(map(str, shape)) for shape in dict.fromkeys(args.shapes))
        return f"shapes ({grid.SHAPE_FORMAT}): {listed}"
    if all(grid.TOTAL_HIDDEN % hdim == 0 for hdim in args.hdims):
        return f"batch*seqlen={grid.TOTAL_TOKENS}  nheads*hdim={grid.TOTAL_HIDDEN}"
    return f"batch*seqlen={grid.TOTAL_TOKENS}  nheads={grid.TOTAL_HIDDEN}//hdim"


def _fail(message: str, code: int) -> int:
    """Print ``flashcute.bench: message`` to stderr and return ``code``."""
    print(f"flashcute.bench: {message}", file=sys.stderr)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m flashcute.bench``.

    Exit codes: 0 on success, 1 on a benchmark error (including a failed
    ``--check``), 2 on usage errors or when PyTorch/CUDA is missing.
    """
    args = parse_args(argv)
    try:
        torch = timing.require_cuda()
    except grid.NoGPUError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    if args.plot:
        try:
            report.import_pyplot()  # fail before spending minutes benchmarking
        except grid.BenchError as exc:
            return _fail(str(exc), 2)

    notes = grid.Notes()
    requested = args.impls if args.impls is not None else grid.IMPLS
    if any(i in grid.FLASHCUTE_IMPLS for i in requested):
        fc, build_info, fc_error = impls.load_flashcute()
    else:
        fc, build_info, fc_error = None, {}, "not requested"
    device_index = torch.cuda.current_device()
    device_name = torch.cuda.get_device_name(device_index)
    major, minor = torch.cuda.get_device_capability(device_index)
    capability = (major, minor)
    chosen = impls.select_impls(
        args.impls, build_info, capability, fc_error, impls.has_cudnn_sdpa(), notes
    )
    if not chosen:
        report.print_notes(notes)
        return _fail("no implementation left to benchmark", 1)
    feature = _feature(args)
    if feature != "dense" and not args.with_dense:
        # No dense line to time them on: no column at all.
        reasons = {i: impls.feature_skip_reason(i, args.window, args.softcap, args.alibi,
                                                args.dropout)
                   for i in chosen}
        for reason in filter(None, reasons.values()):
            notes.add(reason)
        chosen = [i for i in chosen if reasons[i] is None]
        if not chosen:
            report.print_notes(notes)
            return _fail("no implementation left to benchmark", 1)
    if args.bwd:
        for impl in chosen:
            if not impls.backward_supported(impl):
                notes.add(f"{impl}: no backward pass available, timing forward only")

    if args.varlen is not None:
        return _main_varlen(args, chosen, notes, device_name, fc, build_info, torch)

    fc_version = impls.flashcute_version(fc, build_info)
    print(f"device: {device_name} (sm{major}{minor})  "
          f"torch {torch.__version__}  flashcute {fc_version or 'n/a'}")
    print(f"dtype {args.dtype}  {_problem(args)}  timer: {timing.timer_name()} "
          f"(median, warmup {args.warmup:g} ms, rep {args.rep:g} ms; median of "
          f"{args.rounds} alternating round{'s' if args.rounds > 1 else ''})")
    print("values: fwd TFLOP/s; ratios: flashcute-X / sdpa-Y or fa3 fwd TFLOP/s"
          + ("; X/dense: flashcute-X with the feature / without" if args.with_dense else "")
          + ("; '... bwd' columns: the same for the backward" if args.bwd else ""))
    if feature != "dense":
        label = grid.feature_label(args.window, args.softcap, args.alibi, args.dropout)
        print(f"feature: {label} "
              "(flashcute only); FLOPs count only the visible (query, key) pairs, softcap, "
              "ALiBi and dropout add none")
    sys.stdout.flush()

    if args.shapes:
        configs = grid.build_shapes(args.shapes, args.causals, args.dtype)
    else:
        configs = grid.build_grid(args.hdims, args.seqlens, args.causals, args.dtype)
    configs = grid.with_feature(configs, args.window, args.softcap, alibi=args.alibi,
                                dropout=args.dropout, with_dense=args.with_dense)
    progress = report.make_progress(len(configs) * len(chosen), enabled=not args.no_progress)
    try:
        with contextlib.closing(progress):
            rows = timing.run_benchmark(
                configs, chosen, build_info=build_info, capability=capability,
                warmup_ms=args.warmup, rep_ms=args.rep, bwd=args.bwd, check=args.check,
                seed=args.seed, notes=notes, progress=progress, rounds=args.rounds,
            )
    except grid.CheckError as exc:
        report.print_notes(notes)
        return _fail(str(exc), 1)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)

    print()
    print(report.format_table(rows, chosen))
    sys.stdout.flush()
    report.print_notes(notes)

    if args.json:
        report.write_json(args.json, report.results_to_json(
            rows, device=device_name, torch_version=str(torch.__version__),
            flashcute_version=fc_version, dtype=args.dtype, notes=notes.as_list(),
        ))
        print(f"wrote {args.json}", file=sys.stderr)
    if args.plot:
        try:
            title = f"{device_name}, {args.dtype}, forward attention"
            if feature != "dense":
                title += ", " + grid.feature_label(args.window, args.softcap, args.alibi,
                                                   args.dropout)
            report.plot_results(rows, args.plot, title=title)
        except grid.BenchError as exc:
            return _fail(str(exc), 1)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


def _main_varlen(args: argparse.Namespace, chosen: Sequence[str], notes: grid.Notes,
                 device_name: str, fc: object, build_info: dict, torch: object) -> int:
    """``--varlen``: flashcute's packed batches against its fixed-length calls."""
    flashcute_impls = [i for i in chosen if i in grid.FLASHCUTE_IMPLS]
    for impl in chosen:
        if impl not in grid.FLASHCUTE_IMPLS:
            notes.add(f"{impl} not timed with --varlen (flashcute's packed batches only)")
    if not hasattr(fc, "attention_varlen"):
        flashcute_impls = []
        notes.add("this flashcute has no attention_varlen")
    if not flashcute_impls:
        report.print_notes(notes)
        return _fail("no implementation left to benchmark", 1)
    modes = varlen.VARLEN_MODES if args.varlen == "both" else (args.varlen,)
    cases = varlen.build_cases(modes, args.hdims, args.seqlens, args.causals, args.dtype,
                               seed=args.seed)
    fc_version = impls.flashcute_version(fc, build_info)
    print(f"device: {device_name}  torch {getattr(torch, '__version__', '?')}  "
          f"flashcute {fc_version or 'n/a'}")
    print(f"dtype {args.dtype}  varlen modes: {', '.join(modes)}  tokens {grid.TOTAL_TOKENS}  "
          f"timer: {timing.timer_name()} (median of {args.rounds} alternating rounds)")
    print("values: TFLOP/s over each sequence's own (query, key) pairs; dense: the "
          "fixed-length batch of as many sequences at the mean length")
    sys.stdout.flush()
    try:
        rows = varlen.run_varlen(cases, flashcute_impls, warmup_ms=args.warmup, rep_ms=args.rep,
                                 rounds=args.rounds, bwd=args.bwd, seed=args.seed, notes=notes)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    print()
    print(varlen.format_varlen_table(rows))
    report.print_notes(notes)
    if args.json:
        report.write_json(args.json, {
            "device": device_name, "torch": str(getattr(torch, "__version__", "")),
            "flashcute": fc_version, "dtype": args.dtype,
            "rows": [d for r in rows for d in r.to_dicts()], "notes": notes.as_list(),
        })
        print(f"wrote {args.json}", file=sys.stderr)
    return 0
