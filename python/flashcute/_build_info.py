"""Access to the compiled extension ``flashcute._C`` and to what it was built with."""

from __future__ import annotations

import copy
import functools
import importlib
from types import ModuleType
from typing import Any

BACKEND_NAMES = ("ampere", "hopper")

_extension: ModuleType | None = None  # set by the first successful load_extension()


def load_extension() -> ModuleType:
    """Import and return ``flashcute._C``.

    Raises:
        ImportError: the extension is not built or fails to load; the message says how to
            reinstall. The pure-Python parts of the package (``flashcute.reference``) keep
            working without it.
    """
    global _extension
    if _extension is not None:
        return _extension
    try:
        _extension = importlib.import_module("._C", __package__)
    except ImportError as exc:
        raise ImportError(
            "flashcute: the compiled extension flashcute._C is missing or failed to load "
            f"({exc}); reinstall the package with `pip install .` from the source tree"
        ) from exc
    return _extension


def extension_with(feature: str, *names: str) -> ModuleType:
    """``flashcute._C``, refusing a build whose binding lacks any of ``names``.

    Raises:
        ImportError: the extension is missing, or predates ``feature`` (named in the message).
    """
    ext = load_extension()
    if not all(hasattr(ext, name) for name in names):
        raise ImportError(
            f"flashcute: this build of flashcute._C has no {feature}; reinstall the package "
            "with `pip install .`"
        )
    return ext


def _split(value: str) -> list[str]:
    return [item.strip() for item in value.split(";") if item.strip()]


def _head_dims(value: str, key: str) -> list[int]:
    try:
        return sorted(int(item) for item in _split(value))
    except ValueError as exc:
        raise RuntimeError(f"flashcute._C.build_info(): malformed {key} {value!r}") from exc


def _head_dim_pairs(value: str, key: str) -> list[list[int]]:
    """``"192,128;..."`` as sorted [head dim, v head dim] pairs."""
    try:
        pairs = [[int(d) for d in item.split(",")] for item in _split(value)]
    except ValueError as exc:
        raise RuntimeError(f"flashcute._C.build_info(): malformed {key} {value!r}") from exc
    if any(len(pair) != 2 for pair in pairs):
        raise RuntimeError(f"flashcute._C.build_info(): malformed {key} {value!r}")
    return sorted(pairs)


@functools.lru_cache(maxsize=1)
def _cached_build_info() -> dict[str, Any]:
    raw = load_extension().build_info()
    return {
        "version": str(raw["version"]),
        "cuda_archs": _split(raw["cuda_archs"]),
        "cuda_runtime_version": int(raw["cuda_runtime_version"]),
        "backends": {
            name: {
                "head_dims": _head_dims(raw[f"{name}_head_dims"], f"{name}_head_dims"),
                "backward_head_dims": _head_dims(
                    raw.get(f"{name}_backward_head_dims", raw[f"{name}_head_dims"]),
                    f"{name}_backward_head_dims",
                ),
                "dtypes": _split(raw[f"{name}_dtypes"]),
                # (head dim, v head dim) pairs with forward kernels whose v head dim differs
                "head_dim_pairs": _head_dim_pairs(
                    raw.get(f"{name}_dv_pairs", ""), f"{name}_dv_pairs"
                ),
                # FP8 (float8_e4m3fn) forward kernels
                "fp8_head_dims": _head_dims(
                    raw.get(f"{name}_fp8_head_dims", ""), f"{name}_fp8_head_dims"
                ),
                # forward head dims with sm90 code (an sm90 GPU runs the others rounded up)
                "sm90_head_dims": [
                    d for d in _head_dims(raw[f"{name}_head_dims"], f"{name}_head_dims")
                    if d not in _head_dims(raw.get(f"{name}_sm80_only", ""), f"{name}_sm80_only")
                ],
            }
            for name in BACKEND_NAMES
        },
    }


def build_info() -> dict[str, Any]:
    """Describe what this build of the compiled library contains.

    Returns:
        A new dict with keys ``"version"`` (str), ``"cuda_archs"`` (list of str such as
        ``["80", "90a"]``), ``"cuda_runtime_version"`` (int, the CUDART_VERSION built
        against) and ``"backends"``: ``{"ampere": {"head_dims": [...], "backward_head_dims": [...],
        "dtypes": [...], "head_dim_pairs": [...], "fp8_head_dims": [...]}, "hopper": {...}}``. A
        backend that was not built has empty lists. These are the compiled head dims: a call of any multiple of 8
        up to 256 runs on the smallest one at least as large; one without a Hopper-path
        backward kernel that large differentiates on the Ampere path. ``head_dim_pairs`` lists
        the forward kernels whose v head dim differs from q's and k's, as ``[head dim, v head
        dim]``: a call whose v head dim differs runs forward on the smallest pair at least as
        large in both, and backward on the Hopper-path backward kernel at least as large as
        both head dims. ``fp8_head_dims`` lists the FP8 (float8_e4m3fn) forward kernels (Hopper
        path only). ``sm90_head_dims`` lists the head dims an sm90 GPU runs exactly: the Ampere
        path compiles the others as sm80 code only (``FLASHCUTE_AMPERE_SM90_HEAD_DIMS``).

    Raises:
        ImportError: the compiled extension is missing.
    """
    return copy.deepcopy(_cached_build_info())


def head_dim_pairs(backend: str) -> list[list[int]]:
    """[head dim, v head dim] pairs of ``backend``'s forward kernels with a v head dim of their
    own."""
    return _cached_build_info()["backends"][backend]["head_dim_pairs"]


def backend_support(backend: str, *, backward: bool = False) -> tuple[list[int], list[str]]:
    """(head dims, dtypes) compiled for ``backend`` ("ampere" or "hopper"), of its forward
    kernels or, with ``backward=True``, of its backward kernels."""
    info = _cached_build_info()["backends"][backend]
    return info["backward_head_dims" if backward else "head_dims"], info["dtypes"]
