"""Print Markdown tables from a `decodetop probe --json` file (the tables in docs/benchmarks.md come from here).

PYTHONPATH=src python3 benchmarks/reports/probe_summary.py benchmarks/results/primitives/h200x1.json
"""

from __future__ import annotations

import sys

from decodetop.probes.results import MeasurementStatus, ProbeResult, load_results
from decodetop.textfmt import format_bytes, format_number


def _n(value: float | None) -> str:
    return "–" if value is None else format_number(value)


def allreduce_table(result: ProbeResult) -> list[str]:
    lines = [
        "| size | pipelined µs | graph µs | synced p50 µs | synced p99 µs "
        "| algbw GB/s (pipelined) | busbw GB/s (pipelined) |",
        "|---|---|---|---|---|---|---|",
    ]
    sizes = sorted({int(m.params["size_bytes"]) for m in result.measurements})
    for size in sizes:
        by_mode = {m.params["mode"]: m for m in result.measurements if m.params["size_bytes"] == size}

        def t(mode: str, key: str = "time_us", by_mode: dict = by_mode) -> str:  # type: ignore[type-arg]
            m = by_mode.get(mode)
            if m is None or m.status is not MeasurementStatus.OK:
                return "–"
            return _n(m.metrics.get(key))

        lines.append(
            f"| {format_bytes(size)} | {t('pipelined')} | {t('graph')} | {t('synced')} | {t('synced', 'p99_us')} "
            f"| {t('pipelined', 'algbw_gbps')} | {t('pipelined', 'busbw_gbps')} |"
        )
    return lines


def generic_table(result: ProbeResult) -> list[str]:
    lines = ["| measurement | median µs | p10 µs | p90 µs | metrics |", "|---|---|---|---|---|"]
    for m in result.measurements:
        if m.status is not MeasurementStatus.OK:
            lines.append(f"| {m.name} | – | – | – | {m.status.value}: {m.note} |")
            continue
        s = m.stats
        metrics = ", ".join(f"{k} {_n(v)}" for k, v in m.metrics.items() if k != "time_us")
        lines.append(
            f"| {m.name} | {_n(s.median if s else None)} | {_n(s.p10 if s else None)} | {_n(s.p90 if s else None)} "
            f"| {metrics} |"
        )
    return lines


def main() -> int:
    for path in sys.argv[1:]:
        for result in load_results(path):
            env = result.environment
            where = f"{env.world_size} × {', '.join(env.gpu_names) or 'CPU'}, {env.backend}" if env else "?"
            print(f"### {result.probe} ({result.status.value}; {where})\n")
            rows = allreduce_table(result) if result.probe == "allreduce" else generic_table(result)
            print("\n".join(rows))
            print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
