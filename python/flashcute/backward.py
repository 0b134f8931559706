"""``flashcute.attention_backward``: gradients of the attention forward, on DLPack tensors."""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

from ._build_info import load_extension
from ._dispatch import choose_backward_backend
from ._dropout import NO_DROPOUT, Dropout, check_dropout, launch_kwargs
from ._frameworks import Framework, export, framework_of, launchable
from ._validate import ForwardProblem, check_scalars, check_softcap, kernel_window, type_name
from ._validate_backward import check_backward_flags, validate_backward
from ._validate_varlen import VarlenProblem
from .attention import _check_outs, _torch_route, _torch_tensors, check_torch_slopes


def attention_backward(
    dout: Any,
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    lse: Any,
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
    dq: Any = None,
    dk: Any = None,
    dv: Any = None,
    deterministic: bool = False,
    backend: Optional[str] = None,
) -> tuple[Any, Any, Any]:
    """Gradients of ``flashcute.attention`` with respect to q, k and v.

    The attention weights are recomputed block by block from q, k and the forward's
    log-sum-exp; memory stays linear in the sequence length.

    Args:
        dout: gradient of the loss with respect to the forward's output, q's shape and dtype.
        q, k, v: the forward's inputs (same layout, dtype, GQA and stride rules).
        out, lse: the forward's output and its float32 (batch, nheads, seqlen_q) log-sum-exp
            (``flashcute.attention(..., return_lse=True)``).
        causal, softmax_scale, window, softcap, alibi_slopes: as given to the forward (scale
            default 1/sqrt(headdim)); the backward recomputes the same softcapped,
            ALiBi-biased, masked weights. The slopes get no gradient.
        dropout_p, dropout_seed, dropout_offset, dropout_rng_state: the forward's dropout:
            with ``dropout_p > 0`` the backward regenerates the forward's mask from the same
            seed and offset, or the same rng state, which must be given (nothing is drawn
            here). To differentiate a torch forward by hand, draw the state first
            (``state = flashcute.dropout_rng_state(q.device)``) and pass it to both calls.
        dq, dk, dv: optional tensors to write the gradients into (q's, k's, v's shape and
            dtype); dk and dv have nheads_kv heads, each the sum over its query-head group.
        deterministic: ask for bitwise reproducible gradients. Both paths normally add dQ
            with floating-point atomics; this flag runs the Ampere path's design that computes
            dQ in its own pass instead (slower), and with ``backend=None`` selects the Ampere
            path.
        backend: None (choose by GPU: the Hopper path on sm90 where this build has its
            backward for the head dim, else the Ampere path), "ampere" or "hopper".

    The workspace is allocated by q's framework: fp32 per-row sums (8 bytes per query row and
    head on the Hopper path, 4 on the Ampere path) plus, unless deterministic, an fp32 dQ
    accumulator covering a chunk of heads (and on the Hopper path one counter per (batch,
    kv head) pair of the chunk, and without causal or window mask fp32 dK/dV sums for the
    key blocks of the last wave that run split over several CTAs). The kernels run on q's
    current stream, as in the forward.

    Returns:
        ``(dq, dk, dv)``: the given buffers, or new arrays of q's framework.

    Raises:
        TypeError, ValueError: invalid arguments; messages name the argument.
        RuntimeError: no usable GPU, or a CUDA error.
        ImportError: the compiled extension is missing.
    """
    window = kernel_window(window)  # plain ints from here on: they key the kept checks
    softcap = check_softcap(softcap)
    dropout = check_dropout(dropout_p, dropout_seed, dropout_offset, dropout_rng_state, draws=False,
                            backward=True)
    if _torch_tensors(dout, q, k, v, out, lse) and all(
        g is None or _torch_tensors(g) for g in (dq, dk, dv)
    ):
        check_scalars(causal, softmax_scale, backend)  # before they key the kept checks
        check_backward_flags(deterministic, backend)
        check_torch_slopes(alibi_slopes, dropout_rng_state)
        tensors = [x for x in (dout, q, k, v, out, lse, dq, dk, dv, alibi_slopes, dropout_rng_state)
                   if x is not None]
        # Gradients are not differentiated, so autograd does not count as watching.
        if not _torch_route().watched(*tensors):
            from ._torch_direct import attention_backward as direct

            return direct(
                dout, q, k, v, out, lse, causal=causal, softmax_scale=softmax_scale,
                deterministic=deterministic, backend=backend, dq=dq, dk=dk, dv=dv,
                window=window, softcap=softcap, alibi_slopes=alibi_slopes, dropout=dropout,
                dropout_rng_state=dropout_rng_state,
            )
    return _backward_dlpack(
        dout, q, k, v, out, lse, causal=causal, softmax_scale=softmax_scale, dq=dq, dk=dk, dv=dv,
        deterministic=deterministic, backend=backend, window=window, softcap=softcap,
        alibi_slopes=alibi_slopes, dropout=dropout, dropout_rng_state=dropout_rng_state,
    )


def attention_backward_dlpack(
    dout: Any,
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    lse: Any,
    *,
    causal: bool = False,
    softmax_scale: Optional[float] = None,
    dq: Any = None,
    dk: Any = None,
    dv: Any = None,
    deterministic: bool = False,
    backend: Optional[str] = None,
    window: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Any = None,
    dropout_p: float = 0.0,
    dropout_seed: Optional[int] = None,
    dropout_offset: Optional[int] = None,
    dropout_rng_state: Any = None,
) -> tuple[Any, Any, Any]:
    """``attention_backward`` through DLPack, for every framework: the route of calls on
    torch tensors that something watches, and of all cupy and jax calls."""
    dropout = check_dropout(dropout_p, dropout_seed, dropout_offset, dropout_rng_state, draws=False,
                            backward=True)
    return _backward_dlpack(
        dout, q, k, v, out, lse, causal=causal, softmax_scale=softmax_scale, dq=dq, dk=dk, dv=dv,
        deterministic=deterministic, backend=backend, window=window, softcap=softcap,
        alibi_slopes=alibi_slopes, dropout=dropout, dropout_rng_state=dropout_rng_state,
    )


def _backward_dlpack(
    dout: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, *, causal: bool,
    softmax_scale: Optional[float], dq: Any, dk: Any, dv: Any, deterministic: bool,
    backend: Optional[str], window: Sequence[int], softcap: float, alibi_slopes: Any,
    dropout: Dropout, dropout_rng_state: Any,
) -> tuple[Any, Any, Any]:
    """``attention_backward_dlpack`` with its dropout arguments already checked."""
    alloc = _gradient_allocator(q)
    ext = load_extension()
    exported = [export(x) for x in (dout, q, k, v, out, lse)]
    slopes_x = export(alibi_slopes) if alibi_slopes is not None else None
    state_x = export(dropout_rng_state) if dropout_rng_state is not None else None
    problem = validate_backward(
        *exported, dq=dq, dk=dk, dv=dv, causal=causal, softmax_scale=softmax_scale,
        deterministic=deterministic, backend=backend, window=window, softcap=softcap,
        alibi_slopes=slopes_x, dropout_p=dropout.p, dropout_rng_state=state_x,
    )
    _check_outs(dq, dk, dv)
    capability = int(ext.device_capability(problem.device_id))
    backend_code = choose_backward_backend(
        backend, capability, headdim=problem.headdim, dtype=problem.dtype,
        deterministic=deterministic, headdim_v=problem.dv,
    )
    grads = _gradients(alloc, q, problem, dq, dk, dv)
    nbytes = int(ext.backward_workspace_size(
        problem.batch, problem.seqlen_q, problem.seqlen_k, problem.nheads, problem.nheads_kv,
        problem.headdim, problem.dtype, deterministic, backend_code, causal,
        problem.window_left, problem.window_right,
    ))
    inputs = (dout, q, k, v, out, lse)
    _launch(ext, alloc, problem, inputs, exported, grads, nbytes, causal, deterministic,
            backend_code, alibi_slopes=alibi_slopes, slopes_x=slopes_x, dropout=dropout,
            dropout_rng_state=dropout_rng_state, state_x=state_x)
    return grads[0], grads[1], grads[2]


def _gradient_allocator(q: Any) -> Framework:
    """q's framework, which allocates the gradients and the workspace."""
    alloc = framework_of(q)
    if alloc is None:
        raise TypeError(
            f"q: flashcute can allocate gradients and workspaces only for a torch.Tensor, "
            f"cupy.ndarray or jax.Array, got {type_name(q)}"
        )
    return alloc


def _gradients(
    alloc: Framework, q: Any, problem: Union[ForwardProblem, VarlenProblem], dq: Any, dk: Any,
    dv: Any,
) -> list[Any]:
    """[dq, dk, dv]: the given buffers, or new arrays of q's framework."""
    return [
        given if given is not None else alloc.empty(q, shape, problem.dtype)
        for given, shape in ((dq, problem.q_shape), (dk, problem.kv_shape), (dv, problem.v_shape))
    ]


def _launch(
    ext: Any, alloc: Framework, problem: Union[ForwardProblem, VarlenProblem],
    inputs: Sequence[Any], exported: Sequence[Any], grads: Sequence[Any], nbytes: int,
    causal: bool, deterministic: bool, backend_code: int, seq: Sequence[Any] = (),
    sizes: tuple[int, ...] = (), alibi_slopes: Any = None, slopes_x: Any = None,
    dropout: Dropout = NO_DROPOUT, dropout_rng_state: Any = None, state_x: Any = None,
) -> None:
    """Run the backward on q's current stream. ``inputs`` are the caller's dout, q, k, v, out
    and lse (then, for a variable-length call, its offsets and seqused_k; None: not given),
    ``exported`` the first six exported; ``seq`` the exported offsets and seqused_k and
    ``sizes`` the max_seqlen pair of a variable-length call; ``alibi_slopes`` the caller's
    slopes (None: no ALiBi), prepared by their own framework, and ``slopes_x`` them exported;
    ``dropout_rng_state`` and ``state_x`` likewise for the dropout rng state."""
    q = inputs[1]
    workspace = alloc.empty(q, (nbytes,), "uint8")
    if alloc.synchronize_after:
        for x in inputs:
            if x is not None:
                alloc.prepare(x)
        for x in (alibi_slopes, dropout_rng_state):
            adapter = framework_of(x) if x is not None else None
            if adapter is not None:
                adapter.prepare(x)
    stream = alloc.stream(q)
    state = launchable(state_x) if dropout.active and state_x is not None else None
    ext.backward(
        *[launchable(x) for x in (*exported, *[export(g) for g in grads], workspace)],
        problem.scale, causal, deterministic, backend_code, stream,
        problem.window_left, problem.window_right, problem.softcap,
        launchable(slopes_x) if slopes_x is not None else None,
        *[launchable(x) for x in seq], *sizes, **launch_kwargs(ext, dropout, state),
    )
    if alloc.synchronize_after:
        ext.synchronize(stream, problem.device_id)
