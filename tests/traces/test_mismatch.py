"""A trace checked against the model it is compared with: the per-layer kernel pattern, expert and collective kernels,
ranks against TP — on the recorded H200 traces (a 4-layer Llama-shaped model, and 4-layer Mixtral and Qwen3-MoE) and
on synthetic ones; one line on the CLI (text and JSON) naming what does not match, and nothing where all matches."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from decodetop.budget.deployment import Deployment
from decodetop.budget.inventory import build_inventory
from decodetop.budget.spec import load_config, load_preset
from decodetop.cli import main
from decodetop.traces.layers import layer_pattern
from decodetop.traces.mismatch import ModelShape, mismatch_line, repeat_counts, trace_mismatches
from decodetop.traces.ranks import analyze_path
from tests.helpers.synth import SynthSpec, write_synthetic_trace

from .conftest import fixture

LLAMA_4L = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 4,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
    "torch_dtype": "bfloat16",
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}
"""The recorded traces' model (benchmarks/recorders/record_traces.py: a Llama of 4 layers, hidden 2048)."""
MIXTRAL_4L = {
    **LLAMA_4L,
    "model_type": "mixtral",
    "architectures": ["MixtralForCausalLM"],
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
}


def _shape(config: dict[str, Any], tmp_path: Path, tp: int = 1) -> ModelShape:
    path = tmp_path / f"{config['model_type']}-{tp}" / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config))
    return ModelShape.of(build_inventory(load_config(path), Deployment(tp=tp)))


def _config(config: dict[str, Any], tmp_path: Path) -> str:
    path = tmp_path / f"cfg-{config['model_type']}" / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config))
    return str(path)


# --------------------------------------------------------------------------------------------- the layer pattern


def test_the_layer_pattern_is_found_in_every_recorded_step() -> None:
    """Graph and eager Llama steps, and the MoE models' eager steps: 4 layers each, with their head and tail."""
    for name, per_layer in (
        ("h200_graph", 50),
        ("h200_eager", 41),
        ("h200_mixtral_eager", 83),
        ("h200_qwen3moe_eager", 98),
    ):
        pattern = analyze_path(fixture(name)).report.layer_pattern
        assert pattern is not None and (pattern.layers, pattern.kernels_per_layer) == (4, per_layer), name
        assert pattern.step_kernels > pattern.layers * pattern.kernels_per_layer  # embedding, final norm, lm_head


def test_layer_pattern_edges() -> None:
    head, tail = [90, 91], [92, 93, 94]
    layer = [1, 2, 2, 2, 3, 4, 1, 5, 2, 6]  # norm, 3 GEMMs in a row, attention, add, norm, MLP …
    pattern = layer_pattern(head + layer * 6 + tail)
    assert pattern is not None and (pattern.layers, pattern.kernels_per_layer) == (6, 10)
    assert layer_pattern(head + layer + tail) is None  # one layer is no pattern
    assert layer_pattern([]) is None and layer_pattern(list(range(50))) is None
    # a model of 3 dense layers then 75 MoE layers repeats its MoE layer 75 times; either count is the model's
    assert repeat_counts([0] * 3 + [1] * 75) == (75, 78)
    assert repeat_counts([0, 1] * 24) == (24, 48)  # alternating kinds: a two-layer pattern, 24 times
    assert repeat_counts([0] * 80) == (80,)


# --------------------------------------------------------------------------------------------- mismatches


def test_a_trace_of_the_model_itself_matches(tmp_path: Path) -> None:
    for name in ("h200_graph", "h200_eager"):
        assert trace_mismatches(analyze_path(fixture(name)), _shape(LLAMA_4L, tmp_path)) == ()
    assert trace_mismatches(analyze_path(fixture("h200_mixtral_eager")), _shape(MIXTRAL_4L, tmp_path)) == ()
    synth = tmp_path / "tp2-moe.json"
    write_synthetic_trace(synth, 80_000, SynthSpec(layers=4, moe=True, allreduce=True))
    assert trace_mismatches(analyze_path(synth), _shape(MIXTRAL_4L, tmp_path, tp=2)) == ()


def test_another_layer_count_is_named(tmp_path: Path) -> None:
    shape = ModelShape.of(build_inventory(load_preset("llama-3.1-70b"), Deployment(tp=1)))
    found = trace_mismatches(analyze_path(fixture("h200_graph")), shape)
    assert [m.what for m in found] == ["layers"]
    assert mismatch_line(shape, found) == (
        "the trace does not match Llama-3.1-70B at TP 1: 4 layers traced vs 80 (231 kernels per step vs 725 expected)"
    )


def test_no_experts_for_a_moe_model_is_named(tmp_path: Path) -> None:
    shape = _shape(MIXTRAL_4L, tmp_path)
    found = trace_mismatches(analyze_path(fixture("h200_graph")), shape)
    assert [(m.what, m.text) for m in found] == [
        ("experts", "no expert or routing kernels for a MoE model (4 MoE layers)")
    ]
    dense = trace_mismatches(analyze_path(fixture("h200_mixtral_eager")), _shape(LLAMA_4L, tmp_path))
    assert [m.what for m in dense] == ["experts"] and dense[0].text.endswith(
        " expert kernels per step, llama-1 has none"
    )


def test_tp_8_claimed_for_one_rank_is_named(tmp_path: Path) -> None:
    shape = _shape(LLAMA_4L, tmp_path, tp=8)
    found = trace_mismatches(analyze_path(fixture("h200_graph")), shape)
    assert [(m.what, m.text) for m in found] == [
        ("collectives", "TP 8 given, the trace shows 1 rank and no all-reduce kernels")
    ]
    tp2 = tmp_path / "tp2.json"
    write_synthetic_trace(tp2, 80_000, SynthSpec(layers=4, allreduce=True))
    found = trace_mismatches(analyze_path(tp2), _shape(LLAMA_4L, tmp_path, tp=1))
    assert [m.what for m in found] == ["collectives"] and found[0].text.endswith("with TP 1 given (pass --tp)")


def test_the_traces_own_world_size_and_the_rank_files_count(tmp_path: Path) -> None:
    """A trace that carries distributedInfo says its ranks; a directory of rank files is as many ranks."""
    plain = tmp_path / "rank0.json"
    write_synthetic_trace(plain, 80_000, SynthSpec(layers=4, allreduce=True))
    text = plain.read_text().replace(
        '{"schemaVersion":1,', '{"schemaVersion":1,"distributedInfo":{"backend":"nccl","rank":0,"world_size":2},', 1
    )
    sized = tmp_path / "sized.json.gz"
    sized.write_bytes(gzip.compress(text.encode()))
    traces = analyze_path(sized)
    assert traces.report.world_size == 2
    assert trace_mismatches(traces, _shape(LLAMA_4L, tmp_path, tp=2)) == ()
    (found,) = trace_mismatches(traces, _shape(LLAMA_4L, tmp_path, tp=4))
    assert (found.what, found.text) == ("ranks", "TP 4 given, the trace's world size is 2")
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    for rank in (0, 1):
        write_synthetic_trace(ranks / f"rank{rank}.json", 80_000, SynthSpec(layers=4, allreduce=True))
    (found,) = trace_mismatches(analyze_path(ranks), _shape(LLAMA_4L, tmp_path, tp=8))
    assert (found.what, found.text) == ("ranks", "TP 8 given, 2 rank traces read")


# --------------------------------------------------------------------------------------------- the CLI


def test_cli_says_what_does_not_match_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """A 4-layer one-GPU Llama trace against GLM-5 at TP 8: layers, experts and TP in one line under the trace's;
    the roofline budget's figures are called roofline, never probed; JSON has the line and each finding."""
    path = str(fixture("h200_graph"))
    assert main(["trace", path, "--model", "glm-5", "--tp", "8"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == (
        "mismatch the trace does not match GLM-5 at TP 8: 4 layers traced vs 78 (231 kernels per step vs 2,326 "
        "expected); no expert or routing kernels for a MoE model (75 MoE layers); TP 8 given, the trace shows 1 "
        "rank and no all-reduce kernels"
    )
    text = "\n".join(lines)
    assert "largest gap: norms & elementwise: traced 0.198 ms vs roofline 1.78 µs" in text
    assert "roofline vs trace (budget of GLM-5 (TP 8, " in text and "roofline-estimated; run probes" in text
    assert "roofline ms  traced ms" in text and "should cost ms (roofline)" in text
    assert "probed" not in text and "probes ms" not in text and "server ms" not in text
    assert main(["trace", path, "--model", "glm-5", "--tp", "8", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["mismatch"]["line"] == lines[1].removeprefix("mismatch ")
    assert [f["what"] for f in data["mismatch"]["found"]] == ["layers", "experts", "collectives"]
    assert data["traced"]["mismatch"] == data["mismatch"]["line"] and data["traced"]["budget_source"] == "roofline"
    assert {r["source"] for r in data["comparison"]["rows"] if r["probed_ms"] is not None} == {"roofline"}


def test_cli_with_the_model_itself_says_nothing_of_a_mismatch(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["trace", str(fixture("h200_graph")), "--config", _config(LLAMA_4L, tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "mismatch" not in out and "does not match" not in out
    assert main(["trace", str(fixture("h200_graph")), "--config", _config(LLAMA_4L, tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["mismatch"] == {"line": "", "found": []}
