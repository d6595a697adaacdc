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


def _long_functions() -> dict[str, int]:
    found: dict[str, int] = {}
    for path in sorted(SRC.rglob("*.py")):
        module = ".".join(path.relative_to(SRC.parent).with_suffix("").parts)
        tree = ast.parse(path.read_text(encoding="utf-8"))

        def visit(node: ast.AST, prefix: str, module: str = module) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    name = f"{prefix}{child.name}"
                    if not isinstance(child, ast.ClassDef):
                        length = (child.end_lineno or child.lineno) - child.lineno + 1
                        if length > MAX_LINES:
                            found[f"{module}:{name}"] = length
                    visit(child, f"{name}.")

        visit(tree, "")
    return found


def test_no_function_over_the_limit_outside_the_known_debt() -> None:
    new = {name: n for name, n in _long_functions().items() if name not in KNOWN_DEBT}
    assert not new, "split these (lines): " + ", ".join(f"{k} ({v})" for k, v in sorted(new.items()))


def test_the_known_debt_list_is_true() -> None:
    paid = sorted(KNOWN_DEBT - set(_long_functions()))
    assert not paid, f"no longer over {MAX_LINES} lines, remove from KNOWN_DEBT: {', '.join(paid)}"
