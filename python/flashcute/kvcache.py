"""Attention against a key/value cache (``flashcute.attention_with_kvcache``), contiguous or
paged, with in-place appends and split-KV decoding, and the merge of two partial attention
states (``flashcute.merge_attention_states``), on DLPack tensors."""

from __future__ import annotations

from typing import Any, Optional, Sequence

from ._build_info import extension_with
from ._dispatch import _code
from ._frameworks import ALLOCATING_FRAMEWORKS, Framework, export, framework_of, launchable
from ._validate import check_softcap, kernel_window, type_name
from ._validate_kvcache import (
    KVCacheProblem,
    MergeProblem,
    check_kvcache_scalars,
    validate_kvcache,
    validate_merge,
)
from .attention import _allocator, _check_outs, check_torch_slopes
from .varlen import _torch_call


def kvcache_extension() -> Any:
    """``flashcute._C``, refusing a build whose binding predates KV-cache attention."""
    return extension_with("KV-cache attention (kvcache_forward)", "kvcache_forward", "kvcache_plan")


def merge_extension() -> Any:
    """``flashcute._C``, refusing a build whose binding predates ``merge_states``."""
    return extension_with("merge_states", "merge_states")


def backend_code(ext: Any, backend: Optional[str]) -> int:
    """The extension's code of a backend name (None: auto). The library decides which path
    runs a KV-cache call and refuses a backend that cannot run one."""
    return _code(ext, backend)


def kvcache_plan(
    ext: Any, problem: KVCacheProblem, causal: bool, code: int, num_splits: Optional[int] = None,
    copy_pages: bool = True,
) -> tuple[int, int]:
    """(num_splits to launch with, workspace bytes) of a validated problem, as the library
    plans it; ``num_splits`` overrides the problem's (0: the heuristic); ``copy_pages=False``
    keeps a paged prefill on the pages instead of a contiguous copy in the workspace."""
    splits, nbytes = ext.kvcache_plan(
        problem.batch, problem.seqlen_q, problem.nheads, problem.nheads_kv, problem.headdim,
        problem.headdim_v, problem.capacity,
        problem.num_splits if num_splits is None else num_splits, problem.total_q,
        problem.dtype, causal, problem.window_left, problem.window_right, problem.alibi,
        problem.device_id, code, problem.pages[1] if problem.pages is not None else 0, copy_pages,
    )
    return int(splits), int(nbytes)


def _check_frontdoor(return_lse: Any, window: Any, softcap: Any) -> tuple[tuple[int, int], float]:
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse: expected a bool, got {type_name(return_lse)}")
    return kernel_window(window), check_softcap(softcap)


def attention_with_kvcache(
    q: Any,
    k_cache: Any,
    v_cache: Any,
    *,
    cache_seqlens: Any,
    page_table: Any = None,
    k_new: Any = None,
    v_new: Any = None,
    cu_seqlens_q: Any = None,
    max_seqlen_q: Optional[int] = None,
    causal: bool = False,
    softmax_scale: Optional[float] = None,
    window: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Any = None,
    num_splits: int = 0,
    return_lse: bool = False,
    out: Any = None,
    backend: Optional[str] = None,
) -> Any:
    """Attention of q against a key/value cache, after appending new keys and values to it.

    Sequence ``b`` first writes ``k_new[b]``, ``v_new[b]`` (when given) into its cache at key
    positions ``cache_seqlens[b]`` to ``cache_seqlens[b] + seqlen_new - 1`` (across page
    boundaries), then its queries attend to its first ``cache_seqlens[b] + seqlen_new`` keys:
    one ``flashcute.attention`` call per sequence, with masks (causal, window) and ALiBi
    aligned bottom-right to that key count. ``cache_seqlens`` is not advanced: the caller does
    that (as with FlashAttention).

    Args:
        q: (batch, seqlen_q, nheads, headdim), or with ``cu_seqlens_q`` packed
            (total_q, nheads, headdim); float16 or bfloat16 on a CUDA device; headdim a
            multiple of 8 up to 256.
        k_cache, v_cache: the cache, q's dtype and head dim, nheads a multiple of nheads_kv:
            contiguous (batch, seqlen_cache, nheads_kv, headdim), or with ``page_table`` paged
            (num_pages, page_size, nheads_kv, headdim), any page_size >= 1.
        cache_seqlens: int32 (batch,): the keys each sequence holds before the append.
        page_table: int32 (batch, max_pages): the pages of sequence ``b`` in order; key ``j``
            is row ``j % page_size`` of page ``page_table[b, j // page_size]``. None: the cache
            is contiguous.
        k_new, v_new: (batch, seqlen_new, nheads_kv, headdim), q's dtype, given together, with
            a batched q only (with ``cu_seqlens_q`` the new keys must already be in the cache).
        cu_seqlens_q: int32 (batch + 1,) offsets of the packed q's sequences (chunked
            prefill); rows outside every sequence hold unspecified values (unwritten, or
            zeros where the call runs split).
        max_seqlen_q: with ``cu_seqlens_q``, an int at least the longest sequence's query
            count; None otherwise.
        causal, softmax_scale, window, softcap, alibi_slopes: as in ``flashcute.attention``,
            with ``seqlen_k`` the sequence's ``cache_seqlens[b] + seqlen_new``.
        num_splits: how many parts each sequence's keys are split into (split-KV), each part
            reduced on its own and the parts merged over their lse; 0 (default) lets the
            library choose from the problem's size and the GPU. 1 does not split.
        return_lse: also return the float32 log-sum-exp, (batch, nheads, seqlen_q), or
            (nheads, total_q) with ``cu_seqlens_q``.
        out: optional tensor of q's shape and dtype to write into (not for jax arrays); it is
            returned.
        backend: None (the library chooses: on sm90 the Hopper path from 128 query rows per
            sequence where its loads read the pages or from 1024 rows per K/V head, where short
            pages are copied into a contiguous workspace first; else the Ampere path), "ampere"
            or "hopper" (pages that its loads cannot read are copied; refused where no workspace
            can be allocated).

    The values of ``cache_seqlens``, ``page_table`` and ``cu_seqlens_q`` are read only on the
    device, where the kernels clamp them into the tensors: values that break the rules above
    (page ids outside ``[0, num_pages)``, key counts below 0 or beyond the cache) give
    unspecified results but never touch memory outside the tensors. Nothing waits for the
    GPU or allocates outside q's framework, so a decode step with fixed shapes can be captured
    in a CUDA graph and replayed with new ``cache_seqlens`` and ``page_table`` contents.

    Rows with no visible key give zeros and lse = -inf. The call is not differentiable: the
    results never require grad. Torch tensors go through the custom op
    ``flashcute::attention_with_kvcache`` (``..._out`` with ``out=``; both declare k_cache
    and v_cache mutated) where a compiler or transform watches, else straight to the kernels;
    cupy and jax arrays through DLPack (a jax cache cannot take appends: jax arrays are
    immutable). The kernels run on the caller's current stream.

    Returns:
        The output (``out`` itself when given), or ``(output, lse)`` when ``return_lse``.

    Raises:
        TypeError, ValueError: invalid arguments; messages name the argument.
        RuntimeError: no usable GPU, or a CUDA error.
        ImportError: the compiled extension is missing or predates KV-cache attention.
    """
    window, softcap = _check_frontdoor(return_lse, window, softcap)
    tensors = (q, k_cache, v_cache, cache_seqlens, page_table, k_new, v_new, cu_seqlens_q, out)
    if cache_seqlens is not None and _torch_call(*tensors):
        num_splits, max_seqlen_q = check_kvcache_scalars(
            causal, softmax_scale, backend, window, softcap, num_splits, max_seqlen_q,
            cu_seqlens_q is not None,
        )
        check_torch_slopes(alibi_slopes)
        from . import _torch_kvcache

        return _torch_kvcache.attention_with_kvcache(
            q, k_cache, v_cache, cache_seqlens=cache_seqlens, page_table=page_table, k_new=k_new,
            v_new=v_new, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q, causal=causal,
            softmax_scale=softmax_scale, window=window, softcap=softcap,
            alibi_slopes=alibi_slopes, num_splits=num_splits, return_lse=return_lse, out=out,
            backend=backend,
        )
    return attention_with_kvcache_dlpack(
        q, k_cache, v_cache, cache_seqlens=cache_seqlens, page_table=page_table, k_new=k_new,
        v_new=v_new, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q, causal=causal,
        softmax_scale=softmax_scale, window=window, softcap=softcap, alibi_slopes=alibi_slopes,
        num_splits=num_splits, return_lse=return_lse, out=out, backend=backend,
    )


def _check_appendable(k_cache: Any, v_cache: Any) -> None:
    """ValueError naming the cache when appends would have to write into a jax array."""
    for name, x in (("k_cache", k_cache), ("v_cache", v_cache)):
        adapter = framework_of(x)
        if adapter is not None and adapter.name == "jax":
            raise ValueError(
                f"{name}: jax arrays are immutable, and k_new/v_new are appended into the cache "
                f"in place; write the new keys into the cache with jax and call without k_new"
            )


def _prepare(alloc: Optional[Framework], xs: Sequence[Any]) -> bool:
    """Before a launch for an adapter that needs it (jax): wait for the inputs. Returns
    whether the stream must be synchronized after the launch."""
    if alloc is None or not alloc.synchronize_after:
        return False
    for x in xs:
        adapter = framework_of(x) if x is not None else None
        if adapter is not None:
            adapter.prepare(x)
    return True


def _synchronize(ext: Any, stream: int, device_id: int) -> None:
    if not hasattr(ext, "synchronize"):
        raise RuntimeError(
            "flashcute: this build of flashcute._C has no synchronize(), which jax arrays need; "
            "reinstall the package with `pip install .`"
        )
    ext.synchronize(stream, device_id)


def attention_with_kvcache_dlpack(
    q: Any, k_cache: Any, v_cache: Any, *, cache_seqlens: Any, page_table: Any = None,
    k_new: Any = None, v_new: Any = None, cu_seqlens_q: Any = None,
    max_seqlen_q: Optional[int] = None, causal: bool = False,
    softmax_scale: Optional[float] = None, window: Sequence[int] = (-1, -1),
    softcap: float = 0.0, alibi_slopes: Any = None, num_splits: int = 0,
    return_lse: bool = False, out: Any = None, backend: Optional[str] = None,
) -> Any:
    """``attention_with_kvcache`` through DLPack, for every framework (the route of cupy and
    jax calls)."""
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse: expected a bool, got {type_name(return_lse)}")
    named = dict(q=q, k_cache=k_cache, v_cache=v_cache, cache_seqlens=cache_seqlens,
                 page_table=page_table, k_new=k_new, v_new=v_new, cu_seqlens_q=cu_seqlens_q,
                 alibi_slopes=alibi_slopes, out=out)
    x = {name: export(value) if value is not None else None for name, value in named.items()}
    problem = validate_kvcache(
        x["q"], x["k_cache"], x["v_cache"], cache_seqlens=x["cache_seqlens"],
        page_table=x["page_table"], k_new=x["k_new"], v_new=x["v_new"],
        cu_seqlens_q=x["cu_seqlens_q"], max_seqlen_q=max_seqlen_q, causal=causal,
        softmax_scale=softmax_scale, window=window, softcap=softcap,
        alibi_slopes=x["alibi_slopes"], num_splits=num_splits, out=x["out"], backend=backend,
    )
    _check_outs(out)
    if problem.appends:
        _check_appendable(k_cache, v_cache)
    alloc, like = _allocator(q, out, return_lse)
    ext = kvcache_extension()
    code = backend_code(ext, backend)
    result = out if out is not None else alloc.empty(like, problem.out_shape, problem.dtype)
    lse = alloc.empty(like, problem.lse_shape, "float32") if return_lse else None
    if problem.launches:
        splits, nbytes = kvcache_plan(ext, problem, causal, code)
        copy_pages = alloc is not None
        if nbytes > 0 and not copy_pages:  # nothing can allocate a workspace: unsplit, on the pages
            splits, nbytes = kvcache_plan(ext, problem, causal, code, num_splits=1, copy_pages=False)
        workspace = alloc.empty(like, (nbytes,), "uint8") if nbytes > 0 else None
        sync = _prepare(alloc, list(x.values()))
        stream = alloc.stream(like) if alloc is not None else 0
        result_x = x["out"] if out is not None else result
        a = {name: launchable(value) for name, value in x.items() if name != "out"}
        ext.kvcache_forward(
            a["q"], a["k_cache"], a["v_cache"], launchable(result_x), launchable(lse),
            a["cache_seqlens"], a["page_table"], a["k_new"], a["v_new"], a["cu_seqlens_q"],
            problem.seqlen_q, problem.scale, causal, problem.window_left, problem.window_right,
            problem.softcap, a["alibi_slopes"], splits, launchable(workspace), code, stream, copy_pages,
        )
        if sync:
            _synchronize(ext, stream, problem.device_id)
    return (result, lse) if return_lse else result


def merge_attention_states(out_a: Any, lse_a: Any, out_b: Any, lse_b: Any) -> tuple[Any, Any]:
    """Merge two attention states over disjoint key sets into the state over their union.

    With ``lse = log(exp(lse_a) + exp(lse_b))``, the result is
    ``out = exp(lse_a - lse) * out_a + exp(lse_b - lse) * out_b`` per (query row, head): the
    output of attention over both key sets, as cascade inference (a shared prefix, then each
    sequence's own keys) and context parallelism (keys sharded over devices) need. Rows empty
    in both states (lse -inf in both) give zeros and lse -inf, never NaN; a row empty in one
    state takes the other's.

    Args:
        out_a, out_b: (batch, seqlen, nheads, headdim), or packed (total, nheads, headdim);
            one shape and one dtype of float16, bfloat16 or float32; unit stride in the last
            dimension.
        lse_a, lse_b: their float32 natural-log log-sum-exp, (batch, nheads, seqlen), or
            (nheads, total) for packed states (``return_lse=True`` of the attention calls).

    The merged output is allocated in out_a's framework on its device: for torch tensors
    ``torch.empty_like(out_a)`` (out_a's strides), else a contiguous array. The kernel runs on
    the caller's current stream; the result is not differentiable.

    Returns:
        ``(out, lse)``: out of out_a's shape and dtype, lse float32 of lse_a's shape.

    Raises:
        TypeError, ValueError: invalid arguments; messages name the argument.
        RuntimeError: no usable GPU, or a CUDA error.
        ImportError: the compiled extension is missing or predates ``merge_states``.
    """
    if _torch_call(out_a, lse_a, out_b, lse_b):
        from . import _torch_kvcache

        return _torch_kvcache.merge_attention_states(out_a, lse_a, out_b, lse_b)
    return merge_attention_states_dlpack(out_a, lse_a, out_b, lse_b)


def _batch1(name: str, x: Any) -> Any:
    """A packed state or lse with a leading batch axis of 1 (a view where the framework has
    them)."""
    try:
        return x[None]
    except (TypeError, IndexError) as exc:
        raise TypeError(
            f"{name}: a packed (3-d) state must be indexable as x[None] to merge it as batch 1, "
            f"got {type_name(x)}"
        ) from exc


def merge_attention_states_dlpack(out_a: Any, lse_a: Any, out_b: Any, lse_b: Any) -> tuple[Any, Any]:
    """``merge_attention_states`` through DLPack, for every framework."""
    alloc = framework_of(out_a)
    if alloc is None:
        raise TypeError(
            f"out_a: flashcute can allocate the merged state only for a {ALLOCATING_FRAMEWORKS}, "
            f"got {type_name(out_a)}"
        )
    named = dict(out_a=out_a, lse_a=lse_a, out_b=out_b, lse_b=lse_b)
    x = {name: export(value) for name, value in named.items()}
    problem: MergeProblem = validate_merge(x["out_a"], x["lse_a"], x["out_b"], x["lse_b"])
    ext = merge_extension()
    batched = (problem.batch, problem.seqlen, problem.nheads, problem.headdim)
    lse_batched = (problem.batch, problem.nheads, problem.seqlen)
    out = alloc.empty(out_a, batched, problem.dtype)
    lse = alloc.empty(out_a, lse_batched, "float32")
    if not problem.empty:
        inputs = {name: _batch1(name, value) if problem.packed else value
                  for name, value in x.items()}
        sync = _prepare(alloc, list(inputs.values()))
        stream = alloc.stream(out_a)
        ext.merge_states(
            launchable(inputs["out_a"]), launchable(inputs["lse_a"]), launchable(inputs["out_b"]),
            launchable(inputs["lse_b"]), launchable(out), launchable(lse), stream,
        )
        if sync:
            _synchronize(ext, stream, problem.device_id)
    if problem.packed:
        return out[0], lse[0]
    return out, lse
