"""The what-if screen's knobs: numbers step in order and stop at the ends, names wrap, the current deployment's own
value is among the steps wherever it lies, a knob stepped back to now is no longer turned, and `?` lists `w`."""

from __future__ import annotations

from decodetop.tui.bindings import help_keys
from decodetop.tui.screens.whatif import help_keys as whatif_keys
from decodetop.tui.screens.whatif_knobs import KNOB_TABLE, KNOBS_BY_NAME, KnobState, chart_axis, next_axis

NOW = {
    "tp": "2",
    "ep": "1",
    "batch": "1",
    "context": "6000",
    "kv": "bf16",
    "weights": "bf16",
    "accept": "1",
    "draft": "auto",
    "launch": "graph",
    "allreduce": "auto",
    "gpu": "here",
}


def test_numbers_step_in_order_and_stop_at_the_ends() -> None:
    state = KnobState(NOW)
    assert state.step("tp", 1).value("tp") == "4" and state.step("tp", -1).value("tp") == "1"
    assert state.step("tp", -1).step("tp", -1).value("tp") == "1"  # stops at 1
    assert state.step("batch", 1).step("batch", 1).label == "batch=4"
    # 6000 is not on the grid: it sits between 4K and 8K
    assert state.step("context", 1).value("context") == "8192"
    assert state.step("context", -1).value("context") == "4096"
    assert chart_axis("context", state).values[2:5] == ("4096", "6000", "8192")


def test_names_wrap_and_a_knob_back_at_now_is_not_turned() -> None:
    state = KnobState(NOW)
    kv = KNOBS_BY_NAME["kv"].values
    assert state.step("kv", -1).value("kv") == kv[-1]  # wraps
    assert state.step("launch", 1).step("launch", 1).turned == {}
    turned = state.step("allreduce", 1).step("tp", 1)
    assert turned.label == "tp=4 allreduce=nccl"  # in the screen's order, whatever the order of the keys
    assert turned.reset().turned == {} and turned.reset().label == "now"


def test_every_knob_has_its_own_keys_and_the_axis_cycles_through_them() -> None:
    keys = [k for knob in KNOB_TABLE for k in (knob.down, knob.up)]
    assert len(keys) == len(set(keys)) and not {"w", "x", "0", "q", "escape"} & set(keys)
    names = [k.name for k in KNOB_TABLE]
    axis = "batch"
    seen = []
    for _ in names:
        axis = next_axis(axis)
        seen.append(axis)
    assert sorted(seen) == sorted(names)
    assert {key for key, _ in whatif_keys()} >= {f"{k.down} / {k.up}" for k in KNOB_TABLE}


def test_the_main_screens_help_lists_the_what_if_key() -> None:
    assert any(key == "w" and "what-if" in what for key, what in help_keys())


def test_the_gpu_knob_names_a_hardware_table_row_after_here() -> None:
    state = KnobState(NOW)
    assert state.step("gpu", 1).label == "gpu=rtx-pro-6000"  # here first, then the table's rows in order
    assert state.step("gpu", 1).step("gpu", -1).turned == {}


def test_the_draft_knob_steps_from_auto_to_a_count_and_back() -> None:
    """Draft tokens per step: the current deployment's 'auto' (as the accept length needs) first, then 1 … 8."""
    state = KnobState(NOW)
    assert state.step("draft", 1).label == "draft=1" and state.step("draft", -1).turned == {}  # auto is the end
    assert state.step("draft", 1).step("draft", 1).step("draft", -1).step("draft", -1).turned == {}
    assert chart_axis("draft", state).values[:3] == ("auto", "1", "2")
