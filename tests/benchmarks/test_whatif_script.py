"""CPU smoke test of the what-if campaign (benchmarks/whatif/whatif.py) at tiny sizes: the base plan with its curves,
every scenario predicted from it and measured directly, the comparison table and JSON. No timing assertions."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH / "whatif"))
whatif: Any = importlib.import_module("whatif")


@pytest.mark.slow
def test_the_campaign_predicts_and_measures_every_scenario_on_cpu_ranks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "whatif.json"
    argv = ["--device", "cpu", "--tiny", "--layers", "1", "--context", "64", "--quiet", "--json", str(out)]
    serving = tmp_path / "serving.json"
    models = ["--models", "llama-3.1-70b,mixtral-8x7b", "--glm5-plan", "--serving-json", str(serving)]
    assert whatif.main([*argv, *models]) == 0
    doc = json.loads(out.read_text())
    assert doc["device_kind"] == "cpu" and "glm5" not in doc  # timed on a GPU only
    llama, mixtral = doc["models"]["llama-3.1-70b"], doc["models"]["mixtral-8x7b"]
    names = [r["scenario"] for r in llama["rows"]]
    assert names == [s.name for s in whatif.SCENARIOS if not s.moe_only]
    assert [r["scenario"] for r in mixtral["rows"]][-1] == "EP 2 (TP 2)"
    for row in llama["rows"] + mixtral["rows"]:
        assert "skipped" not in row, row
        assert row["predicted_ms"] > 0 and row["direct_ms"] > 0 and row["complete"], row
        lo, hi = row["range_ms"]
        assert lo <= row["predicted_ms"] <= hi
        assert isinstance(row["inside"], bool) and row["error"] is not None
    tp2 = next(r for r in llama["rows"] if r["scenario"] == "TP-2 shard")
    assert tp2["allreduce_status"] in ("missing", "estimated", "extrapolated")  # one rank: shown apart
    fp8 = next(r for r in llama["rows"] if r["scenario"] == "FP8 KV")
    assert fp8["rows"]["attention"]["status"] in ("measured", "interpolated", "transferred")
    assert llama["loo"]["gemm"]["interior"]["n"] > 0  # the base plan's own self-check
    assert llama["base_points"] > 50  # the curve plan measured beside the budget's keys
    assert doc["summary"]["cases"] == len(llama["rows"]) + len(mixtral["rows"])
    shapes = [r["shape"] for r in doc["serving"]]  # the dense model's only, each at a shape of its own
    assert len(shapes) == len(whatif.SERVING_SHAPES) and {s["tp"] for s in shapes} == {1, 2, 4}
    assert all(r["predicted_ms"] > 0 and r["complete"] for r in doc["serving"])
    timed = doc["serving_measured"]["rows"]  # the independent step ran in its own process at every shape
    assert [r["name"] for r in timed] == [r["name"] for r in doc["serving"]] and all(
        r["measured"]["ms"] > 0 for r in timed
    )
    text = capsys.readouterr().out
    assert "| model | scenario | direct ms | predicted ms |" in text and "80 % range in" in text
    assert "| serving-form step (compute of one rank) |" in text and "serving-form step: median |error|" in text
