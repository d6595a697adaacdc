"""`decodetop.inert` marks controls, ESC, C1, separators, bidirectional controls and lone surrogates; the CLI tables,
`fit_text` and the stream guard every headless command prints through use it. Property tests (hypothesis) feed
arbitrary text with controls and Rich markup: nothing unsafe comes out, text stays one line where it must, and
brackets stay the literal text they were (the commands' own output: tests/test_hostile_output.py)."""

from __future__ import annotations

import dataclasses
import io
import sys

from hypothesis import given
from hypothesis import strategies as st

from decodetop.collectors.checks.result import Status
from decodetop.inert import InertStream, guard_streams, inert, inert_data, inert_lines, is_inert
from decodetop.textfmt import fit_text, shorten, table
from tests.helpers.hostile_text import assert_inert, hostile_text


def test_every_control_is_marked_and_the_rest_kept() -> None:
    assert inert("\x1b]0;PWN\x07") == "␛]0;PWN␇"
    assert inert("a\nb\tc\r") == "a␊b␉c␍"
    assert inert("\x7f\x9b\u202e\u2028") == "␡\\u009b\\u202e\\u2028"
    assert inert("\ud800x") == "\ufffdx"
    assert inert("GPU 漢字 é 🚀 [bold]") == "GPU 漢字 é 🚀 [bold]"  # any script, emoji and brackets stay
    assert inert(12) == "12"
    assert is_inert("plain") and not is_inert("\x1b")
    assert inert_lines("a\n\tb\x1bc") == "a\n\tb␛c"


@given(hostile_text)
def test_inert_is_safe_idempotent_and_printable(text: str) -> None:
    once = inert(text)
    assert_inert(once)
    assert "\n" not in once and "\t" not in once  # one line, always
    assert inert(once) == once
    once.encode("utf-8")  # a lone surrogate would raise here: it is marked instead


@given(st.lists(st.lists(hostile_text, min_size=3, max_size=3), min_size=1, max_size=5), hostile_text)
def test_a_cli_table_never_passes_a_control(rows: list[list[str]], header: str) -> None:
    for width in (None, 40):
        text = table([header, "ms", "note"], [[r[0], 1.5, r[2]] for r in rows], width=width, row_notes=[[rows[0][1]]])
        assert_inert(text)
        for row in rows:  # markup stays the literal text it was (inert does not touch brackets)
            assert "[" not in row[0] or "[" in text
    assert_inert(fit_text("\n".join(r[1] for r in rows), width=30))


@given(hostile_text)
def test_the_stream_guard_marks_what_a_command_prints(text: str) -> None:
    sink = io.StringIO()
    guard = InertStream(sink)
    assert guard.write(text) == len(text)
    assert_inert(sink.getvalue())
    assert sink.getvalue().count("\n") == text.count("\n")  # the command's own lines stay lines


def test_guard_streams_puts_the_streams_back() -> None:
    before = (sys.stdout, sys.stderr)
    with guard_streams():
        assert isinstance(sys.stdout, InertStream) and isinstance(sys.stderr, InertStream)
    assert (sys.stdout, sys.stderr) == before


def test_shorten_cuts_and_marks() -> None:
    assert shorten("x" * 100_000, 40) == "x" * 39 + "…"
    assert shorten("a\x1bb", 10) == "a␛b"


def test_inert_data_marks_every_string_however_deep_and_copies_nothing_clean() -> None:
    @dataclasses.dataclass(frozen=True)
    class Leaf:
        name: str
        status: Status
        tags: tuple[str, ...] = ()
        facts: dict[str, str] = dataclasses.field(default_factory=dict)

    @dataclasses.dataclass(frozen=True)
    class Tree:
        leaves: tuple[Leaf, ...]
        count: int

    clean = Tree((Leaf("a", Status.PASS, ("t",), {"k": "v"}),), 1)
    assert inert_data(clean) is clean  # a steady tick copies nothing
    dirty = Tree((Leaf("a\x1b]0;x\x07", Status.WARN, ("\x9b",), {"k\x1b": ["v\r"]}),), 1)  # type: ignore[dict-item]
    shown = inert_data(dirty)
    leaf = shown.leaves[0]
    assert leaf.name == "a␛]0;x␇" and leaf.tags == ("\\u009b",) and leaf.facts == {"k␛": ["v␍"]}
    assert leaf.status is Status.WARN  # an enum member is left as it is (a str enum is no text from outside)
    assert shown.count == 1 and dirty.leaves[0].name == "a\x1b]0;x\x07"  # the original is untouched
