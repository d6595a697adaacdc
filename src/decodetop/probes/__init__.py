"""Provides the probe protocol, results and controller (no torch here); torch lives in `probes.worker` only.

Public API (all importable without torch):

- `probes.controller.ProbeController(gpus=None, cpu_ranks=None, device="auto", registry=None, ...)`: context
  manager; `run(probe, params=None, *, timeout_s=None, on_progress=None) -> ProbeResult` (blocking, never raises for
  a probe's own failure), `cancel()` from any thread, `close()`; `world_size`, `backend`, `environment`,
  `rank_pids()`, `layout`. `resolve_layout(gpus, cpu_ranks, device)` checks device choices without spawning.
- `probes.results`: `ProbeResult` (status ok/failed/timed_out/unsupported/cancelled, measurements, environment,
  error_rank/error/traceback), `Measurement`, `RankSeries`, `Stats`, `Environment`, `RankOutput`,
  `RankMeasurement`, `merge_rank_outputs`, `results_to_json`, `results_from_json`, `load_results(path)`.
- `probes.spec.ProbeSpec` (a probe: worker module, parameters, plan and read hooks), `probes.specs` (one spec
  module per built-in probe), `probes.registry.ProbeRegistry` (built-ins + `DECODETOP_PROBE_MODULES`),
  `probes.hooks` (what the hooks see and return: `PlanContext`, `Planned`, `ProbeRequest`, `MeasuredSetBuilder`).
- `probes.protocol.Progress` (what `on_progress` receives; `.line()` renders it).
- `probes.report.format_result(result, columns)`: the CLI's plain-text table.
- `probes.gpuinfo`: `visible_gpus()`, `compute_processes(gpus)`, `clock_snapshot(gpus)` (NVML, read-only).

Adding a probe: a worker module `probes/worker/<name>.py` with `run(ctx: ProbeContext, params) -> RankOutput`
(and `op_runner(key_id, ctx, *, rotate)` for a component a layer is built from; helpers in `worker/ops.py`,
`worker/tensors.py`, `worker/timing.py`), a spec module `probes/specs/<name>.py` with its `SPEC` (hooks
`plan=hooks.plan_keys` and the default `read` do for a keyed component), listed in `probes.specs.BUILTIN_PROBES`.
"""
