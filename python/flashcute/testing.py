"""For testing code that calls flashcute: the exact dropout mask the kernels use."""

from __future__ import annotations

import numbers
from typing import Any, Sequence

from ._dropout import SEED_LIMIT, check_dropout_p

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
    value is below round(dropout_p · 65536). ``dropout_p`` as the front doors take it (a float
    in [0, 1)); TypeError or ValueError naming it otherwise."""
    return min(round(check_dropout_p(dropout_p) * 65536.0), 65535)


def _check_size(name: str, value: Any) -> int:
    if type(value) is not int and (
        isinstance(value, bool) or not isinstance(value, numbers.Integral)
    ):
        raise TypeError(f"{name}: expected an int >= 0, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name}: expected an int >= 0, got {value}")
    return int(value)


def _check_key(name: str, value: Any) -> int:
    """``seed`` / ``offset``: the range the front doors take for ``dropout_seed`` /
    ``dropout_offset``, so that every mask asked for here is one a call can use."""
    if type(value) is not int and (
        isinstance(value, bool) or not isinstance(value, numbers.Integral)
    ):
        raise TypeError(f"{name}: expected an int in [0, 2**63), got {type(value).__name__}")
    if not 0 <= value < SEED_LIMIT:
        raise ValueError(f"{name}: expected an int in [0, 2**63), got {value}")
    return int(value)


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
    ``mask[b, :, :len_q, :len_k]``. The bits follow cpp/dropout.h exactly.

    ``seed`` and ``offset`` are ints in [0, 2**63), as ``dropout_seed`` and ``dropout_offset``
    of the front doors; bad arguments raise TypeError or ValueError naming them."""
    batch, nheads, seqlen_q, seqlen_k = (
        _check_size(name, value) for name, value in (
            ("batch", batch), ("nheads", nheads), ("seqlen_q", seqlen_q), ("seqlen_k", seqlen_k))
    )
    mask = keep_mask_slices(range(batch * nheads), seqlen_q, seqlen_k, dropout_p, seed, offset,
                            device)
    return mask.view(batch, nheads, seqlen_q, seqlen_k)


#: Weights per block of rows that ``keep_mask_slices`` computes at once: its int64
#: temporaries (a dozen or so) stay near this many cells, whatever the sequence lengths.
_BLOCK_CELLS = 1 << 22


def keep_mask_slices(
    slices: Sequence[int],
    seqlen_q: int,
    seqlen_k: int,
    dropout_p: float,
    seed: int,
    offset: int,
    device: Any = None,
) -> Any:
    """The keep masks (len(slices), seqlen_q, seqlen_k) of some (batch, head) slices: slice
    ``b * nheads + h`` is ``dropout_keep_mask(...)[b, h]``, with the same arguments. For
    checking part of a problem whose whole mask would not fit in memory."""
    import torch

    seqlen_q, seqlen_k = _check_size("seqlen_q", seqlen_q), _check_size("seqlen_k", seqlen_k)
    threshold = dropout_threshold(dropout_p)
    seed, offset = _check_key("seed", seed), _check_key("offset", offset)
    indices = [_check_size("slices", bh) for bh in slices]
    mask = torch.empty((len(indices), seqlen_q, seqlen_k), dtype=torch.bool, device=device)
    if threshold == 0:
        return mask.fill_(True)
    i64 = dict(dtype=torch.int64, device=device)
    key = (seed & _MASK32, ((seed >> 32) ^ (offset >> 32)) & _MASK32)
    block = max(1, _BLOCK_CELLS // max(1, seqlen_k))
    for r0 in range(0, seqlen_q, block):
        r1 = min(r0 + block, seqlen_q)
        shape = (r1 - r0, seqlen_k)
        rows = torch.arange(r0, r1, **i64).view(-1, 1).expand(shape)
        keys = torch.arange(seqlen_k, **i64).view(1, -1).expand(shape)
        key_group = (keys >> 4 << 2) | ((keys >> 1) & 3)
        row_group = (rows >> 4 << 3) | (rows & 7)
        element = ((rows >> 3) & 1) * 4 + ((keys >> 3) & 1) * 2 + (keys & 1)
        for i, bh in enumerate(indices):
            words = philox4x32_10(
                (key_group, row_group, torch.full_like(rows, bh),
                 torch.full_like(rows, offset & _MASK32)), key
            )
            word = torch.gather(torch.stack(words), 0, (element >> 1).unsqueeze(0))[0]
            value = torch.where((element & 1).bool(), word >> 16, word & 0xFFFF)
            mask[i, r0:r1] = value >= threshold
    return mask
