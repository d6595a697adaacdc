"""Provides `decodetop check`: host and GPU health checks as a table or JSON, with baselines and a review tarball.

Exit codes follow the monitoring-plugin convention (`checks.result.exit_code`): 0 ok, 1 warning, 2 critical,
3 unknown. Module level imports nothing heavy; the work is imported inside `run`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from decodetop.argtypes import file_or_directory, output_file
from decodetop.errors import DecodetopError, UserInputError
from decodetop.textfmt import table, terminal_width

if TYPE_CHECKING:
    from decodetop.collectors.baseline import Baseline, Change
    from decodetop.collectors.checks.result import CheckResult
    from decodetop.collectors.hostroot import HostRoot

_PIPE_WIDTH = 160
"""Width of the table when stdout is not a terminal and COLUMNS is unset: the widths the table had before it
followed the terminal (observed cells wrapped at 60, expected at 40)."""
_TEXT_WIDTH = 100


def _root_argument(text: str) -> str:
    """`--root`: an existing directory or regular file (a FIFO or a device is refused before it is opened)."""
    return str(file_or_directory(text))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register this command's flags."""
    parser.add_argument("--json", action="store_true", help="print results, context and changes as JSON")
    parser.add_argument("--verbose", "-v", action="store_true", help="add why each check matters and how to fix it")
    parser.add_argument(
        "--root",
        metavar="DIR",
        type=_root_argument,
        help="check a copied host tree (a directory, or a --collect tarball) instead of this host",
    )
    parser.add_argument(
        "--collect",
        metavar="FILE",
        type=output_file,
        help="also write the files the checks read to FILE (.tar.gz) for review; --root on it gives the same findings",
    )
    parser.add_argument(
        "--save-baseline",
        nargs="?",
        const="default",
        metavar="NAME",
        help="save these results as baseline NAME (default: 'default')",
    )
    parser.add_argument(
        "--baseline",
        metavar="NAME",
        help="list what changed since baseline NAME (default: the 'default' baseline when it exists)",
    )
    parser.add_argument(
        "--sample-interval",
        type=float,
        default=None,
        metavar="SECONDS",
        help="time between the two cpuidle usage samples of C8 (default 0.25)",
    )
    parser.add_argument(
        "--under-load",
        action="store_true",
        help="the GPUs are serving now: judge PCIe link speed and throttle reasons as under load",
    )
    parser.add_argument(
        "--lxc-config-dir",
        action="append",
        metavar="DIR",
        help="container config folder to compare with live NVIDIA majors (default /etc/pve/lxc and /var/lib/lxc)",
    )
    parser.add_argument(
        "--prometheus-textfile",
        metavar="PATH",
        help="also write the results for node_exporter's textfile collector to PATH (*.prom, written atomically)",
    )


UNKNOWN_EXIT = 3
"""Monitoring-plugin UNKNOWN (https://nagios-plugins.org/doc/guidelines.html#AEN78): what a crash inside `check`
exits with, so a bug never reads as a finding's warning (1) or critical (2)."""


def run(args: argparse.Namespace) -> int:
    """Run the checks, print them, handle baselines and --collect; return the exit code.

    Bad input (a flag, a crafted --root archive) exits 2 with one line; anything unexpected exits 3 (UNKNOWN).
    """
    try:
        return _run(args)
    except (DecodetopError, BrokenPipeError):
        raise
    except Exception as exc:  # the monitoring contract: a crash is UNKNOWN, said in one line
        print(f"decodetop check: UNKNOWN: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return UNKNOWN_EXIT


@dataclass(frozen=True)
class _Baselines:
    """The baseline to compare with, and why one was not compared or will not be saved (notes for stderr)."""

    name: str
    loaded: Baseline | None
    compare_note: str
    save_note: str


def _baselines(args: argparse.Namespace) -> _Baselines:
    """Load the baseline before any work. An unreadable one is noted, never fatal: the exit code stays the findings'.

    A missing `--baseline NAME` is a mistyped argument (exit 2). An unreadable `--save-baseline` target is left as
    it is and not overwritten.
    """
    from decodetop.collectors import baseline as bl

    explicit = args.baseline is not None
    name = args.baseline if explicit else bl.DEFAULT_BASELINE
    bl.baseline_path(name)  # a malformed name is an argument error
    loaded: Baseline | None = None
    compare_note = ""
    compare_error: Exception | None = None
    if explicit or not args.root:
        try:
            loaded = bl.load_baseline(name)
        except Exception as exc:  # any unreadable file only costs the comparison
            compare_error = exc
            compare_note = f"baseline not compared: {exc}"
        if explicit and loaded is None and compare_error is None:
            saved = ", ".join(bl.list_baselines()) or "none"
            raise UserInputError(f"--baseline {name}: no such baseline (saved: {saved})")
    save_note = ""
    if args.save_baseline:
        bl.baseline_path(args.save_baseline)  # validate the name early
        error = compare_error if args.save_baseline == name else None
        if args.save_baseline != name or not (explicit or not args.root):
            try:
                bl.load_baseline(args.save_baseline)
            except Exception as exc:
                error = exc
        if error is not None:
            save_note = f"baseline not saved: {error}"
    return _Baselines(name, loaded, compare_note, save_note)


def _root_path(args: argparse.Namespace) -> Path:
    """The directory `--root` names (the unpacked decodetop-collect/ folder counts), refusing one that is `/`."""
    root_path = Path(args.root)
    if (root_path / "findings.json").is_file() and (root_path / "root").is_dir():
        root_path = root_path / "root"  # the unpacked decodetop-collect/ folder itself
    if root_path.is_dir() and root_path.resolve() == Path("/"):
        raise UserInputError(f"--root {args.root}: resolves to / (this host); run without --root to check this host")
    return root_path


@dataclass(frozen=True)
class _Plan:
    """The checked flags: what to read, how, and what to write afterwards."""

    interval_s: float
    lxc_dirs: tuple[str, ...] | None
    textfile: str | None


def _plan(args: argparse.Namespace) -> _Plan:
    """Check every flag before any work, so a bad one fails at once (exit 2)."""
    from decodetop.collectors.checks.context import DEFAULT_SAMPLE_INTERVAL_S

    interval = DEFAULT_SAMPLE_INTERVAL_S if args.sample_interval is None else args.sample_interval
    if not 0 <= interval <= 60:
        raise UserInputError(f"--sample-interval {interval}: give 0 to 60 seconds")
    if args.root and args.collect:
        raise UserInputError("--collect records this host; it cannot be combined with --root")
    if args.collect and Path(args.collect).is_dir():
        raise UserInputError(f"--collect {args.collect}: is a directory, give a file name ending in .tar.gz")
    textfile = args.prometheus_textfile
    if textfile:
        from decodetop.export.prometheus import textfile_path

        textfile = str(textfile_path(textfile))  # a bad name fails before any work
    return _Plan(interval, tuple(args.lxc_config_dir) if args.lxc_config_dir else None, textfile or None)


def _open_root(args: argparse.Namespace, stack: contextlib.ExitStack) -> HostRoot:
    """The root the checks read: a copied tree (a directory or an unpacked archive), a recording root, or this host."""
    from decodetop.collectors.archive import RecordingRoot, unpacked
    from decodetop.collectors.hostroot import HostReadError, HostRoot

    if not args.root:
        return RecordingRoot() if args.collect else HostRoot()
    root_path = _root_path(args)
    if root_path.is_file():
        root_path = stack.enter_context(unpacked(root_path))
    try:
        return HostRoot(root_path)
    except HostReadError as exc:
        raise UserInputError(f"--root {args.root}: {exc}") from exc


def _run(args: argparse.Namespace) -> int:
    from decodetop.collectors import baseline as bl
    from decodetop.collectors.checks.host import run_all_checks
    from decodetop.collectors.checks.result import exit_code, sort_for_display
    from decodetop.collectors.pci import find_gpus

    plan = _plan(args)
    base = _baselines(args)  # before any work, so nothing stored is overwritten after a failed read
    with contextlib.ExitStack() as stack:
        root = _open_root(args, stack)
        busy = {gpu.bdf: True for gpu in find_gpus(root)} if args.under_load else None
        results = run_all_checks(root, sample_interval_s=plan.interval_s, gpu_busy=busy, lxc_config_paths=plan.lxc_dirs)

    ordered = sort_for_display(results)
    changes = bl.diff_baseline(base.loaded, results) if base.loaded is not None else []
    code = exit_code(results)
    try:
        _print(args, ordered=ordered, results=results, code=code, base=base, changes=changes)
    except BrokenPipeError:  # `decodetop check | head`: the reader left; still collect/save and exit with the code
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    _write_outputs(args, root=root, results=results, code=code, base=base, plan=plan)
    return code


def _write_outputs(
    args: argparse.Namespace,
    *,
    root: HostRoot,
    results: list[CheckResult],
    code: int,
    base: _Baselines,
    plan: _Plan,
) -> None:
    """After the table: the --collect archive, the baseline, the notes, the textfile."""
    from decodetop.collectors import baseline as bl
    from decodetop.collectors.archive import RecordingRoot, write_collect_tarball
    from decodetop.collectors.checks.result import sort_for_display

    if args.collect and isinstance(root, RecordingRoot):
        findings = {"exit_code": code, "results": bl.results_to_json(sort_for_display(results))}
        count = write_collect_tarball(root, Path(args.collect), findings)
        print(
            f"collected {count} paths into {args.collect} (check it with: decodetop check --root {args.collect})",
            file=sys.stderr,
        )
    save_note = base.save_note
    if args.save_baseline and not save_note:
        try:
            path = bl.save_baseline(results, args.save_baseline, root=args.root or "/")
        except OSError as exc:  # a read-only or full state dir, a link in the way: a note, never the exit code
            save_note = f"baseline not saved: {bl.baseline_path(args.save_baseline)}: {exc.strerror or exc}"
        else:
            print(f"saved baseline {args.save_baseline!r} to {path}", file=sys.stderr)
    for note in (base.compare_note, save_note):
        if note:
            print(f"decodetop check: {note}", file=sys.stderr)
    if plan.textfile:
        from decodetop.export.prometheus import write_check_textfile

        write_check_textfile(plan.textfile, results)


def _print(
    args: argparse.Namespace,
    *,
    ordered: list[CheckResult],
    results: list[CheckResult],
    code: int,
    base: _Baselines,
    changes: list[Change],
) -> None:
    """The table (or --json document) on stdout."""
    from decodetop.collectors import baseline as bl

    if args.json:
        import json

        document: dict[str, Any] = {
            "root": args.root or "/",
            "context": next((r.observed for r in results if r.check_id == "C16"), ""),
            "exit_code": code,
            "results": bl.results_to_json(ordered),
            "baseline": base.name if base.loaded is not None else None,
            "changes": [c.__dict__ for c in changes],
        }
        if base.compare_note:
            document["baseline_note"] = base.compare_note
        print(json.dumps(document, indent=1, ensure_ascii=False))
        return
    print(f"decodetop check: {args.root if args.root else 'this host'}")
    print(render_table(ordered, verbose=args.verbose))
    print()
    print(summary_line(results, code))
    if base.loaded is not None:
        print(render_changes(base.name, changes))


def render_table(results: list[CheckResult], *, verbose: bool = False) -> str:
    """id, status, title, observed, expected, fitted to the terminal (`decodetop.textfmt.table`: long cells wrap
    onto continuation lines; the full text is in --json); --verbose adds why/fix under each row."""
    headers = ("ID", "STATUS", "TITLE", "OBSERVED", "EXPECTED")
    width = terminal_width() or _PIPE_WIDTH
    rows = [(r.check_id, r.status.value.upper(), r.title, r.observed, r.expected) for r in results]
    notes: list[list[str]] | None = None
    if verbose:
        w_id = max([len(headers[0])] + [len(r.check_id) for r in results])
        wrap_at = max(20, min(_TEXT_WIDTH, width - w_id - 2))
        notes = [
            [
                " " * (w_id + 2) + line
                for label, text in (("why", r.why), ("fix", r.fix))
                if text
                for line in textwrap.wrap(f"{label}: {text}", wrap_at)
            ]
            for r in results
        ]
    return table(headers, rows, align="lllll", width=width, row_notes=notes)


def summary_line(results: list[CheckResult], code: int) -> str:
    """'26 checks: 1 fail, 2 warn, 0 unknown, 12 info, 11 pass → exit 2 (critical)'."""
    from collections import Counter

    counts = Counter(r.status.value for r in results)
    meaning = {0: "ok", 1: "warning", 2: "critical", 3: "unknown"}[code]
    parts = ", ".join(f"{counts.get(s, 0)} {s}" for s in ("fail", "warn", "unknown", "info", "pass"))
    return f"{len(results)} checks: {parts} → exit {code} ({meaning})"


def render_changes(name: str, changes: list[Change]) -> str:
    """'Changed since baseline default:' and one line per change, or 'no change'."""
    if not changes:
        return f"No change since baseline {name!r}."
    lines = [f"Changed since baseline {name!r}:"]
    lines.extend(f"  {c.describe()}" for c in changes)
    return "\n".join(lines)
