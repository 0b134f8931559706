"""Forward-attention throughput benchmark for flashcute against PyTorch SDPA.

Run it as ``python -m flashcute.bench``.  The default grid follows the
FlashAttention-3 paper: the total number of tokens ``batch * seqlen`` is fixed
at 16384 and the hidden size ``nheads * hdim`` at 2048, for head dimensions
64/128/256, causal and non-causal masking, and sequence lengths 512 to 16384.

Implementations compared:

* ``flashcute-ampere``  -- ``flashcute.attention(..., backend="ampere")``
* ``flashcute-hopper``  -- ``flashcute.attention(..., backend="hopper")``
  (only on sm90 devices, for head dims/dtypes listed in ``build_info()``)
* ``sdpa-cudnn``        -- ``F.scaled_dot_product_attention`` restricted to
  ``SDPBackend.CUDNN_ATTENTION``
* ``sdpa-flash``        -- ``F.scaled_dot_product_attention`` restricted to
  ``SDPBackend.FLASH_ATTENTION``

Inputs are created once per configuration in flashcute's ``(batch, seqlen,
nheads, headdim)`` layout; SDPA receives ``.transpose(1, 2)`` views of the same
tensors (no copy).

A progress bar goes to stderr, a results table to stdout; ``--json`` and
``--plot`` write machine-readable results and a PNG chart.

The module keeps ``torch``, ``triton``, ``matplotlib`` and ``flashcute``
itself out of its import-time dependencies, so the pure helpers (grid
construction, FLOP counting, table and JSON formatting) can be imported and
tested on a machine without a GPU or a built extension.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import warnings
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
    TextIO,
)

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch

__all__ = [
    "TOTAL_TOKENS",
    "TOTAL_HIDDEN",
    "DEFAULT_HDIMS",
    "DEFAULT_SEQLENS",
    "QUICK_HDIMS",
    "QUICK_SEQLENS",
    "IMPLS",
    "CHECK_ATOL",
    "BenchConfig",
    "BenchRow",
    "Notes",
    "SimpleProgress",
    "BenchError",
    "CheckError",
    "NoGPUError",
    "build_parser",
    "parse_args",
    "causal_values",
    "build_grid",
    "attention_flops",
    "config_flops",
    "tflops_from_ms",
    "impl_skip_reason",
    "impl_unavailable_reason",
    "select_impls",
    "flashcute_backward_available",
    "format_table",
    "results_to_json",
    "write_json",
    "plot_results",
    "main",
]

# --------------------------------------------------------------------------
# Constants
# --------------------------------------------------------------------------

#: batch * seqlen for every configuration of the grid.
TOTAL_TOKENS: int = 16384
#: nheads * hdim for every configuration of the grid.
TOTAL_HIDDEN: int = 2048

DEFAULT_HDIMS: tuple[int, ...] = (64, 128, 256)
DEFAULT_SEQLENS: tuple[int, ...] = (512, 1024, 2048, 4096, 8192, 16384)
QUICK_HDIMS: tuple[int, ...] = (128,)
QUICK_SEQLENS: tuple[int, ...] = (512, 2048, 8192)

#: Default timing budget, in milliseconds (same as ``triton.testing.do_bench``).
DEFAULT_WARMUP_MS: float = 25.0
DEFAULT_REP_MS: float = 100.0
QUICK_WARMUP_MS: float = 5.0
QUICK_REP_MS: float = 20.0

FLASHCUTE_IMPLS: tuple[str, ...] = ("flashcute-ampere", "flashcute-hopper")
SDPA_IMPLS: tuple[str, ...] = ("sdpa-cudnn", "sdpa-flash")
#: All implementations, in table-column order.
IMPLS: tuple[str, ...] = FLASHCUTE_IMPLS + SDPA_IMPLS

#: ``--check`` fails when flashcute deviates from SDPA by more than this.
CHECK_ATOL: float = 2e-2

#: The backward pass costs 2.5x the forward FLOPs (2 matmuls fwd, 5 bwd).
BWD_FLOPS_FACTOR: float = 2.5

DTYPE_CHOICES: tuple[str, ...] = ("bf16", "fp16")
_DTYPE_ALIASES: dict[str, frozenset[str]] = {
    "bf16": frozenset({"bf16", "bfloat16", "torch.bfloat16"}),
    "fp16": frozenset({"fp16", "float16", "half", "torch.float16"}),
}

NO_GPU_MESSAGE: str = (
    "flashcute.bench needs a CUDA GPU and PyTorch with CUDA; {detail}"
)

_PROG = "python -m flashcute.bench"


# --------------------------------------------------------------------------
# Errors and data records
# --------------------------------------------------------------------------


class BenchError(RuntimeError):
    """A fatal benchmark error, reported on stderr by :func:`main`."""


class NoGPUError(BenchError):
    """PyTorch or a CUDA device is missing; :func:`main` exits with code 2."""


class CheckError(BenchError):
    """``--check`` found a flashcute output that disagrees with SDPA."""


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """One point of the benchmark grid (shared by all implementations)."""

    dtype: str
    hdim: int
    causal: bool
    seqlen: int
    batch: int
    nheads: int

    @property
    def label(self) -> str:
        """Short human-readable description, used in notes and errors."""
        mask = "causal" if self.causal else "non-causal"
        return (
            f"{self.dtype} hdim={self.hdim} {mask} seqlen={self.seqlen} "
            f"(batch={self.batch}, nheads={self.nheads})"
        )

    @property
    def key(self) -> tuple[str, int, bool, int]:
        """The (dtype, hdim, causal, seqlen) tuple identifying a table row."""
        return (self.dtype, self.hdim, self.causal, self.seqlen)


@dataclasses.dataclass
class BenchRow:
    """The measured result of one implementation on one configuration.

    ``bwd_tflops`` is ``None`` when the backward pass was not timed (no
    ``--bwd``, or the implementation has no backward); it is then left out
    of the JSON output.
    """

    impl: str
    dtype: str
    hdim: int
    causal: bool
    seqlen: int
    batch: int
    nheads: int
    fwd_tflops: float
    bwd_tflops: float | None = None

    @classmethod
    def from_config(
        cls,
        impl: str,
        cfg: BenchConfig,
        fwd_tflops: float,
        bwd_tflops: float | None = None,
    ) -> "BenchRow":
        """Build a row for ``impl`` measured on ``cfg``."""
        return cls(
            impl=impl,
            dtype=cfg.dtype,
            hdim=cfg.hdim,
            causal=cfg.causal,
            seqlen=cfg.seqlen,
            batch=cfg.batch,
            nheads=cfg.nheads,
            fwd_tflops=fwd_tflops,
            bwd_tflops=bwd_tflops,
        )

    @property
    def key(self) -> tuple[str, int, bool, int]:
        """The (dtype, hdim, causal, seqlen) tuple identifying a table row."""
        return (self.dtype, self.hdim, self.causal, self.seqlen)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; ``bwd_tflops`` only appears when it was measured."""
        out: dict[str, Any] = {
            "impl": self.impl,
            "dtype": self.dtype,
            "hdim": self.hdim,
            "causal": self.causal,
            "seqlen": self.seqlen,
            "batch": self.batch,
            "nheads": self.nheads,
            "fwd_tflops": self.fwd_tflops,
        }
        if self.bwd_tflops is not None:
            out["bwd_tflops"] = self.bwd_tflops
        return out


class Notes:
    """Ordered, de-duplicated list of informational messages."""

    def __init__(self) -> None:
        self._items: dict[str, None] = {}

    def add(self, message: str) -> None:
        """Record ``message`` (ignored if already present)."""
        self._items.setdefault(message, None)

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def as_list(self) -> list[str]:
        """The messages in insertion order."""
        return list(self._items)


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------


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


def _impl_list(text: str) -> list[str]:
    """argparse type: comma-separated implementation names, or ``all``."""
    names = [tok.strip() for tok in text.split(",") if tok.strip()]
    if not names:
        raise argparse.ArgumentTypeError("expected at least one implementation")
    if names == ["all"]:
        return list(IMPLS)
    unknown = [n for n in names if n not in IMPLS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown implementation(s) {', '.join(unknown)}; "
            f"choose from {', '.join(IMPLS)} or 'all'"
        )
    # Canonical order, no duplicates.
    return [impl for impl in IMPLS if impl in names]


def build_parser() -> argparse.ArgumentParser:
    """Create the argument parser of ``python -m flashcute.bench``."""
    parser = argparse.ArgumentParser(
        prog=_PROG,
        description=(
            "Forward attention TFLOP/s of flashcute vs PyTorch SDPA on the "
            f"FlashAttention-3 grid (batch*seqlen={TOTAL_TOKENS}, "
            f"nheads*hdim={TOTAL_HIDDEN})."
        ),
    )
    parser.add_argument(
        "--hdims",
        type=_int_list,
        default=None,
        help="comma-separated head dims (default: "
        + ",".join(map(str, DEFAULT_HDIMS))
        + "; with --quick: "
        + ",".join(map(str, QUICK_HDIMS))
        + ")",
    )
    parser.add_argument(
        "--seqlens",
        type=_int_list,
        default=None,
        help="comma-separated sequence lengths (default: "
        + ",".join(map(str, DEFAULT_SEQLENS))
        + "; with --quick: "
        + ",".join(map(str, QUICK_SEQLENS))
        + ")",
    )
    parser.add_argument(
        "--causal",
        choices=("both", "yes", "no"),
        default="both",
        help="which masks to run (default: both)",
    )
    parser.add_argument(
        "--dtype", choices=DTYPE_CHOICES, default="bf16", help="default: bf16"
    )
    parser.add_argument(
        "--impls",
        type=_impl_list,
        default=None,
        help="comma-separated subset of "
        + ", ".join(IMPLS)
        + " (default: all available)",
    )
    parser.add_argument(
        "--bwd",
        action="store_true",
        help="also time the backward pass (SDPA via autograd; flashcute when "
        "it provides a backward)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help=f"compare each flashcute config against SDPA first and abort if "
        f"the max abs error exceeds {CHECK_ATOL:g}",
    )
    parser.add_argument("--json", metavar="PATH", help="write results as JSON")
    parser.add_argument(
        "--plot", metavar="PATH", help="write a PNG of TFLOP/s vs seqlen (needs matplotlib)"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: hdim 128, seqlens 512,2048,8192, short timing",
    )
    parser.add_argument(
        "--warmup",
        type=float,
        default=None,
        metavar="MS",
        help=f"warm-up time per measurement in ms (default: {DEFAULT_WARMUP_MS:g}, "
        f"--quick: {QUICK_WARMUP_MS:g})",
    )
    parser.add_argument(
        "--rep",
        type=float,
        default=None,
        metavar="MS",
        help=f"measurement time per measurement in ms (default: {DEFAULT_REP_MS:g}, "
        f"--quick: {QUICK_REP_MS:g})",
    )
    parser.add_argument("--seed", type=int, default=0, help="RNG seed (default: 0)")
    parser.add_argument(
        "--no-progress", action="store_true", help="do not draw a progress bar"
    )
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse and validate the command line, resolving ``--quick`` defaults.

    After parsing, ``hdims``/``seqlens`` are lists of ints, ``causals`` a list
    of bools, ``impls`` a list of names (``None`` meaning "all available"),
    and ``warmup``/``rep`` floats in milliseconds.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.hdims is None:
        args.hdims = list(QUICK_HDIMS if args.quick else DEFAULT_HDIMS)
    if args.seqlens is None:
        args.seqlens = list(QUICK_SEQLENS if args.quick else DEFAULT_SEQLENS)
    if args.warmup is None:
        args.warmup = QUICK_WARMUP_MS if args.quick else DEFAULT_WARMUP_MS
    if args.rep is None:
        args.rep = QUICK_REP_MS if args.quick else DEFAULT_REP_MS
    if args.warmup < 0 or args.rep <= 0:
        parser.error("--warmup must be >= 0 and --rep > 0")
    args.causals = causal_values(args.causal)
    try:
        validate_grid(args.hdims, args.seqlens)
    except ValueError as exc:
        parser.error(str(exc))
    return args


def causal_values(choice: str) -> list[bool]:
    """Map ``--causal both|yes|no`` to the list of causal flags to run."""
    mapping = {"both": [False, True], "yes": [True], "no": [False]}
    try:
        return list(mapping[choice])
    except KeyError:
        raise ValueError(f"--causal must be one of both|yes|no, got {choice!r}") from None


# --------------------------------------------------------------------------
# Grid and FLOP counting
# --------------------------------------------------------------------------


def validate_grid(hdims: Iterable[int], seqlens: Iterable[int]) -> None:
    """Raise ``ValueError`` unless every hdim divides 2048 and seqlen divides 16384."""
    bad_h = [h for h in hdims if h <= 0 or TOTAL_HIDDEN % h]
    if bad_h:
        raise ValueError(
            f"head dims must divide nheads*hdim={TOTAL_HIDDEN}: got {bad_h}"
        )
    bad_s = [s for s in seqlens if s <= 0 or TOTAL_TOKENS % s]
    if bad_s:
        raise ValueError(
            f"seqlens must divide batch*seqlen={TOTAL_TOKENS}: got {bad_s}"
        )


def build_grid(
    hdims: Sequence[int] = DEFAULT_HDIMS,
    seqlens: Sequence[int] = DEFAULT_SEQLENS,
    causals: Sequence[bool] = (False, True),
    dtype: str = "bf16",
) -> list[BenchConfig]:
    """Enumerate the benchmark configurations.

    ``batch = 16384 // seqlen`` and ``nheads = 2048 // hdim``; order is
    hdim, then causal, then seqlen (the table and plot order).
    """
    validate_grid(hdims, seqlens)
    if dtype not in DTYPE_CHOICES:
        raise ValueError(f"dtype must be one of {DTYPE_CHOICES}, got {dtype!r}")
    return [
        BenchConfig(
            dtype=dtype,
            hdim=hdim,
            causal=causal,
            seqlen=seqlen,
            batch=TOTAL_TOKENS // seqlen,
            nheads=TOTAL_HIDDEN // hdim,
        )
        for hdim in hdims
        for causal in causals
        for seqlen in seqlens
    ]


def attention_flops(
    batch: int,
    nheads: int,
    seqlen_q: int,
    seqlen_k: int,
    hdim: int,
    causal: bool,
    *,
    backward: bool = False,
) -> float:
    """FLOPs of one attention pass, FlashAttention convention.

    Forward: ``4 * b * h * s_q * s_k * d`` (two matmuls), halved when causal.
    Backward: 2.5x the forward count.
    """
    flops = 4.0 * batch * nheads * seqlen_q * seqlen_k * hdim
    if causal:
        flops /= 2.0
    if backward:
        flops *= BWD_FLOPS_FACTOR
    return flops


def config_flops(cfg: BenchConfig, *, backward: bool = False) -> float:
    """:func:`attention_flops` for a grid configuration (s_q == s_k)."""
    return attention_flops(
        cfg.batch, cfg.nheads, cfg.seqlen, cfg.seqlen, cfg.hdim, cfg.causal,
        backward=backward,
    )


def tflops_from_ms(flops: float, ms: float) -> float:
    """Convert a FLOP count and a time in milliseconds to TFLOP/s."""
    if ms <= 0 or not math.isfinite(ms):
        raise ValueError(f"time must be positive and finite, got {ms!r} ms")
    return flops / (ms * 1e-3) / 1e12


# --------------------------------------------------------------------------
# Implementation availability (pure helpers)
# --------------------------------------------------------------------------


def _dtype_supported(dtype: str, listed: Iterable[Any] | None) -> bool:
    """Whether ``dtype`` (``bf16``/``fp16``) appears in a build_info dtype list.

    An absent or empty list is taken to mean "no restriction".
    """
    if not listed:
        return True
    aliases = _DTYPE_ALIASES.get(dtype, frozenset({dtype}))
    return any(str(item).lower() in aliases for item in listed)


def _head_dims(listed: Iterable[Any] | None) -> list[int]:
    """Normalize a build_info head-dim list to sorted ints."""
    out: set[int] = set()
    for item in listed or ():
        try:
            out.add(int(item))
        except (TypeError, ValueError):
            continue
    return sorted(out)


def impl_skip_reason(
    impl: str,
    hdim: int,
    dtype: str,
    build_info: Mapping[str, Any] | None,
    capability: tuple[int, int],
) -> str | None:
    """Why ``impl`` cannot run ``(hdim, dtype)`` here, or ``None`` if it can.

    Only flashcute implementations are filtered up front (from
    ``flashcute.build_info()`` and the device's compute capability); SDPA
    backends are tried and any exception is reported as a note instead.
    """
    if impl not in FLASHCUTE_IMPLS:
        return None
    backend = impl.split("-", 1)[1]
    if impl == "flashcute-hopper" and capability[0] != 9:
        return (
            f"{impl} skipped: needs an sm90 device, this one is "
            f"sm{capability[0]}{capability[1]}"
        )
    backends = (build_info or {}).get("backends") or {}
    info = backends.get(backend)
    if not info:
        return f"{impl} skipped: the flashcute build has no {backend!r} backend"
    head_dims = _head_dims(info.get("head_dims"))
    if hdim not in head_dims:
        return (
            f"{impl} skipped for hdim={hdim}: build supports head dims "
            f"{head_dims or 'none'}"
        )
    if not _dtype_supported(dtype, info.get("dtypes")):
        return (
            f"{impl} skipped for {dtype}: build supports dtypes "
            f"{list(info.get('dtypes') or [])}"
        )
    return None


def impl_unavailable_reason(
    impl: str,
    build_info: Mapping[str, Any] | None,
    capability: tuple[int, int],
    flashcute_error: str | None,
    has_cudnn_sdpa: bool,
) -> str | None:
    """Why ``impl`` is unavailable for the whole run, or ``None``.

    Unavailable implementations get no table column; implementations that
    only lack some head dims are handled per row by :func:`impl_skip_reason`.
    """
    if impl in FLASHCUTE_IMPLS:
        if flashcute_error is not None:
            return f"{impl} skipped: flashcute is not usable ({flashcute_error})"
        backend = impl.split("-", 1)[1]
        if impl == "flashcute-hopper" and capability[0] != 9:
            return (
                f"{impl} skipped: needs an sm90 device, this one is "
                f"sm{capability[0]}{capability[1]}"
            )
        backends = (build_info or {}).get("backends") or {}
        info = backends.get(backend)
        if not info or not _head_dims(info.get("head_dims")):
            return f"{impl} skipped: the flashcute build has no {backend!r} kernels"
        return None
    if impl == "sdpa-cudnn" and not has_cudnn_sdpa:
        return f"{impl} skipped: this PyTorch has no SDPBackend.CUDNN_ATTENTION"
    return None


# --------------------------------------------------------------------------
# flashcute access (lazy)
# --------------------------------------------------------------------------


def _import_flashcute() -> Any:
    """Import and return the ``flashcute`` package (raises on failure)."""
    import flashcute  # noqa: PLC0415 - deliberately lazy

    if not callable(getattr(flashcute, "attention", None)):
        raise ImportError("flashcute.attention is not available")
    return flashcute


def flashcute_backward_available() -> bool:
    """Whether the installed flashcute provides a backward pass.

    The benchmark times the flashcute backward (through autograd on
    ``flashcute.attention``) only when this returns ``True``.
    """
    try:
        import flashcute  # noqa: PLC0415 - deliberately lazy
    except Exception:  # noqa: BLE001 - any import failure means "no"
        return False
    return hasattr(flashcute, "attention_backward")


def load_flashcute() -> tuple[Any | None, dict[str, Any], str | None]:
    """Return ``(module, build_info, error)``; ``module`` is None on failure."""
    try:
        fc = _import_flashcute()
    except Exception as exc:  # noqa: BLE001 - report any failure as a note
        return None, {}, _short_error(exc)
    info: dict[str, Any] = {}
    build_info = getattr(fc, "build_info", None)
    if callable(build_info):
        try:
            info = dict(build_info())
        except Exception as exc:  # noqa: BLE001
            return fc, {}, f"build_info() failed: {_short_error(exc)}"
    return fc, info, None


def flashcute_version(fc: Any | None, build_info: Mapping[str, Any]) -> str | None:
    """Best-effort flashcute version string."""
    version = build_info.get("version") if build_info else None
    if version is None and fc is not None:
        version = getattr(fc, "__version__", None)
    return None if version is None else str(version)


def _short_error(exc: BaseException) -> str:
    """``Type: first line of message`` (SDPA errors can be very long)."""
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    if len(first) > 200:
        first = first[:197] + "..."
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


# --------------------------------------------------------------------------
# Environment, inputs and callables (need torch + CUDA)
# --------------------------------------------------------------------------


def require_cuda() -> Any:
    """Import torch and check for a CUDA device; raise :class:`NoGPUError`."""
    try:
        import torch  # noqa: PLC0415 - deliberately lazy
    except Exception as exc:  # noqa: BLE001
        raise NoGPUError(
            NO_GPU_MESSAGE.format(detail=f"PyTorch could not be imported ({_short_error(exc)})")
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


def torch_dtype(name: str) -> "torch.dtype":
    """Map ``bf16``/``fp16`` to the torch dtype."""
    import torch  # noqa: PLC0415

    return {"bf16": torch.bfloat16, "fp16": torch.float16}[name]


def make_inputs(
    cfg: BenchConfig, *, seed: int = 0, device: str = "cuda"
) -> tuple["torch.Tensor", "torch.Tensor", "torch.Tensor"]:
    """Random q, k, v of shape ``(batch, seqlen, nheads, hdim)`` on ``device``."""
    import torch  # noqa: PLC0415

    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    shape = (cfg.batch, cfg.seqlen, cfg.nheads, cfg.hdim)
    dt = torch_dtype(cfg.dtype)
    return tuple(  # type: ignore[return-value]
        torch.randn(shape, generator=gen, device=device, dtype=dt) for _ in range(3)
    )


def has_cudnn_sdpa() -> bool:
    """Whether this PyTorch exposes ``SDPBackend.CUDNN_ATTENTION``."""
    try:
        from torch.nn.attention import SDPBackend  # noqa: PLC0415
    except Exception:  # noqa: BLE001
        return False
    return hasattr(SDPBackend, "CUDNN_ATTENTION")


def sdpa_backend(impl: str) -> Any:
    """The ``SDPBackend`` member for ``sdpa-cudnn`` / ``sdpa-flash``."""
    from torch.nn.attention import SDPBackend  # noqa: PLC0415

    return {
        "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION,
        "sdpa-flash": SDPBackend.FLASH_ATTENTION,
    }[impl]


def impl_context(impl: str) -> Any:
    """Context manager to enter around every call of ``impl``.

    SDPA implementations are pinned to one backend with
    ``torch.nn.attention.sdpa_kernel``; flashcute needs nothing.
    """
    import contextlib  # noqa: PLC0415

    if impl in SDPA_IMPLS:
        from torch.nn.attention import sdpa_kernel  # noqa: PLC0415

        return sdpa_kernel(sdpa_backend(impl))
    return contextlib.nullcontext()


def make_forward_fn(
    impl: str,
    q: "torch.Tensor",
    k: "torch.Tensor",
    v: "torch.Tensor",
    causal: bool,
) -> Callable[[], "torch.Tensor"]:
    """A zero-argument callable running one forward pass of ``impl``.

    ``q, k, v`` are in ``(batch, seqlen, nheads, hdim)`` layout; SDPA gets
    ``(batch, nheads, seqlen, hdim)`` transposed views and must be called
    inside :func:`impl_context`.  The returned output is in the callee's
    native layout.
    """
    if impl in FLASHCUTE_IMPLS:
        fc = _import_flashcute()
        backend = impl.split("-", 1)[1]

        def run_flashcute() -> "torch.Tensor":
            return fc.attention(q, k, v, causal=causal, backend=backend)

        return run_flashcute
    if impl in SDPA_IMPLS:
        import torch.nn.functional as F  # noqa: PLC0415

        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

        def run_sdpa() -> "torch.Tensor":
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

        return run_sdpa
    raise ValueError(f"unknown implementation {impl!r}")


def make_backward_fn(
    impl: str,
    q: "torch.Tensor",
    k: "torch.Tensor",
    v: "torch.Tensor",
    causal: bool,
) -> Callable[[], Any]:
    """A zero-argument callable running only the backward pass of ``impl``.

    The forward runs once here (call inside :func:`impl_context`); the
    callable computes ``torch.autograd.grad(out, (q, k, v), dout,
    retain_graph=True)`` so that it can be repeated.
    """
    import torch  # noqa: PLC0415

    qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
    out = make_forward_fn(impl, qg, kg, vg, causal)()
    dout = torch.randn_like(out)

    def run_backward() -> Any:
        return torch.autograd.grad(out, (qg, kg, vg), dout, retain_graph=True)

    return run_backward


def backward_supported(impl: str) -> bool:
    """Whether ``--bwd`` times a backward pass for ``impl``."""
    if impl in SDPA_IMPLS:
        return True
    return impl in FLASHCUTE_IMPLS and flashcute_backward_available()


# --------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------


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

    fn()
    torch.cuda.synchronize()
    # Estimate the per-call time from a few calls.
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        fn()
    end.record()
    torch.cuda.synchronize()
    estimate = max(start.elapsed_time(end) / 5, 1e-3)
    n_warmup = max(1, int(warmup_ms / estimate))
    n_rep = max(min_reps, int(rep_ms / estimate))

    cache = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
    for _ in range(n_warmup):
        fn()
    for i in range(n_rep):
        cache.zero_()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def time_fn(fn: Callable[[], Any], *, warmup_ms: float, rep_ms: float) -> float:
    """Median runtime of ``fn`` in milliseconds.

    Uses ``triton.testing.do_bench(..., return_mode="median")`` when triton
    is importable, else :func:`cuda_event_bench`.
    """
    do_bench = _triton_do_bench()
    if do_bench is not None:
        return float(
            do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")
        )
    return cuda_event_bench(fn, warmup_ms=warmup_ms, rep_ms=rep_ms)


def time_impl(
    impl: str,
    cfg: BenchConfig,
    q: "torch.Tensor",
    k: "torch.Tensor",
    v: "torch.Tensor",
    *,
    warmup_ms: float,
    rep_ms: float,
    bwd: bool,
    notes: Notes,
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
                fwd_ms = time_fn(
                    make_forward_fn(impl, q, k, v, cfg.causal),
                    warmup_ms=warmup_ms,
                    rep_ms=rep_ms,
                )
            except Exception as exc:  # noqa: BLE001 - unsupported config
                notes.add(f"{impl} failed on {cfg.label}: {_short_error(exc)}")
                return None
            bwd_tflops: float | None = None
            if bwd and backward_supported(impl):
                try:
                    bwd_ms = time_fn(
                        make_backward_fn(impl, q, k, v, cfg.causal),
                        warmup_ms=warmup_ms,
                        rep_ms=rep_ms,
                    )
                    bwd_tflops = tflops_from_ms(config_flops(cfg, backward=True), bwd_ms)
                except Exception as exc:  # noqa: BLE001
                    notes.add(
                        f"{impl} backward failed on {cfg.label}: {_short_error(exc)}"
                    )
    return BenchRow.from_config(
        impl, cfg, tflops_from_ms(config_flops(cfg), fwd_ms), bwd_tflops
    )


# --------------------------------------------------------------------------
# Correctness check
# --------------------------------------------------------------------------


def reference_output(
    q: "torch.Tensor", k: "torch.Tensor", v: "torch.Tensor", causal: bool
) -> "torch.Tensor":
    """SDPA output in ``(batch, seqlen, nheads, hdim)`` layout.

    PyTorch picks among its backends (flash, cuDNN, efficient, math).
    """
    import torch  # noqa: PLC0415
    import torch.nn.functional as F  # noqa: PLC0415

    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal
        )
    return out.transpose(1, 2)


def max_abs_error(out: "torch.Tensor", ref: "torch.Tensor") -> float:
    """``max |out - ref|`` in fp32; ``inf`` on shape mismatch or NaN/inf."""
    if tuple(out.shape) != tuple(ref.shape):
        return math.inf
    err = (out.float() - ref.float()).abs().max().item()
    return err if math.isfinite(err) else math.inf


def check_impl(
    impl: str,
    cfg: BenchConfig,
    q: "torch.Tensor",
    k: "torch.Tensor",
    v: "torch.Tensor",
    ref: "torch.Tensor",
    *,
    atol: float = CHECK_ATOL,
) -> None:
    """Raise :class:`CheckError` if ``impl`` deviates from ``ref`` by > ``atol``.

    Exceptions raised by ``impl`` itself propagate (the caller treats them
    as "unsupported configuration").
    """
    import torch  # noqa: PLC0415

    with torch.no_grad():
        out = make_forward_fn(impl, q, k, v, cfg.causal)()
    torch.cuda.synchronize()
    shape_note = ""
    if tuple(out.shape) != tuple(ref.shape):
        shape_note = f" (output shape {tuple(out.shape)}, expected {tuple(ref.shape)})"
    err = max_abs_error(out, ref)
    if not err <= atol:
        raise CheckError(
            f"--check failed: {impl} on {cfg.label}: max abs error {err:.3e} "
            f"> {atol:g} vs PyTorch SDPA{shape_note}; refusing to benchmark a "
            f"kernel that gives wrong results"
        )


# --------------------------------------------------------------------------
# Output: table, JSON, plot
# --------------------------------------------------------------------------


def _short_impl(impl: str) -> str:
    """``flashcute-ampere`` -> ``ampere``, ``sdpa-cudnn`` -> ``cudnn``."""
    return impl.split("-", 1)[1] if "-" in impl else impl


def _ordered_impls(rows: Sequence[BenchRow]) -> list[str]:
    """Implementations present in ``rows``: known ones first, in IMPLS order."""
    present = {r.impl for r in rows}
    extra = sorted(present - set(IMPLS))
    return [i for i in IMPLS if i in present] + extra


def format_table(
    rows: Sequence[BenchRow], impls: Sequence[str] | None = None
) -> str:
    """Render results as a fixed-width text table.

    One line per (dtype, hdim, causal, seqlen), in first-seen order; columns
    are the forward TFLOP/s of each implementation, then the ratios
    ``flashcute-X / sdpa-Y`` for each flashcute and SDPA implementation, then
    backward TFLOP/s for implementations with backward results.  Missing
    measurements show as ``-``.
    """
    impls = list(impls) if impls is not None else _ordered_impls(rows)
    fc_impls = [i for i in impls if i.startswith("flashcute-")]
    sdpa_impls = [i for i in impls if i.startswith("sdpa-")]
    bwd_impls = [
        i for i in impls if any(r.impl == i and r.bwd_tflops is not None for r in rows)
    ]

    by_key: dict[tuple[str, int, bool, int], dict[str, BenchRow]] = {}
    meta: dict[tuple[str, int, bool, int], BenchRow] = {}
    for r in rows:
        by_key.setdefault(r.key, {})[r.impl] = r
        meta.setdefault(r.key, r)

    headers = ["dtype", "hdim", "causal", "seqlen", "batch", "nheads"]
    headers += list(impls)
    ratio_pairs = [(f, s) for f in fc_impls for s in sdpa_impls]
    headers += [f"{_short_impl(f)}/{_short_impl(s)}" for f, s in ratio_pairs]
    headers += [f"{i} bwd" for i in bwd_impls]

    def fmt_tflops(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    body: list[list[str]] = []
    group_starts: set[int] = set()
    last_group: tuple[str, int, bool] | None = None
    for key, per_impl in by_key.items():
        m = meta[key]
        group = (m.dtype, m.hdim, m.causal)
        if last_group is not None and group != last_group:
            group_starts.add(len(body))
        last_group = group
        cells = [m.dtype, str(m.hdim), "yes" if m.causal else "no", str(m.seqlen),
                 str(m.batch), str(m.nheads)]
        cells += [fmt_tflops(per_impl[i].fwd_tflops if i in per_impl else None)
                  for i in impls]
        for f, s in ratio_pairs:
            if f in per_impl and s in per_impl and per_impl[s].fwd_tflops > 0:
                cells.append(f"{per_impl[f].fwd_tflops / per_impl[s].fwd_tflops:.2f}x")
            else:
                cells.append("-")
        cells += [fmt_tflops(per_impl[i].bwd_tflops if i in per_impl else None)
                  for i in bwd_impls]
        body.append(cells)

    widths = [len(h) for h in headers]
    for cells in body:
        widths = [max(w, len(c)) for w, c in zip(widths, cells)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) for c, w in zip(cells, widths)).rstrip()

    sep = "  ".join("-" * w for w in widths)
    out = [line(headers), sep]
    for idx, cells in enumerate(body):
        if idx in group_starts:
            out.append("")
        out.append(line(cells))
    if not body:
        out.append("(no results)")
    return "\n".join(out)


def results_to_json(
    rows: Sequence[BenchRow],
    *,
    device: str,
    torch_version: str,
    flashcute_version: str | None,
    dtype: str,
    notes: Sequence[str] = (),
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


def write_json(path: str | os.PathLike[str], document: Mapping[str, Any]) -> None:
    """Write ``document`` to ``path`` (parent directories are created)."""
    parent = os.path.dirname(os.fspath(path))
    if parent:
        os.makedirs(parent, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(document, fh, indent=2)
        fh.write("\n")


def _import_pyplot() -> Any:
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
    rows: Sequence[BenchRow],
    path: str | os.PathLike[str],
    *,
    title: str = "",
) -> None:
    """PNG of TFLOP/s vs seqlen: one subplot per (hdim, causal), one line per impl.

    Forward results are solid lines; backward results, when present, dashed.
    """
    plt = _import_pyplot()
    hdims = sorted({r.hdim for r in rows})
    causals = sorted({r.causal for r in rows})
    impls = _ordered_impls(rows)
    seqlens = sorted({r.seqlen for r in rows})
    nrows, ncols = max(1, len(hdims)), max(1, len(causals))
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(5.5 * ncols, 3.8 * nrows), squeeze=False
    )
    colors = plt.rcParams["axes.prop_cycle"].by_key().get("color", [None])
    for ri, hdim in enumerate(hdims):
        for ci, causal in enumerate(causals):
            ax = axes[ri][ci]
            for ii, impl in enumerate(impls):
                sel = sorted(
                    (r for r in rows
                     if r.impl == impl and r.hdim == hdim and r.causal == causal),
                    key=lambda r: r.seqlen,
                )
                if not sel:
                    continue
                color = colors[ii % len(colors)]
                ax.plot([r.seqlen for r in sel], [r.fwd_tflops for r in sel],
                        marker="o", color=color, label=f"{impl} fwd")
                bwd = [r for r in sel if r.bwd_tflops is not None]
                if bwd:
                    ax.plot([r.seqlen for r in bwd], [r.bwd_tflops for r in bwd],
                            marker="s", linestyle="--", color=color,
                            label=f"{impl} bwd")
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
    parent = os.path.dirname(os.fspath(path))
    if parent:
        os.makedirs(parent, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --------------------------------------------------------------------------
# Progress reporting
# --------------------------------------------------------------------------


class SimpleProgress:
    """Minimal one-line ``\\r`` progress bar (used when tqdm is missing)."""

    def __init__(self, total: int, desc: str = "", file: TextIO | None = None,
                 width: int = 30) -> None:
        self.total = max(total, 0)
        self.n = 0
        self.desc = desc
        self.file = file if file is not None else sys.stderr
        self.width = width
        self._postfix = ""
        self._last_len = 0
        self._render()

    def _render(self) -> None:
        frac = self.n / self.total if self.total else 1.0
        filled = int(round(frac * self.width))
        bar = "#" * filled + "." * (self.width - filled)
        text = f"{self.desc} [{bar}] {self.n}/{self.total}"
        if self._postfix:
            text += f" {self._postfix}"
        pad = max(0, self._last_len - len(text))
        self.file.write("\r" + text + " " * pad)
        self.file.flush()
        self._last_len = len(text)

    def set_postfix_str(self, text: str) -> None:
        """Show ``text`` after the counter."""
        self._postfix = text
        self._render()

    def update(self, n: int = 1) -> None:
        """Advance by ``n`` steps."""
        self.n = min(self.total, self.n + n)
        self._render()

    def close(self) -> None:
        """Erase the bar."""
        self.file.write("\r" + " " * self._last_len + "\r")
        self.file.flush()


class _NullProgress:
    """Progress sink that draws nothing (``--no-progress``)."""

    def set_postfix_str(self, text: str) -> None:  # noqa: D102
        pass

    def update(self, n: int = 1) -> None:  # noqa: D102
        pass

    def close(self) -> None:  # noqa: D102
        pass


def make_progress(total: int, *, enabled: bool = True, desc: str = "flashcute.bench") -> Any:
    """A progress bar on stderr: tqdm if importable, else :class:`SimpleProgress`."""
    if not enabled:
        return _NullProgress()
    try:
        from tqdm import tqdm  # noqa: PLC0415
    except ImportError:
        return SimpleProgress(total, desc=desc, file=sys.stderr)
    return tqdm(total=total, desc=desc, file=sys.stderr, leave=False,
                dynamic_ncols=True)


# --------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------


def select_impls(
    requested: Sequence[str] | None,
    build_info: Mapping[str, Any],
    capability: tuple[int, int],
    flashcute_error: str | None,
    cudnn_sdpa: bool,
    notes: Notes,
) -> list[str]:
    """The implementations to run; unavailable ones are dropped with a note."""
    candidates = list(requested if requested is not None else IMPLS)
    if flashcute_error is not None:
        dropped = [i for i in candidates if i in FLASHCUTE_IMPLS]
        if dropped:
            notes.add(
                f"flashcute is not usable ({flashcute_error}); skipping "
                + ", ".join(dropped)
            )
        candidates = [i for i in candidates if i not in FLASHCUTE_IMPLS]
    chosen: list[str] = []
    for impl in candidates:
        reason = impl_unavailable_reason(
            impl, build_info, capability, flashcute_error, cudnn_sdpa
        )
        if reason is None:
            chosen.append(impl)
        else:
            notes.add(reason)
    return chosen


def run_benchmark(
    grid: Sequence[BenchConfig],
    impls: Sequence[str],
    *,
    build_info: Mapping[str, Any],
    capability: tuple[int, int],
    warmup_ms: float,
    rep_ms: float,
    bwd: bool,
    check: bool,
    seed: int,
    notes: Notes,
    progress: Any,
) -> list[BenchRow]:
    """Measure every implementation on every configuration of ``grid``.

    Raises :class:`CheckError` when ``check`` is set and a flashcute output
    disagrees with SDPA.
    """
    import torch  # noqa: PLC0415

    rows: list[BenchRow] = []
    for cfg in grid:
        q, k, v = make_inputs(cfg, seed=seed)
        ref: torch.Tensor | None = None
        for impl in impls:
            progress.set_postfix_str(f"{impl} hdim={cfg.hdim} "
                                     f"{'causal' if cfg.causal else 'full'} "
                                     f"s={cfg.seqlen}")
            reason = impl_skip_reason(impl, cfg.hdim, cfg.dtype, build_info, capability)
            if reason is not None:
                notes.add(reason)
                progress.update(1)
                continue
            if check and impl in FLASHCUTE_IMPLS:
                if ref is None:
                    ref = reference_output(q, k, v, cfg.causal)
                try:
                    check_impl(impl, cfg, q, k, v, ref)
                except CheckError:
                    raise
                except Exception as exc:  # noqa: BLE001 - unsupported config
                    notes.add(f"{impl} failed on {cfg.label}: {_short_error(exc)}")
                    progress.update(1)
                    continue
            row = time_impl(impl, cfg, q, k, v, warmup_ms=warmup_ms, rep_ms=rep_ms,
                            bwd=bwd, notes=notes)
            if row is not None:
                rows.append(row)
            progress.update(1)
        del q, k, v, ref
        torch.cuda.empty_cache()
    return rows


def _print_notes(notes: Notes, file: TextIO) -> None:
    """Print collected notes, one per line."""
    for note in notes:
        print(f"note: {note}", file=file)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m flashcute.bench``.

    Exit codes: 0 on success, 1 on a benchmark error (including a failed
    ``--check``), 2 on usage errors or when PyTorch/CUDA is missing.
    """
    args = parse_args(argv)
    try:
        torch = require_cuda()
    except NoGPUError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    if args.plot:
        try:
            _import_pyplot()  # fail before spending minutes benchmarking
        except BenchError as exc:
            print(f"flashcute.bench: {exc}", file=sys.stderr)
            return 2

    notes = Notes()
    wants_flashcute = any(
        i in FLASHCUTE_IMPLS for i in (args.impls if args.impls is not None else IMPLS)
    )
    fc, build_info, fc_error = (
        load_flashcute() if wants_flashcute else (None, {}, "not requested")
    )
    device_index = torch.cuda.current_device()
    device_name = torch.cuda.get_device_name(device_index)
    capability = tuple(torch.cuda.get_device_capability(device_index))
    impls = select_impls(args.impls, build_info, capability,  # type: ignore[arg-type]
                         fc_error, has_cudnn_sdpa(), notes)
    if not impls:
        _print_notes(notes, sys.stderr)
        print("flashcute.bench: no implementation left to benchmark", file=sys.stderr)
        return 1
    if args.bwd:
        for impl in impls:
            if not backward_supported(impl):
                notes.add(f"{impl}: no backward pass available, timing forward only")

    fc_version = flashcute_version(fc, build_info)
    print(f"device: {device_name} (sm{capability[0]}{capability[1]})  "
          f"torch {torch.__version__}  flashcute {fc_version or 'n/a'}")
    print(f"dtype {args.dtype}  batch*seqlen={TOTAL_TOKENS}  nheads*hdim={TOTAL_HIDDEN}  "
          f"timer: {timer_name()} (median, warmup {args.warmup:g} ms, rep {args.rep:g} ms)")
    print("values: fwd TFLOP/s; ratios: flashcute-X / sdpa-Y fwd TFLOP/s")
    sys.stdout.flush()

    grid = build_grid(args.hdims, args.seqlens, args.causals, args.dtype)
    progress = make_progress(len(grid) * len(impls), enabled=not args.no_progress)
    try:
        rows = run_benchmark(
            grid, impls, build_info=build_info, capability=capability,  # type: ignore[arg-type]
            warmup_ms=args.warmup, rep_ms=args.rep, bwd=args.bwd, check=args.check,
            seed=args.seed, notes=notes, progress=progress,
        )
    except CheckError as exc:
        progress.close()
        _print_notes(notes, sys.stderr)
        print(f"flashcute.bench: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        progress.close()
        print("flashcute.bench: interrupted", file=sys.stderr)
        return 130
    progress.close()

    print()
    print(format_table(rows, impls))
    sys.stdout.flush()
    _print_notes(notes, sys.stderr)

    if args.json:
        write_json(args.json, results_to_json(
            rows, device=device_name, torch_version=str(torch.__version__),
            flashcute_version=fc_version, dtype=args.dtype, notes=notes.as_list(),
        ))
        print(f"wrote {args.json}", file=sys.stderr)
    if args.plot:
        try:
            plot_results(rows, args.plot,
                         title=f"{device_name}, {args.dtype}, forward attention")
        except BenchError as exc:
            print(f"flashcute.bench: {exc}", file=sys.stderr)
            return 1
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
