"""Plain-PyTorch attention with flashcute's semantics, for tests and error baselines."""

from __future__ import annotations

import math
from typing import Optional, Union

import torch

_LOW_PRECISION = (torch.float16, torch.bfloat16)
_DTYPES = (torch.float64, torch.float32, *_LOW_PRECISION)


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dtype: torch.dtype) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__qualname__}")
        if x.dim() != 4:
            raise ValueError(
                f"{name}: expected a 4-d tensor (batch, seqlen, nheads, headdim), "
                f"got shape {tuple(x.shape)}"
            )
    if dtype not in _DTYPES:
        raise TypeError(f"dtype: expected one of {_DTYPES}, got {dtype}")
    if k.shape != v.shape:
        raise ValueError(f"v: shape {tuple(v.shape)} does not match k's {tuple(k.shape)}")
    if k.shape[0] != q.shape[0] or k.shape[3] != q.shape[3]:
        raise ValueError(
            f"k: shape {tuple(k.shape)} does not match q's {tuple(q.shape)} in batch or headdim"
        )
    nheads, nheads_kv = q.shape[2], k.shape[2]
    if (nheads_kv == 0 and nheads != 0) or (nheads_kv != 0 and nheads % nheads_kv != 0):
        raise ValueError(f"q, k: {nheads} query heads are not a multiple of {nheads_kv} kv heads")


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    softmax_scale: Optional[float] = None,
    return_lse: bool = False,
    dtype: torch.dtype = torch.float64,
) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Attention ``softmax(scale * q @ k^T) @ v`` computed by materialising the scores.

    Same semantics as ``flashcute.attention``: q is (batch, seqlen_q, nheads, headdim),
    k and v are (batch, seqlen_k, nheads_kv, headdim) with nheads % nheads_kv == 0 (query
    head ``h`` uses kv head ``h // (nheads // nheads_kv)``). With ``causal``, query ``i``
    attends key ``j`` iff ``j <= i + seqlen_k - seqlen_q`` (bottom-right aligned); a query
    with no key to attend to gives output 0 and lse -inf, never NaN.

    Args:
        q, k, v: torch tensors of any floating dtype, on any device.
        causal: apply the bottom-right aligned causal mask.
        softmax_scale: multiplies the scores; default 1/sqrt(headdim).
        return_lse: also return the natural-log log-sum-exp of the scaled, masked scores,
            shape (batch, nheads, seqlen_q).
        dtype: precision of the computation. float64 (default) or float32 compute
            everything in that dtype. float16 or bfloat16 (typically the inputs' own dtype,
            to measure PyTorch's own error at that precision) do both matmuls in that dtype
            and the softmax in float32, as PyTorch's math attention roughly does.

    Returns:
        The output, (batch, seqlen_q, nheads, headdim) in ``dtype``, or ``(out, lse)``
        when ``return_lse``; lse is in ``dtype``, or float32 for float16/bfloat16.
    """
    _check(q, k, v, dtype)
    nheads, headdim = q.shape[2], q.shape[3]
    seqlen_q, seqlen_k, nheads_kv = q.shape[1], k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(headdim) if softmax_scale is None else float(softmax_scale)
    acc = torch.float32 if dtype in _LOW_PRECISION else dtype

    qt = q.to(dtype).transpose(1, 2)  # (batch, nheads, seqlen_q, headdim)
    kt = k.to(dtype).transpose(1, 2)
    vt = v.to(dtype).transpose(1, 2)
    if nheads_kv not in (0, nheads):
        kt = kt.repeat_interleave(nheads // nheads_kv, dim=1)
        vt = vt.repeat_interleave(nheads // nheads_kv, dim=1)

    scores = torch.matmul(qt, kt.transpose(-1, -2)).to(acc) * scale
    if causal:
        rows = torch.arange(seqlen_q, device=q.device)[:, None]
        cols = torch.arange(seqlen_k, device=q.device)[None, :]
        scores = scores.masked_fill(cols > rows + (seqlen_k - seqlen_q), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # -inf for rows with no key
    finite_lse = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    probs = torch.exp(scores - finite_lse.unsqueeze(-1))  # masked entries: exp(-inf) = 0
    out = torch.matmul(probs.to(dtype), vt).transpose(1, 2).contiguous()
    return (out, lse) if return_lse else out
