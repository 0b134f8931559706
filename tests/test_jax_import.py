"""The import behaviour of flashcute.jax, with or without jax: ``import flashcute`` never imports
jax, and ``import flashcute.jax`` without jax says what to install."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _run(script: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True,
                          text=True, timeout=120)


def test_import_flashcute_does_not_import_jax() -> None:
    result = _run("""
        import sys
        import flashcute
        assert "jax" not in sys.modules, "import flashcute imported jax"
        print("ok")
    """)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr


def test_flashcute_jax_without_jax_raises_import_error() -> None:
    result = _run("""
        import sys
        sys.modules["jax"] = None  # as if jax were not installed
        try:
            import flashcute.jax
        except ImportError as exc:
            print("ImportError:", exc)
        else:
            raise SystemExit("no ImportError")
    """)
    assert result.returncode == 0, result.stderr
    assert "flashcute.jax needs jax" in result.stdout
    assert "pip install" in result.stdout
