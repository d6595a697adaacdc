"""Provides health-check baselines: save the results and facts of a known-good run, load them back, and list what
changed since (`decodetop check --save-baseline` / `--baseline`).

Baselines live under `decodetop.paths.state_dir()/baselines/NAME.json`, written atomically. A corrupt baseline is
reported with one clear line and never overwritten: the user decides what to do with it. A baseline that is a
symbolic link is neither read nor written through (a state file, as the history).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from decodetop import jsonio
from decodetop.atomic import write_text_atomic
from decodetop.collectors.checks.result import CheckResult, Status
from decodetop.errors import UserInputError
from decodetop.paths import state_dir
from decodetop.quantity import UNIX_TIME_S

BASELINE_FORMAT = 1
DEFAULT_BASELINE = "default"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def baseline_dir() -> Path:
    """Where baselines are kept."""
    return state_dir() / "baselines"


def baseline_path(name: str, directory: Path | None = None) -> Path:
    """The file for baseline `name`; a name with slashes, spaces or a leading dot is refused."""
    if not _NAME_RE.match(name):
        raise UserInputError(
            f"baseline name {name!r}: use letters, digits, '.', '_' or '-' (up to 64, not starting with '.')"
        )
    return (directory if directory is not None else baseline_dir()) / f"{name}.json"


@dataclass(frozen=True)
class StoredResult:
    """One check result as a baseline keeps it."""

    check_id: str
    title: str
    status: str
    observed: str
    expected: str
    subject: str
    facts: dict[str, str]


@dataclass(frozen=True)
class Baseline:
    """A saved run: when, where from, and every result with its facts."""

    name: str
    saved_at_unix_s: float
    root: str
    results: tuple[StoredResult, ...]

    def by_id(self) -> dict[str, StoredResult]:
        """Results keyed by check id."""
        return {r.check_id: r for r in self.results}


@dataclass(frozen=True)
class Change:
    """One difference between a baseline and now."""

    check_id: str
    title: str
    what: str
    """'status', a fact name, 'new check' or 'check gone'."""
    before: str
    after: str

    def describe(self) -> str:
        """'C4 governor: performance → schedutil'."""
        return f"{self.check_id} {self.what}: {self.before} → {self.after}"


def results_to_json(results: list[CheckResult]) -> list[dict[str, Any]]:
    """Plain JSON for a list of results (also what `decodetop check --json` prints)."""
    out = []
    for r in results:
        item = asdict(r)
        item["status"] = r.status.value
        out.append(item)
    return out


def save_baseline(
    results: list[CheckResult],
    name: str = DEFAULT_BASELINE,
    *,
    root: str = "/",
    directory: Path | None = None,
    now_unix_s: float | None = None,
) -> Path:
    """Write baseline `name` atomically and return its path. Refuses to replace a corrupt file."""
    path = baseline_path(name, directory)
    if path.exists():
        load_baseline(name, directory=directory)  # raises on a corrupt file, which then stays as it is
    document = {
        "format": BASELINE_FORMAT,
        "name": name,
        "saved_at_unix_s": time.time() if now_unix_s is None else now_unix_s,
        "root": root,
        "results": [
            {
                "check_id": r.check_id,
                "title": r.title,
                "status": r.status.value,
                "observed": r.observed,
                "expected": r.expected,
                "subject": r.subject,
                "facts": dict(r.facts),
            }
            for r in results
        ],
    }
    write_text_atomic(path, json.dumps(document, indent=1, ensure_ascii=False) + "\n", follow_links=False)
    return path


def _corrupt(path: Path, problem: str) -> UserInputError:
    return UserInputError(f"baseline {path}: {problem} (left untouched; move it away or save under another name)")


def load_baseline(name: str = DEFAULT_BASELINE, *, directory: Path | None = None) -> Baseline | None:
    """Baseline `name`, or None when it was never saved. A corrupt file raises UserInputError naming it."""
    path = baseline_path(name, directory)
    if not path.exists() and not path.is_symlink():
        return None
    try:
        # a FIFO, a device or a symbolic link in its place is refused unread (a state file: never followed)
        text = jsonio.read_bounded(path, follow_links=False).decode("utf-8")
    except (UserInputError, UnicodeDecodeError) as exc:
        raise _corrupt(path, f"unreadable: {str(exc).removeprefix(f'{path}: ')}") from None
    try:
        document = jsonio.loads(text, source=str(path))
    except json.JSONDecodeError as exc:
        raise _corrupt(path, f"not valid JSON ({exc.msg} at line {exc.lineno})") from exc
    except jsonio.JsonInputError as exc:  # nesting, huge numbers, NaN
        raise _corrupt(path, exc.problem) from None
    if not isinstance(document, dict):
        raise _corrupt(path, "not a JSON object")
    if document.get("format") != BASELINE_FORMAT:
        raise _corrupt(path, f"format {document.get('format')!r}, expected {BASELINE_FORMAT}")
    raw_results = document.get("results")
    if not isinstance(raw_results, list):
        raise _corrupt(path, "'results' is not a list")
    results = tuple(_stored_result(path, i, item) for i, item in enumerate(raw_results))
    saved = document.get("saved_at_unix_s", 0.0)
    if isinstance(saved, bool) or not isinstance(saved, (int, float)) or not UNIX_TIME_S.accepts(float(saved)):
        raise _corrupt(path, f"'saved_at_unix_s' is not a number {UNIX_TIME_S.range_text}")
    return Baseline(str(document.get("name", name)), float(saved), str(document.get("root", "/")), results)


def _stored_result(path: Path, i: int, item: object) -> StoredResult:
    """The baseline file's `results[i]`, checked; a malformed one raises UserInputError naming the file and the
    index."""
    if not isinstance(item, dict):
        raise _corrupt(path, f"results[{i}] is not an object")
    try:
        status = str(item["status"])
        Status(status)
        facts = item.get("facts", {})
        if not isinstance(facts, dict):
            raise ValueError("facts is not an object")
        return StoredResult(
            check_id=str(item["check_id"]),
            title=str(item.get("title", "")),
            status=status,
            observed=str(item.get("observed", "")),
            expected=str(item.get("expected", "")),
            subject=str(item.get("subject", "")),
            facts={str(k): str(v) for k, v in facts.items()},
        )
    except KeyError as exc:
        raise _corrupt(path, f"results[{i}]: missing {exc}") from exc
    except ValueError as exc:
        raise _corrupt(path, f"results[{i}]: {exc}") from exc


def list_baselines(directory: Path | None = None) -> list[str]:
    """Names of the saved baselines."""
    folder = directory if directory is not None else baseline_dir()
    return sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []


def diff_baseline(baseline: Baseline, results: list[CheckResult]) -> list[Change]:
    """What changed since `baseline`: status changes, fact changes, checks that appeared or went away.

    Observed text is not compared (it can hold sampled counts); facts are the stable values meant for this.
    """
    before = baseline.by_id()
    changes: list[Change] = []
    seen: set[str] = set()
    for r in results:
        seen.add(r.check_id)
        old = before.get(r.check_id)
        if old is None:
            changes.append(Change(r.check_id, r.title, "new check", "-", f"{r.status.value}: {r.observed}"))
            continue
        if old.status != r.status.value:
            changes.append(Change(r.check_id, r.title, "status", old.status, r.status.value))
        for key in sorted(set(old.facts) | set(r.facts)):
            a, b = old.facts.get(key, "-"), r.facts.get(key, "-")
            if a != b:
                changes.append(Change(r.check_id, r.title, key, a, b))
    for old in baseline.results:
        if old.check_id not in seen:
            changes.append(Change(old.check_id, old.title, "check gone", f"{old.status}: {old.observed}", "-"))
    return changes
