"""Why a plan's launch figure moves between runs: a CUDA graph's per-node replay cost against the SM clock, and the
launch probe's figure in a plan that runs first against plans run right after another plan's GEMMs.

Run on a GPU machine from the repository root (read-only towards the GPU: NVML's SM clock is read, never set):

    PYTHONPATH=src python3 benchmarks/whatif/launch_drift.py            # both parts, one GPU, about 60 s
    PYTHONPATH=src python3 benchmarks/whatif/launch_drift.py --part clock

- clock: 32- and 512-node graphs of empty kernels replayed 30 times each after 2 s idle, right after 0.3 s of BF16
  8192² matmuls, and after 0.5 s idle; each line says the SM clock before and after and the per-node slope
  between the two graphs.
- plans: the Llama-3.1-70B (4 layers) base plan of the what-if campaign (TP 1, batch 1, 4K, with its curves), then
  a direct plan at each of the campaign's scenarios (`benchmarks/whatif/whatif.py`), one after another; each line
  says the launch row predicted from the base plan and the launch row of the direct plan, with the per-kernel cost.

The figures and what they mean for the budget's launch range are in docs/benchmarks.md ("Launch cost between runs").
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any


def clock_part() -> None:
    """The per-node slope of graph replay after idle and after matmuls, beside the SM clock."""
    import pynvml
    import torch

    from decodetop.probes.worker.launch import _empty_kernel
    from decodetop.probes.worker.timing import capture_graph, time_host

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)

    def clock() -> int:
        return int(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))

    graphs = {n: capture_graph(_empty_kernel, n, warmup=1) for n in (32, 512)}
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)

    def busy(seconds: float) -> None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            a @ a
        torch.cuda.synchronize()

    def measure(tag: str) -> None:
        before = clock()
        med = {
            n: statistics.median(time_host(g.replay, 1, 30, warmup=3, sync=torch.cuda.synchronize))
            for n, g in graphs.items()
        }
        slope = (med[512] - med[32]) / (512 - 32)
        print(
            f"{tag:28s} clock {before:5d}->{clock():5d} MHz  512 nodes {med[512]:7.1f} us  slope {slope:.3f} us/node",
            flush=True,
        )

    for i in range(3):
        time.sleep(2.0)
        measure(f"after 2 s idle #{i}")
    for i in range(3):
        busy(0.3)
        measure(f"after 0.3 s matmul #{i}")
    for i in range(2):
        time.sleep(0.5)
        measure(f"after 0.5 s idle #{i}")


def plans_part(device: str, tiny: bool) -> None:
    """The base plan's launch row, predicted at each scenario, against each direct plan's own."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import whatif
    from decodetop.budget.compose import Budget
    from decodetop.budget.deployment import Deployment
    from decodetop.pipeline.composition import compose
    from decodetop.pipeline.context import BudgetContext
    from decodetop.pipeline.plan_runner import PlanRunner
    from decodetop.probes.controller import ProbeController

    def launch(budget: Budget) -> str:
        seg = budget.segment("launch")
        return "-" if seg is None or seg.ms is None else f"{seg.ms:.4f} ms: {seg.reason}"

    with ProbeController(device=device, cpu_ranks=1) as pc:
        runner: Any = PlanRunner(lambda: pc, timeout_s=300)
        spec = whatif.model_spec("llama-3.1-70b", 4, tiny=tiny)
        mode = "graph" if pc.layout.kind == "cuda" else "eager"
        base_dep = Deployment(tp=1, batch=1, context_len=64 if tiny else 4096, kv_dtype="bf16", launch_mode=mode)
        base = whatif._plan(runner, pc, whatif._scenario(spec, base_dep), sweeps=True, log=lambda _s: None)
        print("base", launch(base.budget), flush=True)
        for sc in whatif.SCENARIOS:
            if sc.moe_only:
                continue
            scenario = whatif._scenario(spec, sc.deployment(base_dep))
            predicted = compose(BudgetContext(scenario, base.results, group_kind=pc.layout.kind)).budget
            direct = whatif._plan(runner, pc, scenario, sweeps=False, log=lambda _s: None)
            print(f"{sc.name:30s} predicted {launch(predicted)} | direct {launch(direct.budget)}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--part", choices=("clock", "plans", "both"), default="both", help="what to time")
    parser.add_argument("--device", default="cuda", help="the plans part's ranks: cuda or cpu (default cuda)")
    parser.add_argument("--tiny", action="store_true", help="the plans part on a tiny Llama (a CPU smoke run)")
    args = parser.parse_args(argv)
    if args.part in ("clock", "both"):
        clock_part()
    if args.part in ("plans", "both"):
        plans_part(args.device, args.tiny)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
