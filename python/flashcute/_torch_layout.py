"""Strides of gradients that reach the backward kernels from autograd.

Imported only when torch tensors are used.
"""

from __future__ import annotations

from torch import Tensor


def kernel_layout(x: Tensor) -> Tensor:
    """``x``, or a contiguous copy where its strides are not ones the kernels take (gradients
    from autograd may be expanded, stride 0, or otherwise oddly strided)."""
    strides_ok = x.stride(-1) == 1 and all(
        size <= 1 or (stride > 0 and stride % 8 == 0)
        for size, stride in zip(x.shape[:-1], x.stride()[:-1])
    )
    return x if strides_ok and x.data_ptr() % 16 == 0 else x.contiguous()
