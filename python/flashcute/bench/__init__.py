"""Forward-attention throughput benchmark for flashcute against PyTorch SDPA.

Run it as ``python -m flashcute.bench``.  The default grid follows the
FlashAttention-3 paper: the total number of tokens ``batch * seqlen`` is fixed
at 16384 and the hidden size ``nheads * hdim`` at 2048, for head dimensions
64/128/256, causal and non-causal masking, and sequence lengths 512 to 16384.

Implementations compared:

* ``flashcute-ampere``  -- ``flashcute.attention(..., backend="ampere")``
* ``flashcute-hopper``  -- ``flashcute.attention(..., backend="hopper")``
  (only on sm90 devices, for head dims/dtypes listed in ``build_info()``)
* ``sdpa-cudnn``        -- ``F.scaled_dot_product_attention`` restricted to
  ``SDPBackend.CUDNN_ATTENTION``
* ``sdpa-flash``        -- ``F.scaled_dot_product_attention`` restricted to
  ``SDPBackend.FLASH_ATTENTION``

Inputs are created once per configuration in flashcute's ``(batch, seqlen,
nheads, headdim)`` layout; SDPA receives ``.transpose(1, 2)`` views of the same
tensors (no copy).

A progress bar goes to stderr, a results table to stdout; ``--json`` and
``--plot`` write machine-readable results and a PNG chart.

Modules: :mod:`.grid` (constants, records, grid, FLOPs), :mod:`.impls`
(availability, flashcute access, callables), :mod:`.timing` (inputs, timers,
``--check``, run loop), :mod:`.report` (table, JSON, plot, progress) and
:mod:`.cli` (arguments, :func:`main`).  The package keeps ``torch``,
``triton``, ``matplotlib`` and ``flashcute`` itself out of its import-time
dependencies, so the pure helpers can be imported and tested on a machine
without a GPU or a built extension.
"""

from __future__ import annotations

from .cli import build_parser, causal_values, main, parse_args
from .grid import (
    CHECK_ATOL,
    DEFAULT_HDIMS,
    DEFAULT_SEQLENS,
    IMPLS,
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
    attention_flops,
    build_grid,
    config_flops,
    tflops_from_ms,
)
from .impls import (
    flashcute_backward_available,
    impl_skip_reason,
    impl_unavailable_reason,
    select_impls,
)
from .report import (
    SimpleProgress,
    format_table,
    plot_results,
    results_to_json,
    write_json,
)

__all__ = [
    "TOTAL_TOKENS", "TOTAL_HIDDEN", "DEFAULT_HDIMS", "DEFAULT_SEQLENS", "QUICK_HDIMS",
    "QUICK_SEQLENS", "IMPLS", "CHECK_ATOL", "BenchConfig", "BenchRow", "Notes",
    "SimpleProgress", "BenchError", "CheckError", "NoGPUError", "build_parser",
    "parse_args", "causal_values", "build_grid", "attention_flops", "config_flops",
    "tflops_from_ms", "impl_skip_reason", "impl_unavailable_reason", "select_impls",
    "flashcute_backward_available", "format_table", "results_to_json", "write_json",
    "plot_results", "main",
]
