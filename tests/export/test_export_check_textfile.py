"""`decodetop check --prometheus-textfile PATH`: the checks land in a node_exporter textfile (atomically) whose
exit-code gauge matches the command's exit code; a bad path is one clear line and exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import require_tool
from tests.helpers.env import subprocess_env

SRC = Path(__file__).resolve().parents[2] / "src"


def _check(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = subprocess_env(DECODETOP_STATE_DIR=str(tmp_path / "state"), DECODETOP_CONFIG_DIR=str(tmp_path / "config"))
    return subprocess.run(
        [sys.executable, "-m", "decodetop", "check", *extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_check_writes_textfile_matching_its_exit_code(tmp_path: Path) -> None:
    target = tmp_path / "textfile_collector" / "decodetop.prom"
    result = _check(tmp_path, "--prometheus-textfile", str(target))
    assert result.returncode in (0, 1, 2, 3), result.stderr
    text = target.read_text()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    assert samples[("decodetop_check_exit_code", ())] == result.returncode
    statuses = [labels for name, labels in samples if name == "decodetop_check_status"]
    assert statuses, "no check in the textfile"
    assert ("decodetop_check_last_run_timestamp_seconds", ()) in samples
    assert [p.name for p in target.parent.iterdir()] == ["decodetop.prom"]  # no temporary file left
    promtool = subprocess.run(
        [require_tool("promtool"), "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    assert promtool.returncode == 0, promtool.stdout + promtool.stderr


def test_check_textfile_bad_path_is_exit_2(tmp_path: Path) -> None:
    result = _check(tmp_path, "--prometheus-textfile", str(tmp_path / "decodetop.txt"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("decodetop: error: --prometheus-textfile")
    assert ".prom" in result.stderr
    assert not (tmp_path / "decodetop.txt").exists()
