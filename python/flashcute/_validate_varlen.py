"""Argument checks of variable-length (packed) attention calls, with messages that name the
argument: q, k, v and out are packed ``(total, heads, headdim)`` tensors whose sequences the
int32 offsets ``cu_seqlens_q`` / ``cu_seqlens_k`` delimit.

The offsets' values live on the device and are not read here (that would wait for the GPU):
the kernels clamp them so that no value makes them touch memory outside the tensors. Only
their dtype, rank, length and device are checked, in the same order as the fixed-length
checks (scalars, then tensors, devices last).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any, Callable, Optional

from ._dropout import check_dropout_p
from ._validate import (
    _alibi_infos,
    _check_devices,
    _check_dtypes,
    _check_headdim,
    _check_headdim_v,
    _check_kv,
    _check_strides,
    _fmt,
    _Info,
    _inspect,
    _resolve_scalars,
    check_scalars,
    out_shape_of,
    rng_state_infos,
    type_name,
)
from ._validate_backward import check_backward_flags, check_gradient, gradient_infos

#: Sequences are at most this long: the kernels index rows with 32-bit integers. A longer
#: max_seqlen is the same call (no sequence can be longer than its packed tensor).
MAX_SEQLEN = 2**31 - 1


@dataclass(frozen=True)
class VarlenProblem:
    """Sizes of a validated variable-length call; tensors are packed (total, heads, headdim)."""

    batch: int
    total_q: int
    total_k: int
    #: The longest sequences' lengths as the kernels take them (at most total_q / total_k).
    max_seqlen_q: int
    max_seqlen_k: int
    nheads: int
    nheads_kv: int
    headdim: int
    dtype: str
    device_id: int
    scale: float
    window_left: int = -1
    window_right: int = -1
    softcap: float = 0.0
    seqused_k: bool = False
    alibi: bool = False  # ALiBi slopes given (checked against batch and nheads)
    dropout_p: float = 0.0  # 0: off
    headdim_v: int = 0  # v's (and out's) head dim; 0: headdim

    @property
    def dv(self) -> int:
        """v's, out's and dout's head dim."""
        return self.headdim_v or self.headdim

    @property
    def q_shape(self) -> tuple[int, int, int]:
        return (self.total_q, self.nheads, self.headdim)

    @property
    def out_shape(self) -> tuple[int, int, int]:
        return (self.total_q, self.nheads, self.dv)

    @property
    def kv_shape(self) -> tuple[int, int, int]:
        """k's shape (and dk's)."""
        return (self.total_k, self.nheads_kv, self.headdim)

    @property
    def v_shape(self) -> tuple[int, int, int]:
        return (self.total_k, self.nheads_kv, self.dv)

    @property
    def lse_shape(self) -> tuple[int, int]:
        return (self.nheads, self.total_q)

    @property
    def empty_output(self) -> bool:
        """No query row can be written: nothing to compute."""
        return self.max_seqlen_q == 0 or self.nheads == 0


def check_max_seqlen(name: str, value: Any) -> int:
    """A max_seqlen argument as an int >= 0 (bools and floats are refused)."""
    if type(value) is not int and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
        raise TypeError(f"{name}: expected an int, got {type_name(value)}")
    if value < 0:
        raise ValueError(f"{name}: expected the longest sequence's length (>= 0), got {value}")
    return int(value)


def check_varlen_scalars(
    max_seqlen_q: Any, max_seqlen_k: Any, causal: Any, softmax_scale: Any, backend: Any,
    window: Any = (-1, -1), softcap: Any = 0.0,
) -> tuple[int, int]:
    """The scalar arguments of a variable-length call; returns the two max_seqlen as ints."""
    check_scalars(causal, softmax_scale, backend, window, softcap)
    return check_max_seqlen("max_seqlen_q", max_seqlen_q), check_max_seqlen("max_seqlen_k", max_seqlen_k)


def _check_packed(info: _Info) -> None:
    """A packed (total, heads, headdim) tensor: rank, unit headdim stride, positive strides."""
    if len(info.shape) != 3:
        raise ValueError(
            f"{info.name}: expected a 3-d packed tensor (total, nheads, headdim), got shape "
            f"{_fmt(info.shape)}"
        )
    _check_strides(info)


def _check_int32_vector(info: _Info) -> None:
    if info.dtype != "int32":
        raise TypeError(f"{info.name}: expected an int32 tensor, got {info.dtype}")
    if len(info.shape) != 1:
        raise ValueError(f"{info.name}: expected a 1-d tensor, got shape {_fmt(info.shape)}")
    if info.shape[0] > 1 and info.strides[0] != 1:
        raise ValueError(f"{info.name}: expected a contiguous tensor, got stride {info.strides[0]}")


def _check_offsets(cu_q: _Info, cu_k: _Info, seqused_k: Optional[_Info]) -> int:
    """The offsets' and seqused_k's dtype, rank and lengths; returns the batch size."""
    for info in (cu_q, cu_k):
        _check_int32_vector(info)
        if info.shape[0] < 2:
            raise ValueError(
                f"{info.name}: expected batch + 1 >= 2 offsets (the first row of each sequence, "
                f"then the end of the last), got {info.shape[0]}"
            )
    if cu_k.shape[0] != cu_q.shape[0]:
        raise ValueError(
            f"cu_seqlens_k: {cu_k.shape[0]} offsets, but cu_seqlens_q has {cu_q.shape[0]}; "
            f"both give batch + 1 offsets"
        )
    batch = cu_q.shape[0] - 1
    if seqused_k is not None:
        _check_int32_vector(seqused_k)
        if seqused_k.shape[0] != batch:
            raise ValueError(
                f"seqused_k: expected shape ({batch},), one entry per sequence, got "
                f"{_fmt(seqused_k.shape)}"
            )
    return batch


def _check_shapes(q: _Info, k: _Info, v: _Info, out: Optional[_Info]) -> None:
    _check_kv(q, k, v)
    if out is not None and out.shape != out_shape_of(q, v):
        raise ValueError(
            f"out: expected shape {_fmt(out_shape_of(q, v))} (total_q, nheads, v's headdim), "
            f"got {_fmt(out.shape)}"
        )


def varlen_problem(
    q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, max_seqlen_q: Any,
    max_seqlen_k: Any, out: Any = None, *, seqused_k: Any = None, causal: Any = False,
    softmax_scale: Any = None, backend: Any = None, window: Any = (-1, -1), softcap: Any = 0.0,
    alibi_slopes: Any = None, dropout_p: Any = 0.0, dropout_rng_state: Any = None,
    backward: bool = False, check_dtypes: Optional[Callable[[_Info, list[_Info]], None]] = None,
) -> tuple[VarlenProblem, list[_Info]]:
    """``validate_varlen`` without its last check (devices): the problem and the tensors'
    infos, q's first, for callers that add tensors before checking devices. ``backward``: a v
    head dim of its own needs a backward kernel. ``check_dtypes(q, others)``: the dtype check
    (default: float16 or bfloat16, all alike; FP8 calls pass their own)."""
    max_q, max_k = check_varlen_scalars(
        max_seqlen_q, max_seqlen_k, causal, softmax_scale, backend, window, softcap
    )
    dropout = check_dropout_p(dropout_p)
    tensors = {"q": q, "k": k, "v": v}
    if out is not None:
        tensors["out"] = out
    infos = {name: _inspect(name, x) for name, x in tensors.items()}
    for info in infos.values():
        _check_packed(info)
    qi, ki, vi, oi = infos["q"], infos["k"], infos["v"], infos.get("out")
    others = [info for name, info in infos.items() if name != "q"]
    (check_dtypes or _check_dtypes)(qi, others)
    _check_shapes(qi, ki, vi, oi)
    total_q, nheads, headdim = qi.shape
    _check_headdim(headdim)
    _check_headdim_v(headdim, vi.shape[-1], backward)
    vectors = [_inspect("cu_seqlens_q", cu_seqlens_q), _inspect("cu_seqlens_k", cu_seqlens_k)]
    if seqused_k is not None:
        vectors.append(_inspect("seqused_k", seqused_k))
    batch = _check_offsets(vectors[0], vectors[1], vectors[2] if seqused_k is not None else None)
    scale, cap, window_left, window_right = _resolve_scalars(headdim, softmax_scale, softcap, window)
    vectors += _alibi_infos(alibi_slopes, batch, nheads, _inspect)
    vectors += rng_state_infos(dropout_rng_state, _inspect)
    total_k = ki.shape[0]
    problem = VarlenProblem(
        batch=batch, total_q=total_q, total_k=total_k,
        max_seqlen_q=min(max_q, total_q, MAX_SEQLEN), max_seqlen_k=min(max_k, total_k, MAX_SEQLEN),
        nheads=nheads, nheads_kv=ki.shape[1], headdim=headdim, dtype=qi.dtype,
        device_id=qi.device_id, scale=scale, window_left=window_left, window_right=window_right,
        softcap=cap, seqused_k=seqused_k is not None, alibi=alibi_slopes is not None,
        dropout_p=dropout,
        headdim_v=vi.shape[-1],
    )
    return problem, [qi, *others, *vectors]


def validate_varlen(
    q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, max_seqlen_q: Any,
    max_seqlen_k: Any, out: Any = None, *, seqused_k: Any = None, causal: Any = False,
    softmax_scale: Any = None, backend: Any = None, window: Any = (-1, -1), softcap: Any = 0.0,
    alibi_slopes: Any = None, dropout_p: Any = 0.0, dropout_rng_state: Any = None,
) -> VarlenProblem:
    """Check the arguments of a variable-length attention forward call.

    Args:
        q: (total_q, nheads, headdim) DLPack tensor, float16 or bfloat16.
        k, v: (total_k, nheads_kv, headdim), q's dtype; nheads % nheads_kv == 0; v's head
            dim may differ as in ``validate_forward``.
        cu_seqlens_q, cu_seqlens_k: 1-d contiguous int32 tensors of batch + 1 >= 2 offsets.
        max_seqlen_q, max_seqlen_k: ints >= 0, the longest sequences' lengths.
        out: optional (total_q, nheads, headdim_v) tensor of q's dtype.
        seqused_k: optional 1-d contiguous int32 tensor (batch,).
        causal, softmax_scale, backend, window, softcap: as in ``validate_forward``.
        alibi_slopes: None, or a float32 (nheads,) or (batch, nheads) DLPack tensor with unit
            stride over heads, batch being the number of sequences (as in ``validate_forward``).
        dropout_p, dropout_rng_state: as in ``validate_forward``.

    Every tensor, the offsets and slopes included, must live on one CUDA device.

    Raises:
        TypeError: a non-DLPack argument, wrong dtypes (int32 offsets), a non-int max_seqlen.
        ValueError: wrong ranks, shapes, lengths, strides, devices, head dim or scalars.
        ImportError: the compiled extension is missing.
    """
    problem, infos = varlen_problem(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, out,
        seqused_k=seqused_k, causal=causal, softmax_scale=softmax_scale, backend=backend,
        window=window, softcap=softcap, alibi_slopes=alibi_slopes, dropout_p=dropout_p,
        dropout_rng_state=dropout_rng_state,
    )
    _check_devices(infos[0], infos[1:])
    return problem


def varlen_backward_problem(
    dout: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, cu_seqlens_q: Any, cu_seqlens_k: Any,
    max_seqlen_q: Any, max_seqlen_k: Any, *, seqused_k: Any = None, dq: Any = None,
    dk: Any = None, dv: Any = None, causal: Any = False, softmax_scale: Any = None,
    deterministic: Any = False, backend: Any = None, window: Any = (-1, -1), softcap: Any = 0.0,
    alibi_slopes: Any = None, dropout_p: Any = 0.0, dropout_rng_state: Any = None,
) -> tuple[VarlenProblem, list[_Info]]:
    """``validate_varlen_backward`` without its last check (devices)."""
    check_backward_flags(deterministic, backend)
    if out is None:
        raise TypeError("out: expected the forward's output, got None")
    problem, forward_infos = varlen_problem(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, out,
        seqused_k=seqused_k, causal=causal, softmax_scale=softmax_scale, backend=backend,
        window=window, softcap=softcap, alibi_slopes=alibi_slopes, dropout_p=dropout_p,
        dropout_rng_state=dropout_rng_state, backward=True,
    )
    infos = gradient_infos(dout, dq, dk, dv)
    for info in infos:
        _check_packed(info)
        check_gradient(info, problem)
    lse_info = _inspect("lse", lse)
    if lse_info.dtype != "float32" or lse_info.shape != problem.lse_shape:
        raise ValueError(
            f"lse: expected the forward's float32 (nheads, total_q) = {_fmt(problem.lse_shape)} "
            f"log-sum-exp, got {lse_info.dtype} {_fmt(lse_info.shape)}"
        )
    if problem.total_q > 1 and lse_info.strides[1] != 1:
        raise ValueError(f"lse: expected unit stride in the last dimension, got {_fmt(lse_info.strides)}")
    return problem, [*forward_infos, *infos, lse_info]


def validate_varlen_backward(
    dout: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, cu_seqlens_q: Any, cu_seqlens_k: Any,
    max_seqlen_q: Any, max_seqlen_k: Any, *, seqused_k: Any = None, dq: Any = None,
    dk: Any = None, dv: Any = None, causal: Any = False, softmax_scale: Any = None,
    deterministic: Any = False, backend: Any = None, window: Any = (-1, -1), softcap: Any = 0.0,
    alibi_slopes: Any = None, dropout_p: Any = 0.0, dropout_rng_state: Any = None,
) -> VarlenProblem:
    """Check the arguments of a variable-length backward call: q, k, v, out, the offsets and
    seqused_k as in ``validate_varlen``; dq packed like q, dout like out, dk like k, dv like v,
    all in q's dtype; lse the forward's float32 (nheads, total_q) with unit last stride; the
    forward's alibi_slopes, dropout_p and dropout_rng_state; one device.

    Raises:
        TypeError, ValueError: as ``validate_varlen``, for these tensors too; ValueError for
            backend="hopper" with deterministic=True.
    """
    problem, infos = varlen_backward_problem(
        dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
        seqused_k=seqused_k, dq=dq, dk=dk, dv=dv, causal=causal, softmax_scale=softmax_scale,
        deterministic=deterministic, backend=backend, window=window, softcap=softcap,
        alibi_slopes=alibi_slopes, dropout_p=dropout_p, dropout_rng_state=dropout_rng_state,
    )
    _check_devices(infos[0], infos[1:])
    return problem

