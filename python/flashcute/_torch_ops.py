"""torch.library custom ops ``flashcute::attention_forward`` / ``flashcute::attention_backward``
and the autograd formula that ties them, so that ``flashcute.attention`` on torch tensors is
differentiable and traceable by ``torch.compile`` (fake implementations give output shapes)
and capturable in CUDA graphs (all work on the current stream, memory from torch's allocator).

Also the routing of the front door's torch calls (``route``): the custom ops where a compiler,
tracer, subclass, dispatch mode or functorch transform may watch, the eager autograd route
(``_torch_autograd``) where only autograd does, else the direct route (``_torch_direct``).

Imported only when torch tensors are used.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
from torch import Tensor

from . import _torch_autograd, _torch_direct
from ._torch_layout import kernel_layout


def _check_fake_shapes(q: Tensor, k: Tensor, v: Tensor) -> None:
    """The shape rules the fake implementation can check without reading data."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dim() != 4:
            raise ValueError(
                f"{name}: expected a 4-d tensor (batch, seqlen, nheads, headdim), "
                f"got shape {tuple(x.shape)}"
            )
    if k.shape != v.shape or k.shape[0] != q.shape[0] or k.shape[3] != q.shape[3]:
        raise ValueError(
            f"q, k, v: shapes {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)} do not match"
        )


@torch.library.custom_op("flashcute::attention_forward", mutates_args=())
def attention_forward(
    q: Tensor, k: Tensor, v: Tensor, causal: bool, softmax_scale: float, backend: Optional[str]
) -> tuple[Tensor, Tensor]:
    """(out, lse) of flashcute's forward; out is contiguous (batch, seqlen_q, nheads, headdim)."""
    return _torch_direct.attention(
        q, k, v, causal=causal, softmax_scale=softmax_scale, return_lse=True, backend=backend
    )


@attention_forward.register_fake
def _(q: Tensor, k: Tensor, v: Tensor, causal: bool, softmax_scale: float,
      backend: Optional[str]) -> tuple[Tensor, Tensor]:
    _check_fake_shapes(q, k, v)
    batch, seqlen_q, nheads, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((batch, nheads, seqlen_q), dtype=torch.float32)


@torch.library.custom_op("flashcute::attention_backward", mutates_args=())
def attention_backward(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, causal: bool,
    softmax_scale: float, deterministic: bool, backend: Optional[str],
) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of flashcute's backward, each contiguous."""
    return _torch_direct.attention_backward(
        kernel_layout(dout), q, k, v, out, lse, causal=causal, softmax_scale=softmax_scale,
        deterministic=deterministic, backend=backend,
    )


@attention_backward.register_fake
def _(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, causal: bool,
      softmax_scale: float, deterministic: bool,
      backend: Optional[str]) -> tuple[Tensor, Tensor, Tensor]:
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor]) -> None:
    q, k, v, causal, softmax_scale, backend = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.causal = causal
    ctx.softmax_scale = softmax_scale
    # A forward forced onto "hopper" differentiates with the default choice: the Hopper
    # backward where this build has it for the head dim (and deterministic is off), else the
    # Ampere one.
    ctx.backend = None if backend == "hopper" else backend
    ctx.mark_non_differentiable(lse)


def _backward(ctx: Any, dout: Tensor, _dlse: Optional[Tensor]) -> tuple[Any, ...]:
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = attention_backward(
        dout, q, k, v, out, lse, ctx.causal, ctx.softmax_scale,
        torch.are_deterministic_algorithms_enabled(), ctx.backend,
    )
    return dq, dk, dv, None, None, None


attention_forward.register_autograd(_backward, setup_context=_setup_context)


_dispatch_modes = getattr(torch._C, "_len_torch_dispatch_stack", None)
_functorch_active = getattr(torch._C, "_are_functorch_transforms_active", None)


def watched(*tensors: Tensor) -> bool:
    """Whether a compiler or tracer, a tensor subclass, a dispatch mode or a functorch
    transform may watch a call on these tensors (autograd aside)."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return True
    if torch.overrides.has_torch_function(tensors):
        return True
    if _dispatch_modes is None or _dispatch_modes() != 0:
        return True
    return _functorch_active is None or bool(_functorch_active())


def route(*tensors: Tensor) -> str:
    """How a call on these tensors runs: "custom_op" where something other than autograd may
    watch it (see ``watched``), "autograd" where only autograd does (an input requires grad),
    else "direct" (the kernel is called without either).

    Calling the kernels without the custom ops saves their dispatch (a training step's host
    time halves at short sequences)."""
    if watched(*tensors):
        return "custom_op"
    if torch.is_grad_enabled() and any(x.requires_grad for x in tensors):
        return "autograd"
    return "direct"


def attention(
    q: Tensor, k: Tensor, v: Tensor, *, causal: bool, softmax_scale: Optional[float],
    return_lse: bool, backend: Optional[str], out: Optional[Tensor] = None,
) -> Any:
    """The front door's torch route (arguments already type-checked). Calls with ``out`` are
    not differentiable (the front door refused inputs that require grad); where something
    watches one, it takes the generic DLPack route instead of the custom op."""
    if out is not None:
        if route(q, k, v, out) != "direct":
            from .attention import attention_dlpack

            return attention_dlpack(
                q, k, v, causal=causal, softmax_scale=softmax_scale, return_lse=return_lse,
                out=out, backend=backend,
            )
    elif q.dim() == 4:
        how = route(q, k, v)
        if how == "custom_op":
            scale = 1.0 / math.sqrt(q.shape[-1]) if softmax_scale is None else float(softmax_scale)
            result, lse = attention_forward(q, k, v, causal, scale, backend)
            return (result, lse) if return_lse else result
        if how == "autograd":
            result, lse = _torch_autograd.attention(
                q, k, v, causal=causal, softmax_scale=softmax_scale, backend=backend
            )
            return (result, lse) if return_lse else result
    return _torch_direct.attention(
        q, k, v, causal=causal, softmax_scale=softmax_scale, return_lse=return_lse,
        backend=backend, out=out,
    )
