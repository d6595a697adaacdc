"""A pytest plugin (loaded by tests/conftest.py): a test whose code asks the fake NVML a call no recording holds
fails. The fake refuses such a call with FUNCTION_NOT_FOUND, as an NVML library lacking the function would, but code
that copes with the refusal would pass unseen; `@pytest.mark.nvml_unrecorded` marks the tests that make such calls
on purpose."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from decodetop.collectors.fake_nvml import FakeNvmlBackend


@pytest.fixture(autouse=True)
def _strict_fake_nvml(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    unrecorded: list[str] = []
    monkeypatch.setattr(FakeNvmlBackend, "on_unrecorded", unrecorded.append)
    yield
    if unrecorded and request.node.get_closest_marker("nvml_unrecorded") is None:
        calls = ", ".join(sorted(set(unrecorded)))
        pytest.fail(f"the code made NVML calls no recording holds (record them on a GPU machine): {calls}")
