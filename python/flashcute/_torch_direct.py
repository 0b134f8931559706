"""The direct torch routes of ``flashcute.attention`` and ``flashcute.attention_backward``:
calls that nothing watches (see ``_torch_ops.route``) launch the kernels without the custom ops
or the generic DLPack layer; the custom ops' implementations and the eager autograd route
(``_torch_autograd``) launch through them too.

What the argument checks and the dispatch decide (the problem's sizes, the backend, the
workspace size) depends only on the call's signature: shapes, strides, dtypes, devices and
the scalar arguments. It is worked out once per signature, by the same code as every other
route, and kept, so that a decoding loop, which repeats a few signatures, pays per call only
for its allocations (torch's caching allocator), the current stream and the extension call.
That call's C++ layer checks shapes, dtypes, strides and pointer alignment again on every
launch. Signatures that fail a check are never kept: they raise on every call.

Imported only when torch tensors are used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Union

import torch
from torch import Tensor
from torch.utils.dlpack import to_dlpack

from ._build_info import load_extension
from ._dispatch import choose_backend, choose_backward_backend
from ._dropout import NO_DROPOUT, Dropout, launch_kwargs
from ._validate import ForwardProblem, validate_forward
from ._validate_backward import validate_backward
from ._validate_varlen import VarlenProblem
from .attention import forward_workspace_bytes


@dataclass(frozen=True)
class _Plan:
    """What the checks and the dispatch decided for one call signature."""

    problem: Union[ForwardProblem, VarlenProblem]
    backend_code: int
    workspace_bytes: int


#: Plans by call signature, forward and backward, fixed-length and variable-length (the key's
#: first item tells them apart); cleared when full (a model runs a handful
#: of signatures).
_plans: dict[tuple[Any, ...], _Plan] = {}
_MAX_PLANS = 256


def _layout(x: Optional[Tensor]) -> Any:
    return None if x is None else (x.shape, x.stride(), x.dtype, x.device)


def drawn_layout(q: Tensor) -> Any:
    """``_layout`` of the rng state a torch route draws for a call on ``q``
    (``_dropout.dropout_rng_state(q.device)``): contiguous int64 (2,) on q's device, so such a
    state passes the state's checks by construction."""
    return (torch.Size((2,)), (1,), torch.int64, q.device)


def _keep(key: tuple[Any, ...], plan: _Plan) -> None:
    if len(_plans) >= _MAX_PLANS:
        _plans.clear()
    _plans[key] = plan


_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _stream(device: int) -> int:
    return int(
        _raw_stream(device) if _raw_stream is not None
        else torch.cuda.current_stream(device).cuda_stream
    )


def _plan(
    q: Tensor, k: Tensor, v: Tensor, out: Optional[Tensor], causal: bool,
    softmax_scale: Optional[float], backend: Optional[str], window: tuple[int, int],
    softcap: float, alibi_slopes: Optional[Tensor], dropout_p: float = 0.0,
    dropout_rng_state: Optional[Tensor] = None,
) -> _Plan:
    ext = load_extension()  # a missing extension is reported before any argument
    problem = validate_forward(
        q, k, v, out, causal=causal, softmax_scale=softmax_scale, backend=backend,
        window=window, softcap=softcap, alibi_slopes=alibi_slopes, dropout_p=dropout_p,
        dropout_rng_state=dropout_rng_state,
    )
    capability = int(ext.device_capability(problem.device_id))
    code = choose_backend(
        backend, capability, headdim=problem.headdim, dtype=problem.dtype, headdim_v=problem.dv
    )
    workspace_bytes = 0 if problem.empty_output else forward_workspace_bytes(ext, problem, causal, code)
    return _Plan(problem, code, workspace_bytes)


def forward_plan(
    q: Tensor, k: Tensor, v: Tensor, out: Optional[Tensor], causal: bool,
    softmax_scale: Optional[float], backend: Optional[str], window: tuple[int, int],
    softcap: float, alibi_slopes: Optional[Tensor], dropout_p: float,
    dropout_rng_state: Optional[Tensor], *, to_draw: bool = False,
) -> _Plan:
    """The kept plan of a forward's call signature, checked on its first call (raises what
    the checks raise). ``to_draw``: the call will read a rng state not drawn yet; the drawn
    state's layout keys the plan, so that the call itself finds it."""
    state_layout = drawn_layout(q) if to_draw else _layout(dropout_rng_state)
    key = ("forward", _layout(q), _layout(k), _layout(v), _layout(out), causal, softmax_scale,
           backend, window, softcap, _layout(alibi_slopes), dropout_p, state_layout)
    plan = _plans.get(key)
    if plan is None:
        plan = _plan(q, k, v, out, causal, softmax_scale, backend, window, softcap, alibi_slopes,
                     dropout_p, dropout_rng_state)
        _keep(key, plan)
    return plan


def dropout_capsule(dropout: Dropout, rng_state: Optional[Tensor]) -> Any:
    """The rng state as the extension reads it, where the launch uses one."""
    return to_dlpack(rng_state) if dropout.active and rng_state is not None else None


def _capsule(x: Tensor) -> Any:
    # torch's C exporter (Tensor.__dlpack__ is Python code that also orders streams), given a
    # detached tensor as on every route: DLPack export refuses tensors that require grad, and
    # the direct route has no autograd to keep.
    return to_dlpack(x.detach() if x.requires_grad else x)


def _forward_buffers(
    q: Tensor, plan: _Plan, out: Optional[Tensor], return_lse: bool
) -> tuple[Tensor, Optional[Tensor], Optional[Tensor]]:
    """(out, lse, workspace) of a planned forward: out given or new, lse when asked for, the
    workspace when the plan needs one."""
    problem = plan.problem
    if out is None:
        out = q.new_empty(problem.out_shape)
    lse = q.new_empty(problem.lse_shape, dtype=torch.float32) if return_lse else None
    workspace = (
        q.new_empty((plan.workspace_bytes,), dtype=torch.uint8) if plan.workspace_bytes else None
    )
    return out, lse, workspace


def _gradient_buffers(
    q: Tensor, plan: _Plan, dq: Optional[Tensor], dk: Optional[Tensor], dv: Optional[Tensor]
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, workspace) of a planned backward: the given buffers or new tensors."""
    problem = plan.problem
    dq = q.new_empty(problem.q_shape) if dq is None else dq
    dk = q.new_empty(problem.kv_shape) if dk is None else dk
    dv = q.new_empty(problem.v_shape) if dv is None else dv
    return dq, dk, dv, q.new_empty((plan.workspace_bytes,), dtype=torch.uint8)


def attention(
    q: Tensor, k: Tensor, v: Tensor, *, causal: bool, softmax_scale: Optional[float],
    return_lse: bool, backend: Optional[str], out: Optional[Tensor] = None,
    window: tuple[int, int] = (-1, -1), softcap: float = 0.0,
    alibi_slopes: Optional[Tensor] = None, dropout: Dropout = NO_DROPOUT,
    dropout_rng_state: Optional[Tensor] = None,
) -> Any:
    """The output (``out`` when given; and lse) of a call nothing watches; scalar arguments
    already type-checked (``window`` as ``kernel_window`` returns it). With dropout the
    kernels take the explicit seed and offset, or read ``dropout_rng_state`` (drawn by the
    caller: this function draws nothing). Raises what ``attention_dlpack`` raises for the
    same arguments."""
    plan = forward_plan(q, k, v, out, causal, softmax_scale, backend, window, softcap,
                        alibi_slopes, dropout.p, dropout_rng_state)
    problem = plan.problem
    out, lse, workspace = _forward_buffers(q, plan, out, return_lse)
    if not problem.empty_output:
        ext = load_extension()
        ext.forward(
            _capsule(q), _capsule(k), _capsule(v), _capsule(out),
            to_dlpack(lse) if lse is not None else None, problem.scale, causal,
            plan.backend_code, _stream(problem.device_id),
            to_dlpack(workspace) if workspace is not None else None,
            problem.window_left, problem.window_right, problem.softcap,
            _capsule(alibi_slopes) if alibi_slopes is not None else None,
            **launch_kwargs(ext, dropout, dropout_capsule(dropout, dropout_rng_state)),
        )
    return (out, lse) if return_lse else out


def _backward_plan(
    tensors: tuple[Tensor, ...], grads: tuple[Optional[Tensor], ...], causal: bool,
    softmax_scale: Optional[float], deterministic: bool, backend: Optional[str],
    window: tuple[int, int], softcap: float, alibi_slopes: Optional[Tensor],
    dropout_p: float = 0.0, dropout_rng_state: Optional[Tensor] = None,
) -> _Plan:
    ext = load_extension()
    dq, dk, dv = grads
    problem = validate_backward(
        *tensors, dq=dq, dk=dk, dv=dv, causal=causal, softmax_scale=softmax_scale,
        deterministic=deterministic, backend=backend, window=window, softcap=softcap,
        alibi_slopes=alibi_slopes, dropout_p=dropout_p, dropout_rng_state=dropout_rng_state,
    )
    capability = int(ext.device_capability(problem.device_id))
    code = choose_backward_backend(
        backend, capability, headdim=problem.headdim, dtype=problem.dtype,
        deterministic=deterministic, headdim_v=problem.dv,
    )
    workspace_bytes = int(ext.backward_workspace_size(
        problem.batch, problem.seqlen_q, problem.seqlen_k, problem.nheads, problem.nheads_kv,
        problem.headdim, problem.dtype, deterministic, code, causal,
        problem.window_left, problem.window_right,
    ))
    return _Plan(problem, code, workspace_bytes)


def attention_backward(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, *, causal: bool,
    softmax_scale: Optional[float], deterministic: bool, backend: Optional[str],
    dq: Optional[Tensor] = None, dk: Optional[Tensor] = None, dv: Optional[Tensor] = None,
    window: tuple[int, int] = (-1, -1), softcap: float = 0.0,
    alibi_slopes: Optional[Tensor] = None, dropout: Dropout = NO_DROPOUT,
    dropout_rng_state: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of a backward call nothing watches: the given buffers or new tensors; with
    dropout, the forward's explicit seed and offset or its ``dropout_rng_state``.
    Raises what ``flashcute.backward.attention_backward`` raises for the same arguments."""
    tensors = (dout, q, k, v, out, lse)
    grads = (dq, dk, dv)
    key = (
        "backward", *(_layout(x) for x in tensors), *(_layout(g) for g in grads),
        causal, softmax_scale, deterministic, backend, window, softcap, _layout(alibi_slopes),
        dropout.p, _layout(dropout_rng_state),
    )
    plan = _plans.get(key)
    if plan is None:
        plan = _backward_plan(
            tensors, grads, causal, softmax_scale, deterministic, backend, window, softcap,
            alibi_slopes, dropout.p, dropout_rng_state,
        )
        _keep(key, plan)
    problem = plan.problem
    dq, dk, dv, workspace = _gradient_buffers(q, plan, dq, dk, dv)
    ext = load_extension()
    ext.backward(
        *(_capsule(x) for x in (*tensors, dq, dk, dv)), to_dlpack(workspace),
        problem.scale, causal, deterministic, plan.backend_code, _stream(problem.device_id),
        problem.window_left, problem.window_right, problem.softcap,
        _capsule(alibi_slopes) if alibi_slopes is not None else None,
        **launch_kwargs(ext, dropout, dropout_capsule(dropout, dropout_rng_state)),
    )
    return dq, dk, dv
