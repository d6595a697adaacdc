"""The attention probe's reader puts each GQA split-K point's launch onto its curve point: from the launch metrics
the point records, from the note's launch label in results written before those, and none where neither is there
(the H200 campaigns' files in benchmarks/results/whatif/); the curve engine's self-check tells their launch regimes
apart."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from decodetop.budget.gpus import GPUS
from decodetop.budget.gqa_launch import LONG, LONG_BF16, SHORT, SHORT_BEFORE, GqaLaunchFacts
from decodetop.budget.roofline import hardware_for
from decodetop.probes.plan_hooks import measured_from_results
from decodetop.probes.results import load_results

WHATIF = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "whatif"


def _launches(folder: str) -> Counter[GqaLaunchFacts | None]:
    measured = measured_from_results(tuple(load_results(WHATIF / folder / "llama-3.1-70b_base.json.gz")))
    return Counter(p.launch for p in measured.curve_points if p.key.PROBE == "attention")


@pytest.mark.parametrize(
    ("folder", "want"),
    [
        ("h200x1-third", {GqaLaunchFacts(SHORT_BEFORE, 132): 51, GqaLaunchFacts(LONG, 132): 30}),  # by context
        ("h200x1-pairs-grid", {GqaLaunchFacts(SHORT_BEFORE, 132): 81}),  # one shape, said in each note
        ("h200x1", {None: 88}),  # the first campaign's notes do not say it
        (
            "h200x1-fifth",  # the shapes by context and cache, split in one wave
            {
                GqaLaunchFacts(SHORT, 132, "one wave"): 92,
                GqaLaunchFacts(LONG_BF16, 132, "one wave"): 34,
                GqaLaunchFacts(LONG, 132, "one wave"): 17,
            },
        ),
    ],
)
def test_each_gqa_point_carries_the_launch_its_results_say(folder: str, want: dict[object, int]) -> None:
    assert _launches(folder) == want


@pytest.mark.parametrize(
    ("folder", "within", "across", "unknown"),
    [
        ("h200x1-third", 14, 26, 0),
        ("h200x1-pairs-grid", 30, 10, 0),
        ("h200x1", None, None, 2),
        ("h200x1-fifth", 70, 31, 0),
    ],
)
def test_the_self_check_tells_the_recorded_launch_regimes_apart(
    folder: str, within: int | None, across: int | None, unknown: int
) -> None:
    """On the H200's files the interior figures interpolated within one launch regime err less than those across a
    launch change (docs/benchmarks.md, "Leave-one-out across the GQA kernel's launch regimes")."""
    measured = measured_from_results(tuple(load_results(WHATIF / folder / "llama-3.1-70b_base.json.gz")))
    hardware = hardware_for(GPUS["h200"], bandwidth_gbps=measured.copy_gbps)
    check = measured.engine(hardware).self_check().family("attention")
    assert check is not None and check.launch_unknown == unknown
    if within is None:
        assert check.within_launch is None and check.across_launch is None
        return
    assert check.within_launch is not None and check.across_launch is not None
    assert (check.within_launch.n, check.across_launch.n) == (within, across)
    assert check.within_launch.p90_pct < check.across_launch.p90_pct
    assert check.interior_sigma < check.across_sigma
