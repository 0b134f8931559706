"""Measurements: CUDA setup, inputs, timers, the ``--check`` comparison and the run loop.

Everything here imports ``torch`` (and ``triton`` when present) only when called.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Callable

from .grid import (
    CHECK_ATOL,
    DROPOUT_SEED,
    FA3_IMPLS,
    FLASHCUTE_IMPLS,
    NO_WINDOW,
    BenchConfig,
    BenchRow,
    CheckError,
    NoGPUError,
    Notes,
    config_flops,
    feature_label,
    feature_name,
    tflops_from_ms,
)
from .impls import (
    alibi_tensor,
    backward_supported,
    feature_skip_reason,
    impl_context,
    impl_skip_reason,
    make_backward_fn,
    make_forward_fn,
    sdpa_forward,
    sdpa_mask_note,
    short_error,
)

if TYPE_CHECKING:  # pragma: no cover - typing only
    from torch import Tensor

    from .report import Progress

NO_GPU_MESSAGE: str = "flashcute.bench needs a CUDA GPU and PyTorch with CUDA; {detail}"

#: Bytes of float32 scores per call of the window/softcap reference of ``--check``
#: (each call holds a few tensors of this size: about 10 GB at the peak).
REFERENCE_CHUNK_BYTES: int = 2 << 30


def require_cuda() -> Any:
    """Import torch and check for a CUDA device; raise :class:`NoGPUError`."""
    try:
        import torch  # noqa: PLC0415 - deliberately lazy
    except Exception as exc:  # noqa: BLE001
        raise NoGPUError(
            NO_GPU_MESSAGE.format(detail=f"PyTorch could not be imported ({short_error(exc)})")
        ) from exc
    if not torch.cuda.is_available():
        cuda = getattr(torch.version, "cuda", None)
        detail = (
            f"torch.cuda.is_available() is False (torch {torch.__version__}, "
            f"built with CUDA {cuda})"
            if cuda
            else f"torch {torch.__version__} was built without CUDA"
        )
        raise NoGPUError(NO_GPU_MESSAGE.format(detail=detail))
    return torch


def make_inputs(
    cfg: BenchConfig, *, seed: int = 0, device: str = "cuda"
) -> tuple[Tensor, Tensor, Tensor]:
    """Random q, k, v on ``device``.

    q is ``(batch, seqlen_q, nheads, hdim)``, k and v ``(batch, seqlen_k, nheads_kv, hdim)``.
    """
    import torch  # noqa: PLC0415

    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[cfg.dtype]
    q_shape = (cfg.batch, cfg.seqlen, cfg.nheads, cfg.hdim)
    kv_shape = (cfg.batch, cfg.seqlen_k, cfg.nheads_kv, cfg.hdim)
    q, k, v = (torch.randn(shape, generator=gen, device=device, dtype=dtype)
               for shape in (q_shape, kv_shape, kv_shape))
    return q, k, v


def _triton_do_bench() -> Callable[..., Any] | None:
    """``triton.testing.do_bench`` if triton imports, else ``None``."""
    try:
        from triton.testing import do_bench  # noqa: PLC0415
    except Exception:  # noqa: BLE001 - triton missing or broken
        return None
    return do_bench


def timer_name() -> str:
    """Which timer :func:`time_fn` will use, for the output header."""
    return "triton.testing.do_bench" if _triton_do_bench() else "CUDA events"


def cuda_event_bench(
    fn: Callable[[], Any], *, warmup_ms: float, rep_ms: float, min_reps: int = 5
) -> float:
    """Median runtime of ``fn`` in ms, measured with CUDA events.

    Runs ``fn`` for about ``warmup_ms`` to warm up, then times each call
    individually for about ``rep_ms`` (at least ``min_reps`` calls),
    flushing the L2 cache before each timed call.
    """
    import torch  # noqa: PLC0415

    def event() -> Any:
        return torch.cuda.Event(enable_timing=True)

    fn()
    torch.cuda.synchronize()
    # Estimate the per-call time from a few calls.
    start, end = event(), event()
    start.record()
    for _ in range(5):
        fn()
    end.record()
    torch.cuda.synchronize()
    estimate = max(start.elapsed_time(end) / 5, 1e-3)
    n_warmup = max(1, int(warmup_ms / estimate))
    n_rep = max(min_reps, int(rep_ms / estimate))

    cache = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")
    events = [(event(), event()) for _ in range(n_rep)]
    for _ in range(n_warmup):
        fn()
    for start, end in events:
        cache.zero_()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events)


def time_fn(fn: Callable[[], Any], *, warmup_ms: float, rep_ms: float) -> float:
    """Median runtime of ``fn`` in milliseconds.

    Uses ``triton.testing.do_bench(..., return_mode="median")`` when triton
    is importable, else :func:`cuda_event_bench`.
    """
    do_bench = _triton_do_bench()
    if do_bench is not None:
        return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
    return cuda_event_bench(fn, warmup_ms=warmup_ms, rep_ms=rep_ms)


def time_impl(
    impl: str, cfg: BenchConfig, q: Tensor, k: Tensor, v: Tensor,
    *, warmup_ms: float, rep_ms: float, bwd: bool, notes: Notes,
) -> BenchRow | None:
    """Time ``impl`` on one configuration; ``None`` (plus a note) if it fails.

    With ``bwd=True`` the backward pass is also timed for implementations
    that have one; a backward failure keeps the forward result.
    """
    with warnings.catch_warnings():
        # SDPA explains at length why a pinned backend refuses an input;
        # the exception already says it and the warnings would break the bar.
        warnings.simplefilter("ignore")
        with impl_context(impl):
            try:
                fn = make_forward_fn(impl, q, k, v, cfg.causal, window=cfg.window,
                                     softcap=cfg.softcap, alibi=cfg.alibi, dropout=cfg.dropout)
                fwd_ms = time_fn(fn, warmup_ms=warmup_ms, rep_ms=rep_ms)
            except Exception as exc:  # noqa: BLE001 - unsupported config
                notes.add(f"{impl} failed on {cfg.label}: {short_error(exc)}")
                return None
            bwd_tflops: float | None = None
            if bwd and backward_supported(impl):
                try:
                    fn = make_backward_fn(impl, q, k, v, cfg.causal, window=cfg.window,
                                          softcap=cfg.softcap, alibi=cfg.alibi,
                                          dropout=cfg.dropout)
                    bwd_ms = time_fn(fn, warmup_ms=warmup_ms, rep_ms=rep_ms)
                    bwd_tflops = tflops_from_ms(config_flops(cfg, backward=True), bwd_ms)
                except Exception as exc:  # noqa: BLE001
                    notes.add(f"{impl} backward failed on {cfg.label}: {short_error(exc)}")
    return BenchRow.from_config(impl, cfg, tflops_from_ms(config_flops(cfg), fwd_ms), bwd_tflops)


def median_row(rows: Sequence[BenchRow]) -> BenchRow:
    """One implementation's rounds on one configuration: median forward and backward."""
    bwd = [r.bwd_tflops for r in rows if r.bwd_tflops is not None]
    return dataclasses.replace(
        rows[0], fwd_tflops=statistics.median(r.fwd_tflops for r in rows),
        bwd_tflops=statistics.median(bwd) if bwd else None,
    )


def feature_reference(
    q: Tensor, k: Tensor, v: Tensor, causal: bool, *, window: Sequence[int] = NO_WINDOW,
    softcap: float = 0.0, alibi: bool = False, dropout: float = 0.0,
    chunk_bytes: int = REFERENCE_CHUNK_BYTES,
) -> Tensor:
    """``flashcute.reference.attention`` in float32, a few (batch, head) slices at a time.

    The reference materialises the scores; slicing batches and query heads
    (each slice with its kv head) keeps every call near ``chunk_bytes`` of
    scores, and leaves the bottom-right alignment intact (slicing query rows
    would not).  With ``alibi``, each head slice takes its slopes of
    :func:`~.impls.alibi_tensor`; with ``dropout``, its slice of the keep mask of
    :data:`~.grid.DROPOUT_SEED` (``flashcute.testing.keep_mask_slices``), built for that
    slice alone, so the mask never takes more than the slice's scores.  Output: float32,
    ``(batch, seqlen_q, nheads, hdim)``.
    """
    import torch  # noqa: PLC0415

    from flashcute import reference  # noqa: PLC0415 - torch-only module, imported lazily
    from flashcute.testing import keep_mask_slices  # noqa: PLC0415

    batch, seqlen_q, nheads, _ = q.shape
    seqlen_k, nheads_kv = k.shape[1], k.shape[2]
    group = nheads // nheads_kv
    per_head = max(1, seqlen_q * seqlen_k * 4)
    heads = max(1, min(group, chunk_bytes // per_head))
    batches = max(1, chunk_bytes // (per_head * heads)) if heads == group else 1
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    slopes = alibi_tensor(q) if alibi else None
    with torch.no_grad():
        for b0 in range(0, batch, batches):
            bs = slice(b0, min(b0 + batches, batch))
            for kv_head in range(nheads_kv):
                for h0 in range(kv_head * group, (kv_head + 1) * group, heads):
                    hs = slice(h0, min(h0 + heads, (kv_head + 1) * group))
                    keep = None
                    if dropout > 0.0:  # the slice's mask only: the whole one may not fit
                        keep = keep_mask_slices(
                            [b * nheads + h for b in range(bs.start, bs.stop)
                             for h in range(hs.start, hs.stop)],
                            seqlen_q, seqlen_k, dropout, *DROPOUT_SEED, device=q.device,
                        ).view(bs.stop - bs.start, hs.stop - hs.start, seqlen_q, seqlen_k)
                    out[bs, :, hs] = reference.attention(
                        q[bs, :, hs], k[bs, :, kv_head:kv_head + 1],
                        v[bs, :, kv_head:kv_head + 1], causal=causal, window=tuple(window),
                        softcap=softcap, dtype=torch.float32,
                        alibi_slopes=slopes[hs] if slopes is not None else None,
                        dropout_p=dropout, dropout_mask=keep,
                    )
    return out


def reference_output(
    q: Tensor, k: Tensor, v: Tensor, causal: bool, *, window: Sequence[int] = NO_WINDOW,
    softcap: float = 0.0, alibi: bool = False, dropout: float = 0.0,
) -> Tensor:
    """The output of flashcute's problem for ``--check``, in ``(batch, seqlen_q, nheads,
    hdim)`` layout.

    Dense problems run SDPA (PyTorch picks among its backends: flash, cuDNN,
    efficient, math).  Causal is bottom-right aligned
    (:func:`~.impls.sdpa_forward`); query rows with no key to see (causal,
    ``seqlen_q > seqlen_k``) are zero, as in flashcute, where SDPA may leave
    NaN.  With a window, softcap, ALiBi or dropout, which SDPA cannot compute (with
    flashcute's mask), it is :func:`feature_reference`.
    """
    import torch  # noqa: PLC0415

    if feature_name(window, softcap, alibi, dropout) != "dense":
        return feature_reference(q, k, v, causal, window=window, softcap=softcap, alibi=alibi,
                                 dropout=dropout)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = sdpa_forward(q, k, v, causal)().transpose(1, 2)
    empty_rows = q.shape[1] - k.shape[1]
    if causal and empty_rows > 0:
        out[:, :empty_rows] = 0
    return out


def check_impl(
    impl: str, cfg: BenchConfig, q: Tensor, k: Tensor, v: Tensor, ref: Tensor,
    *, atol: float = CHECK_ATOL,
) -> None:
    """Raise :class:`CheckError` if ``impl`` deviates from ``ref`` by > ``atol``.

    ``ref`` is :func:`reference_output` of ``cfg``, in flashcute's layout
    (which FlashAttention-3 shares).

    Exceptions raised by ``impl`` itself propagate (the caller treats them
    as "unsupported configuration").
    """
    import torch  # noqa: PLC0415

    with torch.no_grad():
        out = make_forward_fn(impl, q, k, v, cfg.causal, window=cfg.window,
                              softcap=cfg.softcap, alibi=cfg.alibi, dropout=cfg.dropout)()
    torch.cuda.synchronize()
    shape_note, err = "", math.inf  # max |out - ref| in fp32; inf on mismatch or NaN/inf
    if tuple(out.shape) != tuple(ref.shape):
        shape_note = f" (output shape {tuple(out.shape)}, expected {tuple(ref.shape)})"
    else:
        err = float((out.float() - ref.float()).abs().max().item())
        err = err if math.isfinite(err) else math.inf
    if not err <= atol:
        against = "PyTorch SDPA" if cfg.feature == "dense" else "flashcute.reference (fp32)"
        detail = f"max abs error {err:.3e} > {atol:g} vs {against}{shape_note}"
        raise CheckError(
            f"--check failed: {impl} on {cfg.label}: {detail}; refusing to benchmark a "
            f"kernel that gives wrong results",
            detail=detail,
        )


def _progress_label(cfg: BenchConfig) -> str:
    """The configuration, briefly, for the progress bar."""
    mask = "causal" if cfg.causal else "full"
    if cfg.feature != "dense":
        mask += f" {feature_label(cfg.window, cfg.softcap, cfg.alibi, cfg.dropout)}"
    if cfg.seqlen_k == cfg.seqlen and cfg.nheads_kv == cfg.nheads:
        return f"hdim={cfg.hdim} {mask} s={cfg.seqlen}"
    return (f"{cfg.batch},{cfg.seqlen},{cfg.seqlen_k},{cfg.nheads},{cfg.nheads_kv},{cfg.hdim} "
            f"{mask}")


def run_benchmark(
    grid: Sequence[BenchConfig], impls: Sequence[str], *, build_info: Mapping[str, Any],
    capability: tuple[int, int], warmup_ms: float, rep_ms: float, bwd: bool, check: bool,
    seed: int, notes: Notes, progress: Progress, rounds: int = 1,
) -> list[BenchRow]:
    """Measure every implementation on every configuration of ``grid``, ``rounds`` times
    in alternation, keeping each one's median.

    With ``check``, every flashcute implementation and FlashAttention-3 is
    first compared against SDPA on each configuration: a flashcute mismatch
    raises :class:`CheckError`; a FlashAttention-3 mismatch drops it from that
    configuration with a note (a baseline that computes something else is not
    timed, and does not stop flashcute's run).  Configurations with a window,
    softcap or ALiBi run flashcute only (:func:`~.impls.feature_skip_reason`); their
    ``--check`` reference is :func:`feature_reference`.
    """
    import torch  # noqa: PLC0415

    rows: list[BenchRow] = []
    for cfg in grid:
        q, k, v = make_inputs(cfg, seed=seed)
        ref: Tensor | None = None
        runnable: list[str] = []
        for impl in impls:
            progress.set_postfix_str(f"{impl} {_progress_label(cfg)}")
            reason = feature_skip_reason(impl, cfg.window, cfg.softcap, cfg.alibi,
                                         cfg.dropout) or impl_skip_reason(
                impl, cfg.hdim, cfg.dtype, build_info, capability)
            if reason is None and check and impl in FLASHCUTE_IMPLS + FA3_IMPLS:
                try:
                    if ref is None:
                        ref = reference_output(q, k, v, cfg.causal, window=cfg.window,
                                               softcap=cfg.softcap, alibi=cfg.alibi,
                                               dropout=cfg.dropout)
                except Exception as exc:  # noqa: BLE001 - nothing to check against
                    what = "SDPA reference" if cfg.feature == "dense" else "reference"
                    reason = (f"{impl} skipped on {cfg.label}: --check's {what} failed "
                              f"({short_error(exc)})")
                else:
                    try:
                        check_impl(impl, cfg, q, k, v, ref)
                    except CheckError as exc:
                        if impl in FLASHCUTE_IMPLS:
                            raise
                        reason = f"{impl} skipped on {cfg.label} by --check: {exc.detail}"
                    except Exception as exc:  # noqa: BLE001 - unsupported config
                        reason = f"{impl} failed on {cfg.label}: {short_error(exc)}"
            if reason is not None:
                notes.add(reason)
            else:
                runnable.append(impl)
                mask_note = sdpa_mask_note(impl, cfg.causal, cfg.seqlen, cfg.seqlen_k)
                if mask_note is not None:
                    notes.add(mask_note)
        # Rounds alternate between the implementations, so that clock changes under
        # sustained load affect each of them alike; each reports its median round.
        timed: dict[str, list[BenchRow]] = {impl: [] for impl in runnable}
        for round_index in range(rounds):
            for impl in runnable:
                if len(timed[impl]) < round_index:
                    continue  # failed in an earlier round (and noted)
                row = time_impl(impl, cfg, q, k, v, warmup_ms=warmup_ms, rep_ms=rep_ms,
                                bwd=bwd, notes=notes)
                if row is not None:
                    timed[impl].append(row)
        for impl in impls:
            if timed.get(impl):
                rows.append(median_row(timed[impl]))
            progress.update(1)
        del q, k, v, ref
        torch.cuda.empty_cache()
    return rows
