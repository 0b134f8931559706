"""flashcute.jax's XLA custom calls (cpp/bindings/xla_ffi.cpp): target registration, the static
plan of a call, and the forward and backward calls on traced arrays.

A plan is decided at trace time, once per traced call: the checks with argument names, the
backend (``_dispatch``), and the workspace sizes for the device the trace targets. The handlers
run on XLA's stream and device with workspaces that XLA allocates as extra results, so a
jitted step holds no host sync and no allocation of flashcute's own.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ._build_info import load_extension

FORWARD_TARGET = "flashcute_attention_forward"
BACKWARD_TARGET = "flashcute_attention_backward"

#: The optional inputs of both calls, in order; an absent one is an empty array.
OPTIONAL_INPUTS = ("alibi_slopes", "dropout_rng_state", "cu_seqlens_q", "cu_seqlens_k", "seqused_k")

#: jax's tracer type (traced values inside jit, grad, vmap, ...).
TRACER: Any = getattr(getattr(jax, "core", None), "Tracer", ())


@functools.lru_cache(maxsize=1)
def register_targets() -> None:
    """Register the handlers with XLA for CUDA (once per process).

    Raises:
        ImportError: the compiled extension is missing or was built without the handlers.
    """
    ext = load_extension()
    targets = getattr(ext, "xla_ffi_targets", None)
    if targets is None:
        raise ImportError(
            "flashcute.jax: this build of flashcute._C has no XLA FFI handlers (no jaxlib "
            "headers at build time); reinstall with `pip install .`, whose build environment "
            "brings them, or point FLASHCUTE_XLA_FFI_INCLUDE_DIR at a jaxlib/include folder"
        )
    for name, capsule in targets().items():
        jax.ffi.register_ffi_target(name, capsule, platform="CUDA")


def trace_device_id(x: Any) -> int:
    """The CUDA ordinal whose GPU sizes the plan: a concrete array's own device, else JAX's
    first GPU (the handlers launch on the device XLA runs them on).

    Raises:
        RuntimeError: JAX has no CUDA GPU.
    """
    devices = getattr(x, "devices", None)
    if devices is not None and not isinstance(x, TRACER):
        found = list(devices())
        if len(found) == 1 and found[0].platform == "gpu":
            return int(found[0].local_hardware_id)
    try:
        gpus = jax.devices("gpu")
    except RuntimeError as exc:
        raise RuntimeError(f"flashcute.jax needs a CUDA GPU visible to JAX ({exc})") from exc
    return int(gpus[0].local_hardware_id)


@dataclass(frozen=True)
class Plan:
    """What the trace decided for one call: static, hashable (a custom_vjp's static argument)."""

    scale: float
    causal: bool
    window_left: int
    window_right: int
    softcap: float
    dropout_p: float
    max_seqlen_q: int  # variable-length calls; 0 otherwise
    max_seqlen_k: int
    forward_backend: int
    forward_workspace: int  # bytes (0: none)
    out_shape: tuple[int, ...]
    lse_shape: tuple[int, ...]
    # How vmap runs the call: "broadcast_all" folds the mapped axis into the batch (one
    # launch); variable-length and dropout calls map sequentially (offsets and masks are
    # per call).
    vmap_method: str
    backward_backend: int = -1  # -1: not planned (a forward-only call)
    backward_workspace: int = 0
    deterministic: bool = False
    requested_backend: Optional[str] = None  # the caller's backend=, for the backward's choice
    varlen: bool = False  # packed tensors with cu_seqlens

    def attributes(self) -> dict[str, Any]:
        return {
            "softmax_scale": np.float32(self.scale),
            "causal": np.bool_(self.causal),
            "window_left": np.int64(self.window_left),
            "window_right": np.int64(self.window_right),
            "softcap": np.float32(self.softcap),
            "dropout_p": np.float32(self.dropout_p),
            "max_seqlen_q": np.int64(self.max_seqlen_q),
            "max_seqlen_k": np.int64(self.max_seqlen_k),
        }


def forward(
    plan: Plan, q: Any, k: Any, v: Any, optional: Sequence[Any], with_lse: bool = True
) -> tuple[Any, Any]:
    """(out, lse) of the forward custom call; ``optional`` as ``OPTIONAL_INPUTS``. Without
    ``with_lse`` the lse is an empty array that the kernel does not write."""
    results = (
        jax.ShapeDtypeStruct(plan.out_shape, q.dtype),
        jax.ShapeDtypeStruct(plan.lse_shape if with_lse else (0,), jnp.float32),
        jax.ShapeDtypeStruct((plan.forward_workspace,), jnp.uint8),
    )
    call = jax.ffi.ffi_call(FORWARD_TARGET, results, vmap_method=plan.vmap_method)
    out, lse, _ = call(q, k, v, *optional, **plan.attributes(),
                       backend=np.int32(plan.forward_backend))
    return out, lse


def backward(
    plan: Plan, dout: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, optional: Sequence[Any]
) -> tuple[Any, Any, Any]:
    """(dq, dk, dv) of the backward custom call."""
    results = (
        jax.ShapeDtypeStruct(q.shape, q.dtype),
        jax.ShapeDtypeStruct(k.shape, k.dtype),
        jax.ShapeDtypeStruct(v.shape, v.dtype),
        jax.ShapeDtypeStruct((plan.backward_workspace,), jnp.uint8),
    )
    call = jax.ffi.ffi_call(BACKWARD_TARGET, results, vmap_method=plan.vmap_method)
    dq, dk, dv, _ = call(dout, q, k, v, out, lse, *optional, **plan.attributes(),
                         deterministic=np.bool_(plan.deterministic),
                         backend=np.int32(plan.backward_backend))
    return dq, dk, dv
