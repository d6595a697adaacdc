"""History: appended atomically, read back with ages, a corrupt file set aside and never truncated."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from decodetop.history import KIND_BASELINE, KIND_PROBE, History, HistoryEntry, default_history_path, format_age


def _clock() -> float:
    return 1_800_000_000.0


def test_default_path_follows_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DECODETOP_STATE_DIR", str(tmp_path))
    assert default_history_path() == tmp_path / "history.jsonl"


def test_append_and_reload(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    history = History(path, clock=_clock)
    assert history.load().entries == ()
    history.record(KIND_PROBE, "allreduce", {"median_us": 41.5}, recorded_at_s=100.0)
    history.record(KIND_PROBE, "allreduce", {"median_us": 40.0}, recorded_at_s=200.0)
    history.record(KIND_BASELINE, "default", {"checks": {}})
    again = History(path, clock=_clock)
    loaded = again.load()
    assert loaded.problem is None
    assert [e.key for e in loaded.entries] == ["allreduce", "allreduce", "default"]
    latest = again.latest(KIND_PROBE)
    assert latest["allreduce"].payload == {"median_us": 40.0}
    assert latest["allreduce"].age_s(260.0) == 60.0
    assert again.latest(KIND_BASELINE)["default"].recorded_at_s == _clock()


def test_corrupt_file_is_set_aside_not_truncated(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    good = HistoryEntry(KIND_PROBE, "gemm", 5.0, {"gbps": 3000.0}).to_json()
    original = f"{good}\n{{not json\n[1,2]\n"
    path.write_text(original)
    history = History(path, clock=_clock)
    loaded = history.load()
    assert loaded.problem is not None
    assert "corrupt history" in loaded.problem
    assert "2 bad lines" in loaded.problem
    assert "line 2" in loaded.problem
    assert loaded.set_aside_path is not None
    assert loaded.set_aside_path.read_text() == original  # every byte kept
    assert [e.key for e in loaded.entries] == ["gemm"]
    assert path.read_text() == good + "\n"  # the good entries carried over
    history.record(KIND_PROBE, "launch", {"us": 3.0})
    assert len(History(path).load().entries) == 2


def test_not_utf8_is_set_aside(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    path.write_bytes(b"\xff\xff\n")
    loaded = History(path, clock=_clock).load()
    assert loaded.problem is not None and "not UTF-8" in loaded.problem
    assert loaded.set_aside_path is not None and loaded.set_aside_path.read_bytes() == b"\xff\xff\n"


def test_two_corrupt_loads_do_not_overwrite_each_other(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    path.write_text("garbage 1\n")
    first = History(path, clock=_clock).load().set_aside_path
    path.write_text("garbage 2\n")
    second = History(path, clock=_clock).load().set_aside_path
    assert first is not None and second is not None and first != second
    assert first.read_text() == "garbage 1\n"
    assert second.read_text() == "garbage 2\n"


@pytest.mark.parametrize(
    "line",
    ['{"kind":"probe","key":"x"}', '{"kind":"","key":"x","at":1}', '{"kind":"p","key":"x","at":1,"data":[]}', "3"],
)
def test_entry_validation(line: str) -> None:
    with pytest.raises(ValueError):
        HistoryEntry.from_json(line)


def test_non_json_payload_is_refused_before_writing(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    history = History(path)
    history.record(KIND_PROBE, "a", {"x": 1})
    with pytest.raises(ValueError):
        history.record(KIND_PROBE, "b", {"x": float("nan")})
    assert len(History(path).load().entries) == 1


def test_rewrite_keeps_the_newest(tmp_path: Path) -> None:
    history = History(tmp_path / "h.jsonl", max_entries=3)
    for i in range(5):
        history.record(KIND_PROBE, f"p{i}", {}, recorded_at_s=float(i))
    assert [e.key for e in History(tmp_path / "h.jsonl").load().entries] == ["p2", "p3", "p4"]


def test_concurrent_appends_lose_nothing(tmp_path: Path) -> None:
    history = History(tmp_path / "h.jsonl")
    history.load()

    def writer(n: int) -> None:
        for i in range(10):
            history.record(KIND_PROBE, f"w{n}-{i}", {})

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(History(tmp_path / "h.jsonl").load().entries) == 40


@pytest.mark.parametrize(("age", "text"), [(0.2, "now"), (42, "42s"), (300, "5m"), (7200, "2h"), (200000, "2d")])
def test_format_age(age: float, text: str) -> None:
    assert format_age(age) == text


def test_rewrite_keeps_the_newest_that_fit_in_the_byte_cap(tmp_path: Path) -> None:
    history = History(tmp_path / "h.jsonl", max_bytes=500)
    for i in range(10):
        history.record(KIND_PROBE, f"p{i}", {"pad": "x" * 100}, recorded_at_s=float(i))
    keys = [e.key for e in History(tmp_path / "h.jsonl").load().entries]
    assert keys == ["p7", "p8", "p9"]
    assert (tmp_path / "h.jsonl").stat().st_size <= 500


@pytest.mark.parametrize(("age", "text"), [(3, "now"), (19, "10s"), (59.9, "50s"), (61, "1m"), (7200, "2h")])
def test_format_age_coarse(age: float, text: str) -> None:
    from decodetop.history import format_age_coarse

    assert format_age_coarse(age) == text
