"""The custom all-reduce segment against an independent one-shot timing (engine kernels, part a).

Probe side: the `allreduce` probe with `impls=["one_shot"]`, graph mode — the points the budget's all-reduce
curve takes under `--allreduce auto` below the engines' 8 MiB limit — the slowest rank's median per size.
Independent side: this file's own ranks (fresh processes, TCP rendezvous, no decodetop code in the timed path): one
symmetric buffer per rank from `torch.distributed._symmetric_memory`, `torch.ops.symm_mem.one_shot_all_reduce`
captured 20 times into one CUDA graph, the graph replayed 50 times back to back between two CUDA events,
time / 1000 — the method of the 2 × H200 reading (NCCL 11.1–19.1 µs vs one-shot 6.2–13.1 µs at 8 B–1 MiB).
Rounds alternate the two sides. Expected: within 15 % at 8 B–1 MiB on 2 GPUs.

NVLink multicast stays off (`TORCH_SYMM_MEM_DISABLE_MULTICAST=1` in both sides' ranks). Without two GPUs the probe
says why the kernel cannot run and the independent side is skipped: the table says so.

    PYTHONPATH=src python3 benchmarks/engine/allreduce_oneshot.py --json $OUT/engine_allreduce_oneshot.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from decodetop.probes.protocol import RANK_ENV_DEFAULTS

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "accuracy"))

from accuracy import free_port, gather_ranks

#: Sizes compared (bytes): the issue's range, 8 B–1 MiB, with the 16 KiB and 128 KiB points of the H200 reading.
SIZES = (8, 1024, 16 * 1024, 128 * 1024, 1024 * 1024)
#: Ops per captured graph and replays per timing (the H200 reading: "CUDA graph of 20 ops, 50 back-to-back replays").
GRAPH_OPS = 20
REPLAYS = 50
#: Agreement the acceptance asks for.
TOLERANCE = 0.15


def _oneshot_rank(rank: int, world: int, port: int, sizes: Sequence[int], q: Any) -> None:
    """One rank of the independent one-shot timing: own process group, own symmetric buffer, own graph."""
    for key, value in RANK_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available():
        q.put((rank, {"error": "no CUDA: the one-shot kernel needs GPUs"}))
        return
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    out: dict[str, Any] = {}
    try:
        import torch.distributed._symmetric_memory as symm_mem

        name = dist.group.WORLD.group_name  # type: ignore[union-attr]
        if hasattr(symm_mem, "enable_symm_mem_for_group"):
            symm_mem.enable_symm_mem_for_group(name)
        numel = max(sizes) // 2
        buf = symm_mem.empty(numel, dtype=torch.bfloat16, device=f"cuda:{rank}")
        buf.fill_(rank + 1)
        symm_mem.rendezvous(buf, name)
        dist.barrier()
        for size in sizes:
            n = max(1, size // 2)
            view = buf[:n]
            got = torch.ops.symm_mem.one_shot_all_reduce(view, "sum", name)
            torch.cuda.synchronize()
            if not bool((got == world * (world + 1) / 2).all()):
                out[str(size)] = {"error": "wrong sum"}
                continue
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    torch.ops.symm_mem.one_shot_all_reduce(view, "sum", name)
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(GRAPH_OPS):
                    torch.ops.symm_mem.one_shot_all_reduce(view, "sum", name)
            samples = []
            for _ in range(3):  # three timings; the median is kept
                graph.replay()
                torch.cuda.synchronize()
                dist.barrier()
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(REPLAYS):
                    graph.replay()
                end.record()
                torch.cuda.synchronize()
                samples.append(start.elapsed_time(end) * 1e3 / (REPLAYS * GRAPH_OPS))
            graph.reset()
            out[str(size)] = {"graph_us": statistics.median(samples)}
        del buf
        torch.cuda.synchronize()
    except Exception as exc:  # one line back to the table, never a hang
        out["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    q.put((rank, out))
    q.close()
    q.join_thread()  # the result is on the pipe before the hard exit
    os._exit(0)  # destroy_process_group can hang after graph-captured collectives (h200 notes)


def independent_oneshot(world: int, sizes: Sequence[int], timeout_s: float = 180.0) -> dict[str, Any]:
    """Per size, the slowest rank's µs from `world` fresh processes."""
    port = free_port()
    got = gather_ranks(_oneshot_rank, lambda r: (r, world, port, list(sizes)), world, timeout_s)
    if len(got) < world:
        return {"error": f"only {len(got)} of {world} ranks answered within {timeout_s:g} s"}
    errors = [got[r]["error"] for r in range(world) if "error" in got[r]]
    if errors:
        return {"error": errors[0]}
    out: dict[str, Any] = {}
    for size in sizes:
        rows = [got[r].get(str(size), {}) for r in range(world)]
        if all("graph_us" in row for row in rows):
            out[str(size)] = max(row["graph_us"] for row in rows)
    return out


def probe_oneshot(sizes: Sequence[int], device: str = "auto") -> dict[str, Any]:
    """The `allreduce` probe's one-shot graph points: per size the slowest rank's median µs, or why not."""
    from decodetop.probes.controller import ProbeController
    from decodetop.probes.results import MeasurementStatus

    with ProbeController(device=device) as pc:
        res = pc.run("allreduce", {"sizes": list(sizes), "impls": ["one_shot"], "modes": ["graph"]})
    out: dict[str, Any] = {"world_size": res.world_size}
    for m in res.measurements:
        if m.status is not MeasurementStatus.OK:
            out["unsupported"] = m.note
            continue
        medians = [r.stats.median for r in m.per_rank if r.stats is not None]
        if medians:
            out[str(m.params["size_bytes"])] = max(medians)
    return out


def compare(probe: Mapping[str, Any], independent: Mapping[str, Any], sizes: Sequence[int]) -> list[dict[str, Any]]:
    """One row per size: probe µs, independent µs, ratio, within TOLERANCE (None where a side is missing)."""
    rows = []
    for size in sizes:
        p = probe.get(str(size))
        i = independent.get(str(size))
        ratio = p / i if isinstance(p, float) and isinstance(i, float) and i > 0 else None
        ok = abs(ratio - 1.0) <= TOLERANCE if ratio is not None else None
        rows.append({"size_bytes": size, "probe_us": p, "independent_us": i, "ratio": ratio, "within": ok})
    return rows


def table(rows: Sequence[Mapping[str, Any]], why: str = "") -> str:
    """The Markdown table printed last."""

    def f(v: Any, fmt: str) -> str:
        return format(v, fmt) if isinstance(v, float) else "—"

    lines = ["| size | probe one-shot µs | independent one-shot µs | ratio | within 15 % |", "|---|---|---|---|---|"]
    for r in rows:
        ok = {True: "yes", False: "NO", None: "—"}[r["within"]]
        lines.append(
            f"| {r['size_bytes']} B | {f(r['probe_us'], '.2f')} | {f(r['independent_us'], '.2f')} "
            f"| {f(r['ratio'], '.3f')} | {ok} |"
        )
    if why:
        lines.append(f"\n{why}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="write the rows and raw timings here")
    ap.add_argument("--rounds", type=int, default=2, help="alternated rounds of both sides (default 2)")
    ap.add_argument("--device", default="auto", help="probe group device: auto, cuda or cpu")
    args = ap.parse_args(argv)
    import torch

    world = torch.cuda.device_count() if torch.cuda.is_available() and args.device != "cpu" else 0
    probes: list[dict[str, Any]] = []
    independents: list[dict[str, Any]] = []
    for _ in range(max(1, args.rounds)):
        independents.append(independent_oneshot(world, SIZES) if world >= 2 else {"error": "needs two GPUs"})
        probes.append(probe_oneshot(SIZES, args.device))
    probe = _median_by_size(probes)
    independent = _median_by_size(independents)
    rows = compare(probe, independent, SIZES)
    why = "; ".join(
        str(x) for x in (probes[-1].get("unsupported"), independents[-1].get("error")) if isinstance(x, str) and x
    )
    doc = {"rows": rows, "probe_rounds": probes, "independent_rounds": independents, "tolerance": TOLERANCE}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    print(table(rows, why))
    return 0


def _median_by_size(rounds: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for size in SIZES:
        vals = [r[str(size)] for r in rounds if isinstance(r.get(str(size)), float)]
        if vals:
            out[str(size)] = statistics.median(vals)
    return out


if __name__ == "__main__":
    sys.exit(main())
