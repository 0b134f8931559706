"""FP8 (e4m3fn) quantization of attention inputs (``flashcute.quantize_fp8``): one scale per
(batch, head) or per block of ``FP8_BLOCK`` rows, optionally after a random-sign Hadamard
transform over the head dim, in one fused kernel. ``flashcute.reference_fp8.quantize`` and
``reference_fp8.hadamard`` define the results.

torch only: the result's dtype is ``torch.float8_e4m3fn``.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from ._build_info import extension_with
from ._frameworks import TorchFramework
from ._validate import type_name
from ._validate_fp8 import FP8_BLOCK

if TYPE_CHECKING:
    import torch

_DTYPES = ("float16", "bfloat16")
_HADAMARD_HEAD_DIMS = (64, 128, 256)
_TORCH = TorchFramework()


def quantize_extension() -> Any:
    """``flashcute._C``, refusing a build whose binding predates ``quantize_fp8``."""
    return extension_with("quantize_fp8", "quantize_fp8", "quantize_fp8_workspace_size")


def _check_flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name}: expected a bool, got {type_name(value)}")
    return value


def _check_seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed: expected an int, got {type_name(seed)}")
    if not 0 <= seed < 2**64:
        raise ValueError(f"seed: expected an int in [0, 2**64), got {seed}")
    return seed


def _check_x(x: Any, hadamard: bool) -> None:
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(x, torch.Tensor):
        raise TypeError(
            f"x: quantize_fp8 takes a torch.Tensor (its result is torch.float8_e4m3fn), got "
            f"{type_name(x)}"
        )
    dtype = str(x.dtype).removeprefix("torch.")
    if dtype not in _DTYPES:
        raise TypeError(f"x: expected float16 or bfloat16, got {dtype}")
    if x.dim() != 4:
        raise ValueError(
            f"x: expected a 4-d tensor (batch, seqlen, nheads, headdim), got shape {tuple(x.shape)}"
        )
    headdim = x.shape[3]
    if headdim % 8 or not 8 <= headdim <= 256:
        raise ValueError(f"x: expected a headdim that is a multiple of 8 from 8 to 256, got {headdim}")
    if hadamard and headdim not in _HADAMARD_HEAD_DIMS:
        raise ValueError(
            f"x: hadamard=True needs headdim 64, 128 or 256, got headdim {headdim}"
        )
    if x.stride(3) != 1:
        raise ValueError(
            f"x: expected unit stride in the last (headdim) dimension, got strides {tuple(x.stride())}"
        )
    if x.numel() == 0:
        return
    strides = [s for n, s in zip(x.shape[:3], x.stride()[:3]) if n > 1]
    if any(s < 0 for s in strides):
        raise ValueError(f"x: expected non-negative strides, got strides {tuple(x.stride())}")
    per_16_bytes = 16 // x.element_size()
    if x.data_ptr() % 16 or any(s % per_16_bytes for s in strides):
        raise ValueError(
            f"x: the kernel reads 16-byte vectors, so the data pointer must be 16-byte aligned and "
            f"the batch, row and head strides multiples of {per_16_bytes} elements; got pointer % 16 "
            f"= {x.data_ptr() % 16}, strides {tuple(x.stride())} (x.contiguous() is such a tensor)"
        )


def _check_device(x: Any) -> None:
    if x.device.type != "cuda":
        raise ValueError(f"x: expected a CUDA tensor, got a {x.device.type} tensor")


def quantize_fp8(
    x: torch.Tensor, *, block: bool = False, hadamard: bool = False, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize x to FP8 (e4m3fn) with per-head or per-block scales, in one fused kernel.

    Each group of x's values (per head: all rows and columns of one (batch, head); with
    ``block``: each block of ``FP8_BLOCK`` rows of one (batch, head)) gets
    ``descale = amax / 448`` rounded to float32 (448: e4m3's largest value; a group of zeros
    gets 1), and ``x_fp8 = x / descale``, divided by that float32 descale exactly and rounded
    once to the nearest e4m3 value, ties to even, saturating at ±448; the true value is
    ``x_fp8 * descale``. NaNs stay NaN and do not enter amax. These are
    ``flashcute.reference_fp8.quantize``'s results (granularity "head" or "block"), which
    divide by the float64 descale: bytes can differ where that quotient is an exact tie.

    With ``hadamard``, every row is first rotated over the head dim,
    ``y = (x * signs) @ H / sqrt(headdim)`` with H the Sylvester Hadamard matrix and signs
    ``reference_fp8.hadamard_signs(headdim, seed)`` (fast Walsh-Hadamard butterflies in fp32),
    and y is quantized. The rotation is orthonormal: quantizing Q and K with one seed keeps
    ``Q @ K^T`` while spreading outliers over the head dim.

    Args:
        x: (batch, seqlen, nheads, headdim) float16 or bfloat16 CUDA tensor with unit
            stride in the headdim, other strides any multiples of 16 bytes; headdim a multiple
            of 8 up to 256 (64, 128 or 256 with ``hadamard``).
        block: scales per block of ``FP8_BLOCK`` rows instead of per head.
        hadamard: apply the random-sign Hadamard transform first.
        seed: the transform's key, an int in [0, 2**64).

    Returns:
        ``(x_fp8, descale)``: x_fp8 a new contiguous (batch, seqlen, nheads, headdim)
        ``torch.float8_e4m3fn`` tensor; descale float32 (batch, nheads), or with ``block``
        (batch, nheads, ceil(seqlen / FP8_BLOCK)). The kernel runs on the current stream of
        x's device; nothing synchronizes, and the results do not require grad.

    Raises:
        TypeError, ValueError: invalid arguments; messages name the argument.
        RuntimeError: no usable GPU, or a CUDA error.
        ImportError: the compiled extension is missing or predates ``quantize_fp8``.
    """
    block = _check_flag("block", block)
    hadamard = _check_flag("hadamard", hadamard)
    seed = _check_seed(seed)
    _check_x(x, hadamard)
    _check_device(x)
    import torch

    batch, seqlen, nheads, headdim = x.shape
    blocks = -(-seqlen // FP8_BLOCK)
    x_fp8 = torch.empty((batch, seqlen, nheads, headdim), dtype=torch.float8_e4m3fn, device=x.device)
    scale_shape = (batch, nheads, blocks) if block else (batch, nheads)
    if x.numel() == 0:  # nothing to launch; an empty head's scale is 1
        return x_fp8, torch.ones(scale_shape, dtype=torch.float32, device=x.device)
    descale = torch.empty(scale_shape, dtype=torch.float32, device=x.device)
    ext = quantize_extension()
    nbytes = int(ext.quantize_fp8_workspace_size(batch, nheads, block))
    workspace = torch.empty(nbytes, dtype=torch.uint8, device=x.device) if nbytes else None
    # The fp8 result goes out as its bytes: torch builds with DLPack headers older than 1.1
    # cannot export float8 tensors.
    ext.quantize_fp8(
        _TORCH.launchable(x.detach()), _TORCH.launchable(x_fp8.view(torch.uint8)),
        _TORCH.launchable(descale), None if workspace is None else _TORCH.launchable(workspace),
        block, hadamard, seed, _TORCH.stream(x),
    )
    return x_fp8, descale
