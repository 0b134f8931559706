"""Variable-length batches: ``flashcute.attention_varlen`` and
``flashcute.attention_varlen_backward`` over packed sequences, on DLPack tensors."""

from __future__ import annotations

from typing import Any, Optional, Sequence

from ._build_info import load_extension
from ._dispatch import choose_backend, choose_backward_backend
from ._dropout import Dropout, check_dropout
from ._frameworks import export
from ._validate import check_scalars, check_softcap, kernel_window, type_name
from ._validate_backward import check_backward_flags
from ._validate_varlen import (
    VarlenProblem,
    check_max_seqlen,
    validate_varlen,
    validate_varlen_backward,
)
from .attention import (
    _allocator,
    _check_front_door_flags,
    _check_outs,
    _launch,
    _outputs,
    _refuse_grad_with_out,
    _torch_route,
    _torch_tensors,
    check_torch_slopes,
    headdim_v_arg,
)
from .backward import _gradient_allocator, _gradients
from .backward import _launch as _launch_backward
from .fp8 import attention_varlen_fp8, is_fp8_call


def varlen_extension() -> Any:
    """``flashcute._C``, refusing a build whose binding predates variable-length batches."""
    ext = load_extension()
    if "cu_seqlens_q" not in (getattr(ext.forward, "__doc__", None) or ""):
        raise ImportError(
            "flashcute: this build of flashcute._C has no variable-length batches "
            "(cu_seqlens); reinstall the package with `pip install .`"
        )
    return ext


def forward_workspace_bytes(ext: Any, problem: VarlenProblem, causal: bool, backend_code: int) -> int:
    """Bytes of the optional forward workspace of a validated variable-length problem."""
    return int(ext.forward_workspace_size(
        problem.batch, problem.max_seqlen_q, problem.max_seqlen_k, problem.nheads,
        problem.nheads_kv, problem.headdim, problem.dtype, causal, backend_code,
        problem.device_id, problem.window_left, problem.window_right, problem.alibi,
        problem.total_q, problem.total_k, problem.seqused_k, **headdim_v_arg(problem),
    ))


def backward_workspace_bytes(
    ext: Any, problem: VarlenProblem, causal: bool, deterministic: bool, backend_code: int
) -> int:
    """Bytes of the backward's workspace of a validated variable-length problem: its rows are
    (batch, nheads, max_seqlen_q rounded up), as for a fixed-length batch of that length."""
    return int(ext.backward_workspace_size(
        problem.batch, problem.max_seqlen_q, problem.max_seqlen_k, problem.nheads,
        problem.nheads_kv, problem.headdim, problem.dtype, deterministic, backend_code, causal,
        problem.window_left, problem.window_right, problem.total_q, problem.total_k,
        problem.seqused_k,
    ))


def _torch_call(*xs: Any) -> bool:
    """Whether every given (not None) argument is a torch.Tensor."""
    return _torch_tensors(*(x for x in xs if x is not None))


def attention_varlen(
    q: Any,
    k: Any,
    v: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    seqused_k: Any = None,
    causal: bool = False,
    softmax_scale: Optional[float] = None,
    window: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Any = None,
    dropout_p: float = 0.0,
    dropout_seed: Optional[int] = None,
    dropout_offset: Optional[int] = None,
    dropout_rng_state: Any = None,
    return_lse: bool = False,
    out: Any = None,
    backend: Optional[str] = None,
    deterministic: bool = False,
    q_descale: Any = None,
    k_descale: Any = None,
    v_descale: Any = None,
    dtype: Optional[str] = None,
) -> Any:
    """``flashcute.attention`` over a batch of packed sequences of different lengths.

    Sequence ``b`` is query rows ``cu_seqlens_q[b]:cu_seqlens_q[b+1]`` of q against key rows
    ``cu_seqlens_k[b]:cu_seqlens_k[b+1]`` of k and v, computed as one ``flashcute.attention``
    call: masks (causal, window) align bottom-right within each sequence, to its own lengths.

    Args:
        q: (total_q, nheads, headdim), float16 or bfloat16, on a CUDA device.
        k, v: (total_k, nheads_kv, headdim), q's dtype and device; nheads a multiple of
            nheads_kv (grouped-query attention, as in ``flashcute.attention``).
        cu_seqlens_q, cu_seqlens_k: int32 (batch + 1,) offsets on q's device: the first row of
            each sequence, then the end of the last (typically ``cu_seqlens_q[0] = 0`` and
            ``cu_seqlens_q[batch] = total_q``), non-decreasing.
        max_seqlen_q, max_seqlen_k: ints, at least the longest sequence's query and key count
            (they size the grid). A sequence longer than them is cut to them.
        seqused_k: optional int32 (batch,) on q's device: sequence ``b`` uses only its first
            ``seqused_k[b]`` keys (e.g. the filled part of a key/value cache slot), and its
            masks align to that length. Keys past it are never read into the result: they may
            hold anything, NaN included.
        causal, softmax_scale, window, softcap: as in ``flashcute.attention``, per sequence.
        alibi_slopes: ALiBi as in ``flashcute.attention``: float32 (nheads,) or
            (batch, nheads) slopes (a row per sequence) on q's device; the distance of query
            ``i`` and key ``j`` of sequence ``b`` is ``|i + seqlen_k[b] - seqlen_q[b] - j|``
            with the sequence's own lengths (``seqlen_k[b]`` is ``seqused_k[b]`` where given).
            The slopes get no gradient.
        dropout_p, dropout_seed, dropout_offset, dropout_rng_state: dropout as in
            ``flashcute.attention``; the weight of query ``i`` and key ``j`` of sequence ``b``
            (positions within the sequence) is that of (batch ``b``, ``i``, ``j``) in
            ``flashcute.testing.dropout_keep_mask``.
        return_lse: also return the float32 (nheads, total_q) natural-log log-sum-exp.
        out: optional (total_q, nheads, headdim) tensor of q's dtype to write into (not for jax
            arrays); it is returned.
        backend: None (choose by GPU), "ampere" or "hopper".
        deterministic: differentiate this call with the bitwise reproducible backward (torch
            autograd), as in ``flashcute.attention``.
        q_descale, k_descale, v_descale, dtype: FP8 (float8_e4m3fn q, k and v), as in
            ``flashcute.attention``, with per-head descales only: (num_sequences, nheads or
            nheads_kv) for q, (num_sequences, nheads_kv) for k and v.

    The offsets are read only by the kernels, which clamp them into the tensors: values that
    break the rules above give unspecified results but never touch memory outside the
    tensors. Rows of out and lse outside every sequence are not written. A query row with no
    visible key (an empty key range, a window) gives zeros and lse = -inf.

    Routes are those of ``flashcute.attention``: torch tensors go through the custom ops
    ``flashcute::attention_varlen_forward`` (``..._forward_out`` with ``out=``) and
    ``flashcute::attention_varlen_backward`` where something watches the call (autograd,
    ``torch.compile(fullgraph=True)``, ...), else straight to the kernel; cupy and jax arrays
    through DLPack. The result is differentiable with respect to q, k and v.

    Returns:
        The output (``out`` itself when given), or ``(output, lse)`` when ``return_lse``.

    Raises:
        TypeError, ValueError: invalid arguments; messages name the argument.
        NotImplementedError: torch inputs that require grad together with ``out``.
        RuntimeError: no usable GPU, or a CUDA error.
        ImportError: the compiled extension is missing or predates variable-length batches.
    """
    window, softcap = _check_front_door_flags(return_lse, deterministic, window, softcap)
    max_seqlen_q = check_max_seqlen("max_seqlen_q", max_seqlen_q)
    max_seqlen_k = check_max_seqlen("max_seqlen_k", max_seqlen_k)
    if is_fp8_call(q, k, v, dtype):
        return attention_varlen_fp8(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k=seqused_k,
            causal=causal, softmax_scale=softmax_scale, window=window, softcap=softcap,
            alibi_slopes=alibi_slopes, dropout_p=dropout_p, return_lse=return_lse, out=out,
            backend=backend, deterministic=deterministic, q_descale=q_descale, k_descale=k_descale,
            v_descale=v_descale, dtype=dtype,
        )
    for name, x in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
        if x is not None:
            raise TypeError(f"{name}: only float8_e4m3fn inputs take descales")
    if _torch_call(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, out):
        check_scalars(causal, softmax_scale, backend)
        check_torch_slopes(alibi_slopes, dropout_rng_state)
        dropout = check_dropout(dropout_p, dropout_seed, dropout_offset, dropout_rng_state,
                                draws=True)
        if out is not None:
            _refuse_grad_with_out(q, k, v, out)
        from . import _torch_varlen

        return _torch_varlen.attention(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k=seqused_k,
            causal=causal, softmax_scale=softmax_scale, return_lse=return_lse, backend=backend,
            out=out, deterministic=deterministic, window=window, softcap=softcap,
            alibi_slopes=alibi_slopes, dropout=dropout, dropout_rng_state=dropout_rng_state,
        )
    if out is not None:
        _refuse_grad_with_out(q, k, v, out)
    _refuse_grad_beside_other_arrays(
        q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, seqused_k=seqused_k,
        alibi_slopes=alibi_slopes, dropout_rng_state=dropout_rng_state,
    )
    return attention_varlen_dlpack(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k=seqused_k,
        causal=causal, softmax_scale=softmax_scale, return_lse=return_lse, out=out,
        backend=backend, window=window, softcap=softcap, alibi_slopes=alibi_slopes,
        dropout_p=dropout_p, dropout_seed=dropout_seed, dropout_offset=dropout_offset,
        dropout_rng_state=dropout_rng_state,
    )


def _refuse_grad_beside_other_arrays(**arguments: Any) -> None:
    """TypeError naming the first argument that is not a torch.Tensor when a torch input
    requires grad: only all-torch calls take the differentiable routes."""
    import sys

    torch = sys.modules.get("torch")  # torch tensors exist only if torch was imported
    if torch is None or not torch.is_grad_enabled():
        return
    if not any(isinstance(x, torch.Tensor) and x.requires_grad for x in arguments.values()):
        return
    for name, x in arguments.items():
        if x is not None and not isinstance(x, torch.Tensor):
            raise TypeError(
                f"{name}: expected a torch.Tensor, got {type_name(x)}: q, k or v requires grad, "
                f"and only calls on torch tensors alone are differentiable"
            )


def attention_varlen_dlpack(
    q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, max_seqlen_q: int,
    max_seqlen_k: int, *, seqused_k: Any = None, causal: bool = False,
    softmax_scale: Optional[float] = None, return_lse: bool = False, out: Any = None,
    backend: Optional[str] = None, window: Sequence[int] = (-1, -1), softcap: float = 0.0,
    alibi_slopes: Any = None, dropout_p: float = 0.0, dropout_seed: Optional[int] = None,
    dropout_offset: Optional[int] = None, dropout_rng_state: Any = None,
) -> Any:
    """``attention_varlen`` through DLPack, without autograd; dropout takes an explicit seed
    and offset, or a rng state."""
    dropout = check_dropout(dropout_p, dropout_seed, dropout_offset, dropout_rng_state, draws=False)
    ext = varlen_extension()
    q_x, k_x, v_x = export(q), export(k), export(v)
    cu_q_x, cu_k_x = export(cu_seqlens_q), export(cu_seqlens_k)
    used_x = export(seqused_k) if seqused_k is not None else None
    out_x = export(out) if out is not None else None
    slopes_x = export(alibi_slopes) if alibi_slopes is not None else None
    state_x = export(dropout_rng_state) if dropout_rng_state is not None else None
    problem = validate_varlen(
        q_x, k_x, v_x, cu_q_x, cu_k_x, max_seqlen_q, max_seqlen_k, out_x, seqused_k=used_x,
        causal=causal, softmax_scale=softmax_scale, backend=backend, window=window,
        softcap=softcap, alibi_slopes=slopes_x, dropout_p=dropout.p, dropout_rng_state=state_x,
    )
    _check_outs(out)
    alloc, like = _allocator(q, out, return_lse)
    capability = int(ext.device_capability(problem.device_id))
    code = choose_backend(
        backend, capability, headdim=problem.headdim, dtype=problem.dtype, headdim_v=problem.dv
    )
    result, lse = _outputs(problem, alloc, like, out, return_lse)
    if not problem.empty_output:
        tensors = (q_x, k_x, v_x, out_x if out is not None else result, lse, slopes_x, cu_q_x,
                   cu_k_x, used_x)
        _launch(ext, problem, alloc, like, tensors, causal, code, forward_workspace_bytes,
                (problem.max_seqlen_q, problem.max_seqlen_k), dropout, state_x)
    return (result, lse) if return_lse else result


def attention_varlen_backward(
    dout: Any,
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    lse: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    seqused_k: Any = None,
    causal: bool = False,
    softmax_scale: Optional[float] = None,
    window: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Any = None,
    dropout_p: float = 0.0,
    dropout_seed: Optional[int] = None,
    dropout_offset: Optional[int] = None,
    dropout_rng_state: Any = None,
    dq: Any = None,
    dk: Any = None,
    dv: Any = None,
    deterministic: bool = False,
    backend: Optional[str] = None,
) -> tuple[Any, Any, Any]:
    """Gradients of ``flashcute.attention_varlen`` with respect to q, k and v.

    Args:
        dout: gradient of the loss with respect to the forward's output, q's shape and dtype.
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k: as given
            to the forward.
        out, lse: the forward's output and its float32 (nheads, total_q) log-sum-exp
            (``attention_varlen(..., return_lse=True)``).
        causal, softmax_scale, window, softcap, alibi_slopes: as given to the forward.
        dropout_p, dropout_seed, dropout_offset, dropout_rng_state: the forward's dropout, as
            in ``flashcute.attention_backward`` (the seed and offset or the rng state must be
            given with ``dropout_p > 0``).
        dq, dk, dv: optional packed tensors to write into (q's, k's, v's shape and dtype).
        deterministic, backend: as in ``flashcute.attention_backward``.

    Keys past ``seqused_k[b]`` of sequence ``b`` get dk = dv = 0. Rows outside every sequence
    are not written. The workspace (from q's framework) is that of a fixed-length backward
    of ``batch`` sequences of ``max_seqlen_q`` queries.

    Returns:
        ``(dq, dk, dv)``: the given buffers, or new arrays of q's framework.

    Raises:
        TypeError, ValueError: invalid arguments; messages name the argument.
        RuntimeError: no usable GPU, or a CUDA error.
        ImportError: the compiled extension is missing or predates variable-length batches.
    """
    window = kernel_window(window)
    softcap = check_softcap(softcap)
    max_seqlen_q = check_max_seqlen("max_seqlen_q", max_seqlen_q)
    max_seqlen_k = check_max_seqlen("max_seqlen_k", max_seqlen_k)
    dropout = check_dropout(dropout_p, dropout_seed, dropout_offset, dropout_rng_state, draws=False,
                            backward=True)
    if _torch_call(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, dq, dk, dv):
        check_scalars(causal, softmax_scale, backend)
        check_torch_slopes(alibi_slopes, dropout_rng_state)
        check_backward_flags(deterministic, backend)
        tensors = [x for x in (dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k,
                               dq, dk, dv, alibi_slopes, dropout_rng_state) if x is not None]
        # Gradients are not differentiated, so autograd does not count as watching.
        if not _torch_route().watched(*tensors):
            from ._torch_varlen import backward as direct

            return direct(
                dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                seqused_k=seqused_k, causal=causal, softmax_scale=softmax_scale,
                deterministic=deterministic, backend=backend, dq=dq, dk=dk, dv=dv,
                window=window, softcap=softcap, alibi_slopes=alibi_slopes, dropout=dropout,
                dropout_rng_state=dropout_rng_state,
            )
    return _backward_dlpack(
        dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
        seqused_k=seqused_k, causal=causal, softmax_scale=softmax_scale, dq=dq, dk=dk, dv=dv,
        deterministic=deterministic, backend=backend, window=window, softcap=softcap,
        alibi_slopes=alibi_slopes, dropout=dropout, dropout_rng_state=dropout_rng_state,
    )


def attention_varlen_backward_dlpack(
    dout: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, cu_seqlens_q: Any, cu_seqlens_k: Any,
    max_seqlen_q: int, max_seqlen_k: int, *, seqused_k: Any = None, causal: bool = False,
    softmax_scale: Optional[float] = None, dq: Any = None, dk: Any = None, dv: Any = None,
    deterministic: bool = False, backend: Optional[str] = None,
    window: Sequence[int] = (-1, -1), softcap: float = 0.0, alibi_slopes: Any = None,
    dropout_p: float = 0.0, dropout_seed: Optional[int] = None,
    dropout_offset: Optional[int] = None, dropout_rng_state: Any = None,
) -> tuple[Any, Any, Any]:
    """``attention_varlen_backward`` through DLPack, for every framework."""
    dropout = check_dropout(dropout_p, dropout_seed, dropout_offset, dropout_rng_state, draws=False,
                            backward=True)
    return _backward_dlpack(
        dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
        seqused_k=seqused_k, causal=causal, softmax_scale=softmax_scale, dq=dq, dk=dk, dv=dv,
        deterministic=deterministic, backend=backend, window=window, softcap=softcap,
        alibi_slopes=alibi_slopes, dropout=dropout, dropout_rng_state=dropout_rng_state,
    )


def _backward_dlpack(
    dout: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, cu_seqlens_q: Any, cu_seqlens_k: Any,
    max_seqlen_q: int, max_seqlen_k: int, *, seqused_k: Any, causal: bool,
    softmax_scale: Optional[float], dq: Any, dk: Any, dv: Any, deterministic: bool,
    backend: Optional[str], window: Sequence[int], softcap: float, alibi_slopes: Any,
    dropout: Dropout, dropout_rng_state: Any,
) -> tuple[Any, Any, Any]:
    """``attention_varlen_backward_dlpack`` with its dropout arguments already checked."""
    alloc = _gradient_allocator(q)
    ext = varlen_extension()
    exported = [export(x) for x in (dout, q, k, v, out, lse)]
    cu_q_x, cu_k_x = export(cu_seqlens_q), export(cu_seqlens_k)
    used_x = export(seqused_k) if seqused_k is not None else None
    slopes_x = export(alibi_slopes) if alibi_slopes is not None else None
    state_x = export(dropout_rng_state) if dropout_rng_state is not None else None
    problem = validate_varlen_backward(
        *exported, cu_q_x, cu_k_x, max_seqlen_q, max_seqlen_k, seqused_k=used_x, dq=dq, dk=dk,
        dv=dv, causal=causal, softmax_scale=softmax_scale, deterministic=deterministic,
        backend=backend, window=window, softcap=softcap, alibi_slopes=slopes_x,
        dropout_p=dropout.p, dropout_rng_state=state_x,
    )
    _check_outs(dq, dk, dv)
    capability = int(ext.device_capability(problem.device_id))
    code = choose_backward_backend(
        backend, capability, headdim=problem.headdim, dtype=problem.dtype,
        deterministic=deterministic, headdim_v=problem.dv,
    )
    grads = _gradients(alloc, q, problem, dq, dk, dv)
    nbytes = backward_workspace_bytes(ext, problem, causal, deterministic, code)
    inputs = (dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k)
    _launch_backward(
        ext, alloc, problem, inputs, exported, grads, nbytes, causal, deterministic, code,
        (cu_q_x, cu_k_x, used_x), (problem.max_seqlen_q, problem.max_seqlen_k),
        alibi_slopes=alibi_slopes, slopes_x=slopes_x, dropout=dropout,
        dropout_rng_state=dropout_rng_state, state_x=state_x,
    )
    return grads[0], grads[1], grads[2]
