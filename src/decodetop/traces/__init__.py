"""Provides profiler-trace reading, decode-step segmentation and kernel attribution (stdlib only).

Public API (what the TUI and the `trace` command call):

- `analyze_trace(path, *, rules_path=None, device=None, vocab_size=None, top_n=15, all_steps=False,
  gemm_shapes=None) -> TraceReport` (gemm_shapes: `gemm_shapes_from_inventory(inventory.ops)`)
- `compare(report, budget) -> Comparison` (budget: a `Budget`, `decodetop budget --json` output, or {component: ms})
- `capture(url, *, steps=5, output_dir=None, engine="auto", timeout_s=120.0, ...) -> CaptureResult`
- `read_trace(path) -> Trace` (the streaming reader), `load_rules(path=None) -> RuleSet` (the classification table)
"""

from __future__ import annotations

from decodetop.traces.analysis import analyze, analyze_trace, gemm_shapes_from_inventory
from decodetop.traces.capture import CaptureResult, capture
from decodetop.traces.classify import RuleSet, load_rules
from decodetop.traces.compare import compare, short_name
from decodetop.traces.reader import Trace, read_trace
from decodetop.traces.trace_report import BucketTime, Comparison, ComparisonRow, KernelStat, StepSummary, TraceReport

__all__ = [
    "BucketTime",
    "CaptureResult",
    "Comparison",
    "ComparisonRow",
    "KernelStat",
    "RuleSet",
    "StepSummary",
    "Trace",
    "TraceReport",
    "analyze",
    "analyze_trace",
    "capture",
    "compare",
    "gemm_shapes_from_inventory",
    "load_rules",
    "read_trace",
    "short_name",
]
