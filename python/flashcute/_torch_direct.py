"""The direct torch route of ``flashcute.attention``: calls that nothing watches (see
``_torch_ops._needs_custom_op``) launch the kernel without the custom op.

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
from typing import Any, Optional

import torch
from torch import Tensor
from torch.utils.dlpack import to_dlpack

from ._build_info import load_extension
from ._dispatch import choose_backend
from ._validate import ForwardProblem, validate_forward
from .attention import forward_workspace_bytes


@dataclass(frozen=True)
class _Plan:
    """What the checks and the dispatch decided for one call signature."""

    problem: ForwardProblem
    backend_code: int
    workspace_bytes: int


#: Plans by call signature; cleared when full (a model runs a handful of signatures).
_plans: dict[tuple[Any, ...], _Plan] = {}
_MAX_PLANS = 256

_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _signature(
    q: Tensor, k: Tensor, v: Tensor, out: Optional[Tensor], causal: bool,
    softmax_scale: Optional[float], backend: Optional[str],
) -> tuple[Any, ...]:
    return (
        q.shape, q.stride(), q.dtype, q.device,
        k.shape, k.stride(), k.dtype, k.device,
        v.shape, v.stride(), v.dtype, v.device,
        None if out is None else (out.shape, out.stride(), out.dtype, out.device),
        causal, softmax_scale, backend,
    )


def _plan(
    q: Tensor, k: Tensor, v: Tensor, out: Optional[Tensor], causal: bool,
    softmax_scale: Optional[float], backend: Optional[str],
) -> _Plan:
    ext = load_extension()  # a missing extension is reported before any argument
    problem = validate_forward(
        q, k, v, out, causal=causal, softmax_scale=softmax_scale, backend=backend
    )
    capability = int(ext.device_capability(problem.device_id))
    code = choose_backend(backend, capability, headdim=problem.headdim, dtype=problem.dtype)
    workspace_bytes = 0 if problem.empty_output else forward_workspace_bytes(ext, problem, causal, code)
    return _Plan(problem, code, workspace_bytes)


def _capsule(x: Tensor) -> Any:
    # torch's C exporter (Tensor.__dlpack__ is Python code that also orders streams), given a
    # detached tensor as on every route: DLPack export refuses tensors that require grad, and
    # the direct route has no autograd to keep.
    return to_dlpack(x.detach() if x.requires_grad else x)


def attention(
    q: Tensor, k: Tensor, v: Tensor, *, causal: bool, softmax_scale: Optional[float],
    return_lse: bool, backend: Optional[str], out: Optional[Tensor] = None,
) -> Any:
    """The output (``out`` when given; and lse) of a call nothing watches; scalar arguments
    already type-checked. Raises what ``attention_dlpack`` raises for the same arguments."""
    key = _signature(q, k, v, out, causal, softmax_scale, backend)
    plan = _plans.get(key)
    if plan is None:
        plan = _plan(q, k, v, out, causal, softmax_scale, backend)
        if len(_plans) >= _MAX_PLANS:
            _plans.clear()
        _plans[key] = plan
    problem = plan.problem
    if out is None:
        out = q.new_empty(problem.out_shape)
    lse = q.new_empty(problem.lse_shape, dtype=torch.float32) if return_lse else None
    if not problem.empty_output:
        workspace = (
            q.new_empty((plan.workspace_bytes,), dtype=torch.uint8) if plan.workspace_bytes else None
        )
        device = problem.device_id
        stream = (
            _raw_stream(device) if _raw_stream is not None
            else torch.cuda.current_stream(device).cuda_stream
        )
        load_extension().forward(
            _capsule(q), _capsule(k), _capsule(v), _capsule(out),
            to_dlpack(lse) if lse is not None else None, problem.scale, causal,
            plan.backend_code, int(stream), to_dlpack(workspace) if workspace is not None else None,
        )
    return (out, lse) if return_lse else out
