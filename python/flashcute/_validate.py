"""Argument checks for the attention forward pass, with messages that name the argument.

The checks run in a fixed order (scalars, then DLPack, rank, dtype, shapes, heads, head dim,
strides and finally device) so that CPU tensors can exercise every check but the last.
"""

from __future__ import annotations

import math
import numbers
import struct
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from ._build_info import BACKEND_NAMES, backend_support, load_extension
from ._dispatch import kernel_head_dim_pair, pairs_text
from ._dropout import check_dropout_p, check_rng_state_info
from ._frameworks import framework_of, is_dlpack

SUPPORTED_DTYPES = ("float16", "bfloat16")
#: Head dims a call may have: a kernel of the smallest compiled head dim at least as large
#: runs it, reading and writing only its columns (16-byte chunks, hence multiples of 8).
SUPPORTED_HEAD_DIMS = tuple(range(8, 257, 8))

_FLOAT32_MAX = 3.4028234663852886e38
_FLOAT32_MIN_NORMAL = 1.1754943508222875e-38
#: The range of softmax_scale: a normal float32 whose product with log2(e) is finite.
SOFTMAX_SCALE_MIN = _FLOAT32_MIN_NORMAL
SOFTMAX_SCALE_MAX = _FLOAT32_MAX / 1.4426950408889634 * (1 - 2.0**-20)
#: A window side at least this long bounds nothing: the kernels take sequence lengths that
#: fit in 32 bits. Longer sides are clipped to it, so that they fit the extension's integers.
WINDOW_SIDE_MAX = 2**31 - 1

# DLPack device types (DLDeviceType).
_KDLCUDA = 2
_KDLCUDA_MANAGED = 13
_CUDA_DEVICE_TYPES = (_KDLCUDA, _KDLCUDA_MANAGED)
_DEVICE_NAMES = {
    0: "meta",
    1: "CPU",
    2: "CUDA",
    3: "CUDA pinned host",
    4: "OpenCL",
    7: "Vulkan",
    8: "Metal",
    9: "VPI",
    10: "ROCm",
    11: "ROCm pinned host",
    12: "ExtDev",
    13: "CUDA managed",
    14: "oneAPI",
    15: "WebGPU",
    16: "Hexagon",
}


@dataclass(frozen=True)
class ForwardProblem:
    """Sizes of a validated forward call; tensors are (batch, seqlen, heads, headdim)."""

    batch: int
    seqlen_q: int
    seqlen_k: int
    nheads: int
    nheads_kv: int
    headdim: int
    dtype: str
    device_id: int
    scale: float
    #: The window as the kernels take it (sides clipped to WINDOW_SIDE_MAX; -1: unbounded).
    window_left: int = -1
    window_right: int = -1
    softcap: float = 0.0  # 0: off
    alibi: bool = False  # ALiBi slopes given (checked against batch and nheads)
    dropout_p: float = 0.0  # 0: off
    headdim_v: int = 0  # v's (and out's) head dim; 0: headdim

    @property
    def dv(self) -> int:
        """v's, out's and dout's head dim."""
        return self.headdim_v or self.headdim

    @property
    def q_shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.seqlen_q, self.nheads, self.headdim)

    @property
    def out_shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.seqlen_q, self.nheads, self.dv)

    @property
    def kv_shape(self) -> tuple[int, int, int, int]:
        """k's shape (and dk's)."""
        return (self.batch, self.seqlen_k, self.nheads_kv, self.headdim)

    @property
    def v_shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.seqlen_k, self.nheads_kv, self.dv)

    @property
    def lse_shape(self) -> tuple[int, int, int]:
        return (self.batch, self.nheads, self.seqlen_q)

    @property
    def empty_output(self) -> bool:
        """The output has no rows: nothing to compute."""
        return self.batch == 0 or self.seqlen_q == 0 or self.nheads == 0


@dataclass(frozen=True)
class _Info:
    name: str
    device_type: int
    device_id: int
    dtype: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]


def _fmt(values: Sequence[int]) -> str:
    return "(" + ", ".join(str(v) for v in values) + ")"


def type_name(x: Any) -> str:
    """``module.Class`` of ``x``, or just ``Class`` for builtins."""
    cls = type(x)
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


def _inspect(name: str, x: Any) -> _Info:
    adapter = framework_of(x)
    described = adapter.describe(x) if adapter is not None else None
    if described is not None:
        return _Info(name, *described)
    if not is_dlpack(x):
        raise TypeError(
            f"{name}: expected a DLPack tensor (torch.Tensor, cupy.ndarray, jax.Array, ...), "
            f"got {type_name(x)}"
        )
    try:
        device_type, device_id, dtype, shape, strides = load_extension().inspect(x)
    except (TypeError, ValueError, RuntimeError, BufferError) as exc:
        raise TypeError(
            f"{name}: could not read {type_name(x)} through DLPack: {exc}"
        ) from exc
    return _Info(name, int(device_type), int(device_id), str(dtype), tuple(shape), tuple(strides))


def check_scalars(
    causal: Any, softmax_scale: Any, backend: Any, window: Any = (-1, -1), softcap: Any = 0.0
) -> None:
    """Type and range checks of the forward's scalar arguments (no tensors touched).

    ``softcap`` is checked on its own here; against the scale (``check_softcap_scale``) once
    the default scale is known."""
    if not isinstance(causal, bool):
        raise TypeError(f"causal: expected a bool, got {type_name(causal)}")
    if backend is not None and backend not in BACKEND_NAMES:
        raise ValueError(f"backend: expected None, 'ampere' or 'hopper', got {backend!r}")
    check_window(window)
    check_softcap(softcap)
    if softmax_scale is None:
        return
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, numbers.Real):
        raise TypeError(
            f"softmax_scale: expected a float or None, got {type_name(softmax_scale)}"
        )
    try:
        value = float(softmax_scale)
    except OverflowError:  # an int beyond float range, e.g. 10**400
        raise ValueError(
            f"softmax_scale: expected a finite positive float, got an integer of "
            f"{int(softmax_scale).bit_length()} bits"
        ) from None
    if not 0.0 < value < math.inf:  # NaN fails too; comparisons trace under torch.compile
        raise ValueError(f"softmax_scale: expected a finite positive float, got {value}")
    # The kernels take the scale as float32 and multiply it by log2(e): both must stay
    # normal, finite float32 numbers.
    if not SOFTMAX_SCALE_MIN <= value <= SOFTMAX_SCALE_MAX:
        raise ValueError(
            f"softmax_scale: expected a finite positive float in float32 range "
            f"[{SOFTMAX_SCALE_MIN:.4g}, {SOFTMAX_SCALE_MAX:.4g}], got {value:g}"
        )


def check_window(window: Any) -> tuple[int, int]:
    """``window=(left, right)`` as two ints, each -1 (unbounded) or >= 0; TypeError or
    ValueError naming ``window`` otherwise (bools and floats are refused)."""
    try:
        left, right = window
    except (TypeError, ValueError):
        raise TypeError(f"window: expected a pair (left, right) of ints, got {window!r}") from None
    for side in (left, right):
        # type() first: isinstance against the numbers ABCs costs a few hundred ns per call.
        if type(side) is not int and (
            isinstance(side, bool) or not isinstance(side, numbers.Integral)
        ):
            raise TypeError(f"window: expected a pair (left, right) of ints, got {window!r}")
        if side < -1:
            raise ValueError(f"window: each side must be -1 (unbounded) or >= 0, got {window!r}")
    return int(left), int(right)


def kernel_window(window: Any) -> tuple[int, int]:
    """``check_window``, with sides clipped to ``WINDOW_SIDE_MAX`` (no sequence is that long,
    so the window is the same): the values the kernels and the custom ops take."""
    left, right = check_window(window)
    return min(left, WINDOW_SIDE_MAX), min(right, WINDOW_SIDE_MAX)


def check_softcap(softcap: Any) -> float:
    """``softcap`` as a float: a finite real >= 0, 0 disabling it (bools are refused);
    TypeError or ValueError naming ``softcap`` otherwise."""
    if type(softcap) is not float and (
        isinstance(softcap, bool) or not isinstance(softcap, numbers.Real)
    ):
        raise TypeError(f"softcap: expected a float, got {type_name(softcap)}")
    try:
        value = float(softcap)
    except OverflowError:  # an int beyond float range
        value = math.inf
    # Comparisons rather than math.isfinite, which torch.compile cannot trace on a float it
    # made symbolic; NaN fails both.
    if not (0.0 <= value < math.inf):
        raise ValueError(f"softcap: expected a finite float >= 0 (0 disables it), got {value}")
    return value


def _float32(x: float) -> float:
    """``x`` rounded to float32 (infinite beyond its range). Rounding a float64 quotient of
    two float32 numbers gives the float32 quotient, so this reproduces float32 division."""
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def check_softcap_scale(softcap: float, scale: float) -> None:
    """ValueError naming ``softcap`` where a nonzero cap does not work with this scale.

    The kernels take ``softcap / scale`` and ``scale / softcap`` as float32: the first must
    be finite, the second a normal number (so the cap is within about 2^126 of the scale),
    and the cap itself must not round to 0 in float32 (which would switch it off)."""
    if softcap == 0.0:
        return
    cap, scale32 = _float32(softcap), _float32(scale)
    if not (
        0.0 < cap < math.inf
        and math.isfinite(_float32(cap / scale32))
        and _float32(scale32 / cap) >= _FLOAT32_MIN_NORMAL
    ):
        raise ValueError(
            f"softcap: {softcap:g} does not work with softmax_scale {scale:g}: softcap / "
            f"softmax_scale must be finite and softmax_scale / softcap at least "
            f"{_FLOAT32_MIN_NORMAL:.8g} in float32"
        )


def _check_alibi_slopes(info: _Info, batch: int, nheads: int) -> None:
    """FlashAttention's ``alibi_slopes``: float32 of shape (nheads,) or (batch, nheads), unit
    stride over heads; TypeError or ValueError naming ``alibi_slopes`` otherwise."""
    if info.dtype != "float32":
        raise TypeError(f"alibi_slopes: expected float32, got {info.dtype}")
    if info.shape not in ((nheads,), (batch, nheads)):
        raise ValueError(
            f"alibi_slopes: expected shape (nheads,) = ({nheads},) or (batch, nheads) = "
            f"({batch}, {nheads}), got {_fmt(info.shape)}"
        )
    if nheads > 1 and info.strides[-1] != 1:
        raise ValueError(
            f"alibi_slopes: expected unit stride over heads (the last dimension), got strides "
            f"{_fmt(info.strides)}"
        )
    if len(info.shape) == 2 and batch > 1 and nheads > 0 and info.strides[0] < 0:
        raise ValueError(
            f"alibi_slopes: expected a non-negative batch stride, got strides {_fmt(info.strides)}"
        )


def check_deterministic(deterministic: Any) -> None:
    """Type check of the ``deterministic`` flag."""
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic: expected a bool, got {type_name(deterministic)}")


def _check_rank(info: _Info) -> None:
    if len(info.shape) != 4:
        raise ValueError(
            f"{info.name}: expected a 4-d tensor (batch, seqlen, nheads, headdim), "
            f"got shape {_fmt(info.shape)}"
        )


def _check_dtypes(q: _Info, others: Sequence[_Info]) -> None:
    for info in (q, *others):
        if info.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{info.name}: expected float16 or bfloat16, got {info.dtype}")
    for info in others:
        if info.dtype != q.dtype:
            raise TypeError(
                f"{info.name}: dtype {info.dtype} does not match q's dtype {q.dtype}"
            )


def _check_kv(q: _Info, k: _Info, v: _Info) -> None:
    """k's head dim (last axis) against q's, v's shape against k's but for the head dim (which
    ``_check_headdim_v`` checks), and q's heads (second to last axis) a multiple of k's: the
    shape checks fixed-length and packed calls share."""
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(
            f"k: head dim {k.shape[-1]} does not match q's {q.shape[-1]} "
            f"(q shape {_fmt(q.shape)}, k shape {_fmt(k.shape)})"
        )
    if v.shape[:-1] != k.shape[:-1]:
        raise ValueError(
            f"v: shape {_fmt(v.shape)} does not match k's shape {_fmt(k.shape)} "
            f"(only the head dim may differ)"
        )
    nheads, nheads_kv = q.shape[-2], k.shape[-2]
    if (nheads_kv == 0 and nheads != 0) or (nheads_kv != 0 and nheads % nheads_kv != 0):
        raise ValueError(
            f"q, k: q's {nheads} heads are not a multiple of k/v's {nheads_kv} heads "
            f"(grouped-query attention needs nheads % nheads_kv == 0)"
        )


def out_shape_of(q: _Info, v: _Info) -> tuple[int, ...]:
    """out's shape: q's, with v's head dim."""
    return (*q.shape[:-1], v.shape[-1])


def _check_shapes(q: _Info, k: _Info, v: _Info, out: Optional[_Info]) -> None:
    if k.shape[0] != q.shape[0]:
        raise ValueError(
            f"k: batch size {k.shape[0]} does not match q's {q.shape[0]} "
            f"(q shape {_fmt(q.shape)}, k shape {_fmt(k.shape)})"
        )
    _check_kv(q, k, v)
    if out is not None and out.shape != out_shape_of(q, v):
        raise ValueError(
            f"out: expected shape {_fmt(out_shape_of(q, v))} (batch, seqlen_q, nheads, "
            f"v's headdim), got {_fmt(out.shape)}"
        )


def _compiled_head_dims() -> str:
    try:
        parts = []
        for backend in BACKEND_NAMES:
            dims = backend_support(backend)[0]
            parts.append(f"{backend} {', '.join(map(str, dims)) if dims else 'none'}")
        return "; this build compiles head dims: " + "; ".join(parts)
    except Exception:  # build info is a courtesy in this message, never the error itself
        return ""


def _check_headdim(headdim: int) -> None:
    """Any multiple of 8 from 8 to 256. Whether a path of this build has a kernel that large
    (the smallest compiled head dim at least as large runs it) is the library's dispatch
    question (``_dispatch``, cpp/dispatch_policy.h), as for every other build-dependent
    choice."""
    if headdim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(
            f"q: head dim {headdim} is not supported; supported head dims are the multiples "
            f"of 8 from 8 to 256, each run by the smallest compiled head dim at least as "
            f"large{_compiled_head_dims()}"
        )


def _check_headdim_v(headdim: int, headdim_v: int, backward: bool = False) -> None:
    """v's head dim: q's, or one that a compiled Hopper-path kernel runs (forward: a head dim
    pair at least as large in both; backward: a smaller one, on a kernel at least as large as
    q's). Which backend runs the call is the dispatch's question."""
    if headdim_v == headdim:
        return
    pass_name = "backward" if backward else "forward"
    if backward and headdim_v > headdim:
        # The backward's workspace follows q's head dim; a wider v is not run.
        raise ValueError(
            f"v: head dim {headdim_v} is larger than q's and k's {headdim}; the backward runs a "
            f"v head dim that differs from q's only where it is smaller"
        )
    if headdim_v not in SUPPORTED_HEAD_DIMS:
        raise ValueError(
            f"v: head dim {headdim_v} is not supported; supported head dims are the multiples "
            f"of 8 from 8 to 256"
        )
    if kernel_head_dim_pair("hopper", headdim, headdim_v, backward) is None:
        raise ValueError(
            f"v: head dim {headdim_v} differs from q's and k's {headdim}, and this build has no "
            f"{pass_name} kernel for such a call (Hopper path, compiled: {pairs_text(backward)}); "
            f"other calls need v's head dim equal to q's"
        )


def _check_strides(info: _Info) -> None:
    """Unit stride in the last (headdim) dimension, positive strides in the others of size > 1
    (any rank: fixed-length and packed tensors alike)."""
    if info.strides[-1] != 1:
        raise ValueError(
            f"{info.name}: expected unit stride in the last (headdim) dimension, "
            f"got strides {_fmt(info.strides)}"
        )
    if 0 in info.shape:
        return
    for size, stride in zip(info.shape, info.strides):
        if size > 1 and stride <= 0:
            raise ValueError(
                f"{info.name}: expected positive strides in every dimension of size > 1, "
                f"got strides {_fmt(info.strides)} for shape {_fmt(info.shape)}"
            )


def _device_name(device_type: int) -> str:
    return _DEVICE_NAMES.get(device_type, f"DLPack device type {device_type}")


def _check_devices(q: _Info, others: Sequence[_Info]) -> None:
    for info in (q, *others):
        if info.device_type not in _CUDA_DEVICE_TYPES:
            device = _device_name(info.device_type)
            raise ValueError(f"{info.name}: expected a CUDA tensor, got a {device} tensor")
    for info in others:
        if info.device_id != q.device_id:
            raise ValueError(
                f"{info.name}: on CUDA device {info.device_id}, but q is on CUDA device "
                f"{q.device_id}; all tensors must be on one device"
            )


def validate_forward(
    q: Any,
    k: Any,
    v: Any,
    out: Any = None,
    *,
    causal: Any = False,
    softmax_scale: Any = None,
    backend: Any = None,
    window: Any = (-1, -1),
    softcap: Any = 0.0,
    alibi_slopes: Any = None,
    dropout_p: Any = 0.0,
    dropout_rng_state: Any = None,
) -> ForwardProblem:
    """Check the arguments of an attention forward call and describe the problem.

    Args:
        q: (batch, seqlen_q, nheads, headdim) DLPack tensor, float16 or bfloat16.
        k, v: (batch, seqlen_k, nheads_kv, headdim), q's dtype; nheads % nheads_kv == 0. v's
            head dim (headdim_v) may differ where a head dim pair kernel runs it (Hopper path).
        out: optional (batch, seqlen_q, nheads, headdim_v) tensor of q's dtype to write into.
        causal: bool.
        softmax_scale: finite positive float, or None for 1/sqrt(headdim).
        backend: None, "ampere" or "hopper" (only the name is checked here).
        window: (left, right), ints >= -1 (-1: unbounded).
        softcap: finite float >= 0 (0: off) that works with the scale in float32.
        alibi_slopes: None, or a float32 (nheads,) or (batch, nheads) DLPack tensor with unit
            stride over heads, on q's device.
        dropout_p: float in [0, 1) (0: off).
        dropout_rng_state: None, or a contiguous int64 (2,) DLPack tensor on q's device.

    Every tensor needs unit stride in the headdim dimension, positive strides elsewhere and
    must live on one CUDA device. Zero batch, sequence length or head count is valid.

    Returns:
        The ForwardProblem, with ``scale`` resolved and the window sides clipped to
        ``WINDOW_SIDE_MAX``.

    Raises:
        TypeError: a non-DLPack argument, wrong dtypes, a non-bool causal, a window or
            softcap of the wrong type.
        ValueError: wrong ranks, shapes, strides, devices, head dim, scale, window, softcap,
            ALiBi slopes, dropout_p, dropout_rng_state or backend name.
        ImportError: the compiled extension is missing.
    """
    problem, infos = forward_problem(
        q, k, v, out, causal=causal, softmax_scale=softmax_scale, backend=backend,
        window=window, softcap=softcap, alibi_slopes=alibi_slopes, dropout_p=dropout_p,
        dropout_rng_state=dropout_rng_state,
    )
    _check_devices(infos[0], infos[1:])
    return problem


def _resolve_scalars(
    headdim: int, softmax_scale: Any, softcap: Any, window: Any
) -> tuple[float, float, int, int]:
    """(scale, softcap, window_left, window_right) as the kernels take them: the scale given
    or 1/sqrt(headdim), a softcap that works with it, the window's sides clipped."""
    scale = 1.0 / math.sqrt(headdim) if softmax_scale is None else float(softmax_scale)
    cap = check_softcap(softcap)
    check_softcap_scale(cap, scale)
    window_left, window_right = kernel_window(window)
    return scale, cap, window_left, window_right


def _alibi_infos(
    alibi_slopes: Any, batch: int, nheads: int, inspect: Callable[[str, Any], _Info] = _inspect
) -> list[_Info]:
    """The ALiBi slopes' info checked against batch and nheads, in a list (empty without
    slopes) to append to the infos of the device check; ``inspect`` is the caller's, so the
    slopes are described like its other tensors."""
    if alibi_slopes is None:
        return []
    info = inspect("alibi_slopes", alibi_slopes)
    _check_alibi_slopes(info, batch, nheads)
    return [info]


def rng_state_infos(
    dropout_rng_state: Any, inspect: Callable[[str, Any], _Info] = _inspect
) -> list[_Info]:
    """The dropout rng state's info, checked (int64, (2,), contiguous), in a list (empty
    without one) to append to the infos of the device check, as ``_alibi_infos``."""
    if dropout_rng_state is None:
        return []
    info = inspect("dropout_rng_state", dropout_rng_state)
    check_rng_state_info(info)
    return [info]


def forward_problem(
    q: Any, k: Any, v: Any, out: Any = None, *, causal: Any, softmax_scale: Any, backend: Any,
    window: Any = (-1, -1), softcap: Any = 0.0, alibi_slopes: Any = None, dropout_p: Any = 0.0,
    dropout_rng_state: Any = None, backward: bool = False,
    check_dtypes: Optional[Callable[[_Info, list[_Info]], None]] = None,
) -> tuple[ForwardProblem, list[_Info]]:
    """``validate_forward`` without its last check (devices): the problem and the tensors'
    infos, q's first (the slopes' and the dropout rng state's last), for callers that add
    tensors of their own before checking devices. ``backward``: a v head dim of its own
    needs a backward kernel. ``check_dtypes(q, others)``: the dtype check (default: float16
    or bfloat16, all alike; FP8 calls pass their own)."""
    check_scalars(causal, softmax_scale, backend, window, softcap)
    dropout = check_dropout_p(dropout_p)
    tensors = {"q": q, "k": k, "v": v}
    if out is not None:
        tensors["out"] = out
    infos = {name: _inspect(name, x) for name, x in tensors.items()}
    for info in infos.values():
        _check_rank(info)
    qi, ki, vi, oi = infos["q"], infos["k"], infos["v"], infos.get("out")
    others = [info for name, info in infos.items() if name != "q"]
    (check_dtypes or _check_dtypes)(qi, others)
    _check_shapes(qi, ki, vi, oi)
    batch, seqlen_q, nheads, headdim = qi.shape
    _check_headdim(headdim)
    _check_headdim_v(headdim, vi.shape[-1], backward)
    for info in infos.values():
        _check_strides(info)
    scale, cap, window_left, window_right = _resolve_scalars(headdim, softmax_scale, softcap, window)
    slopes = _alibi_infos(alibi_slopes, batch, nheads) + rng_state_infos(dropout_rng_state)
    problem = ForwardProblem(
        batch=batch,
        seqlen_q=seqlen_q,
        seqlen_k=ki.shape[1],
        nheads=nheads,
        nheads_kv=ki.shape[2],
        headdim=headdim,
        dtype=qi.dtype,
        device_id=qi.device_id,
        scale=scale,
        window_left=window_left,
        window_right=window_right,
        softcap=cap,
        alibi=alibi_slopes is not None,
        dropout_p=dropout,
        headdim_v=vi.shape[-1],
    )
    return problem, [qi, *others, *slopes]
