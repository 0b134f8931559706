"""Argument checks for the attention backward pass, on top of the forward's checks."""

from __future__ import annotations

from typing import Any, Protocol

from ._validate import (
    ForwardProblem,
    _check_devices,
    _check_rank,
    _check_strides,
    _fmt,
    _Info,
    _inspect,
    check_deterministic,
    forward_problem,
)


def check_backward_flags(deterministic: Any, backend: Any) -> None:
    """The backward's flags, before any tensor or device is looked at: ``deterministic`` is a
    bool, and the Hopper-path backward (dQ added with atomics) is not asked to be
    bitwise reproducible."""
    check_deterministic(deterministic)
    if deterministic and backend == "hopper":
        raise ValueError(
            "backend='hopper': its backward adds dQ with atomics and is not bitwise "
            "reproducible; deterministic=True runs on backend=None or 'ampere'"
        )


class _GradientShapes(Protocol):
    @property
    def q_shape(self) -> tuple[int, ...]: ...

    @property
    def out_shape(self) -> tuple[int, ...]: ...

    @property
    def kv_shape(self) -> tuple[int, ...]: ...

    @property
    def v_shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> str: ...


def gradient_infos(dout: Any, dq: Any, dk: Any, dv: Any) -> list[_Info]:
    """The infos of dout and of the gradient buffers given (not None), in that order."""
    infos = [_inspect("dout", dout)]
    for name, x in (("dq", dq), ("dk", dk), ("dv", dv)):
        if x is not None:
            infos.append(_inspect(name, x))
    return infos


def check_gradient(info: _Info, problem: _GradientShapes) -> None:
    """dout or a gradient buffer against the problem: dq of q's shape, dk of k's, dv of v's and
    dout of out's, all in q's dtype."""
    expected = {
        "dq": problem.q_shape, "dk": problem.kv_shape, "dv": problem.v_shape
    }.get(info.name, problem.out_shape)
    if info.shape != expected:
        raise ValueError(f"{info.name}: expected shape {_fmt(expected)}, got {_fmt(info.shape)}")
    if info.dtype != problem.dtype:
        raise TypeError(
            f"{info.name}: dtype {info.dtype} does not match q's dtype {problem.dtype}"
        )


def backward_problem(
    dout: Any,
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    lse: Any,
    *,
    dq: Any = None,
    dk: Any = None,
    dv: Any = None,
    causal: Any = False,
    softmax_scale: Any = None,
    deterministic: Any = False,
    backend: Any = None,
    window: Any = (-1, -1),
    softcap: Any = 0.0,
    alibi_slopes: Any = None,
    dropout_p: Any = 0.0,
    dropout_rng_state: Any = None,
) -> tuple[ForwardProblem, list[_Info]]:
    """``validate_backward`` without its last check (devices): the problem and the tensors'
    infos, q's first, for the fake implementation of the backward custom op."""
    check_backward_flags(deterministic, backend)
    if out is None:
        raise TypeError("out: expected the forward's output, got None")
    problem, forward_infos = forward_problem(
        q, k, v, out, causal=causal, softmax_scale=softmax_scale, backend=backend,
        window=window, softcap=softcap, alibi_slopes=alibi_slopes, dropout_p=dropout_p,
        dropout_rng_state=dropout_rng_state, backward=True,
    )
    infos = gradient_infos(dout, dq, dk, dv)
    for info in infos:
        _check_rank(info)
        check_gradient(info, problem)
        _check_strides(info)
    lse_info = _inspect("lse", lse)
    if lse_info.dtype != "float32" or lse_info.shape != problem.lse_shape:
        raise ValueError(
            f"lse: expected the forward's float32 (batch, nheads, seqlen_q) = "
            f"{_fmt(problem.lse_shape)} log-sum-exp, got {lse_info.dtype} {_fmt(lse_info.shape)}"
        )
    if problem.lse_shape[2] > 1 and lse_info.strides[2] != 1:
        raise ValueError(f"lse: expected unit stride in the last dimension, got {_fmt(lse_info.strides)}")
    return problem, [*forward_infos, *infos, lse_info]


def validate_backward(
    dout: Any,
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    lse: Any,
    *,
    dq: Any = None,
    dk: Any = None,
    dv: Any = None,
    causal: Any = False,
    softmax_scale: Any = None,
    deterministic: Any = False,
    backend: Any = None,
    window: Any = (-1, -1),
    softcap: Any = 0.0,
    alibi_slopes: Any = None,
    dropout_p: Any = 0.0,
    dropout_rng_state: Any = None,
) -> ForwardProblem:
    """Check the arguments of an attention backward call and describe the problem.

    q, k, v, out follow the forward's rules (see ``validate_forward``); dq has q's shape, dout
    out's, dk k's and dv v's, all in q's dtype on q's device with unit headdim stride; lse
    is the forward's float32 (batch, nheads, seqlen_q) log-sum-exp with unit last stride;
    alibi_slopes, dropout_p and dropout_rng_state follow the forward's rules.

    Raises:
        TypeError: a non-DLPack argument, wrong dtypes, a non-bool flag.
        ValueError: wrong ranks, shapes, strides, devices, head dim, scale, window, softcap,
            ALiBi slopes or backend name, or backend="hopper" with deterministic=True.
        ImportError: the compiled extension is missing.
    """
    problem, infos = backward_problem(
        dout, q, k, v, out, lse, dq=dq, dk=dk, dv=dv, causal=causal,
        softmax_scale=softmax_scale, deterministic=deterministic, backend=backend,
        window=window, softcap=softcap, alibi_slopes=alibi_slopes, dropout_p=dropout_p,
        dropout_rng_state=dropout_rng_state,
    )
    _check_devices(infos[0], infos[1:])
    return problem
