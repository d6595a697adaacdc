"""Shared fixtures of the trace tests: the recorded traces and a helper to write small trace files."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "traces"


def fixture(name: str) -> Path:
    """A recorded trace under tests/fixtures/traces (see benchmarks/record_traces.py)."""
    path = FIXTURES / f"{name}.trace.json.gz"
    assert path.is_file(), path
    return path


def write_trace(path: Path, events: list[dict[str, Any]], **top: Any) -> Path:
    """Write a Chrome trace object with these events (gzipped when the name ends in .gz)."""
    text = json.dumps({"schemaVersion": 1, **top, "traceEvents": events})
    if path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


@pytest.fixture
def h200_eager_planted() -> Path:
    return fixture("h200_eager_planted")
