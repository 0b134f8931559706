"""The eager training route of ``flashcute.attention``: inputs that require grad, with nothing
but autograd watching (no compiler, tracer, tensor subclass, dispatch mode or functorch
transform; see ``_torch_ops.route``).

A ``torch.autograd.Function`` over the direct routes of the forward and the backward
(``_torch_direct``) records the same graph as the custom ops' autograd formula, without two
passes through torch's custom-op dispatch per training step (hundreds of microseconds of host
time at short sequences). Everything that traces or transforms the call still goes through the
custom ops (``_torch_ops``), which ``torch.compile`` and ``opcheck`` understand.

Imported only when torch tensors are used.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from . import _torch_direct
from ._dropout import NO_DROPOUT, Dropout
from ._torch_layout import kernel_layout


def save_options(
    ctx: Any, lse: Tensor, causal: bool, softmax_scale: Any, window: tuple[Any, Any],
    softcap: Any, deterministic: bool, backend: Optional[str], dropout: Dropout = NO_DROPOUT,
) -> None:
    """The forward's options on ``ctx`` for the backward (fixed-length and variable-length,
    eager and custom-op routes), lse marked non-differentiable. The dropout rng state, a
    tensor, is saved with the other tensors."""
    ctx.causal = causal
    ctx.softmax_scale = softmax_scale
    ctx.window = window
    ctx.softcap = softcap
    ctx.deterministic = deterministic
    ctx.dropout = dropout
    # A forward forced onto "hopper" differentiates with the default choice of backward.
    ctx.backend = None if backend == "hopper" else backend
    ctx.mark_non_differentiable(lse)


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, q: Tensor, k: Tensor, v: Tensor, causal: bool, softmax_scale: Optional[float],
        backend: Optional[str], deterministic: bool, window: tuple[int, int], softcap: float,
        alibi_slopes: Optional[Tensor], dropout: Dropout, dropout_rng_state: Optional[Tensor],
    ) -> tuple[Tensor, Tensor]:
        # dropout_rng_state: the state the route drew or was given; nothing is drawn here.
        out, lse = _torch_direct.attention(
            q, k, v, causal=causal, softmax_scale=softmax_scale, return_lse=True, backend=backend,
            window=window, softcap=softcap, alibi_slopes=alibi_slopes, dropout=dropout,
            dropout_rng_state=dropout_rng_state,
        )
        ctx.save_for_backward(q, k, v, out, lse, alibi_slopes, dropout_rng_state)
        save_options(ctx, lse, causal, softmax_scale, window, softcap, deterministic, backend,
                     dropout)
        return out, lse

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, dout: Tensor, _dlse: Optional[Tensor]) -> tuple[Any, ...]:  # type: ignore[override]
        q, k, v, out, lse, alibi_slopes, state = ctx.saved_tensors
        dq, dk, dv = _torch_direct.attention_backward(
            kernel_layout(dout), q, k, v, out, lse, causal=ctx.causal,
            softmax_scale=ctx.softmax_scale,
            deterministic=ctx.deterministic or torch.are_deterministic_algorithms_enabled(),
            backend=ctx.backend, window=ctx.window, softcap=ctx.softcap,
            alibi_slopes=alibi_slopes, dropout=ctx.dropout, dropout_rng_state=state,
        )
        return (dq, dk, dv) + (None,) * 9


def attention(
    q: Tensor, k: Tensor, v: Tensor, *, causal: bool, softmax_scale: Optional[float],
    backend: Optional[str], deterministic: bool = False, window: tuple[int, int] = (-1, -1),
    softcap: float = 0.0, alibi_slopes: Optional[Tensor] = None,
    dropout: Dropout = NO_DROPOUT, dropout_rng_state: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor]:
    """(out, lse) of a differentiable call; lse is not differentiable, nor are the ALiBi
    slopes. ``deterministic`` makes its backward bitwise reproducible (as
    ``torch.use_deterministic_algorithms`` does); the backward takes the forward's window,
    softcap, slopes and dropout mask (the explicit seed and offset, the given rng state, or
    the one drawn from torch's generator for this call, passed as ``dropout_rng_state``:
    nothing is drawn here)."""
    out, lse = _Attention.apply(
        q, k, v, causal, softmax_scale, backend, deterministic, window, softcap, alibi_slopes,
        dropout, dropout_rng_state,
    )
    return out, lse
