"""Which kernel runs a call, as the library decides it.

The decision (backend, compiled head dims, what a build and a GPU can run) lives in one place,
the C++ library's dispatch policy (cpp/dispatch_policy.h), which ``attention_forward`` and
``attention_backward`` follow too. Every front end (torch, DLPack, JAX) asks it through
``flashcute._C.choose_kernel``; this module only names the backends and converts. Its
ValueError messages name the argument that decides (``backend``, ``v``, the head dim, dtype).
"""

from __future__ import annotations

from typing import Any, Optional

from ._build_info import BACKEND_NAMES, backend_support, head_dim_pairs, load_extension

# A capability each path runs on, for questions about a path rather than a GPU.
_RUNS_ON = {"ampere": 80, "hopper": 90}


def _code(ext: Any, requested: Optional[str]) -> int:
    if requested is None:
        return int(ext.BACKEND_AUTO)
    if requested not in BACKEND_NAMES:
        raise ValueError(f"backend: expected None, 'ampere' or 'hopper', got {requested!r}")
    return int(ext.BACKEND_HOPPER if requested == "hopper" else ext.BACKEND_AMPERE)


def kernel_head_dim_pair(
    backend: str, headdim: int, headdim_v: int, backward: bool = False
) -> Optional[tuple[int, int]]:
    """The compiled kernel's (head dim, v head dim) that runs a call of ``backend``, or None.
    Forward: the smallest head dim pair at least as large in both (equal head dims: the
    smallest kernel at least as large). Backward with differing head dims: the backward kernel
    at least as large as both, as (kernel head dim, kernel head dim)."""
    ext = load_extension()
    try:
        _, d, dv = ext.choose_kernel(_code(ext, backend), _RUNS_ON[backend], headdim, headdim_v, "",
                                     backward, False)
    except ValueError:
        return None
    return int(d), int(dv)


def kernel_head_dim(backend: str, headdim: int, backward: bool = False) -> Optional[int]:
    """The compiled head dim of ``backend`` (its backward with ``backward=True``) that runs
    ``headdim``: the smallest one at least as large, or None. The kernel then reads and writes
    only ``headdim`` columns."""
    pair = kernel_head_dim_pair(backend, headdim, headdim, backward)
    return pair[0] if pair is not None else None


def pairs_text(backward: bool) -> str:
    """What the Hopper path compiles for calls whose v head dim differs, for messages."""
    if backward:
        dims = backend_support("hopper", backward=True)[0]
        compiled = ", ".join(map(str, dims)) if dims else "none"
        return f"backward head dims {compiled}, one at least as large as both head dims"
    pairs = head_dim_pairs("hopper")
    return "pairs " + (", ".join(f"({d}, {dv})" for d, dv in pairs) if pairs else "none")


def _choose(
    requested: Optional[str], capability: int, headdim: Optional[int], headdim_v: Optional[int],
    dtype: Optional[str], backward: bool, deterministic: bool,
) -> int:
    ext = load_extension()
    backend, _, _ = ext.choose_kernel(
        _code(ext, requested), capability, headdim or 0, headdim_v or 0, dtype or "", backward,
        deterministic,
    )
    return int(backend)


def choose_backend(
    requested: Optional[str],
    capability: int,
    *,
    headdim: Optional[int] = None,
    dtype: Optional[str] = None,
    headdim_v: Optional[int] = None,
) -> int:
    """Resolve a backend request to one of ``_C.BACKEND_AMPERE`` / ``_C.BACKEND_HOPPER``.

    Args:
        requested: None (pick by the GPU), "ampere" or "hopper".
        capability: the GPU's compute capability, major * 10 + minor (86 for sm86).
        headdim, dtype: when given, the chosen backend must have kernels compiled for them.
        headdim_v: v's head dim where it differs from ``headdim``: only the Hopper path's
            head dim pair kernels run such calls (a ValueError naming ``v`` elsewhere).

    With ``requested=None`` the GPU's default backend runs the call; when this build lacks
    kernels for the head dim / dtype there, the other backend does if it has them and runs on
    this GPU. On sm90 the Hopper path keeps a call unless its kernel would be more than twice
    as wide as the Ampere path's (measured faster up to twice); elsewhere a narrower kernel of
    the other backend wins over rounding up.

    Raises:
        ValueError: an unknown backend name, or a backend that cannot run this GPU, head dim
            or dtype in this build.
        RuntimeError: the GPU is older than sm80 (no backend can run on it).
        ImportError: the compiled extension is missing.
    """
    return _choose(requested, capability, headdim, headdim_v, dtype, False, False)


def choose_backward_backend(
    requested: Optional[str],
    capability: int,
    *,
    headdim: int,
    dtype: str,
    deterministic: bool = False,
    headdim_v: Optional[int] = None,
) -> int:
    """Like ``choose_backend``, for the backward pass.

    With ``requested=None``, an sm90 GPU runs the Hopper-path backward where this build has it
    for the head dim (rounded up) and dtype, unless its kernel would be more than twice as wide
    as the Ampere path's; everything else, and every ``deterministic=True`` call, runs the
    Ampere path (only its atomic-free design is bitwise reproducible). A call whose v head dim
    differs runs on the Hopper path only, on a backward kernel at least as large as both head
    dims (never deterministic: it adds dQ with atomics).

    Raises:
        ValueError: a backend that cannot run this GPU, head dim or dtype, or
            backend="hopper" with deterministic=True, or a v head dim of its own where no
            kernel runs it (naming ``v``).
        RuntimeError: the GPU is older than sm80.
    """
    return _choose(requested, capability, headdim, headdim_v, dtype, True, deterministic)
