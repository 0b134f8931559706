"""FP8 attention: ``flashcute.attention`` with float8_e4m3fn q, k and v (Hopper path, forward only).

``attention`` routes calls here when q, k or v is a float8 array or ``dtype='float8_e4m3fn'``
is given. The kernel reads e4m3 Q, K and V with their descales (per (batch, head) or per
block of ``FP8_BLOCK`` rows), quantizes P to e4m3 and writes a bfloat16 (or, into an fp16
``out``, float16) output.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from ._build_info import load_extension
from ._dispatch import choose_backend
from ._frameworks import export, launchable
from ._validate import _check_devices, _inspect, forward_problem
from ._validate_varlen import varlen_problem
from ._validate_fp8 import (
    FP8_DTYPE,
    FP8_OUT_DTYPES,
    check_descales,
    check_dtype_arg,
    check_input_dtypes,
    check_out,
    fp8_dtype_name,
)


def is_fp8_call(q: Any, k: Any, v: Any, dtype: Any) -> bool:
    """Whether ``attention`` takes the FP8 route: a float8 q, k or v, or ``dtype=`` given."""
    return dtype is not None or any(fp8_dtype_name(x) is not None for x in (q, k, v))


def _refuse_training(q: Any, k: Any, v: Any, deterministic: Any, dropout_p: Any) -> None:
    """FP8 has no backward: autograd and ``deterministic`` raise NotImplementedError; dropout
    (which only training uses) a ValueError."""
    if deterministic is True:
        raise NotImplementedError("deterministic: FP8 (float8_e4m3fn) attention has no backward yet")
    if dropout_p != 0.0:
        raise ValueError(f"dropout_p: FP8 (float8_e4m3fn) attention has no dropout, got {dropout_p!r}")
    if any(type(x).__module__.partition(".")[0] == "torch" for x in (q, k, v)):
        import torch

        if torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in (q, k, v)):
            raise NotImplementedError(
                "q, k, v: FP8 (float8_e4m3fn) attention has no backward yet, so it cannot run "
                "under autograd; call it under torch.no_grad() or on tensors that do not require grad"
            )


def _torch_bytes(q: Any, k: Any, v: Any) -> Optional[tuple[Any, Any, Any]]:
    """torch float8 tensors as uint8 views (DLPack export of float8 differs between torch
    versions; the bytes are what the kernel reads), after naming any that is not e4m3; None
    for other arrays."""
    xs = (q, k, v)
    if not all(type(x).__module__.partition(".")[0] == "torch" for x in xs):
        return None
    import torch

    if not all(isinstance(x, torch.Tensor) for x in xs):
        return None
    for name, x in zip("qkv", xs):
        if x.dtype == torch.float8_e5m2:
            raise TypeError(f"{name}: float8_e5m2 is unsupported; FP8 attention takes float8_e4m3fn")
        if x.dtype != torch.float8_e4m3fn:
            raise TypeError(
                f"{name}: expected float8_e4m3fn like the other inputs, got {str(x.dtype).rpartition('.')[2]}; "
                "FP8 calls take float8_e4m3fn q, k and v together"
            )
    return tuple(x.view(torch.uint8) for x in xs)  # type: ignore[return-value]


def _prepare(q: Any, k: Any, v: Any, dtype: Any, deterministic: Any, dropout_p: Any) -> tuple[Any, Any, Any, bool]:
    """The refusals, then the inputs as the extension reads them (torch float8 as uint8 views)
    and whether they are uint8 bytes of e4m3."""
    dtype = check_dtype_arg(dtype)
    _refuse_training(q, k, v, deterministic, dropout_p)
    views = _torch_bytes(q, k, v)
    q_in, k_in, v_in = views if views is not None else (q, k, v)
    return q_in, k_in, v_in, views is not None or dtype is not None


def _run(
    ext: Any, problem: Any, infos: list[Any], tensors: tuple[Any, ...], sizes: tuple[int, ...], *, q: Any, out: Any,
    causal: bool, backend: Optional[str], return_lse: bool, descales: dict[str, Any], uint8_bytes: bool,
    varlen: bool,
) -> Any:
    """Descale and out checks, one device, allocation with q's framework, the launch."""
    from .attention import _allocator, _check_outs, _launch

    _, descale_infos = check_descales(
        _inspect, descales["q_descale"], descales["k_descale"], descales["v_descale"],
        batch=problem.batch, nheads=problem.nheads, nheads_kv=problem.nheads_kv,
        seqlen_q=getattr(problem, "seqlen_q", 0), seqlen_k=getattr(problem, "seqlen_k", 0), varlen=varlen,
    )
    out_x = export(out) if out is not None else None
    out_infos = []
    if out_x is not None:
        out_info = _inspect("out", out_x)
        check_out(out_info, problem.out_shape)
        out_infos.append(out_info)
    _check_devices(infos[0], infos[1:] + descale_infos + out_infos)
    _check_outs(out)
    alloc, like = _allocator(q, out, return_lse)
    capability = int(ext.device_capability(problem.device_id))
    backend_code = choose_backend(backend, capability, headdim=problem.headdim, dtype=FP8_DTYPE,
                                  headdim_v=problem.dv)
    result = out if out is not None else alloc.empty(like, problem.out_shape, FP8_OUT_DTYPES[0])
    lse = alloc.empty(like, problem.lse_shape, "float32") if return_lse else None
    if not problem.empty_output:
        q_x, k_x, v_x, slopes_x, *seq = tensors
        launched = (q_x, k_x, v_x, out_x if out is not None else result, lse, slopes_x, *seq)
        extra = {name: launchable(x) if x is not None else None for name, x in descales.items()}
        _launch(ext, problem, alloc, like, launched, causal, backend_code, lambda *_: 0, sizes,
                extra={**extra, "uint8_as_fp8": uint8_bytes})
    return (result, lse) if return_lse else result


def _exported_descales(q_descale: Any, k_descale: Any, v_descale: Any) -> dict[str, Any]:
    return {name: export(x) if x is not None else None
            for name, x in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale))}


def attention_fp8(
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
    return_lse: bool = False,
    out: Any = None,
    backend: Optional[str] = None,
    deterministic: bool = False,
    q_descale: Any = None,
    k_descale: Any = None,
    v_descale: Any = None,
    dtype: Optional[str] = None,
) -> Any:
    """FP8 attention forward; ``flashcute.attention`` documents the arguments.

    Raises:
        TypeError: inputs not all float8_e4m3fn (float8_e5m2 named unsupported), a descale
            that is not float32, an out that is not bfloat16 or float16.
        ValueError: shapes, strides, devices, descale shapes, block descales beside a missing
            one, dropout, or a GPU or backend without the Hopper path (FP8 needs sm90).
        NotImplementedError: autograd or ``deterministic=True`` (FP8 has no backward yet).
    """
    q_in, k_in, v_in, uint8_bytes = _prepare(q, k, v, dtype, deterministic, dropout_p)
    ext = load_extension()
    q_x, k_x, v_x = export(q_in), export(k_in), export(v_in)
    slopes_x = export(alibi_slopes) if alibi_slopes is not None else None
    problem, infos = forward_problem(
        q_x, k_x, v_x, None, causal=causal, softmax_scale=softmax_scale, backend=backend,
        window=window, softcap=softcap, alibi_slopes=slopes_x,
        check_dtypes=lambda qi, others: check_input_dtypes([qi, *others], uint8_bytes),
    )
    return _run(ext, problem, infos, (q_x, k_x, v_x, slopes_x), (), q=q, out=out, causal=causal, backend=backend,
                return_lse=return_lse, descales=_exported_descales(q_descale, k_descale, v_descale),
                uint8_bytes=uint8_bytes, varlen=False)


def attention_varlen_fp8(
    q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, max_seqlen_q: int, max_seqlen_k: int, *,
    seqused_k: Any = None, causal: bool = False, softmax_scale: Optional[float] = None,
    window: Sequence[int] = (-1, -1), softcap: float = 0.0, alibi_slopes: Any = None, dropout_p: float = 0.0,
    return_lse: bool = False, out: Any = None, backend: Optional[str] = None, deterministic: bool = False,
    q_descale: Any = None, k_descale: Any = None, v_descale: Any = None, dtype: Optional[str] = None,
) -> Any:
    """FP8 ``attention_varlen``: descales per (sequence, head) only, of shape (num_sequences,
    heads); otherwise as ``attention_fp8``."""
    from .varlen import varlen_extension

    q_in, k_in, v_in, uint8_bytes = _prepare(q, k, v, dtype, deterministic, dropout_p)
    ext = varlen_extension()
    q_x, k_x, v_x = export(q_in), export(k_in), export(v_in)
    cu_q_x, cu_k_x = export(cu_seqlens_q), export(cu_seqlens_k)
    used_x = export(seqused_k) if seqused_k is not None else None
    slopes_x = export(alibi_slopes) if alibi_slopes is not None else None
    problem, infos = varlen_problem(
        q_x, k_x, v_x, cu_q_x, cu_k_x, max_seqlen_q, max_seqlen_k, None, seqused_k=used_x, causal=causal,
        softmax_scale=softmax_scale, backend=backend, window=window, softcap=softcap, alibi_slopes=slopes_x,
        check_dtypes=lambda qi, others: check_input_dtypes([qi, *others], uint8_bytes),
    )
    return _run(ext, problem, infos, (q_x, k_x, v_x, slopes_x, cu_q_x, cu_k_x, used_x),
                (problem.max_seqlen_q, problem.max_seqlen_k), q=q, out=out, causal=causal, backend=backend,
                return_lse=return_lse, descales=_exported_descales(q_descale, k_descale, v_descale),
                uint8_bytes=uint8_bytes, varlen=True)


__all__ = ["attention_fp8", "attention_varlen_fp8", "is_fp8_call"]
