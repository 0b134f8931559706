"""Hugging Face transformers integration: ``attn_implementation="flashcute"``.

::

    import flashcute.integrations.transformers

    flashcute.integrations.transformers.register()
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="flashcute",
                                                 dtype=torch.bfloat16, device_map="cuda")

``register()`` adds ``attention_forward`` to transformers' ``AttentionInterface`` and SDPA's
mask function to its ``AttentionMaskInterface`` under the name "flashcute". transformers
then hands flashcute what it hands SDPA: no mask where SDPA's ``is_causal`` (aligned
top-left) or plain attention is exact (no padding, no packed sequences, no sliding window),
else a materialised mask, which ``attention_forward`` refuses: masks are not supported yet.

This module imports transformers (and torch) only when ``register`` or ``attention_forward``
runs, so it imports without them.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

from ..sdpa import sdpa

#: The ``attn_implementation`` name that ``register`` adds.
NAME = "flashcute"

#: Keyword arguments of transformers' attention call for features flashcute lacks; any of
#: them set (not None) raises NotImplementedError naming it.
_UNSUPPORTED_KWARGS = (
    "softcap", "s_aux", "position_bias", "head_mask",
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
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    except ImportError as exc:
        raise ImportError(
            f"flashcute.integrations.transformers.register(): transformers "
            f"{getattr(transformers, '__version__', '?')} has no AttentionInterface and "
            "AttentionMaskInterface; pip install --upgrade transformers"
        ) from exc
    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    _skip_flash_preload()


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
            ``is_causal`` is given.
        query: (batch, nheads, seqlen_q, headdim); key, value: (batch, nheads_kv, seqlen_k,
            headdim), as transformers passes them to SDPA (float16/bfloat16 on a CUDA
            device; float32 under autocast is cast to the autocast dtype).
        attention_mask: must be None, which the registered mask function gives for causal
            or plain attention without padding or packed sequences.
        dropout: must be 0.0 (an evaluation-mode model, or ``attention_dropout=0``).
        scaling: softmax scale; default 1/sqrt(headdim).
        is_causal: overrides ``module.is_causal``.
        **kwargs: further keywords from the model; those for features flashcute lacks
            (``softcap``, ``s_aux``, ``position_bias``, ``head_mask``, the packed-sequence
            ``cu_seq_lens_*``/``max_length_*``/``seq_idx``) must be None, and
            ``sliding_window`` None or more than seqlen_k (the window then masks nothing).

    As transformers' SDPA integration: causal attention is SDPA's top-left aligned one, and a
    single query row (a decoding step) attends every key.

    Returns:
        (attn_output (batch, seqlen_q, nheads, headdim), None): no attention weights.
    """
    import torch

    _refuse(attention_mask, dropout, kwargs, seqlen_k=key.shape[2])
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    # bool() of the shape test: under torch.compile with dynamic shapes it is a SymBool.
    causal = bool(causal) and bool(query.shape[2] > 1)
    if query.dtype == torch.float32 and torch.is_autocast_enabled(query.device.type):
        # Rotary embeddings in float32 lift q and k out of autocast's dtype; bring them back.
        dtype = torch.get_autocast_dtype(query.device.type)
        query, key, value = (x.to(dtype) for x in (query, key, value))
    out = sdpa(query, key, value, is_causal=causal, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2), None


def _refuse(attention_mask: Any, dropout: Any, kwargs: dict[str, Any], *, seqlen_k: int) -> None:
    if dropout:
        raise NotImplementedError(
            f"dropout: flashcute has no attention dropout, got {dropout}; set the config's "
            "attention_dropout to 0.0 or put the model in eval mode"
        )
    window = kwargs.get("sliding_window")
    # Query i sees keys i - window < j <= i: with fewer keys than window that is every
    # causal key, and transformers' masks skip the window in the same case.
    if window is not None and seqlen_k >= window:
        raise NotImplementedError(
            f"sliding_window: attn_implementation='flashcute' has no sliding window yet; "
            f"got sliding_window={window} with {seqlen_k} keys (it runs only while there are "
            "fewer keys than the window)"
        )
    for name in _UNSUPPORTED_KWARGS:
        if kwargs.get(name) is not None:
            raise NotImplementedError(
                f"{name}: attn_implementation='flashcute' does not support {name} yet"
            )
    if attention_mask is not None:
        raise NotImplementedError(
            "attention_mask: attn_implementation='flashcute' runs causal or plain attention "
            "only, and got a mask (padding, packed sequences, a sliding window or a static "
            "cache ask for one); pass no attention_mask (or all ones), or use "
            "attn_implementation='sdpa' for masked batches"
        )
