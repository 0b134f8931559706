"""The implementations: availability, lazy access to flashcute and FlashAttention-3, callables.

The availability helpers are pure (FlashAttention-3's only tries the import);
everything that runs an implementation imports ``torch`` (and ``flashcute``
or ``flash_attn_interface``) only when called.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Callable, Optional

from .grid import (
    DROPOUT_SEED,
    FA3_DTYPES,
    FA3_HDIMS,
    FA3_IMPLS,
    FLASHCUTE_IMPLS,
    IMPLS,
    NO_WINDOW,
    SDPA_IMPLS,
    Notes,
    alibi_slopes,
    feature_label,
    feature_name,
    short_impl,
)

if TYPE_CHECKING:  # pragma: no cover - typing only
    from torch import Tensor

#: What ``flashcute.build_info()`` returns (``None`` or ``{}`` when unknown).
BuildInfo = Optional[Mapping[str, Any]]

_DTYPE_ALIASES: dict[str, frozenset[str]] = {
    "bf16": frozenset({"bf16", "bfloat16", "torch.bfloat16"}),
    "fp16": frozenset({"fp16", "float16", "half", "torch.float16"}),
}


def short_error(exc: BaseException) -> str:
    """``Type: first line of message`` (SDPA errors can be very long)."""
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    if len(first) > 200:
        first = first[:197] + "..."
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _dtype_supported(dtype: str, listed: Iterable[Any] | None) -> bool:
    """Whether ``dtype`` appears in a build_info dtype list (absent/empty: no limit)."""
    if not listed:
        return True
    aliases = _DTYPE_ALIASES.get(dtype, frozenset({dtype}))
    return any(str(item).lower() in aliases for item in listed)


def _head_dims(listed: Iterable[Any] | None) -> list[int]:
    """Normalize a build_info head-dim list to sorted ints."""
    out: set[int] = set()
    for item in listed or ():
        with contextlib.suppress(TypeError, ValueError):
            out.add(int(item))
    return sorted(out)


def _hopper_reason(impl: str, capability: tuple[int, int]) -> str | None:
    """Why ``impl`` cannot run on this device's architecture, or ``None``."""
    if impl == "flashcute-hopper" and capability[0] != 9:
        return (
            f"{impl} skipped: needs an sm90 device, this one is "
            f"sm{capability[0]}{capability[1]}"
        )
    return None


def _backend_info(backend: str, build_info: BuildInfo) -> Any:
    """The ``build_info()["backends"][backend]`` entry, or ``None``."""
    return ((build_info or {}).get("backends") or {}).get(backend)


def impl_skip_reason(
    impl: str, hdim: int, dtype: str, build_info: BuildInfo, capability: tuple[int, int]
) -> str | None:
    """Why ``impl`` cannot run ``(hdim, dtype)`` here, or ``None`` if it can.

    flashcute implementations are filtered up front from
    ``flashcute.build_info()`` and the device's compute capability,
    FlashAttention-3 by :data:`FA3_HDIMS` and :data:`FA3_DTYPES`; SDPA
    backends are tried and any exception is reported as a note instead.
    """
    if impl in FA3_IMPLS:
        return _fa3_skip_reason(impl, hdim, dtype)
    if impl not in FLASHCUTE_IMPLS:
        return None
    backend = short_impl(impl)
    reason = _hopper_reason(impl, capability)
    if reason is not None:
        return reason
    info = _backend_info(backend, build_info)
    if not info:
        return f"{impl} skipped: the flashcute build has no {backend!r} backend"
    head_dims = _head_dims(info.get("head_dims"))
    if not any(compiled >= hdim for compiled in head_dims):  # runs on the next larger kernel
        return (
            f"{impl} skipped for hdim={hdim}: build supports head dims up to "
            f"{head_dims[-1] if head_dims else 'none'} (compiled: {head_dims or 'none'})"
        )
    if not _dtype_supported(dtype, info.get("dtypes")):
        return (
            f"{impl} skipped for {dtype}: build supports dtypes "
            f"{list(info.get('dtypes') or [])}"
        )
    return None


def impl_unavailable_reason(
    impl: str, build_info: BuildInfo, capability: tuple[int, int],
    flashcute_error: str | None, has_cudnn_sdpa: bool,
) -> str | None:
    """Why ``impl`` is unavailable for the whole run, or ``None``.

    Unavailable implementations get no table column; implementations that
    only lack some head dims are handled per row by :func:`impl_skip_reason`.
    """
    if impl in FLASHCUTE_IMPLS:
        if flashcute_error is not None:
            return f"{impl} skipped: flashcute is not usable ({flashcute_error})"
        backend = short_impl(impl)
        reason = _hopper_reason(impl, capability)
        if reason is not None:
            return reason
        info = _backend_info(backend, build_info)
        if not info or not _head_dims(info.get("head_dims")):
            return f"{impl} skipped: the flashcute build has no {backend!r} kernels"
        return None
    if impl == "sdpa-cudnn" and not has_cudnn_sdpa:
        return f"{impl} skipped: this PyTorch has no SDPBackend.CUDNN_ATTENTION"
    if impl in FA3_IMPLS:
        error = fa3_import_error()
        if error is not None:
            return f"{impl} skipped: FlashAttention-3 is not importable ({error})"
    return None


def feature_skip_reason(
    impl: str, window: Sequence[int] = NO_WINDOW, softcap: float = 0.0, alibi: bool = False,
    dropout: float = 0.0,
) -> str | None:
    """Why ``impl`` is not timed with this window, softcap, ALiBi and dropout, or ``None``
    if it is.

    Only flashcute computes them: SDPA has no sliding-window, softcap or ALiBi
    kernel (a dense boolean or additive mask would time another algorithm, and
    softcap has no form at all), and the FlashAttention-3 build timed beside
    flashcute has none of them.  These implementations are timed on dense
    problems only, dropout included (their masks would differ from flashcute's,
    so ``--check`` could not hold them to one reference).
    """
    if impl in FLASHCUTE_IMPLS or feature_name(window, softcap, alibi, dropout) == "dense":
        return None
    what = feature_label(window, softcap, alibi, dropout)
    if impl in FA3_IMPLS:
        why = "the FlashAttention-3 build timed here has no window, softcap or ALiBi"
    else:
        why = "SDPA has no sliding-window, softcap or ALiBi kernel"
    if feature_name(window, softcap, alibi) == "dense":  # dropout alone
        why = "dropout is timed for flashcute only (another mask would not be checkable)"
    return (f"{impl} not timed with {what}: {why}; it is timed on dense problems only "
            f"(--with-dense adds them)")


def _fa3_skip_reason(impl: str, hdim: int, dtype: str) -> str | None:
    """Why FlashAttention-3 is not timed for ``(hdim, dtype)``, or ``None``."""
    if hdim not in FA3_HDIMS:
        return f"{impl} skipped for hdim={hdim}: timed for head dims {list(FA3_HDIMS)}"
    if dtype not in FA3_DTYPES:
        return f"{impl} skipped for {dtype}: timed for dtypes {list(FA3_DTYPES)}"
    return None


def _import_fa3() -> Callable[..., Any]:
    """``flash_attn_interface.flash_attn_func`` (raises when it cannot be imported)."""
    from flash_attn_interface import flash_attn_func  # noqa: PLC0415 - deliberately lazy

    if not callable(flash_attn_func):
        raise ImportError("flash_attn_interface.flash_attn_func is not callable")
    return flash_attn_func


def fa3_import_error() -> str | None:
    """Why ``from flash_attn_interface import flash_attn_func`` fails, or ``None``."""
    try:
        _import_fa3()
    except Exception as exc:  # noqa: BLE001 - any failure means "unavailable"
        return short_error(exc)
    return None


def select_impls(
    requested: Sequence[str] | None, build_info: Mapping[str, Any], capability: tuple[int, int],
    flashcute_error: str | None, cudnn_sdpa: bool, notes: Notes,
) -> list[str]:
    """The implementations to run; unavailable ones are dropped with a note."""
    candidates = list(requested if requested is not None else IMPLS)
    if flashcute_error is not None:
        dropped = [i for i in candidates if i in FLASHCUTE_IMPLS]
        if dropped:
            notes.add(
                f"flashcute is not usable ({flashcute_error}); skipping " + ", ".join(dropped)
            )
        candidates = [i for i in candidates if i not in FLASHCUTE_IMPLS]
    chosen: list[str] = []
    for impl in candidates:
        reason = impl_unavailable_reason(impl, build_info, capability, flashcute_error, cudnn_sdpa)
        if reason is None:
            chosen.append(impl)
        else:
            notes.add(reason)
    return chosen


def _import_flashcute() -> Any:
    """Import and return the ``flashcute`` package (raises on failure)."""
    import flashcute  # noqa: PLC0415 - deliberately lazy

    if not callable(getattr(flashcute, "attention", None)):
        raise ImportError("flashcute.attention is not available")
    return flashcute


def flashcute_backward_available() -> bool:
    """Whether the installed flashcute provides a backward pass.

    The benchmark times the flashcute backward (through autograd on
    ``flashcute.attention``) only when this returns ``True``.
    """
    try:
        import flashcute  # noqa: PLC0415 - deliberately lazy
    except Exception:  # noqa: BLE001 - any import failure means "no"
        return False
    return hasattr(flashcute, "attention_backward")


def backward_supported(impl: str) -> bool:
    """Whether ``--bwd`` times a backward pass for ``impl``."""
    if impl in SDPA_IMPLS or impl in FA3_IMPLS:
        return True
    return impl in FLASHCUTE_IMPLS and flashcute_backward_available()


def load_flashcute() -> tuple[Any | None, dict[str, Any], str | None]:
    """Return ``(module, build_info, error)``; ``module`` is None on failure."""
    try:
        fc = _import_flashcute()
    except Exception as exc:  # noqa: BLE001 - report any failure as a note
        return None, {}, short_error(exc)
    info: dict[str, Any] = {}
    build_info = getattr(fc, "build_info", None)
    if callable(build_info):
        try:
            info = dict(build_info())
        except Exception as exc:  # noqa: BLE001
            return fc, {}, f"build_info() failed: {short_error(exc)}"
    return fc, info, None


def flashcute_version(fc: Any | None, build_info: Mapping[str, Any]) -> str | None:
    """Best-effort flashcute version string."""
    version = build_info.get("version") if build_info else None
    if version is None and fc is not None:
        version = getattr(fc, "__version__", None)
    return None if version is None else str(version)


def has_cudnn_sdpa() -> bool:
    """Whether this PyTorch exposes ``SDPBackend.CUDNN_ATTENTION``."""
    try:
        from torch.nn.attention import SDPBackend  # noqa: PLC0415
    except Exception:  # noqa: BLE001
        return False
    return hasattr(SDPBackend, "CUDNN_ATTENTION")


def impl_context(impl: str) -> contextlib.AbstractContextManager[Any]:
    """Context manager to enter around every call of ``impl``.

    SDPA implementations are pinned to one backend with
    ``torch.nn.attention.sdpa_kernel``; flashcute and FlashAttention-3 need nothing.
    """
    if impl not in SDPA_IMPLS:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: PLC0415

    backends = {
        "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION,
        "sdpa-flash": SDPBackend.FLASH_ATTENTION,
    }
    return sdpa_kernel(backends[impl])


def sdpa_mask_note(impl: str, causal: bool, seqlen_q: int, seqlen_k: int) -> str | None:
    """The note for SDPA on a causal problem with ``seqlen_q != seqlen_k``, else ``None``.

    SDPA's ``is_causal`` aligns the mask top-left, flashcute and
    FlashAttention-3 bottom-right; :func:`sdpa_forward` then passes torch's
    bottom-right ``CausalBias`` instead, so that every implementation solves
    the same problem.
    """
    if impl not in SDPA_IMPLS or not causal or seqlen_q == seqlen_k:
        return None
    return (
        f"{impl}: causal with seqlen_q != seqlen_k runs with "
        "torch.nn.attention.bias.causal_lower_right (is_causal is aligned top-left); "
        "a backend without a bottom-right causal kernel gets it as a dense boolean mask"
    )


def sdpa_forward(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> Callable[[], Tensor]:
    """A callable running SDPA on ``(batch, seqlen, nheads, hdim)`` tensors.

    It computes flashcute's problem: causal is bottom-right aligned when
    ``seqlen_q != seqlen_k`` (see :func:`sdpa_mask_note`), and ``nheads_kv <
    nheads`` uses ``enable_gqa``.  Its output has SDPA's ``(batch, nheads,
    seqlen, hdim)`` layout.
    """
    import torch.nn.functional as F  # noqa: PLC0415

    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    kwargs: dict[str, Any] = {}
    if q.shape[2] != k.shape[2]:
        kwargs["enable_gqa"] = True
    if causal and seqlen_q != seqlen_k:
        from torch.nn.attention.bias import causal_lower_right  # noqa: PLC0415

        with warnings.catch_warnings():
            # It warns of NaN rows when seqlen_q > seqlen_k: rows with no key, expected.
            warnings.simplefilter("ignore")
            kwargs["attn_mask"] = causal_lower_right(seqlen_q, seqlen_k)
    else:
        kwargs["is_causal"] = causal
    return lambda: F.scaled_dot_product_attention(qt, kt, vt, **kwargs)


def alibi_tensor(q: Tensor) -> Tensor:
    """The :func:`~.grid.alibi_slopes` of q's head count, float32 (nheads,) on q's device."""
    import torch  # noqa: PLC0415

    return torch.tensor(alibi_slopes(q.shape[2]), dtype=torch.float32, device=q.device)


def make_forward_fn(
    impl: str, q: Tensor, k: Tensor, v: Tensor, causal: bool,
    *, window: Sequence[int] = NO_WINDOW, softcap: float = 0.0, alibi: bool = False,
    dropout: float = 0.0,
) -> Callable[[], Tensor]:
    """A zero-argument callable running one forward pass of ``impl``.

    ``q`` is ``(batch, seqlen_q, nheads, hdim)``, ``k, v`` ``(batch, seqlen_k,
    nheads_kv, hdim)``; causal is bottom-right aligned for every
    implementation.  SDPA gets ``(batch, nheads, seqlen, hdim)`` transposed
    views and must be called inside :func:`impl_context`.  The returned output
    is in the callee's native layout; FlashAttention-3's is its output tensor
    whether its version returns ``out`` or ``(out, lse)``.  ``window``,
    ``softcap`` and ``alibi`` (the slopes of :func:`alibi_tensor`, made once
    here) and ``dropout`` (its ``dropout_p``, seed and offset :data:`~.grid.DROPOUT_SEED`)
    go to flashcute only; other implementations refuse them (ValueError, see
    :func:`feature_skip_reason`).
    """
    reason = feature_skip_reason(impl, window, softcap, alibi, dropout)
    if reason is not None:
        raise ValueError(reason)
    if impl in FLASHCUTE_IMPLS:
        fc = _import_flashcute()
        backend = short_impl(impl)
        # Dense calls keep the exact call of a dense benchmark (no extra keywords).
        features: dict[str, Any] = {}
        if tuple(window) != NO_WINDOW:
            features["window"] = tuple(window)
        if softcap > 0.0:
            features["softcap"] = softcap
        if alibi:
            features["alibi_slopes"] = alibi_tensor(q)
        if dropout > 0.0:
            seed, offset = DROPOUT_SEED
            features.update(dropout_p=dropout, dropout_seed=seed, dropout_offset=offset)
        return lambda: fc.attention(q, k, v, causal=causal, backend=backend, **features)
    if impl in SDPA_IMPLS:
        return sdpa_forward(q, k, v, causal)
    if impl in FA3_IMPLS:
        fa3 = _import_fa3()

        def run_fa3() -> Tensor:
            result = fa3(q, k, v, causal=causal)
            return result[0] if isinstance(result, tuple) else result

        return run_fa3
    raise ValueError(f"unknown implementation {impl!r}")


def make_backward_fn(
    impl: str, q: Tensor, k: Tensor, v: Tensor, causal: bool,
    *, window: Sequence[int] = NO_WINDOW, softcap: float = 0.0, alibi: bool = False,
    dropout: float = 0.0,
) -> Callable[[], Any]:
    """A zero-argument callable running only the backward pass of ``impl``.

    The forward runs once here (call inside :func:`impl_context`), with
    ``window``, ``softcap``, ``alibi`` and ``dropout`` as in :func:`make_forward_fn`; the callable
    computes ``torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)``
    so that it can be repeated.
    """
    import torch  # noqa: PLC0415

    qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
    out = make_forward_fn(impl, qg, kg, vg, causal, window=window, softcap=softcap, alibi=alibi,
                          dropout=dropout)()
    dout = torch.randn_like(out)
    return lambda: torch.autograd.grad(out, (qg, kg, vg), dout, retain_graph=True)
