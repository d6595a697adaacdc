"""Tables fit the terminal: text columns wrap, numbers are never cut; the real commands' output stays ≤ COLUMNS."""

from __future__ import annotations

import textwrap

import pytest

from decodetop.cli import main
from decodetop.collectors.checks.result import CheckResult, Status
from decodetop.commands.check import render_table
from decodetop.textfmt import fit_text, reserved_columns, table, terminal_width

LONG = "roofline estimate for NVIDIA RTX PRO 6000 Blackwell (assumed: no --gpu and no GPU seen)"


def _widest(text: str) -> int:
    return max(len(line) for line in text.splitlines())


def test_a_table_that_fits_is_unchanged() -> None:
    rows = [["attention", 0.0757, "measured"], ["all-reduce", 3.85, "estimated"]]
    assert table(["component", "ms", "status"], rows, width=200) == table(
        ["component", "ms", "status"], rows, width=None
    )
    assert table(["a", "b"], [["x", 1]], width=None).splitlines() == ["a  b", "-  -", "x  1"]


def test_text_wraps_and_numbers_stay_whole() -> None:
    rows = [["attention projections", 123456.789, LONG], ["routing", 0.132, "measured in this run"]]
    text = table(["component", "ms", "where it came from"], rows, width=60)
    assert _widest(text) <= 60
    assert "123457" in text and "0.132" in text  # numbers whole, on one line
    start = text.splitlines()[0].index("where")
    joined = " ".join(line[start:].strip() for line in text.splitlines()[2:])
    for word in LONG.split():
        assert word in joined  # every word of the long cell is still there, wrapped
    assert len(text.splitlines()) > 4


def test_max_lines_trims_with_an_ellipsis() -> None:
    text = table(["k", "text"], [["a", LONG]], width=30, max_lines=2)
    body = text.splitlines()[2:]
    assert len(body) == 2 and body[-1].endswith("…") and _widest(text) <= 30


def test_indent_and_reserved_columns_count_against_the_width() -> None:
    rows = [["x", LONG]]
    indented = table(["k", "v"], rows, width=50, indent=4)
    assert all(line.startswith("    ") for line in indented.splitlines()) and _widest(indented) <= 50
    with reserved_columns(6):
        inner = table(["k", "v"], rows, width=50)
    assert _widest(inner) <= 44


def test_terminal_width_follows_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "93")
    assert terminal_width() == 93
    monkeypatch.setenv("COLUMNS", "junk")
    assert terminal_width() is None  # pytest's captured stdout is not a terminal: no limit
    monkeypatch.delenv("COLUMNS")
    assert terminal_width() is None


def test_fit_text_wraps_long_lines_with_a_hanging_indent() -> None:
    text = "short\n  bandwidth: " + LONG + "\n" + "x" * 10
    out = fit_text(text, width=40)
    assert _widest(out) <= 40
    lines = out.splitlines()
    assert lines[0] == "short" and lines[1].startswith("  bandwidth:") and lines[2].startswith("    ")
    assert fit_text(text, width=None) == text


def _check(check_id: str, observed: str) -> CheckResult:
    return CheckResult(
        check_id=check_id,
        title="Kernel vs NVIDIA module version",
        status=Status.WARN,
        observed=observed,
        expected="the NVIDIA kernel module built for the running kernel, loaded at boot by the driver package",
        why="a module built for another kernel fails to load after an update and the GPUs disappear",
        fix="reinstall the driver package for the running kernel (dkms autoinstall) and reboot",
    )


@pytest.mark.parametrize("columns", [80, 120])
def test_check_table_fits_columns(monkeypatch: pytest.MonkeyPatch, columns: int) -> None:
    monkeypatch.setenv("COLUMNS", str(columns))
    results = [
        _check("C14", "module 570.86.15 built for 6.8.0-45-generic, running 6.8.0-49-generic " * 2),
        _check("P7:0000:03:00.0-0000:04:00.0", "ACS on 0000:03:00.0 redirects peer traffic to the root complex"),
    ]
    for verbose in (False, True):
        text = render_table(results, verbose=verbose)
        assert _widest(text) <= columns
        assert ("why: a module built" in text) is verbose
        assert "6.8.0-49-generic" in text


@pytest.mark.parametrize("argv", [["--model", "glm-5-nvfp4", "--plan"], ["--model", "llama-3.1-70b"]])
def test_budget_output_fits_80_columns(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["budget", "--tp", "8", "--gpu", "h200", *argv]) == 0
    out = capsys.readouterr().out
    assert _widest(out) <= 80
    monkeypatch.delenv("COLUMNS")
    assert main(["budget", "--tp", "8", "--gpu", "h200", *argv]) == 0
    assert _widest(capsys.readouterr().out) > 80  # not a terminal and no COLUMNS: whole lines for grep


def test_trace_report_fits_80_columns(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from pathlib import Path

    trace = Path(__file__).parent / "fixtures" / "traces" / "h200_mixtral_eager.trace.json.gz"
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["trace", str(trace), "--model", "mixtral-8x7b", "--gpu", "h200"]) == 0
    out = capsys.readouterr().out
    assert _widest(out) <= 80 and "routed experts" in out


def test_narrowing_keeps_words_whole_and_wraps_the_long_text() -> None:
    rows = [["C1", "CPU scaling driver", LONG + " " + LONG], ["attention projections", "all-reduce", "ok"]]
    text = table(["ID", "TITLE", "OBSERVED"], rows, width=70)
    assert _widest(text) <= 70
    words = {w for line in text.splitlines()[2:] for w in line.split()}
    assert {"scaling", "projections", "all-reduce", "Blackwell"} <= words  # no word broken while there is room
    assert len(text.splitlines()) == 2 + len(textwrap.wrap(LONG + " " + LONG, 70 - 21 - 10 - 4)) + 1
    huge = table(["k", "v"], [[f"row{i}", LONG] for i in range(2000)], width=60)  # past the estimate's bound
    assert _widest(huge) <= 60 and len(huge.splitlines()) > 4000
