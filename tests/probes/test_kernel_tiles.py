"""The fused-MoE tile store (`kernels.tiles`): entries of three, five and six numbers read back, six written, malformed
ones ignored; the tuner's `mma` candidates tried for gate_up only (the timing faked: it needs a GPU)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from decodetop.probes.worker.kernels import tiles as tile_store
from decodetop.probes.worker.kernels.tiles import TileChoice, Tiles

GPU = "NVIDIA H200"
SHAPE = tile_store.shape_id(1, 8, 7168, 256, "bf16")


def _store(path: Path, gate_up: object, down: object) -> None:
    entry = {"gate_up": gate_up, "down": down, "gate_up_us": 12.5, "down_us": 9.0, "tried": 29}
    path.write_text(json.dumps({GPU: {SHAPE: entry}}))


@pytest.mark.parametrize(
    ("stored", "want"),
    [
        ([16, 512, 4], Tiles(16, 512, 4)),
        ([8, 1024, 4, 0, 2], Tiles(8, 1024, 4, 0, 2)),
        ([16, 256, 4, 3, 2, 1], Tiles(16, 256, 4, 3, 2, mma=True)),
        ([16, 256, 8, 0, 1, 0], Tiles(16, 256, 8)),
    ],
)
def test_entries_of_three_five_and_six_numbers_read_back(tmp_path: Path, stored: list[int], want: Tiles) -> None:
    path = tmp_path / tile_store.STORE_NAME
    _store(path, stored, [16, 256, 4])
    found = tile_store.lookup(GPU, SHAPE, path)
    assert found is not None and found.cached
    assert (found.gate_up, found.down, found.gate_up_us, found.tried) == (want, Tiles(16, 256, 4), 12.5, 29)


@pytest.mark.parametrize(
    "stored",
    [[16, 256], [16, 256, 4, 0], [16, 256, 4, 0, 1, 2], [16, 256, 4, 0, 1, True], [16, 256, 4, 0, 0, 1], "16×256"],
)
def test_malformed_entries_are_not_read(tmp_path: Path, stored: object) -> None:
    path = tmp_path / tile_store.STORE_NAME
    _store(path, stored, [16, 256, 4])
    assert tile_store.lookup(GPU, SHAPE, path) is None


@pytest.mark.parametrize("field", ["gate_up_us", "down_us", "step_us"])
@pytest.mark.parametrize("value", ["12", True, -1.0, "NaN", 10**400, None, [1.0]])
def test_a_crafted_time_is_not_read(tmp_path: Path, field: str, value: object) -> None:
    """A time that is no finite number ≥ 0 (a 400-digit integer, past float's range, included) leaves the entry
    unread rather than raising."""
    path = tmp_path / tile_store.STORE_NAME
    entry = {"gate_up": [16, 256, 4], "down": [16, 256, 4], "gate_up_us": 12.5, "down_us": 9.0, "tried": 29}
    entry[field] = float("nan") if value == "NaN" else value
    path.write_text(json.dumps({GPU: {SHAPE: entry}}))
    assert tile_store.lookup(GPU, SHAPE, path) is None


def test_writes_have_six_numbers_and_read_back_the_same(tmp_path: Path) -> None:
    path = tmp_path / tile_store.STORE_NAME
    choice = TileChoice(Tiles(32, 256, 4, 3, 1, mma=True), Tiles(16, 256, 4, 0, 4), 14.0, 8.5, 29, False)
    tile_store.remember(GPU, SHAPE, choice, path)
    entry = json.loads(path.read_text())[GPU][SHAPE]
    assert entry["gate_up"] == [32, 256, 4, 3, 1, 1] and entry["down"] == [16, 256, 4, 0, 4, 0]
    found = tile_store.lookup(GPU, SHAPE, path)
    assert found is not None and (found.gate_up, found.down) == (choice.gate_up, choice.down)
    assert "32×256/4w/3st mma" in found.text and "from the tile store" in found.text
    assert (found.form, found.step_us) == (tile_store.FORM_LATE, 0.0)


def test_the_form_and_step_time_read_back_and_an_entry_without_a_form_is_the_late_one(tmp_path: Path) -> None:
    path = tmp_path / tile_store.STORE_NAME
    choice = TileChoice(Tiles(16, 512), Tiles(128, 256, 8), 12.0, 9.0, 31, False, tile_store.FORM_EARLY, 20.5)
    tile_store.remember(GPU, SHAPE, choice, path)
    found = tile_store.lookup(GPU, SHAPE, path)
    assert found is not None and (found.form, found.step_us) == (tile_store.FORM_EARLY, 20.5)
    assert "form early (20.5 µs a step)" in found.text
    _store(path, [16, 256, 4], [16, 256, 4])  # no "form": written for the late form
    found = tile_store.lookup(GPU, SHAPE, path)
    assert found is not None and found.form == tile_store.FORM_LATE
    entry = json.loads(path.read_text())
    entry[GPU][SHAPE]["form"] = "sideways"
    path.write_text(json.dumps(entry))
    assert tile_store.lookup(GPU, SHAPE, path) is None


def test_the_store_key_names_this_kernel_version() -> None:
    assert SHAPE.endswith(f"kernel=v{tile_store.KERNEL_VERSION}") and tile_store.KERNEL_VERSION >= 4


def test_the_tuner_tries_the_mma_tiles_for_gate_up_only(monkeypatch: pytest.MonkeyPatch) -> None:
    # The fake timing: an mma tile of gate_up is fastest, the down kernel's fastest a reduction-form split.
    speed = {"gate_up": {Tiles(32, 256, 4, 3, 1, mma=True): 1.0}, "down": {Tiles(16, 256, 4, 0, 4): 2.0}}
    tried: dict[str, list[Tiles]] = {"gate_up": [], "down": []}

    def launcher(kernel: str) -> Callable[[Tiles], Callable[[], None]]:
        def build(tiles: Tiles) -> Callable[[], None]:
            tried[kernel].append(tiles)

            def go() -> None:
                return None

            go.us = speed[kernel].get(tiles, 10.0)  # type: ignore[attr-defined]
            return go

        return build

    monkeypatch.setattr(tile_store, "_time", lambda fn: fn.us)
    choice = tile_store.tune(launcher("gate_up"), launcher("down"))
    assert tried["gate_up"] == list(tile_store.TILE_CANDIDATES)
    assert tried["down"] == [t for t in tile_store.TILE_CANDIDATES if not t.mma] and len(tried["down"]) < len(
        tried["gate_up"]
    )
    assert choice.gate_up == Tiles(32, 256, 4, 3, 1, mma=True) and choice.down == Tiles(16, 256, 4, 0, 4)
    assert (choice.gate_up_us, choice.down_us, choice.cached) == (1.0, 2.0, False)


def test_the_tuner_times_whole_steps_in_every_form_and_keeps_the_fastest(monkeypatch: pytest.MonkeyPatch) -> None:
    # Alone, 16×256 is the fastest down tile; as a whole step, a prefetching 128-row down in the early form wins.
    big = tile_store.PREFETCH_CANDIDATES[0]
    alone = {Tiles(16, 256): 2.0, big: 5.0}
    steps: list[tuple[Tiles, Tiles, str]] = []

    def kernel(tiles: Tiles) -> Callable[[], None]:
        def go() -> None:
            return None

        go.us = alone.get(tiles, 10.0)  # type: ignore[attr-defined]
        return go

    def step(up: Tiles, down: Tiles, form: str) -> Callable[[], None]:
        steps.append((up, down, form))

        def go() -> None:
            return None

        go.us = 3.0 if (down, form) == (big, tile_store.FORM_EARLY) else 8.0  # type: ignore[attr-defined]
        return go

    monkeypatch.setattr(tile_store, "_time", lambda fn: fn.us)
    choice = tile_store.tune(kernel, kernel, launch_step=step)
    assert {form for _, _, form in steps} == set(tile_store.FORMS)
    assert len({up for up, _, _ in steps}) == tile_store.STEP_GATE_UP
    assert (choice.down, choice.form, choice.step_us, choice.down_us) == (big, tile_store.FORM_EARLY, 3.0, 5.0)
    assert tile_store.tune(kernel, kernel).form == tile_store.FORM_LATE  # no step launcher: each kernel alone


def test_every_mma_candidate_is_a_whole_dot_tile() -> None:
    assert tile_store.MMA_CANDIDATES and all(t.mma for t in tile_store.MMA_CANDIDATES)
    for t in tile_store.MMA_CANDIDATES:
        assert t.block_n >= 16 and t.block_k >= 16 and t.num_stages >= 1, t
