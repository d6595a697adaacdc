"""`decodetop budget`: output, JSON, errors (exit code 2, one line naming file and key), import hygiene."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from decodetop.budget.spec import PRESET_DIR
from decodetop.cli import main
from tests.budget.test_spec import TINY_LLAMA

ROOT = Path(__file__).resolve().parents[2]


def test_text_output_glm5_nvfp4(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["budget", "--model", "glm-5-nvfp4", "--tp", "8", "--gpu", "rtx-pro-6000"]) == 0
    out = capsys.readouterr().out
    assert "743.9 B total, 40.83 B active" in out
    assert "157 × 12 KiB (156 in the layers + 1 after the embedding)" in out
    assert "Roofline on NVIDIA RTX PRO 6000 Blackwell (--gpu), 1792 GB/s" in out
    assert "unexplained" in out and "target 309 tok/s = 3.24 ms/step" in out
    assert "observed 95.0 ms assumed, not observed (the default: no --observed-ms and no --server)" in out
    assert "TP 8 (--tp)" in out
    assert "q_a+kv_a_proj (replicated)" in out  # the inventory, grouped by component
    assert "Assumptions" in out


def test_json_output(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        [
            "budget",
            "--model",
            "deepseek-v3",
            "--tp",
            "8",
            "--gpu",
            "h200",
            "--json",
            "--plan",
            "--observed-ms",
            "20",
            "--target-tps",
            "100",
        ]
    )
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    assert data["deployment"]["tp"] == 8
    assert data["per_gpu"]["all_reduce"] == {"14336": 123}
    assert data["roofline"]["mem_bandwidth_gbps"] == 4800
    assert data["budget"]["observed_ms"] == 20
    assert data["budget"]["target_ms"] == pytest.approx(10.0)
    assert data["budget"]["unexplained_ms"] == pytest.approx(20 - data["budget"]["total_ms"])
    assert {s["status"] for s in data["budget"]["segments"]} == {"estimated"}
    assert "moe" in data["plan"]["probes"]
    assert data["model"]["params_total"] == pytest.approx(671.03e9, rel=1e-4)


def test_measured_bandwidth_and_latency_override(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        [
            "budget",
            "--model",
            "llama-3.1-70b",
            "--tp",
            "4",
            "--gpu",
            "h100",
            "--bandwidth-tbps",
            "2.5",
            "--allreduce-us",
            "7",
            "--json",
        ]
    )
    assert rc == 0
    roof = json.loads(capsys.readouterr().out)["roofline"]
    assert roof["mem_bandwidth_gbps"] == 2500
    assert roof["bandwidth_source"].startswith("measured")
    assert roof["allreduce_latency_us"] == 7


def test_config_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    preset = json.loads((PRESET_DIR / "gpt-oss-120b.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(preset["config"]))
    assert main(["budget", "--config", str(tmp_path), "--tp", "4", "--gpu", "b200", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["model"]["model_type"] == "gpt_oss"
    assert "MXFP4" in data["model"]["quantization"]


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("{not json", "not valid JSON"),
        ("[]", "expected a JSON object"),
        (json.dumps({k: v for k, v in TINY_LLAMA.items() if k != "hidden_size"}), "hidden_size: missing"),
        (json.dumps({**TINY_LLAMA, "num_attention_heads": -4}), "num_attention_heads: -4 is out of range"),
        (json.dumps({**TINY_LLAMA, "vocab_size": 10**12}), "vocab_size"),
        (json.dumps({**TINY_LLAMA, "model_type": "t5"}), "model_type: 't5' is not a family"),
        (
            json.dumps({**TINY_LLAMA, "quantization_config": {"quant_method": "bitsandbytes"}}),
            "quantization_config.quant_method: 'bitsandbytes'",
        ),
    ],
)
def test_malformed_config_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, fragment: str
) -> None:
    path = tmp_path / "config.json"
    path.write_text(content)
    assert main(["budget", "--config", str(path), "--tp", "2", "--gpu", "h100"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert str(path) in err
    assert fragment in err


def test_malformed_hf_quant_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA))
    (tmp_path / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "INT8_SQ"}}))
    assert main(["budget", "--config", str(tmp_path), "--tp", "2", "--gpu", "h100"]) == 2
    err = capsys.readouterr().err.strip()
    assert "hf_quant_config.json: quantization.quant_algo" in err


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--model", "glm-9"], "unknown preset"),
        (["--tp", "3"], "--tp"),
        (["--gpu", "voodoo"], "--gpu: unknown GPU"),
        (["--bandwidth-tbps", "-1"], "--bandwidth-tbps"),
        (["--config", "/nonexistent/dir"], "no such file"),
        (["--model", "kimi-k2", "--accept-length", "2"], "MTP"),
    ],
)
def test_bad_flags_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str], fragment: str) -> None:
    base = ["budget", "--gpu", "h200"] if "--gpu" not in argv else ["budget"]
    if "--tp" not in argv:
        base += ["--tp", "8"]
    assert main(base + argv) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and "\n" not in err


def test_list_models(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["budget", "--list-models"]) == 0
    assert "glm-5-nvfp4" in capsys.readouterr().out.split()


def test_budget_command_imports_neither_torch_nor_textual() -> None:
    """Acceptance: the budget command runs without importing torch or textual (a fresh interpreter)."""
    code = (
        "import sys, io, contextlib\n"
        "from decodetop.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    rc = main(['budget', '--model', 'glm-5-nvfp4', '--tp', '8', '--gpu', 'rtx-pro-6000'])\n"
        "assert rc == 0\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'textual', 'rich')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60, cwd=ROOT
    ).stdout
    assert out.strip() == "[]"


def test_defaults_without_nvml(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from decodetop.commands import budget as command

    monkeypatch.setattr(command._GpuFacts, "count", lambda self: 0)
    monkeypatch.setattr(command._GpuFacts, "gpu0_name", lambda self: None)
    assert main(["budget", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["model"]["name"] == "GLM-5-NVFP4"
    assert (data["deployment"]["tp"], data["deployment"]["tp_source"]) == (1, "default: no probe group; pass --tp")
    assert data["roofline"]["hardware"] == "NVIDIA RTX PRO 6000 Blackwell (assumed: no --gpu and no GPU seen)"
    assert data["budget"]["observed"]["assumed"] is True


def test_tp_and_bandwidth_from_nvml(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from decodetop.commands import budget as command

    monkeypatch.setattr(command._GpuFacts, "count", lambda self: 2)
    monkeypatch.setattr(command._GpuFacts, "gpu0_name", lambda self: "NVIDIA H200")
    assert main(["budget", "--model", "llama-3.1-70b", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["deployment"]["tp"], data["deployment"]["tp_source"]) == (
        2,
        "default: the 2 GPUs seen by NVML",
    )
    assert data["roofline"]["mem_bandwidth_gbps"] == 4800  # the datasheet's, as the live UI uses for the same GPU
    assert data["roofline"]["hardware"] == "NVIDIA H200 141GB (detected by NVML)"
    assert data["roofline"]["allreduce_latency_us"] == 14.0  # NVLink default from the H200 row


def test_warns_when_weights_do_not_fit(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["budget", "--model", "glm-5", "--tp", "8", "--gpu", "rtx-pro-6000"]) == 0
    assert "do not fit in the 96 GiB" in capsys.readouterr().out
    assert main(["budget", "--model", "glm-5-nvfp4", "--tp", "8", "--gpu", "rtx-pro-6000"]) == 0
    assert "do not fit" not in capsys.readouterr().out


# --------------------------------------------------------------------------------------------- --diff


def test_diff_of_two_real_plan_files(capsys: pytest.CaptureFixture[str]) -> None:
    from tests.budget.test_diff import PLAN_X1, PLAN_X2

    assert main(["budget", "--diff", str(PLAN_X2), str(PLAN_X1)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == f"vs baseline {PLAN_X2} (Llama-3.1-70B): ms per decode step"
    assert lines[1].split() == ["component", "before", "ms", "after", "ms", "Δ", "ms", "×", "noise", "ms", "note"]
    assert lines[3].split() == ["dense", "MLP", "14.0", "15.0", "+1.03", "1.07", "0.419", "moved", "▲"]
    assert any(line.startswith("all-reduce / all-to-all") and "missing" in line for line in lines)
    assert lines[-1] == "moved most: dense MLP (+1.03 ms, ×1.1)"


def test_diff_finds_a_planted_slowdown_and_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.budget.test_diff import compose_h200x2

    old, new = tmp_path / "clean.json", tmp_path / "planted.json"
    old.write_text(json.dumps({"budget": compose_h200x2().to_dict()}))
    planted = compose_h200x2(scale=lambda key: 1.6 if key.startswith("attention:") else 1.0)
    new.write_text(json.dumps(planted.to_dict()))  # a bare budget works as well as a document holding one
    assert main(["budget", "--diff", str(old), str(new)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[3].startswith("attention ") and "moved ▲" in out.splitlines()[3]
    assert out.rstrip().splitlines()[-1].startswith("moved most: attention (+0.")
    assert main(["budget", "--diff", str(old), str(new), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["baseline_path"], data["current_path"], data["moved_most"]) == (str(old), str(new), "attention")
    assert [c["component"] for c in data["components"] if c["significant"]] == ["attention"]


def test_diff_against_a_roofline_only_budget(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`decodetop budget --json` output reads as a budget; its estimates compare with estimates only."""
    from tests.budget.test_diff import PLAN_X2

    estimates = []
    for bandwidth in ("4.8", "2.4"):  # the H200's HBM, then half of it
        argv = ["budget", "--model", "llama-3.1-70b", "--tp", "2", "--gpu", "h200", "--bandwidth-tbps", bandwidth]
        assert main([*argv, "--json"]) == 0
        estimates.append(tmp_path / f"roofline-{bandwidth}.json")
        estimates[-1].write_text(capsys.readouterr().out)
    assert main(["budget", "--diff", str(estimates[0]), str(PLAN_X2)]) == 0
    out = capsys.readouterr().out
    assert out.count("estimate vs measured") == 7 and "note:" not in out  # same model and deployment string
    assert out.rstrip().endswith("no component moved beyond its noise")
    assert main(["budget", "--diff", str(estimates[0]), str(estimates[1])]) == 0
    assert "moved most: dense MLP (+" in capsys.readouterr().out  # the largest weight stream, at half the bandwidth


def test_diff_of_budgets_that_do_not_compare_says_what_differs_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Another model and TP, or a CPU-measured budget against an H200 roofline of the same model: one line naming
    what differs, no table and no headline; the JSON says it too, with no component; exit 2."""
    from tests.budget.test_diff import PLAN_X2

    files = {}
    for name, argv in {
        "glm5-tp8": ["--model", "glm-5", "--tp", "8", "--gpu", "h200"],
        "llama-tp2-h200": ["--model", "llama-3.1-70b", "--tp", "2", "--gpu", "h200"],
    }.items():
        assert main(["budget", *argv, "--json"]) == 0
        files[name] = tmp_path / f"{name}.json"
        files[name].write_text(capsys.readouterr().out)
    cpu = json.loads(PLAN_X2.read_text())  # the same model and TP, measured on CPU ranks
    cpu["budget"].update(device_kind="cpu", hardware="n/a on CPU")
    files["llama-tp2-cpu"] = tmp_path / "cpu.json"
    files["llama-tp2-cpu"].write_text(json.dumps(cpu))

    assert main(["budget", "--diff", str(files["llama-tp2-h200"]), str(files["glm5-tp8"])]) == 2
    out = capsys.readouterr().out
    assert out == (
        f"vs baseline {files['llama-tp2-h200']}: not comparable: model Llama-3.1-70B vs GLM-5; TP 2 vs 8 (baseline "
        "vs now): a per-component diff needs the same model, TP, hardware and device kind\n"
    )
    assert main(["budget", "--diff", str(files["llama-tp2-cpu"]), str(files["llama-tp2-h200"])]) == 2
    out = capsys.readouterr().out
    assert "not comparable: device kind cpu vs cuda; hardware n/a on CPU vs NVIDIA H200 141GB" in out
    assert "moved" not in out and "no component" not in out
    assert main(["budget", "--diff", str(files["llama-tp2-cpu"]), str(files["llama-tp2-h200"]), "--json"]) == 2
    data = json.loads(capsys.readouterr().out)
    assert data["comparable"] is False and data["components"] == [] and data["moved_most"] is None
    assert data["not_comparable"] == ["device kind cpu vs cuda", "hardware n/a on CPU vs NVIDIA H200 141GB"]


def test_diff_bad_file_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.budget.test_diff import PLAN_X2

    bad = tmp_path / "bad.json"
    bad.write_text('{"budget": {"segments": [{"component": "attention", "ms": "slow"}]}}')
    assert main(["budget", "--diff", str(bad), str(PLAN_X2)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"decodetop: error: {bad}: budget segment 'attention': 'ms' is 'slow', not a number from 0 to 3,600,000 ms\n"
    )
    assert main(["budget", "--diff", str(PLAN_X2), str(tmp_path / "gone.json")]) == 2
    assert "gone.json: cannot read: No such file or directory" in capsys.readouterr().err
    assert main(["budget", "--model", "glm-5", "--diff", str(PLAN_X2), str(PLAN_X2)]) == 2
    assert "--diff compares two files: give it without --model" in capsys.readouterr().err
