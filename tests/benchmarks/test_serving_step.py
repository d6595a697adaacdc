"""CPU smoke test of the independent serving-form step (benchmarks/whatif/serving_step.py) at tiny widths: each
attention form checked against SDPA and timed, and with `--parts` the step without its elementwise chain and
without its attention, each share the difference of two timed steps. No timing assertions."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH / "whatif"))
serving_step: Any = importlib.import_module("serving_step")

SHAPE = {"layers": 2, "hidden": 64, "heads": 8, "kv_heads": 2, "head_dim": 16, "intermediate": 128, "vocab": 256,
         "tp": 1, "batch": 2, "context": 300}  # fmt: skip


def test_the_parts_are_differences_of_timed_steps(tmp_path: Path) -> None:
    predicted = tmp_path / "whatif.json"
    predicted.write_text(json.dumps({"serving": [{"name": "tiny", "predicted_ms": 1.0, "range_ms": [0.9, 1.1],
                                                  "shape": SHAPE}]}))  # fmt: skip
    out = tmp_path / "serving.json"
    argv = ["--predicted", str(predicted), "--device", "cpu", "--replays", "1", "--repeats", "2", "--parts"]
    assert serving_step.main([*argv, "--json", str(out)]) == 0
    measured = json.loads(out.read_text())["rows"][0]["measured"]
    parts = measured["parts"]
    assert set(parts) == {"without_elementwise_ms", "elementwise_ms", "without_attention_ms", "attention_ms"}
    for name in ("elementwise", "attention"):
        assert parts[f"without_{name}_ms"] > 0
        assert parts[f"{name}_ms"] == pytest.approx(measured["ms"] - parts[f"without_{name}_ms"])


def test_the_step_without_a_part_still_gives_each_sequence_a_token() -> None:
    for kw in ({}, {"elementwise": False}, {"attend": False}):
        shard = serving_step.Shard(SHAPE, torch.device("cpu"), torch.float32, attention="split", **kw)
        assert tuple(shard.step().shape) == (SHAPE["batch"],)


def test_a_form_that_fails_is_kept_with_its_error_and_the_others_still_count(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: Any) -> Any:
        raise RuntimeError("this torch has no such kernel")

    monkeypatch.setattr(serving_step.Shard, "_split_attend", broken)
    measured = serving_step.measure(SHAPE, torch.device("cpu"), replays=1, repeats=2)
    assert measured["attention"] == "sdpa"
    assert "no such kernel" in measured["forms"]["split"]["error"]
    assert "ms" not in measured["forms"]["split"]


def test_compile_is_refused_on_the_cpu_smoke_path() -> None:
    shard = serving_step.Shard(SHAPE, torch.device("cpu"), torch.float32, attention="sdpa")
    with pytest.raises(ValueError, match="GPU"):
        serving_step.time_eager(shard, 1, 1, compiled=True)
