"""Plain-PyTorch attention with flashcute's semantics, for tests and error baselines."""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional, Sequence, Union

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


class KVCacheResult(NamedTuple):
    """What :func:`attention_with_kvcache` returns: the output and lse, and copies of the
    caches with the appended keys and values written in."""

    out: torch.Tensor
    lse: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor


def _int_rows(name: str, x: Any, shape: tuple[int, ...]) -> list[Any]:
    """An int32 tensor of ``shape`` as nested lists; TypeError/ValueError naming it."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__qualname__}")
    if x.dtype != torch.int32 or tuple(x.shape) != shape:
        raise ValueError(
            f"{name}: expected an int32 tensor of shape {shape}, got {x.dtype} of shape "
            f"{tuple(x.shape)}"
        )
    return x.tolist()


def _key_slots(
    cache: torch.Tensor, b: int, positions: torch.Tensor, table: Optional[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(first index, second index) of sequence ``b``'s key ``positions`` in a cache: (page,
    row in the page) through the page table, else (b, position)."""
    if table is None:
        return torch.full_like(positions, b), positions
    page_size = cache.shape[1]
    return table[b][positions // page_size], positions % page_size


def attention_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    *,
    cache_seqlens: torch.Tensor,
    page_table: Optional[torch.Tensor] = None,
    k_new: Optional[torch.Tensor] = None,
    v_new: Optional[torch.Tensor] = None,
    cu_seqlens_q: Optional[torch.Tensor] = None,
    max_seqlen_q: Optional[int] = None,
    causal: bool = False,
    softmax_scale: Optional[float] = None,
    window: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[torch.Tensor] = None,
    dtype: torch.dtype = torch.float64,
) -> KVCacheResult:
    """``flashcute.attention_with_kvcache``'s semantics, computed by :func:`attention` per
    sequence on the gathered cache; the given caches are not modified.

    The appends are written first, into copies of the caches: sequence ``b``'s ``k_new[b]``,
    ``v_new[b]`` at key positions ``cache_seqlens[b]`` onwards (key ``j`` of a paged cache is
    row ``j % page_size`` of page ``page_table[b, j // page_size]``). Then sequence ``b``'s
    first ``cache_seqlens[b] + seqlen_new`` keys are gathered into a contiguous sequence, and
    its queries (``q[b]``, or rows ``cu_seqlens_q[b]:cu_seqlens_q[b+1]`` of a packed q) attend
    to them as one :func:`attention` call with the same keywords (masks and ALiBi aligned
    bottom-right to that key count). Rows with no visible key, and packed rows outside every
    sequence (which the kernels leave unspecified), give zeros and lse -inf.

    Unlike the kernels, which clamp them, the values are checked here: key counts from 0 to
    the capacity less seqlen_new, page ids of the pages in use within ``[0, num_pages)``,
    offsets non-decreasing within q's rows, no sequence longer than ``max_seqlen_q``.

    Args:
        q: (batch, seqlen_q, nheads, headdim), or packed (total_q, nheads, headdim) with
            ``cu_seqlens_q``.
        k_cache, v_cache: (batch, seqlen_cache, nheads_kv, headdim), or paged
            (num_pages, page_size, nheads_kv, headdim) with ``page_table``.
        cache_seqlens: int32 (batch,), the keys before the append.
        page_table: int32 (batch, max_pages), or None for a contiguous cache.
        k_new, v_new: (batch, seqlen_new, nheads_kv, headdim), both or neither (batched q
            only).
        cu_seqlens_q: int32 (batch + 1,) offsets into a packed q; ``max_seqlen_q`` an upper
            bound of its sequences' lengths (optional here).
        causal, softmax_scale, window, softcap, alibi_slopes, dtype: as in :func:`attention`
            (``alibi_slopes`` (nheads,) or (batch, nheads)).

    Returns:
        ``KVCacheResult(out, lse, k_cache, v_cache)``: out like q with v's head dim, in
        ``dtype``; lse (batch, nheads, seqlen_q), or (nheads, total_q) when packed, in
        ``dtype`` (float32 for float16/bfloat16); the updated copies of the caches in their
        own dtype and layout.
    """
    varlen = cu_seqlens_q is not None
    rank = 3 if varlen else 4
    for name, x in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__qualname__}")
        if x.dim() != (rank if name == "q" else 4):
            raise ValueError(f"{name}: expected a {rank if name == 'q' else 4}-d tensor, got "
                             f"shape {tuple(x.shape)}")
    if k_cache.shape[:-1] != v_cache.shape[:-1]:
        raise ValueError(f"v_cache: shape {tuple(v_cache.shape)} does not match k_cache's "
                         f"{tuple(k_cache.shape)}")
    if varlen:
        assert cu_seqlens_q is not None
        starts = _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.shape[0])
        batch = len(starts) - 1
        longest = max((e - s for s, e in zip(starts, starts[1:])), default=0)
        if max_seqlen_q is not None and longest > max_seqlen_q:
            raise ValueError(f"max_seqlen_q: {max_seqlen_q} is below the longest sequence's "
                             f"{longest} queries")
        if k_new is not None or v_new is not None:
            raise ValueError("k_new: appends take a batched q only")
    else:
        batch = q.shape[0]
        starts = []
    lengths = _int_rows("cache_seqlens", cache_seqlens, (batch,))
    table = None
    if page_table is not None:
        if not isinstance(page_table, torch.Tensor) or page_table.dim() != 2:
            raise ValueError("page_table: expected a 2-d int32 tensor (batch, max_pages)")
        max_pages = page_table.shape[1]
        rows = _int_rows("page_table", page_table, (batch, max_pages))
        capacity = max_pages * k_cache.shape[1]
        table = torch.tensor(rows, dtype=torch.long, device=k_cache.device).reshape(batch, max_pages)
    else:
        if k_cache.shape[0] != batch:
            raise ValueError(f"k_cache: batch size {k_cache.shape[0]} does not match {batch}")
        capacity = k_cache.shape[1]
    if (k_new is None) != (v_new is None):
        raise ValueError("k_new, v_new: expected both or neither")
    seqlen_new = 0
    if k_new is not None and v_new is not None:
        seqlen_new = k_new.shape[1]
        want = (batch, seqlen_new, *k_cache.shape[2:])
        if tuple(k_new.shape) != want or tuple(v_new.shape) != (*want[:3], v_cache.shape[3]):
            raise ValueError(f"k_new: expected shape {want}, got {tuple(k_new.shape)} and v_new "
                             f"{tuple(v_new.shape)}")
    num_pages, page_size = k_cache.shape[0], k_cache.shape[1]
    for b, n in enumerate(lengths):
        if not 0 <= n <= capacity - seqlen_new:
            raise ValueError(
                f"cache_seqlens: sequence {b} holds {n} keys; with {seqlen_new} appended they "
                f"must fit the capacity of {capacity} keys"
            )
        if table is not None:
            used = table[b][: -(-(n + seqlen_new) // page_size)].tolist()
            if any(not 0 <= page < num_pages for page in used):
                raise ValueError(f"page_table: sequence {b} uses pages {used}, outside "
                                 f"[0, {num_pages})")

    k_all, v_all = k_cache.clone(), v_cache.clone()
    if k_new is not None and v_new is not None:
        for b, n in enumerate(lengths):
            slot = _key_slots(k_all, b, torch.arange(n, n + seqlen_new, device=k_all.device), table)
            k_all[slot] = k_new[b].to(k_all.dtype)
            v_all[slot] = v_new[b].to(v_all.dtype)

    nheads, headdim_v = q.shape[-2], v_cache.shape[-1]
    lse_dtype = torch.float32 if dtype in _LOW_PRECISION else dtype
    if varlen:
        out = torch.zeros(q.shape[0], nheads, headdim_v, dtype=dtype, device=q.device)
        lse = torch.full((nheads, q.shape[0]), float("-inf"), dtype=lse_dtype, device=q.device)
    else:
        out = torch.zeros(*q.shape[:3], headdim_v, dtype=dtype, device=q.device)
        lse = torch.full((batch, nheads, q.shape[1]), float("-inf"), dtype=lse_dtype,
                         device=q.device)
    for b, n in enumerate(lengths):
        slot = _key_slots(k_all, b, torch.arange(n + seqlen_new, device=k_all.device), table)
        keys, values = k_all[slot][None].to(q.device), v_all[slot][None].to(q.device)
        slopes = alibi_slopes
        if slopes is not None and slopes.dim() == 2:
            slopes = slopes[b]
        rows = slice(starts[b], starts[b + 1]) if varlen else slice(b, b + 1)
        q_b = q[None, rows] if varlen else q[rows]
        out_b, lse_b = attention(
            q_b, keys, values, causal=causal, softmax_scale=softmax_scale, window=window,
            softcap=softcap, alibi_slopes=slopes, return_lse=True, dtype=dtype,
        )
        if varlen:
            out[rows], lse[:, rows] = out_b[0], lse_b[0]
        else:
            out[rows], lse[rows] = out_b, lse_b
    return KVCacheResult(out, lse, k_all, v_all)


def merge_attention_states(
    out_a: torch.Tensor,
    lse_a: torch.Tensor,
    out_b: torch.Tensor,
    lse_b: torch.Tensor,
    *,
    dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``flashcute.merge_attention_states``'s semantics in ``dtype``: with
    ``lse = log(exp(lse_a) + exp(lse_b))``, ``out = exp(lse_a - lse) * out_a +
    exp(lse_b - lse) * out_b``, where a state whose lse is -inf adds nothing; rows with lse
    -inf in both give zeros and lse -inf.

    Args:
        out_a, out_b: (batch, seqlen, nheads, headdim), or packed (total, nheads, headdim).
        lse_a, lse_b: (batch, nheads, seqlen), or (nheads, total) for packed states.
        dtype: precision of the computation and of both results.

    Returns:
        ``(out, lse)`` of out_a's and lse_a's shapes, in ``dtype``.
    """
    for name, x in (("out_a", out_a), ("lse_a", lse_a), ("out_b", out_b), ("lse_b", lse_b)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__qualname__}")
    if out_a.dim() not in (3, 4) or out_b.shape != out_a.shape:
        raise ValueError(f"out_b: shape {tuple(out_b.shape)} does not match out_a's "
                         f"{tuple(out_a.shape)} (3-d or 4-d)")
    packed = out_a.dim() == 3
    want = (out_a.shape[1], out_a.shape[0]) if packed else (
        out_a.shape[0], out_a.shape[2], out_a.shape[1])
    for name, x in (("lse_a", lse_a), ("lse_b", lse_b)):
        if tuple(x.shape) != want:
            raise ValueError(f"{name}: expected shape {want}, got {tuple(x.shape)}")
    la, lb = lse_a.to(dtype), lse_b.to(dtype)
    lse = torch.logaddexp(la, lb)
    finite = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    # Row weights, broadcast to the output's (..., seqlen, nheads, 1) layout.
    wa, wb = torch.exp(la - finite), torch.exp(lb - finite)
    if packed:
        wa, wb = wa.transpose(0, 1)[..., None], wb.transpose(0, 1)[..., None]
    else:
        wa, wb = wa.transpose(1, 2)[..., None], wb.transpose(1, 2)[..., None]
    # A state whose lse is -inf adds nothing, whatever its output holds.
    zero = torch.zeros((), dtype=dtype, device=out_a.device)
    out = (torch.where(wa > 0, wa * out_a.to(dtype), zero)
           + torch.where(wb > 0, wb * out_b.to(dtype), zero))
    return out, lse


#: The names the tests and the issue use for these references.
attention_with_kvcache_reference = attention_with_kvcache
merge_attention_states_reference = merge_attention_states
