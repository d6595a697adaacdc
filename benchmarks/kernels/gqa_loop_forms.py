"""The GQA decode kernel's loop forms (`gqa.LOOP_FORMS`: the score scale in q, unmasked whole tiles, the lazy
rescale, TMA tiles, the combine's early PDL trigger, and their combinations) beside the loop as it is, timed on one
GPU at Llama-3.1-70B's shard (8 query heads per KV head, head dim 128, one new token), each over a small grid of
launch shapes (`SHAPES`: tiles of 64/128/256 tokens, 1–8 warps, 2–4 stages, 1–6 programs per SM), and the shipped
launch (`default_config`). Each form's best shape at 8 pairs × 32K over FP8 (the case the forms are for: 1.85×
bytes / copy) is then timed at the other cases (`CASES`); over BF16 each form takes the best of `BF16_SHAPES`
(an SM holds fewer BF16 programs). Every timed launch is first checked against the torch form (SDPA over the cache
cast to BF16; rel err in the JSON). CUDA graph replay of calls cycling over copies of the cache, at least
`ROTATE_BYTES` (2 × the H200's 50 MB L2) between two reads of one copy, so each call reads HBM; events, the median
of 15, beside the cache's bytes over the measured copy bandwidth. The kernels are compiled ahead in parallel
processes (`precompile.compile_ahead`), so the sweep fits `--deadline`; rows not started by then are left out.
`--smoke` runs a tiny case of every form and shape under Triton's CPU interpreter (correctness only, no timing).

    PYTHONPATH=src python3 benchmarks/kernels/gqa_loop_forms.py --json $OUT/gqa_loop_forms.json
    PYTHONPATH=src python3 benchmarks/kernels/gqa_loop_forms.py --smoke --json /tmp/gqa_loop_forms_smoke.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

DIM = 128
GROUP = 8
CASES = ((8, 32768, True), (8, 65536, True), (8, 131072, True), (1, 32768, True), (32, 32768, True), (8, 32768, False))
"""(pairs, context, FP8): the whole model's KV heads at batch 1 (32K–128K), Llama-70B's TP-8 shard, batch 4; BF16."""
PICK = CASES[0]
"""The case each form's shape is picked at."""
SHAPES = (  # (block_n, warps, stages, programs per SM): LONG first
    (128, 2, 2, 4), (128, 2, 3, 3), (128, 4, 2, 2), (128, 1, 2, 4), (128, 2, 2, 6),
    (64, 1, 3, 6), (64, 2, 4, 4), (64, 1, 2, 5),
    (256, 4, 2, 1), (256, 8, 2, 1), (256, 2, 2, 1), (256, 4, 3, 1),
)  # fmt: skip
BF16_SHAPES = ((128, 2, 2, 3), (128, 4, 2, 2), (64, 1, 3, 6), (256, 4, 2, 1))
ROTATE_BYTES = 100 * 2**20
OPS = 12
SMOKE_SHAPES = ((128, 2, 2, 4), (64, 1, 3, 6), (256, 4, 2, 1))


def forms() -> dict[str, dict[str, bool]]:
    """The loop as it is, then each form of `gqa.LOOP_FORMS`."""
    from decodetop.probes.worker.kernels import gqa

    return {"loop as is": {}, **gqa.LOOP_FORMS}


def config_of(form: dict[str, bool], shape: tuple[int, int, int, int]) -> Any:
    from decodetop.probes.worker.kernels import gqa

    block_n, warps, stages, per_sm = shape
    return gqa.GqaConfig(block_n, warps, stages, per_sm, f16=True, **form)


class Case:
    """One shape's inputs: q, enough copies of the cache to read past L2 between two reads of one, the scales."""

    def __init__(self, pairs: int, context: int, fp8: bool, device: Any) -> None:
        import torch

        self.pairs, self.context, self.fp8 = pairs, context, fp8
        self.kv_heads = min(pairs, 8)
        self.batch = pairs // self.kv_heads
        self.bytes = 2 * pairs * context * DIM * (1 if fp8 else 2)
        dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
        copies = max(1, -(-ROTATE_BYTES // self.bytes)) if device.type == "cuda" else 1
        shape = (self.batch, self.kv_heads, context, DIM)
        self.q = torch.randn(self.batch, GROUP * self.kv_heads, 1, DIM, device=device).to(torch.bfloat16)
        self.caches = [
            (torch.randn(shape, device=device).to(dtype), torch.randn(shape, device=device).to(dtype))
            for _ in range(copies)
        ]
        self.scales = torch.tensor([0.5, 0.25], device=device) if fp8 else None

    def workspace(self, config: Any) -> Any:
        from decodetop.probes.worker.kernels import gqa

        d = self.q.device
        return gqa.gqa_workspace(
            self.batch, GROUP * self.kv_heads, self.kv_heads, 1, self.context, DIM, d, config=config, fp8=self.fp8
        )

    def rel_err(self, config: Any) -> float:
        from decodetop.probes.worker.kernels import gqa

        k, v = self.caches[0]
        work = self.workspace(config)
        work.out.fill_(float("nan"))
        got = gqa.gqa_decode(self.q, k, v, sm_scale=DIM**-0.5, scales=self.scales, work=work).float()
        want = gqa.reference_gqa(self.q, k, v, sm_scale=DIM**-0.5, scales=self.scales).float()
        return float((got - want).norm() / want.norm())

    def time_us(self, config: Any) -> float:
        """Median µs of one decode in `config`, CUDA graph replay over the cache's copies."""
        from decodetop.probes.worker.kernels import gqa
        from decodetop.probes.worker.timing import capture_graph, time_events

        work = self.workspace(config)
        turn = itertools.cycle(self.caches)
        ops = max(OPS, len(self.caches))

        def once() -> None:
            k, v = next(turn)
            gqa.gqa_decode(self.q, k, v, sm_scale=DIM**-0.5, scales=self.scales, work=work)

        graph = capture_graph(once, ops)
        us = statistics.median(time_events(graph.replay, 1, 15, warmup=2)) / ops
        del graph
        return us


def precompile(configs: list[tuple[tuple[int, int, bool], Any]], deadline_s: float) -> str:
    """Every (case, config)'s split and combine kernels compiled ahead in parallel processes (their launches
    collected on meta tensors of the case's shapes)."""
    import torch

    from decodetop.probes.worker import precompile as pre
    from decodetop.probes.worker.context import ProbeContext
    from decodetop.probes.worker.kernels import gqa

    def builder(case: tuple[int, int, bool], config: Any) -> Any:
        pairs, context, fp8 = case

        def build(ctx: ProbeContext) -> None:
            kv_heads = min(pairs, 8)
            batch = pairs // kv_heads
            dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
            q = torch.empty(batch, GROUP * kv_heads, 1, DIM, device=ctx.device, dtype=torch.bfloat16)
            k = torch.empty(batch, kv_heads, context, DIM, device=ctx.device, dtype=dtype)
            scales = torch.empty(2, device=ctx.device) if fp8 else None
            work = gqa.gqa_workspace(
                batch, GROUP * kv_heads, kv_heads, 1, context, DIM, ctx.device, config=config, fp8=fp8
            )
            gqa.gqa_decode(q, k, k, sm_scale=DIM**-0.5, scales=scales, work=work)

        return build

    ctx = ProbeContext(rank=0, world_size=1, device=torch.device("cuda"), backend="gloo")
    ahead = pre.compile_ahead(ctx, [builder(case, cfg) for case, cfg in configs], deadline_s=deadline_s)
    return ahead.text


def smoke(json_path: Path) -> int:
    """Every form × `SMOKE_SHAPES` at a tiny case (2 pairs of 300 tokens, FP8 and BF16) under the interpreter."""
    import torch

    rows = []
    worst = 0.0
    for fp8 in (True, False):
        case = Case(2, 300, fp8, torch.device("cpu"))
        for (name, form), shape in itertools.product(forms().items(), SMOKE_SHAPES):
            config = config_of(form, shape)
            err = case.rel_err(config)
            worst = max(worst, err)
            rows.append({"form": name, "config": config.label, "fp8": fp8, "rel_err": err})
            print(json.dumps(rows[-1]), flush=True)
    json_path.write_text(json.dumps({"smoke": True, "rows": rows}, indent=1), encoding="utf-8")
    print(f"smoke: {len(rows)} launches, worst rel err {worst:.2e}")
    return 0 if worst < 2e-2 else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--deadline", type=float, default=80.0, help="seconds after which no further timing starts")
    ap.add_argument("--smoke", action="store_true", help="a tiny case of every form under the CPU interpreter")
    args = ap.parse_args(argv)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported
        return smoke(args.json)
    start = time.monotonic()
    stop = start + args.deadline
    import torch
    from gqa_split_rules import copy_gbps, kernel_resources  # this directory's

    from decodetop.probes.worker.kernels import gqa

    d = torch.device("cuda")
    copy = copy_gbps()
    shipped = {case: gqa.default_config(case[1], "fp8" if case[2] else "bf16") for case in CASES}
    first = [(PICK, config_of(f, s)) for f, s in itertools.product(forms().values(), SHAPES)]
    ahead = [precompile([*first, *shipped.items()], 0.3 * args.deadline)]
    print(ahead[-1], flush=True)
    rows: list[dict[str, Any]] = []
    cases = {case: Case(*case, d) for case in CASES[:1]}

    def timed(case_key: tuple[int, int, bool], form: str, config: Any) -> dict[str, Any] | None:
        if time.monotonic() > stop:
            return None
        if case_key not in cases:
            cases.clear()
            torch.cuda.empty_cache()
            cases[case_key] = Case(*case_key, d)
        case = cases[case_key]
        row: dict[str, Any] = {"pairs": case.pairs, "context": case.context, "kv": "fp8" if case.fp8 else "bf16"}
        row |= {"form": form, "config": config.label, "bytes_us": case.bytes / copy / 1e3}
        try:
            row["rel_err"] = case.rel_err(config)
            row["us"] = case.time_us(config)
            row["x_bytes"] = row["us"] / row["bytes_us"]
        except Exception as exc:  # a form or shape that does not compile or run is a row, not the end
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        rows.append(row)
        print(json.dumps(row), flush=True)
        return row

    best: dict[str, Any] = {}
    timed(PICK, "shipped", shipped[PICK])
    for name, form in forms().items():  # each form's best shape at the case it is for
        configs = {config_of(form, shape).label: config_of(form, shape) for shape in SHAPES}
        got = [timed(PICK, name, config) for config in configs.values()]
        ok = [r for r in got if r is not None and "us" in r and r["rel_err"] < 2e-2]
        if ok:
            best[name] = configs[min(ok, key=lambda r: r["us"])["config"]]
    later = [(case, best[name]) for case in CASES[1:] if case[2] for name in best]
    later += [
        (case, config_of(forms()[name], b)) for case in CASES if not case[2] for name in best for b in BF16_SHAPES
    ]
    ahead.append(precompile(later, max(5.0, 0.8 * (stop - time.monotonic()))))
    print(ahead[-1], flush=True)
    for case in CASES[1:]:
        timed(case, "shipped", shipped[case])
        for name, form in forms().items():
            if name not in best:
                continue
            if case[2]:
                timed(case, name, best[name])
            else:
                for shape in BF16_SHAPES:
                    timed(case, name, config_of(form, shape))
    resources = kernel_resources()
    out = {
        "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "copy_gbps": copy, "precompile": ahead,
        "wall_s": time.monotonic() - start, "rows": rows, "kernels": resources,
        "best_shapes": {name: cfg.label for name, cfg in best.items()},
    }  # fmt: skip
    args.json.write_text(json.dumps(out, indent=1), encoding="utf-8")
    print_table(rows, copy)
    return 0


def print_table(rows: list[dict[str, Any]], copy: float) -> None:
    """The best µs (× bytes/copy) of each form at each case, and the shape it took at the pick case."""
    cols = [f"{p}×{c // 1024}K {'FP8' if f else 'BF16'}" for p, c, f in CASES]
    print(f"\ncopy {copy:.0f} GB/s; µs (× bytes / copy) of the best shape timed; shape at {cols[0]}")
    print("| form | " + " | ".join(cols) + " | shape |")
    print("|---|" + "---|" * (len(cols) + 1))
    for form in ["shipped", *forms()]:
        cells, shape = [], ""
        for p, c, f in CASES:
            mine = [r for r in rows if (r["form"], r["pairs"], r["context"], r["kv"] == "fp8") == (form, p, c, f)]
            mine = [r for r in mine if "us" in r and r["rel_err"] < 2e-2]
            top = min(mine, key=lambda r: r["us"]) if mine else None
            cells.append(f"{top['us']:.1f} ({top['x_bytes']:.2f}×)" if top else "–")
            if top and (p, c, f) == PICK:
                shape = top["config"].split(",")[0]
        print(f"| {form} | " + " | ".join(cells) + f" | {shape} |")
    bad = [r for r in rows if "error" in r or r.get("rel_err", 0.0) >= 2e-2]
    for r in bad:
        print(f"failed: {r['form']} [{r['config']}] {r['pairs']}×{r['context']} {r['kv']}: "
              f"{r.get('error', r.get('rel_err'))}")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
