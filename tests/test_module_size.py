"""Modules stay small enough to live in: none in src/ runs over MAX_LINES unless it is listed as known debt below.

The list may only shrink: an entry that no longer exists or is now under the limit fails too, so the list stays
true. The checks run over a planted tree as well, to show each can fail.
"""

from __future__ import annotations

from collections.abc import Set
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "decodetop"
MAX_LINES = 800

KNOWN_DEBT: frozenset[str] = frozenset()
"""Paths under src/decodetop still over MAX_LINES, each being split; shrink, never grow."""


def long_modules(root: Path, max_lines: int = MAX_LINES) -> dict[str, int]:
    """Path (relative to `root`, with /) → line count, for every .py file over `max_lines`."""
    found: dict[str, int] = {}
    for path in sorted(root.rglob("*.py")):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > max_lines:
            found[path.relative_to(root).as_posix()] = lines
    return found


def over_the_limit(found: dict[str, int], known: Set[str]) -> dict[str, int]:
    """The long modules the known-debt list does not excuse."""
    return {name: n for name, n in found.items() if name not in known}


def paid_debt(found: dict[str, int], known: Set[str]) -> list[str]:
    """Known-debt entries that are no longer long (or no longer exist): to be taken off the list."""
    return sorted(set(known) - set(found))


def test_no_module_over_the_limit_outside_the_known_debt() -> None:
    new = over_the_limit(long_modules(SRC), KNOWN_DEBT)
    assert not new, "split these by subject (lines): " + ", ".join(f"{k} ({v})" for k, v in sorted(new.items()))


def test_the_known_debt_list_is_true() -> None:
    """Empty today, so this can only fail once an entry is added: the planted tree below shows the check works."""
    paid = paid_debt(long_modules(SRC), KNOWN_DEBT)
    assert not paid, f"no longer over {MAX_LINES} lines, remove from KNOWN_DEBT: {', '.join(paid)}"


def test_both_checks_fail_on_a_planted_tree(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "big.py").write_text("x = 1\n" * 11)
    (tmp_path / "pkg" / "small.py").write_text("x = 1\n" * 10)
    found = long_modules(tmp_path, max_lines=10)
    assert found == {"pkg/big.py": 11}
    assert over_the_limit(found, frozenset()) == {"pkg/big.py": 11}
    assert over_the_limit(found, {"pkg/big.py"}) == {}
    assert paid_debt(found, {"pkg/big.py", "pkg/small.py", "pkg/gone.py"}) == ["pkg/gone.py", "pkg/small.py"]
