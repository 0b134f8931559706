"""flashcute for JAX: attention as XLA FFI custom calls, under ``jit``, ``grad``, ``vmap`` and
``shard_map``.

The functions mirror ``flashcute.attention``, ``flashcute.attention_backward`` and
``flashcute.attention_varlen`` (same argument names and defaults, without ``out=``) on jax
arrays, traced or concrete. Each call is checked, and its backend and workspace sizes chosen,
when it is traced; the kernels then run on XLA's stream, with workspaces that XLA allocates,
so the calls fit in XLA command buffers (CUDA graphs).

``import flashcute`` never imports jax; this module needs it (``pip install "jax[cuda13]"``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Optional, Sequence, Union

try:
    import jax
    import jax.numpy as jnp
except ImportError as _exc:  # pragma: no cover - exercised where jax is absent
    raise ImportError(
        "flashcute.jax needs jax with CUDA support: pip install \"jax[cuda13]\" (or "
        "\"jax[cuda12]\" for CUDA 12 drivers)"
    ) from _exc
import numpy as np

from . import _jax_calls
from ._build_info import load_extension
from ._dispatch import choose_backend, choose_backward_backend
from ._dropout import Dropout, check_dropout
from ._frameworks import ArraySpec
from ._jax_calls import Plan
from ._validate import ForwardProblem, type_name, validate_forward
from ._validate_backward import check_backward_flags, validate_backward
from ._validate_varlen import VarlenProblem, validate_varlen, validate_varlen_backward
from .attention import _check_front_door_flags, forward_workspace_bytes
from .varlen import backward_workspace_bytes as varlen_backward_workspace_bytes
from .varlen import forward_workspace_bytes as varlen_forward_workspace_bytes

__all__ = ["attention", "attention_backward", "attention_varlen", "attention_varlen_backward"]

_jax_calls.register_targets()

Problem = Union[ForwardProblem, VarlenProblem]
_ARRAY_TYPES = (jax.Array, _jax_calls.TRACER)


def _spec(x: Any, device_id: int) -> ArraySpec:
    """A jax array (or tracer) as the checks read it; other objects fail them by type."""
    if not isinstance(x, _ARRAY_TYPES):
        return x  # the checks raise a TypeError naming the argument
    return ArraySpec(x.shape, jnp.dtype(x.dtype).name, device_id)


def _given(x: Any) -> bool:
    """Whether an optional input is there: not None and not the empty stand-in."""
    return x is not None and getattr(x, "size", 1) > 0


def _none() -> Any:
    return jnp.zeros((0,), jnp.int32)


def _slopes(alibi_slopes: Any, batch: int, nheads: int) -> Any:
    """The slopes as (batch, nheads): with vmap folded into the batch, each row is a batch's."""
    if alibi_slopes is None:
        return jnp.zeros((0,), jnp.float32)
    return jnp.broadcast_to(alibi_slopes, (batch, nheads))


_WORD = 0xFFFFFFFF


def _rng_words(dropout: Dropout, state: Any) -> Any:
    """{seed, offset} as four uint32 words, low word first (an empty array without dropout).

    ``state`` may be an int64 or uint64 (2,) array {seed, offset}, or four uint32/int32 words."""
    if not dropout.active:
        return jnp.zeros((0,), jnp.uint32)
    if state is None:
        seed, offset = int(dropout.seed), int(dropout.offset)
        return jnp.asarray(np.array([seed & _WORD, seed >> 32, offset & _WORD, offset >> 32], np.uint32))
    if not isinstance(state, _ARRAY_TYPES):
        raise TypeError(f"dropout_rng_state: expected a jax array, got {type_name(state)}")
    dtype = jnp.dtype(state.dtype)
    if dtype.itemsize == 8 and dtype.kind in "iu" and state.shape == (2,):
        return jax.lax.bitcast_convert_type(state, jnp.uint32).reshape(4)
    if dtype.itemsize == 4 and dtype.kind in "iu" and state.shape == (4,):
        return jax.lax.bitcast_convert_type(state, jnp.uint32)
    raise ValueError(
        "dropout_rng_state: expected {seed, offset} as an int64 (2,) array or as four 32-bit "
        f"integer words (low word first), got {dtype.name} {tuple(state.shape)}"
    )


def _check_dropout(dropout_p: Any, seed: Any, offset: Any, state: Any, backward: bool = False) -> Dropout:
    return check_dropout(dropout_p, seed, offset, state, draws=False, backward=backward)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attend(plan: Plan, q: Any, k: Any, v: Any, optional: tuple[Any, ...]) -> tuple[Any, Any]:
    return _jax_calls.forward(plan, q, k, v, optional)


def _attend_fwd(plan: Plan, q: Any, k: Any, v: Any, optional: tuple[Any, ...]) -> tuple[Any, Any]:
    out, lse = _jax_calls.forward(plan, q, k, v, optional)
    return (out, lse), (q, k, v, out, lse, optional)


def _attend_bwd(plan: Plan, residuals: tuple[Any, ...], cotangents: tuple[Any, Any]) -> tuple[Any, ...]:
    q, k, v, out, lse, optional = residuals
    dout = cotangents[0]  # lse reaches callers through stop_gradient: its cotangent is zero
    plan = _backward_plan(plan, dout, q, k, v, out, lse, optional)
    dq, dk, dv = _jax_calls.backward(plan, dout, q, k, v, out, lse, optional)
    return dq, dk, dv, tuple(None for _ in optional)


_attend.defvjp(_attend_fwd, _attend_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attend_out(plan: Plan, q: Any, k: Any, v: Any, optional: tuple[Any, ...]) -> Any:
    """``_attend`` for callers without lse: undifferentiated calls leave it unwritten."""
    return _jax_calls.forward(plan, q, k, v, optional, with_lse=False)[0]


def _attend_out_fwd(plan: Plan, q: Any, k: Any, v: Any, optional: tuple[Any, ...]) -> tuple[Any, Any]:
    (out, lse), residuals = _attend_fwd(plan, q, k, v, optional)
    return out, residuals


def _attend_out_bwd(plan: Plan, residuals: tuple[Any, ...], dout: Any) -> tuple[Any, ...]:
    return _attend_bwd(plan, residuals, (dout, None))


_attend_out.defvjp(_attend_out_fwd, _attend_out_bwd)


def _run(plan: Plan, q: Any, k: Any, v: Any, optional: tuple[Any, ...], return_lse: bool) -> Any:
    if not return_lse:
        return _attend_out(plan, q, k, v, optional)
    out, lse = _attend(plan, q, k, v, optional)
    return out, jax.lax.stop_gradient(lse)


def _forward_plan(
    problem: Problem, device_id: int, backend: Optional[str], causal: bool,
    deterministic: bool, varlen: bool,
) -> Plan:
    ext = load_extension()
    capability = int(ext.device_capability(device_id))
    code = choose_backend(backend, capability, headdim=problem.headdim, dtype=problem.dtype,
                          headdim_v=problem.dv)
    if problem.empty_output:
        workspace = 0
    elif varlen:
        workspace = varlen_forward_workspace_bytes(ext, problem, causal, code)
    else:
        workspace = forward_workspace_bytes(ext, problem, causal, code)
    return Plan(
        scale=problem.scale, causal=causal, window_left=problem.window_left,
        window_right=problem.window_right, softcap=problem.softcap, dropout_p=problem.dropout_p,
        max_seqlen_q=problem.max_seqlen_q if varlen else 0,
        max_seqlen_k=problem.max_seqlen_k if varlen else 0,
        forward_backend=code, forward_workspace=workspace, out_shape=tuple(problem.out_shape),
        lse_shape=tuple(problem.lse_shape),
        vmap_method="sequential" if varlen or problem.dropout_p > 0.0 else "broadcast_all",
        backward_backend=-1, deterministic=deterministic, requested_backend=backend, varlen=varlen,
    )


def _backward_plan(
    plan: Plan, dout: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, optional: Sequence[Any]
) -> Plan:
    """``plan`` with the backward's backend and workspace, for the traced tensors."""
    device_id = _jax_calls.trace_device_id(q)
    specs = [_spec(x, device_id) for x in (dout, q, k, v, out, lse)]
    alibi, _, cu_q, cu_k, used = optional
    varlen = plan.varlen
    common = dict(
        causal=plan.causal, softmax_scale=plan.scale, deterministic=plan.deterministic,
        backend=plan.requested_backend, window=(plan.window_left, plan.window_right),
        softcap=plan.softcap, alibi_slopes=_spec(alibi, device_id) if _given(alibi) else None,
        dropout_p=plan.dropout_p,
    )
    ext = load_extension()
    if varlen:
        problem: Problem = validate_varlen_backward(
            *specs, _spec(cu_q, device_id), _spec(cu_k, device_id), plan.max_seqlen_q,
            plan.max_seqlen_k, seqused_k=_spec(used, device_id) if _given(used) else None,
            **common,
        )
    else:
        problem = validate_backward(*specs, **common)
    capability = int(ext.device_capability(device_id))
    code = choose_backward_backend(
        plan.requested_backend, capability, headdim=problem.headdim, dtype=problem.dtype,
        deterministic=plan.deterministic, headdim_v=problem.dv,
    )
    if varlen:
        nbytes = varlen_backward_workspace_bytes(ext, problem, plan.causal, plan.deterministic, code)
    else:
        nbytes = int(ext.backward_workspace_size(
            problem.batch, problem.seqlen_q, problem.seqlen_k, problem.nheads, problem.nheads_kv,
            problem.headdim, problem.dtype, plan.deterministic, code, plan.causal,
            problem.window_left, problem.window_right,
        ))
    sizes = {"max_seqlen_q": problem.max_seqlen_q, "max_seqlen_k": problem.max_seqlen_k} if varlen else {}
    return dataclasses.replace(plan, backward_backend=code, backward_workspace=nbytes, **sizes)


def attention(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = False,
    softmax_scale: Optional[float] = None,
    window: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Any = None,
    dropout_p: float = 0.0,
    dropout_seed: Optional[int] = None,
    dropout_offset: Optional[int] = None,
    dropout_rng_state: Any = None,
    return_lse: bool = False,
    backend: Optional[str] = None,
    deterministic: bool = False,
) -> Any:
    """``flashcute.attention`` on jax arrays, differentiable and traceable.

    Args:
        q: (batch, seqlen_q, nheads, headdim) float16 or bfloat16 jax array.
        k, v: (batch, seqlen_k, nheads_kv, headdim); nheads % nheads_kv == 0.
        causal, softmax_scale, window, softcap, alibi_slopes, dropout_p, return_lse, backend:
            as in ``flashcute.attention`` (static Python values, except the arrays).
        dropout_seed, dropout_offset: static ints keying the dropout mask; or
        dropout_rng_state: a (traced) int64 (2,) array {seed, offset}, or four 32-bit integer
            words, low word first (for seeds drawn inside a jitted step).
        deterministic: differentiate with the bitwise reproducible backward.

    ``jax.grad`` runs ``attention_backward``'s kernel with ``out`` and ``lse`` as residuals;
    the returned lse is not differentiable (it passes through ``stop_gradient``) and neither
    are the ALiBi slopes. ``jax.vmap`` over a leading axis of q, k and v runs one launch
    (the mapped axis joins the batch); calls with dropout map sequentially.

    Returns:
        out (batch, seqlen_q, nheads, v's head dim), or ``(out, lse)`` with ``return_lse``.

    Raises:
        TypeError, ValueError: at trace time, naming the argument.
        RuntimeError: JAX has no CUDA GPU.
    """
    window, softcap = _check_front_door_flags(return_lse, deterministic, window, softcap)
    dropout = _check_dropout(dropout_p, dropout_seed, dropout_offset, dropout_rng_state)
    device_id = _jax_calls.trace_device_id(q)
    problem = validate_forward(
        _spec(q, device_id), _spec(k, device_id), _spec(v, device_id), causal=causal,
        softmax_scale=softmax_scale, backend=backend, window=window, softcap=softcap,
        alibi_slopes=_spec(alibi_slopes, device_id) if alibi_slopes is not None else None,
        dropout_p=dropout.p,
    )
    plan = _forward_plan(problem, device_id, backend, causal, deterministic, varlen=False)
    optional = (_slopes(alibi_slopes, problem.batch, problem.nheads),
                _rng_words(dropout, dropout_rng_state), _none(), _none(), _none())
    return _run(plan, q, k, v, optional, return_lse)


def attention_varlen(
    q: Any,
    k: Any,
    v: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    seqused_k: Any = None,
    causal: bool = False,
    softmax_scale: Optional[float] = None,
    window: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Any = None,
    dropout_p: float = 0.0,
    dropout_seed: Optional[int] = None,
    dropout_offset: Optional[int] = None,
    dropout_rng_state: Any = None,
    return_lse: bool = False,
    backend: Optional[str] = None,
    deterministic: bool = False,
) -> Any:
    """``flashcute.attention_varlen`` on jax arrays, differentiable and traceable.

    q is (total_q, nheads, headdim) and k, v (total_k, nheads_kv, headdim), packed;
    ``cu_seqlens_q`` / ``cu_seqlens_k`` are int32 (batch + 1,) offsets and ``seqused_k`` an
    optional int32 (batch,), all jax arrays (traced values are fine: the kernels clamp them);
    ``max_seqlen_q`` / ``max_seqlen_k`` are static ints. The other arguments are as in
    ``attention``; lse is (nheads, total_q). ``jax.vmap`` maps these calls sequentially.

    Raises:
        TypeError, ValueError: at trace time, naming the argument.
        RuntimeError: JAX has no CUDA GPU.
    """
    window, softcap = _check_front_door_flags(return_lse, deterministic, window, softcap)
    dropout = _check_dropout(dropout_p, dropout_seed, dropout_offset, dropout_rng_state)
    device_id = _jax_calls.trace_device_id(q)
    problem = validate_varlen(
        _spec(q, device_id), _spec(k, device_id), _spec(v, device_id),
        _spec(cu_seqlens_q, device_id), _spec(cu_seqlens_k, device_id), max_seqlen_q,
        max_seqlen_k, seqused_k=_spec(seqused_k, device_id) if seqused_k is not None else None,
        causal=causal, softmax_scale=softmax_scale, backend=backend, window=window,
        softcap=softcap,
        alibi_slopes=_spec(alibi_slopes, device_id) if alibi_slopes is not None else None,
        dropout_p=dropout.p,
    )
    plan = _forward_plan(problem, device_id, backend, causal, deterministic, varlen=True)
    optional = (_slopes(alibi_slopes, problem.batch, problem.nheads),
                _rng_words(dropout, dropout_rng_state), cu_seqlens_q, cu_seqlens_k,
                seqused_k if seqused_k is not None else _none())
    return _run(plan, q, k, v, optional, return_lse)


def attention_backward(
    dout: Any,
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    lse: Any,
    *,
    causal: bool = False,
    softmax_scale: Optional[float] = None,
    window: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Any = None,
    dropout_p: float = 0.0,
    dropout_seed: Optional[int] = None,
    dropout_offset: Optional[int] = None,
    dropout_rng_state: Any = None,
    deterministic: bool = False,
    backend: Optional[str] = None,
) -> tuple[Any, Any, Any]:
    """``flashcute.attention_backward`` on jax arrays: (dq, dk, dv) from the forward's out and
    lse (``attention(..., return_lse=True)``) with the forward's arguments.

    Raises:
        TypeError, ValueError: at trace time, naming the argument.
        RuntimeError: JAX has no CUDA GPU.
    """
    return _backward(
        dout, q, k, v, out, lse, None, causal=causal, softmax_scale=softmax_scale, window=window,
        softcap=softcap, alibi_slopes=alibi_slopes, dropout_p=dropout_p, dropout_seed=dropout_seed,
        dropout_offset=dropout_offset, dropout_rng_state=dropout_rng_state,
        deterministic=deterministic, backend=backend,
    )


def attention_varlen_backward(
    dout: Any,
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    lse: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    seqused_k: Any = None,
    causal: bool = False,
    softmax_scale: Optional[float] = None,
    window: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Any = None,
    dropout_p: float = 0.0,
    dropout_seed: Optional[int] = None,
    dropout_offset: Optional[int] = None,
    dropout_rng_state: Any = None,
    deterministic: bool = False,
    backend: Optional[str] = None,
) -> tuple[Any, Any, Any]:
    """``flashcute.attention_varlen_backward`` on jax arrays: (dq, dk, dv) of packed tensors
    from the forward's out and (nheads, total_q) lse, with the forward's arguments.

    Raises:
        TypeError, ValueError: at trace time, naming the argument.
        RuntimeError: JAX has no CUDA GPU.
    """
    sequences = (cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k)
    return _backward(
        dout, q, k, v, out, lse, sequences, causal=causal, softmax_scale=softmax_scale,
        window=window, softcap=softcap, alibi_slopes=alibi_slopes, dropout_p=dropout_p,
        dropout_seed=dropout_seed, dropout_offset=dropout_offset,
        dropout_rng_state=dropout_rng_state, deterministic=deterministic, backend=backend,
    )


def _backward(
    dout: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, sequences: Optional[tuple[Any, ...]],
    *, causal: bool, softmax_scale: Optional[float], window: Sequence[int], softcap: float,
    alibi_slopes: Any, dropout_p: float, dropout_seed: Optional[int],
    dropout_offset: Optional[int], dropout_rng_state: Any, deterministic: bool,
    backend: Optional[str],
) -> tuple[Any, Any, Any]:
    """The backward call of a fixed-length (``sequences`` None) or variable-length call
    (``sequences``: cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k)."""
    check_backward_flags(deterministic, backend)
    window, softcap = _check_front_door_flags(False, deterministic, window, softcap)
    dropout = _check_dropout(dropout_p, dropout_seed, dropout_offset, dropout_rng_state, backward=True)
    # The scalars as given: _backward_plan checks them with the tensors.
    headdim = q.shape[-1] if isinstance(q, _ARRAY_TYPES) and q.ndim > 0 else 1
    cu_q, cu_k, used, max_q, max_k = sequences or (_none(), _none(), None, 0, 0)
    plan = Plan(
        scale=1.0 / math.sqrt(max(headdim, 1)) if softmax_scale is None else softmax_scale,
        causal=causal, window_left=window[0], window_right=window[1], softcap=softcap,
        dropout_p=dropout.p, max_seqlen_q=max_q, max_seqlen_k=max_k, forward_backend=-1,
        forward_workspace=0, out_shape=(), lse_shape=(),
        vmap_method="sequential" if dropout.active or sequences else "broadcast_all",
        deterministic=deterministic, requested_backend=backend, varlen=sequences is not None,
    )
    rest = (_rng_words(dropout, dropout_rng_state), cu_q, cu_k, used if used is not None else _none())
    given = alibi_slopes if alibi_slopes is not None else _slopes(None, 0, 0)
    plan = _backward_plan(plan, dout, q, k, v, out, lse, (given, *rest))  # checks the slopes
    batch = int(cu_q.shape[0]) - 1 if sequences else q.shape[0]
    optional = (_slopes(alibi_slopes, batch, q.shape[-2]), *rest)
    return _jax_calls.backward(plan, dout, q, k, v, out, lse, optional)

