"""Baselines: atomic save, load, diff; a corrupt baseline is a clear error and is never overwritten."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from decodetop.collectors import baseline as bl
from decodetop.collectors.checks.result import CheckResult, Status
from decodetop.errors import UserInputError


def _results(governor: str = "performance", status: Status = Status.PASS) -> list[CheckResult]:
    return [
        CheckResult("C4", "CPU governor", status, f"governor {governor}", "performance", facts={"governor": governor}),
        CheckResult("C14", "Kernel", Status.PASS, "kernel 6.8", "", facts={"kernel": "6.8.0-49-generic"}),
    ]


def test_save_load_roundtrip(tmp_path: Path) -> None:
    path = bl.save_baseline(_results(), "good", directory=tmp_path, now_unix_s=1000.0, root="/")
    assert path == tmp_path / "good.json"
    loaded = bl.load_baseline("good", directory=tmp_path)
    assert loaded is not None and loaded.saved_at_unix_s == 1000.0
    assert loaded.by_id()["C4"].facts == {"governor": "performance"}
    assert bl.list_baselines(tmp_path) == ["good"]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # atomic write left no temp file


def test_diff_lists_status_fact_new_and_gone(tmp_path: Path) -> None:
    bl.save_baseline(_results(), directory=tmp_path)
    baseline = bl.load_baseline(directory=tmp_path)
    assert baseline is not None
    now = [*_results("schedutil", Status.WARN)[:1], CheckResult("N12", "majors", Status.FAIL, "stale", "")]
    changes = {(c.check_id, c.what): (c.before, c.after) for c in bl.diff_baseline(baseline, now)}
    assert changes[("C4", "status")] == ("pass", "warn")
    assert changes[("C4", "governor")] == ("performance", "schedutil")
    assert ("N12", "new check") in changes and ("C14", "check gone") in changes
    assert bl.diff_baseline(baseline, _results()) == []


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("{not json", "not valid JSON"),
        ("[]", "not a JSON object"),
        ('{"format": 99, "results": []}', "format 99"),
        ('{"format": 1, "results": [{"status": "pass"}]}', r"results\[0\]"),
        ('{"format": 1, "results": [{"check_id": "C1", "status": "great"}]}', r"results\[0\]"),
    ],
)
def test_corrupt_baseline_is_an_error_and_kept(tmp_path: Path, content: str, problem: str) -> None:
    path = tmp_path / "default.json"
    path.write_text(content)
    with pytest.raises(UserInputError, match=problem) as info:
        bl.load_baseline(directory=tmp_path)
    assert str(path) in str(info.value) and "left untouched" in str(info.value)
    with pytest.raises(UserInputError):
        bl.save_baseline(_results(), directory=tmp_path)
    assert path.read_text() == content


def test_bad_names_and_missing(tmp_path: Path) -> None:
    for name in ("../x", ".hidden", "a b", ""):
        with pytest.raises(UserInputError, match="baseline name"):
            bl.baseline_path(name, tmp_path)
    assert bl.load_baseline("nothing", directory=tmp_path) is None


def test_saved_file_is_plain_json(tmp_path: Path) -> None:
    path = bl.save_baseline(_results(), "x", directory=tmp_path)
    document = json.loads(path.read_text())
    assert document["format"] == 1 and document["results"][0]["status"] == "pass"
