"""Provides the fingerprints stored results are matched by (stdlib only): where a result was measured (host, device
kind, GPU name and count, driver / CUDA / torch / NCCL versions, decodetop version) and for which scenario
(`Scenario.fingerprint_id`). Only a matching record feeds a budget; a record of unknown origin never does.

    stored = fingerprint_of(result.environment, scenario)                 # kept with a fresh result in the history
    current = expected_fingerprint(scenario, device_kind="cuda", gpu_count=2)   # before the probe group has run
    fingerprint_accepts(stored, current, exact=False)                     # may that record feed this budget?
"""

from __future__ import annotations

import dataclasses

from decodetop import __version__
from decodetop.budget.scenario import Scenario
from decodetop.history import Fingerprint, local_host_id
from decodetop.probes.results import Environment

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
