"""The torch floor of flashcute's torch route.

torch is optional (cupy, jax and other DLPack tensors need none), so the floor is checked when
the torch route is first imported rather than declared as a dependency: the route registers
``torch.library.custom_op`` operators with fake and autograd implementations, new in torch 2.4.
"""

from __future__ import annotations

import re

TORCH_MIN = (2, 4)


def _major_minor(version: str) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match.group(1)), int(match.group(2))) if match else None


def require_torch(version: str) -> None:
    """Raise ImportError when ``version`` (``torch.__version__``) is older than 2.4.

    Pre-releases and local builds of 2.4 (``2.4.0a0+git...``) pass: they carry the API.
    An unparsable version passes too, since it cannot be shown to be too old.
    """
    found = _major_minor(str(version))
    if found is not None and found < TORCH_MIN:
        floor = ".".join(map(str, TORCH_MIN))
        raise ImportError(
            f"flashcute: torch tensors need torch>={floor} (torch.library.custom_op), "
            f"this is torch {version}; upgrade it: pip install 'torch>={floor}'"
        )
