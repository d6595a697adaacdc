"""Provides `other_scenarios`: the stored probe records that do not feed the current budget (another model, TP,
host, device or software; or of unknown origin), grouped by where they were measured, for the budget's details.

They are listed, never composed: the budget source's `accepts` decides, the same rule that picks what it restores.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import PurePath

from decodetop.history import KIND_PROBE, Fingerprint, HistoryEntry, format_ago


def origin_text(fp: Fingerprint | None) -> str:
    """Where a stored record was measured: "on host-a (2 × NVIDIA H200)", "on host-b (2 CPU ranks)"."""
    if fp is None:
        return "of unknown origin (stored before records said where they were measured)"
    if fp.device_kind == "cpu":
        device = f"{fp.gpu_count} CPU rank{'s' if fp.gpu_count != 1 else ''}"
    else:
        device = f"{fp.gpu_count} × {fp.gpu_name or 'GPU'}"
    return f"on {fp.host_id} ({device})"


@dataclass(frozen=True)
class OtherScenario:
    """Stored probe records of one fingerprint that the current budget does not take."""

    fingerprint: Fingerprint | None
    """None: records written before fingerprints (origin unknown)."""
    records: int
    newest_at_s: float

    def _scenario_field(self, name: str) -> str:
        if self.fingerprint is None:
            return ""
        for part in self.fingerprint.scenario.split(";"):
            key, sep, value = part.partition("=")
            if sep and key == name:
                return value
        return ""

    @property
    def model(self) -> str:
        """The model as a user named it: a preset's name, or the checkpoint's folder ('?' when not said)."""
        kind, _, value = self._scenario_field("model").partition(":")
        if kind == "config" and value:
            path = PurePath(value)
            return path.parent.name if path.name == "config.json" and path.parent.name else path.name
        return value or "?"

    @property
    def where(self) -> str:
        """ "on host-a (2 × NVIDIA H200)"."""
        return origin_text(self.fingerprint)

    def line(self, now_s: float) -> str:
        """ "llama-3.1-70b · TP 2 · on host-a (2 CPU ranks) · 7 records, newest 2h ago"."""
        plural = "s" if self.records != 1 else ""
        when = f"{self.records} record{plural}, newest {format_ago(max(0.0, now_s - self.newest_at_s))}"
        if self.fingerprint is None:
            return f"{self.where} · {when}"
        tp = self._scenario_field("tp")
        return " · ".join(p for p in (self.model, f"TP {tp}" if tp else "", self.where, when) if p)


def other_scenarios(
    entries: Iterable[HistoryEntry], accepts: Callable[[Fingerprint | None], bool]
) -> tuple[OtherScenario, ...]:
    """The stored probe records `accepts` turns away, one `OtherScenario` per fingerprint, newest first
    (`accepts` is asked once per distinct fingerprint)."""
    counts: dict[Fingerprint | None, int] = {}
    newest: dict[Fingerprint | None, float] = {}
    for entry in entries:
        if entry.kind != KIND_PROBE:
            continue
        fp = entry.fingerprint
        counts[fp] = counts.get(fp, 0) + 1
        newest[fp] = max(newest.get(fp, entry.recorded_at_s), entry.recorded_at_s)
    others = [OtherScenario(fp, n, newest[fp]) for fp, n in counts.items() if not accepts(fp)]
    return tuple(sorted(others, key=lambda o: o.newest_at_s, reverse=True))


def others_summary(others: Iterable[OtherScenario]) -> str:
    """ "9 stored records of 2 other scenarios" ("" when there are none)."""
    found = list(others)
    if not found:
        return ""
    records = sum(o.records for o in found)
    return (
        f"{records} stored record{'s' if records != 1 else ''} of {len(found)} other "
        f"scenario{'s' if len(found) != 1 else ''}"
    )
