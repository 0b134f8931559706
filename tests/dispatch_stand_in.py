"""A stand-in extension whose dispatch runs the library's policy (``_C._choose_kernel_in``) on a
build described by the test, so dispatch tests do not depend on the compiled head dims."""

from __future__ import annotations

import types
from typing import Any


def stand_in_extension(built: dict[Any, Any], dtypes: list[str]) -> types.SimpleNamespace:
    """``built`` maps (path, backward) to head dims and, optionally, "pairs" to the Hopper
    path's [d, dv] forward pairs; it is read on every call, so tests may change it."""
    from flashcute import _C

    def catalogue() -> dict[str, Any]:
        return {
            path: {
                "head_dims": list(built[(path, False)]),
                "backward_head_dims": list(built[(path, True)]),
                "dtypes": list(dtypes) if built[(path, False)] else [],
                "pairs": [list(p) for p in built.get("pairs", [])] if path == "hopper" else [],
            }
            for path in ("ampere", "hopper")
        }

    return types.SimpleNamespace(
        BACKEND_AUTO=_C.BACKEND_AUTO, BACKEND_AMPERE=_C.BACKEND_AMPERE,
        BACKEND_HOPPER=_C.BACKEND_HOPPER,
        choose_kernel=lambda *args: _C._choose_kernel_in(catalogue(), *args),
        default_backend=lambda capability: "hopper" if capability == 90 and built[("hopper", False)] else "ampere",
    )
