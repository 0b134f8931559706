"""Plain-PyTorch attention with flashcute's semantics, for tests and error baselines."""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence, Union

import torch

# The front door's checks of these arguments, so that both refuse the same values.
from ._dropout import check_dropout_p as _check_dropout_p
from ._validate import check_softcap as _check_softcap
from ._validate import check_window as _check_window

_LOW_PRECISION = (torch.float16, torch.bfloat16)
_DTYPES = (torch.float64, torch.float32, *_LOW_PRECISION)

Result = Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]


def _check(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dtype: torch.dtype, *, varlen: bool = False
) -> None:
    ndim, layout = (4, "(batch, seqlen, nheads, headdim)")
    if varlen:
        ndim, layout = (3, "(total, nheads, headdim)")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__qualname__}")
        if x.dim() != ndim:
            raise ValueError(
                f"{name}: expected a {ndim}-d tensor {layout}, got shape {tuple(x.shape)}"
            )
    if dtype not in _DTYPES:
        raise TypeError(f"dtype: expected one of {_DTYPES}, got {dtype}")
    if k.shape[:-1] != v.shape[:-1]:  # v's head dim may differ from q's and k's
        raise ValueError(f"v: shape {tuple(v.shape)} does not match k's {tuple(k.shape)}")
    if k.shape[-1] != q.shape[-1] or (not varlen and k.shape[0] != q.shape[0]):
        what = "headdim" if varlen else "batch or headdim"
        raise ValueError(f"k: shape {tuple(k.shape)} does not match q's {tuple(q.shape)} in {what}")
    nheads, nheads_kv = q.shape[-2], k.shape[-2]
    if (nheads_kv == 0 and nheads != 0) or (nheads_kv != 0 and nheads % nheads_kv != 0):
        raise ValueError(f"q, k: {nheads} query heads are not a multiple of {nheads_kv} kv heads")


def _check_alibi(alibi_slopes: Any, batch: int, nheads: int) -> None:
    if not isinstance(alibi_slopes, torch.Tensor):
        raise TypeError(
            f"alibi_slopes: expected a torch.Tensor or None, got {type(alibi_slopes).__qualname__}"
        )
    if not alibi_slopes.is_floating_point():
        raise TypeError(f"alibi_slopes: expected a floating tensor, got {alibi_slopes.dtype}")
    if tuple(alibi_slopes.shape) not in ((nheads,), (batch, nheads)):
        raise ValueError(
            f"alibi_slopes: expected shape ({nheads},) or ({batch}, {nheads}), "
            f"got {tuple(alibi_slopes.shape)}"
        )


def _check_dropout_mask(mask: Any, shape: tuple[int, ...]) -> torch.Tensor:
    """A bool keep mask of at least ``shape`` (batch, nheads, seqlen_q, seqlen_k), cut to it;
    TypeError/ValueError naming ``dropout_mask`` otherwise."""
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"dropout_mask: expected a torch.Tensor, got {type(mask).__qualname__}")
    if mask.dtype != torch.bool:
        raise TypeError(f"dropout_mask: expected a bool tensor, got {mask.dtype}")
    short = any(m < n for m, n in zip(mask.shape[2:], shape[2:]))
    if mask.dim() != 4 or mask.shape[:2] != shape[:2] or short:
        raise ValueError(
            f"dropout_mask: expected shape {shape} (batch, nheads, seqlen_q, seqlen_k), or longer "
            f"sequences, got {tuple(mask.shape)}"
        )
    return mask[:, :, :shape[2], :shape[3]]


def _visible(
    seqlen_q: int, seqlen_k: int, left: int, right: int, device: torch.device
) -> Optional[torch.Tensor]:
    """(seqlen_q, seqlen_k) bool mask of the keys each query sees, or None when it sees all."""
    if left < 0 and right < 0:
        return None
    diag = torch.arange(seqlen_q, device=device)[:, None] + (seqlen_k - seqlen_q)
    cols = torch.arange(seqlen_k, device=device)[None, :]
    visible = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if left >= 0:
        visible &= cols >= diag - left
    if right >= 0:
        visible &= cols <= diag + right
    return visible


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    softmax_scale: Optional[float] = None,
    window: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[torch.Tensor] = None,
    dropout_p: float = 0.0,
    dropout_mask: Optional[torch.Tensor] = None,
    return_lse: bool = False,
    dtype: torch.dtype = torch.float64,
) -> Result:
    """Attention ``softmax(scale * q @ k^T) @ v`` computed by materialising the scores.

    Same semantics as ``flashcute.attention``: q is (batch, seqlen_q, nheads, headdim),
    k and v are (batch, seqlen_k, nheads_kv, headdim) with nheads % nheads_kv == 0 (query
    head ``h`` uses kv head ``h // (nheads // nheads_kv)``); v's head dim may differ from
    q's and k's, and the output takes it. Masks are bottom-right aligned:
    with ``d = i + seqlen_k - seqlen_q``, query ``i`` sees key ``j`` iff
    ``d - left <= j <= d + right`` for ``window=(left, right)`` (-1 leaves that side
    unbounded), and ``causal`` sets ``right = 0``. A query with no key to attend to gives
    output 0 and lse -inf, never NaN.

    Each score is formed in this order: ``s = scale * q_i . k_j``; with ``softcap > 0``,
    ``s = softcap * tanh(s / softcap)``; with ALiBi, ``s -= slope[h] * |d - j|``; then the
    mask and the softmax over the visible keys. With ``dropout_mask`` the weights are then
    ``softmax * dropout_mask / (1 - dropout_p)``; lse is that of the softmax before dropout.

    Args:
        q, k, v: torch tensors of any floating dtype, on any device.
        causal: apply the bottom-right aligned causal mask (``right = 0``).
        softmax_scale: multiplies the scores; default 1/sqrt(headdim).
        window: (left, right) sliding-window bounds, ints >= -1; (-1, -1) is no window.
        softcap: tanh soft cap of the scaled scores; 0.0 disables it.
        alibi_slopes: ALiBi slopes (nheads,) or (batch, nheads), typically float32.
        dropout_p: the dropout probability that scales the kept weights, in [0, 1).
        dropout_mask: bool keep mask (batch, nheads, seqlen_q, seqlen_k) (a larger one is cut
            to these lengths), e.g. ``flashcute.testing.dropout_keep_mask`` of the kernels'
            seed and offset; None (default): no dropout, whatever ``dropout_p`` says.
        return_lse: also return the natural-log log-sum-exp of the final, masked scores,
            shape (batch, nheads, seqlen_q).
        dtype: precision of the computation. float64 (default) or float32 compute
            everything in that dtype. float16 or bfloat16 (typically the inputs' own dtype,
            to measure PyTorch's own error at that precision) do both matmuls in that dtype
            and the softmax in float32, as PyTorch's math attention roughly does.

    Returns:
        The output, (batch, seqlen_q, nheads, v's headdim) in ``dtype``, or ``(out, lse)``
        when ``return_lse``; lse is in ``dtype``, or float32 for float16/bfloat16.
    """
    _check(q, k, v, dtype)
    left, right = _check_window(window)
    cap = _check_softcap(softcap)
    batch, seqlen_q, nheads, headdim = q.shape
    seqlen_k, nheads_kv = k.shape[1], k.shape[2]
    if alibi_slopes is not None:
        _check_alibi(alibi_slopes, batch, nheads)
    p = _check_dropout_p(dropout_p)
    keep = None
    if dropout_mask is not None:
        keep = _check_dropout_mask(dropout_mask, (batch, nheads, seqlen_q, seqlen_k)).to(q.device)
    if causal:
        right = 0
    scale = 1.0 / math.sqrt(headdim) if softmax_scale is None else float(softmax_scale)
    acc = torch.float32 if dtype in _LOW_PRECISION else dtype

    qt = q.to(dtype).transpose(1, 2)  # (batch, nheads, seqlen_q, headdim)
    kt = k.to(dtype).transpose(1, 2)
    vt = v.to(dtype).transpose(1, 2)
    if nheads_kv not in (0, nheads):
        kt = kt.repeat_interleave(nheads // nheads_kv, dim=1)
        vt = vt.repeat_interleave(nheads // nheads_kv, dim=1)

    scores = torch.matmul(qt, kt.transpose(-1, -2)).to(acc) * scale
    if cap > 0.0:
        scores = cap * torch.tanh(scores / cap)
    if alibi_slopes is not None:
        diag = torch.arange(seqlen_q, device=q.device)[:, None] + (seqlen_k - seqlen_q)
        dist = (diag - torch.arange(seqlen_k, device=q.device)[None, :]).abs().to(acc)
        slopes = alibi_slopes.to(device=q.device, dtype=acc)[..., None, None]
        scores = scores - slopes * dist  # slopes: (nheads, 1, 1) or (batch, nheads, 1, 1)
    visible = _visible(seqlen_q, seqlen_k, left, right, q.device)
    if visible is not None:
        scores = scores.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # -inf for rows with no key
    finite_lse = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    probs = torch.exp(scores - finite_lse.unsqueeze(-1))  # masked entries: exp(-inf) = 0
    if keep is not None:
        probs = probs * keep.to(probs.dtype) * (1.0 / (1.0 - p))
    out = torch.matmul(probs.to(dtype), vt).transpose(1, 2).contiguous()
    return (out, lse) if return_lse else out


def _check_cu_seqlens(name: str, cu: Any, total: int) -> list[int]:
    """The offsets of a cu_seqlens tensor as ints; TypeError/ValueError naming it otherwise."""
    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(cu).__qualname__}")
    if cu.dtype != torch.int32 or cu.dim() != 1 or cu.numel() == 0:
        raise ValueError(
            f"{name}: expected a non-empty 1-d int32 tensor, "
            f"got {cu.dtype} of shape {tuple(cu.shape)}"
        )
    offsets = cu.tolist()
    if offsets[0] < 0 or offsets[-1] > total:
        raise ValueError(f"{name}: offsets {offsets[0]}..{offsets[-1]} fall outside 0..{total}")
    if any(b < a for a, b in zip(offsets, offsets[1:])):
        raise ValueError(f"{name}: offsets must be non-decreasing, got {offsets}")
    return offsets


def attention_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    *,
    seqused_k: Optional[torch.Tensor] = None,
    causal: bool = False,
    softmax_scale: Optional[float] = None,
    window: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[torch.Tensor] = None,
    dropout_p: float = 0.0,
    dropout_mask: Optional[torch.Tensor] = None,
    return_lse: bool = False,
    dtype: torch.dtype = torch.float64,
) -> Result:
    """:func:`attention` over a batch of packed sequences of different lengths.

    q is (total_q, nheads, headdim), k and v (total_k, nheads_kv, headdim; v's may differ).
    Sequence ``b`` is query rows ``cu_seqlens_q[b]:cu_seqlens_q[b+1]`` against keys
    ``cu_seqlens_k[b]:cu_seqlens_k[b+1]``, computed as one :func:`attention` call with the
    same keywords (masks aligned bottom-right within the sequence). With ``seqused_k``, it
    uses only the first ``seqused_k[b]`` of those keys, and the masks align to that length.
    Query rows outside every sequence give output 0 and lse -inf.

    Args:
        q, k, v: packed torch tensors of any floating dtype, on any device.
        cu_seqlens_q, cu_seqlens_k: 1-d int32 tensors of batch + 1 non-decreasing offsets
            within q's and k's rows.
        seqused_k: optional 1-d int32 tensor (batch,), each between 0 and its sequence's
            key count.
        causal, softmax_scale, window, softcap, return_lse, dtype: as in :func:`attention`.
        alibi_slopes: (nheads,) or (batch, nheads); row ``b`` applies to sequence ``b``.
        dropout_p: as in :func:`attention`.
        dropout_mask: bool (batch, nheads, max_q, max_k) keep mask, positions within each
            sequence: sequence ``b`` takes ``dropout_mask[b, :, :len_q, :len_k]`` (its own
            lengths, ``len_k`` its ``seqused_k`` where given), as the kernels do.

    Returns:
        The output, (total_q, nheads, v's headdim) in ``dtype``, or ``(out, lse)`` when
        ``return_lse``, lse (nheads, total_q) in ``dtype``, or float32 for float16/bfloat16.
    """
    _check(q, k, v, dtype, varlen=True)
    starts_q = _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.shape[0])
    starts_k = _check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, k.shape[0])
    batch = len(starts_q) - 1
    if len(starts_k) != batch + 1:
        raise ValueError(
            f"cu_seqlens_k: {len(starts_k)} offsets, but cu_seqlens_q has {len(starts_q)}"
        )
    lengths_k = [b - a for a, b in zip(starts_k, starts_k[1:])]
    if seqused_k is not None:
        if not isinstance(seqused_k, torch.Tensor):
            raise TypeError(
                f"seqused_k: expected a torch.Tensor, got {type(seqused_k).__qualname__}"
            )
        if seqused_k.dtype != torch.int32 or tuple(seqused_k.shape) != (batch,):
            raise ValueError(
                f"seqused_k: expected an int32 tensor of shape ({batch},), "
                f"got {seqused_k.dtype} of shape {tuple(seqused_k.shape)}"
            )
        used = seqused_k.tolist()
        if any(not 0 <= u <= n for u, n in zip(used, lengths_k)):
            raise ValueError(
                f"seqused_k: expected entries from 0 to the key counts {lengths_k}, got {used}"
            )
        lengths_k = used
    if alibi_slopes is not None:
        _check_alibi(alibi_slopes, batch, q.shape[1])
    # Checked here too so that a bad value is reported even when there is no sequence.
    _check_window(window)
    _check_softcap(softcap)
    _check_dropout_p(dropout_p)
    if dropout_mask is not None:
        longest_q = max((b - a for a, b in zip(starts_q, starts_q[1:])), default=0)
        _check_dropout_mask(dropout_mask, (batch, q.shape[1], longest_q, max(lengths_k, default=0)))

    total_q, nheads, headdim = q.shape
    lse_dtype = torch.float32 if dtype in _LOW_PRECISION else dtype
    out = torch.zeros(total_q, nheads, v.shape[-1], dtype=dtype, device=q.device)
    lse = torch.full((nheads, total_q), float("-inf"), dtype=lse_dtype, device=q.device)
    for b in range(batch):
        rows = slice(starts_q[b], starts_q[b + 1])
        keys = slice(starts_k[b], starts_k[b] + lengths_k[b])
        slopes = alibi_slopes
        if slopes is not None and slopes.dim() == 2:
            slopes = slopes[b]
        mask = None if dropout_mask is None else dropout_mask[b:b + 1]
        out_b, lse_b = attention(
            q[None, rows], k[None, keys], v[None, keys], causal=causal,
            softmax_scale=softmax_scale, window=window, softcap=softcap, alibi_slopes=slopes,
            dropout_p=dropout_p, dropout_mask=mask, return_lse=True, dtype=dtype,
        )
        out[rows] = out_b[0]  # sequences never overlap; autograd records the slice copies
        lse[:, rows] = lse_b[0]
    return (out, lse) if return_lse else out
