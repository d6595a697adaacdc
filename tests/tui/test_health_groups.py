"""The health panel collapses the rows of one check and status (P7 on every GPU pair) into one counted row; enter on it
lists every subject."""

from __future__ import annotations

from collections.abc import Callable
from itertools import combinations
from pathlib import Path

import pytest
from textual.widgets import Static

from decodetop.collectors.checks.result import CheckResult, Status
from decodetop.tui.messages import ChecksReady
from decodetop.tui.screens.details import CheckDetailScreen, CheckGroupDetailScreen
from decodetop.tui.widgets.health_panel import HealthPanel, group_checks, sorted_checks

from .conftest import MessageLog, make_app, wait_until
from .fakes import FakeChecks, failing_checks, make_sources

PAIRS = list(combinations(range(8), 2))
"""Eight GPUs' pairs, each way: the 56 rows a real host's P7 reads when NVML cannot say the topology."""


def _p7(a: int, b: int, status: Status = Status.UNKNOWN, observed: str = "") -> CheckResult:
    return CheckResult(
        f"P7:GPU{a}-GPU{b}",
        "GPU-pair topology",
        status,
        observed or "common ancestor unknown (NVML: not supported)",
        "report only; pairs at SYS get poor PCIe P2P",
        "PCIe P2P across the CPU interconnect is slow",
        "place tensor-parallel ranks on GPUs under one switch",
        subject=f"GPU{a}-GPU{b}",
    )


def _host_checks() -> list[CheckResult]:
    """The fake host's checks, 56 unknown P7 rows (both directions of each pair), two at NODE (info)."""
    p7 = [_p7(a, b) for a, b in PAIRS] + [_p7(b, a) for a, b in PAIRS]
    p7[:2] = [_p7(0, 1, Status.INFO, "common ancestor NODE (20)"), _p7(0, 2, Status.INFO, "common ancestor NODE (20)")]
    info = CheckResult("C16", "host context", Status.INFO, "bare metal", "")
    return [*failing_checks(), *p7, info]


def test_rows_of_one_check_and_status_collapse_in_status_order() -> None:
    groups = group_checks(sorted_checks(tuple(_host_checks())))
    assert [(g[0].check_id.partition(":")[0], g[0].status, len(g)) for g in groups] == [
        ("N3", Status.FAIL, 1),
        ("P1", Status.FAIL, 1),
        ("C1", Status.WARN, 1),
        ("P7", Status.UNKNOWN, 54),
        ("C3", Status.PASS, 1),
        ("N12", Status.PASS, 1),
        ("C5", Status.INFO, 1),
        ("C16", Status.INFO, 1),
        ("P7", Status.INFO, 2),
    ]
    assert sum(len(g) for g in groups) == len(_host_checks())  # every check in exactly one row


async def test_a_collapsed_row_counts_and_enter_lists_every_subject(tmp_path: Path) -> None:
    log = MessageLog()
    app = make_app(make_sources(checks=FakeChecks(_host_checks())))
    async with app.run_test(size=(120, 40), message_hook=log) as pilot:
        await wait_until(pilot, lambda: bool(log.of(ChecksReady)), "checks")
        await pilot.press("3")
        panel = app.query_one("#health-panel", HealthPanel)
        await wait_until(pilot, lambda: panel.table.row_count == 9, "nine rows for 63 checks")
        summary = str(app.query_one("#health-summary", Static).content)
        assert "2 fail · 1 warn · 54 unknown · 2 pass · 4 info" in summary  # the counts stay per check
        row = [str(c) for c in panel.table.get_row_at(3)]
        assert row[:4] == ["unknown", "P7 ×54", "GPU-pair topology", "common ancestor unknown (NVML: not supported)"]
        assert [str(c) for c in panel.table.get_row_at(8)][1:4:2] == ["P7 ×2", "common ancestor NODE (20)"]
        panel.table.focus()
        panel.table.move_cursor(row=3)
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, CheckGroupDetailScreen), "group details")
        body = str(app.screen.query_one("#check-group-detail-body", Static).content)
        assert "status: unknown ×54" in body and "how to fix" in body
        assert body.count("GPU-pair topology") == 1 and "GPU7-GPU6: common ancestor unknown" in body
        assert sum(line.startswith("  GPU") for line in body.splitlines()) == 54
        await pilot.press("escape")
        await wait_until(pilot, lambda: not isinstance(app.screen, CheckGroupDetailScreen), "closed")
        panel.table.move_cursor(row=0)
        await pilot.press("enter")  # a single check: its own details, as before
        await wait_until(pilot, lambda: isinstance(app.screen, CheckDetailScreen), "check details")


def test_rows_that_differ_show_each_value_once() -> None:
    from decodetop.tui.widgets.health_panel import group_observed

    same = (_p7(0, 1), _p7(0, 2))
    assert group_observed(same) == "common ancestor unknown (NVML: not supported)"
    mixed = (*same, _p7(0, 3, observed="common ancestor unknown (NVML: timeout)"))
    assert group_observed(mixed).startswith("2 values: common ancestor unknown (NVML: not supported) · ")


@pytest.mark.parametrize("size", [(80, 24), (120, 40), (200, 50)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_snapshot_health_with_collapsed_pairs(snap_compare: Callable[..., bool], size: tuple[int, int]) -> None:
    app = make_app(make_sources(checks=FakeChecks(_host_checks())))

    async def health_tab(pilot: object) -> None:
        from textual.pilot import Pilot

        assert isinstance(pilot, Pilot)
        panel = app.query_one("#health-panel", HealthPanel)
        await pilot.press("3")
        await wait_until(pilot, lambda: panel.table.row_count == 9, "rows")

    assert snap_compare(app, terminal_size=size, run_before=health_tab)
