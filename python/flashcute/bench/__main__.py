"""``python -m flashcute.bench``: run the benchmark and exit with its status."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
