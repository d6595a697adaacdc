"""Provides `python -m decodetop`."""

from __future__ import annotations

import sys

from decodetop.cli import main

if __name__ == "__main__":
    sys.exit(main())
