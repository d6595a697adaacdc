"""The attention probe's reader puts each GQA split-K point's launch onto its curve point: from the launch metrics
the point records, from the note's launch label in results written before those, and none where neither is there
(the H200 campaigns' files in benchmarks/results/whatif/)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from decodetop.budget.gqa_launch import LONG, SHORT, GqaLaunchFacts
from decodetop.probes.plan_hooks import measured_from_results
from decodetop.probes.results import load_results

WHATIF = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "whatif"


def _launches(folder: str) -> Counter[GqaLaunchFacts | None]:
    measured = measured_from_results(tuple(load_results(WHATIF / folder / "llama-3.1-70b_base.json")))
    return Counter(p.launch for p in measured.curve_points if p.key.PROBE == "attention")


@pytest.mark.parametrize(
    ("folder", "want"),
    [
        ("h200x1-third", {GqaLaunchFacts(SHORT, 132): 51, GqaLaunchFacts(LONG, 132): 30}),  # by context
        ("h200x1-pairs-grid", {GqaLaunchFacts(SHORT, 132): 81}),  # one shape, said in each note
        ("h200x1", {None: 88}),  # the first campaign's notes do not say it
    ],
)
def test_each_gqa_point_carries_the_launch_its_results_say(folder: str, want: dict[object, int]) -> None:
    assert _launches(folder) == want
