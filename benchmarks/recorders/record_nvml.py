"""Records what this machine's NVML answers, idle and under load, for the fake NVML backend to replay.

Run on a GPU machine from the repository root (torch is needed only for the load, in child processes):

    PYTHONPATH=src python3 benchmarks/recorders/record_nvml.py --out DIR --label h200x2

It runs decodetop's own telemetry sampler and GPU checks through `RecordingBackend`, so every NVML function the
code uses is called for every GPU and every pair, and each outcome (the value, or the NVML error code) is kept
under its call key. A few extra calls the code only makes as fallbacks (nvmlDeviceGetPcieThroughput, violation
counters) are made too. Phases:

- idle: `--samples` ticks `--interval` apart, nothing running;
- load: a child process per GPU runs a bf16 matmul loop plus a device-to-device copy loop (torch), and the same
  ticks are taken once the load has started, so the process list and each process's SM share
  (nvmlDeviceGetProcessUtilization) hold that process; `--load-only` skips the idle phase.

It writes `<label>-idle.json` and `<label>-load.json` (format `decodetop-nvml-recording/1`), and
`<label>-nvlink.json`: what NVML answered for NVLink on every GPU (the link count, each link's state, the per-link
throughput fields at every link scope and the all-links scope, the older utilisation counter and its control), also
printed as a table. It never changes a GPU setting (the utilisation counter's control is read, never set).
`--backend fake:NAME` records from the fake instead (to test the recorder without a GPU).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from decodetop.collectors.fake_nvml import RECORDING_FORMAT, FakeNvmlBackend, load_recording
from decodetop.collectors.nvml import GpuRef, Nvml, NvmlBackend, PynvmlBackend, RecordingBackend, call_key
from decodetop.collectors.telemetry import TelemetrySampler

LOAD_SCRIPT = r"""
import sys, time
import torch
gpu, seconds = int(sys.argv[1]), float(sys.argv[2])
torch.cuda.set_device(gpu)
dev = torch.device("cuda", gpu)
a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
src = torch.empty(256 * 1024 * 1024, device=dev, dtype=torch.uint8)
dst = torch.empty_like(src)
host = torch.empty(64 * 1024 * 1024, dtype=torch.uint8, pin_memory=True)
print(f"load on cuda:{gpu} started", flush=True)
end = time.monotonic() + seconds
i = 0
while time.monotonic() < end:
    for _ in range(8):
        c = a @ b
    dst.copy_(src)
    if i % 4 == 0:
        host.copy_(src[: host.numel()], non_blocking=True)  # some PCIe traffic (D2H)
        src[: host.numel()].copy_(host, non_blocking=True)  # and H2D
    torch.cuda.synchronize()
    i += 1
print(f"load on cuda:{gpu} done after {i} rounds", flush=True)
"""

EXTRA_CALLS: tuple[tuple[str, tuple[int, ...]], ...] = (
    # Fallbacks and cross-checks the telemetry code may use: PCIe throughput (KB/s, 20 ms window each),
    # violation counters per perf policy (pynvml NVML_PERF_POLICY_*: 0 power, 1 thermal, 2 sync boost,
    # 3 board limit, 4 low utilisation, 5 reliability, 10 total app clocks, 11 total base clocks).
    ("nvmlDeviceGetPcieThroughput", (0,)),
    ("nvmlDeviceGetPcieThroughput", (1,)),
    *(("nvmlDeviceGetViolationStatus", (p,)) for p in (0, 1, 2, 3, 4, 5, 10, 11)),
    ("nvmlDeviceGetCurrentClocksThrottleReasons", ()),
    ("nvmlDeviceGetSupportedClocksThrottleReasons", ()),
    ("nvmlDeviceGetRetiredPages", (0,)),
    ("nvmlDeviceGetRetiredPages", (1,)),
    ("nvmlDeviceGetClockInfo", (0,)),
    ("nvmlDeviceGetPowerManagementLimitConstraints", ()),
    ("nvmlDeviceGetComputeMode", ()),
    ("nvmlDeviceGetArchitecture", ()),
    ("nvmlDeviceGetBoardPartNumber", ()),
    # Per-process SM share (lastSeenTimeStamp 0: every sample in the driver's buffer), asked on every tick as the
    # sampler asks it whenever a GPU has processes: idle it answers NOT_FOUND (no sample), under load a value.
    ("nvmlDeviceGetProcessUtilization", (0,)),
    ("nvmlDeviceGetComputeRunningProcesses", ()),
)


NVML_FI_DEV_NVLINK_THROUGHPUT_FIELDS = (138, 139, 140, 141)
"""NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX and _RAW_TX/RX, KiB counters per link (nvml.h; pynvml.py)."""
NVLINK4_LINKS = 18
"""Links of an NVLink-4 GPU (H100/H200 SXM): the scopes asked beside the driver's own link count."""
ALL_LINKS_SCOPE = 0xFFFFFFFF
"""scopeId UINT_MAX: "returns aggregate value summed up across all links" (nvml.h, the throughput fields)."""

NVLINK_EXTRA_CALLS: tuple[tuple[str, tuple[Any, ...]], ...] = (
    # Every throughput field at every link scope and the all-links scope, in one call (what the driver answers
    # where a GPU has no NVLink, or has it down), and the fields asked bare (scope 0, as pynvml leaves it).
    (
        "nvmlDeviceGetFieldValues",
        (
            tuple(
                (fid, scope)
                for scope in (*range(NVLINK4_LINKS), ALL_LINKS_SCOPE)
                for fid in NVML_FI_DEV_NVLINK_THROUGHPUT_FIELDS
            ),
        ),
    ),
    ("nvmlDeviceGetFieldValues", ((138, 139),)),
    # The older per-link counters (deprecated; counter 0 and 1) and the units their control says they count.
    *(("nvmlDeviceGetNvLinkUtilizationControl", (0, c)) for c in (0, 1)),
    *(("nvmlDeviceGetNvLinkUtilizationCounter", (0, c)) for c in (0, 1)),
    ("nvmlDeviceGetNvLinkVersion", (0,)),
    ("nvmlDeviceGetNvLinkRemoteDeviceType", (0,)),
)


def _nvlink_extras(backend: NvmlBackend, gpu: int) -> tuple[tuple[str, tuple[Any, ...]], ...]:
    """The NVLink calls to make on `gpu`: all on a real GPU; from a fake, those its recording holds (a recording made
    before the recorder asked them has none, and the fake would refuse them)."""
    if not isinstance(backend, FakeNvmlBackend):
        return NVLINK_EXTRA_CALLS
    held = {key for sample in backend.recording.samples for key in sample}
    return tuple(
        (fn, args)
        for fn, args in NVLINK_EXTRA_CALLS
        if call_key(fn, (GpuRef(gpu % backend.recording.gpu_count), *args)) in held
    )


def _make_backend(spec: str) -> NvmlBackend:
    if spec == "real":
        return PynvmlBackend()
    if spec.startswith("fake:"):
        return FakeNvmlBackend(load_recording(spec[len("fake:") :]), clock=None)
    raise SystemExit(f"--backend must be 'real' or 'fake:NAME', got {spec!r}")


def _run_checks(nvml: Nvml) -> None:
    """Run the GPU checks too, so every call they make is recorded (they may not exist yet in older trees)."""
    try:
        from decodetop.collectors.checks.gpu import gpu_checks
        from decodetop.collectors.hostroot import HostRoot
    except ImportError as exc:
        print(f"  (gpu checks not run: {exc})", flush=True)
        return
    start = time.perf_counter()
    results = gpu_checks(HostRoot(), nvml, window_s=0.0)
    print(f"  gpu_checks: {len(results)} results in {time.perf_counter() - start:.3f} s", flush=True)


def _record_phase(backend_spec: str, *, samples: int, interval_s: float, run_checks: bool) -> dict[str, Any]:
    recording = RecordingBackend(_make_backend(backend_spec))
    nvml = Nvml(recording)
    status = nvml.status()
    sampler = TelemetrySampler(nvml)
    out_samples: list[dict[str, Any]] = []
    tick_costs: list[dict[str, float]] = []
    t0 = time.monotonic()
    for k in range(samples):
        recording.outcomes = {}
        t = time.monotonic() - t0
        snap = sampler.sample(processes=True)
        tick_costs.append(
            {
                "tick_cost_s": snap.tick_cost_s,
                "tick_cost_per_gpu_s": snap.tick_cost_per_gpu_s,
                "static_cost_s": snap.static_cost_s,
            }
        )
        if status.available:
            for i in range(snap.system.device_count):
                for fn, args in (*EXTRA_CALLS, *_nvlink_extras(recording.inner, i)):
                    nvml.query(fn, GpuRef(i), *args)
            if k == 0 and run_checks:
                _run_checks(nvml)
        out_samples.append({"t_s": round(t, 6), "calls": recording.outcomes})
        gpus = ", ".join(
            f"gpu{g.index}: {g.sm_clock_mhz} MHz {g.power_w} W util {g.gpu_util_pct}% reasons {g.clock_event_reasons}"
            for g in snap.gpus
        )
        print(
            f"  sample {k}: {len(recording.outcomes)} calls, tick {snap.tick_cost_s * 1e3:.2f} ms; {gpus}", flush=True
        )
        if k + 1 < samples:
            time.sleep(max(0.0, interval_s - (time.monotonic() - t0 - t)))
    nvml.close()
    count = sampler.previous.system.device_count if sampler.previous is not None else 0
    return {
        "init_error": recording.init_error,
        "gpu_count": count,
        "samples": out_samples,
        "tick_costs": tick_costs,
    }


def _meta(phase: str, load: str) -> dict[str, Any]:
    try:
        import pynvml  # only for its version string

        binding = getattr(pynvml, "__version__", "") or _dist_version("nvidia-ml-py")
    except ImportError:
        binding = "not installed"
    return {
        "phase": phase,
        "load": load,
        "recorded_at_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "nvidia_ml_py": binding,
        "cpu_count": os.cpu_count(),
        "recorder": "benchmarks/recorders/record_nvml.py",
    }


def _dist_version(name: str) -> str:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return "unknown"


def _write(out_dir: Path, label: str, phase: str, description: str, *, data: dict[str, Any], load: str) -> Path:
    meta = _meta(phase, load)
    meta["tick_costs"] = data["tick_costs"]
    doc = {
        "format": RECORDING_FORMAT,
        "label": f"{label}-{phase}",
        "description": description,
        "gpu_count": data["gpu_count"],
        "init_error": data["init_error"],
        "meta": meta,
        "samples": data["samples"],
    }
    path = out_dir / f"{label}-{phase}.json"
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {path} ({path.stat().st_size} bytes)", flush=True)
    return path


def _nvlink_answers(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """The NVLink calls of the first and last sample (call key → outcome), for `<label>-nvlink.json`."""

    def pick(calls: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in sorted(calls.items()) if "NvLink" in k or "[138" in k}

    return {"first": pick(samples[0]["calls"]), "last": pick(samples[-1]["calls"])} if samples else {}


def _print_nvlink(phase: str, answers: dict[str, Any]) -> None:
    """One line per NVLink call of the phase's last sample: the key and what NVML answered (fields compactly)."""
    print(f"NVLink answers ({phase}, last sample):", flush=True)
    for key, outcome in answers.get("last", {}).items():
        value = outcome.get("ok", outcome)
        if isinstance(value, list) and value and isinstance(value[0], dict) and "fieldId" in value[0]:
            value = " ".join(
                f"{e['fieldId']}:{e['scopeId']}={e['value'] if e['nvmlReturn'] == 0 else 'ret' + str(e['nvmlReturn'])}"
                for e in value
            )
        print(f"  {key[:70]:70s} {str(value)[:2000]}", flush=True)


def _start_load(gpus: int, seconds: float) -> list[subprocess.Popen[bytes]]:
    procs = []
    for i in range(gpus):
        procs.append(
            subprocess.Popen([sys.executable, "-c", LOAD_SCRIPT, str(i), str(seconds)], stdin=subprocess.DEVNULL)
        )
    return procs


def _wait_for_load(gpus: int, settle_s: float, timeout_s: float = 90.0) -> None:
    """Wait until every GPU is busy (utilisation ≥ 50 %), then `settle_s` more, so samples see steady load."""
    nvml = Nvml(PynvmlBackend())
    deadline = time.monotonic() + timeout_s
    utils: list[object] = []
    while time.monotonic() < deadline:
        utils = [nvml.query("nvmlDeviceGetUtilizationRates", GpuRef(i)) for i in range(gpus)]
        if all(isinstance(u, dict) and u.get("gpu", 0) >= 50 for u in utils):
            break
        time.sleep(0.5)
    print(f"  load running: {utils}", flush=True)
    nvml.close()
    time.sleep(settle_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for the JSON recordings")
    parser.add_argument("--label", required=True, help="recording name prefix, e.g. h200x2")
    parser.add_argument("--backend", default="real", help="'real' (pynvml) or 'fake:NAME' (test the recorder)")
    parser.add_argument("--samples", type=int, default=5, help="ticks per phase")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between ticks")
    parser.add_argument("--load-warmup", type=float, default=3.0, help="seconds of steady load before sampling")
    parser.add_argument("--no-load", action="store_true", help="record the idle phase only")
    parser.add_argument("--load-only", action="store_true", help="record the load phase only")
    args = parser.parse_args(argv)
    if args.no_load and args.load_only:
        parser.error("--no-load and --load-only exclude each other")
    args.out.mkdir(parents=True, exist_ok=True)

    print("idle phase", flush=True)
    idle = _record_phase(
        args.backend,
        samples=1 if args.load_only else args.samples,
        interval_s=args.interval,
        run_checks=not args.load_only,
    )
    if not args.load_only:
        _write(args.out, args.label, "idle", f"{args.label}: idle, nothing running", data=idle, load="none")
    if args.no_load or idle["gpu_count"] == 0:
        return 0

    seconds = 90.0 + args.load_warmup + args.samples * args.interval  # outlasts start-up; terminated after
    load_desc = "per GPU: bf16 8192x8192 matmul loop + 256 MiB device copy + 64 MiB pinned H2D/D2H copies (torch)"
    print(f"load phase: starting {idle['gpu_count']} load processes for {seconds:.0f} s", flush=True)
    procs = _start_load(idle["gpu_count"], seconds) if args.backend == "real" else []
    try:
        if procs:
            _wait_for_load(idle["gpu_count"], args.load_warmup)
        load = _record_phase(args.backend, samples=args.samples, interval_s=args.interval, run_checks=True)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    _write(args.out, args.label, "load", f"{args.label}: under load ({load_desc})", data=load, load=load_desc)
    answers = {"idle": _nvlink_answers(idle["samples"]), "load": _nvlink_answers(load["samples"])}
    path = args.out / f"{args.label}-nvlink.json"
    path.write_text(json.dumps(answers, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    _print_nvlink("idle", answers["idle"])
    _print_nvlink("load", answers["load"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
