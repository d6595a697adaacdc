"""Runs one call of a test module in a fresh process under Triton's CPU interpreter (`TRITON_INTERPRET=1` is read
when Triton kernels are defined, so it needs a process of its own), in the isolated environment every test
subprocess gets (`tests.helpers.env.subprocess_env`), and returns what the call returned, through JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.helpers.env import subprocess_env

ROOT = Path(__file__).resolve().parents[2]


def interpreted_call(test_file: Path, call: str, *, timeout_s: float = 600) -> Any:
    """`call` (Python source, e.g. "block_outputs('mixtral-8x7b', 'auto')") evaluated in the module `test_file` under
    the interpreter; the subprocess's stderr tail on failure."""
    code = (
        "import importlib.util, json\n"
        f"spec = importlib.util.spec_from_file_location('t', {str(test_file)!r})\n"
        "t = importlib.util.module_from_spec(spec); spec.loader.exec_module(t)\n"
        f"print(json.dumps(t.{call}))\n"
    )
    env = subprocess_env(pythonpath=(ROOT,), TRITON_INTERPRET="1")
    done = subprocess.run(
        [sys.executable, "-c", code], check=False, env=env, capture_output=True, text=True, timeout=timeout_s
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
