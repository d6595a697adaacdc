"""Provides the public entry points of the health checks: `run_host_checks` (C1-C16, P1, P3-P7, N8, N12 over a
`HostRoot`) and `run_all_checks` (those plus the NVML GPU checks N1-N11 and P2 on the live host)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from decodetop.collectors.checks.context import DEFAULT_SAMPLE_INTERVAL_S, HostContext, build_context
from decodetop.collectors.checks.cpu import CPU_CHECKS
from decodetop.collectors.checks.devices import DEVICE_CHECKS
from decodetop.collectors.checks.gpu import gpu_checks
from decodetop.collectors.checks.gpu_driver import NVML_OUTCOME, nvml_outcome_line, tree_gpu_checks
from decodetop.collectors.checks.kernel import KERNEL_CHECKS
from decodetop.collectors.checks.pcie import PCIE_CHECKS
from decodetop.collectors.checks.result import CheckResult, Status
from decodetop.collectors.hostroot import HostRoot
from decodetop.collectors.nvml import Nvml
from decodetop.collectors.telemetry import TelemetrySampler

HOST_CHECKS = (*KERNEL_CHECKS[-1:], *CPU_CHECKS, *KERNEL_CHECKS[:-1], *PCIE_CHECKS, *DEVICE_CHECKS)
"""C16 first (it sets the context the rest is read in), then C1-C15, P1-P7, N12, N8."""

BUSY_UTIL_PCT = 10
"""A GPU counts as busy (link speed judged) at this NVML utilisation or more. Idle GPUs show 0 % and retrain their
link down to 2.5 GT/s (docs/reference/healthchecks.md §2.7); any steady work keeps the link at its trained speed."""


def nvml_gpu_busy(nvml: Nvml) -> dict[str, bool] | None:
    """bdf → busy, from one NVML telemetry sample; None when NVML cannot say (no library, no GPUs)."""
    snapshot = TelemetrySampler(nvml).sample(processes=False, processes_note="not needed to judge load")
    busy = {
        g.pci_bus_id: g.gpu_util_pct >= BUSY_UTIL_PCT
        for g in snapshot.gpus
        if g.pci_bus_id is not None and g.gpu_util_pct is not None
    }
    return busy or None


def run_host_checks(
    root: HostRoot,
    *,
    sample_interval_s: float = DEFAULT_SAMPLE_INTERVAL_S,
    gpu_busy: Mapping[str, bool] | None = None,
    sleep: Callable[[float], None] | None = None,
    lxc_config_paths: tuple[str, ...] | None = None,
) -> list[CheckResult]:
    """Run every host check over `root`, in table order.

    `sample_interval_s` spaces C8's two cpuidle samples (live root only; a copied tree uses its `.later/` sample).
    `gpu_busy` (bdf → busy) lets P1 judge link speed; without it an idle-looking link is "recheck under load".
    """
    ctx = build_context(root, sample_interval_s=sample_interval_s, gpu_busy=gpu_busy, sleep=sleep)
    if lxc_config_paths is not None:
        ctx.lxc_config_paths = lxc_config_paths
    return run_checks(ctx)


def run_checks(ctx: HostContext) -> list[CheckResult]:
    """Run the host checks over a prepared context."""
    results: list[CheckResult] = []
    for check in HOST_CHECKS:
        results.extend(check(ctx))
    return results


def run_gpu_checks(root: HostRoot, nvml: Nvml | None = None, *, under_load: bool = False) -> list[CheckResult]:
    """The NVML checks N1-N11 and P2 on the live host (NVML's init outcome recorded for a --collect tree); over a
    copied tree, N1 from the outcome that tree recorded (`tree_gpu_checks`); one unknown line if they crash."""
    if not root.is_live:
        return tree_gpu_checks(root)
    if nvml is None:
        nvml = Nvml()
    try:
        root.record_outcome(NVML_OUTCOME, nvml_outcome_line(nvml.status()))
        results = gpu_checks(root, nvml, under_load=under_load)
    except Exception as exc:
        return [
            CheckResult(
                "N1-N11",
                "GPU checks (NVML)",
                Status.UNKNOWN,
                f"GPU checks crashed: {type(exc).__name__}: {exc}",
                "NVML readable for N1-N11 and P2",
                subject="GPUs",
            )
        ]
    return list(results)


def run_all_checks(
    root: HostRoot | None = None,
    *,
    nvml: Nvml | None = None,
    sample_interval_s: float = DEFAULT_SAMPLE_INTERVAL_S,
    gpu_busy: Mapping[str, bool] | None = None,
    sleep: Callable[[float], None] | None = None,
    lxc_config_paths: tuple[str, ...] | None = None,
) -> list[CheckResult]:
    """Host checks, then GPU checks (NVML on a live root only). `root` defaults to the live host.

    On the live host without `gpu_busy`, one NVML sample decides which GPUs are busy, so P1 can judge link speed.
    """
    root = root if root is not None else HostRoot()
    if root.is_live and gpu_busy is None:
        if nvml is None:
            nvml = Nvml()
        gpu_busy = nvml_gpu_busy(nvml)
    results = run_host_checks(
        root,
        sample_interval_s=sample_interval_s,
        gpu_busy=gpu_busy,
        sleep=sleep,
        lxc_config_paths=lxc_config_paths,
    )
    under_load = bool(gpu_busy) and all(gpu_busy.values()) if gpu_busy else False
    return merge_results(results, run_gpu_checks(root, nvml, under_load=under_load))


NVML_PREFERRED = ("P6", "P7")
"""Checks both halves make: NVML's version (which also reads sysfs) wins when it produced a real answer."""


def _family(check_id: str) -> str:
    return check_id.split(":", 1)[0]


def merge_results(host: list[CheckResult], gpu: list[CheckResult]) -> list[CheckResult]:
    """Host findings then GPU findings, without two findings for one check and subject (P6, P7)."""
    answered = {_family(r.check_id) for r in gpu if r.status is not Status.UNKNOWN}
    dropped = {fam for fam in NVML_PREFERRED if fam in answered}
    gpu_ids = {r.check_id for r in gpu}
    kept = [r for r in host if _family(r.check_id) not in dropped and r.check_id not in gpu_ids]
    return kept + list(gpu)
