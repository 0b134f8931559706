"""For testing code that calls flashcute: the exact dropout mask the kernels use."""

from __future__ import annotations

from typing import Any

_MASK32 = 0xFFFFFFFF
_MUL0, _MUL1 = 0xD2511F53, 0xCD9E8D57
_WEYL0, _WEYL1 = 0x9E3779B9, 0xBB67AE85


def _mulhilo(a: Any, mul: int) -> tuple[Any, Any]:
    """(high, low) 32-bit words of a · mul for int64 tensors a in [0, 2^32), in 16-bit pieces
    so that no intermediate overflows int64."""
    a_hi, a_lo = a >> 16, a & 0xFFFF
    m_hi, m_lo = mul >> 16, mul & 0xFFFF
    cross = a_hi * m_lo + a_lo * m_hi
    low = a_lo * m_lo + ((cross & 0xFFFF) << 16)
    high = a_hi * m_hi + (cross >> 16) + (low >> 32)
    return high & _MASK32, low & _MASK32


def philox4x32_10(counter: tuple[Any, Any, Any, Any], key: tuple[int, int]) -> tuple[Any, Any, Any, Any]:
    """Philox4x32 with 10 rounds on int64 tensors holding 32-bit words (as cpp/dropout.h)."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for _ in range(10):
        hi0, lo0 = _mulhilo(c0, _MUL0)
        hi1, lo1 = _mulhilo(c2, _MUL1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0, k1 = (k0 + _WEYL0) & _MASK32, (k1 + _WEYL1) & _MASK32
    return c0, c1, c2, c3


def dropout_threshold(dropout_p: float) -> int:
    """The 16-bit threshold the kernels compare against: a weight is dropped where its random
    value is below round(dropout_p · 65536)."""
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p: expected a value in [0, 1), got {dropout_p}")
    return min(round(dropout_p * 65536.0), 65535)


def dropout_keep_mask(
    batch: int,
    nheads: int,
    seqlen_q: int,
    seqlen_k: int,
    dropout_p: float,
    seed: int,
    offset: int,
    device: Any = None,
) -> Any:
    """The boolean keep-mask (batch, nheads, seqlen_q, seqlen_k) that flashcute's kernels use for
    ``dropout_p``, ``seed`` and ``offset``: True where the attention weight is kept (and scaled
    by 1 / (1 - dropout_p)).

    Rows and columns are positions within a sequence; for a variable-length call, ``batch`` is
    the number of sequences, the lengths are the longest ones, and sequence b's weights are
    ``mask[b, :, :len_q, :len_k]``. The bits follow cpp/dropout.h exactly."""
    import torch

    for name, value in (("batch", batch), ("nheads", nheads), ("seqlen_q", seqlen_q), ("seqlen_k", seqlen_k)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{name}: expected an int >= 0, got {value!r}")
    for name, value in (("seed", seed), ("offset", offset)):
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**64:
            raise ValueError(f"{name}: expected an int in [0, 2^64), got {value!r}")
    threshold = dropout_threshold(dropout_p)
    shape = (batch, nheads, seqlen_q, seqlen_k)
    if threshold == 0:
        return torch.ones(shape, dtype=torch.bool, device=device)
    i64 = dict(dtype=torch.int64, device=device)
    rows = torch.arange(seqlen_q, **i64).view(seqlen_q, 1).expand(seqlen_q, seqlen_k)
    keys = torch.arange(seqlen_k, **i64).view(1, seqlen_k).expand(seqlen_q, seqlen_k)
    key_group = (keys >> 4 << 2) | ((keys >> 1) & 3)
    row_group = (rows >> 4 << 3) | (rows & 7)
    element = ((rows >> 3) & 1) * 4 + ((keys >> 3) & 1) * 2 + (keys & 1)
    key = (seed & _MASK32, ((seed >> 32) ^ (offset >> 32)) & _MASK32)
    mask = torch.empty((batch * nheads, seqlen_q, seqlen_k), dtype=torch.bool, device=device)
    for bh in range(batch * nheads):  # one (batch, head) slice at a time bounds the memory
        words = philox4x32_10(
            (key_group, row_group, torch.full_like(rows, bh), torch.full_like(rows, offset & _MASK32)), key
        )
        word = torch.gather(torch.stack(words), 0, (element >> 1).unsqueeze(0))[0]
        value = torch.where((element & 1).bool(), word >> 16, word & 0xFFFF)
        mask[bh] = value >= threshold
    return mask.view(shape)
