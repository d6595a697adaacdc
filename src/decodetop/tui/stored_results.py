"""Provides StoredResults: what the results history holds for this session, read once at start in a worker.

Every stored probe record is kept with its fingerprint; only those the budget source accepts (same host, devices,
versions and scenario) are restored into the probe rows and the budget. The rest are other scenarios: counted in
the status line, listed by `b`, never composed. The baseline (`s`) is kept beside them.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from decodetop.history import KIND_BASELINE, KIND_PROBE, Fingerprint, History, HistoryEntry
from decodetop.settings import Settings
from decodetop.tui.baseline import BASELINE_NAME
from decodetop.tui.messages import BaselineSaved, HistoryLoaded
from decodetop.tui.other_scenarios import OtherScenario, other_scenarios
from decodetop.tui.screens.budget_details import stored_line

Accepts = Callable[[Fingerprint | None, Settings], bool]
"""The budget source's rule: may a stored record with this fingerprint feed the budget for these settings?"""


class StoredResults:
    """The history's probe records and baseline, and which of the records feed the current budget."""

    def __init__(self, history: History | None, accepts: Accepts, baseline_name: str = BASELINE_NAME) -> None:
        self.history = history
        self.accepts = accepts
        self.baseline_name = baseline_name
        """The key of the baseline this session diffs against (the demo's is its own)."""
        self.probes: list[HistoryEntry] = []
        """Every stored probe result; only those whose fingerprint the budget accepts are restored."""
        self.baseline: HistoryEntry | None = None
        self.others: tuple[OtherScenario, ...] = ()
        """Stored probe records the budget does not take (another scenario, host or device; unknown origin)."""

    def read(self) -> HistoryLoaded:
        """(worker thread) Read the history file."""
        if self.history is None:
            return HistoryLoaded(entries=[], problem=None)
        loaded = self.history.load()
        return HistoryLoaded(entries=list(loaded.entries), problem=loaded.problem)

    def save_baseline(self, payload: dict[str, object], now_s: float) -> BaselineSaved:
        """(worker thread) Write the baseline (`s`) to the history; the message says what was stored, or why not."""
        if self.history is None:
            return BaselineSaved(entry=None, problem="no history file in this session")
        try:
            entry = self.history.record(KIND_BASELINE, self.baseline_name, payload, recorded_at_s=now_s)
        except (OSError, ValueError) as exc:
            return BaselineSaved(entry=None, problem=f"baseline not saved: {exc}")
        return BaselineSaved(entry=entry)

    def take(self, message: HistoryLoaded) -> None:
        """Keep what was read: the probe records and the baseline (a newer baseline saved meanwhile stays)."""
        baseline: HistoryEntry | None = None
        for entry in message.entries:
            if entry.kind == KIND_BASELINE and entry.key == self.baseline_name:
                baseline = entry
        self.probes = [e for e in message.entries if e.kind == KIND_PROBE]
        if baseline is not None:
            self.baseline = baseline

    def matching(self, probe_id: str, settings: Settings) -> HistoryEntry | None:
        """The newest stored result of `probe_id` measured on this setup for this scenario (fingerprints compared by
        the budget source); records from elsewhere or of unknown origin never feed the budget."""
        found = [e for e in self.probes if e.key == probe_id and self.accepts(e.fingerprint, settings)]
        return max(found, key=lambda e: e.recorded_at_s) if found else None

    def verdicts(self, settings: Settings) -> dict[object, bool] | None:
        """Whether each distinct fingerprint in the history feeds the budget now (asked once per fingerprint); None
        when the budget cannot say (a model it cannot handle: the composition says why)."""
        verdicts: dict[object, bool] = {}
        try:
            for entry in self.probes:
                if entry.fingerprint not in verdicts:
                    verdicts[entry.fingerprint] = self.accepts(entry.fingerprint, settings)
        except Exception:  # the composition's worker reports the same failure in the status line
            return None
        return verdicts

    def split(self, settings: Settings) -> None:
        """Find the stored records of other scenarios (listed by `b`, counted in the status line)."""
        verdicts = self.verdicts(settings)
        self.others = () if verdicts is None else other_scenarios(self.probes, lambda fp: verdicts.get(fp, False))

    def feeding(self, settings: Settings, probe_ids: Collection[str]) -> list[HistoryEntry]:
        """The stored records of planned probes that feed the budget for `settings`."""
        verdicts = self.verdicts(settings) or {}
        return [e for e in self.probes if e.key in probe_ids and verdicts.get(e.fingerprint)]

    def newest_feeding(self, settings: Settings, probe_ids: Collection[str]) -> HistoryEntry | None:
        """The newest of `feeding` (None when no stored record feeds the budget)."""
        return max(self.feeding(settings, probe_ids), key=lambda e: e.recorded_at_s, default=None)

    def stored_line(self, settings: Settings, probe_ids: Collection[str], now_s: float) -> str:
        """How many probes' stored results feed this budget and how old the newest is (`b`)."""
        feeding = self.feeding(settings, probe_ids)
        newest = max((e.recorded_at_s for e in feeding), default=None)
        return stored_line(len({e.key for e in feeding}), newest, now_s)
