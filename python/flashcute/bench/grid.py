"""Benchmark problems: constants, errors, the grid, ``--shape`` shapes, masks, records and FLOPs.

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

#: ``window=(left, right)`` with both sides unbounded: no sliding window.
NO_WINDOW: tuple[int, int] = (-1, -1)
#: The dropout seed and offset of every ``--dropout`` call: the mask is known (``--check``)
#: and no call draws from torch's generator, so the kernels alone are timed.
DROPOUT_SEED: tuple[int, int] = (0, 0)

#: (dtype, hdim, causal, seqlen_q, seqlen_k, batch, nheads, nheads_kv, window, softcap,
#: alibi): one table line.
RowKey = tuple[str, int, bool, int, int, int, int, int, tuple[int, int], float, bool, float]


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


#: How ``--window`` spells a window, for messages.
WINDOW_FORMAT: str = "L,R"


def check_window(window: Sequence[int]) -> tuple[int, int]:
    """``window`` as ``(left, right)``: two ints, each -1 (unbounded) or >= 0; ValueError else."""
    try:
        left, right = window
    except (TypeError, ValueError):
        raise ValueError(f"window: expected (left, right), got {window!r}") from None
    if any(isinstance(side, bool) or not isinstance(side, int) or side < -1
           for side in (left, right)):
        raise ValueError(
            f"window: each side must be an int, -1 (unbounded) or >= 0, got {window!r}"
        )
    return left, right


def parse_window(text: str) -> tuple[int, int]:
    """Parse ``L,R`` (``--window``) into ``(left, right)``; ``ValueError`` says what is wrong."""
    tokens = [tok.strip() for tok in text.split(",")]
    try:
        values = tuple(int(tok) for tok in tokens)
    except ValueError:
        values = ()
    if len(values) != 2 or any(side < -1 for side in values):
        raise ValueError(
            f"expected {WINDOW_FORMAT} (two integers, each -1 for unbounded or >= 0: keys "
            f"left and right of the diagonal), got {text!r}"
        )
    return values[0], values[1]


def check_softcap(softcap: float) -> float:
    """``softcap`` as a float: finite and >= 0 (0 is off); ValueError otherwise."""
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
        raise ValueError(f"softcap: expected a float, got {softcap!r}")
    value = float(softcap)
    if not (math.isfinite(value) and value >= 0.0):
        raise ValueError(f"softcap: expected a finite float >= 0 (0 is off), got {softcap!r}")
    return value


def check_dropout(dropout: float) -> float:
    """``dropout`` as a float in [0, 1) (0 is off); ValueError otherwise."""
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)):
        raise ValueError(f"dropout: expected a float, got {dropout!r}")
    value = float(dropout)
    if not 0.0 <= value < 1.0:
        raise ValueError(f"dropout: expected a float in [0, 1) (0 is off), got {dropout!r}")
    return value


def parse_dropout(text: str) -> float:
    """Parse ``--dropout``: a float in [0, 1); ``ValueError`` says what is wrong."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"expected a float, got {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise ValueError(f"expected a float in [0, 1) (0 is off), got {text!r}")
    return value


def parse_softcap(text: str) -> float:
    """Parse ``--softcap``: a finite float >= 0; ``ValueError`` says what is wrong."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"expected a float, got {text!r}") from None
    if not (math.isfinite(value) and value >= 0.0):
        raise ValueError(f"expected a finite float >= 0 (0 is off), got {text!r}")
    return value


def feature_name(
    window: Sequence[int] = NO_WINDOW, softcap: float = 0.0, alibi: bool = False,
    dropout: float = 0.0,
) -> str:
    """The ``feature`` of a problem, as results record it.

    ``"dense"`` without window, softcap, ALiBi and dropout; otherwise the features set,
    joined by ``+`` in the order ``window`` (a window other than ``(-1, -1)``),
    ``softcap`` (``softcap > 0``), ``alibi``, ``dropout`` (``dropout > 0``):
    ``"window+softcap"``, ``"alibi"``, ``"dropout"``, ...  A causal mask alone is
    ``"dense"``.
    """
    parts = [name for name, on in (("window", tuple(window) != NO_WINDOW),
                                   ("softcap", softcap > 0.0), ("alibi", alibi),
                                   ("dropout", dropout > 0.0)) if on]
    return "+".join(parts) or "dense"


def feature_label(
    window: Sequence[int] = NO_WINDOW, softcap: float = 0.0, alibi: bool = False,
    dropout: float = 0.0,
) -> str:
    """The feature with its values, for tables and notes: ``window=4096,0+softcap=30``,
    ``alibi`` (its slopes are always :func:`alibi_slopes`), ``dropout=0.1``."""
    parts = []
    if tuple(window) != NO_WINDOW:
        parts.append(f"window={window[0]},{window[1]}")
    if softcap > 0.0:
        parts.append(f"softcap={softcap:g}")
    if alibi:
        parts.append("alibi")
    if dropout > 0.0:
        parts.append(f"dropout={dropout:g}")
    return "+".join(parts) or "dense"


def alibi_slopes(nheads: int) -> list[float]:
    """The ALiBi slopes ``--alibi`` times: ``2^(-8 (h + 1) / nheads)`` for head ``h``, the
    geometric sequence of the ALiBi paper (exact for a power-of-two head count)."""
    return [2.0 ** (-8.0 * (h + 1) / nheads) for h in range(nheads)]


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """One problem timed for every implementation.

    ``seqlen`` is the query length; ``seqlen_k`` and ``nheads_kv`` default (0)
    to ``seqlen`` and ``nheads``, as on the grid.  ``window`` and ``softcap``
    are passed to flashcute as given (``(-1, -1)`` and 0: off); ``alibi`` gives
    it the slopes of :func:`alibi_slopes`; ``dropout`` is its ``dropout_p`` (0: off),
    with a fixed seed and offset (:data:`DROPOUT_SEED`).
    """

    dtype: str
    hdim: int
    causal: bool
    seqlen: int
    batch: int
    nheads: int
    seqlen_k: int = 0
    nheads_kv: int = 0
    window: tuple[int, int] = NO_WINDOW
    softcap: float = 0.0
    alibi: bool = False
    dropout: float = 0.0

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
    def feature(self) -> str:
        """:func:`feature_name` of this problem (``dense``, ``window``, ...)."""
        return feature_name(self.window, self.softcap, self.alibi, self.dropout)

    def dense(self) -> BenchConfig:
        """The same problem without window, softcap, ALiBi and dropout (the causal flag
        stays)."""
        return dataclasses.replace(self, window=NO_WINDOW, softcap=0.0, alibi=False, dropout=0.0)

    @property
    def label(self) -> str:
        """Short human-readable description, used in notes and errors."""
        mask = "causal" if self.causal else "non-causal"
        if self.feature != "dense":
            mask += f" {feature_label(self.window, self.softcap, self.alibi, self.dropout)}"
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
                self.nheads, self.nheads_kv, tuple(self.window), self.softcap, self.alibi,
                self.dropout)


@dataclasses.dataclass
class BenchRow:
    """The measured result of one implementation on one configuration.

    ``bwd_tflops`` is ``None`` when the backward pass was not timed (no
    ``--bwd``, or the implementation has no backward); it is then left out
    of the JSON output.  ``seqlen_k`` and ``nheads_kv`` default (0) to
    ``seqlen`` and ``nheads``; ``window``, ``softcap``, ``alibi`` and ``dropout`` to off.
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
    window: tuple[int, int] = NO_WINDOW
    softcap: float = 0.0
    alibi: bool = False
    dropout: float = 0.0

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
                self.nheads, self.nheads_kv, tuple(self.window), self.softcap, self.alibi,
                self.dropout)

    @property
    def feature(self) -> str:
        """:func:`feature_name` of the measured problem."""
        return feature_name(self.window, self.softcap, self.alibi, self.dropout)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with the full shape and the ``feature``; ``bwd_tflops`` only when
        it was measured, ``window`` ([left, right]), ``softcap``, ``alibi`` (true) and
        ``dropout`` only when set.

        ``seqlen`` (the query length) stays beside ``seqlen_q`` for older readers.
        """
        out: dict[str, Any] = {
            "impl": self.impl, "dtype": self.dtype, "hdim": self.hdim, "causal": self.causal,
            "seqlen": self.seqlen, "batch": self.batch, "nheads": self.nheads,
            "seqlen_q": self.seqlen, "seqlen_k": self.seqlen_k, "nheads_kv": self.nheads_kv,
            "fwd_tflops": self.fwd_tflops, "feature": self.feature,
        }
        if tuple(self.window) != NO_WINDOW:
            out["window"] = list(self.window)
        if self.softcap > 0.0:
            out["softcap"] = self.softcap
        if self.alibi:
            out["alibi"] = True
        if self.dropout > 0.0:
            out["dropout"] = self.dropout
        if self.bwd_tflops is not None:
            out["bwd_tflops"] = self.bwd_tflops
        return out


def dense_key(key: RowKey) -> RowKey:
    """The key of the same problem without window, softcap, ALiBi and dropout."""
    return (*key[:8], NO_WINDOW, 0.0, False, 0.0)  # type: ignore[return-value]


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


def with_feature(
    configs: Sequence[BenchConfig], window: Sequence[int] = NO_WINDOW, softcap: float = 0.0,
    *, alibi: bool = False, dropout: float = 0.0, with_dense: bool = False,
) -> list[BenchConfig]:
    """``configs`` with ``window``, ``softcap``, ``alibi`` and ``dropout`` set; with
    ``with_dense``, each one's dense problem comes right before it (so that both are timed
    close together).

    ``with_dense`` without a window, softcap, ALiBi or dropout changes nothing.
    """
    window = check_window(tuple(window))
    softcap = check_softcap(softcap)
    dropout = check_dropout(dropout)
    if not isinstance(alibi, bool):
        raise ValueError(f"alibi: expected a bool, got {alibi!r}")
    out: list[BenchConfig] = []
    for cfg in configs:
        featured = dataclasses.replace(cfg, window=window, softcap=softcap, alibi=alibi,
                                       dropout=dropout)
        if with_dense and featured.feature != "dense":
            out.append(cfg.dense())
        out.append(featured)
    return out


def _check_dtype(dtype: str) -> None:
    if dtype not in DTYPE_CHOICES:
        raise ValueError(f"dtype must be one of {DTYPE_CHOICES}, got {dtype!r}")


def _clamped_prefix(stop: int, cap: int) -> int:
    """``sum(min(max(x, 0), cap) for x < stop)`` over all integers ``x < stop``."""
    if stop <= 0:
        return 0
    if stop <= cap + 1:
        return stop * (stop - 1) // 2
    return cap * (cap + 1) // 2 + (stop - cap - 1) * cap


def visible_pairs(
    seqlen_q: int, seqlen_k: int, *, causal: bool = False, window: Sequence[int] = NO_WINDOW,
) -> int:
    """Number of (query, key) pairs that the bottom-right aligned mask keeps.

    With ``o = seqlen_k - seqlen_q``, query ``i`` sees key ``j`` (``0 <= j <
    seqlen_k``) iff ``i + o - left <= j <= i + o + right`` for ``window=(left,
    right)``, a side of -1 being unbounded and ``causal`` setting ``right = 0``.
    Row ``i`` thus keeps ``clamp(i + o + right + 1) - clamp(i + o - left)`` keys,
    ``clamp`` limiting to ``[0, seqlen_k]``; summed over the rows in closed form.
    """
    if seqlen_q <= 0 or seqlen_k <= 0:
        return 0
    left, right = check_window(tuple(window))
    if causal:
        right = 0
    offset = seqlen_k - seqlen_q

    def clamped_rows(start: int) -> int:  # sum of clamp(start + i) over the rows i
        return (_clamped_prefix(start + seqlen_q, seqlen_k)
                - _clamped_prefix(start, seqlen_k))

    upper = seqlen_q * seqlen_k if right < 0 else clamped_rows(offset + right + 1)
    lower = 0 if left < 0 else clamped_rows(offset - left)
    return upper - lower


def causal_pairs(seqlen_q: int, seqlen_k: int) -> int:
    """Number of (query, key) pairs the bottom-right causal mask keeps.

    Query ``i`` sees key ``j`` iff ``j <= i + seqlen_k - seqlen_q``, so row
    ``i`` keeps ``max(0, i + seqlen_k - seqlen_q + 1)`` keys (never more than
    ``seqlen_k``: the last row keeps exactly all of them); :func:`visible_pairs`
    without a window.
    """
    return visible_pairs(seqlen_q, seqlen_k, causal=True)


def attention_flops(
    batch: int, nheads: int, seqlen_q: int, seqlen_k: int, hdim: int, causal: bool,
    *, backward: bool = False, window: Sequence[int] = NO_WINDOW,
) -> float:
    """FLOPs of one attention pass, FlashAttention convention.

    Forward: ``4 * d`` per (query, key) pair and head (two matmuls), over
    ``b * h * s_q * s_k`` pairs.  Causal with ``s_q == s_k`` and no window
    counts half the pairs (the FlashAttention convention that published
    numbers use); every other mask (causal with ``s_q != s_k``, a sliding
    window, with or without causal) counts exactly the pairs it keeps
    (:func:`visible_pairs`).  Softcap and ALiBi add nothing to the count.
    Backward: 2.5x the forward count.
    """
    unbounded = tuple(window) == NO_WINDOW
    if not causal and unbounded:
        pairs = float(seqlen_q) * seqlen_k
    elif causal and unbounded and seqlen_q == seqlen_k:
        pairs = float(seqlen_q) * seqlen_k / 2.0
    else:
        pairs = float(visible_pairs(seqlen_q, seqlen_k, causal=causal, window=window))
    flops = 4.0 * batch * nheads * pairs * hdim
    if backward:
        flops *= BWD_FLOPS_FACTOR
    return flops


def config_flops(cfg: BenchConfig, *, backward: bool = False) -> float:
    """:func:`attention_flops` for a configuration."""
    return attention_flops(
        cfg.batch, cfg.nheads, cfg.seqlen, cfg.seqlen_k, cfg.hdim, cfg.causal, backward=backward,
        window=cfg.window,
    )


def tflops_from_ms(flops: float, ms: float) -> float:
    """Convert a FLOP count and a time in milliseconds to TFLOP/s."""
    if ms <= 0 or not math.isfinite(ms):
        raise ValueError(f"time must be positive and finite, got {ms!r} ms")
    return flops / (ms * 1e-3) / 1e12
