"""Provides the node_exporter textfile of `decodetop check`: the checks' exposition written atomically to a `.prom`
file that node_exporter's textfile collector reads."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from decodetop.atomic import write_text_atomic
from decodetop.collectors.checks.result import CheckResult
from decodetop.errors import UserInputError
from decodetop.export.prometheus.rendering import render_exposition
from decodetop.export.prometheus.state import ExportState


def textfile_path(path: str | Path) -> Path:
    """`path` as a textfile target, checked before any work: a `.prom` name that is not a directory."""
    target = Path(path)
    if target.suffix != ".prom":
        raise UserInputError(
            f"--prometheus-textfile {target}: must end in .prom (node_exporter's textfile collector reads only *.prom)"
        )
    if target.is_dir():
        raise UserInputError(f"--prometheus-textfile {target}: is a directory")
    return target


def write_check_textfile(path: str | Path, results: Sequence[CheckResult], *, now_unix_s: float | None = None) -> Path:
    """Write the checks for node_exporter's textfile collector, atomically (`decodetop.atomic`).

    node_exporter reads only `*.prom` files in its `--collector.textfile.directory`, so another suffix is refused.
    """
    target = textfile_path(path)
    state = ExportState(checks=tuple(results), checks_unix_s=time.time() if now_unix_s is None else now_unix_s)
    text = render_exposition(state, parts=("checks",))
    try:
        write_text_atomic(target, text)
    except OSError as exc:
        raise UserInputError(f"--prometheus-textfile {target}: cannot write ({exc.strerror or exc})") from None
    return target
