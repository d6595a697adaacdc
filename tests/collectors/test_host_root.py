"""HostRoot: reads stay inside the root, side files stand in for what plain files cannot carry."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from decodetop.collectors.hostroot import DeviceNumber, HostReadError, HostRoot


def _tree(tmp_path: Path) -> HostRoot:
    (tmp_path / "sys/devices/pci0000:00/0000:00:01.0").mkdir(parents=True)
    (tmp_path / "sys/devices/pci0000:00/0000:00:01.0/vendor").write_text("0x10de\n")
    (tmp_path / "sys/devices/pci0000:00/0000:00:01.0/config.hex").write_text("de 10 35 23\n00 00 10 00\n")
    (tmp_path / "sys/bus/pci/devices").mkdir(parents=True)
    (tmp_path / "sys/bus/pci/devices/0000:00:01.0").symlink_to("../../../devices/pci0000:00/0000:00:01.0")
    (tmp_path / "sys/abs").symlink_to("/sys/devices/pci0000:00")  # absolute: must resolve inside the root
    (tmp_path / "sys/loop").symlink_to("loop")
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/nvidia-uvm").write_text("")
    (tmp_path / "dev/.rdev").write_text(
        "# name type major minor\nnvidia-uvm c 510 0\nnvidia-caps/nvidia-cap1 c 511 1\n"
    )
    (tmp_path / "dev/.open").write_text("nvidia-uvm EPERM\n")
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/counter").write_text("1\n")
    (tmp_path / ".later/proc").mkdir(parents=True)
    (tmp_path / ".later/proc/counter").write_text("5\n")
    return HostRoot(tmp_path)


def test_symlinks_resolve_inside_the_root(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    assert root.read_text("/sys/bus/pci/devices/0000:00:01.0/vendor") == "0x10de\n"
    assert root.realpath("/sys/bus/pci/devices/0000:00:01.0") == "/sys/devices/pci0000:00/0000:00:01.0"
    assert root.read_text("/sys/abs/0000:00:01.0/vendor") == "0x10de\n"
    assert root.realpath("sys/bus/pci/devices/../../../abs") == "/sys/devices/pci0000:00"
    with pytest.raises(HostReadError, match="too many symlinks"):
        root.read_text("/sys/loop/x")
    # '..' cannot climb out of the root.
    assert root.path("/../../etc/passwd") == tmp_path.resolve() / "etc/passwd"


def test_config_hex_side_file(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    assert root.read_bytes("/sys/bus/pci/devices/0000:00:01.0/config") == bytes.fromhex("de1035230000 1000")
    assert root.exists("/sys/bus/pci/devices/0000:00:01.0/config")
    assert "config" in root.listdir("/sys/bus/pci/devices/0000:00:01.0")
    (tmp_path / "sys/devices/pci0000:00/0000:00:01.0/config.hex").write_text("zz\n")
    with pytest.raises(HostReadError, match="not hex text"):
        root.read_bytes("/sys/bus/pci/devices/0000:00:01.0/config")


def test_rdev_open_and_later_side_files(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    assert root.stat_rdev("/dev/nvidia-uvm") == DeviceNumber("c", 510, 0)
    assert root.device_nodes("/dev/nvidia-caps/*") == ["/dev/nvidia-caps/nvidia-cap1"]
    assert ".rdev" not in root.listdir("/dev")
    probe = root.open_probe("/dev/nvidia-uvm")
    assert not probe.ok and probe.errno_name == "EPERM"
    assert root.open_probe("/dev/nvidia0").errno_name == "UNRECORDED"
    with pytest.raises(HostReadError, match="does not exist"):
        root.stat_rdev("/dev/nvidia9")
    assert root.read_text("/proc/counter") == "1\n" and root.read_text_later("/proc/counter") == "5\n"
    (tmp_path / "dev/.rdev").write_text("nvidia-uvm c x 0\n")
    with pytest.raises(HostReadError, match="bad entry"):
        root.stat_rdev("/dev/nvidia-uvm")


def test_glob_and_errors(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    assert root.glob("/sys/bus/pci/devices/*/vendor") == ["/sys/bus/pci/devices/0000:00:01.0/vendor"]
    assert root.try_read_text("/proc/nothing") is None
    with pytest.raises(HostReadError, match="/proc/nothing does not exist"):
        root.read_text("/proc/nothing")
    with pytest.raises(HostReadError, match="not a directory"):
        HostRoot(tmp_path / "proc/counter")


def test_live_root_reads_the_real_host() -> None:
    root = HostRoot()
    assert root.is_live
    assert root.read_text("/proc/sys/kernel/osrelease").strip() == os.uname().release
    assert root.stat_rdev("/dev/null") == DeviceNumber("c", 1, 3)
    assert root.open_probe("/dev/null").ok
    assert root.stat_rdev("/proc/cpuinfo") is None


def test_only_regular_files_are_read_and_reads_are_bounded(tmp_path: Path) -> None:
    """A FIFO in a copied tree is never opened (opening it for reading would hang); a file past the cap is refused."""
    from decodetop.collectors.hostroot import MAX_FILE_BYTES

    root = _tree(tmp_path)
    os.mkfifo(tmp_path / "proc/cmdline")
    with pytest.raises(HostReadError, match=r"/proc/cmdline is a FIFO; not read"):
        root.read_text("/proc/cmdline")
    with pytest.raises(HostReadError, match=r"/proc is a directory; not read"):
        root.read_text("/proc")
    big = tmp_path / "proc/kallsyms"
    with big.open("wb") as handle:
        handle.truncate(MAX_FILE_BYTES + 1)  # sparse: no disk used
    with pytest.raises(HostReadError, match=r"/proc/kallsyms is larger than 67,108,864 bytes; not read"):
        root.read_bytes("/proc/kallsyms")
    assert root.read_bytes("/proc/kallsyms", 16) == b"\0" * 16
    (tmp_path / ".later/proc/cmdline").symlink_to("/etc/hostname")  # resolved inside the tree: absent there
    assert root.read_text_later("/proc/counter") == "5\n"
    (tmp_path / "sys/outside").symlink_to("../../../../../../../../etc")  # '..' stops at the root
    assert root.path("/sys/outside/hostname") == tmp_path.resolve() / "etc/hostname"


def test_live_device_nodes_are_never_opened_for_reading() -> None:
    root = HostRoot()
    with pytest.raises(HostReadError, match=r"/dev/zero is a character device; not read"):
        root.read_bytes("/dev/zero")
    assert root.try_read_text("/dev/zero") is None
