"""decodetop: where a multi-GPU LLM decode step's time goes, and whether the host is set up right."""

from __future__ import annotations

__version__ = "0.1.0"
