"""The front door: ``flashcute.attention``."""

from __future__ import annotations

from types import ModuleType
from typing import Any, Callable, Optional, Sequence, Union

from ._build_info import load_extension
from ._dispatch import choose_backend
from ._dropout import NO_DROPOUT, Dropout, check_dropout, launch_kwargs
from ._frameworks import ALLOCATING_FRAMEWORKS, Framework, export, framework_of, launchable
from ._validate import (
    ForwardProblem,
    check_deterministic,
    check_scalars,
    check_softcap,
    kernel_window,
    type_name,
    validate_forward,
)
from ._validate_varlen import VarlenProblem
from .fp8 import attention_fp8, is_fp8_call


def _is_torch_type(x: Any) -> bool:
    return type(x).__module__.partition(".")[0] == "torch"


def _torch_tensors(*xs: Any) -> bool:
    """Whether every x is a torch.Tensor, without importing torch for other arrays.

    The type's module is checked first and torch is then imported by a plain statement: code
    that torch.compile traces must not read ``sys.modules`` (dynamo wraps the whole dict, which
    compile workers importing at the same time change under it)."""
    if not all(_is_torch_type(x) for x in xs):
        return False
    import torch

    return all(isinstance(x, torch.Tensor) for x in xs)


def _torch_route() -> ModuleType:
    """``flashcute._torch_ops``, imported on the first torch call (it imports torch).

    A plain import statement: torch.compile traces it, whereas a ``sys.modules`` lookup would
    become a guard that the import itself invalidates in the frame being compiled."""
    from . import _torch_ops

    return _torch_ops


def _refuse_grad_with_out(q: Any, k: Any, v: Any, out: Any) -> None:
    if not any(_is_torch_type(x) for x in (q, k, v, out)):
        return
    import torch

    if not torch.is_grad_enabled():
        return
    needs_grad = [n for n, x in (("q", q), ("k", k), ("v", v), ("out", out))
                  if isinstance(x, torch.Tensor) and x.requires_grad]
    if needs_grad:
        raise NotImplementedError(
            f"flashcute.attention: {', '.join(needs_grad)} require grad, but a call with out= "
            "is not differentiable; omit out= (the result is then differentiable)"
        )


def _allocator(q: Any, out: Any, return_lse: bool) -> tuple[Optional[Framework], Any]:
    """(adapter, array) that allocates results and names the stream: q's, else out's.

    The adapter is None only when out is given, nothing else is to be allocated and neither
    q nor out belongs to a known framework; the launch then goes on the legacy default stream.
    """
    for x in (q, out):
        adapter = framework_of(x) if x is not None else None
        if adapter is not None:
            return adapter, x
    if out is None:
        raise TypeError(
            f"q: flashcute can allocate the output only for a {ALLOCATING_FRAMEWORKS}, got "
            f"{type_name(q)}; pass out= to write into a tensor of your own"
        )
    if return_lse:
        raise TypeError(
            f"q, out: return_lse=True needs q or out to be a {ALLOCATING_FRAMEWORKS} to "
            f"allocate lse, got {type_name(q)} and {type_name(out)}"
        )
    return None, q


def _check_front_door_flags(
    return_lse: Any, deterministic: Any, window: Any, softcap: Any
) -> tuple[tuple[int, int], float]:
    """The front doors' checks before routing: ``return_lse`` and ``deterministic`` bools;
    returns the window as ``kernel_window`` gives it and the softcap as a float (plain values
    from here on: they key plans and custom ops)."""
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse: expected a bool, got {type_name(return_lse)}")
    check_deterministic(deterministic)
    return kernel_window(window), check_softcap(softcap)


def _check_outs(*xs: Any) -> None:
    """The framework's own checks of buffers to write into (None: not given)."""
    for x in xs:
        adapter = framework_of(x) if x is not None else None
        if adapter is not None:
            adapter.check_out(x)


def _outputs(
    problem: Union[ForwardProblem, VarlenProblem], alloc: Optional[Framework], like: Any, out: Any, return_lse: bool
) -> tuple[Any, Any]:
    """The output (``out`` or a new array) and, when asked for, a new lse array."""
    result = out if out is not None else alloc.empty(like, problem.out_shape, problem.dtype)
    lse = alloc.empty(like, problem.lse_shape, "float32") if return_lse else None
    return result, lse


def attention(
    q: Any,
    k: Any,
    v: Any,
    *,
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
    """Exact softmax attention, ``softmax(scale * q @ k^T) @ v``, in one fused kernel.

    Args:
        q: (batch, seqlen_q, nheads, headdim), float16, bfloat16 or float8_e4m3fn (FP8, see
            below), on a CUDA device.
        k, v: (batch, seqlen_k, nheads_kv, headdim), q's dtype and device (v's head dim may
            differ where a head dim pair kernel runs it: see the README). Grouped-query /
            multi-query attention: nheads must be a multiple of nheads_kv; query head ``h``
            uses key/value head ``h // (nheads // nheads_kv)``.
        causal: mask so query ``i`` attends key ``j`` only if ``j <= i + seqlen_k - seqlen_q``
            (bottom-right aligned). Query rows with no key to attend to give zeros and
            lse = -inf.
        softmax_scale: multiplies ``q @ k^T`` before the softmax; default 1/sqrt(headdim).
        window: (left, right) local (sliding-window) attention: query ``i`` attends key
            ``j`` only if ``i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q +
            right``; -1 leaves a side unbounded, (-1, -1) (default) is no window. Each side
            is an int >= -1. ``causal=True`` intersects the window with the causal mask (the
            right side becomes 0). Rows without a visible key give zeros and lse = -inf.
        softcap: when > 0, each scaled score ``s = softmax_scale * q . k`` becomes
            ``softcap * tanh(s / softcap)`` before the mask and the softmax (as in Gemma-2
            and FlashAttention); 0.0 (default) leaves scores as they are. A finite float >= 0;
            ``softcap / softmax_scale`` must be finite and ``softmax_scale / softcap`` a
            normal number in float32.
        alibi_slopes: ALiBi (FlashAttention's convention): a float32 tensor of shape
            (nheads,) or (batch, nheads) on q's device (a torch.Tensor for torch inputs), with
            unit stride over heads. The score of query ``i`` and key ``j`` in head ``h`` (of batch ``b``)
            gains ``-slope[b, h] * |i + seqlen_k - seqlen_q - j|`` after the softcap and
            before the mask. None (default): no bias. The slopes are not differentiated.
        dropout_p: dropout on the attention weights, after the softmax: each weight is
            dropped with probability ``dropout_p`` (rounded to a multiple of 2^-16) and the
            kept ones are scaled by ``1 / (1 - dropout_p)``; a float in [0, 1), 0.0 (default)
            is off. The mask is a function of a seed, an offset and the weight's (batch, head,
            query, key) (``flashcute.testing.dropout_keep_mask``); the backward regenerates it.
        dropout_seed, dropout_offset: ints in [0, 2**63) that key the mask; given together.
            Torch calls that give neither (nor ``dropout_rng_state``) draw them from torch's
            CUDA generator on every call (``flashcute.dropout_rng_state``), which works in
            CUDA graphs and follows ``torch.manual_seed``; calls on other arrays must give them.
        dropout_rng_state: instead of the seed and offset, an int64 tensor (2,) {seed, offset}
            on q's device that the kernels read (``flashcute.dropout_rng_state(device)`` draws
            one); pass the same tensor to ``attention_backward``.
        return_lse: also return the float32 (batch, nheads, seqlen_q) natural-log
            log-sum-exp of the scaled (softcapped, ALiBi-biased, masked) scores, before
            dropout.
        out: optional (batch, seqlen_q, nheads, v's head dim) tensor of q's dtype to write into
            (not for jax arrays, which are immutable); it is returned.
        backend: None (choose by GPU), "ampere" or "hopper".
        deterministic: differentiate this call with the bitwise reproducible backward (torch
            autograd; ``torch.use_deterministic_algorithms(True)`` does the same for every
            call). The forward is always reproducible.
        q_descale, k_descale, v_descale: FP8 only: float32 descales on q's device (None: 1.0);
            an element's value is its e4m3 value times its descale. Per head: q (batch,
            nheads) or (batch, nheads_kv) (FlashAttention-3's convention), k and v (batch,
            nheads_kv). Per block of ``flashcute.FP8_BLOCK`` (128) rows: q (batch, nheads or
            nheads_kv, ceil(seqlen_q / 128)), k and v (batch, nheads_kv, ceil(seqlen_k / 128));
            any block descale needs all three. ``flashcute.quantize_fp8`` makes both kinds.
            The values are not checked (that would cost a sync).
        dtype: None, or "float8_e4m3fn" to read uint8 q, k and v as e4m3 bytes (frameworks
            that cannot export float8 through DLPack).

    FP8 (float8_e4m3fn q, k and v): the Hopper path's forward (sm90; head dims up to 256 run on
    the 64, 128 and 256 kernels) with in-kernel V transpose; P is quantized to e4m3 in the
    kernel. The output is bfloat16, or float16 into a float16 ``out``. Causal, window,
    softcap, ALiBi, GQA/MQA and ``return_lse`` work; dropout does not, and there is no
    backward: autograd and ``deterministic=True`` raise NotImplementedError.

    Any strides work as long as the headdim dimension has unit stride and the others are
    positive, so ``x.transpose(1, 2)`` of a (batch, nheads, seqlen, headdim) tensor needs no
    copy. Zero batch, seqlen_q or head count give empty results without a kernel launch;
    seqlen_k == 0 gives zeros and lse = -inf (every row has no key).

    Inputs may be torch tensors, cupy arrays or jax arrays; results are allocated by q's
    framework on q's device. So is a transient fp32 workspace where the Hopper path spreads
    the last wave of query tiles of a call without causal or window mask over all SMs (few tiles with long keys, or a
    short last wave): up to 2 · SMs · tile rows · (headdim + 8) · 4 bytes, 28 MB at hd 128
    (192-row tiles) on 132 SMs. Other DLPack objects are accepted when ``out`` is given (they
    are then launched on the stream of out's framework, else the legacy default stream).
    The kernel runs on the caller's current stream (torch, cupy). JAX streams cannot be
    joined: for jax arrays the call waits for the inputs, launches on the legacy default
    stream and synchronizes it before returning.

    Torch tensors (without ``out``) go through the custom op ``flashcute::attention_forward``
    whenever something may watch the call: ``torch.compile`` traces, a tensor subclass,
    dispatch mode or functorch transform is active (in eager mode an input that requires grad
    runs an ``autograd.Function`` over the same kernels instead). The result is then
    differentiable (``flashcute::attention_backward``; bitwise reproducible gradients under
    ``torch.use_deterministic_algorithms(True)`` or with ``deterministic=True``) and
    works under ``torch.compile(fullgraph=True)``; a call with ``out`` goes through the
    mutating custom op ``flashcute::attention_forward_out`` then. Otherwise the kernel is
    launched directly, without the custom op's dispatch cost. A direct launch
    keeps what the argument checks decided per call signature (shapes, strides, dtypes,
    devices, scalar arguments), so a repeated call, a decoding step say, pays only for its
    allocations and the launch; data pointers are checked on every call. Both routes work in
    CUDA graphs. The returned lse is not differentiable.

    Returns:
        The output (``out`` itself when given), or ``(output, lse)`` when ``return_lse``.

    Raises:
        TypeError, ValueError: invalid arguments; messages name the argument.
        NotImplementedError: torch inputs that require grad together with ``out``.
        RuntimeError: no usable GPU, or a CUDA error.
        ImportError: the compiled extension is missing.
    """
    window, softcap = _check_front_door_flags(return_lse, deterministic, window, softcap)
    if is_fp8_call(q, k, v, dtype):
        return attention_fp8(
            q, k, v, causal=causal, softmax_scale=softmax_scale, window=window, softcap=softcap,
            alibi_slopes=alibi_slopes, dropout_p=dropout_p, return_lse=return_lse, out=out,
            backend=backend, deterministic=deterministic, q_descale=q_descale,
            k_descale=k_descale, v_descale=v_descale, dtype=dtype,
        )
    for name, x in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
        if x is not None:
            raise TypeError(f"{name}: only float8_e4m3fn inputs take descales")
    if _torch_tensors(q, k, v) and (out is None or _torch_tensors(out)):
        check_scalars(causal, softmax_scale, backend)
        check_torch_slopes(alibi_slopes, dropout_rng_state)
        dropout = check_dropout(dropout_p, dropout_seed, dropout_offset, dropout_rng_state,
                                draws=True)
        if out is not None:
            _refuse_grad_with_out(q, k, v, out)
        return _torch_route().attention(
            q, k, v, causal=causal, softmax_scale=softmax_scale, return_lse=return_lse,
            backend=backend, out=out, deterministic=deterministic, window=window,
            softcap=softcap, alibi_slopes=alibi_slopes, dropout=dropout,
            dropout_rng_state=dropout_rng_state,
        )
    _refuse_grad_with_out(q, k, v, out)
    return attention_dlpack(
        q, k, v, causal=causal, softmax_scale=softmax_scale, return_lse=return_lse, out=out,
        backend=backend, window=window, softcap=softcap, alibi_slopes=alibi_slopes,
        dropout_p=dropout_p, dropout_seed=dropout_seed, dropout_offset=dropout_offset,
        dropout_rng_state=dropout_rng_state,
    )


def check_torch_slopes(alibi_slopes: Any, dropout_rng_state: Any = None) -> None:
    """Calls on torch tensors take ALiBi slopes and a dropout rng state as torch.Tensors (or
    None): another framework's array would leave the call without autograd and compile
    support."""
    for name, x in (("alibi_slopes", alibi_slopes), ("dropout_rng_state", dropout_rng_state)):
        if x is not None and not _torch_tensors(x):
            raise TypeError(f"{name}: expected a torch.Tensor like q, or None, got {type_name(x)}")


def attention_dlpack(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = False,
    softmax_scale: Optional[float] = None,
    return_lse: bool = False,
    out: Any = None,
    backend: Optional[str] = None,
    window: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Any = None,
    dropout_p: float = 0.0,
    dropout_seed: Optional[int] = None,
    dropout_offset: Optional[int] = None,
    dropout_rng_state: Any = None,
) -> Any:
    """``attention`` through DLPack, without autograd: the implementation under every route.
    Dropout takes an explicit seed and offset, or a rng state: nothing is drawn here."""
    dropout = check_dropout(dropout_p, dropout_seed, dropout_offset, dropout_rng_state, draws=False)
    ext = load_extension()
    q_x, k_x, v_x = export(q), export(k), export(v)
    out_x = export(out) if out is not None else None
    slopes_x = export(alibi_slopes) if alibi_slopes is not None else None
    state_x = export(dropout_rng_state) if dropout_rng_state is not None else None
    problem = validate_forward(
        q_x, k_x, v_x, out_x, causal=causal, softmax_scale=softmax_scale, backend=backend,
        window=window, softcap=softcap, alibi_slopes=slopes_x, dropout_p=dropout.p,
        dropout_rng_state=state_x,
    )
    _check_outs(out)
    alloc, like = _allocator(q, out, return_lse)

    capability = int(ext.device_capability(problem.device_id))
    backend_code = choose_backend(
        backend, capability, headdim=problem.headdim, dtype=problem.dtype, headdim_v=problem.dv
    )
    result, lse = _outputs(problem, alloc, like, out, return_lse)
    if not problem.empty_output:
        result_x = out_x if out is not None else result
        _launch(ext, problem, alloc, like, (q_x, k_x, v_x, result_x, lse, slopes_x), causal,
                backend_code, dropout=dropout, dropout_rng_state=state_x)
    return (result, lse) if return_lse else result


def headdim_v_arg(problem: Union[ForwardProblem, VarlenProblem]) -> dict[str, int]:
    """The workspace query's ``headdim_v`` keyword, given only where v's head dim differs from
    q's (the split's state follows the kernel's v head dim)."""
    return {"headdim_v": problem.dv} if problem.dv != problem.headdim else {}


def forward_workspace_bytes(ext: Any, problem: ForwardProblem, causal: bool, backend_code: int) -> int:
    """Bytes of the optional forward workspace of a validated problem (0: none); it depends
    on the mask (causal and window) and on whether ALiBi and dropout are on (either turns off
    packed query heads, whose split plan differs)."""
    dropout = {"dropout": True} if problem.dropout_p > 0.0 else {}
    return int(ext.forward_workspace_size(
        problem.batch, problem.seqlen_q, problem.seqlen_k, problem.nheads, problem.nheads_kv,
        problem.headdim, problem.dtype, causal, backend_code, problem.device_id,
        problem.window_left, problem.window_right, problem.alibi, **headdim_v_arg(problem),
        **dropout,
    ))


#: ``forward_workspace_bytes`` of a fixed-length or variable-length problem.
WorkspaceBytes = Callable[[Any, Any, bool, int], int]


def _workspace(
    ext: Any,
    problem: Union[ForwardProblem, VarlenProblem],
    alloc: Optional[Framework],
    like: Any,
    causal: bool,
    backend_code: int,
    workspace_bytes: WorkspaceBytes = forward_workspace_bytes,
) -> Any:
    """The optional forward workspace, from the allocating framework; None when the call
    needs none (the Hopper path uses it to split the last wave of tiles of a call
    without causal or window mask) or
    nothing can allocate it (the call then runs unsplit, with the same results)."""
    if alloc is None:
        return None
    nbytes = workspace_bytes(ext, problem, causal, backend_code)
    return alloc.empty(like, (nbytes,), "uint8") if nbytes > 0 else None


def _launch(
    ext: Any,
    problem: Union[ForwardProblem, VarlenProblem],
    alloc: Optional[Framework],
    like: Any,
    tensors: Sequence[Any],
    causal: bool,
    backend_code: int,
    workspace_bytes: WorkspaceBytes = forward_workspace_bytes,
    sizes: tuple[int, ...] = (),
    dropout: Dropout = NO_DROPOUT,
    dropout_rng_state: Any = None,
    extra: Optional[dict[str, Any]] = None,
) -> None:
    """Run the kernel on the allocating framework's current stream. ``tensors`` are the
    exported q, k, v, out, lse and ALiBi slopes (None: not asked for, or absent), then for a
    variable-length call the offsets and seqused_k, whose max_seqlen pair is ``sizes``;
    ``dropout_rng_state`` the exported rng state (None: none); ``extra``: more keywords of
    the extension's forward (FP8's descales)."""
    sync = alloc is not None and alloc.synchronize_after
    if sync:
        if not hasattr(ext, "synchronize"):
            raise RuntimeError(
                "flashcute: this build of flashcute._C has no synchronize(), which jax "
                "arrays need; reinstall the package with `pip install .`"
            )
        for x in (*tensors, dropout_rng_state, *(extra or {}).values()):
            adapter = framework_of(x) if x is not None else None
            if adapter is not None:
                adapter.prepare(x)
    stream = alloc.stream(like) if alloc is not None else 0
    workspace = _workspace(ext, problem, alloc, like, causal, backend_code, workspace_bytes)
    q, k, v, out, lse, slopes, *seq = (launchable(x) for x in tensors)
    state = None
    if dropout.active and dropout_rng_state is not None:
        state = launchable(dropout_rng_state)
    ext.forward(q, k, v, out, lse, problem.scale, causal, backend_code, stream,
                launchable(workspace) if workspace is not None else None,
                problem.window_left, problem.window_right, problem.softcap, slopes, *seq, *sizes,
                **launch_kwargs(ext, dropout, state), **(extra or {}))
    if sync:
        ext.synchronize(stream, problem.device_id)
