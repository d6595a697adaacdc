"""Provides the fingerprints stored results are matched by (stdlib only): where a result was measured (host, device
kind, GPU name and count, driver / CUDA / torch / NCCL versions, decodetop version) and for which scenario
(`Scenario.fingerprint_id`). Only a matching record feeds a budget; a record of unknown origin never does.

    stored = fingerprint_of(result.environment, scenario)                 # kept with a fresh result in the history
    current = expected_fingerprint(scenario, device_kind="cuda", gpu_count=2)   # before the probe group has run
    fingerprint_accepts(stored, current, exact=False)                     # may that record feed this budget?
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Collection, Sequence

from decodetop import __version__
from decodetop.budget.scenario import Scenario
from decodetop.history import Fingerprint, local_host_id
from decodetop.probes.results import Environment, ProbeResult

_VERSION_FIELDS = ("driver_version", "cuda_version", "torch_version", "nccl_version")


def fingerprint_of(env: Environment, scenario: Scenario | str) -> Fingerprint:
    """The history fingerprint of a result taken in `env` for `scenario` (its `fingerprint_id`)."""
    scenario_id = scenario if isinstance(scenario, str) else scenario.fingerprint_id
    cuda = env.device_kind == "cuda"
    return Fingerprint(
        host_id=env.host or local_host_id(),
        device_kind="cuda" if cuda else "cpu",
        gpu_name=(env.gpu_names[0] if env.gpu_names else None) if cuda else None,
        gpu_count=env.world_size,
        driver_version=env.driver if cuda else None,
        cuda_version=env.cuda if cuda else None,
        torch_version=env.torch,
        nccl_version=env.nccl if cuda else None,
        decodetop_version=__version__,
        scenario=scenario_id,
    )


def expected_fingerprint(
    scenario: Scenario | str, *, device_kind: str, gpu_count: int, gpu_name: str | None = None
) -> Fingerprint:
    """The fingerprint this session's results will carry, as far as it is known before the probe group has run:
    host, device kind, GPU name and count, decodetop version and scenario; the versions the ranks report (driver,
    CUDA, torch, NCCL) are None until a fresh result gives them (`fingerprint_accepts` treats them as not yet
    known)."""
    scenario_id = scenario if isinstance(scenario, str) else scenario.fingerprint_id
    cuda = device_kind == "cuda"
    return Fingerprint(
        host_id=local_host_id(),
        device_kind="cuda" if cuda else "cpu",
        gpu_name=gpu_name if cuda else None,
        gpu_count=gpu_count,
        driver_version=None,
        cuda_version=None,
        torch_version=None,
        nccl_version=None,
        decodetop_version=__version__,
        scenario=scenario_id,
    )


def fingerprint_accepts(stored: Fingerprint | None, current: Fingerprint, *, exact: bool) -> bool:
    """Whether a stored record may feed the current budget: never one of unknown origin; with `exact` (the current
    fingerprint came from a fresh result), only an equal one; otherwise one equal on every field the current
    fingerprint knows (the versions the ranks report are not known before they ran, a GPU's name not before the
    first NVML tick)."""
    if stored is None:
        return False
    if exact:
        return stored == current
    for f in dataclasses.fields(Fingerprint):
        want = getattr(current, f.name)
        if want is None and (f.name in _VERSION_FIELDS or (f.name == "gpu_name" and current.device_kind == "cuda")):
            continue  # not known before the ranks (or the first NVML tick) said it
        if getattr(stored, f.name) != want:
            return False
    return True


class SessionFingerprints:
    """Which stored records may feed a session's budget: before this session's ranks have run, those equal on
    every field already known (host, device kind, GPU count, the GPU's name once NVML said it, decodetop version,
    scenario); once a fresh result said what the ranks run (driver, CUDA, torch, NCCL), only those equal to its
    fingerprint. Shared by the history callback (`learn`) and the budget (`accepts`, `keep`); any thread."""

    def __init__(self) -> None:
        self._fresh: Fingerprint | None = None
        self._lock = threading.Lock()

    def learn(self, env: Environment, scenario: Scenario) -> Fingerprint:
        """The fingerprint of a fresh result taken in `env` for `scenario`; from now on stored records must equal it
        (with the scenario of the budget asking)."""
        fp = fingerprint_of(env, scenario)
        with self._lock:
            self._fresh = fp
        return fp

    def current(
        self, scenario: Scenario, *, device_kind: str, gpu_count: int, gpu_name: str | None
    ) -> tuple[Fingerprint, bool]:
        """This session's fingerprint for `scenario` and whether it is exact (from a fresh result) or expected (the
        versions the ranks report not known yet)."""
        with self._lock:
            fresh = self._fresh
        if fresh is not None:
            return dataclasses.replace(fresh, scenario=scenario.fingerprint_id), True
        return expected_fingerprint(scenario, device_kind=device_kind, gpu_count=gpu_count, gpu_name=gpu_name), False

    def accepts(
        self,
        stored: Fingerprint | None,
        scenario: Scenario,
        *,
        device_kind: str,
        gpu_count: int,
        gpu_name: str | None,
    ) -> bool:
        """Whether a stored record may feed the budget of `scenario` (never one of unknown origin)."""
        current, exact = self.current(scenario, device_kind=device_kind, gpu_count=gpu_count, gpu_name=gpu_name)
        return fingerprint_accepts(stored, current, exact=exact)

    def keep(self, results: Sequence[ProbeResult], scenario: Scenario, stored: Collection[str]) -> list[ProbeResult]:
        """`results` less the ones read back from the history (`stored`: their probes) that were measured elsewhere
        than this session's ranks, once a fresh result said where that is."""
        with self._lock:
            fresh = self._fresh
        if fresh is None:
            return list(results)
        want = dataclasses.replace(fresh, scenario=scenario.fingerprint_id)
        return [
            r
            for r in results
            if r.probe not in stored or (r.environment is not None and fingerprint_of(r.environment, scenario) == want)
        ]
