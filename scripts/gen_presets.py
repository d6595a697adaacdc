#!/usr/bin/env python3
"""Generate decodetop's model presets (src/decodetop/budget/presets/*.json) from the real HF configs.

Input: docs/reference/model_configs.json (verbatim config.json keys of each checkpoint, plus `_`-prefixed
annotations; see docs/reference/models.md). Each preset file holds that checkpoint's `config` (verbatim keys
only) and, where the checkpoint has one, its `hf_quant_config`, so a preset goes through exactly the same reader as
`--config DIR`.

Some reference entries summarise a long exclusion list by pattern, with `N` standing for a layer index and a count
(e.g. `"model.layers.N.self_attn.o_proj": 79`). This script expands `N` back into the layer indices the count
implies for that architecture (all layers incl. MTP, the main layers, the MoE layers incl. MTP, or the MTP layer
alone) and fails when a count fits none of them, rather than guess.

Usage: python3 scripts/gen_presets.py [--reference PATH] [--out DIR] [--check]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_REFERENCE = ROOT / "docs" / "reference" / "model_configs.json"
DEFAULT_OUT = ROOT / "src" / "decodetop" / "budget" / "presets"


def verbatim(entry: dict[str, Any]) -> dict[str, Any]:
    """The config.json keys of a reference entry (annotations start with `_`)."""
    return {k: v for k, v in entry.items() if not k.startswith("_")}


def expand(patterns: dict[str, int], config: dict[str, Any]) -> list[str]:
    """Expand `model.layers.N.<x>` pattern summaries into the concrete module names their counts imply."""
    n_layers = int(config["num_hidden_layers"])
    n_mtp = int(config.get("num_nextn_predict_layers") or 0)
    first_dense = int(config.get("first_k_dense_replace") or 0)
    total = n_layers + n_mtp
    candidates = [
        ("all layers incl. MTP", list(range(total))),
        ("main layers", list(range(n_layers))),
        ("MoE layers incl. MTP", list(range(first_dense, total))),
        ("MoE layers", list(range(first_dense, n_layers))),
    ]
    if n_mtp:
        candidates.append(("MTP layer", list(range(n_layers, total))))
    out: list[str] = []
    for pattern, count in patterns.items():
        if ".N." not in pattern and not pattern.endswith(".N"):
            if count != 1:
                raise SystemExit(f"pattern {pattern!r} has no N but count {count}")
            out.append(pattern)
            continue
        for _label, layers in candidates:
            if len(layers) == count:
                out.extend(pattern.replace(".N.", f".{i}.") for i in layers)
                break
        else:
            raise SystemExit(f"pattern {pattern!r}: count {count} matches no layer set of this model")
    return out


def presets(ref: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every preset, keyed by its name."""
    out: dict[str, dict[str, Any]] = {}

    def plain(name: str, repo: str, display: str, notes: str = "") -> None:
        entry = ref[repo]
        out[name] = {
            "display_name": display,
            "hf_repo": repo,
            "sources": [entry["_source"]],
            "notes": notes or entry.get("_notes", "") or entry.get("_confidence", ""),
            "config": verbatim(entry),
            "hf_quant_config": None,
        }

    plain("glm-5", "zai-org/GLM-5", "GLM-5")
    plain("glm-4.5", "zai-org/GLM-4.5", "GLM-4.5", ref["zai-org/GLM-4.5"]["_confidence"])
    plain("deepseek-v3", "deepseek-ai/DeepSeek-V3", "DeepSeek-V3")
    plain("deepseek-r1", "deepseek-ai/DeepSeek-R1", "DeepSeek-R1")
    plain("kimi-k2", "moonshotai/Kimi-K2-Instruct", "Kimi-K2-Instruct")
    plain("qwen3-235b-a22b", "Qwen/Qwen3-235B-A22B", "Qwen3-235B-A22B")
    plain("llama-3.1-70b", "meta-llama/Llama-3.1-70B", "Llama-3.1-70B")
    plain("llama-3.1-405b", "meta-llama/Llama-3.1-405B", "Llama-3.1-405B")
    plain("gpt-oss-120b", "openai/gpt-oss-120b", "gpt-oss-120b")
    plain("mixtral-8x7b", "mistralai/Mixtral-8x7B-v0.1", "Mixtral-8x7B-v0.1")

    glm5 = verbatim(ref["zai-org/GLM-5"])
    fp8 = ref["zai-org/GLM-5-FP8"]
    qc = dict(fp8["quantization_config"])
    qc["modules_to_not_convert"] = expand(fp8["_quantization_config_modules_to_not_convert_summary"]["patterns"], glm5)
    out["glm-5-fp8"] = {
        "display_name": "GLM-5-FP8",
        "hf_repo": "zai-org/GLM-5-FP8",
        "sources": [fp8["_source"], ref["zai-org/GLM-5"]["_source"]],
        "notes": fp8["_notes"] + " modules_to_not_convert re-expanded from the pattern summary by gen_presets.py.",
        "config": {**glm5, "quantization_config": qc},
        "hf_quant_config": None,
    }

    nv = ref["nvidia/GLM-5-NVFP4"]
    hq = json.loads(json.dumps(nv["_hf_quant_config.json"]))
    hq["quantization"]["exclude_modules"] = expand(nv["_hf_quant_config_exclude_modules_summary"]["patterns"], glm5)
    out["glm-5-nvfp4"] = {
        "display_name": "GLM-5-NVFP4",
        "hf_repo": "nvidia/GLM-5-NVFP4",
        "sources": [nv["_source"]],
        "notes": nv["_notes"] + " exclude_modules re-expanded from the pattern summary by gen_presets.py.",
        "config": glm5,
        "hf_quant_config": hq,
    }

    qwen = verbatim(ref["Qwen/Qwen3-235B-A22B"])
    qfp8 = ref["Qwen/Qwen3-235B-A22B-FP8"]
    out["qwen3-235b-a22b-fp8"] = {
        "display_name": "Qwen3-235B-A22B-FP8",
        "hf_repo": "Qwen/Qwen3-235B-A22B-FP8",
        "sources": [qfp8["_source"], ref["Qwen/Qwen3-235B-A22B"]["_source"]],
        "notes": qfp8["_notes"] + " (lm_head, norms and routers stay BF16 in decodetop whatever the list says).",
        "config": {**qwen, "quantization_config": qfp8["quantization_config"]},
        "hf_quant_config": None,
    }

    others = ref["_other_quantized_checkpoints_hf_quant_config"]

    def modelopt(name: str, repo: str, display: str, base_repo: str, note: str) -> None:
        entry = others[repo]
        # The base repo's own quantization_config (DeepSeek-V3's FP8) is not this checkpoint's: drop it.
        base = {k: v for k, v in verbatim(ref[base_repo]).items() if k != "quantization_config"}
        hq = {k: v for k, v in entry.items() if not k.startswith("_")}
        hq = json.loads(json.dumps(hq))
        hq["quantization"]["exclude_modules"] = expand(entry["_exclude_modules_patterns"], base)
        out[name] = {
            "display_name": display,
            "hf_repo": repo,
            "sources": [entry["_source"], ref[base_repo]["_source"]],
            "notes": note,
            "config": base,
            "hf_quant_config": hq,
        }

    modelopt(
        "qwen3-235b-a22b-nvfp4",
        "nvidia/Qwen3-235B-A22B-NVFP4",
        "Qwen3-235B-A22B-NVFP4",
        "Qwen/Qwen3-235B-A22B",
        "config.json taken from Qwen/Qwen3-235B-A22B (the same architecture); hf_quant_config.json from nvidia.",
    )
    modelopt(
        "deepseek-v3.1-nvfp4",
        "nvidia/DeepSeek-V3.1-NVFP4",
        "DeepSeek-V3.1-NVFP4",
        "deepseek-ai/DeepSeek-V3",
        "config.json taken from DeepSeek-V3 (V3.1 keeps the V3 architecture; its own config.json was not read); "
        "hf_quant_config.json from nvidia/DeepSeek-V3.1-NVFP4.",
    )
    modelopt(
        "llama-3.1-70b-fp8",
        "nvidia/Llama-3.1-70B-Instruct-FP8",
        "Llama-3.1-70B-FP8",
        "meta-llama/Llama-3.1-70B",
        "config.json taken from meta-llama/Llama-3.1-70B (Instruct has the same architecture); hf_quant_config.json "
        "from nvidia/Llama-3.1-70B-Instruct-FP8.",
    )
    for body in out.values():
        body["generated_by"] = "scripts/gen_presets.py from docs/reference/model_configs.json"
    return out


def render(body: dict[str, Any]) -> str:
    """Stable file text."""
    return json.dumps(body, indent=1, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write (or with --check, compare) every preset file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference", type=Path, default=DEFAULT_REFERENCE)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--check", action="store_true", help="fail if a preset file differs from what it would be")
    args = parser.parse_args(argv)
    ref = json.loads(args.reference.read_text(encoding="utf-8"))
    generated = presets(ref)
    stale: list[str] = []
    args.out.mkdir(parents=True, exist_ok=True)
    for name, body in sorted(generated.items()):
        path = args.out / f"{name}.json"
        text = render(body)
        if args.check:
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        else:
            path.write_text(text, encoding="utf-8")
    if args.check:
        extra = sorted({p.stem for p in args.out.glob("*.json")} - set(generated))
        if stale or extra:
            print(f"stale presets: {stale}; unexpected files: {extra}", file=sys.stderr)
            return 1
        print(f"{len(generated)} presets up to date")
        return 0
    print(f"wrote {len(generated)} presets to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
