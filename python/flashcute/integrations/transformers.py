"""Hugging Face transformers integration: ``attn_implementation="flashcute"``.

::

    import flashcute.integrations.transformers

    flashcute.integrations.transformers.register()
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="flashcute",
                                                 dtype=torch.bfloat16, device_map="cuda")

``register()`` adds ``attention_forward`` to transformers' ``AttentionInterface`` and
``mask_function`` to its ``AttentionMaskInterface`` under the name "flashcute". transformers
then hands flashcute what it hands SDPA: no mask where SDPA's ``is_causal`` (aligned
top-left) or plain attention is exact (no padding, no packed sequences), else a
materialised mask, which ``attention_forward`` refuses: masks are not supported yet. Causal
sliding windows are the exception: their mask is left out where the causal one would be,
and ``attention_forward`` applies the window it is given (``sliding_window``) in the kernel,
as it applies ``softcap``.

This module imports transformers (and torch) only when ``register``, ``mask_function`` or
``attention_forward`` runs, so it imports without them.
"""

from __future__ import annotations

import functools
import numbers
from typing import Any, Callable, Optional

from ..attention import attention
from ..sdpa import sdpa

#: The ``attn_implementation`` name that ``register`` adds.
NAME = "flashcute"

#: Keyword arguments of transformers' attention call for features flashcute lacks; any of
#: them set (not None) raises NotImplementedError naming it.
_UNSUPPORTED_KWARGS = (
    "s_aux", "position_bias", "head_mask",
    "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx",
)


def register() -> None:
    """Register flashcute with Hugging Face transformers as ``attn_implementation="flashcute"``.

    Models that dispatch attention through ``AttentionInterface`` (Llama, Mistral, Qwen2/3,
    Gemma and most other decoder models) can then be created or switched with
    ``attn_implementation="flashcute"`` (``from_pretrained``, ``from_config``,
    ``model.set_attn_implementation``). Calling it again changes nothing.

    Raises:
        ImportError: transformers is not installed, or is too old to have
            ``AttentionInterface`` and ``AttentionMaskInterface``.
    """
    try:
        import transformers
    except ImportError as exc:
        raise ImportError(
            "flashcute.integrations.transformers.register() needs Hugging Face transformers: "
            "pip install transformers"
        ) from exc
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError as exc:
        raise ImportError(
            f"flashcute.integrations.transformers.register(): transformers "
            f"{getattr(transformers, '__version__', '?')} has no AttentionInterface and "
            "AttentionMaskInterface; pip install --upgrade transformers"
        ) from exc
    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, mask_function)
    _skip_flash_preload()


def mask_function(*args: Any, **kwargs: Any) -> Any:
    """transformers' mask function for ``attn_implementation="flashcute"``: SDPA's, except
    that a causal sliding window does not by itself make a mask.

    transformers asks for a causal sliding-window mask with ``local_size`` set to the
    window, which keeps SDPA's function from leaving the mask out. Here that case is decided
    as for a plain causal mask: where SDPA's ``is_causal`` would do (no padding, no packed
    sequences), the result is None and ``attention_forward`` applies the window, which the
    model passes it as ``sliding_window``. Chunked and bidirectional masks, and every mask
    with padding, are SDPA's.
    """
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    if _causal_sliding_window(kwargs):
        kwargs = {**kwargs, "local_size": None}
    return ALL_MASK_ATTENTION_FUNCTIONS["sdpa"](*args, **kwargs)


def _causal_sliding_window(kwargs: dict[str, Any]) -> bool:
    """Whether a mask request is the causal sliding window of the config: its ``local_size``
    is the config's ``sliding_window`` (not a chunk size) and the mask may be left out for
    SDPA's ``is_causal`` (transformers forbids that for bidirectional masks, overlays and
    packed sequences)."""
    size = kwargs.get("local_size")
    config = kwargs.get("config")
    return (
        size is not None
        and config is not None
        and bool(kwargs.get("allow_is_causal_skip", True))
        and getattr(config, "sliding_window", None) == size
        and getattr(config, "attention_chunk_size", None) != size
    )


def _skip_flash_preload() -> None:
    """Keep transformers from preloading a FlashAttention build for "flashcute".

    transformers 5 takes every implementation whose name contains "flash" for a
    FlashAttention package or hub kernel and loads one when a model is created, which fails
    for "flashcute": its attention function needs nothing loaded. The loader that model
    creation calls is wrapped to pass over this name only.
    """
    try:
        from transformers import modeling_utils
    except ImportError:
        return
    preload: Optional[Callable[..., Any]] = getattr(
        modeling_utils, "lazy_import_flash_attention", None
    )
    if preload is None or getattr(preload, "_flashcute_passes_over", False):
        return

    @functools.wraps(preload)
    def lazy_import_flash_attention(implementation: Any, *args: Any, **kwargs: Any) -> Any:
        if implementation == NAME:
            return None
        return preload(implementation, *args, **kwargs)

    lazy_import_flash_attention._flashcute_passes_over = True  # type: ignore[attr-defined]
    modeling_utils.lazy_import_flash_attention = lazy_import_flash_attention


def attention_forward(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: Optional[float] = None,
    is_causal: Optional[bool] = None,
    **kwargs: Any,
) -> tuple[Any, None]:
    """transformers' attention function for ``attn_implementation="flashcute"``.

    Args:
        module: the calling attention layer; its ``is_causal`` (default True) applies unless
            ``is_causal`` is given, and its ``sliding_window`` unless the keyword is passed.
        query: (batch, nheads, seqlen_q, headdim); key, value: (batch, nheads_kv, seqlen_k,
            headdim), as transformers passes them to SDPA (float16/bfloat16 on a CUDA
            device; float32 under autocast is cast to the autocast dtype).
        attention_mask: must be None, which the registered mask function gives for causal
            or plain attention (with or without a sliding window) without padding or packed
            sequences.
        dropout: must be 0.0 (an evaluation-mode model, or ``attention_dropout=0``): this
            integration does not pass dropout on.
        scaling: softmax scale; default 1/sqrt(headdim).
        is_causal: overrides ``module.is_causal``.
        **kwargs: further keywords from the model. ``sliding_window`` (a positive int or
            None): a causal query sees itself and the ``sliding_window - 1`` keys before it,
            as in transformers' masks. ``softcap`` (a float or None): scores become
            ``softcap * tanh(score / softcap)``. Those for features flashcute lacks
            (``s_aux``, ``position_bias``, ``head_mask``, the packed-sequence
            ``cu_seq_lens_*``/``max_length_*``/``seq_idx``) must be None.

    As transformers' SDPA integration: causal attention is SDPA's top-left aligned one, and a
    single query row (a decoding step) attends every key (the last ``sliding_window`` with
    a window). A module that is not causal may have a sliding window only where it masks
    nothing (no more than ``sliding_window`` keys).

    Returns:
        (attn_output (batch, seqlen_q, nheads, headdim), None): no attention weights.
    """
    import torch

    _refuse(attention_mask, dropout, kwargs)
    wants_causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    # bool() of the shape test: under torch.compile with dynamic shapes it is a SymBool.
    causal = wants_causal and bool(query.shape[2] > 1)
    left = _window_left(module, kwargs, wants_causal, causal, query.shape[2], key.shape[2])
    softcap = kwargs.get("softcap")
    if query.dtype == torch.float32 and torch.is_autocast_enabled(query.device.type):
        # Rotary embeddings in float32 lift q and k out of autocast's dtype; bring them back.
        dtype = torch.get_autocast_dtype(query.device.type)
        query, key, value = (x.to(dtype) for x in (query, key, value))
    if left < 0 and softcap is None:
        out = sdpa(query, key, value, is_causal=causal, scale=scaling, enable_gqa=True)
        return out.transpose(1, 2), None
    q, k, v = (x.transpose(1, 2) for x in (query, key, value))  # flashcute's layout, views
    if causal:
        if q.shape[1] > k.shape[1]:
            raise NotImplementedError(
                f"sliding_window, softcap: attn_implementation='flashcute' takes them only "
                f"where the keys are at least as many as the queries; got {q.shape[1]} "
                f"queries and {k.shape[1]} keys"
            )
        # SDPA's top-left causal mask is flashcute's bottom-right one on the first seqlen_q
        # keys, and so is the window that follows it.
        k, v = k[:, : q.shape[1]], v[:, : q.shape[1]]
    out = attention(
        q, k, v, causal=causal, softmax_scale=scaling, window=(left, -1),
        softcap=0.0 if softcap is None else softcap,
    )
    return out, None


def _window_left(
    module: Any, kwargs: dict[str, Any], wants_causal: bool, causal: bool, seqlen_q: int,
    seqlen_k: int,
) -> int:
    """flashcute's left window side for transformers' ``sliding_window`` (the keyword, or
    where the model passes none, the module's attribute), or -1 where there is none or it
    masks nothing."""
    if "sliding_window" in kwargs:
        window = kwargs["sliding_window"]
    else:  # Qwen2-MoE, for one, keeps it on its sliding layers only
        window = getattr(module, "sliding_window", None)
    if window is None:
        return -1
    if isinstance(window, bool) or not isinstance(window, numbers.Integral) or window < 1:
        raise ValueError(f"sliding_window: expected a positive int or None, got {window!r}")
    # Keys a row can see without the window: up to seqlen_q under the top-left causal mask,
    # all seqlen_k otherwise.
    reach = seqlen_q if causal else seqlen_k
    if int(reach) <= window:
        return -1
    if not wants_causal:
        raise NotImplementedError(
            f"sliding_window: attn_implementation='flashcute' has no bidirectional sliding "
            f"window; got sliding_window={window} with {seqlen_k} keys on a module that is "
            "not causal (it runs only while the window masks nothing)"
        )
    # transformers' window: key j is seen from query i iff i - window < j <= i.
    return int(window) - 1


def _refuse(attention_mask: Any, dropout: Any, kwargs: dict[str, Any]) -> None:
    if dropout:
        raise NotImplementedError(
            f"dropout: flashcute has no attention dropout, got {dropout}; set the config's "
            "attention_dropout to 0.0 or put the model in eval mode"
        )
    for name in _UNSUPPORTED_KWARGS:
        if kwargs.get(name) is not None:
            raise NotImplementedError(
                f"{name}: attn_implementation='flashcute' does not support {name} yet"
            )
    if attention_mask is not None:
        raise NotImplementedError(
            "attention_mask: attn_implementation='flashcute' runs causal or plain attention "
            "(with or without a sliding window) only, and got a mask (padding, packed "
            "sequences or a static cache ask for one); pass no attention_mask (or all ones), "
            "or use attn_implementation='sdpa' for masked batches"
        )
