"""The recipe for a new component probe holds: a probe written only in its own two modules (a torch-free spec with
its hooks, a worker module with its kernel) plus its measurement key is planned by `plan_requests`, runs on real
gloo ranks, and is read into the budget inputs by `measured_from_results` — no other file names it."""

from __future__ import annotations

import dataclasses
import importlib
import sys
import textwrap
from pathlib import Path

import pytest

from decodetop.budget.plan import build_plan
from decodetop.probes.controller import ProbeController
from decodetop.probes.plan_hooks import measured_from_results, plan_requests
from decodetop.probes.registry import ProbeRegistry
from decodetop.probes.results import ProbeStatus
from tests.probes.test_plan_hooks import tiny_inventory

pytestmark = pytest.mark.slow

#: The toy's spec module: its key (what the inventory would hold) and its ProbeSpec with the generic hooks.
SPEC_MODULE = '''
"""Provides the toy probe's spec (no torch)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from decodetop.budget.keys import _Key
from decodetop.probes.hooks import plan_keys
from decodetop.probes.probe_spec import ProbeSpec


@dataclasses.dataclass(frozen=True)
class ToyKey(_Key):
    """One elementwise doubling of `width` fp32 values."""

    PROBE: ClassVar[str] = "toy"
    width: int


PROBES = (
    ProbeSpec(
        name="toy",
        description="doubles a vector",
        module="toy_probe_worker",
        default_timeout_s=60.0,
        default_params={"keys": ["toy:width=64"], "budget_ms": 5.0, "samples": 5, "cpu_samples": 3, "rotate": False},
        plan=plan_keys,
    ),
)
'''

#: The toy's worker module: its kernel as an OpRunner, its `run` and its `op_runner`, timed by the shared helpers.
WORKER_MODULE = '''
"""Provides the toy probe's kernel (torch side)."""

from __future__ import annotations

from functools import partial

import torch

from decodetop.probes.results import RankOutput
from decodetop.probes.worker.context import ProbeContext
from decodetop.probes.worker.ops import OpRunner, TimingOptions, measure


def _width(key_id: str) -> int:
    return int(key_id.partition("width=")[2])


def op_runner(key_id: str, ctx: ProbeContext, *, rotate: bool) -> OpRunner:
    x = torch.randn(_width(key_id), device=ctx.device)
    return OpRunner(lambda: x * 2.0, 8.0 * x.numel(), float(x.numel()))


def run(ctx: ProbeContext, params: dict[str, object]) -> RankOutput:
    opts = TimingOptions.from_params(ctx, params)
    points = []
    for kid in params["keys"]:
        pt = {"what": "toy", "key": kid, "role": "budget", "device": ctx.device.type}
        points.append(measure(ctx, opts, kid, pt, partial(op_runner, kid, ctx, rotate=False)))
    return RankOutput(measurements=tuple(points))
'''


def test_a_component_probe_from_its_own_modules_is_planned_run_and_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "toy_probe_spec.py").write_text(textwrap.dedent(SPEC_MODULE))
    (tmp_path / "toy_probe_worker.py").write_text(textwrap.dedent(WORKER_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))  # spawned ranks get the parent's sys.path
    importlib.invalidate_caches()
    registry = ProbeRegistry(extra_modules=["toy_probe_spec"])
    toy_key = sys.modules["toy_probe_spec"].ToyKey(width=4096)

    # The inventory side: the model's plan holds the toy's key (as build_plan groups an inventory's keys by probe).
    inventory = tiny_inventory(tmp_path)
    plan = build_plan(inventory)
    plan = dataclasses.replace(plan, groups=(*plan.groups, ("toy", (toy_key,))))

    requests, _notes = plan_requests(plan, inventory, world_size=2, device_kind="cpu", registry=registry)
    toy = [r for r in requests if r.probe == "toy"]
    assert [(r.params["keys"], r.keys) for r in toy] == [(["toy:width=4096"], ("toy:width=4096",))]
    assert requests[-1].probe == "layer"  # a new probe runs before the layer that reuses every kernel

    with ProbeController(device="cpu", cpu_ranks=2, registry=registry, rank_log=tmp_path / "ranks.log") as pc:
        result = pc.run("toy", toy[0].params)
    assert result.status is ProbeStatus.OK, result.message
    assert [len(m.per_rank) for m in result.measurements] == [2]

    measured = measured_from_results([result], plan=plan, registry=registry)
    time = measured.times["toy:width=4096"]
    assert time.median_ms > 0 and time.source == "toy probe"
