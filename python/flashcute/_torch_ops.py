"""torch.library custom ops ``flashcute::attention_forward`` / ``flashcute::attention_backward``
and the autograd formula that ties them, so that ``flashcute.attention`` on torch tensors is
differentiable and traceable by ``torch.compile`` (fake implementations give output shapes)
and capturable in CUDA graphs (all work on the current stream, memory from torch's allocator).

Also the routing of the front door's torch calls (``route``): the custom ops where a compiler,
tracer, subclass, dispatch mode or functorch transform may watch, the eager autograd route
(``_torch_autograd``) where only autograd does, else the direct route (``_torch_direct``).

Imported only when torch tensors are used.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

import torch
from torch import Tensor

from ._torch_version import require_torch

require_torch(torch.__version__)  # before the custom ops below, which older torch lacks

from . import _dropout, _torch_autograd, _torch_direct
from ._build_info import load_extension
from ._dispatch import choose_backend, choose_backward_backend
from ._dropout import NO_DROPOUT, Dropout, check_dropout, rng_state_for
from ._torch_layout import kernel_layout
from ._validate import ForwardProblem, _check_devices, forward_problem
from ._validate_backward import backward_problem


def _fake_forward_problem(
    q: Tensor, k: Tensor, v: Tensor, out: Optional[Tensor], causal: bool,
    backend: Optional[str], softmax_scale: float, window: tuple[int, int], softcap: float,
    alibi_slopes: Optional[Tensor] = None, dropout_p: float = 0.0,
    dropout_rng_state: Optional[Tensor] = None,
) -> ForwardProblem:
    """The real forward's checks, run by the fake implementation so that ``torch.compile``
    reports a bad dtype, shape, head dim, window, softcap or ALiBi slopes while tracing.
    Inputs off CUDA (meta tensors, whose op this fake is, or CPU tensors) skip the device
    checks and the dispatch; a real call on CPU tensors still raises the device error when it
    runs."""
    problem, infos = forward_problem(
        q, k, v, out, causal=causal, softmax_scale=softmax_scale, backend=backend,
        window=window, softcap=softcap, alibi_slopes=alibi_slopes, dropout_p=dropout_p,
        dropout_rng_state=dropout_rng_state,
    )
    _fake_device_checks(q, infos, lambda capability: choose_backend(
        backend, capability, headdim=problem.headdim, dtype=problem.dtype,
        headdim_v=problem.dv))
    return problem


def _concrete(softmax_scale: float, window_left: int, window_right: int,
              softcap: float) -> tuple[float, tuple[int, int], float]:
    """The scalar arguments as Python numbers. torch.compile hands the fakes symbolic ones
    for a value that changed between calls; reading them specializes the graph to the
    values, which the checks need."""
    return float(softmax_scale), (int(window_left), int(window_right)), float(softcap)


#: Called directly with dropout and neither a seed nor a rng state, the forward ops draw the
#: rng state from torch's generator: a compiler must neither fold, merge nor drop them.
_RANDOM = (torch.Tag.nondeterministic_seeded,)


def _op_dropout(
    dropout_p: Any, dropout_seed: Optional[int], dropout_offset: Optional[int],
    dropout_rng_state: Optional[Tensor], *, draws: bool,
) -> Dropout:
    """A custom op's dropout arguments checked as the front doors check them (the ops are
    public: ``torch.ops.flashcute.*``); ``dropout_p`` as a Python float, as ``_concrete``."""
    seed = None if dropout_seed is None else int(dropout_seed)
    offset = None if dropout_offset is None else int(dropout_offset)
    return check_dropout(float(dropout_p), seed, offset, dropout_rng_state, draws=draws,
                         backward=not draws)


def drawn_state(q: Tensor, state: Optional[Tensor], given: Optional[Tensor]) -> Tensor:
    """The forward ops' third output: the rng state they drew for the call (the autograd
    formula saves it for the backward), or an empty int64 tensor when they drew none (no
    dropout, or the caller's seed and offset or rng state, which the formula takes)."""
    if state is not None and state is not given:
        return state
    return q.new_empty((0,), dtype=torch.int64)


def fake_drawn_state(q: Tensor, dropout: Dropout, given: Optional[Tensor]) -> Tensor:
    """``drawn_state``'s shape, for the fakes: (2,) where the op draws, else (0,)."""
    draws = dropout.active and dropout.seed is None and given is None
    return q.new_empty((2,) if draws else (0,), dtype=torch.int64)


def _fake_device_checks(q: Tensor, infos: list[Any], choose: Callable[[int], Any]) -> None:
    """The real call's last checks, for CUDA inputs: one device, and a backend that runs the
    call there (``choose`` gets the device's compute capability)."""
    if q.device.type == "cuda":
        _check_devices(infos[0], infos[1:])
        choose(int(load_extension().device_capability(infos[0].device_id)))


@torch.library.custom_op("flashcute::attention_forward", mutates_args=(), tags=_RANDOM)
def attention_forward(
    q: Tensor, k: Tensor, v: Tensor, causal: bool, softmax_scale: float, backend: Optional[str],
    deterministic: bool = False, window_left: int = -1, window_right: int = -1,
    softcap: float = 0.0, alibi_slopes: Optional[Tensor] = None, dropout_p: float = 0.0,
    dropout_seed: Optional[int] = None, dropout_offset: Optional[int] = None,
    dropout_rng_state: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """(out, lse, rng_state) of flashcute's forward; out is contiguous (batch, seqlen_q,
    nheads, v's head dim). ``deterministic`` asks the autograd formula for a bitwise reproducible
    backward; the window sides, softcap, ALiBi slopes (not differentiated) and dropout
    arguments are ``flashcute.attention``'s. With ``dropout_p > 0`` and neither an explicit
    seed nor a rng state, the op draws a rng state from torch's generator and returns it
    (int64 (2,)); otherwise the third output is empty."""
    dropout = _op_dropout(dropout_p, dropout_seed, dropout_offset, dropout_rng_state, draws=True)
    state = rng_state_for(q, dropout, dropout_rng_state)
    out, lse = _torch_direct.attention(
        q, k, v, causal=causal, softmax_scale=softmax_scale, return_lse=True, backend=backend,
        window=(window_left, window_right), softcap=softcap, alibi_slopes=alibi_slopes,
        dropout=dropout, dropout_rng_state=state,
    )
    return out, lse, drawn_state(q, state, dropout_rng_state)


@attention_forward.register_fake
def _(q: Tensor, k: Tensor, v: Tensor, causal: bool, softmax_scale: float,
      backend: Optional[str], deterministic: bool = False, window_left: int = -1,
      window_right: int = -1, softcap: float = 0.0,
      alibi_slopes: Optional[Tensor] = None, dropout_p: float = 0.0,
      dropout_seed: Optional[int] = None, dropout_offset: Optional[int] = None,
      dropout_rng_state: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor]:
    dropout = _op_dropout(dropout_p, dropout_seed, dropout_offset, dropout_rng_state, draws=True)
    problem = _fake_forward_problem(
        q, k, v, None, causal, backend, *_concrete(softmax_scale, window_left, window_right, softcap),
        alibi_slopes, dropout.p, dropout_rng_state,
    )
    return (q.new_empty(problem.out_shape), q.new_empty(problem.lse_shape, dtype=torch.float32),
            fake_drawn_state(q, dropout, dropout_rng_state))


@torch.library.custom_op("flashcute::attention_forward_out", mutates_args=("out",), tags=_RANDOM)
def attention_forward_out(
    q: Tensor, k: Tensor, v: Tensor, out: Tensor, causal: bool, softmax_scale: float,
    backend: Optional[str], window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
    alibi_slopes: Optional[Tensor] = None, dropout_p: float = 0.0,
    dropout_seed: Optional[int] = None, dropout_offset: Optional[int] = None,
    dropout_rng_state: Optional[Tensor] = None,
) -> Tensor:
    """Writes the forward's output into ``out`` and returns lse: calls with ``out=`` that a
    compiler or another transform watches (not differentiable; a rng state drawn for
    dropout is not returned)."""
    dropout = _op_dropout(dropout_p, dropout_seed, dropout_offset, dropout_rng_state, draws=True)
    _, lse = _torch_direct.attention(
        q, k, v, causal=causal, softmax_scale=softmax_scale, return_lse=True, backend=backend,
        out=out, window=(window_left, window_right), softcap=softcap, alibi_slopes=alibi_slopes,
        dropout=dropout, dropout_rng_state=rng_state_for(q, dropout, dropout_rng_state),
    )
    return lse


@attention_forward_out.register_fake
def _(q: Tensor, k: Tensor, v: Tensor, out: Tensor, causal: bool, softmax_scale: float,
      backend: Optional[str], window_left: int = -1, window_right: int = -1,
      softcap: float = 0.0, alibi_slopes: Optional[Tensor] = None, dropout_p: float = 0.0,
      dropout_seed: Optional[int] = None, dropout_offset: Optional[int] = None,
      dropout_rng_state: Optional[Tensor] = None) -> Tensor:
    dropout = _op_dropout(dropout_p, dropout_seed, dropout_offset, dropout_rng_state, draws=True)
    problem = _fake_forward_problem(
        q, k, v, out, causal, backend, *_concrete(softmax_scale, window_left, window_right, softcap),
        alibi_slopes, dropout.p, dropout_rng_state,
    )
    return q.new_empty(problem.lse_shape, dtype=torch.float32)


@torch.library.custom_op("flashcute::attention_backward", mutates_args=())
def attention_backward(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, causal: bool,
    softmax_scale: float, deterministic: bool, backend: Optional[str], window_left: int = -1,
    window_right: int = -1, softcap: float = 0.0, alibi_slopes: Optional[Tensor] = None,
    dropout_p: float = 0.0, dropout_seed: Optional[int] = None,
    dropout_offset: Optional[int] = None, dropout_rng_state: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of flashcute's backward, each contiguous; with dropout, the forward's
    explicit seed and offset or its rng state."""
    dropout = _op_dropout(dropout_p, dropout_seed, dropout_offset, dropout_rng_state, draws=False)
    return _torch_direct.attention_backward(
        kernel_layout(dout), q, k, v, out, lse, causal=causal, softmax_scale=softmax_scale,
        deterministic=deterministic, backend=backend, window=(window_left, window_right),
        softcap=softcap, alibi_slopes=alibi_slopes, dropout=dropout,
        dropout_rng_state=dropout_rng_state,
    )


@attention_backward.register_fake
def _(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, causal: bool,
      softmax_scale: float, deterministic: bool, backend: Optional[str], window_left: int = -1,
      window_right: int = -1, softcap: float = 0.0,
      alibi_slopes: Optional[Tensor] = None, dropout_p: float = 0.0,
      dropout_seed: Optional[int] = None, dropout_offset: Optional[int] = None,
      dropout_rng_state: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor]:
    # As the forward's fake: the real call's checks, on a dout of the layout the real call
    # hands the kernel (kernel_layout copies autograd's expanded or oddly strided gradients).
    softmax_scale, window, softcap = _concrete(softmax_scale, window_left, window_right, softcap)
    dropout = _op_dropout(dropout_p, dropout_seed, dropout_offset, dropout_rng_state, draws=False)
    problem, infos = backward_problem(
        dout.new_empty(dout.shape), q, k, v, out, lse, causal=causal,
        softmax_scale=softmax_scale, deterministic=deterministic, backend=backend,
        window=window, softcap=softcap, alibi_slopes=alibi_slopes, dropout_p=dropout.p,
        dropout_rng_state=dropout_rng_state,
    )
    _fake_device_checks(q, infos, lambda capability: choose_backward_backend(
        backend, capability, headdim=problem.headdim, dtype=problem.dtype,
        deterministic=deterministic, headdim_v=problem.dv))
    kv_shape = (q.shape[0], k.shape[1], k.shape[2], q.shape[3])
    v_shape = (*kv_shape[:3], v.shape[3])  # v's head dim may differ from q's
    return q.new_empty(q.shape), q.new_empty(kv_shape), q.new_empty(v_shape)


def backward_state(dropout: Dropout, given: Optional[Tensor], drawn: Tensor) -> Optional[Tensor]:
    """The rng state the backward of a forward op reads: the caller's, else the one the op
    drew; None without dropout or with an explicit seed and offset."""
    if not dropout.active or dropout.seed is not None:
        return None
    return given if given is not None else drawn


def _setup_context(
    ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor, Tensor]
) -> None:
    (q, k, v, causal, softmax_scale, backend, deterministic, left, right, softcap, slopes,
     dropout_p, seed, offset, given) = inputs
    out, lse, drawn = output
    dropout = _op_dropout(dropout_p, seed, offset, given, draws=True)
    ctx.save_for_backward(q, k, v, out, lse, slopes, backward_state(dropout, given, drawn))
    _torch_autograd.save_options(ctx, lse, causal, softmax_scale, (left, right), softcap,
                                 deterministic, backend, dropout)


def _backward(
    ctx: Any, dout: Tensor, _dlse: Optional[Tensor], _dstate: Optional[Tensor]
) -> tuple[Any, ...]:
    q, k, v, out, lse, slopes, state = ctx.saved_tensors
    dropout: Dropout = ctx.dropout
    dq, dk, dv = attention_backward(
        dout, q, k, v, out, lse, ctx.causal, ctx.softmax_scale,
        ctx.deterministic or torch.are_deterministic_algorithms_enabled(), ctx.backend,
        *ctx.window, ctx.softcap, slopes, dropout.p, dropout.seed, dropout.offset, state,
    )
    return (dq, dk, dv) + (None,) * 12


attention_forward.register_autograd(_backward, setup_context=_setup_context)


_dispatch_modes = getattr(torch._C, "_len_torch_dispatch_stack", None)
_functorch_active = getattr(torch._C, "_are_functorch_transforms_active", None)


def watched(*tensors: Tensor) -> bool:
    """Whether a compiler or tracer, a tensor subclass, a dispatch mode or a functorch
    transform may watch a call on these tensors (autograd aside)."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return True
    if torch.overrides.has_torch_function(tensors):
        return True
    if _dispatch_modes is None or _dispatch_modes() != 0:
        return True
    return _functorch_active is None or bool(_functorch_active())


def route(*tensors: Tensor) -> str:
    """How a call on these tensors runs: "custom_op" where something other than autograd may
    watch it (see ``watched``), "autograd" where only autograd does (an input requires grad),
    else "direct" (the kernel is called without either).

    Calling the kernels without the custom ops saves their dispatch (a training step's host
    time halves at short sequences)."""
    if watched(*tensors):
        return "custom_op"
    if torch.is_grad_enabled() and any(x.requires_grad for x in tensors):
        return "autograd"
    return "direct"


def attention(
    q: Tensor, k: Tensor, v: Tensor, *, causal: bool, softmax_scale: Optional[float],
    return_lse: bool, backend: Optional[str], out: Optional[Tensor] = None,
    deterministic: bool = False, window: tuple[int, int] = (-1, -1), softcap: float = 0.0,
    alibi_slopes: Optional[Tensor] = None, dropout: Dropout = NO_DROPOUT,
    dropout_rng_state: Optional[Tensor] = None,
) -> Any:
    """The front door's torch route (arguments already type-checked; ``window`` as
    ``kernel_window`` returns it). Calls with ``out`` are not differentiable (the front door
    refused inputs that require grad); where something watches one, it goes through the
    mutating custom op ``flashcute::attention_forward_out``. The slopes get no gradient.
    Dropout without an explicit seed or rng state draws one from torch's generator here, on
    every route, so that under a compiler the draw is a graph node of its own."""
    left, right = window
    tensors = [x for x in (alibi_slopes, dropout_rng_state) if x is not None]
    how = route(q, k, v, *([] if out is None else [out]), *tensors)
    allocating = out is None and q.dim() == 4  # other ranks: direct, whose checks name q
    op = (how == "custom_op" and allocating) or (how != "direct" and out is not None)
    if dropout.active and dropout.seed is None and dropout_rng_state is None:
        # Checked before the draw, so that a call that raises leaves torch's generator as it
        # was; drawn here, outside any custom op, so that a compiler cannot merge two calls'
        # draws into one mask. A drawn state does not change the route.
        if op:
            _check_before_op_draw(q, k, v, out, causal, softmax_scale, backend, window,
                                  softcap, alibi_slopes, dropout.p)
        else:
            _torch_direct.forward_plan(q, k, v, out, causal, softmax_scale, backend, window,
                                       softcap, alibi_slopes, dropout.p, None, to_draw=True)
        dropout_rng_state = _dropout.dropout_rng_state(q.device)
    if op:
        drop = (dropout.p, dropout.seed, dropout.offset, dropout_rng_state)
        if out is not None:
            lse = attention_forward_out(
                q, k, v, out, causal, _scale(q, softmax_scale), backend, left, right, softcap,
                alibi_slopes, *drop,
            )
            return (out, lse) if return_lse else out
        result, lse, _ = attention_forward(
            q, k, v, causal, _scale(q, softmax_scale), backend, deterministic, left, right,
            softcap, alibi_slopes, *drop,
        )
        return (result, lse) if return_lse else result
    # What the kernels read: the state given or drawn above; none without dropout.
    state = dropout_rng_state if dropout.active else None
    if allocating and how == "autograd":
        result, lse = _torch_autograd.attention(
            q, k, v, causal=causal, softmax_scale=softmax_scale, backend=backend,
            deterministic=deterministic, window=window, softcap=softcap,
            alibi_slopes=alibi_slopes, dropout=dropout, dropout_rng_state=state,
        )
        return (result, lse) if return_lse else result
    return _torch_direct.attention(
        q, k, v, causal=causal, softmax_scale=softmax_scale, return_lse=return_lse,
        backend=backend, out=out, window=window, softcap=softcap, alibi_slopes=alibi_slopes,
        dropout=dropout, dropout_rng_state=state,
    )


def _check_before_op_draw(
    q: Tensor, k: Tensor, v: Tensor, out: Optional[Tensor], causal: bool,
    softmax_scale: Optional[float], backend: Optional[str], window: tuple[int, int],
    softcap: float, alibi_slopes: Optional[Tensor], dropout_p: float,
) -> None:
    """The forward op's checks (its fake's), for a call about to draw a rng state for it.
    Skipped while compiling, where the fake runs them as the call is traced (a trace that
    fails runs no draw), and under functorch transforms, where the op's own dispatch decides
    what its checks see."""
    if checked_by_the_op():
        return
    _fake_forward_problem(q, k, v, out, causal, backend, _scale(q, softmax_scale), window,
                          softcap, alibi_slopes, dropout_p)


def checked_by_the_op() -> bool:
    """Whether a forward op's checks are left to the op (see ``_check_before_op_draw``)."""
    return bool(torch.compiler.is_compiling() or _functorch_active is None
                or _functorch_active())


def _scale(q: Tensor, softmax_scale: Optional[float]) -> float:
    """The scale the custom ops take: given, or 1/sqrt(headdim). A q without a head dim gets
    1.0: the op's checks then name what is wrong with q."""
    if softmax_scale is not None:
        return float(softmax_scale)
    headdim = q.shape[-1] if q.dim() > 0 else 0
    return 1.0 / math.sqrt(headdim) if headdim > 0 else 1.0


# The variable-length and KV-cache custom ops register with these: one import makes every
# flashcute op known to torch.
from . import _torch_varlen  # noqa: E402,F401
from . import _torch_kvcache  # noqa: E402,F401
