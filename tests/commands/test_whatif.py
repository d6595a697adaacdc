"""`decodetop whatif`: the current deployment against variants, from a results file or the stored results of this
host; text, JSON, the target and its reasons, and one-line errors."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from decodetop.cli import main
from decodetop.history import KIND_PROBE, History
from decodetop.pipeline.fingerprints import fingerprint_of
from decodetop.probes.results import load_results
from tests.helpers.model_configs import small_llama

PLANS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "plans"
LLAMA = str(PLANS / "plan_llama-3.1-70b-tp1-h200x1.json")
SCENARIO = "model=preset:llama-3.1-70b;tp=1;ep=1;batch=1;context=4096;kv=bf16;launch=graph;spec=off"


@pytest.fixture(autouse=True)
def _own_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DECODETOP_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("COLUMNS", "240")


def test_the_table_names_each_variant_its_range_limit_and_the_target(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    draft = tmp_path / "draft.json"
    draft.write_text(json.dumps(small_llama()))
    argv = ["whatif", "--model", "llama-3.1-70b", "--results", LLAMA, "--tp", "1", "--draft-config", str(draft)]
    vary = ["--vary", "tp=2,4", "accept=1,3", "draft=1"]  # accept 3 of one draft token: that variant says why not
    assert main([*argv, *vary, "--target-tps", "100", "--observed-ms", "40"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("What-if: Llama-3.1-70B, TP 1 (--tp)")
    assert f"predicted from the results in {LLAMA}" in out
    assert "calibrated ×" in out and "observed 40 ms" in out
    header = next(line for line in out.splitlines() if line.startswith("variant"))
    for column in ("step ms", "80 % range", "calibrated", "tok/s/seq", "tok/s total", "limited by", "weakest figure"):
        assert column in header
    assert "tp=4 accept=3 draft=1" in out and "3.0 is more than the 1 draft tokens + 1" in out
    assert "tok/s per sequence over the accept length (tp=2 draft=1): 1 →" in out
    assert "reach 100 tok/s per sequence: " in out and "cannot be served so" in out
    assert "self-check (leave-one-out on this host's curves): " in out and "gemm: " in out


def test_json_carries_every_variant_and_why_the_others_miss_the_target(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["whatif", "--model", "llama-3.1-70b", "--results", LLAMA, "--tp", "1", "--vary", "tp=1,8", "--json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["now"]["label"] == "now" and [v["label"] for v in doc["variants"]] == ["tp=1", "tp=8"]
    tp8 = doc["variants"][1]
    assert tp8["step_ms"] < doc["now"]["step_ms"] and tp8["range_ms"][0] <= tp8["step_ms"] <= tp8["range_ms"][1]
    assert tp8["budget"]["self_check"]["families"] and tp8["limiting"]
    assert doc["calibration"] is None and "assumed" in doc["calibration_note"]
    assert doc["not_reaching"][0]["variant"] == "tp=1" and "weights do not fit" in doc["not_reaching"][0]["why"]


def test_without_results_it_takes_this_hosts_stored_ones(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["whatif", "--model", "llama-3.1-70b", "--tp", "1", "--vary", "batch=8"]
    assert main(argv) == 2
    assert "no probe results to predict from" in capsys.readouterr().err
    history = History()
    for r in load_results(LLAMA):
        assert r.environment is not None
        env = dataclasses.replace(r.environment, host="")  # measured on this host
        fp = fingerprint_of(env, SCENARIO)
        history.record(KIND_PROBE, r.probe, r.to_dict(), fingerprint=fp)
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "predicted from stored results of this host for this scenario" in out and "batch=8" in out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--vary", "speed=2"], "--vary: unknown knob 'speed'"),
        (["--vary", "tp"], "--vary 'tp': give KNOB=V1,V2"),
        (["--gpu", "nonesuch"], "--gpu: unknown GPU 'nonesuch'"),
        (["--vary", "tp=1,[red]2"], "--vary tp='[red]2': not a whole number"),
        (["--vary", "tp=1,,2"], "--vary 'tp=1,,2': an empty value between the commas"),
        (["--vary", "tp="], "--vary 'tp=': give KNOB=V1,V2"),
        (["--vary", "tp=3"], "--vary tp='3': 3 does not split the 64 attention heads of Llama-3.1-70B"),
        (["--vary", "batch=1", "accept=0.5"], "--vary accept='0.5': 0.5 is out of range (1..64)"),
        (["--vary", "accept=2"], "--vary accept='2': Llama-3.1-70B has no MTP layer to draft with"),
        (["--vary", "kv=fp4"], "--vary kv='fp4': 'fp4' is not one of"),
        (["--vary", "weights=int3"], "--vary weights='int3': not one of bf16, fp8"),
        (["--vary", "ep=2"], "--vary ep='2': Llama-3.1-70B has no routed experts to split"),
        (["--vary", "gpu=nonesuch"], "--vary gpu='nonesuch': unknown GPU 'nonesuch'"),
    ],
)
def test_bad_flags_are_one_line(extra: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["whatif", "--model", "llama-3.1-70b", "--results", LLAMA, *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_without_vary_it_compares_the_default_grid_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["whatif", "--model", "llama-3.1-70b", "--results", LLAMA, "--tp", "1", "--target-tps", "50"]) == 0
    out = capsys.readouterr().out
    assert "variants: the default grid --vary tp=1,2,4,8 weights=bf16,fp8,nvfp4\n" in out  # no MTP: no accept axis
    rows = [line.split()[0] for line in out.splitlines() if line.startswith("tp=")]
    assert rows[:3] == ["tp=1", "tp=1", "tp=1"] and len(rows) == 12
    assert "reach 50 tok/s per sequence: " in out and "weights do not fit" in out


def test_the_default_grid_turns_mtp_on_and_off_where_the_model_has_it() -> None:
    from decodetop.budget.deployment import Deployment
    from decodetop.budget.scenario import Scenario, model_source
    from decodetop.budget.spec import load_preset
    from decodetop.pipeline.whatif import default_axes

    spec = load_preset("glm-5")
    axes = dict(default_axes(Scenario(model_source("glm-5", None), spec, Deployment(tp=8), "test")))
    assert axes == {"tp": ("1", "2", "4", "8"), "weights": ("bf16", "fp8", "nvfp4"), "accept": ("1", "3")}


def test_a_400_digit_or_very_long_vary_value_is_shown_short() -> None:
    """A value of 400 digits is one short line that names it, never echoed whole (twice, as it was)."""
    from decodetop.errors import UserInputError
    from decodetop.pipeline.whatif import parse_vary

    long = "9" * 400
    with pytest.raises(UserInputError) as got:
        parse_vary([f"batch{long}"])
    assert len(str(got.value)) < 200 and long not in str(got.value)
