"""Benchmark grid: constants, errors, result records and FLOP counting (pure Python)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

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
#: Alternating rounds per configuration (each implementation reports its median).
DEFAULT_ROUNDS: int = 3
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

#: (dtype, hdim, causal, seqlen): one line of the results table.
RowKey = tuple[str, int, bool, int]


def short_impl(impl: str) -> str:
    """``flashcute-ampere`` -> ``ampere``, ``sdpa-cudnn`` -> ``cudnn``."""
    return impl.split("-", 1)[1] if "-" in impl else impl


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
    def key(self) -> RowKey:
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
        cls, impl: str, cfg: BenchConfig, fwd_tflops: float, bwd_tflops: float | None = None
    ) -> BenchRow:
        """Build a row for ``impl`` measured on ``cfg``."""
        return cls(impl, **dataclasses.asdict(cfg), fwd_tflops=fwd_tflops, bwd_tflops=bwd_tflops)

    @property
    def key(self) -> RowKey:
        """The (dtype, hdim, causal, seqlen) tuple identifying a table row."""
        return (self.dtype, self.hdim, self.causal, self.seqlen)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; ``bwd_tflops`` only appears when it was measured."""
        out = dataclasses.asdict(self)
        if out["bwd_tflops"] is None:
            del out["bwd_tflops"]
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


def validate_grid(hdims: Iterable[int], seqlens: Iterable[int]) -> None:
    """Raise ``ValueError`` unless every hdim divides 2048 and seqlen divides 16384."""
    for values, total, what in (
        (hdims, TOTAL_HIDDEN, "head dims must divide nheads*hdim"),
        (seqlens, TOTAL_TOKENS, "seqlens must divide batch*seqlen"),
    ):
        bad = [x for x in values if x <= 0 or total % x]
        if bad:
            raise ValueError(f"{what}={total}: got {bad}")


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
        BenchConfig(dtype, hdim, causal, seqlen, TOTAL_TOKENS // seqlen, TOTAL_HIDDEN // hdim)
        for hdim in hdims
        for causal in causals
        for seqlen in seqlens
    ]


def attention_flops(
    batch: int, nheads: int, seqlen_q: int, seqlen_k: int, hdim: int, causal: bool,
    *, backward: bool = False,
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
        cfg.batch, cfg.nheads, cfg.seqlen, cfg.seqlen, cfg.hdim, cfg.causal, backward=backward
    )


def tflops_from_ms(flops: float, ms: float) -> float:
    """Convert a FLOP count and a time in milliseconds to TFLOP/s."""
    if ms <= 0 or not math.isfinite(ms):
        raise ValueError(f"time must be positive and finite, got {ms!r} ms")
    return flops / (ms * 1e-3) / 1e12
