"""No import cycle in decodetop, function-level and TYPE_CHECKING imports included: a cycle hidden inside a function
still ties two modules together (a newcomer cannot read one without the other, and a change to either can break
the import order). The import graph is grimp's, the one import-linter checks the layer contracts on; a planted cycle
in a copy of the package proves the check can fail."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CYCLES = """
import json, sys
import grimp

graph = grimp.build_graph("decodetop", cache_dir=None)
modules = sorted(m for m in graph.modules if m.startswith("decodetop"))
edges = {m: sorted(x for x in graph.find_modules_directly_imported_by(m) if x.startswith("decodetop")) for m in modules}
index, low, stack, on_stack, cycles = {}, {}, [], set(), []


def visit(start):
    # Tarjan's strongly connected components, iteratively (the graph is a few hundred modules deep at most)
    work = [(start, iter(edges[start]))]
    index[start] = low[start] = len(index)
    stack.append(start)
    on_stack.add(start)
    while work:
        node, children = work[-1]
        child = next(children, None)
        if child is None:
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
        elif child not in index:
            index[child] = low[child] = len(index)
            stack.append(child)
            on_stack.add(child)
            work.append((child, iter(edges[child])))
        elif child in on_stack:
            low[node] = min(low[node], index[child])


for module in modules:
    if module not in index:
        visit(module)
print(json.dumps(sorted(cycles)))
"""


def _cycles(src: Path) -> list[list[str]]:
    pytest.importorskip("grimp", reason="grimp comes with import-linter (the test extra)")
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run(
        [sys.executable, "-c", CYCLES], check=True, capture_output=True, text=True, env=env, cwd=src, timeout=300
    )
    found: list[list[str]] = json.loads(out.stdout.strip().splitlines()[-1])
    return found


def test_no_module_takes_part_in_an_import_cycle() -> None:
    assert _cycles(ROOT / "src") == []


@pytest.mark.parametrize(
    ("module", "planted", "expected"),
    [
        # a function-level import back into a module that imports this one (the way cycles used to hide)
        (
            "budget/ranks.py",
            "\n\ndef _planted() -> None:\n    from decodetop.budget.text import format_budget_table  # noqa\n",
            ("decodetop.budget.ranks", "decodetop.budget.text"),
        ),
        # a types-only import (the family records naming the spec they fill)
        (
            "budget/families/base.py",
            "\nfrom typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
            "    from decodetop.budget.spec import ModelSpec  # noqa\n",
            ("decodetop.budget.families.base", "decodetop.budget.spec"),
        ),
        # a module-level one across packages of the same layer order
        (
            "probes/plan_hooks.py",
            "\nimport decodetop.pipeline.composition  # noqa\n",
            ("decodetop.probes.plan_hooks", "decodetop.pipeline.composition"),
        ),
    ],
)
def test_a_planted_cycle_is_found(tmp_path: Path, module: str, planted: str, expected: tuple[str, ...]) -> None:
    src = tmp_path / "src"
    shutil.copytree(ROOT / "src" / "decodetop", src / "decodetop", ignore=shutil.ignore_patterns("__pycache__"))
    target = src / "decodetop" / module
    target.write_text(target.read_text(encoding="utf-8") + planted, encoding="utf-8")
    cycles = _cycles(src)
    assert len(cycles) == 1, cycles
    assert set(expected) <= set(cycles[0]), cycles
