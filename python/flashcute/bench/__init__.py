"""Attention throughput benchmark for flashcute against PyTorch SDPA and FlashAttention-3.

Run it as ``python -m flashcute.bench``.  The default grid follows the
FlashAttention-3 paper: the total number of tokens ``batch * seqlen`` is fixed
at 16384 and the hidden size ``nheads * hdim`` at 2048, for head dimensions
64/128/256, causal and non-causal masking, and sequence lengths 512 to 16384.
``--hdims`` takes any multiple of 8 up to 256 (``nheads = 2048 // hdim``);
``--shape b,sq,sk,h,hkv,d`` times given shapes instead (GQA, ``seqlen_q !=
seqlen_k``).  Causal masks are bottom-right aligned for every implementation.
``--window L,R``, ``--softcap C``, ``--alibi`` and ``--dropout P`` time flashcute's
sliding window, logit softcap, ALiBi (slopes ``2^(-8(h+1)/nheads)``) and dropout
(a fixed seed and offset; FLOPs count only the visible (query, key) pairs; SDPA
and FlashAttention-3 are timed on dense problems only, which ``--with-dense``
adds beside each one); every JSON row names its ``feature`` (``dense``,
``window``, ``softcap``, ``alibi``, ``dropout``, or those set joined by ``+``:
``window+softcap``, ``window+alibi``, ``softcap+dropout``, ...).

Implementations compared:

* ``flashcute-ampere``  -- ``flashcute.attention(..., backend="ampere")``
* ``flashcute-hopper``  -- ``flashcute.attention(..., backend="hopper")``
  (only on sm90 devices, for head dims/dtypes listed in ``build_info()``)
* ``sdpa-cudnn``        -- ``F.scaled_dot_product_attention`` restricted to
  ``SDPBackend.CUDNN_ATTENTION``
* ``sdpa-flash``        -- ``F.scaled_dot_product_attention`` restricted to
  ``SDPBackend.FLASH_ATTENTION``
* ``fa3``               -- FlashAttention-3's ``flash_attn_interface.flash_attn_func``
  (where it imports; bf16, head dims 64/128/256)

Inputs are created once per configuration in flashcute's ``(batch, seqlen,
nheads, headdim)`` layout; SDPA receives ``.transpose(1, 2)`` views of the same
tensors (no copy).

A tqdm progress bar (when tqdm is installed) goes to stderr, a results table
to stdout; ``--json`` and ``--plot`` write machine-readable results and a PNG
chart.

Modules: :mod:`.grid` (constants, records, grid, ``--shape``, FLOPs),
:mod:`.impls` (availability, flashcute and FlashAttention-3 access,
callables), :mod:`.timing` (inputs, timers, ``--check``, run loop),
:mod:`.report` (table, JSON, plot, progress) and :mod:`.cli` (arguments,
:func:`main`).  The package keeps ``torch``, ``triton``, ``matplotlib``,
``tqdm``, ``flash_attn_interface`` and ``flashcute`` itself out of its
import-time dependencies, so the pure helpers can be imported and tested on a
machine without a GPU or a built extension.
"""

from __future__ import annotations

from .cli import build_parser, causal_values, main, parse_args
from .grid import (
    CHECK_ATOL,
    DEFAULT_HDIMS,
    DEFAULT_SEQLENS,
    FA3_DTYPES,
    FA3_HDIMS,
    IMPLS,
    NO_WINDOW,
    QUICK_HDIMS,
    QUICK_SEQLENS,
    TOTAL_HIDDEN,
    TOTAL_TOKENS,
    BenchConfig,
    BenchError,
    BenchRow,
    CheckError,
    NoGPUError,
    Notes,
    Shape,
    alibi_slopes,
    attention_flops,
    build_grid,
    build_shapes,
    causal_pairs,
    config_flops,
    feature_name,
    parse_shape,
    parse_dropout,
    parse_shapes,
    parse_softcap,
    parse_window,
    tflops_from_ms,
    visible_pairs,
    with_feature,
)
from .impls import (
    fa3_import_error,
    feature_skip_reason,
    flashcute_backward_available,
    impl_skip_reason,
    impl_unavailable_reason,
    select_impls,
)
from .report import (
    format_table,
    make_progress,
    plot_results,
    results_to_json,
    write_json,
)

__all__ = [
    "TOTAL_TOKENS", "TOTAL_HIDDEN", "DEFAULT_HDIMS", "DEFAULT_SEQLENS", "QUICK_HDIMS",
    "QUICK_SEQLENS", "IMPLS", "FA3_HDIMS", "FA3_DTYPES", "CHECK_ATOL", "NO_WINDOW",
    "BenchConfig", "BenchRow", "Notes", "Shape", "BenchError", "CheckError", "NoGPUError",
    "build_parser", "parse_args", "causal_values", "build_grid", "build_shapes", "parse_shape",
    "parse_shapes", "parse_window", "parse_softcap", "parse_dropout", "feature_name",
    "with_feature",
    "alibi_slopes",
    "attention_flops", "causal_pairs", "visible_pairs", "config_flops", "tflops_from_ms",
    "feature_skip_reason", "impl_skip_reason", "impl_unavailable_reason", "select_impls",
    "fa3_import_error", "flashcute_backward_available", "format_table", "results_to_json",
    "write_json", "plot_results", "make_progress", "main",
]
