"""One way in: the scenario flags are the fields of one dataclass (`ScenarioFlags`), registered the same way on every
command and on the live UI, with their defaults in one place; a flag given to the wrong command says where it
belongs; the live UI refuses a bad scenario before any screen opens."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from decodetop.cli import build_parser, main
from decodetop.defaults import DEFAULT_MODEL, DEFAULT_TARGET_TPS
from decodetop.pipeline.scenario_flags import ScenarioFlags
from tests.helpers.env import subprocess_env

ROOT = Path(__file__).resolve().parents[2]
SURFACES = ([], ["budget"], ["probe"], ["exporter"])
"""The live UI (no subcommand) and the commands that compose a budget from the scenario flags."""


def _actions(argv: list[str]) -> dict[str, argparse.Action]:
    parser = build_parser()
    if argv:
        parser = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[argv[0]]
    return {flag: action for action in parser._actions for flag in action.option_strings}


@pytest.mark.parametrize("surface", SURFACES, ids=lambda s: s[0] if s else "live-ui")
def test_every_surface_takes_every_scenario_flag_the_same_way(surface: list[str]) -> None:
    actions = _actions(surface)
    for name, flag in ScenarioFlags.flags():
        action = actions[flag.name]
        assert action.dest == name and action.default is None, flag.name  # None: the one default, read in one place
        assert tuple(action.choices or ()) == flag.choices, flag.name
    flags = ScenarioFlags.from_namespace(build_parser().parse_args([*surface, "--batch", "8", "--kv-dtype", "fp8"]))
    assert flags.given() == {"batch": 8, "kv_dtype": "fp8"}
    scenario = flags.scenario(4, group_label="GPUs", default_model=DEFAULT_MODEL)
    assert (scenario.deployment.batch, scenario.kv_dtype, scenario.tp) == (8, "fp8", 4)
    assert scenario.tp_text == "TP 4 (default: the 4 GPUs of the probe group)"


def test_the_defaults_are_said_once() -> None:
    flags = ScenarioFlags()
    scenario = flags.scenario(None, default_model=DEFAULT_MODEL)
    dep = scenario.deployment
    assert (scenario.source.value, dep.tp, dep.ep, dep.batch, dep.context_len) == (DEFAULT_MODEL, 1, 1, 1, 4096)
    assert (dep.launch_mode, dep.allreduce, flags.target_tps_or_default()) == ("graph", "auto", DEFAULT_TARGET_TPS)
    assert scenario.tp_text == "TP 1 (default: no probe group; pass --tp)"
    assert ScenarioFlags(observed_ms=12.5).observed_flag_ms() == 12.5 and flags.observed_flag_ms() is None


def test_the_live_ui_takes_the_deployment_flags(capsys: pytest.CaptureFixture[str]) -> None:
    """`decodetop --batch 8` used to fail with "COMMAND: invalid choice: '8'"."""
    args = build_parser().parse_args(["--batch", "8", "--context", "32768", "--accept-length", "2", "--ep", "2"])
    assert args.command is None
    assert ScenarioFlags.from_namespace(args).given() == {"batch": 8, "context": 32768, "accept_length": 2.0, "ep": 2}


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["--json"],
            "--json is a flag of decodetop probe, decodetop budget, decodetop whatif, decodetop check, "
            "decodetop trace, not of ",
        ),
        (["budget", "--server", "http://x"], "--server is a flag of decodetop (the live UI), decodetop trace, "),
        (
            ["probe", "--theme", "decodetop-dark"],
            "--theme is a flag of decodetop (the live UI), not of decodetop probe",
        ),
        (["budget", "--nosuch"], "unrecognized arguments: --nosuch"),
    ],
)
def test_a_flag_of_another_command_says_where_it_belongs(
    argv: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("decodetop: error: ") and line in err and len(err.strip().splitlines()) == 1


def _live_ui(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """The live UI's command in a fresh process, its stdin and stdout not a terminal (so it would refuse to start:
    anything said before that line is said up front)."""
    env = {
        **subprocess_env(),
        "HOME": str(tmp_path),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "DECODETOP_CONFIG_DIR": str(tmp_path / "config"),
        "DECODETOP_STATE_DIR": str(tmp_path / "state"),
    }
    return subprocess.run(
        [sys.executable, "-m", "decodetop", *argv],
        capture_output=True,
        text=True,
        env=env,
        stdin=subprocess.DEVNULL,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--model", "nosuch"], "--model: unknown preset 'nosuch' (known: deepseek-r1"),
        (["--batch", "0"], "--batch: must be at least 1, got '0'"),
        (["--context", "1000000000"], "--context: 1000000000 is out of range"),
        (["--model", "llama-3.1-70b", "--tp", "3"], "--tp: 3 does not split the 64 attention heads"),
    ],
)
def test_a_bad_scenario_fails_before_the_live_ui_opens(tmp_path: Path, argv: list[str], line: str) -> None:
    out = _live_ui(tmp_path, *argv)
    assert out.returncode == 2, out.stderr
    assert line in out.stderr and "terminal" not in out.stderr  # said before the terminal is even looked at


def test_a_good_scenario_gets_as_far_as_the_terminal_check(tmp_path: Path) -> None:
    out = _live_ui(tmp_path, "--batch", "8", "--kv-dtype", "fp8", "--context", "32768")
    assert out.returncode == 2 and "the live UI needs a terminal" in out.stderr
