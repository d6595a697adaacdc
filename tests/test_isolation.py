"""The suite writes nothing outside its temp dirs: a representative part of it (settings and history files, check
baselines and archives, a probe group's rank log, the CLI in subprocesses, the UI saving settings) runs in a
subprocess whose HOME and XDG dirs are read-only, and must pass and leave them as they were.

Read-only is enforced by permissions (as in CI, which runs unprivileged); as root, which ignores them, by a
read-only bind mount in a private mount namespace (`unshare -rm`) where that is allowed. Either way the tree is
compared before and after. `DECODETOP_TEST_READONLY_HOME=1 bash scripts/test` runs the whole suite that way.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.env import ISOLATED_VARS, SRC, subprocess_env

ROOT = Path(__file__).resolve().parents[1]
SUBSET = (
    "tests/test_settings.py",
    "tests/test_history.py",
    "tests/commands/test_check.py",
    "tests/commands/test_probe.py::test_json_to_stdout_is_only_json",
    "tests/commands/test_probe.py::test_failed_probe_exits_1_with_traceback_on_stderr",
    "tests/probes/test_controller.py::test_rank_output_goes_to_the_rank_log_not_the_terminal",
    "tests/tui/test_settings_save.py",
)
DESELECT = ("not collect_then_root",)
"""Reads the live host's kernel log, which a private user namespace may not (/dev/kmsg): nothing about HOME."""


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under `root` with its mode and modification time."""
    return {str(p.relative_to(root)): (p.lstat().st_mode, p.lstat().st_mtime_ns) for p in sorted(root.rglob("*"))} | {
        ".": (root.lstat().st_mode, root.lstat().st_mtime_ns)
    }


def _read_only_home(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    home = tmp_path / "home"
    dirs = {
        "HOME": home,
        "XDG_CONFIG_HOME": home / ".config",
        "XDG_STATE_HOME": home / ".local" / "state",
        "XDG_DATA_HOME": home / ".local" / "share",
        "XDG_CACHE_HOME": home / ".cache",
    }
    for path in dirs.values():
        path.mkdir(parents=True, exist_ok=True)
    for path in sorted(home.rglob("*"), reverse=True):
        path.chmod(stat.S_IRUSR | stat.S_IXUSR)
    home.chmod(stat.S_IRUSR | stat.S_IXUSR)
    return home, {name: str(path) for name, path in dirs.items()}


def _enforce(home: Path) -> list[str]:
    """The command prefix that makes `home` really read-only for root (permissions do for anyone else)."""
    if os.geteuid() != 0:
        return []
    unshare = shutil.which("unshare")
    probe = [unshare or "unshare", "-rm", "true"]
    if unshare is None or subprocess.run(probe, capture_output=True, check=False).returncode != 0:
        return []  # root without namespaces: the tree comparison below still catches any write
    mount = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" "$0" && exec "$@"'
    return [unshare, "-rm", "sh", "-c", mount, str(home)]


@pytest.mark.slow
def test_a_representative_run_writes_nothing_outside_its_temp_dirs(tmp_path: Path) -> None:
    home, dirs = _read_only_home(tmp_path)
    before = _tree(home)
    (tmp_path / "tmp").mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ISOLATED_VARS and not k.startswith("PYTEST")}
    env.update(dirs, TMPDIR=str(tmp_path / "tmp"), PYTHONPATH=os.pathsep.join([str(ROOT), str(SRC)]))
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-n",
        "0",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=",
        "-rs",
        *SUBSET,
    ]
    command += [arg for expr in DESELECT for arg in ("-k", expr)]
    done = subprocess.run(
        [*_enforce(home), *command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False
    )
    try:
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
        assert " passed" in done.stdout and " failed" not in done.stdout
        assert _tree(home) == before, "something was written under the read-only HOME"
    finally:
        for path in [home, *home.rglob("*")]:
            path.chmod(stat.S_IRWXU)


def test_a_write_to_the_read_only_home_is_caught(tmp_path: Path) -> None:
    """The guard above can fail: a write under that HOME is refused, or (root without namespaces) seen."""
    home, dirs = _read_only_home(tmp_path)
    before = _tree(home)
    write = "import os, pathlib; pathlib.Path(os.environ['XDG_STATE_HOME'], 'decodetop').mkdir()"
    prefix = _enforce(home)
    done = subprocess.run(
        [*prefix, sys.executable, "-c", write], env={**os.environ, **dirs}, capture_output=True, text=True, check=False
    )
    try:
        if prefix or os.geteuid() != 0:
            assert done.returncode != 0 and ("Read-only" in done.stderr or "Permission denied" in done.stderr)
        else:
            assert _tree(home) != before
    finally:
        for path in [home, *home.rglob("*")]:
            path.chmod(stat.S_IRWXU)


def test_children_take_ctrl_c_where_the_suite_was_started_with_it_ignored() -> None:
    """A suite started in the background (`bash scripts/test &`) inherits SIGINT ignored; the processes its tests
    start must not (tests/helpers/signals.py): before the helper a child ignores SIGINT, after it the child does not."""
    ask = "import signal; print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)"
    code = (
        "import signal, subprocess, sys\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"  # as a background start leaves it
        f"before = subprocess.run([sys.executable, '-c', {ask!r}], capture_output=True, text=True).stdout.split()\n"
        "from tests.helpers.signals import interruptible_children\n"
        "interruptible_children()\n"
        f"after = subprocess.run([sys.executable, '-c', {ask!r}], capture_output=True, text=True).stdout.split()\n"
        "print(*before, *after)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=subprocess_env(),
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "False"]
