"""StoredResults writes the baseline (`s`) to the history and says why where it cannot; nothing else in the app
touches the history file."""

from __future__ import annotations

from pathlib import Path

from decodetop.history import KIND_BASELINE, History
from decodetop.tui.baseline import BASELINE_NAME
from decodetop.tui.stored_results import StoredResults


def test_the_baseline_is_written_to_the_history_or_the_message_says_why(tmp_path: Path) -> None:
    history = History(tmp_path / "history.jsonl")
    saved = StoredResults(history, lambda fp, settings: True).save_baseline({"checks": [], "probes": {}}, 1000.0)
    assert saved.entry is not None and saved.problem == ""
    assert saved.entry.recorded_at_s == 1000.0
    assert history.latest(KIND_BASELINE)[BASELINE_NAME].payload == {"checks": [], "probes": {}}
    none = StoredResults(None, lambda fp, settings: True).save_baseline({}, 1000.0)
    assert none.entry is None and none.problem == "no history file in this session"
    (tmp_path / "blocked").write_text("a file where the history's directory should be")
    blocked = StoredResults(History(tmp_path / "blocked" / "history.jsonl"), lambda fp, settings: True)
    failed = blocked.save_baseline({}, 1000.0)
    assert failed.entry is None and failed.problem.startswith("baseline not saved: ")
