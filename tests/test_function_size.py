"""Functions stay short enough to read: none in src/ runs over MAX_LINES unless it is listed as known debt below.

The list may only shrink: an entry whose function no longer exists or is now short fails too, so the list stays
true. ruff's complexity rules (C901, PLR0912, PLR0915) run in the test command beside this.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "decodetop"
MAX_LINES = 80
"""Lines from `def` to the function's last line, docstring included."""

KNOWN_DEBT: frozenset[str] = frozenset()
"""`module:qualified.name` of functions still over MAX_LINES, to be split; shrink, never grow."""


def long_functions(root: Path, max_lines: int = MAX_LINES) -> dict[str, int]:
    """`module:qualified.name` → lines, for every function under `root` (a package directory) over `max_lines`."""
    found: dict[str, int] = {}
    for path in sorted(root.rglob("*.py")):
        module = ".".join(path.relative_to(root.parent).with_suffix("").parts)
        tree = ast.parse(path.read_text(encoding="utf-8"))

        def visit(node: ast.AST, prefix: str, module: str = module) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    name = f"{prefix}{child.name}"
                    if not isinstance(child, ast.ClassDef):
                        length = (child.end_lineno or child.lineno) - child.lineno + 1
                        if length > max_lines:
                            found[f"{module}:{name}"] = length
                    visit(child, f"{name}.")

        visit(tree, "")
    return found


def test_no_function_over_the_limit_outside_the_known_debt() -> None:
    new = {name: n for name, n in long_functions(SRC).items() if name not in KNOWN_DEBT}
    assert not new, "split these (lines): " + ", ".join(f"{k} ({v})" for k, v in sorted(new.items()))


def test_the_known_debt_list_is_true() -> None:
    """Empty today, so this can only fail once an entry is added: the planted test below shows the check works."""
    paid = sorted(KNOWN_DEBT - set(long_functions(SRC)))
    assert not paid, f"no longer over {MAX_LINES} lines, remove from KNOWN_DEBT: {', '.join(paid)}"


def test_the_scan_finds_a_planted_long_function_and_a_paid_entry(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    method = "    def long(self) -> None:\n" + "".join(f"        x{i} = {i}\n" for i in range(9))
    (pkg / "mod.py").write_text("class C:\n" + method + "\n\ndef short() -> int:\n    return 1\n")
    found = long_functions(pkg, max_lines=5)
    assert found == {"pkg.mod:C.long": 10}
    known = frozenset({"pkg.mod:C.long", "pkg.mod:short"})
    assert sorted(known - set(found)) == ["pkg.mod:short"]  # a listed function that is short: the list is stale
