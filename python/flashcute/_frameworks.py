"""Adapters for the array frameworks whose tensors flashcute can allocate and launch for.

A framework is recognised by the type of the object, only when that framework's module is
already imported (``sys.modules``); nothing here imports torch, cupy or jax on its own.

Each adapter knows how to
  * allocate (``empty``) on the device of an existing array, through the
    framework's own allocator;
  * name the caller's current CUDA stream (``stream``), on which the kernel is launched;
  * turn an array into an object that ``flashcute._C`` can read through DLPack (``export``),
    and that into the argument of one extension call (``launchable``);
  * describe an array's device, dtype, shape and strides without a DLPack export
    (``describe``), where the framework can say so cheaply.

JAX has no notion of a "current stream" that other libraries can join: its adapter reports
stream 0 (the legacy default stream) and sets ``synchronize_after``. The caller must then
wait for the inputs to be ready before the launch (``prepare``) and synchronize the stream
after it, so that JAX never reads an output the kernel is still writing.

Objects that merely implement ``__dlpack__``/``__dlpack_device__`` are handled by the
caller without an adapter: they can be read, but nothing can be allocated for them.
"""

from __future__ import annotations

import sys
from typing import Any, Optional, Sequence

Shape = Sequence[int]
#: (DLPack device type, device id, dtype name, shape, strides in elements)
Description = tuple[int, int, str, tuple[int, ...], tuple[int, ...]]

# torch device type -> DLDeviceType; meta tensors (no data, no DLPack export) get 0, which no
# DLPack device uses, so that checks can still read their shapes.
_TORCH_DLPACK_DEVICES = {"cpu": 1, "cuda": 2, "meta": 0}

ALLOCATING_FRAMEWORKS = "torch.Tensor, cupy.ndarray or jax.Array"


def _loaded_class(module: str, attr: str) -> type | None:
    mod = sys.modules.get(module)
    cls = getattr(mod, attr, None) if mod is not None else None
    return cls if isinstance(cls, type) else None


def is_dlpack(x: Any) -> bool:
    """Whether ``x`` implements the DLPack protocol (``__dlpack__`` and ``__dlpack_device__``)."""
    return hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__")


class Framework:
    """Base adapter; see the module docstring."""

    name = "?"
    #: The launch goes on stream 0 and the caller must synchronize it after the launch.
    synchronize_after = False

    def empty(self, like: Any, shape: Shape, dtype_name: str) -> Any:
        """Uninitialised array of ``shape``/``dtype_name`` on ``like``'s device."""
        raise NotImplementedError

    def stream(self, like: Any) -> int:
        """Handle of the caller's current CUDA stream on ``like``'s device."""
        raise NotImplementedError

    def export(self, x: Any) -> Any:
        """An object ``flashcute._C`` can read through DLPack."""
        return x

    def describe(self, x: Any) -> Optional[Description]:
        """``x``'s (device_type, device_id, dtype, shape, strides) as DLPack would give them,
        read without a DLPack export; None when only DLPack can tell."""
        return None

    def launchable(self, x: Any) -> Any:
        """What to hand an extension call for the exported ``x``: read once, then dropped."""
        return x

    def prepare(self, x: Any) -> None:
        """Make ``x``'s data ready for a launch on ``stream(x)``; a no-op by default."""

    def check_out(self, out: Any) -> None:
        """Raise if a caller-supplied ``out`` of this framework cannot be written."""


class TorchFramework(Framework):
    name = "torch"

    def _dtype(self, dtype_name: str) -> Any:
        import torch

        return getattr(torch, dtype_name)

    def empty(self, like: Any, shape: Shape, dtype_name: str) -> Any:
        import torch

        return torch.empty(tuple(shape), dtype=self._dtype(dtype_name), device=like.device)

    def stream(self, like: Any) -> int:
        import torch

        raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if raw_stream is not None:  # what torch.cuda.current_stream reads, without the object
            return int(raw_stream(like.device.index))
        return int(torch.cuda.current_stream(like.device).cuda_stream)

    def export(self, x: Any) -> Any:
        # DLPack export refuses tensors that require grad; the caller decides about autograd.
        return x.detach()

    def describe(self, x: Any) -> Optional[Description]:
        device = x.device
        device_type = _TORCH_DLPACK_DEVICES.get(device.type)
        if device_type is None:
            return None
        dtype = str(x.dtype).removeprefix("torch.")
        return device_type, device.index or 0, dtype, tuple(x.shape), tuple(x.stride())

    def launchable(self, x: Any) -> Any:
        # A capsule from torch's C exporter: Tensor.__dlpack__ is Python code that also
        # orders streams, which costs microseconds per tensor; the launch is on x's current
        # stream anyway.
        import torch.utils.dlpack

        return torch.utils.dlpack.to_dlpack(x)


class CupyFramework(Framework):
    name = "cupy"

    def _dtype(self, dtype_name: str) -> Any:
        import cupy

        if not hasattr(cupy, dtype_name):
            raise TypeError(f"cupy has no {dtype_name} dtype; use torch or jax for {dtype_name}")
        return getattr(cupy, dtype_name)

    def empty(self, like: Any, shape: Shape, dtype_name: str) -> Any:
        import cupy

        with cupy.cuda.Device(like.device.id):
            return cupy.empty(tuple(shape), dtype=self._dtype(dtype_name))

    def stream(self, like: Any) -> int:
        import cupy

        with cupy.cuda.Device(like.device.id):
            return int(cupy.cuda.get_current_stream().ptr)


class JaxFramework(Framework):
    """JAX arrays: immutable, no joinable stream; see the module docstring.

    Results are fresh JAX buffers that the kernel fills through DLPack before any JAX
    computation sees them; this relies on ``__dlpack__`` exporting the buffer without a copy.
    """

    name = "jax"
    synchronize_after = True

    @staticmethod
    def _device(like: Any) -> Any:
        devices = like.devices()
        if len(devices) != 1:
            raise ValueError(
                f"flashcute: expected a jax.Array on a single device, got one sharded over "
                f"{len(devices)} devices"
            )
        return next(iter(devices))

    def empty(self, like: Any, shape: Shape, dtype_name: str) -> Any:
        import jax
        import jax.numpy as jnp

        device = self._device(like)
        dtype = getattr(jnp, dtype_name)
        # JAX cannot allocate uninitialised memory (jnp.empty is zeros as well).
        try:
            result = jnp.zeros(tuple(shape), dtype, device=device)
        except TypeError:  # jax without the device= keyword
            with jax.default_device(device):
                result = jnp.zeros(tuple(shape), dtype)
        # The zero fill runs asynchronously on JAX's own stream; it must finish before the
        # kernel (on another stream) writes into the buffer.
        return result.block_until_ready()

    def stream(self, like: Any) -> int:
        return 0  # legacy default stream; synchronize_after is set

    def export(self, x: Any) -> Any:
        import jax

        tracer = getattr(getattr(jax, "core", None), "Tracer", None)
        if tracer is not None and isinstance(x, tracer):
            raise TypeError(
                "flashcute.attention cannot take traced jax values (inside jax.jit, grad, vmap, "
                "...); call it on concrete jax.Arrays"
            )
        return x

    def prepare(self, x: Any) -> None:
        x.block_until_ready()

    def check_out(self, out: Any) -> None:
        raise ValueError(
            "out: jax arrays are immutable and cannot be written in place; omit out= and use "
            "the returned array"
        )


class ArraySpec:
    """An array known only by shape, dtype and CUDA device, dense and row-major: what a traced
    jax value is when ``flashcute.jax`` checks a call at trace time. It is described like any
    array, so every front end's checks run on it unchanged."""

    __slots__ = ("shape", "dtype", "device_id")

    def __init__(self, shape: Shape, dtype: str, device_id: int) -> None:
        self.shape = tuple(int(n) for n in shape)
        self.dtype = dtype
        self.device_id = device_id


class SpecFramework(Framework):
    """``ArraySpec``s: described, never allocated or launched."""

    name = "spec"

    def describe(self, x: Any) -> Optional[Description]:
        strides, step = [], 1
        for n in reversed(x.shape):
            strides.append(step)
            step *= max(n, 1)
        return 2, x.device_id, x.dtype, x.shape, tuple(reversed(strides))  # 2: kDLCUDA


_ADAPTERS: tuple[tuple[str, str, Framework], ...] = (
    ("torch", "Tensor", TorchFramework()),
    ("cupy", "ndarray", CupyFramework()),
    ("jax", "Array", JaxFramework()),
)


_ADAPTER_OF_TYPE: dict[type, Framework] = {ArraySpec: SpecFramework()}  # types already recognised


def framework_of(x: Any) -> Framework | None:
    """The adapter for ``x``'s framework, or None for anything else (generic DLPack or not)."""
    adapter = _ADAPTER_OF_TYPE.get(type(x))
    if adapter is not None:
        return adapter
    for module, attr, candidate in _ADAPTERS:
        cls = _loaded_class(module, attr)
        if cls is not None and isinstance(x, cls):
            _ADAPTER_OF_TYPE[type(x)] = candidate
            return candidate
    return None


def export(x: Any) -> Any:
    """``x`` as an object ``flashcute._C`` can read; unknown objects are returned as they are."""
    adapter = framework_of(x)
    return adapter.export(x) if adapter is not None else x


def launchable(x: Any) -> Any:
    """An exported ``x`` (or None) as the argument of one extension call."""
    adapter = framework_of(x) if x is not None else None
    return adapter.launchable(x) if adapter is not None else x
