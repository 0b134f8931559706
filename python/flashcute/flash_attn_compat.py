"""``flashcute.flash_attn_func`` and ``flashcute.flash_attn_varlen_func``: FlashAttention-2's
``flash_attn_func`` and ``flash_attn_varlen_func`` on flashcute.

FlashAttention's layout is flashcute's, (batch, seqlen, heads, headdim), and its causal mask,
sliding window, softcap and ALiBi slopes are flashcute's (bottom-right aligned), so the call
maps over directly; only FlashAttention's reading of window bounds (``_window``) is translated.
``dropout_p`` is FlashAttention's: applied whenever it is nonzero (callers pass 0.0 in
evaluation), with a seed and offset drawn from torch's CUDA generator on every call.
Arguments for features flashcute lacks are checked in ``_refuse_unsupported``, which keeps
their default values working.
"""

from __future__ import annotations

import numbers
from typing import Any, Optional, Sequence

from ._dropout import check_dropout_p
from ._frameworks import _loaded_class
from ._validate import type_name
from .attention import attention
from .varlen import attention_varlen


def flash_attn_func(
    q: Any,
    k: Any,
    v: Any,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Any = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    qv: Any = None,
    q_descale: Any = None,
    k_descale: Any = None,
    v_descale: Any = None,
    attention_chunk: int = 0,
    num_splits: Any = None,
    pack_gqa: Any = None,
    sm_margin: Any = None,
) -> Any:
    """FlashAttention-2's ``flash_attn_func``, computed by ``flashcute.attention``.

    Positional order and defaults are FlashAttention-2's; FlashAttention-3's extra arguments
    are accepted as keywords.

    Args:
        q: (batch, seqlen_q, nheads, headdim), float16 or bfloat16, on a CUDA device.
        k, v: (batch, seqlen_k, nheads_kv, headdim); nheads a multiple of nheads_kv.
        dropout_p: dropout probability on the attention weights, in [0, 1) (0.0: none), as
            ``flashcute.attention``'s; torch calls draw its seed and offset from torch's CUDA
            generator.
        softmax_scale: default 1/sqrt(headdim).
        causal: bottom-right aligned causal mask, as FlashAttention (and flashcute).
        window_size: (left, right) sliding window, as FlashAttention: query ``i`` attends key
            ``j`` iff ``i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q +
            right``; a negative bound, or one of at least seqlen_k, is no bound; ``causal``
            sets the right bound to 0.
        softcap: when > 0, scores ``s = softmax_scale * q . k`` become
            ``softcap * tanh(s / softcap)`` before the softmax.
        alibi_slopes: None, or float32 (nheads,) or (batch, nheads) on q's device: the score
            of query ``i`` and key ``j`` gains ``-slope * |i + seqlen_k - seqlen_q - j|``
            (after the softcap), as in FlashAttention.
        deterministic: bitwise reproducible backward (torch autograd).
        return_attn_probs: also return the log-sum-exp, as FlashAttention-2 does; see Returns.
        qv, q_descale, k_descale, v_descale: FlashAttention-3 features; must be None.
        attention_chunk: FlashAttention-3 chunked attention; must be 0.
        num_splits, pack_gqa, sm_margin: FlashAttention-3 scheduling hints; accepted and
            not used (flashcute schedules on its own; results do not depend on them).

    Returns:
        out (batch, seqlen_q, nheads, headdim); with ``return_attn_probs=True`` the tuple
        ``(out, softmax_lse, None)``: softmax_lse float32 (batch, nheads, seqlen_q), natural
        log, as FlashAttention-2's; the attention probabilities are never formed, so the third
        element, FlashAttention-2's dropout-masked probabilities (meant for its tests), is None
        (``flashcute.testing.dropout_keep_mask`` gives a mask for a known seed and offset).

    Raises:
        NotImplementedError: an argument asks for a feature flashcute lacks; the message
            names it.
        TypeError, ValueError: invalid arguments (as ``flashcute.attention``).
    """
    if not isinstance(return_attn_probs, bool):
        raise TypeError(f"return_attn_probs: expected a bool, got {type_name(return_attn_probs)}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal: expected a bool, got {type_name(causal)}")
    _refuse_unsupported(
        qv=qv, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
        attention_chunk=attention_chunk,
    )
    dropout_p = _dropout_for(q, dropout_p)
    shape = getattr(k, "shape", None)  # anything else fails flashcute.attention's checks
    seqlen_k = int(shape[1]) if shape is not None and len(shape) == 4 else None
    window = _window(window_size, seqlen_k=seqlen_k)
    result = attention(
        # A right bound of 0 is the causal mask's; with causal=True the call takes exactly the
        # causal path, (-1, 0) included.
        q, k, v, causal=causal or window[1] == 0, softmax_scale=softmax_scale, window=window,
        softcap=softcap, alibi_slopes=alibi_slopes, dropout_p=dropout_p,
        return_lse=return_attn_probs, deterministic=deterministic,
    )
    if return_attn_probs:
        out, lse = result
        return out, lse, None
    return result


def flash_attn_varlen_func(
    q: Any,
    k: Any,
    v: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Any = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    block_table: Any = None,
    *,
    seqused_q: Any = None,
    seqused_k: Any = None,
) -> Any:
    """FlashAttention-2's ``flash_attn_varlen_func``, computed by ``flashcute.attention_varlen``.

    Positional order and defaults are FlashAttention-2's; FlashAttention-3's ``seqused_q``
    and ``seqused_k`` are accepted as keywords.

    Args:
        q: (total_q, nheads, headdim), float16 or bfloat16, on a CUDA device.
        k, v: (total_k, nheads_kv, headdim); nheads a multiple of nheads_kv.
        cu_seqlens_q, cu_seqlens_k: int32 (batch + 1,) offsets of the sequences' rows.
        max_seqlen_q, max_seqlen_k: the longest sequences' lengths.
        dropout_p: as in ``flash_attn_func``. block_table, seqused_q: must be None.
        softmax_scale, causal, softcap, alibi_slopes, deterministic: as in ``flash_attn_func``,
            per sequence (alibi_slopes (nheads,) or (batch, nheads) float32, a row per
            sequence).
        window_size: (left, right) as in ``flash_attn_func``; a negative bound, or one of at
            least max_seqlen_k, is no bound (FlashAttention's reading for packed batches).
        return_attn_probs: also return the log-sum-exp; see Returns.
        seqused_k: optional int32 (batch,): sequence ``b`` uses only its first ``seqused_k[b]``
            keys.

    Returns:
        out (total_q, nheads, headdim); with ``return_attn_probs=True`` the tuple
        ``(out, softmax_lse, None)``, softmax_lse float32 (nheads, total_q) as
        FlashAttention-2's.

    Raises:
        NotImplementedError: an argument asks for a feature flashcute lacks; the message
            names it.
        TypeError, ValueError: invalid arguments (as ``flashcute.attention_varlen``).
    """
    if not isinstance(return_attn_probs, bool):
        raise TypeError(f"return_attn_probs: expected a bool, got {type_name(return_attn_probs)}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal: expected a bool, got {type_name(causal)}")
    _refuse_unsupported(qv=None, q_descale=None, k_descale=None, v_descale=None, attention_chunk=0)
    dropout_p = _dropout_for(q, dropout_p)
    for name, value in (("block_table", block_table), ("seqused_q", seqused_q)):
        if value is not None:
            raise NotImplementedError(f"{name}: flashcute does not support {name} yet; pass None")
    bound = max_seqlen_k if isinstance(max_seqlen_k, numbers.Integral) else None
    window = _window(window_size, seqlen_k=bound)
    result = attention_varlen(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k=seqused_k,
        causal=causal or window[1] == 0, softmax_scale=softmax_scale, window=window,
        softcap=softcap, alibi_slopes=alibi_slopes, dropout_p=dropout_p,
        return_lse=return_attn_probs, deterministic=deterministic,
    )
    if return_attn_probs:
        out, lse = result
        return out, lse, None
    return result


def _dropout_for(q: Any, dropout_p: Any) -> float:
    """``dropout_p`` checked; nonzero only for torch tensors, whose generator gives the seed
    (these functions take no seed: other arrays call ``flashcute.attention`` with one)."""
    dropout_p = check_dropout_p(dropout_p)
    torch_tensor = _loaded_class("torch", "Tensor")
    if dropout_p > 0.0 and (torch_tensor is None or not isinstance(q, torch_tensor)):
        raise ValueError(
            f"dropout_p: {dropout_p} needs torch tensors here (the seed comes from torch's "
            f"generator); for {type_name(q)} call flashcute.attention with dropout_seed and "
            f"dropout_offset"
        )
    return dropout_p


def _refuse_unsupported(
    *, qv: Any, q_descale: Any, k_descale: Any, v_descale: Any, attention_chunk: Any,
) -> None:
    """NotImplementedError naming the first argument that asks for a missing feature."""
    if isinstance(attention_chunk, bool) or not isinstance(attention_chunk, numbers.Real):
        raise TypeError(f"attention_chunk: expected a number, got {type_name(attention_chunk)}")
    if attention_chunk != 0:
        raise NotImplementedError(
            f"attention_chunk: flashcute does not support attention_chunk != 0 yet; got "
            f"{attention_chunk}"
        )
    for name, value in (("qv", qv), ("q_descale", q_descale), ("k_descale", k_descale),
                        ("v_descale", v_descale)):
        if value is not None:
            raise NotImplementedError(f"{name}: flashcute does not support {name} yet; pass None")


def _window(window_size: Any, *, seqlen_k: Optional[int]) -> tuple[int, int]:
    """flashcute's ``window`` for FlashAttention's ``window_size``: the same bounds, with
    FlashAttention's unbounded values (any negative bound, or one of at least seqlen_k)
    as -1. TypeError naming window_size for anything but a pair of ints."""
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise TypeError(
            f"window_size: expected a pair (left, right) of ints, got {window_size!r}"
        ) from None
    bounds = []
    for bound in (left, right):
        if isinstance(bound, bool) or not isinstance(bound, numbers.Integral):
            raise TypeError(
                f"window_size: expected a pair (left, right) of ints, got {window_size!r}"
            )
        unbounded = bound < 0 or (seqlen_k is not None and bound >= seqlen_k)
        bounds.append(-1 if unbounded else int(bound))
    return bounds[0], bounds[1]
