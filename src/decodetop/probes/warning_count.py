"""Provides `WarningCount`: the Python warnings a probe rank showed, counted for its controller (stdlib only).

Installed by the rank's torch-free entry (`decodetop.probes.rankmain`) and read by the torch-side rank loop
(`decodetop.probes.worker`), so neither imports the other for it.
"""

from __future__ import annotations

import warnings
from typing import TextIO


class WarningCount:
    """Python warnings shown in this process since the last `take()` (they still go to stderr: the rank log)."""

    _count = 0

    @classmethod
    def install(cls) -> None:
        shown = warnings.showwarning

        def count_and_show(  # noqa: PLR0917 - the signature of warnings.showwarning
            message: Warning | str,
            category: type[Warning],
            filename: str,
            lineno: int,
            file: TextIO | None = None,
            line: str | None = None,
        ) -> None:
            cls._count += 1
            shown(message, category, filename, lineno, file, line)

        warnings.showwarning = count_and_show

    @classmethod
    def take(cls) -> int:
        """The count since the last call (the rank reports it with Ready and each RankDone)."""
        count, cls._count = cls._count, 0
        return count
