"""Argument checks of ``attention_with_kvcache`` and ``merge_attention_states``, with messages
that name the argument.

The cache is contiguous, (batch, seqlen_cache, nheads_kv, headdim), or paged,
(num_pages, page_size, nheads_kv, headdim) with an int32 ``page_table`` (batch, max_pages). The
values of ``cache_seqlens``, ``page_table`` and ``cu_seqlens_q`` live on the device and are not
read here (that would wait for the GPU, and break CUDA-graph capture): the kernels clamp them.
Only dtypes, ranks, shapes, strides and devices are checked, in the order of the other checks
(scalars, then tensors, devices last), so that CPU tensors exercise every check but the last.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any, Optional

from ._validate import (
    _alibi_infos,
    _check_devices,
    _check_dtypes,
    _check_headdim,
    _check_strides,
    _fmt,
    _Info,
    _inspect,
    _resolve_scalars,
    check_scalars,
    type_name,
)
from ._validate_varlen import MAX_SEQLEN, _check_int32_vector, check_max_seqlen

#: The most splits a call may ask for (the library's limit); 0 asks the library's heuristic.
MAX_NUM_SPLITS = 1024
#: The largest head dim ``merge_attention_states`` takes.
MERGE_MAX_HEADDIM = 256
#: Output dtypes ``merge_attention_states`` takes.
MERGE_DTYPES = ("float16", "bfloat16", "float32")


@dataclass(frozen=True)
class KVCacheProblem:
    """Sizes of a validated ``attention_with_kvcache`` call."""

    batch: int
    #: Query rows per sequence: q's seqlen_q, or with cu_seqlens_q the longest sequence's
    #: (max_seqlen_q, at most total_q).
    seqlen_q: int
    #: Packed query rows with cu_seqlens_q; -1 for a batched q.
    total_q: int
    nheads: int
    nheads_kv: int
    headdim: int
    headdim_v: int
    dtype: str
    device_id: int
    scale: float
    #: Keys the cache holds per sequence: seqlen_cache, or max_pages * page_size when paged.
    capacity: int
    #: (num_pages, page_size, max_pages) of a paged cache; None for a contiguous one.
    pages: Optional[tuple[int, int, int]] = None
    #: Keys appended per sequence (k_new's seqlen; 0: no append).
    seqlen_new: int = 0
    window_left: int = -1
    window_right: int = -1
    softcap: float = 0.0
    alibi: bool = False
    #: The num_splits argument (0: the library's heuristic picks).
    num_splits: int = 0

    @property
    def varlen(self) -> bool:
        return self.total_q >= 0

    @property
    def paged(self) -> bool:
        return self.pages is not None

    @property
    def out_shape(self) -> tuple[int, ...]:
        if self.varlen:
            return (self.total_q, self.nheads, self.headdim_v)
        return (self.batch, self.seqlen_q, self.nheads, self.headdim_v)

    @property
    def lse_shape(self) -> tuple[int, ...]:
        if self.varlen:
            return (self.nheads, self.total_q)
        return (self.batch, self.nheads, self.seqlen_q)

    @property
    def appends(self) -> bool:
        """Whether the call writes keys and values into the cache."""
        return self.batch > 0 and self.seqlen_new > 0 and self.nheads_kv > 0

    @property
    def launches(self) -> bool:
        """Whether there is anything to do: query rows to compute, or keys to append."""
        has_rows = self.batch > 0 and self.seqlen_q > 0 and self.nheads > 0
        return has_rows or self.appends


@dataclass(frozen=True)
class MergeProblem:
    """Sizes of a validated ``merge_attention_states`` call, as 4-d (batch, seqlen, nheads,
    headdim) states (packed 3-d states are batch 1)."""

    batch: int
    seqlen: int
    nheads: int
    headdim: int
    dtype: str
    device_id: int
    #: The states were packed (total, nheads, headdim) with lse (nheads, total).
    packed: bool

    @property
    def out_shape(self) -> tuple[int, ...]:
        if self.packed:
            return (self.seqlen, self.nheads, self.headdim)
        return (self.batch, self.seqlen, self.nheads, self.headdim)

    @property
    def lse_shape(self) -> tuple[int, ...]:
        if self.packed:
            return (self.nheads, self.seqlen)
        return (self.batch, self.nheads, self.seqlen)

    @property
    def empty(self) -> bool:
        return self.batch == 0 or self.seqlen == 0 or self.nheads == 0


def check_num_splits(num_splits: Any) -> int:
    """``num_splits`` as an int in [0, MAX_NUM_SPLITS] (0: the heuristic); bools and floats
    are refused."""
    if type(num_splits) is not int and (
        isinstance(num_splits, bool) or not isinstance(num_splits, numbers.Integral)
    ):
        raise TypeError(f"num_splits: expected an int, got {type_name(num_splits)}")
    if not 0 <= num_splits <= MAX_NUM_SPLITS:
        raise ValueError(
            f"num_splits: expected an int from 0 (the library's heuristic) to {MAX_NUM_SPLITS}, "
            f"got {num_splits}"
        )
    return int(num_splits)


def check_kvcache_scalars(
    causal: Any, softmax_scale: Any, backend: Any, window: Any, softcap: Any, num_splits: Any,
    max_seqlen_q: Any, varlen: bool,
) -> tuple[int, Optional[int]]:
    """The scalar arguments; returns num_splits and max_seqlen_q (None without cu_seqlens_q)."""
    check_scalars(causal, softmax_scale, backend, window, softcap)
    splits = check_num_splits(num_splits)
    if not varlen:
        if max_seqlen_q is not None:
            raise ValueError(
                "max_seqlen_q: given without cu_seqlens_q; a batched q (batch, seqlen_q, nheads, "
                "headdim) has its own length"
            )
        return splits, None
    if max_seqlen_q is None:
        raise TypeError(
            "max_seqlen_q: expected an int with cu_seqlens_q (the longest sequence's query "
            "count), got None"
        )
    return splits, check_max_seqlen("max_seqlen_q", max_seqlen_q)


def _check_rank(info: _Info, rank: int, layout: str) -> None:
    if len(info.shape) != rank:
        raise ValueError(
            f"{info.name}: expected a {rank}-d tensor {layout}, got shape {_fmt(info.shape)}"
        )


def _q_layout(varlen: bool) -> tuple[int, str]:
    if varlen:
        return 3, "(total_q, nheads, headdim) with cu_seqlens_q"
    return 4, "(batch, seqlen_q, nheads, headdim)"


def _cache_layout(paged: bool) -> str:
    if paged:
        return "(num_pages, page_size, nheads_kv, headdim) with page_table"
    return "(batch, seqlen_cache, nheads_kv, headdim)"


def _check_append_pair(k_new: Any, v_new: Any, varlen: bool) -> None:
    if (k_new is None) != (v_new is None):
        given, missing = ("k_new", "v_new") if v_new is None else ("v_new", "k_new")
        raise ValueError(f"{missing}: expected together with {given} (both or neither), got None")
    if k_new is not None and varlen:
        raise ValueError(
            "k_new: appends take a batched q (batch, seqlen_q, nheads, headdim) only; with "
            "cu_seqlens_q the new keys must already be in the cache"
        )


def _check_cache_shapes(
    q: _Info, k: _Info, v: _Info, batch: int, batch_source: str, paged: bool
) -> None:
    """k_cache against q (head dim, heads), v_cache against k_cache, and for a contiguous
    cache its batch."""
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(
            f"k_cache: head dim {k.shape[-1]} does not match q's {q.shape[-1]} "
            f"(q shape {_fmt(q.shape)}, k_cache shape {_fmt(k.shape)})"
        )
    if v.shape[:-1] != k.shape[:-1]:
        raise ValueError(
            f"v_cache: shape {_fmt(v.shape)} does not match k_cache's shape {_fmt(k.shape)}"
        )
    if v.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"v_cache: head dim {v.shape[-1]} differs from k_cache's {k.shape[-1]}; the KV-cache "
            f"kernels take one head dim for q, k and v"
        )
    nheads, nheads_kv = q.shape[-2], k.shape[2]
    if (nheads_kv == 0 and nheads != 0) or (nheads_kv != 0 and nheads % nheads_kv != 0):
        raise ValueError(
            f"q, k_cache: q's {nheads} heads are not a multiple of the cache's {nheads_kv} heads "
            f"(grouped-query attention needs nheads % nheads_kv == 0)"
        )
    if paged:
        num_pages, page_size = k.shape[0], k.shape[1]
        if num_pages < 1 or page_size < 1:
            raise ValueError(
                f"k_cache: a paged cache needs at least one page of at least one key, got shape "
                f"{_fmt(k.shape)} (num_pages, page_size, nheads_kv, headdim)"
            )
    elif k.shape[0] != batch:
        raise ValueError(
            f"k_cache: batch size {k.shape[0]} does not match {batch_source} {batch} "
            f"(a contiguous cache holds one row of keys per sequence; pass page_table for a "
            f"paged cache)"
        )


def _check_new(k_new: _Info, v_new: _Info, k: _Info, batch: int, capacity: int) -> int:
    """k_new and v_new against the cache; returns the number of keys appended per sequence."""
    seqlen_new = k_new.shape[1]
    want = (batch, seqlen_new, k.shape[2], k.shape[3])
    if k_new.shape != want:
        raise ValueError(
            f"k_new: expected shape {_fmt(want)} (batch, seqlen_new, nheads_kv, headdim), got "
            f"{_fmt(k_new.shape)}"
        )
    if v_new.shape != want:
        raise ValueError(
            f"v_new: expected shape {_fmt(want)} (k_new's), got {_fmt(v_new.shape)}"
        )
    if seqlen_new > capacity:
        raise ValueError(
            f"k_new: {seqlen_new} new keys per sequence do not fit the cache's {capacity} keys "
            f"per sequence"
        )
    return seqlen_new


def _check_page_table(info: _Info, batch: int) -> int:
    """int32 (batch, max_pages >= 1) with unit stride over pages; returns max_pages."""
    if info.dtype != "int32":
        raise TypeError(f"page_table: expected an int32 tensor, got {info.dtype}")
    if len(info.shape) != 2 or info.shape[0] != batch or info.shape[1] < 1:
        raise ValueError(
            f"page_table: expected shape ({batch}, max_pages), a row of max_pages >= 1 page ids "
            f"per sequence, got {_fmt(info.shape)}"
        )
    rows, max_pages = info.shape
    if max_pages > 1 and info.strides[1] != 1:
        raise ValueError(
            f"page_table: expected unit stride over pages (the last dimension), got strides "
            f"{_fmt(info.strides)}"
        )
    if rows > 1 and max_pages > 0 and info.strides[0] <= 0:
        raise ValueError(
            f"page_table: expected a positive row stride, got strides {_fmt(info.strides)}"
        )
    return max_pages


def _check_out(out: _Info, shape: tuple[int, ...], layout: str) -> None:
    if out.shape != shape:
        raise ValueError(f"out: expected shape {_fmt(shape)} {layout}, got {_fmt(out.shape)}")


def kvcache_problem(
    q: Any, k_cache: Any, v_cache: Any, *, cache_seqlens: Any, page_table: Any = None,
    k_new: Any = None, v_new: Any = None, cu_seqlens_q: Any = None, max_seqlen_q: Any = None,
    causal: Any = False, softmax_scale: Any = None, window: Any = (-1, -1), softcap: Any = 0.0,
    alibi_slopes: Any = None, num_splits: Any = 0, out: Any = None, backend: Any = None,
) -> tuple[KVCacheProblem, list[_Info]]:
    """``validate_kvcache`` without its last check (devices): the problem and the tensors'
    infos, q's first."""
    varlen = cu_seqlens_q is not None
    splits, max_q = check_kvcache_scalars(
        causal, softmax_scale, backend, window, softcap, num_splits, max_seqlen_q, varlen
    )
    _check_append_pair(k_new, v_new, varlen)
    paged = page_table is not None
    q_rank, q_layout = _q_layout(varlen)
    tensors = {"q": q, "k_cache": k_cache, "v_cache": v_cache, "k_new": k_new, "v_new": v_new,
               "out": out}
    infos = {name: _inspect(name, x) for name, x in tensors.items() if x is not None}
    for name, info in infos.items():
        if name in ("q", "out"):
            _check_rank(info, q_rank, q_layout)
        elif name in ("k_cache", "v_cache"):
            _check_rank(info, 4, _cache_layout(paged))
        else:
            _check_rank(info, 4, "(batch, seqlen_new, nheads_kv, headdim)")
    qi, ki, vi = infos["q"], infos["k_cache"], infos["v_cache"]
    others = [info for name, info in infos.items() if name != "q"]
    _check_dtypes(qi, others)

    if cache_seqlens is None:
        raise TypeError("cache_seqlens: expected an int32 tensor (batch,), got None")
    vectors = [_inspect("cache_seqlens", cache_seqlens)]
    if varlen:
        cu = _inspect("cu_seqlens_q", cu_seqlens_q)
        _check_int32_vector(cu)
        if cu.shape[0] < 2:
            raise ValueError(
                f"cu_seqlens_q: expected batch + 1 >= 2 offsets (the first row of each "
                f"sequence, then the end of the last), got {cu.shape[0]}"
            )
        vectors.append(cu)
        batch, batch_source = cu.shape[0] - 1, "cu_seqlens_q's sequence count"
    else:
        batch, batch_source = qi.shape[0], "q's batch size"
    _check_cache_shapes(qi, ki, vi, batch, batch_source, paged)
    nheads, headdim = qi.shape[-2], qi.shape[-1]
    _check_headdim(headdim)
    if paged:
        table = _inspect("page_table", page_table)
        max_pages = _check_page_table(table, batch)
        vectors.append(table)
        pages: Optional[tuple[int, int, int]] = (ki.shape[0], ki.shape[1], max_pages)
        capacity = max_pages * ki.shape[1]
        if capacity > MAX_SEQLEN:
            raise ValueError(
                f"page_table: max_pages * page_size = {capacity} keys per sequence; the kernels "
                f"take at most {MAX_SEQLEN}"
            )
    else:
        pages, capacity = None, ki.shape[1]
        if capacity > MAX_SEQLEN:
            raise ValueError(
                f"k_cache: {capacity} keys per sequence; the kernels take at most {MAX_SEQLEN}"
            )
    seqlen_new = 0
    if k_new is not None:
        seqlen_new = _check_new(infos["k_new"], infos["v_new"], ki, batch, capacity)
    if "out" in infos:
        _check_out(infos["out"], (*qi.shape[:-1], vi.shape[-1]),
                   "(q's shape)" if not varlen else "(total_q, nheads, headdim)")
    for info in infos.values():
        _check_strides(info)
    seqlens = vectors[0]
    _check_int32_vector(seqlens)
    if seqlens.shape != (batch,):
        raise ValueError(
            f"cache_seqlens: expected shape ({batch},), one key count per sequence, got "
            f"{_fmt(seqlens.shape)}"
        )
    scale, cap, window_left, window_right = _resolve_scalars(headdim, softmax_scale, softcap, window)
    vectors += _alibi_infos(alibi_slopes, batch, nheads, _inspect)
    if varlen:
        total_q = qi.shape[0]
        seqlen_q = min(max_q if max_q is not None else 0, total_q, MAX_SEQLEN)
    else:
        total_q, seqlen_q = -1, qi.shape[1]
    problem = KVCacheProblem(
        batch=batch, seqlen_q=seqlen_q, total_q=total_q, nheads=nheads, nheads_kv=ki.shape[2],
        headdim=headdim, headdim_v=vi.shape[-1], dtype=qi.dtype, device_id=qi.device_id,
        scale=scale, capacity=capacity, pages=pages, seqlen_new=seqlen_new,
        window_left=window_left, window_right=window_right, softcap=cap,
        alibi=alibi_slopes is not None, num_splits=splits,
    )
    return problem, [qi, *others, *vectors]


def validate_kvcache(
    q: Any, k_cache: Any, v_cache: Any, *, cache_seqlens: Any, page_table: Any = None,
    k_new: Any = None, v_new: Any = None, cu_seqlens_q: Any = None, max_seqlen_q: Any = None,
    causal: Any = False, softmax_scale: Any = None, window: Any = (-1, -1), softcap: Any = 0.0,
    alibi_slopes: Any = None, num_splits: Any = 0, out: Any = None, backend: Any = None,
) -> KVCacheProblem:
    """Check the arguments of an ``attention_with_kvcache`` call and describe the problem.

    Args:
        q: (batch, seqlen_q, nheads, headdim), or (total_q, nheads, headdim) with cu_seqlens_q;
            float16 or bfloat16.
        k_cache, v_cache: (batch, seqlen_cache, nheads_kv, headdim), or with page_table
            (num_pages, page_size, nheads_kv, headdim) with at least one page of at least one
            key; q's dtype and head dim; nheads % nheads_kv == 0.
        cache_seqlens: int32 (batch,), contiguous.
        page_table: None, or int32 (batch, max_pages >= 1) with unit stride over pages.
        k_new, v_new: None, or both (batch, seqlen_new, nheads_kv, headdim) of q's dtype, with
            a batched q only; seqlen_new at most the cache's capacity.
        cu_seqlens_q: None, or int32 (batch + 1,) offsets, contiguous.
        max_seqlen_q: an int >= 0 with cu_seqlens_q, None without.
        causal, softmax_scale, window, softcap, backend: as in ``validate_forward``.
        alibi_slopes: None, or float32 (nheads,) or (batch, nheads) with unit stride over heads.
        num_splits: an int from 0 (the library's heuristic) to 1024.
        out: None, or a tensor of q's shape (v's head dim) and dtype.

    Every tensor must have unit stride in its last dimension, positive strides elsewhere, and
    live on one CUDA device. The values of cache_seqlens, page_table and cu_seqlens_q are not
    read.

    Raises:
        TypeError: a non-DLPack argument, wrong dtypes, a non-int num_splits or max_seqlen_q.
        ValueError: wrong ranks, shapes, strides, devices, head dim or scalars.
    """
    problem, infos = kvcache_problem(
        q, k_cache, v_cache, cache_seqlens=cache_seqlens, page_table=page_table, k_new=k_new,
        v_new=v_new, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q, causal=causal,
        softmax_scale=softmax_scale, window=window, softcap=softcap, alibi_slopes=alibi_slopes,
        num_splits=num_splits, out=out, backend=backend,
    )
    _check_devices(infos[0], infos[1:])
    return problem


def _check_state_pair(out: _Info, other: _Info) -> None:
    if out.dtype not in MERGE_DTYPES:
        raise TypeError(f"{out.name}: expected float16, bfloat16 or float32, got {out.dtype}")
    if other.dtype != out.dtype:
        raise TypeError(f"{other.name}: dtype {other.dtype} does not match out_a's {out.dtype}")
    if other.shape != out.shape:
        raise ValueError(
            f"{other.name}: shape {_fmt(other.shape)} does not match out_a's {_fmt(out.shape)}"
        )


def _check_lse(info: _Info, want: tuple[int, ...], layout: str) -> None:
    if info.dtype != "float32":
        raise TypeError(f"{info.name}: expected float32, got {info.dtype}")
    if info.shape != want:
        raise ValueError(
            f"{info.name}: expected shape {_fmt(want)} {layout}, got {_fmt(info.shape)}"
        )


def merge_problem(out_a: Any, lse_a: Any, out_b: Any, lse_b: Any) -> tuple[MergeProblem, list[_Info]]:
    """``validate_merge`` without its last check (devices)."""
    infos = [_inspect(name, x) for name, x in
             (("out_a", out_a), ("lse_a", lse_a), ("out_b", out_b), ("lse_b", lse_b))]
    oa, la, ob, lb = infos
    if len(oa.shape) not in (3, 4):
        raise ValueError(
            f"out_a: expected a 4-d tensor (batch, seqlen, nheads, headdim) or a 3-d packed "
            f"(total, nheads, headdim), got shape {_fmt(oa.shape)}"
        )
    _check_state_pair(oa, ob)
    if oa.shape[-1] > MERGE_MAX_HEADDIM:
        raise ValueError(
            f"out_a: head dim {oa.shape[-1]} is larger than {MERGE_MAX_HEADDIM}, the largest the "
            f"merge takes"
        )
    packed = len(oa.shape) == 3
    if packed:
        batch, (seqlen, nheads, headdim) = 1, oa.shape
        want, layout = (nheads, seqlen), "(nheads, total)"
    else:
        batch, seqlen, nheads, headdim = oa.shape
        want, layout = (batch, nheads, seqlen), "(batch, nheads, seqlen)"
    for info in (oa, ob):
        _check_strides(info)
    for info in (la, lb):
        _check_lse(info, want, layout)
    problem = MergeProblem(batch=batch, seqlen=seqlen, nheads=nheads, headdim=headdim,
                           dtype=oa.dtype, device_id=oa.device_id, packed=packed)
    return problem, infos


def validate_merge(out_a: Any, lse_a: Any, out_b: Any, lse_b: Any) -> MergeProblem:
    """Check the arguments of a ``merge_attention_states`` call.

    Args:
        out_a, out_b: (batch, seqlen, nheads, headdim), or packed (total, nheads, headdim); one
            shape and one dtype of float16, bfloat16 or float32; head dim at most 256; unit
            stride in the last dimension, positive strides elsewhere.
        lse_a, lse_b: float32 (batch, nheads, seqlen), or (nheads, total) for packed states;
            any strides.

    Every tensor must live on one CUDA device.

    Raises:
        TypeError: a non-DLPack argument or a wrong dtype.
        ValueError: wrong ranks, shapes, strides or devices.
    """
    problem, infos = merge_problem(out_a, lse_a, out_b, lse_b)
    _check_devices(infos[0], infos[1:])
    return problem
