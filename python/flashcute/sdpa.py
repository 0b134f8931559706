"""``flashcute.sdpa``: flashcute behind torch's ``scaled_dot_product_attention`` signature.

SDPA's tensors are (..., heads, seqlen, headdim); flashcute's are (batch, seqlen, heads,
headdim) with any strides, so ``x.transpose(1, 2)`` hands SDPA's tensors to the kernel without
a copy. SDPA's ``is_causal`` is aligned top-left (query ``i`` sees key ``j`` iff ``j <= i``),
flashcute's ``causal`` bottom-right; ``_top_left`` builds the first from the second on views.

Imports torch only when called.
"""

from __future__ import annotations

import numbers
from typing import Any, Optional

from ._validate import check_scalars, type_name
from .attention import attention

_NAMES = ("query", "key", "value")


def sdpa(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: Optional[float] = None,
    enable_gqa: bool = False,
) -> Any:
    """``torch.nn.functional.scaled_dot_product_attention`` computed by flashcute.

    Same signature, layout and semantics as SDPA for what flashcute supports, so that
    ``F.scaled_dot_product_attention`` can be swapped for ``flashcute.sdpa``.

    Args:
        query: (..., nheads, seqlen_q, headdim) torch tensor, float16 or bfloat16, on a CUDA
            device; at least 3-d. Leading dimensions (``...``) are batch dimensions; more
            than one are merged (a view where their strides allow it).
        key, value: (..., nheads_kv, seqlen_k, headdim), query's dtype, device and leading
            dimensions (no broadcasting), and query's head dim.
        attn_mask: must be None: arbitrary masks are not supported (``NotImplementedError``);
            ``is_causal=True`` gives the causal mask.
        dropout_p: must be 0.0 (``NotImplementedError`` otherwise).
        is_causal: SDPA's causal mask, aligned top-left: query ``i`` attends key ``j`` iff
            ``j <= i``, also when ``seqlen_q != seqlen_k`` (``flashcute.attention``'s
            ``causal`` is aligned bottom-right instead).
        scale: multiplies ``query @ key^T``; default ``1/sqrt(headdim)``; must be positive.
        enable_gqa: allow ``nheads_kv < nheads`` (grouped-query attention, ``nheads`` a
            multiple of ``nheads_kv``; query head ``h`` uses key/value head
            ``h // (nheads // nheads_kv)``, as SDPA). Without it the head counts must match.

    No input is copied: ``flashcute.attention`` runs on transposed views, and on slices of
    them for a causal call with ``seqlen_q != seqlen_k``. (Several leading dimensions are merged
    into one batch dimension, which copies inputs whose strides do not allow a view.) Query rows that see no key occur
    only when ``seqlen_k == 0``; they give zeros, as SDPA's math backend does. Differentiable
    (torch autograd, ``torch.compile``) as ``flashcute.attention`` is.

    Returns:
        (..., nheads, seqlen_q, headdim), query's dtype: a transposed view of flashcute's
        (batch, seqlen_q, nheads, headdim) output, or for a causal call with
        ``seqlen_q > seqlen_k`` of the two parts it is computed in.

    Raises:
        NotImplementedError: ``attn_mask`` given or ``dropout_p`` nonzero.
        TypeError, ValueError: invalid arguments; messages name the argument.
        RuntimeError: no usable GPU, or a CUDA error.
    """
    _check_options(attn_mask, dropout_p, is_causal, scale, enable_gqa)
    _check_tensors(query, key, value, enable_gqa)
    q, k, v = (_kernel_view(x) for x in (query, key, value))
    out = _top_left(q, k, v, causal=is_causal, scale=scale)
    return _sdpa_view(out, query)


def _check_options(
    attn_mask: Any, dropout_p: Any, is_causal: Any, scale: Any, enable_gqa: Any
) -> None:
    if attn_mask is not None:
        raise NotImplementedError(
            "attn_mask: flashcute.sdpa does not take attention masks; pass attn_mask=None, and "
            "is_causal=True for a causal mask"
        )
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real):
        raise TypeError(f"dropout_p: expected a float, got {type_name(dropout_p)}")
    if dropout_p != 0.0:
        raise NotImplementedError(
            f"dropout_p: flashcute.sdpa does not take dropout; got {dropout_p}, pass 0.0 (or "
            f"call flashcute.attention with dropout_p)"
        )
    for name, flag in (("is_causal", is_causal), ("enable_gqa", enable_gqa)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name}: expected a bool, got {type_name(flag)}")
    try:  # flashcute's own check (type, float32 range), under SDPA's name for the argument
        check_scalars(False, scale, None)
    except (TypeError, ValueError) as exc:
        raise type(exc)(str(exc).replace("softmax_scale", "scale", 1)) from None


def _check_tensors(query: Any, key: Any, value: Any, enable_gqa: bool) -> None:
    """SDPA's shape rules, with SDPA's argument names (flashcute's own checks name q, k, v
    and see the transposed shapes)."""
    import torch

    for name, x in zip(_NAMES, (query, key, value)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type_name(x)}")
    if query.dim() < 3:
        raise ValueError(
            f"query: expected (..., nheads, seqlen, headdim) with at least 3 dimensions, got "
            f"shape {tuple(query.shape)}"
        )
    for name, x in (("key", key), ("value", value)):
        if x.dim() != query.dim() or x.shape[:-3] != query.shape[:-3]:
            raise ValueError(
                f"{name}: shape {tuple(x.shape)} does not match query's {tuple(query.shape)} in "
                "its leading (batch) dimensions; flashcute.sdpa does not broadcast them"
            )
        if x.shape[-1] != query.shape[-1]:
            raise ValueError(
                f"{name}: head dim {x.shape[-1]} differs from query's {query.shape[-1]}; "
                "flashcute.sdpa needs one head dim for query, key and value"
            )
    if value.shape != key.shape:
        raise ValueError(
            f"value: shape {tuple(value.shape)} does not match key's {tuple(key.shape)}"
        )
    nheads, nheads_kv = query.shape[-3], key.shape[-3]
    if not enable_gqa and nheads != nheads_kv:
        raise ValueError(
            f"enable_gqa: query has {nheads} heads and key/value {nheads_kv}; pass "
            "enable_gqa=True for grouped-query attention"
        )
    if (nheads_kv == 0 and nheads != 0) or (nheads_kv != 0 and nheads % nheads_kv != 0):
        raise ValueError(
            f"key: query's {nheads} heads are not a multiple of key/value's {nheads_kv} heads"
        )


def _kernel_view(x: Any) -> Any:
    """(batch, seqlen, heads, headdim) view of an SDPA-layout (..., heads, seqlen, headdim)
    tensor."""
    if x.dim() == 3:
        x = x.unsqueeze(0)
    elif x.dim() > 4:
        x = x.flatten(0, -4)
    return x.transpose(1, 2)


def _sdpa_view(out: Any, query: Any) -> Any:
    """flashcute's (batch, seqlen_q, heads, headdim) output in query's SDPA layout."""
    out = out.transpose(1, 2)
    if query.dim() == 3:
        return out.squeeze(0)
    if query.dim() > 4:
        return out.unflatten(0, query.shape[:-3])
    return out


def _top_left(q: Any, k: Any, v: Any, *, causal: bool, scale: Optional[float]) -> Any:
    """Attention with SDPA's top-left causal mask, from flashcute's bottom-right one.

    Query row ``i`` sees keys ``0..i``. For ``seqlen_q <= seqlen_k`` no row sees a key past
    ``seqlen_q - 1``, and on the first ``seqlen_q`` keys both alignments coincide. For
    ``seqlen_q > seqlen_k`` the first ``seqlen_k`` rows are a square causal problem and the
    others see every key.
    """
    seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    if not causal:
        return attention(q, k, v, softmax_scale=scale)
    if seqlen_q <= seqlen_k:
        return attention(q, k[:, :seqlen_q], v[:, :seqlen_q], causal=True, softmax_scale=scale)
    from . import _torch_ops

    if _torch_ops.route(q, k, v) == "direct":
        # Nothing records the call: both parts are written into one output, without a copy.
        out = q.new_empty(q.shape)
        attention(q[:, :seqlen_k], k, v, causal=True, softmax_scale=scale, out=out[:, :seqlen_k])
        attention(q[:, seqlen_k:], k, v, softmax_scale=scale, out=out[:, seqlen_k:])
        return out
    import torch

    square = attention(q[:, :seqlen_k], k, v, causal=True, softmax_scale=scale)
    rest = attention(q[:, seqlen_k:], k, v, softmax_scale=scale)
    return torch.cat([square, rest], dim=1)
