"""Attribution of real decode steps recorded on an H200 (and on this CPU), and of synthetic traces."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from decodetop.budget.components import Component
from decodetop.errors import UserInputError
from decodetop.traces import analyze_trace
from decodetop.traces.trace_report import LAUNCH_KEY
from tests.helpers.synth import SynthSpec, write_synthetic_trace

from .conftest import fixture, write_trace

CAST = "direct_copy_kernel_cuda"
"""The planted FP8→BF16 cast of the whole KV cache runs as PyTorch's direct_copy kernel."""


def test_planted_cast_is_the_top_entry_under_attention() -> None:
    report = analyze_trace(fixture("h200_eager_planted"))
    top = report.top_kernels[0]
    assert CAST in top.name
    assert top.bucket == Component.ATTENTION.value
    assert top.via is not None and top.via.endswith("in attention") and "_to_copy" in top.via
    assert top.count_per_step == 4  # one per layer per step
    attention = report.bucket("attention")
    assert attention is not None and attention.top[0].name == top.name
    # the cast is most of attention's time, and attention is the largest component
    assert top.time_us_per_step > 0.8 * attention.time_us_per_step
    assert report.buckets[0].key == "attention"


def test_planted_cast_adds_to_attention_only() -> None:
    """Planting the cast moves attention by about the cast's time; the GEMM components barely move."""
    clean = analyze_trace(fixture("h200_eager"))
    planted = analyze_trace(fixture("h200_eager_planted"))
    cast_us = planted.top_kernels[0].time_us_per_step
    grow = planted.bucket("attention").time_us_per_step - clean.bucket("attention").time_us_per_step  # type: ignore[union-attr]
    assert grow == pytest.approx(cast_us, rel=0.1)
    for key in ("attention_proj", "dense_mlp", "lm_head"):
        a, b = clean.bucket(key), planted.bucket(key)
        assert a is not None and b is not None
        assert b.kernels_per_step == a.kernels_per_step


def test_eager_gpu_idle_is_reported_as_host_overhead() -> None:
    report = analyze_trace(fixture("h200_eager"))
    assert report.segmentation.startswith("markers: profiler_step")
    assert len(report.steps) == 4
    assert report.gpu_idle_us_mean > report.gpu_busy_us_mean  # tiny model, eager: host-bound
    assert any("host-bound" in n for n in report.notes)
    assert report.traced_ms()[LAUNCH_KEY] == pytest.approx(report.gpu_idle_us_mean / 1000)
    for step in report.steps:
        assert step.gpu_idle_us == pytest.approx(step.gpu_window_us - step.gpu_busy_us)
        assert step.kernel_count == report.steps[0].kernel_count


def test_graph_replay_removes_most_idle() -> None:
    eager = analyze_trace(fixture("h200_eager"))
    graph = analyze_trace(fixture("h200_graph"))
    frac = lambda r: r.gpu_idle_us_mean / (r.gpu_idle_us_mean + r.gpu_busy_us_mean)  # noqa: E731
    assert frac(graph) < 0.3 < frac(eager)
    assert not any("host-bound" in n for n in graph.notes)


def test_graph_gemms_are_attributed_by_their_neighbours() -> None:
    """No host context under graph replay: 4 layers × (q, k, v, o) projections and 4 × (gate, up, down + splitK
    reduce) MLP GEMMs are found from the norm-delimited blocks, the lm_head from the final block."""
    report = analyze_trace(fixture("h200_graph"))
    assert report.bucket("attention_proj").kernels_per_step == 16  # type: ignore[union-attr]
    mlp = report.bucket("dense_mlp")
    # + 4 SiLU (the budget counts the activation here) + 8 dtype copies the replay runs inside the MLP blocks
    assert mlp is not None and mlp.kernels_per_step == 16 + 4 + 8
    assert sum(k.count_per_step for k in mlp.top if k.family == "copy") == 8
    lm_head = report.bucket("lm_head")
    assert lm_head is not None and any("256x8" in k.name for k in lm_head.top)
    assert any("by their neighbours" in n for n in report.notes)


def test_graph_planted_cast_lands_in_attention_by_its_place_in_the_replay() -> None:
    """Inside a graph the cast has no enclosing operator: it is the top entry, attributed to attention because the
    replay runs it inside the attention block (between the norms around the attention kernel), and says so."""
    report = analyze_trace(fixture("h200_graph_planted"))
    top = report.top_kernels[0]
    assert CAST in top.name
    assert (top.bucket, top.via) == ("attention", "graph replay, attention block")
    assert report.buckets[0].key == "attention"


def test_cpu_trace_recorded_here_attributes() -> None:
    report = analyze_trace(fixture("cpu_eager"))
    assert report.source == "cpu" and len(report.steps) == 3
    assert {b.key for b in report.buckets} >= {"attention", "attention_proj", "dense_mlp", "lm_head", "norms"}
    # aten::mm does its work itself (self time) under aten::matmul: its module decides the component
    lm_head = report.bucket("lm_head")
    assert lm_head is not None
    assert any(k.name == "aten::mm" and k.via and "LlamaForCausalLM" in k.via for k in lm_head.top)
    assert all(s.gpu_busy_us <= s.gpu_window_us for s in report.steps)
    planted = analyze_trace(fixture("cpu_eager_planted"))
    top = planted.top_kernels[0]
    assert top.name == "aten::copy_" and top.bucket == "attention" and top.via and "in attention" in top.via


def test_steps_without_markers_are_one_per_graph_launch(tmp_path: Path) -> None:
    """Without ProfilerStep ranges each cudaGraphLaunch delimits a step: the kernels carrying its correlation id."""
    data = json.loads(gzip.decompress(fixture("h200_graph").read_bytes()))
    data["traceEvents"] = [e for e in data["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep")]
    path = tmp_path / "nomarkers.json"
    path.write_text(json.dumps(data))
    report = analyze_trace(path)
    assert report.segmentation.startswith("graph launches")
    assert len(report.steps) == 4
    assert report.kernels_per_step_mean == report.graph_kernels_per_step == 229
    assert all(s.wall_us >= s.gpu_busy_us for s in report.steps)


def test_steps_without_markers_are_found_by_repetition(tmp_path: Path) -> None:
    """The graph trace with every ProfilerStep range and graph launch removed still splits into its steps."""
    data = json.loads(gzip.decompress(fixture("h200_graph").read_bytes()))
    data["traceEvents"] = [
        e
        for e in data["traceEvents"]
        if not str(e.get("name", "")).startswith("ProfilerStep") and e.get("name") != "cudaGraphLaunch"
    ]
    path = tmp_path / "nomarkers.json"
    path.write_text(json.dumps(data))
    with_markers = analyze_trace(fixture("h200_graph"))
    report = analyze_trace(path)
    assert report.segmentation.startswith("repetition")
    assert report.kernels_per_step_mean == with_markers.kernels_per_step_mean
    assert len(report.steps) >= 3


def test_synthetic_segmentation_paths(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    steps, _ = write_synthetic_trace(path, 200_000, SynthSpec())
    assert len(analyze_trace(path).steps) == steps
    steps, _ = write_synthetic_trace(path, 200_000, SynthSpec(marker_name="decode"))
    report = analyze_trace(path)
    assert report.segmentation.startswith("markers: decode") and len(report.steps) == steps
    steps, _ = write_synthetic_trace(path, 200_000, SynthSpec(markers=False))
    report = analyze_trace(path)
    assert report.segmentation.startswith("repetition") and report.kernels_per_step_mean == 51
    write_synthetic_trace(path, 200_000, SynthSpec(markers=False, extra_kernels_every_step=True))
    report = analyze_trace(path)
    assert report.segmentation == "gaps between kernels"
    assert [s.kernel_count for s in report.steps[:3]] == [51, 52, 53]


def test_unclassified_kernels_are_shown(tmp_path: Path) -> None:
    path = tmp_path / "odd.json"
    write_synthetic_trace(path, 100_000, SynthSpec(odd_kernel="my_new_fused_thing_v7"))
    report = analyze_trace(path)
    odd = report.bucket("unclassified")
    assert odd is not None and odd.kernels_per_step == 1
    assert report.unclassified_names == ("my_new_fused_thing_v7",)


def test_lm_head_by_vocabulary_shape(tmp_path: Path) -> None:
    """Without module frames, the GEMM whose shape holds the vocabulary size is the lm_head when it is given."""
    path = tmp_path / "nomod.json"
    write_synthetic_trace(path, 100_000, SynthSpec(modules=False, vocab=50000))
    report = analyze_trace(path, vocab_size=50000)
    lm = report.bucket("lm_head")
    assert lm is not None and any(k.via and "vocabulary" in k.via for k in lm.top)


def test_device_choice_and_empty_traces(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match="no kernels on device 5"):
        analyze_trace(fixture("h200_graph"), device=5)
    empty = write_trace(tmp_path / "e.json", [{"ph": "M", "name": "process_name", "pid": 1}])
    with pytest.raises(UserInputError, match="nothing to attribute"):
        analyze_trace(empty)


def test_report_json_round_trips() -> None:
    report = analyze_trace(fixture("h200_eager_planted"))
    data = json.loads(json.dumps(report.to_json()))
    assert data["traced_ms"]["attention"] == pytest.approx(report.bucket("attention").time_us_per_step / 1000)  # type: ignore[union-attr]
    assert len(data["steps"]) == 4


def test_untypical_steps_are_left_out_and_said(tmp_path: Path) -> None:
    """A prefill-like first step (more kernels) is dropped from the per-step means unless all steps are asked for."""
    path = tmp_path / "prefill.json"
    steps, _ = write_synthetic_trace(path, 400_000, SynthSpec(long_first_step=30))
    report = analyze_trace(path)
    assert len(report.steps) == steps - 1 and report.kernels_per_step_mean == 51
    assert any("another kernel count" in n for n in report.notes)
    everything = analyze_trace(path, all_steps=True)
    assert len(everything.steps) == steps and everything.steps[0].kernel_count == 81


def test_allreduce_kernels_are_communication(tmp_path: Path) -> None:
    """No 2-GPU machine was lent for a real NCCL trace: a synthetic TP layer stack carries the NCCL kernel names."""
    path = tmp_path / "tp.json"
    write_synthetic_trace(path, 300_000, SynthSpec(allreduce=True, layers=3))
    comm = analyze_trace(path).bucket("communication")
    assert comm is not None and comm.kernels_per_step == 6
    assert comm.top[0].rule_id == "nccl"


def test_gemms_by_the_models_weight_shapes(tmp_path: Path) -> None:
    """Module frames removed: the budget inventory's (k, n) of the same model's GEMMs attribute them (o_proj,
    down_proj, lm_head; transformers' separate q/k/v and gate/up do not match the fused shapes and fall back)."""
    from decodetop.budget.deployment import Deployment
    from decodetop.budget.inventory import build_inventory
    from decodetop.budget.spec import load_config
    from decodetop.traces import gemm_shapes_from_inventory

    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "model_type": "llama",
                "architectures": ["LlamaForCausalLM"],
                "hidden_size": 2048,
                "intermediate_size": 5632,
                "num_hidden_layers": 4,
                "num_attention_heads": 16,
                "num_key_value_heads": 8,
                "vocab_size": 32000,
                "torch_dtype": "bfloat16",
            }
        )
    )
    inv = build_inventory(load_config(str(config)), Deployment(tp=1))
    shapes = gemm_shapes_from_inventory(inv.ops)
    assert shapes[(5632, 2048)] is Component.DENSE_MLP and shapes[(2048, 32000)] is Component.LM_HEAD
    data = json.loads(gzip.decompress(fixture("h200_eager").read_bytes()))
    data["traceEvents"] = [e for e in data["traceEvents"] if e.get("cat") != "python_function"]
    path = tmp_path / "nomodules.json"
    path.write_text(json.dumps(data))
    report = analyze_trace(path, gemm_shapes=shapes)
    by_shape = {(k.bucket, k.name) for b in report.buckets for k in b.top if k.via and k.via.startswith("weight shape")}
    assert ("lm_head", "nvjet_sm90_tst_256x8_64x6_2x1_v_bz_TNT") in by_shape
    assert any(bucket == "dense_mlp" for bucket, _ in by_shape)
    assert any(bucket == "attention_proj" for bucket, _ in by_shape)
    plain = analyze_trace(path)
    assert all(not (k.via or "").startswith("weight shape") for b in plain.buckets for k in b.top)


def test_moe_block_without_context(tmp_path: Path) -> None:
    """Graph-like MoE layers (no module frames): fused_moe GEMMs are experts by name, the activation between them
    is put with the experts by its block, the router top-k is routing."""
    path = tmp_path / "moe.json"
    write_synthetic_trace(path, 300_000, SynthSpec(moe=True, modules=False, layers=2))
    report = analyze_trace(path)
    experts, routing = report.bucket("routed_experts"), report.bucket("routing")
    assert experts is not None and experts.kernels_per_step == 2 * 3  # 2 fused_moe + 1 activation per layer
    assert any(k.via == "inferred: in an MoE block" for k in experts.top)
    assert routing is not None and routing.kernels_per_step == 2
    assert report.bucket("dense_mlp") is None


@pytest.mark.parametrize(
    ("name", "vocab"),
    [("h200_qwen3moe_eager", 151936), ("h200_mixtral_eager", 32000)],
)
def test_moe_models_are_split_into_their_components(name: str, vocab: int) -> None:
    """Real eager steps of 4-layer Qwen3-235B-A22B- and Mixtral-8x7B-shaped transformers models on an H200
    (benchmarks/fidelity.py, serving-form attention): every class in them carries 'Moe' or lives in an MoE model,
    yet attention, projections, norms, routing and lm_head each get their own share, not routed experts."""
    report = analyze_trace(fixture(name), vocab_size=vocab)
    traced = report.traced_ms()
    for key in ("attention", "attention_proj", "routed_experts", "routing", "norms", "lm_head"):
        assert traced.get(key, 0.0) > 0.03, (key, traced)
    kernel_ms = sum(v for k, v in traced.items() if k != "launch")
    assert traced["routed_experts"] < 0.7 * kernel_ms
