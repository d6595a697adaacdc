"""The scenario layer: one model resolver, one TP rule, one GPU-list grammar, and the canonical scenario string."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from decodetop.budget.scenario import (
    ModelSource,
    build_scenario,
    choose_tp,
    model_source,
    parse_gpu_list,
)
from decodetop.cli import main
from decodetop.errors import UserInputError

from .test_spec import TINY_LLAMA

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0", (0,)), ("0,1", (0, 1)), ("0-3", (0, 1, 2, 3)), ("0-3,5", (0, 1, 2, 3, 5)), (" 2 , 4-5 ", (2, 4, 5))],
)
def test_gpu_lists(text: str, expected: tuple[int, ...]) -> None:
    assert parse_gpu_list(text) == expected


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("-1", "'-1' is not a GPU index or range"),
        ("", "is not a GPU list"),
        ("0,,1", "is not a GPU list"),
        ("3-1", "runs backwards"),
        ("0,0", "GPU 0 is listed twice"),
        ("0-2,1", "GPU 1 is listed twice"),
        ("a", "'a' is not a GPU index"),
        ("99999", "out of range"),
    ],
)
def test_bad_gpu_lists_are_one_line(text: str, needle: str) -> None:
    with pytest.raises(UserInputError, match=r"^--gpus: ") as info:
        parse_gpu_list(text)
    assert needle in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("argv", [["probe", "--gpus", "-1"], ["--gpus", "0,0"], ["probe", "--gpus", "3-1", "launch"]])
def test_every_command_uses_the_one_grammar(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    if argv[0] == "--gpus":  # the live UI: refused before anything starts
        argv = [*argv, "--no-probes"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("decodetop: error: --gpus: ") and err.count("\n") == 1


def test_model_source_takes_exactly_one_non_empty_name(tmp_path: Path) -> None:
    assert model_source("Llama-3.1-70B", None).ref == "preset:llama-3.1-70b"
    (tmp_path / "config.json").write_text("{}")
    assert model_source(None, str(tmp_path)).ref == f"config:{tmp_path}"
    assert model_source(None, None, default_model="glm-5-nvfp4").value == "glm-5-nvfp4"
    for model, config, needle in (
        ("a", "b", "give one of them"),
        ("", None, "--model: empty name"),
        (None, " ", "--config: empty path"),
        (None, None, "no model"),
    ):
        with pytest.raises(UserInputError, match=needle):
            model_source(model, config)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_or_a_device_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(UserInputError, match="not a regular file or a directory"):
        model_source(None, str(fifo))
    with pytest.raises(UserInputError, match="not a regular file or a directory"):
        model_source(None, "/dev/zero")
    folder = tmp_path / "ckpt"
    folder.mkdir()
    os.mkfifo(folder / "config.json")
    with pytest.raises(UserInputError, match=r"config\.json in this directory is not a regular file"):
        model_source(None, str(folder))
    # and through a command: one line, exit 2, nothing hangs (a subprocess so a hang would fail the timeout)
    out = subprocess.run(
        [sys.executable, "-m", "decodetop", "budget", "--config", str(fifo)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )
    assert out.returncode == 2 and "not a regular file or a directory" in out.stderr


def test_the_settings_say_what_kind_of_model_they_hold(tmp_path: Path) -> None:
    """A typed model source: the key says it (model: a preset, config: a checkpoint), never a guess from the text."""
    from decodetop.pipeline.scenario_flags import settings_source
    from decodetop.settings import Settings, settings_from_mapping

    assert settings_source(Settings(model="glm-5-nvfp4")) == ModelSource("preset", "glm-5-nvfp4")
    (tmp_path / "config.json").write_text("{}")
    config = str(tmp_path / "config.json")
    assert settings_source(settings_from_mapping({"config": config}, "settings.toml")) == ModelSource("config", config)
    with pytest.raises(UserInputError, match=r"is not a preset name; a checkpoint's config\.json goes under config ="):
        settings_from_mapping({"model": config}, "settings.toml")
    with pytest.raises(UserInputError, match="model and config name the model twice"):
        settings_from_mapping({"model": "glm-5", "config": config}, "settings.toml")


def test_one_tp_rule_said_in_words() -> None:
    assert choose_tp(4).text == "TP 4 (--tp)"
    assert choose_tp(None, group_size=2, group_label="CPU ranks").text == (
        "TP 2 (default: the 2 CPU ranks of the probe group)"
    )
    assert choose_tp(None, group_size=8, group_label="GPUs", group_where="seen by NVML").source == (
        "default: the 8 GPUs seen by NVML"
    )
    assert choose_tp(None).text == "TP 1 (default: no probe group; pass --tp)"
    with pytest.raises(UserInputError, match="--tp: 0 is out of range"):
        choose_tp(0)


def test_a_tp_that_does_not_split_the_kv_heads_is_refused_with_the_reason(tmp_path: Path) -> None:
    import json

    config = dict(TINY_LLAMA, hidden_size=96, num_attention_heads=24, num_key_value_heads=4)
    (tmp_path / "config.json").write_text(json.dumps(config))
    source = model_source(None, str(tmp_path))
    assert build_scenario(source, choose_tp(2)).tp == 2  # splits 4 KV heads 2 per rank
    assert build_scenario(source, choose_tp(12)).tp == 12  # 3 replicas of each KV head, as vLLM does
    with pytest.raises(UserInputError, match=r"--tp: 6 neither splits the 4 KV heads .* evenly nor replicates them"):
        build_scenario(source, choose_tp(6))


def test_the_scenario_string_names_every_deployment_choice() -> None:
    scenario = build_scenario(model_source("llama-3.1-70b", None), choose_tp(2), batch=4, context_len=8192)
    assert scenario.fingerprint_id == (
        "model=preset:llama-3.1-70b;tp=2;ep=1;batch=4;context=8192;kv=bf16;launch=graph;spec=off"
    )
    other = build_scenario(
        model_source("llama-3.1-70b", None), choose_tp(None, group_size=2), batch=4, context_len=8192
    )
    assert other.fingerprint_id == scenario.fingerprint_id  # where TP came from is not part of what was measured
    assert other.describe().startswith("Llama-3.1-70B, TP 2 (default: the 2 ranks of the probe group), EP 1")


def test_the_live_ui_refuses_a_tp_the_model_cannot_serve_before_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DECODETOP_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("DECODETOP_STATE_DIR", str(tmp_path / "state"))
    assert main(["--model", "llama-3.1-70b", "--tp", "3", "--no-probes"]) == 2
    assert capsys.readouterr().err == (
        "decodetop: error: --tp: 3 does not split the 64 attention heads of Llama-3.1-70B\n"
    )
    assert main(["--config", "/dev/zero", "--no-probes"]) == 2
    assert "not a regular file or a directory" in capsys.readouterr().err
