"""flashcute: fused exact-softmax attention kernels for CUDA GPUs, behind DLPack.

``flashcute.attention`` takes torch, cupy or jax tensors of layout
(batch, seqlen, heads, headdim) and is differentiable for torch tensors;
``flashcute.attention_backward`` computes the gradients on any of them;
``flashcute.attention_varlen`` and ``flashcute.attention_varlen_backward`` do the same for
packed batches of sequences of different lengths. ``flashcute.attention_with_kvcache`` attends
against a contiguous or paged key/value cache, appending new keys in place (decoding, chunked
prefill), and ``flashcute.merge_attention_states`` merges two partial attention results over
their log-sum-exp; ``flashcute.quantize_fp8`` quantizes attention inputs to FP8 with per-head
or per-block (``flashcute.FP8_BLOCK`` rows) scales, optionally after a random-sign Hadamard
transform. ``flashcute.sdpa``,
``flashcute.flash_attn_func`` and ``flashcute.flash_attn_varlen_func`` take torch SDPA's and
FlashAttention's signatures and layouts;
``flashcute.integrations.transformers`` plugs into Hugging Face transformers.
``flashcute.reference`` is a plain-PyTorch implementation
of the same semantics for testing, and ``flashcute.testing`` gives the exact dropout mask of a
seed and offset; ``flashcute.dropout_rng_state`` draws a dropout seed and offset from torch's
generator. ``import flashcute`` and ``flashcute.reference`` work even
when the compiled extension ``flashcute._C`` is missing; ``attention`` and ``build_info``
then raise ImportError.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

from ._build_info import build_info
from ._version import package_version as _package_version
from ._dropout import dropout_rng_state
from .attention import attention
from .backward import attention_backward
from .flash_attn_compat import flash_attn_func, flash_attn_varlen_func
from .kvcache import attention_with_kvcache, merge_attention_states
from .quantize import FP8_BLOCK, quantize_fp8
from .sdpa import sdpa
from .varlen import attention_varlen, attention_varlen_backward

__version__: str = _package_version()

__all__ = [
    "__version__", "attention", "attention_backward", "attention_varlen",
    "attention_varlen_backward", "attention_with_kvcache", "build_info", "cmake_prefix_path",
    "dropout_rng_state", "flash_attn_func", "flash_attn_varlen_func", "merge_attention_states",
    "reference", "sdpa", "testing", "FP8_BLOCK", "quantize_fp8",
]


def cmake_prefix_path() -> str:
    """Directory to put on CMAKE_PREFIX_PATH so that ``find_package(flashcute)`` works.

    The package installs ``lib/cmake/flashcute/flashcuteConfig.cmake`` under its own
    directory, which is returned. For example::

        prefix=$(python -c "import flashcute; print(flashcute.cmake_prefix_path())")
        cmake -DCMAKE_PREFIX_PATH="$prefix" ...
    """
    return os.path.dirname(os.path.abspath(__file__))


def __getattr__(name: str) -> ModuleType:
    # flashcute.reference and flashcute.testing use torch; each is imported when asked for.
    if name in ("reference", "testing"):
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
