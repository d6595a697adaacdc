"""Numbers from outside never crash a reader nor reach a figure out of range: integers of 310 to 4,300 digits (no
float holds them; `float()` raises OverflowError, which is not a ValueError), 1e308 and 1e-320 in flags, settings,
history lines, recordings, traces and budget files give one line naming the file or flag, or are skipped and
counted where a reader skips bad lines. Only public entry points are called, so each test runs on any version."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from decodetop.cli import main
from decodetop.errors import UserInputError
from decodetop.export.recording import read_recording
from decodetop.history import History
from decodetop.settings import load_settings

BIG = "9" * 400
"""An integer of 400 digits: within the JSON loader's 4,300-digit cap, beyond any float."""


def _one_line_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str], needle: str) -> str:
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2, err
    assert needle in err and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [  # main: a traceback from format_number (1e-320), an infinite target, or a 300-digit figure
        (["budget", "--model", "llama-3.1-70b", "--target-tps", "1e-320"], "--target-tps: must be a number from"),
        (["budget", "--model", "llama-3.1-70b", "--target-tps", "1e308"], "--target-tps: must be a number from"),
        (["budget", "--model", "llama-3.1-70b", "--observed-ms", "1e308"], "--observed-ms: must be a number from"),
        (["budget", "--model", "llama-3.1-70b", "--observed-ms", "1e-320"], "--observed-ms: must be a number from"),
        (["--observed-ms", "1e308"], "--observed-ms: must be a number from"),
        (["--target-tps", "1e-320"], "--target-tps: must be a number from"),
        (["--tick", "1e308"], "--tick: must be a number from"),
        (["trace", "x.json", "--timeout", "1e308"], "--timeout: must be a number from"),
        (["probe", "--timeout", "1e308"], "--timeout: must be a number from"),
    ],
)
def test_extreme_flags_are_one_line(capsys: pytest.CaptureFixture[str], argv: list[str], needle: str) -> None:
    _one_line_exit_2(capsys, argv, needle)


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        pytest.param("observed_ms = 1e308", "observed_ms must be a number from", id="observed_ms-1e308"),
        pytest.param("target_tps = 1e-320", "target_tps must be a number from", id="target_tps-1e-320"),
        pytest.param(f"tick_s = {BIG}", "tick_s must be a number from", id="tick_s-400-digits"),
        pytest.param(f"observed_ms = {BIG}", "observed_ms must be a number from", id="observed_ms-400-digits"),
        pytest.param(f"target_tps = -{BIG}", "target_tps must be a number from", id="target_tps-minus-400-digits"),
    ],
)
def test_extreme_settings_are_one_line(tmp_path: Path, line: str, needle: str) -> None:
    path = tmp_path / "settings.toml"
    path.write_text(line + "\n")
    with pytest.raises(UserInputError) as info:
        load_settings(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and needle in message and "\n" not in message and len(message) < 300


def test_a_history_line_with_a_huge_time_is_set_aside_not_raised(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    good = '{"v":1,"kind":"probe","key":"membw","at":1796000000.0,"data":{}}'
    path.write_text(good + "\n" + f'{{"v":1,"kind":"probe","key":"gemm","at":{BIG},"data":{{}}}}\n')
    history = History(path)
    loaded = history.load()  # main: OverflowError out of load(), and the UI then saved nothing all session
    assert [e.key for e in loaded.entries] == ["membw"]
    assert loaded.problem is not None and "line 2" in loaded.problem and "\n" not in loaded.problem
    history.record("probe", "launch", {})
    assert [e.key for e in History(path).load().entries] == ["membw", "launch"]


def test_a_recording_with_huge_numbers_skips_and_counts_them(tmp_path: Path) -> None:
    path = tmp_path / "rec.jsonl"
    meta = {"v": 1, "t": 1796000000.0, "kind": "meta", "type": None, "data": {"format": "decodetop-recording"}}
    path.write_text(json.dumps(meta) + "\n" + f'{{"v":1,"t":{BIG},"kind":"meta","type":null,"data":{{}}}}\n')
    replay = read_recording(path)
    assert replay.corrupt_lines == 1 and "1 corrupt line" in replay.summary


def _trace_with(tmp_path: Path, ts: str) -> Path:
    events = [
        f'{{"ph":"X","cat":"user_annotation","name":"ProfilerStep#{i}","ts":{i * 1000},"dur":900}}' for i in range(3)
    ]
    events.append(f'{{"ph":"X","cat":"kernel","name":"k","ts":{ts},"dur":{ts},"args":{{"device":0}}}}')
    path = tmp_path / "t.json"
    path.write_text('{"traceEvents":[' + ",".join(events) + "]}")
    return path


def test_a_trace_with_huge_numbers_is_read_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["trace", str(_trace_with(tmp_path, BIG))])  # main: OverflowError traceback
    out, err = capsys.readouterr()
    assert code in (0, 2) and "Traceback" not in out + err
    if code == 2:
        assert err.count("\n") == 1


def _budget(path: Path, ms: str) -> Path:
    path.write_text(
        '{"model":"m","deployment":"TP 2","complete":true,"total_ms":1.0,'
        f'"segments":[{{"component":"attention","ms":{ms},"status":"measured"}}]}}'
    )
    return path


@pytest.mark.parametrize("ms", [BIG, "1e308"], ids=["400-digits", "1e308"])
def test_budget_diff_with_huge_numbers_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], ms: str) -> None:
    old = _budget(tmp_path / "old.json", "1.0")
    new = _budget(tmp_path / "new.json", ms)
    assert main(["budget", "--diff", str(old), str(new)]) == 2  # main: traceback (BIG) or a 300-digit figure
    err = capsys.readouterr().err
    assert "new.json" in err and err.count("\n") == 1


@pytest.mark.parametrize("ms", [BIG, "1e308"], ids=["400-digits", "1e308"])
def test_trace_budget_with_huge_numbers_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], ms: str
) -> None:
    budget = _budget(tmp_path / "budget.json", ms)
    trace = _trace_with(tmp_path, "100")
    assert main(["trace", str(trace), "--budget", str(budget)]) == 2
    err = capsys.readouterr().err
    assert "budget.json" in err and err.count("\n") == 1


@pytest.mark.parametrize("ms", [BIG, "1e308"], ids=["400-digits", "1e308"])
def test_probe_baseline_with_huge_numbers_is_one_line_before_any_rank(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], ms: str
) -> None:
    baseline = _budget(tmp_path / "baseline.json", ms)
    argv = ["probe", "--model", "llama-3.1-8b", "--cpu-ranks", "1", "--baseline", str(baseline)]
    assert main(argv) == 2  # main: a traceback (OverflowError), exit 1
    err = capsys.readouterr().err
    assert "baseline.json" in err and err.count("\n") == 1 and "Traceback" not in err
