"""Property tests for the small parsers the host checks share."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from decodetop.collectors.checks.parsers import (
    DeviceRule,
    cmdline_value,
    format_cpulist,
    kmsg_text,
    parse_cmdline,
    parse_cpulist,
    parse_device_rule,
    parse_devices_list,
    parse_int,
    parse_name,
    parse_proc_devices,
    parse_thp_bracket,
    parse_xids,
)

cpus = st.frozensets(st.integers(0, 4095), max_size=200)


@given(cpus)
def test_cpulist_roundtrip(values: frozenset[int]) -> None:
    assert parse_cpulist(format_cpulist(values)) == values


def test_cpulist_examples() -> None:
    assert parse_cpulist("0-15,64-79\n") == frozenset([*range(16), *range(64, 80)])
    assert parse_cpulist("") == frozenset()
    assert parse_cpulist("0-7:2/4") == frozenset({0, 1, 4, 5})
    for bad in ("a-b", "5-3", "1,,2", "0-99999999", "1-2:3/0"):
        with pytest.raises(ValueError):
            parse_cpulist(bad)


@settings(max_examples=300)
@given(st.text(max_size=40))
def test_cpulist_garbage_raises_value_error_only(text: str) -> None:
    with contextlib.suppress(ValueError):
        parse_cpulist(text)


names = st.builds(
    lambda head, tail: head + tail,
    st.sampled_from("abcdefghijklmnopqrstuvwxyz/"),
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789/_-", max_size=15),
)


@given(
    st.lists(st.tuples(st.integers(0, 4095), names), max_size=30),
    st.lists(st.tuples(st.integers(0, 511), names), max_size=10),
)
def test_proc_devices_roundtrip(char: list[tuple[int, str]], block: list[tuple[int, str]]) -> None:
    text = "Character devices:\n" + "".join(f"{m:3d} {n}\n" for m, n in char) + "\nBlock devices:\n"
    text += "".join(f"{m:3d} {n}\n" for m, n in block)
    parsed = parse_proc_devices(text)
    assert list(parsed.char) == char and list(parsed.block) == block


def test_proc_devices_lookup_and_garbage() -> None:
    parsed = parse_proc_devices("Character devices:\n195 nvidia\n509 nvidia-uvm\n\nBlock devices:\n  7 loop\n")
    assert parsed.char_major("nvidia-uvm") == 509 and parsed.char_major("nvidia-caps") is None
    for bad in ("", "195 nvidia\n", "Character devices:\nxx nvidia\n"):
        with pytest.raises(ValueError):
            parse_proc_devices(bad)


@settings(max_examples=300)
@given(st.text(max_size=200))
def test_proc_devices_garbage_raises_value_error_only(text: str) -> None:
    with contextlib.suppress(ValueError):
        parse_proc_devices(text)


rules = st.builds(
    DeviceRule,
    st.sampled_from(["a", "b", "c"]),
    st.none() | st.integers(0, 4095),
    st.none() | st.integers(0, 1 << 20),
    st.sampled_from(["r", "w", "m", "rw", "rwm", "rm", "wm"]),
)


@given(st.lists(rules, max_size=20))
def test_devices_list_roundtrip(items: list[DeviceRule]) -> None:
    assert list(parse_devices_list("\n".join(str(r) for r in items))) == items


@given(rules, st.integers(0, 4095), st.integers(0, 1 << 20))
def test_rule_cover_semantics(rule: DeviceRule, major: int, minor: int) -> None:
    covered = rule.covers("c", major, minor, "rw")
    expected = (
        rule.kind in ("a", "c")
        and rule.major in (None, major)
        and rule.minor in (None, minor)
        and "r" in rule.access
        and "w" in rule.access
    )
    assert covered == expected


def test_device_rule_examples() -> None:
    assert parse_device_rule("a") == DeviceRule("a", None, None, "rwm")
    assert parse_device_rule("c 195:* rwm").covers("c", 195, 255)
    assert not parse_device_rule("c 510:* rwm").covers("c", 509, 0)
    for bad in ("c 195 rwm", "x 1:2 r", "c 1:2 q", "c a:b rw", ""):
        with pytest.raises(ValueError):
            parse_device_rule(bad)


@settings(max_examples=300)
@given(st.text(max_size=60))
def test_devices_list_garbage_raises_value_error_only(text: str) -> None:
    with contextlib.suppress(ValueError):
        parse_devices_list(text)


words = st.lists(st.text(alphabet="abcdefgmnorstvy+", min_size=1, max_size=10), min_size=1, max_size=6, unique=True)


@given(words, st.data())
def test_thp_bracket_picks_the_bracketed_word(choices: list[str], data: st.DataObject) -> None:
    active = data.draw(st.integers(0, len(choices) - 1))
    text = " ".join(f"[{w}]" if i == active else w for i, w in enumerate(choices)) + "\n"
    assert parse_thp_bracket(text) == choices[active]


def test_thp_garbage() -> None:
    for bad in ("", "always madvise never", "[always] [never]", "[]"):
        with pytest.raises(ValueError):
            parse_thp_bracket(bad)


def test_int_cmdline_kmsg_xid() -> None:
    assert parse_int(" 4\n", "x") == 4
    with pytest.raises(ValueError, match="perf: expected an integer"):
        parse_int("four", "perf")
    params = parse_cmdline("ro amd_pstate=passive quiet amd_pstate=active -- init=1\n")
    assert cmdline_value(params, "amd_pstate") == "active" and cmdline_value(params, "quiet") == ""
    assert cmdline_value(params, "init") is None
    assert kmsg_text("4,1702,4013001,-;hello; world") == "hello; world"
    events = parse_xids(["3,9,9,-;NVRM: Xid (PCI:0000:3B:00): 79, pid=123, GPU has fallen off the bus."])
    assert [(e.pci, e.code) for e in events] == [("0000:3b:00", 79)]


def test_names_are_read_as_the_kernel_writes_them() -> None:
    """cpuidle state names are free text (cpuidle-haltpoll's "haltpoll idle"), not one word."""
    assert parse_name("haltpoll idle\n", "name") == "haltpoll idle"
    assert parse_name("C1E\n", "name") == "C1E"
    assert parse_name("C\x1b[31m2\n", "name") == "C?[31m2"  # no terminal escapes reach the table
    assert parse_name("x" * 100, "name") == "x" * 64 + "…"
    for bad in ("", "\n", "  \n", "two\nlines\n"):
        with pytest.raises(ValueError, match="name: "):
            parse_name(bad, "name")


@given(st.text(max_size=80))
def test_name_garbage_raises_value_error_only(text: str) -> None:
    with contextlib.suppress(ValueError):
        shown = parse_name(text, "name")
        assert shown.strip() and "\n" not in shown and len(shown) <= 65
