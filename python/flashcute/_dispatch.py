"""Which kernel family (backend) runs a call, from the request, the GPU and the build."""

from __future__ import annotations

from typing import Optional

from ._build_info import BACKEND_NAMES, backend_support, head_dim_pairs, load_extension

_MIN_CAPABILITY = {"ampere": 80, "hopper": 90}


def _sm(capability: int) -> str:
    return f"sm{capability}"


def kernel_head_dim(backend: str, headdim: int, backward: bool = False) -> Optional[int]:
    """The compiled head dim of ``backend`` (its backward with ``backward=True``) that runs
    ``headdim``: the smallest one at least as large, or None. The kernel then reads and writes
    only ``headdim`` columns."""
    head_dims, _ = backend_support(backend, backward=backward)
    return min((d for d in head_dims if d >= headdim), default=None)


def kernel_head_dim_pair(
    backend: str, headdim: int, headdim_v: int, backward: bool = False
) -> Optional[tuple[int, int]]:
    """The compiled kernel's (head dim, v head dim) that runs a call of ``backend`` whose v
    head dim ``headdim_v`` differs from ``headdim``, or None. Forward: the smallest head dim
    pair at least as large in both. Backward: the backward kernel at least as large as both
    head dims (its columns past each are zeros), as (kernel head dim, kernel head dim)."""
    if backward:
        kernel = kernel_head_dim(backend, max(headdim, headdim_v), backward=True)
        return None if kernel is None else (kernel, kernel)
    fits = [(d, dv) for d, dv in head_dim_pairs(backend) if d >= headdim and dv >= headdim_v]
    return min(fits, key=lambda pair: (pair[0] + pair[1], pair), default=None)


def pairs_text(backward: bool) -> str:
    """What the Hopper path compiles for calls whose v head dim differs, for messages."""
    if backward:
        dims = backend_support("hopper", backward=True)[0]
        compiled = ", ".join(map(str, dims)) if dims else "none"
        return f"backward head dims {compiled}, one at least as large as both head dims"
    pairs = head_dim_pairs("hopper")
    return "pairs " + (", ".join(f"({d}, {dv})" for d, dv in pairs) if pairs else "none")


def _choose_pair(
    requested: Optional[str],
    capability: int,
    headdim: int,
    headdim_v: int,
    dtype: Optional[str],
    backward: bool,
) -> int:
    """The backend of a call whose v head dim differs from q's: only the Hopper path has such
    kernels (head dim pairs), on sm90. ValueError naming ``v`` everywhere else."""
    what = (
        f"v: head dim {headdim_v} differs from q's and k's {headdim}; only the Hopper path "
        f"runs such calls (compiled: {pairs_text(backward)})"
    )
    if requested == "ampere":
        raise ValueError(f"{what}, not backend='ampere'")
    if not _runs_on("hopper", capability):
        raise ValueError(f"{what}, on an sm90 GPU; this is {_sm(capability)}")
    if kernel_head_dim_pair("hopper", headdim, headdim_v, backward) is None:
        raise ValueError(f"{what}; this build has none for ({headdim}, {headdim_v})")
    reason = _compiled_for("hopper", None, dtype, backward=backward)
    if reason is not None:
        raise ValueError(f"backend={'hopper'!r}: {reason}")
    return load_extension().BACKEND_HOPPER


def _compiled_for(
    backend: str, headdim: Optional[int], dtype: Optional[str], backward: bool = False
) -> Optional[str]:
    """Why ``backend`` cannot run this head dim / dtype in this build, or None if it can."""
    head_dims, dtypes = backend_support(backend, backward=backward)
    if not head_dims or not dtypes:
        what = "backward " if backward else ""
        return f"the {backend.capitalize()} path has no {what}kernels in this build"
    if headdim is not None and kernel_head_dim(backend, headdim, backward) is None:
        compiled = ", ".join(map(str, head_dims))
        what = "backward " if backward else ""
        return (
            f"head dim {headdim} has no {what}kernel in this build (compiled: {compiled}; "
            f"a head dim runs on the smallest compiled one at least as large)"
        )
    if dtype is not None and dtype not in dtypes:
        return f"dtype {dtype} is not compiled in this build (compiled: {', '.join(dtypes)})"
    return None


def _exact(backend: str, headdim: Optional[int], backward: bool = False) -> bool:
    """Whether ``backend`` compiles a kernel of exactly ``headdim`` (None: any head dim)."""
    return headdim is None or headdim in backend_support(backend, backward=backward)[0]


def _runs_on(backend: str, capability: int) -> bool:
    if backend == "hopper":
        return capability == 90  # sm90a kernels run on sm90 only
    return capability >= _MIN_CAPABILITY[backend]


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

    With ``requested=None`` the GPU's default backend (``_C.default_backend``) is used; when
    this build lacks kernels for the head dim / dtype there, the other backend is used if
    it has them and runs on this GPU. A head dim that only the other backend compiles exactly
    runs there too, rather than rounded up to a larger kernel of the default.

    Raises:
        ValueError: an unknown backend name, or a backend that cannot run this GPU, head dim
            or dtype in this build.
        RuntimeError: the GPU is older than sm80 (no backend can run on it).
        ImportError: the compiled extension is missing.
    """
    ext = load_extension()
    codes = {"ampere": ext.BACKEND_AMPERE, "hopper": ext.BACKEND_HOPPER}
    if requested is not None and requested not in BACKEND_NAMES:
        raise ValueError(f"backend: expected None, 'ampere' or 'hopper', got {requested!r}")

    if requested is None and capability < _MIN_CAPABILITY["ampere"]:
        raise RuntimeError(
            f"flashcute needs an sm80 or newer GPU (Ampere, Ada, Hopper); "
            f"this is {_sm(capability)}"
        )
    if headdim is not None and headdim_v is not None and headdim_v != headdim:
        return _choose_pair(requested, capability, headdim, headdim_v, dtype, backward=False)

    if requested is None:
        default = str(ext.default_backend(capability))
        candidates = [default] + [b for b in BACKEND_NAMES if b != default]
        able = [
            b for b in candidates
            if _runs_on(b, capability) and _compiled_for(b, headdim, dtype) is None
        ]
        for backend in able:
            if _exact(backend, headdim):
                return codes[backend]
        if able:
            return codes[able[0]]
        reason = _compiled_for(default, headdim, dtype)
        raise ValueError(f"backend={default!r} (the default on {_sm(capability)}): {reason}")

    reason = _compiled_for(requested, None, None)
    if reason is None and not _runs_on(requested, capability):
        need = "an sm90 GPU" if requested == "hopper" else "an sm80 or newer GPU"
        reason = f"requires {need}, this is {_sm(capability)}"
    if reason is None:
        reason = _compiled_for(requested, headdim, dtype)
    if reason is not None:
        raise ValueError(f"backend={requested!r}: {reason}")
    return codes[requested]


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
    for the head dim (rounded up) and dtype, unless only the Ampere path compiles that head
    dim exactly; everything else, and every ``deterministic=True`` call, runs the Ampere path
    (only its atomic-free design is bitwise reproducible).

    A call whose v head dim ``headdim_v`` differs from ``headdim`` runs on the Hopper path
    only, on a backward kernel at least as large as both head dims (never deterministic: it
    adds dQ with atomics).

    Raises:
        ValueError: a backend that cannot run this GPU, head dim or dtype, or
            backend="hopper" with deterministic=True, or a v head dim of its own where no
            kernel runs it (naming ``v``).
        RuntimeError: the GPU is older than sm80.
    """
    ext = load_extension()
    if headdim_v is not None and headdim_v != headdim:
        if requested is None and capability < _MIN_CAPABILITY["ampere"]:
            return choose_backend(None, capability, headdim=headdim, dtype=dtype)  # raises
        if deterministic and requested != "hopper":  # backend="hopper" is refused below
            raise ValueError(
                f"v: head dim {headdim_v} differs from q's and k's {headdim}; only the "
                f"Hopper-path backward runs such calls, which adds dQ with atomics: "
                f"deterministic=True has no kernel for them"
            )
        if not deterministic:
            return _choose_pair(requested, capability, headdim, headdim_v, dtype, backward=True)
    if requested == "hopper":
        if deterministic:
            raise ValueError(
                "backend='hopper': its backward adds dQ with atomics and is not bitwise "
                "reproducible; deterministic=True runs on backend=None or 'ampere'"
            )
        reason = None if _runs_on("hopper", capability) else (
            f"requires an sm90 GPU, this is {_sm(capability)}"
        )
        if reason is None:
            reason = _compiled_for("hopper", headdim, dtype, backward=True)
        if reason is not None:
            raise ValueError(f"backend='hopper': {reason}")
        return ext.BACKEND_HOPPER
    if requested is None and capability < _MIN_CAPABILITY["ampere"]:
        return choose_backend(None, capability, headdim=headdim, dtype=dtype)  # raises
    if (
        requested is None
        and not deterministic
        and _runs_on("hopper", capability)
        and str(ext.default_backend(capability)) == "hopper"
        and _compiled_for("hopper", headdim, dtype, backward=True) is None
        and (
            _exact("hopper", headdim, backward=True)
            or not _exact("ampere", headdim, backward=True)
            or _compiled_for("ampere", headdim, dtype, backward=True) is not None
        )
    ):
        return ext.BACKEND_HOPPER
    return choose_backend("ampere", capability, headdim=headdim, dtype=dtype)
