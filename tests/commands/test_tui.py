"""`decodetop` with no subcommand: flags on the main parser, settings precedence, one-line errors."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from decodetop.cli import build_parser, main
from decodetop.settings import Settings, save_settings
from decodetop.tui.crash import CrashReport


def test_flags_are_on_the_main_parser() -> None:
    args = build_parser().parse_args(
        [
            "--model",
            "llama-3.1-70b",
            "--tp",
            "4",
            "--observed-ms",
            "40",
            "--target-tps",
            "100",
            "--theme",
            "decodetop-light",
            "--cpu-ranks",
            "2",
            "--gpus",
            "0-1",
            "--no-probes",
            "--tick",
            "0.5",
            "--demo",
            "--force",
        ]
    )
    assert args.command is None
    assert (args.model, args.tp, args.observed_ms, args.target_tps) == ("llama-3.1-70b", 4, 40.0, 100.0)
    assert args.no_probes and args.demo and args.force and args.tick == 0.5


@pytest.mark.parametrize("bad", [["--tp", "0"], ["--observed-ms", "-3"], ["--tick", "abc"]])
def test_bad_flag_values_exit_2(bad: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(bad)
    assert info.value.code == 2


def test_unknown_theme_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--theme", "pink", "--no-probes"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "theme 'pink'" in err[0]


def test_record_and_replay_together_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    replay = tmp_path / "b.jsonl"
    replay.write_text("")
    assert main(["--record", str(tmp_path / "a.jsonl"), "--replay", str(replay)]) == 2
    assert "--record and --replay" in capsys.readouterr().err


def test_corrupt_settings_file_is_one_line_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.toml"
    path.write_text("tp = [")
    assert main(["--settings", str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "not valid TOML" in err


def test_flags_override_the_settings_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "s.toml"
    save_settings(Settings(model="glm-5", tp=8, observed_ms=50.0, theme="decodetop-contrast"), path)
    seen: dict[str, object] = {}

    class FakeApp:
        crash = None
        return_code = 0

        def __init__(self, sources: object, settings: Settings, path: Path, *, save_theme: bool) -> None:
            seen.update(settings=settings, path=path, save_theme=save_theme)
            self.crash_report = CrashReport()

        def run(self) -> int:
            return 0

        def shutdown_sources(self) -> None:
            seen["closed"] = True

    monkeypatch.setattr("decodetop.tui.app.DecodetopApp", FakeApp)
    monkeypatch.setattr("decodetop.tui.launch.build_sources", lambda settings, options: SimpleNamespace(settings=None))
    monkeypatch.setattr("decodetop.tui.launch.require_terminal", lambda stdin, stdout, environ: None)
    assert main(["--settings", str(path), "--tp", "2", "--no-probes"]) == 0
    settings = seen["settings"]
    assert isinstance(settings, Settings)
    assert (settings.model, settings.tp, settings.observed_ms, settings.theme) == (
        "glm-5",
        2,
        50.0,
        "decodetop-contrast",
    )
    assert seen["path"] == path and seen["save_theme"] is True and seen["closed"] is True


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--timeout", "3"], "--timeout is a flag of decodetop probe, decodetop trace, not of decodetop (the live UI)"),
        (["--tick", "1", "--set", "x=1"], "--set is a flag of decodetop probe"),
    ],
)
def test_a_headless_flag_with_a_value_says_where_it_belongs(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its value used to be read as the command's name: "COMMAND: invalid choice: '3'"."""
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and said in err[0] and "invalid choice" not in err[0]
