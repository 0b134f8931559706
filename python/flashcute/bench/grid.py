"""Benchmark problems: constants, errors, the grid, ``--shape`` shapes, records and FLOPs.

Pure Python: nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple

#: batch * seqlen for every configuration of the grid.
TOTAL_TOKENS: int = 16384
#: nheads * hdim for the grid's head dims that divide it; others get ``nheads = 2048 // hdim``.
TOTAL_HIDDEN: int = 2048
#: Head dims the benchmark accepts: positive multiples of HDIM_MULTIPLE up to MAX_HDIM.
HDIM_MULTIPLE: int = 8
MAX_HDIM: int = 256

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
#: FlashAttention-3 (``flash_attn_interface.flash_attn_func``), where it is installed.
FA3_IMPLS: tuple[str, ...] = ("fa3",)
#: What flashcute's ratio columns divide by.
BASELINE_IMPLS: tuple[str, ...] = SDPA_IMPLS + FA3_IMPLS
#: All implementations, in table-column order.
IMPLS: tuple[str, ...] = FLASHCUTE_IMPLS + BASELINE_IMPLS
#: Head dims and dtypes FlashAttention-3 is timed for; other configs skip it with a note.
FA3_HDIMS: tuple[int, ...] = (64, 128, 256)
FA3_DTYPES: tuple[str, ...] = ("bf16",)

#: ``--check`` fails when flashcute (or FlashAttention-3) deviates from SDPA by more than this.
CHECK_ATOL: float = 2e-2

#: The backward pass costs 2.5x the forward FLOPs (2 matmuls fwd, 5 bwd).
BWD_FLOPS_FACTOR: float = 2.5

DTYPE_CHOICES: tuple[str, ...] = ("bf16", "fp16")

#: (dtype, hdim, causal, seqlen_q, seqlen_k, batch, nheads, nheads_kv): one table line.
RowKey = tuple[str, int, bool, int, int, int, int, int]


def short_impl(impl: str) -> str:
    """``flashcute-ampere`` -> ``ampere``, ``sdpa-cudnn`` -> ``cudnn``."""
    return impl.split("-", 1)[1] if "-" in impl else impl


class BenchError(RuntimeError):
    """A fatal benchmark error, reported on stderr by :func:`main`."""


class NoGPUError(BenchError):
    """PyTorch or a CUDA device is missing; :func:`main` exits with code 2."""


class CheckError(BenchError):
    """``--check`` found an output that disagrees with SDPA.

    ``detail`` is the mismatch alone (the error, the tolerance), for notes.
    """

    def __init__(self, message: str, *, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail or message


class Shape(NamedTuple):
    """One ``--shape``.

    q is ``(batch, seqlen_q, nheads, hdim)``, k and v ``(batch, seqlen_k, nheads_kv, hdim)``.
    """

    batch: int
    seqlen_q: int
    seqlen_k: int
    nheads: int
    nheads_kv: int
    hdim: int


#: How ``--shape`` spells a shape, for messages.
SHAPE_FORMAT: str = "b,sq,sk,h,hkv,d"


def check_hdim(hdim: int) -> bool:
    """Whether the benchmark accepts head dim ``hdim`` (a positive multiple of 8, <= 256)."""
    return 0 < hdim <= MAX_HDIM and hdim % HDIM_MULTIPLE == 0


def parse_shape(text: str) -> Shape:
    """Parse ``b,sq,sk,h,hkv,d`` into a :class:`Shape`; ``ValueError`` says what is wrong."""
    tokens = [tok.strip() for tok in text.split(",")]
    try:
        values = [int(tok) for tok in tokens]
    except ValueError:
        values = []
    if len(values) != len(Shape._fields) or any(v <= 0 for v in values):
        raise ValueError(
            f"expected {SHAPE_FORMAT} (six positive integers: batch, seqlen_q, seqlen_k, "
            f"nheads, nheads_kv, hdim), got {text!r}"
        )
    shape = Shape(*values)
    if shape.nheads % shape.nheads_kv:
        raise ValueError(
            f"nheads={shape.nheads} is not a multiple of nheads_kv={shape.nheads_kv} in {text!r}"
        )
    if not check_hdim(shape.hdim):
        raise ValueError(
            f"hdim={shape.hdim} in {text!r}: head dims must be positive multiples of "
            f"{HDIM_MULTIPLE} up to {MAX_HDIM}"
        )
    return shape


def parse_shapes(text: str) -> list[Shape]:
    """Parse one or more ``;``-separated shapes (see :func:`parse_shape`)."""
    parts = [part for part in text.split(";") if part.strip()]
    if not parts:
        raise ValueError(f"expected at least one shape {SHAPE_FORMAT}, got {text!r}")
    return [parse_shape(part) for part in parts]


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """One problem timed for every implementation.

    ``seqlen`` is the query length; ``seqlen_k`` and ``nheads_kv`` default (0)
    to ``seqlen`` and ``nheads``, as on the grid.
    """

    dtype: str
    hdim: int
    causal: bool
    seqlen: int
    batch: int
    nheads: int
    seqlen_k: int = 0
    nheads_kv: int = 0

    def __post_init__(self) -> None:
        # Frozen: fill the defaults through object.__setattr__.
        if not self.seqlen_k:
            object.__setattr__(self, "seqlen_k", self.seqlen)
        if not self.nheads_kv:
            object.__setattr__(self, "nheads_kv", self.nheads)

    @classmethod
    def from_shape(cls, shape: Shape, causal: bool, dtype: str) -> BenchConfig:
        """The configuration of a ``--shape``."""
        return cls(dtype, shape.hdim, causal, shape.seqlen_q, shape.batch, shape.nheads,
                   shape.seqlen_k, shape.nheads_kv)

    @property
    def seqlen_q(self) -> int:
        """The query length (``seqlen``)."""
        return self.seqlen

    @property
    def label(self) -> str:
        """Short human-readable description, used in notes and errors."""
        mask = "causal" if self.causal else "non-causal"
        if self.seqlen_k == self.seqlen and self.nheads_kv == self.nheads:
            return (
                f"{self.dtype} hdim={self.hdim} {mask} seqlen={self.seqlen} "
                f"(batch={self.batch}, nheads={self.nheads})"
            )
        return (
            f"{self.dtype} hdim={self.hdim} {mask} seqlen_q={self.seqlen} "
            f"seqlen_k={self.seqlen_k} (batch={self.batch}, nheads={self.nheads}, "
            f"nheads_kv={self.nheads_kv})"
        )

    @property
    def key(self) -> RowKey:
        """The tuple identifying a table row."""
        return (self.dtype, self.hdim, self.causal, self.seqlen, self.seqlen_k, self.batch,
                self.nheads, self.nheads_kv)


@dataclasses.dataclass
class BenchRow:
    """The measured result of one implementation on one configuration.

    ``bwd_tflops`` is ``None`` when the backward pass was not timed (no
    ``--bwd``, or the implementation has no backward); it is then left out
    of the JSON output.  ``seqlen_k`` and ``nheads_kv`` default (0) to
    ``seqlen`` and ``nheads``.
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
    seqlen_k: int = 0
    nheads_kv: int = 0

    def __post_init__(self) -> None:
        self.seqlen_k = self.seqlen_k or self.seqlen
        self.nheads_kv = self.nheads_kv or self.nheads

    @classmethod
    def from_config(
        cls, impl: str, cfg: BenchConfig, fwd_tflops: float, bwd_tflops: float | None = None
    ) -> BenchRow:
        """Build a row for ``impl`` measured on ``cfg``."""
        return cls(impl, **dataclasses.asdict(cfg), fwd_tflops=fwd_tflops, bwd_tflops=bwd_tflops)

    @property
    def key(self) -> RowKey:
        """The tuple identifying a table row (same as :attr:`BenchConfig.key`)."""
        return (self.dtype, self.hdim, self.causal, self.seqlen, self.seqlen_k, self.batch,
                self.nheads, self.nheads_kv)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with the full shape; ``bwd_tflops`` only when it was measured.

        ``seqlen`` (the query length) stays beside ``seqlen_q`` for older readers.
        """
        out: dict[str, Any] = {
            "impl": self.impl, "dtype": self.dtype, "hdim": self.hdim, "causal": self.causal,
            "seqlen": self.seqlen, "batch": self.batch, "nheads": self.nheads,
            "seqlen_q": self.seqlen, "seqlen_k": self.seqlen_k, "nheads_kv": self.nheads_kv,
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


def validate_grid(hdims: Iterable[int], seqlens: Iterable[int]) -> None:
    """Raise ``ValueError`` naming the flag for a bad ``--hdims`` or ``--seqlens`` value.

    Head dims must be positive multiples of 8 up to 256; seqlens must divide
    ``batch*seqlen`` = 16384.
    """
    bad = [x for x in hdims if not check_hdim(x)]
    if bad:
        raise ValueError(
            f"--hdims: head dims must be positive multiples of {HDIM_MULTIPLE} up to "
            f"{MAX_HDIM}, got {bad}"
        )
    bad = [x for x in seqlens if x <= 0 or TOTAL_TOKENS % x]
    if bad:
        raise ValueError(
            f"--seqlens: seqlens must divide batch*seqlen={TOTAL_TOKENS}, got {bad} "
            f"(--shape times any other shape)"
        )


def grid_nheads(hdim: int) -> int:
    """The grid's head count for ``hdim``: ``2048 // hdim`` (exact for divisors of 2048)."""
    return max(1, TOTAL_HIDDEN // hdim)


def build_grid(
    hdims: Sequence[int] = DEFAULT_HDIMS,
    seqlens: Sequence[int] = DEFAULT_SEQLENS,
    causals: Sequence[bool] = (False, True),
    dtype: str = "bf16",
) -> list[BenchConfig]:
    """Enumerate the benchmark configurations.

    ``batch = 16384 // seqlen`` and ``nheads = 2048 // hdim`` (so ``nheads *
    hdim`` is 2048 for the head dims that divide it, e.g. 2016 for 96); order
    is hdim, then causal, then seqlen (the table and plot order).
    """
    validate_grid(hdims, seqlens)
    _check_dtype(dtype)
    return [
        BenchConfig(dtype, hdim, causal, seqlen, TOTAL_TOKENS // seqlen, grid_nheads(hdim))
        for hdim in hdims
        for causal in causals
        for seqlen in seqlens
    ]


def build_shapes(
    shapes: Sequence[Shape], causals: Sequence[bool] = (False, True), dtype: str = "bf16"
) -> list[BenchConfig]:
    """The configurations of ``--shape``: each shape once per causal flag.

    Order is causal, then the shapes as given; repeated shapes are timed once.
    """
    _check_dtype(dtype)
    unique = list(dict.fromkeys(shapes))
    return [BenchConfig.from_shape(shape, causal, dtype) for causal in causals for shape in unique]


def _check_dtype(dtype: str) -> None:
    if dtype not in DTYPE_CHOICES:
        raise ValueError(f"dtype must be one of {DTYPE_CHOICES}, got {dtype!r}")


def causal_pairs(seqlen_q: int, seqlen_k: int) -> int:
    """Number of (query, key) pairs the bottom-right causal mask keeps.

    Query ``i`` sees key ``j`` iff ``j <= i + seqlen_k - seqlen_q``, so row
    ``i`` keeps ``max(0, i + seqlen_k - seqlen_q + 1)`` keys (never more than
    ``seqlen_k``: the last row keeps exactly all of them).
    """
    if seqlen_q <= 0 or seqlen_k <= 0:
        return 0
    first_row = max(0, seqlen_q - seqlen_k)  # the first query with a key to see
    rows = seqlen_q - first_row
    first_count = first_row + seqlen_k - seqlen_q + 1
    return rows * (first_count + seqlen_k) // 2  # arithmetic series up to seqlen_k


def attention_flops(
    batch: int, nheads: int, seqlen_q: int, seqlen_k: int, hdim: int, causal: bool,
    *, backward: bool = False,
) -> float:
    """FLOPs of one attention pass, FlashAttention convention.

    Forward: ``4 * d`` per (query, key) pair and head (two matmuls), over
    ``b * h * s_q * s_k`` pairs.  Causal with ``s_q == s_k`` counts half the
    pairs (the FlashAttention convention that published numbers use); causal
    with ``s_q != s_k`` counts exactly the pairs the bottom-right mask keeps
    (:func:`causal_pairs`).  Backward: 2.5x the forward count.
    """
    if not causal:
        pairs = float(seqlen_q) * seqlen_k
    elif seqlen_q == seqlen_k:
        pairs = float(seqlen_q) * seqlen_k / 2.0
    else:
        pairs = float(causal_pairs(seqlen_q, seqlen_k))
    flops = 4.0 * batch * nheads * pairs * hdim
    if backward:
        flops *= BWD_FLOPS_FACTOR
    return flops


def config_flops(cfg: BenchConfig, *, backward: bool = False) -> float:
    """:func:`attention_flops` for a configuration."""
    return attention_flops(
        cfg.batch, cfg.nheads, cfg.seqlen, cfg.seqlen_k, cfg.hdim, cfg.causal, backward=backward
    )


def tflops_from_ms(flops: float, ms: float) -> float:
    """Convert a FLOP count and a time in milliseconds to TFLOP/s."""
    if ms <= 0 or not math.isfinite(ms):
        raise ValueError(f"time must be positive and finite, got {ms!r} ms")
    return flops / (ms * 1e-3) / 1e12
