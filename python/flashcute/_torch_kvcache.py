"""The torch routes of ``flashcute.attention_with_kvcache`` and
``flashcute.merge_attention_states``: the custom ops ``flashcute::attention_with_kvcache``,
``flashcute::attention_with_kvcache_out`` (both declare k_cache and v_cache mutated, the
second out too) and ``flashcute::merge_attention_states``, with fake implementations that run
the real checks, for ``torch.compile`` and other transforms; and the direct launch for calls
nothing watches, which keeps what the checks and the library's plan decided per call
signature (as ``_torch_direct`` does).

Nothing here reads a tensor's values on the host or synchronizes, and every buffer (outputs,
the split-KV workspace) comes from torch's allocator on the current stream: calls capture in
CUDA graphs. Neither operation is differentiable: results never require grad.

Imported only when torch tensors are used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Union

import torch
from torch import Tensor
from torch.utils.dlpack import to_dlpack

from . import _torch_ops
from ._torch_direct import _capsule, _layout, _stream
from ._validate_kvcache import (
    KVCacheProblem,
    MergeProblem,
    kvcache_problem,
    merge_problem,
    validate_kvcache,
    validate_merge,
)
from .kvcache import backend_code, kvcache_extension, kvcache_plan, merge_extension


@dataclass(frozen=True)
class _KVCachePlan:
    """What the checks and the library's plan decided for one call signature."""

    problem: KVCacheProblem
    backend_code: int
    num_splits: int
    workspace_bytes: int


#: Plans by call signature (KV-cache calls and merges); cleared when full.
_plans: dict[tuple[Any, ...], Union["_KVCachePlan", MergeProblem]] = {}
_MAX_PLANS = 256


def _keep(key: tuple[Any, ...], plan: Union["_KVCachePlan", MergeProblem]) -> None:
    if len(_plans) >= _MAX_PLANS:
        _plans.clear()
    _plans[key] = plan


def _optional_capsule(x: Optional[Tensor]) -> Any:
    return None if x is None else _capsule(x)


def forward_plan(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, cache_seqlens: Tensor,
    page_table: Optional[Tensor], k_new: Optional[Tensor], v_new: Optional[Tensor],
    cu_seqlens_q: Optional[Tensor], max_seqlen_q: Optional[int], out: Optional[Tensor],
    causal: bool, softmax_scale: Optional[float], window: tuple[int, int], softcap: float,
    alibi_slopes: Optional[Tensor], num_splits: int, backend: Optional[str],
) -> _KVCachePlan:
    """The kept plan of a call signature, checked on its first call (raises what the checks
    raise)."""
    key = ("kvcache", *(_layout(x) for x in (q, k_cache, v_cache, cache_seqlens, page_table,
                                             k_new, v_new, cu_seqlens_q, out, alibi_slopes)),
           max_seqlen_q, causal, softmax_scale, window, softcap, num_splits, backend)
    plan = _plans.get(key)
    if not isinstance(plan, _KVCachePlan):
        problem = validate_kvcache(
            q, k_cache, v_cache, cache_seqlens=cache_seqlens, page_table=page_table,
            k_new=k_new, v_new=v_new, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q,
            causal=causal, softmax_scale=softmax_scale, window=window, softcap=softcap,
            alibi_slopes=alibi_slopes, num_splits=num_splits, out=out, backend=backend,
        )
        ext = kvcache_extension()
        code = backend_code(ext, backend)
        splits, nbytes = kvcache_plan(ext, problem, causal, code) if problem.launches else (1, 0)
        plan = _KVCachePlan(problem, code, splits, nbytes)
        _keep(key, plan)
    return plan


def forward(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, *, cache_seqlens: Tensor,
    page_table: Optional[Tensor], k_new: Optional[Tensor], v_new: Optional[Tensor],
    cu_seqlens_q: Optional[Tensor], max_seqlen_q: Optional[int], causal: bool,
    softmax_scale: Optional[float], window: tuple[int, int], softcap: float,
    alibi_slopes: Optional[Tensor], num_splits: int, return_lse: bool,
    out: Optional[Tensor], backend: Optional[str],
) -> Any:
    """The direct launch: the output (``out`` when given; and lse), scalar arguments already
    checked (``window`` as ``kernel_window`` returns it)."""
    plan = forward_plan(q, k_cache, v_cache, cache_seqlens, page_table, k_new, v_new,
                        cu_seqlens_q, max_seqlen_q, out, causal, softmax_scale, window, softcap,
                        alibi_slopes, num_splits, backend)
    problem = plan.problem
    if out is None:
        out = q.new_empty(problem.out_shape)
    lse = q.new_empty(problem.lse_shape, dtype=torch.float32) if return_lse else None
    if problem.launches:
        workspace = (torch.empty((plan.workspace_bytes,), dtype=torch.uint8, device=q.device)
                     if plan.workspace_bytes > 0 else None)
        kvcache_extension().kvcache_forward(
            _capsule(q), _capsule(k_cache), _capsule(v_cache), _capsule(out),
            _optional_capsule(lse), to_dlpack(cache_seqlens), _optional_capsule(page_table),
            _optional_capsule(k_new), _optional_capsule(v_new), _optional_capsule(cu_seqlens_q),
            problem.seqlen_q, problem.scale, causal, problem.window_left, problem.window_right,
            problem.softcap, _optional_capsule(alibi_slopes), plan.num_splits,
            _optional_capsule(workspace), plan.backend_code, _stream(problem.device_id),
        )
    return (out, lse) if return_lse else out


# ---------------------------------------------------------------------------------------------
# The custom ops.


def _fake_problem(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, cache_seqlens: Tensor,
    page_table: Optional[Tensor], k_new: Optional[Tensor], v_new: Optional[Tensor],
    cu_seqlens_q: Optional[Tensor], max_seqlen_q: Optional[int], out: Optional[Tensor],
    causal: bool, softmax_scale: Any, window_left: Any, window_right: Any, softcap: Any,
    alibi_slopes: Optional[Tensor], num_splits: Any, backend: Optional[str],
) -> KVCacheProblem:
    """The real call's checks, run while tracing (device checks only on CUDA inputs). Scalars
    are read as Python numbers: torch.compile may hand symbolic ones, and reading them
    specializes the graph to their values, which the checks need."""
    problem, infos = kvcache_problem(
        q, k_cache, v_cache, cache_seqlens=cache_seqlens, page_table=page_table, k_new=k_new,
        v_new=v_new, cu_seqlens_q=cu_seqlens_q,
        max_seqlen_q=None if max_seqlen_q is None else int(max_seqlen_q), causal=causal,
        softmax_scale=float(softmax_scale), window=(int(window_left), int(window_right)),
        softcap=float(softcap), alibi_slopes=alibi_slopes, num_splits=int(num_splits), out=out,
        backend=backend,
    )
    _torch_ops._fake_device_checks(q, infos, lambda capability: None)
    return problem


@torch.library.custom_op("flashcute::attention_with_kvcache", mutates_args=("k_cache", "v_cache"))
def attention_with_kvcache_op(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, cache_seqlens: Tensor,
    page_table: Optional[Tensor], k_new: Optional[Tensor], v_new: Optional[Tensor],
    cu_seqlens_q: Optional[Tensor], max_seqlen_q: Optional[int], causal: bool,
    softmax_scale: float, window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
    alibi_slopes: Optional[Tensor] = None, num_splits: int = 0, backend: Optional[str] = None,
) -> tuple[Tensor, Tensor]:
    """(out, lse) of ``flashcute.attention_with_kvcache``; appends k_new and v_new into the
    cache when given (k_cache and v_cache are declared mutated either way)."""
    result, lse = forward(
        q, k_cache, v_cache, cache_seqlens=cache_seqlens, page_table=page_table, k_new=k_new,
        v_new=v_new, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q, causal=causal,
        softmax_scale=softmax_scale, window=(window_left, window_right), softcap=softcap,
        alibi_slopes=alibi_slopes, num_splits=num_splits, return_lse=True, out=None,
        backend=backend,
    )
    return result, lse


@attention_with_kvcache_op.register_fake
def _(q: Tensor, k_cache: Tensor, v_cache: Tensor, cache_seqlens: Tensor,
      page_table: Optional[Tensor], k_new: Optional[Tensor], v_new: Optional[Tensor],
      cu_seqlens_q: Optional[Tensor], max_seqlen_q: Optional[int], causal: bool,
      softmax_scale: float, window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
      alibi_slopes: Optional[Tensor] = None, num_splits: int = 0,
      backend: Optional[str] = None) -> tuple[Tensor, Tensor]:
    problem = _fake_problem(q, k_cache, v_cache, cache_seqlens, page_table, k_new, v_new,
                            cu_seqlens_q, max_seqlen_q, None, causal, softmax_scale, window_left,
                            window_right, softcap, alibi_slopes, num_splits, backend)
    return q.new_empty(problem.out_shape), q.new_empty(problem.lse_shape, dtype=torch.float32)


@torch.library.custom_op("flashcute::attention_with_kvcache_out",
                         mutates_args=("k_cache", "v_cache", "out"))
def attention_with_kvcache_out_op(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, out: Tensor, cache_seqlens: Tensor,
    page_table: Optional[Tensor], k_new: Optional[Tensor], v_new: Optional[Tensor],
    cu_seqlens_q: Optional[Tensor], max_seqlen_q: Optional[int], causal: bool,
    softmax_scale: float, window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
    alibi_slopes: Optional[Tensor] = None, num_splits: int = 0, backend: Optional[str] = None,
) -> Tensor:
    """Writes ``flashcute.attention_with_kvcache``'s output into ``out`` and returns lse."""
    _, lse = forward(
        q, k_cache, v_cache, cache_seqlens=cache_seqlens, page_table=page_table, k_new=k_new,
        v_new=v_new, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q, causal=causal,
        softmax_scale=softmax_scale, window=(window_left, window_right), softcap=softcap,
        alibi_slopes=alibi_slopes, num_splits=num_splits, return_lse=True, out=out,
        backend=backend,
    )
    return lse


@attention_with_kvcache_out_op.register_fake
def _(q: Tensor, k_cache: Tensor, v_cache: Tensor, out: Tensor, cache_seqlens: Tensor,
      page_table: Optional[Tensor], k_new: Optional[Tensor], v_new: Optional[Tensor],
      cu_seqlens_q: Optional[Tensor], max_seqlen_q: Optional[int], causal: bool,
      softmax_scale: float, window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
      alibi_slopes: Optional[Tensor] = None, num_splits: int = 0,
      backend: Optional[str] = None) -> Tensor:
    problem = _fake_problem(q, k_cache, v_cache, cache_seqlens, page_table, k_new, v_new,
                            cu_seqlens_q, max_seqlen_q, out, causal, softmax_scale, window_left,
                            window_right, softcap, alibi_slopes, num_splits, backend)
    return q.new_empty(problem.lse_shape, dtype=torch.float32)


# ---------------------------------------------------------------------------------------------
# Routing.


def _scale(q: Tensor, softmax_scale: Optional[float]) -> float:
    return _torch_ops._scale(q, softmax_scale)


def _needs_no_grad(tensors: list[Tensor]) -> bool:
    return torch.is_grad_enabled() and any(x.requires_grad for x in tensors)


def attention_with_kvcache(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, *, cache_seqlens: Tensor,
    page_table: Optional[Tensor], k_new: Optional[Tensor], v_new: Optional[Tensor],
    cu_seqlens_q: Optional[Tensor], max_seqlen_q: Optional[int], causal: bool,
    softmax_scale: Optional[float], window: tuple[int, int], softcap: float,
    alibi_slopes: Optional[Tensor], num_splits: int, return_lse: bool,
    out: Optional[Tensor], backend: Optional[str],
) -> Any:
    """The front door's torch route (scalar arguments already checked): the custom ops where
    a compiler, tracer, subclass, dispatch mode or functorch transform may watch
    (``_torch_ops.watched``), else the direct launch. Inputs that require grad are read
    without autograd: the results never require grad."""
    tensors = [x for x in (q, k_cache, v_cache, cache_seqlens, page_table, k_new, v_new,
                           cu_seqlens_q, alibi_slopes, out) if x is not None]
    if not _torch_ops.watched(*tensors):
        return forward(
            q, k_cache, v_cache, cache_seqlens=cache_seqlens, page_table=page_table,
            k_new=k_new, v_new=v_new, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q,
            causal=causal, softmax_scale=softmax_scale, window=window, softcap=softcap,
            alibi_slopes=alibi_slopes, num_splits=num_splits, return_lse=return_lse, out=out,
            backend=backend,
        )
    args = (cache_seqlens, page_table, k_new, v_new, cu_seqlens_q, max_seqlen_q, causal,
            _scale(q, softmax_scale), window[0], window[1], softcap, alibi_slopes, num_splits,
            backend)
    if _needs_no_grad(tensors):
        with torch.no_grad():
            return _call_op(q, k_cache, v_cache, out, args, return_lse)
    return _call_op(q, k_cache, v_cache, out, args, return_lse)


def _call_op(q: Tensor, k_cache: Tensor, v_cache: Tensor, out: Optional[Tensor],
             args: tuple[Any, ...], return_lse: bool) -> Any:
    if out is not None:
        lse = attention_with_kvcache_out_op(q, k_cache, v_cache, out, *args)
        return (out, lse) if return_lse else out
    result, lse = attention_with_kvcache_op(q, k_cache, v_cache, *args)
    return (result, lse) if return_lse else result


# ---------------------------------------------------------------------------------------------
# merge_attention_states


def _merge_plan(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor) -> MergeProblem:
    """The kept checks of a merge's call signature."""
    key = ("merge", *(_layout(x) for x in (out_a, lse_a, out_b, lse_b)))
    problem = _plans.get(key)
    if not isinstance(problem, MergeProblem):
        problem = validate_merge(out_a, lse_a, out_b, lse_b)
        _keep(key, problem)
    return problem


def merge_direct(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor) -> tuple[Tensor, Tensor]:
    """The direct launch of ``merge_attention_states``: out from ``torch.empty_like(out_a)``,
    a new float32 lse."""
    problem = _merge_plan(out_a, lse_a, out_b, lse_b)
    out = torch.empty_like(out_a, requires_grad=False)
    lse = torch.empty(problem.lse_shape, dtype=torch.float32, device=out_a.device)
    if not problem.empty:
        views = [out_a, lse_a, out_b, lse_b, out, lse]
        if problem.packed:
            views = [x.unsqueeze(0) for x in views]
        merge_extension().merge_states(*(_capsule(x) for x in views),
                                       _stream(problem.device_id))
    return out, lse


@torch.library.custom_op("flashcute::merge_attention_states", mutates_args=())
def merge_attention_states_op(
    out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor
) -> tuple[Tensor, Tensor]:
    """(out, lse) of ``flashcute.merge_attention_states``."""
    return merge_direct(out_a, lse_a, out_b, lse_b)


@merge_attention_states_op.register_fake
def _(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor) -> tuple[Tensor, Tensor]:
    problem, infos = merge_problem(out_a, lse_a, out_b, lse_b)
    _torch_ops._fake_device_checks(out_a, infos, lambda capability: None)
    return (torch.empty_like(out_a),
            out_a.new_empty(problem.lse_shape, dtype=torch.float32))


def merge_attention_states(
    out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor
) -> tuple[Tensor, Tensor]:
    """The torch route of ``merge_attention_states``: the custom op where something watches,
    else the direct launch; never differentiable."""
    tensors = [out_a, lse_a, out_b, lse_b]
    if not _torch_ops.watched(*tensors):
        return merge_direct(out_a, lse_a, out_b, lse_b)
    if _needs_no_grad(tensors):
        with torch.no_grad():
            return merge_attention_states_op(out_a, lse_a, out_b, lse_b)
    return merge_attention_states_op(out_a, lse_a, out_b, lse_b)
