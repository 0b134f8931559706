"""The package version, written once: ``[project] version`` in pyproject.toml."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

_PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def package_version() -> str:
    """The installed distribution's version; for a source tree on ``sys.path`` without an
    install, its pyproject.toml's; ``"0+unknown"`` when neither can be read."""
    try:
        return metadata.version("flashcute")
    except metadata.PackageNotFoundError:
        pass
    try:
        text = _PYPROJECT.read_text(encoding="utf-8")
    except OSError:
        return "0+unknown"
    match = re.search(r'^version\s*=\s*"([^"]+)"', text, re.MULTILINE)
    return match.group(1) if match else "0+unknown"
