"""The torch routes of ``flashcute.attention_varlen`` and ``flashcute.attention_varlen_backward``:
the custom ops ``flashcute::attention_varlen_forward`` / ``..._forward_out`` /
``flashcute::attention_varlen_backward`` with fake implementations and an autograd formula
(``torch.compile``, other transforms), an eager ``torch.autograd.Function`` (inputs that
require grad, nothing else watching) and the direct launch, chosen as for fixed-length calls
(``_torch_ops.route``). The direct launch keeps what the checks decided per call signature,
as ``_torch_direct`` does; the offsets' values are never read on the host.

Imported only when torch tensors are used.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable
from torch.utils.dlpack import to_dlpack

from . import _dropout, _torch_ops
from ._dispatch import choose_backend, choose_backward_backend
from ._dropout import NO_DROPOUT, Dropout, launch_kwargs, rng_state_for
from ._torch_direct import (
    _capsule,
    dropout_capsule,
    drawn_layout,
    _forward_buffers,
    _gradient_buffers,
    _keep,
    _layout,
    _Plan,
    _plans,
    _stream,
)
from ._torch_autograd import save_options
from ._torch_layout import kernel_layout
from ._validate_varlen import (
    VarlenProblem,
    validate_varlen,
    validate_varlen_backward,
    varlen_backward_problem,
    varlen_problem,
)
from .varlen import backward_workspace_bytes, forward_workspace_bytes, varlen_extension

# ---------------------------------------------------------------------------------------------
# The direct launch.


def _optional_capsule(x: Optional[Tensor]) -> Any:
    return None if x is None else to_dlpack(x)


def forward(
    q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
    max_seqlen_q: int, max_seqlen_k: int, *, seqused_k: Optional[Tensor], causal: bool,
    softmax_scale: Optional[float], return_lse: bool, backend: Optional[str],
    out: Optional[Tensor] = None, window: tuple[int, int] = (-1, -1), softcap: float = 0.0,
    alibi_slopes: Optional[Tensor] = None, dropout: Dropout = NO_DROPOUT,
    dropout_rng_state: Optional[Tensor] = None,
) -> Any:
    """The output (``out`` when given; and lse) of a call nothing watches; with dropout, the
    explicit seed and offset or ``dropout_rng_state`` (nothing is drawn here)."""
    plan = forward_plan(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                        seqused_k, out, causal, softmax_scale, backend, window, softcap,
                        alibi_slopes, dropout.p, dropout_rng_state)
    problem = plan.problem
    out, lse, workspace = _forward_buffers(q, plan, out, return_lse)
    if not problem.empty_output:
        ext = varlen_extension()
        ext.forward(
            _capsule(q), _capsule(k), _capsule(v), _capsule(out), _optional_capsule(lse),
            problem.scale, causal, plan.backend_code, _stream(problem.device_id),
            _optional_capsule(workspace), problem.window_left, problem.window_right,
            problem.softcap, _optional_capsule(alibi_slopes), to_dlpack(cu_seqlens_q),
            to_dlpack(cu_seqlens_k), _optional_capsule(seqused_k), problem.max_seqlen_q,
            problem.max_seqlen_k,
            **launch_kwargs(ext, dropout, dropout_capsule(dropout, dropout_rng_state)),
        )
    return (out, lse) if return_lse else out


def forward_plan(
    q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
    max_seqlen_q: int, max_seqlen_k: int, seqused_k: Optional[Tensor], out: Optional[Tensor],
    causal: bool, softmax_scale: Optional[float], backend: Optional[str],
    window: tuple[int, int], softcap: float, alibi_slopes: Optional[Tensor], dropout_p: float,
    dropout_rng_state: Optional[Tensor], *, to_draw: bool = False,
) -> _Plan:
    """The kept plan of a forward's call signature, checked on its first call (raises what
    the checks raise); ``to_draw`` as ``_torch_direct.forward_plan``."""
    state_layout = drawn_layout(q) if to_draw else _layout(dropout_rng_state)
    key = ("varlen_forward", _layout(q), _layout(k), _layout(v), _layout(out),
           _layout(cu_seqlens_q), _layout(cu_seqlens_k), _layout(seqused_k), max_seqlen_q,
           max_seqlen_k, causal, softmax_scale, backend, window, softcap, _layout(alibi_slopes),
           dropout_p, state_layout)
    plan = _plans.get(key)
    if plan is None:
        ext = varlen_extension()
        problem = validate_varlen(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, out,
            seqused_k=seqused_k, causal=causal, softmax_scale=softmax_scale, backend=backend,
            window=window, softcap=softcap, alibi_slopes=alibi_slopes, dropout_p=dropout_p,
            dropout_rng_state=dropout_rng_state,
        )
        code = choose_backend(backend, int(ext.device_capability(problem.device_id)),
                              headdim=problem.headdim, dtype=problem.dtype,
                              headdim_v=problem.dv)
        nbytes = 0 if problem.empty_output else forward_workspace_bytes(ext, problem, causal, code)
        plan = _Plan(problem, code, nbytes)
        _keep(key, plan)
    return plan


def backward(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
    cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int, *,
    seqused_k: Optional[Tensor], causal: bool, softmax_scale: Optional[float],
    deterministic: bool, backend: Optional[str], dq: Optional[Tensor] = None,
    dk: Optional[Tensor] = None, dv: Optional[Tensor] = None,
    window: tuple[int, int] = (-1, -1), softcap: float = 0.0,
    alibi_slopes: Optional[Tensor] = None, dropout: Dropout = NO_DROPOUT,
    dropout_rng_state: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of a backward call nothing watches: the given buffers or new tensors."""
    tensors = (dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, dq, dk, dv,
               alibi_slopes, dropout_rng_state)
    key = ("varlen_backward", *(_layout(x) for x in tensors), max_seqlen_q, max_seqlen_k,
           causal, softmax_scale, deterministic, backend, window, softcap, dropout.p)
    plan = _plans.get(key)
    if plan is None:
        ext = varlen_extension()
        problem = validate_varlen_backward(
            dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
            seqused_k=seqused_k, dq=dq, dk=dk, dv=dv, causal=causal,
            softmax_scale=softmax_scale, deterministic=deterministic, backend=backend,
            window=window, softcap=softcap, alibi_slopes=alibi_slopes, dropout_p=dropout.p,
            dropout_rng_state=dropout_rng_state,
        )
        code = choose_backward_backend(
            backend, int(ext.device_capability(problem.device_id)), headdim=problem.headdim,
            dtype=problem.dtype, deterministic=deterministic, headdim_v=problem.dv,
        )
        plan = _Plan(problem, code, backward_workspace_bytes(ext, problem, causal, deterministic, code))
        _keep(key, plan)
    problem = plan.problem
    dq, dk, dv, workspace = _gradient_buffers(q, plan, dq, dk, dv)
    ext = varlen_extension()
    ext.backward(
        *(_capsule(x) for x in (dout, q, k, v, out, lse, dq, dk, dv)), to_dlpack(workspace),
        problem.scale, causal, deterministic, plan.backend_code, _stream(problem.device_id),
        problem.window_left, problem.window_right, problem.softcap,
        _optional_capsule(alibi_slopes), to_dlpack(cu_seqlens_q), to_dlpack(cu_seqlens_k),
        _optional_capsule(seqused_k), problem.max_seqlen_q, problem.max_seqlen_k,
        **launch_kwargs(ext, dropout, dropout_capsule(dropout, dropout_rng_state)),
    )
    return dq, dk, dv


# ---------------------------------------------------------------------------------------------
# The custom ops.


def _concrete(
    max_seqlen_q: Any, max_seqlen_k: Any, softmax_scale: Any, window_left: Any, window_right: Any,
    softcap: Any,
) -> tuple[int, int, float, tuple[int, int], float]:
    """The scalar arguments as Python numbers (torch.compile may hand the fakes symbolic
    ones; reading them specializes the graph to their values, which the checks need)."""
    return (int(max_seqlen_q), int(max_seqlen_k), float(softmax_scale),
            (int(window_left), int(window_right)), float(softcap))


def _fake_problem(
    q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
    seqused_k: Optional[Tensor], max_seqlen_q: Any, max_seqlen_k: Any, out: Optional[Tensor],
    causal: bool, backend: Optional[str], softmax_scale: Any, window_left: Any, window_right: Any,
    softcap: Any, alibi_slopes: Optional[Tensor], dropout: Dropout = NO_DROPOUT,
    dropout_rng_state: Optional[Tensor] = None,
) -> VarlenProblem:
    """The real forward's checks, run while tracing (device checks only on CUDA inputs)."""
    max_q, max_k, scale, window, cap = _concrete(
        max_seqlen_q, max_seqlen_k, softmax_scale, window_left, window_right, softcap
    )
    problem, infos = varlen_problem(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_q, max_k, out, seqused_k=seqused_k,
        causal=causal, softmax_scale=scale, backend=backend, window=window, softcap=cap,
        alibi_slopes=alibi_slopes, dropout_p=dropout.p, dropout_rng_state=dropout_rng_state,
    )
    _torch_ops._fake_device_checks(q, infos, lambda capability: choose_backend(
        backend, capability, headdim=problem.headdim, dtype=problem.dtype,
        headdim_v=problem.dv))
    return problem


@torch.library.custom_op("flashcute::attention_varlen_forward", mutates_args=(),
                         tags=_torch_ops._RANDOM)
def attention_varlen_forward(
    q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
    seqused_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int, causal: bool,
    softmax_scale: float, backend: Optional[str], deterministic: bool = False,
    window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
    alibi_slopes: Optional[Tensor] = None, dropout_p: float = 0.0,
    dropout_seed: Optional[int] = None, dropout_offset: Optional[int] = None,
    dropout_rng_state: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """(out, lse, rng_state) of a variable-length forward: out (total_q, nheads, v's head dim), lse
    (nheads, total_q), and the dropout rng state the op drew (empty where it drew none), as
    ``flashcute::attention_forward``. ``deterministic`` asks the autograd formula for a
    bitwise reproducible backward; the ALiBi slopes are not differentiated."""
    dropout = _torch_ops._op_dropout(dropout_p, dropout_seed, dropout_offset, dropout_rng_state,
                                     draws=True)
    state = rng_state_for(q, dropout, dropout_rng_state)
    out, lse = forward(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k=seqused_k,
        causal=causal, softmax_scale=softmax_scale, return_lse=True, backend=backend,
        window=(window_left, window_right), softcap=softcap, alibi_slopes=alibi_slopes,
        dropout=dropout, dropout_rng_state=state,
    )
    return out, lse, _torch_ops.drawn_state(q, state, dropout_rng_state)


@attention_varlen_forward.register_fake
def _(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
      seqused_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int, causal: bool,
      softmax_scale: float, backend: Optional[str], deterministic: bool = False,
      window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
      alibi_slopes: Optional[Tensor] = None, dropout_p: float = 0.0,
      dropout_seed: Optional[int] = None, dropout_offset: Optional[int] = None,
      dropout_rng_state: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor]:
    dropout = _torch_ops._op_dropout(dropout_p, dropout_seed, dropout_offset, dropout_rng_state,
                                     draws=True)
    problem = _fake_problem(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
                            max_seqlen_k, None, causal, backend, softmax_scale, window_left,
                            window_right, softcap, alibi_slopes, dropout, dropout_rng_state)
    return (q.new_empty(problem.out_shape), q.new_empty(problem.lse_shape, dtype=torch.float32),
            _torch_ops.fake_drawn_state(q, dropout, dropout_rng_state))


@torch.library.custom_op("flashcute::attention_varlen_forward_out", mutates_args=("out",),
                         tags=_torch_ops._RANDOM)
def attention_varlen_forward_out(
    q: Tensor, k: Tensor, v: Tensor, out: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
    seqused_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int, causal: bool,
    softmax_scale: float, backend: Optional[str], window_left: int = -1, window_right: int = -1,
    softcap: float = 0.0, alibi_slopes: Optional[Tensor] = None, dropout_p: float = 0.0,
    dropout_seed: Optional[int] = None, dropout_offset: Optional[int] = None,
    dropout_rng_state: Optional[Tensor] = None,
) -> Tensor:
    """Writes a variable-length forward's output into ``out`` and returns lse (calls with
    ``out=`` that something watches; not differentiable)."""
    dropout = _torch_ops._op_dropout(dropout_p, dropout_seed, dropout_offset, dropout_rng_state,
                                     draws=True)
    _, lse = forward(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k=seqused_k,
        causal=causal, softmax_scale=softmax_scale, return_lse=True, backend=backend, out=out,
        window=(window_left, window_right), softcap=softcap, alibi_slopes=alibi_slopes,
        dropout=dropout, dropout_rng_state=rng_state_for(q, dropout, dropout_rng_state),
    )
    return lse


@attention_varlen_forward_out.register_fake
def _(q: Tensor, k: Tensor, v: Tensor, out: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
      seqused_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int, causal: bool,
      softmax_scale: float, backend: Optional[str], window_left: int = -1, window_right: int = -1,
      softcap: float = 0.0, alibi_slopes: Optional[Tensor] = None, dropout_p: float = 0.0,
      dropout_seed: Optional[int] = None, dropout_offset: Optional[int] = None,
      dropout_rng_state: Optional[Tensor] = None) -> Tensor:
    dropout = _torch_ops._op_dropout(dropout_p, dropout_seed, dropout_offset, dropout_rng_state,
                                     draws=True)
    problem = _fake_problem(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
                            max_seqlen_k, out, causal, backend, softmax_scale, window_left,
                            window_right, softcap, alibi_slopes, dropout, dropout_rng_state)
    return q.new_empty(problem.lse_shape, dtype=torch.float32)


@torch.library.custom_op("flashcute::attention_varlen_backward", mutates_args=())
def attention_varlen_backward(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
    cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, seqused_k: Optional[Tensor], max_seqlen_q: int,
    max_seqlen_k: int, causal: bool, softmax_scale: float, deterministic: bool,
    backend: Optional[str], window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
    alibi_slopes: Optional[Tensor] = None, dropout_p: float = 0.0,
    dropout_seed: Optional[int] = None, dropout_offset: Optional[int] = None,
    dropout_rng_state: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of a variable-length backward, each contiguous."""
    dropout = _torch_ops._op_dropout(dropout_p, dropout_seed, dropout_offset, dropout_rng_state,
                                     draws=False)
    return backward(
        kernel_layout(dout), q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
        max_seqlen_k, seqused_k=seqused_k, causal=causal, softmax_scale=softmax_scale,
        deterministic=deterministic, backend=backend, window=(window_left, window_right),
        softcap=softcap, alibi_slopes=alibi_slopes, dropout=dropout,
        dropout_rng_state=dropout_rng_state,
    )


@attention_varlen_backward.register_fake
def _(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
      cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, seqused_k: Optional[Tensor], max_seqlen_q: int,
      max_seqlen_k: int, causal: bool, softmax_scale: float, deterministic: bool,
      backend: Optional[str], window_left: int = -1, window_right: int = -1,
      softcap: float = 0.0, alibi_slopes: Optional[Tensor] = None, dropout_p: float = 0.0,
      dropout_seed: Optional[int] = None, dropout_offset: Optional[int] = None,
      dropout_rng_state: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor]:
    max_q, max_k, scale, window, cap = _concrete(
        max_seqlen_q, max_seqlen_k, softmax_scale, window_left, window_right, softcap
    )
    dropout = _torch_ops._op_dropout(dropout_p, dropout_seed, dropout_offset, dropout_rng_state,
                                     draws=False)
    problem, infos = varlen_backward_problem(
        dout.new_empty(dout.shape), q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_q, max_k,
        seqused_k=seqused_k, causal=causal, softmax_scale=scale, deterministic=deterministic,
        backend=backend, window=window, softcap=cap, alibi_slopes=alibi_slopes,
        dropout_p=dropout.p, dropout_rng_state=dropout_rng_state,
    )
    _torch_ops._fake_device_checks(q, infos, lambda capability: choose_backward_backend(
        backend, capability, headdim=problem.headdim, dtype=problem.dtype,
        deterministic=deterministic, headdim_v=problem.dv))
    return q.new_empty(q.shape), q.new_empty(k.shape), q.new_empty(v.shape)


def _setup_context(
    ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor, Tensor]
) -> None:
    (q, k, v, cu_q, cu_k, used, max_q, max_k, causal, scale, backend, deterministic, left, right,
     softcap, slopes, dropout_p, seed, offset, given) = inputs
    out, lse, drawn = output
    dropout = _torch_ops._op_dropout(dropout_p, seed, offset, given, draws=True)
    state = _torch_ops.backward_state(dropout, given, drawn)
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, used, slopes, state)
    ctx.sizes = (max_q, max_k)
    save_options(ctx, lse, causal, scale, (left, right), softcap, deterministic, backend, dropout)


def _backward(
    ctx: Any, dout: Tensor, _dlse: Optional[Tensor], _dstate: Optional[Tensor]
) -> tuple[Any, ...]:
    q, k, v, out, lse, cu_q, cu_k, used, slopes, state = ctx.saved_tensors
    dropout: Dropout = ctx.dropout
    dq, dk, dv = attention_varlen_backward(
        dout, q, k, v, out, lse, cu_q, cu_k, used, *ctx.sizes, ctx.causal, ctx.softmax_scale,
        ctx.deterministic or torch.are_deterministic_algorithms_enabled(), ctx.backend,
        *ctx.window, ctx.softcap, slopes, dropout.p, dropout.seed, dropout.offset, state,
    )
    return (dq, dk, dv) + (None,) * 17


attention_varlen_forward.register_autograd(_backward, setup_context=_setup_context)


# ---------------------------------------------------------------------------------------------
# The eager autograd route.


class _AttentionVarlen(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor, cu_k: Tensor,
        used: Optional[Tensor], max_q: int, max_k: int, causal: bool,
        softmax_scale: Optional[float], backend: Optional[str], deterministic: bool,
        window: tuple[int, int], softcap: float, slopes: Optional[Tensor], dropout: Dropout,
        given: Optional[Tensor],
    ) -> tuple[Tensor, Tensor]:
        # given: the state the route drew or was given; nothing is drawn here.
        out, lse = forward(
            q, k, v, cu_q, cu_k, max_q, max_k, seqused_k=used, causal=causal,
            softmax_scale=softmax_scale, return_lse=True, backend=backend, window=window,
            softcap=softcap, alibi_slopes=slopes, dropout=dropout, dropout_rng_state=given,
        )
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, used, slopes, given)
        ctx.sizes = (max_q, max_k)
        save_options(ctx, lse, causal, softmax_scale, window, softcap, deterministic, backend,
                     dropout)
        return out, lse

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, dout: Tensor, _dlse: Optional[Tensor]) -> tuple[Any, ...]:  # type: ignore[override]
        q, k, v, out, lse, cu_q, cu_k, used, slopes, state = ctx.saved_tensors
        dq, dk, dv = backward(
            kernel_layout(dout), q, k, v, out, lse, cu_q, cu_k, *ctx.sizes, seqused_k=used,
            causal=ctx.causal, softmax_scale=ctx.softmax_scale,
            deterministic=ctx.deterministic or torch.are_deterministic_algorithms_enabled(),
            backend=ctx.backend, window=ctx.window, softcap=ctx.softcap, alibi_slopes=slopes,
            dropout=ctx.dropout, dropout_rng_state=state,
        )
        return (dq, dk, dv) + (None,) * 14


# ---------------------------------------------------------------------------------------------
# Routing.


def _scale(q: Tensor, softmax_scale: Optional[float]) -> float:
    """The scale the custom ops take: given, or 1/sqrt(headdim) (1.0 for a q without one,
    whose checks then name what is wrong)."""
    if softmax_scale is not None:
        return float(softmax_scale)
    headdim = q.shape[-1] if q.dim() > 0 else 0
    return 1.0 / math.sqrt(headdim) if headdim > 0 else 1.0


def attention(
    q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
    max_seqlen_q: int, max_seqlen_k: int, *, seqused_k: Optional[Tensor], causal: bool,
    softmax_scale: Optional[float], return_lse: bool, backend: Optional[str],
    out: Optional[Tensor] = None, deterministic: bool = False,
    window: tuple[int, int] = (-1, -1), softcap: float = 0.0,
    alibi_slopes: Optional[Tensor] = None, dropout: Dropout = NO_DROPOUT,
    dropout_rng_state: Optional[Tensor] = None,
) -> Any:
    """The torch route of ``attention_varlen`` (scalar arguments already checked); dropout
    without an explicit seed or rng state draws one as ``_torch_ops.attention`` does."""
    left, right = window
    watched = [x for x in (q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, out, alibi_slopes,
                           dropout_rng_state) if x is not None]
    how = _torch_ops.route(*watched)
    allocating = out is None and q.dim() == 3  # other ranks: direct, whose checks name q
    op = (how == "custom_op" and allocating) or (how != "direct" and out is not None)
    if dropout.active and dropout.seed is None and dropout_rng_state is None:
        # As in _torch_ops.attention: checked before the draw (a call that raises leaves
        # torch's generator as it was), drawn outside the custom ops.
        if op:
            _check_before_op_draw(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
                                  max_seqlen_k, out, causal, backend, softmax_scale, window,
                                  softcap, alibi_slopes, dropout)
        else:
            forward_plan(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                         seqused_k, out, causal, softmax_scale, backend, window, softcap,
                         alibi_slopes, dropout.p, None, to_draw=True)
        dropout_rng_state = _dropout.dropout_rng_state(q.device)
    if op:
        drop = (dropout.p, dropout.seed, dropout.offset, dropout_rng_state)
        if out is not None:
            lse = attention_varlen_forward_out(
                q, k, v, out, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
                causal, _scale(q, softmax_scale), backend, left, right, softcap, alibi_slopes,
                *drop,
            )
            return (out, lse) if return_lse else out
        result, lse, _ = attention_varlen_forward(
            q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
            causal, _scale(q, softmax_scale), backend, deterministic, left, right, softcap,
            alibi_slopes, *drop,
        )
        return (result, lse) if return_lse else result
    # What the kernels read: the state given or drawn above; none without dropout.
    state = dropout_rng_state if dropout.active else None
    if allocating and how == "autograd":
        result, lse = _AttentionVarlen.apply(
            q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
            causal, softmax_scale, backend, deterministic, window, softcap, alibi_slopes,
            dropout, state,
        )
        return (result, lse) if return_lse else result
    return forward(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k=seqused_k,
        causal=causal, softmax_scale=softmax_scale, return_lse=return_lse, backend=backend,
        out=out, window=window, softcap=softcap, alibi_slopes=alibi_slopes, dropout=dropout,
        dropout_rng_state=state,
    )


def _check_before_op_draw(
    q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
    seqused_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int, out: Optional[Tensor],
    causal: bool, backend: Optional[str], softmax_scale: Optional[float],
    window: tuple[int, int], softcap: float, alibi_slopes: Optional[Tensor], dropout: Dropout,
) -> None:
    """The forward op's checks (its fake's), for a call about to draw a rng state for it;
    skipped where ``_torch_ops._check_before_op_draw`` skips them."""
    if _torch_ops.checked_by_the_op():
        return
    _fake_problem(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
                  out, causal, backend, _scale(q, softmax_scale), *window, softcap,
                  alibi_slopes, dropout)
