"""Where does the small all-reduce's time vary? The `allreduce` probe and independent loops, fresh processes each.

The proof's accuracy table on 2 × H200 found the probe's small eager all-reduce at 45–47 µs against 28–30 µs from
benchmarks/accuracy/accuracy.py's own loop in the same run, while benchmarks/accuracy/allreduce_vs_dist.py (a
different independent loop) agreed with the probe within 8 %. This script separates the candidate causes by
running, R rounds in alternation, each in a fresh pair of rank processes:

- `probe`: the `allreduce` probe through `ProbeController` (FileStore rendezvous, eager NCCL init with device_id, a
  gloo side group, CUDA events around the pipelined loop);
- `plain`: accuracy.py's loop (TCP rendezvous, no device_id, a barrier before every sample);
- `plain+device_id`, `plain+gloo`, `plain+events`: `plain` plus one of the probe's differences each.

Per variant and size it prints the median over rounds and the min–max across rounds of the per-process medians
(pipelined and graph µs per op). If the variants overlap within their round-to-round spread, the difference is
between process launches, not between the methods.

    PYTHONPATH=src python3 benchmarks/accuracy/allreduce_variance.py --rounds 3 --json /tmp/ar_variance.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from decodetop.atomic import write_text_atomic
from decodetop.probes.protocol import RANK_ENV_DEFAULTS

sys.path.insert(0, str(Path(__file__).resolve().parent))

from accuracy import free_port, gather_ranks

#: Back-to-back ops per timed sample (nccl-tests' -n 20; docs/reference/probes.md §1), as the probe and accuracy.py.
OPS = 20
REPS = 15
#: Ops per graph in the layer probe's all-reduce part (shapes.time_runner: 200 µs / ~40 µs eager estimate).
SMALL_GRAPH_OPS = 5
DEFAULT_SIZES = (8, 65536, 1048576)
VARIANTS: dict[str, dict[str, bool]] = {
    "plain": {},
    "plain+device_id": {"device_id": True},
    "plain+gloo": {"gloo": True},
    "plain+events": {"events": True},
    "plain+env": {"controller_env": True},
    "plain+timers": {"timers": True},
    "plain+all": {"device_id": True, "gloo": True, "controller_env": True, "timers": True},
}


def _rank(rank: int, cfg: Mapping[str, Any], q: Any) -> None:
    world, port, sizes, opts = cfg["world"], cfg["port"], cfg["sizes"], cfg["opts"]
    for key, value in RANK_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    os.environ.update(cfg.get("env") or {})
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    kwargs: dict[str, Any] = {"device_id": device} if opts.get("device_id") else {}
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, **kwargs)
    if opts.get("gloo"):
        dist.new_group(backend="gloo")
    out: dict[str, Any] = {}
    graphs = []
    for size in sizes:
        buf = torch.zeros(max(1, size // 2), dtype=torch.bfloat16, device=device)
        for _ in range(5):
            dist.all_reduce(buf)
        torch.cuda.synchronize()
        if opts.get("timers"):  # the probe's own timers (worker/timing.py), in this plain process
            from decodetop.probes.worker.timing import time_graph, time_host_and_events

            def op(buf: Any = buf) -> None:
                dist.all_reduce(buf)

            dist.barrier()
            host_t, _ = time_host_and_events(op, OPS, REPS, warmup=5)
            dist.barrier()
            graph_t = time_graph(op, OPS, REPS, warmup=2)
            out[str(size)] = {
                "pipelined_us": statistics.median(host_t),
                "graph_us": statistics.median(graph_t),
                "graph5_us": statistics.median(time_graph(op, SMALL_GRAPH_OPS, REPS * 4, warmup=2)),
            }
            continue
        host = []
        for _ in range(REPS):
            dist.barrier()
            torch.cuda.synchronize()
            if opts.get("events"):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                t = time.perf_counter()
                s.record()
                for _ in range(OPS):
                    dist.all_reduce(buf)
                e.record()
            else:
                t = time.perf_counter()
                for _ in range(OPS):
                    dist.all_reduce(buf)
            torch.cuda.synchronize()
            host.append((time.perf_counter() - t) / OPS * 1e6)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                dist.all_reduce(buf)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(OPS):
                dist.all_reduce(buf)
        graphs.append(g)
        ev = []
        for _ in range(REPS):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            g.replay()
            e.record()
            e.synchronize()
            ev.append(s.elapsed_time(e) * 1e3 / OPS)
        row = {"pipelined_us": statistics.median(host), "graph_us": statistics.median(ev)}
        # The layer probe's way (shapes.time_runner): a graph of 5 ops (~200 µs of eager time), replays enqueued
        # back to back with events, no synchronize between them.
        g5 = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g5):
            for _ in range(SMALL_GRAPH_OPS):
                dist.all_reduce(buf)
        graphs.append(g5)
        g5.replay()
        torch.cuda.synchronize()
        pairs = []
        for _ in range(REPS * 4):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            g5.replay()
            e.record()
            pairs.append((s, e))
        torch.cuda.synchronize()
        row["graph5_us"] = statistics.median(s.elapsed_time(e) * 1e3 / SMALL_GRAPH_OPS for s, e in pairs)
        out[str(size)] = row
    q.put((rank, out))
    q.close()
    q.join_thread()
    for g in graphs:
        g.reset()
    sys.stdout.flush()
    os._exit(0)  # destroy_process_group can hang after graph-captured collectives (docs/reference/h200-machine.md)


def run_plain(
    world: int,
    sizes: Sequence[int],
    opts: Mapping[str, bool],
    timeout_s: float = 120.0,
    extra_env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """One fresh process group of the independent loop; per size the slowest rank's medians."""
    port = free_port()
    env: dict[str, str] = dict(extra_env or {})
    if opts.get("controller_env"):  # what ProbeController._rank_env sets: GPUs by UUID, PCI bus order
        from decodetop.probes.controller import resolve_layout

        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = ",".join(g.uuid for g in resolve_layout(None, 1, "cuda").gpus)
    cfg = {"world": world, "port": port, "sizes": list(sizes), "opts": dict(opts), "env": env}
    got = gather_ranks(_rank, lambda r: (r, cfg), world, timeout_s)
    if len(got) < world:
        return {"error": f"only {len(got)} of {world} ranks answered"}
    return {
        str(s): {m: max(got[r][str(s)][m] for r in range(world)) for m in ("pipelined_us", "graph_us", "graph5_us")}
        for s in sizes
    }


def run_probe(sizes: Sequence[int]) -> dict[str, Any]:
    """The `allreduce` probe in a fresh ProbeController; per size and mode the slowest rank's median."""
    from decodetop.probes.controller import ProbeController

    with ProbeController(device="cuda") as pc:
        res = pc.run("allreduce", {"sizes": list(sizes), "extra_sizes": [], "modes": ["pipelined", "graph"]})
    out: dict[str, Any] = {}
    for m in res.measurements:
        size = str(m.params.get("size_bytes"))
        mode = str(m.params.get("mode"))
        vals = [r.stats.median for r in m.per_rank if r.stats is not None]  # slowest rank, as accuracy.py
        if vals:
            out.setdefault(size, {})[f"{mode}_us"] = max(vals)
    if not out:
        return {"error": f"probe {res.status.value}: {res.message}"}
    return out


def summarize(runs: Mapping[str, list[dict[str, Any]]], sizes: Sequence[int]) -> list[dict[str, Any]]:
    """Per variant, size and mode: median over rounds, min and max."""
    rows = []
    for variant, rounds in runs.items():
        for size in sizes:
            for mode in ("pipelined_us", "graph_us", "graph5_us"):
                vals = [r[str(size)][mode] for r in rounds if str(size) in r and mode in r[str(size)]]
                if vals:
                    rows.append(
                        {
                            "variant": variant,
                            "size_bytes": size,
                            "mode": mode.removesuffix("_us"),
                            "median_us": statistics.median(vals),
                            "min_us": min(vals),
                            "max_us": max(vals),
                            "rounds": vals,
                        }
                    )
    return rows


def table(rows: Sequence[Mapping[str, Any]]) -> str:
    out = ["| variant | size | mode | median µs | min–max µs over rounds |", "|---|---|---|---|---|"]
    for r in rows:
        out.append(
            f"| {r['variant']} | {r['size_bytes']} B | {r['mode']} | {r['median_us']:.1f} | "
            f"{r['min_us']:.1f}–{r['max_us']:.1f} |"
        )
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)))
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--variants", default=",".join(["probe", *VARIANTS]), help="comma-separated")
    ap.add_argument("--nccl-debug-dir", metavar="DIR", help="also one round with NCCL_DEBUG=INFO logs here")
    args = ap.parse_args(argv)
    import torch

    world = torch.cuda.device_count()
    if world < 2:
        print("allreduce_variance: needs 2 or more GPUs (a one-rank all-reduce exchanges nothing)", file=sys.stderr)
        return 2
    sizes = [int(s) for s in args.sizes.split(",")]
    chosen = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in chosen if v != "probe" and v not in VARIANTS]
    if unknown:
        print(f"allreduce_variance: unknown variant(s) {', '.join(unknown)}", file=sys.stderr)
        return 2
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in chosen}
    t0 = time.monotonic()
    for rnd in range(args.rounds):
        for variant, kept in runs.items():
            got = run_probe(sizes) if variant == "probe" else run_plain(world, sizes, VARIANTS[variant])
            print(f"round {rnd + 1} {variant}: {json.dumps(got)}", file=sys.stderr, flush=True)
            if "error" not in got:
                kept.append(got)
    if args.nccl_debug_dir:  # one more round of probe and plain with NCCL's INIT/TUNING log, to compare choices
        dbg = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,GRAPH,TUNING,ENV"}
        Path(args.nccl_debug_dir).mkdir(parents=True, exist_ok=True)
        for variant in ("probe", "plain"):
            dbg["NCCL_DEBUG_FILE"] = str(Path(args.nccl_debug_dir) / f"nccl_{variant}.%h.%p.log")
            saved = {k: os.environ.get(k) for k in dbg}
            os.environ.update(dbg)
            try:
                got = run_probe(sizes) if variant == "probe" else run_plain(world, sizes, {}, extra_env=dbg)
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
            print(f"nccl-debug round {variant}: {json.dumps(got)}", file=sys.stderr, flush=True)
    rows = summarize(runs, sizes)
    doc = {
        "what": "small all-reduce: probe vs independent loops, fresh processes, alternated",
        "world_size": world,
        "rounds": args.rounds,
        "wall_s": round(time.monotonic() - t0, 1),
        "runs": runs,
        "rows": rows,
        "table": table(rows),
    }
    if args.json:
        write_text_atomic(Path(args.json), json.dumps(doc, indent=1) + "\n")
    print(doc["table"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
