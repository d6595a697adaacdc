"""`decodetop check --root FILE`: a crafted archive is refused with one line naming the member, writes nothing
outside its temporary directory, changes nothing it points at, and leaves no temporary directory behind.

Every archive is built here, byte by byte where tarfile would not write it (sparse and oversized headers).
"""

from __future__ import annotations

import gzip
import io
import os
import signal
import stat
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from decodetop.cli import main
from decodetop.collectors.archive import MAX_MEMBERS, ROOT_IN_ARCHIVE, unpack_collected, unpacked
from decodetop.errors import UserInputError
from tests.helpers.env import subprocess_env
from tests.helpers.waiting import wait_for

R = ROOT_IN_ARCHIVE
Member = tuple[tarfile.TarInfo, bytes | None]


@pytest.fixture()
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """tmp_path holds decoy files (host/), the archives, and tmp/ (decodetop's TMPDIR, checked empty afterwards)."""
    host = tmp_path / "host"
    (host / "etc").mkdir(parents=True)
    (host / "secret.txt").write_text("decoy\n")
    (host / "secret.txt").chmod(0o600)
    (host / "etc" / "passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    (host / "etc" / "passwd").chmod(0o640)
    os.utime(host / "secret.txt", ns=(1_000_000_000, 1_000_000_000))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.setenv("DECODETOP_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    yield tmp_path


def _snapshot(base: Path) -> dict[str, tuple[object, ...]]:
    """Every path under `base` but tmp/ and the archives: type, content or link target, mode, owner, mtime."""
    out: dict[str, tuple[object, ...]] = {}
    for path in sorted(base.rglob("*")):
        rel = path.relative_to(base)
        if rel.parts[0] == "tmp" or path.suffix in (".tar", ".gz"):
            continue
        st = path.lstat()
        body: object = (
            str(path.readlink())
            if stat.S_ISLNK(st.st_mode)
            else path.read_bytes()
            if stat.S_ISREG(st.st_mode)
            else None
        )
        out[str(rel)] = (stat.S_IFMT(st.st_mode), body, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_mtime_ns)
    return out


def _info(name: str, kind: bytes = tarfile.REGTYPE, *, link: str = "", data: bytes | None = None) -> Member:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.mode = 0o777 if kind == tarfile.DIRTYPE else 0o4777  # never applied: nothing is chmodded
    info.uid = info.gid = 4242  # never applied: nothing is chowned
    if data is not None:
        info.size = len(data)
    return info, data


def _tarball(path: Path, members: list[Member], *, top: bool = True) -> Path:
    with tarfile.open(path, "w:gz", format=tarfile.GNU_FORMAT) as tar:
        if top:
            tar.addfile(_info("decodetop-collect", tarfile.DIRTYPE)[0])
            tar.addfile(_info(R, tarfile.DIRTYPE)[0])
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _raw_header(name: str, size: int, kind: bytes = tarfile.REGTYPE, extra: dict[int, bytes] | None = None) -> bytes:
    """One GNU tar header block with any size (tarfile refuses to write a size it has no data for)."""
    info = tarfile.TarInfo(name)
    info.size = 0
    block = bytearray(info.tobuf(format=tarfile.GNU_FORMAT))
    block[124:136] = b"%011o\0" % size if size < 8**11 else b"\x80" + size.to_bytes(11, "big")
    block[156:157] = kind
    for offset, value in (extra or {}).items():
        block[offset : offset + len(value)] = value
    block[148:156] = b"        "
    block[148:156] = b"%06o\0 " % sum(block)
    return bytes(block)


def _hostile(sandbox: Path) -> dict[str, Callable[[], tuple[Path, str]]]:
    """Each crafted archive with the member its refusal must name."""
    host = sandbox / "host"
    a = sandbox

    def hard_link_then_file() -> tuple[Path, str]:
        name = f"{R}/etc/passwd"
        members = [_info(name, tarfile.LNKTYPE, link=str(host / "etc/passwd")), _info(name, data=b"pwned\n")]
        return _tarball(a / "hl-file.tar.gz", members), name

    def hard_link_alone_relative() -> tuple[Path, str]:
        name = f"{R}/secret"
        return _tarball(a / "hl.tar.gz", [_info(name, tarfile.LNKTYPE, link="../../host/secret.txt")]), name

    def hard_link_absolute() -> tuple[Path, str]:
        name = f"{R}/proc/cpuinfo"
        return _tarball(a / "hl-abs.tar.gz", [_info(name, tarfile.LNKTYPE, link=str(host / "secret.txt"))]), name

    def symlink_relative_out() -> tuple[Path, str]:
        name = f"{R}/sys/x"
        members = [_info(name, tarfile.SYMTYPE, link="../../../../../host/secret.txt")]
        return _tarball(a / "sl-rel.tar.gz", members), name

    def symlink_absolute_dotdot() -> tuple[Path, str]:
        name = f"{R}/sys/y"
        return _tarball(a / "sl-abs.tar.gz", [_info(name, tarfile.SYMTYPE, link="/../../host/secret.txt")]), name

    def symlink_then_file_through_it() -> tuple[Path, str]:
        name = f"{R}/etc"
        members = [_info(name, tarfile.SYMTYPE, link=str(host / "etc")), _info(f"{R}/etc/passwd", data=b"pwned\n")]
        return _tarball(a / "sl-file.tar.gz", members), name

    def fifo() -> tuple[Path, str]:
        name = f"{R}/proc/cmdline"
        return _tarball(a / "fifo.tar.gz", [_info(name, tarfile.FIFOTYPE)]), name

    def char_device() -> tuple[Path, str]:
        name = f"{R}/proc/cpuinfo"
        info, _ = _info(name, tarfile.CHRTYPE)
        info.devmajor, info.devminor = 1, 5  # /dev/zero
        return _tarball(a / "chr.tar.gz", [(info, None)]), name

    def sparse_20_gib() -> tuple[Path, str]:
        name = f"{R}/proc/cpuinfo"
        # GNU sparse ('S'): one 512-byte chunk at offset 0, real size 20 GiB at offset 483 (GNU tar's format).
        realsize = 20 * 2**30
        extra = {386: b"%011o\0" % 0 + b"%011o\0" % 512, 483: b"%011o\0" % realsize}
        blob = _raw_header(name, 512, tarfile.GNUTYPE_SPARSE, extra) + b"\0" * 512 + b"\0" * 1024
        return _gz(a / "sparse.tar.gz", _top_headers() + blob), name

    def huge_size_header() -> tuple[Path, str]:
        name = f"{R}/dev/kmsg"
        return _gz(a / "huge.tar.gz", _top_headers() + _raw_header(name, 20 * 2**30) + b"\0" * 1024), name

    def too_many_members() -> tuple[Path, str]:
        template = _raw_header(f"{R}/f", 0, tarfile.DIRTYPE)
        blocks = [_top_headers()]
        for i in range(200_000):
            name = f"{R}/d{i}".encode()
            block = bytearray(template)
            block[0 : len(name)] = name
            block[148:156] = b"        "
            block[148:156] = b"%06o\0 " % sum(block)
            blocks.append(bytes(block))
        return _gz(a / "many.tar.gz", b"".join(blocks) + b"\0" * 1024), f"{R}/d{MAX_MEMBERS - 2}"

    def root_is_a_symlink_to_slash() -> tuple[Path, str]:
        top = _info("decodetop-collect", tarfile.DIRTYPE)
        return _tarball(a / "slash.tar.gz", [top, _info(R, tarfile.SYMTYPE, link="/")], top=False), R

    def top_is_a_symlink() -> tuple[Path, str]:
        members = [_info("decodetop-collect", tarfile.SYMTYPE, link=str(host))]
        return _tarball(a / "top.tar.gz", members, top=False), "decodetop-collect"

    def long_symlink_chain() -> tuple[Path, str]:
        """CVE-2025-4517's shape: 16 links to 247-character directories, a link climbing back, a file through it."""
        comp = "d" * 247
        path = R
        members: list[Member] = []
        for step in "abcdefghijklmnop":
            members.append(_info(f"{path}/{comp}", tarfile.DIRTYPE))
            members.append(_info(f"{path}/{step}", tarfile.SYMTYPE, link=comp))
            path = f"{path}/{comp}"
        long_link = f"{R}/" + "/".join("abcdefghijklmnop") + "/" + "l" * 254
        members.append(_info(long_link, tarfile.SYMTYPE, link="../" * 16))
        escape = f"{R}/escape"
        members.append(_info(escape, tarfile.SYMTYPE, link=long_link.removeprefix(R + "/") + "/../" * 8 + "host"))
        members.append(_info(f"{R}/escape/secret.txt", data=b"pwned\n"))
        return _tarball(a / "chain.tar.gz", members), escape

    return {
        f.__name__: f
        for f in (
            hard_link_then_file,
            hard_link_alone_relative,
            hard_link_absolute,
            symlink_relative_out,
            symlink_absolute_dotdot,
            symlink_then_file_through_it,
            fifo,
            char_device,
            sparse_20_gib,
            huge_size_header,
            too_many_members,
            root_is_a_symlink_to_slash,
            top_is_a_symlink,
            long_symlink_chain,
        )
    }


def _top_headers() -> bytes:
    return _raw_header("decodetop-collect/", 0, tarfile.DIRTYPE) + _raw_header(f"{R}/", 0, tarfile.DIRTYPE)


def _gz(path: Path, raw: bytes) -> Path:
    path.write_bytes(gzip.compress(raw, compresslevel=6, mtime=0))
    return path


CASES = [
    "hard_link_then_file",
    "hard_link_alone_relative",
    "hard_link_absolute",
    "symlink_relative_out",
    "symlink_absolute_dotdot",
    "symlink_then_file_through_it",
    "fifo",
    "char_device",
    "sparse_20_gib",
    "huge_size_header",
    "too_many_members",
    "root_is_a_symlink_to_slash",
    "top_is_a_symlink",
    "long_symlink_chain",
]


@pytest.mark.parametrize("case", CASES)
def test_crafted_archive_is_refused_and_touches_nothing(
    sandbox: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    archive, member = _hostile(sandbox)[case]()
    before = _snapshot(sandbox)
    code = main(["check", "--root", str(archive)])
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert code == 2, captured
    assert err.count("\n") == 0 and err.startswith(f"decodetop: error: {archive}: member {member!r} "), err
    assert captured.out == ""
    assert _snapshot(sandbox) == before
    assert list((sandbox / "tmp").iterdir()) == []


def test_sparse_archive_is_small(sandbox: Path) -> None:
    """The 20 GiB sparse member and the 20 GiB size header really are tiny archives."""
    cases = _hostile(sandbox)
    assert cases["sparse_20_gib"]()[0].stat().st_size < 300
    assert cases["huge_size_header"]()[0].stat().st_size < 300


def test_absolute_symlinks_stay_inside_the_tree(sandbox: Path) -> None:
    """An absolute target means that path under the tree's root: it is written relative, and reads stay inside."""
    archive = _tarball(
        sandbox / "ok.tar.gz",
        [
            _info(f"{R}/sys/devices/x/vendor", data=b"0x10de\n"),
            _info(f"{R}/sys/bus/pci/devices/x", tarfile.SYMTYPE, link="/sys/devices/x"),
            _info(f"{R}/sys/y", tarfile.SYMTYPE, link="devices/x"),
        ],
    )
    tree = unpack_collected(archive, sandbox / "out")
    assert (tree / "sys/bus/pci/devices/x").readlink() == Path("../../../../sys/devices/x")
    assert (tree / "sys/bus/pci/devices/x/vendor").read_text() == "0x10de\n"
    assert (tree / "sys/y").readlink() == Path("devices/x")
    mode = stat.S_IMODE((tree / "sys/devices/x/vendor").stat().st_mode)
    assert mode & 0o7000 == 0 and (tree / "sys/devices/x/vendor").stat().st_uid == os.getuid()


def test_bomb_and_duplicate_and_foreign_names(sandbox: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from decodetop.collectors import archive as archive_module

    monkeypatch.setattr(archive_module, "MAX_TOTAL_BYTES", 3 * 2**20)  # the mechanism, without 256 MiB of zeros
    many = [_info(f"{R}/f{i}", data=b"\0" * 2**20) for i in range(5)]
    with pytest.raises(UserInputError, match=r"member '.*/f3' takes the files past 3,145,728 bytes in all"):
        unpack_collected(_tarball(sandbox / "bomb.tar.gz", many), sandbox / "o1")
    assert not (sandbox / "o1").exists()  # the first pass refused it before anything was written
    twice = [_info(f"{R}/a", data=b"1"), _info(f"{R}/a", data=b"2")]
    with pytest.raises(UserInputError, match="appears twice"):
        unpack_collected(_tarball(sandbox / "twice.tar.gz", twice), sandbox / "o2")
    with pytest.raises(UserInputError, match=r"member 'elsewhere/x' is outside decodetop-collect/root/"):
        unpack_collected(_tarball(sandbox / "else.tar.gz", [_info("elsewhere/x", data=b"")]), sandbox / "o3")
    assert not any((sandbox / d).exists() and any((sandbox / d).rglob("f*")) for d in ("o2", "o3"))


def test_a_fifo_or_device_as_the_archive_is_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo.tar.gz")
    for path in (tmp_path / "fifo.tar.gz", Path("/dev/zero")):
        with pytest.raises(UserInputError, match="not a regular file"):
            unpack_collected(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_sigterm_removes_the_temporary_tree(sandbox: Path) -> None:
    archive = _tarball(sandbox / "ok.tar.gz", [_info(f"{R}/proc/cmdline", data=b"quiet\n")])
    seen: list[Path] = []
    with pytest.raises(SystemExit) as stopped, unpacked(archive) as tree:
        seen.append(tree)
        assert (tree / "proc/cmdline").read_text() == "quiet\n"
        os.kill(os.getpid(), signal.SIGTERM)
    assert stopped.value.code == 128 + signal.SIGTERM
    assert seen and not seen[0].exists() and list((sandbox / "tmp").iterdir()) == []
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL or callable(signal.getsignal(signal.SIGTERM))


def test_sigterm_during_check_root_removes_the_unpacked_tree(tmp_path: Path) -> None:
    """End to end: `decodetop check --root FILE` killed with SIGTERM while it checks leaves no temporary tree."""
    import subprocess
    import sys

    archive = _tarball(tmp_path / "ok.tar.gz", [_info(f"{R}/proc/cmdline", data=b"quiet\n")])
    (tmp_path / "tmp").mkdir()
    ready = tmp_path / "ready"
    code = (
        "import sys, time, pathlib\n"
        "import decodetop.collectors.checks.host as host\n"
        "def hang(root, **_kw):\n"
        "    pathlib.Path(sys.argv[1]).write_text(str(root.base))\n"
        "    time.sleep(120)\n"
        "host.run_all_checks = hang\n"
        "from decodetop.cli import main\n"
        "sys.exit(main(['check', '--root', sys.argv[2]]))\n"
    )
    env = subprocess_env(TMPDIR=str(tmp_path / "tmp"), DECODETOP_STATE_DIR=str(tmp_path / "state"))
    proc = subprocess.Popen([sys.executable, "-c", code, str(ready), str(archive)], env=env)
    try:
        wait_for(lambda: ready.exists() and ready.read_text(), "the checks to run over the unpacked tree")
        tree = Path(ready.read_text())
        assert tree.is_dir() and str(tree).startswith(str(tmp_path / "tmp"))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        proc.kill()
    assert not tree.exists() and list((tmp_path / "tmp").iterdir()) == []


@pytest.mark.parametrize("kind", [tarfile.XHDTYPE, tarfile.GNUTYPE_LONGNAME], ids=["pax-path", "gnu-long-name"])
def test_a_200_mib_extended_header_is_refused_before_it_is_read(tmp_path: Path, kind: bytes) -> None:
    """tarfile reads a pax header (or a GNU long name) whole into memory before any member check: the archive is
    refused from the record's size, in a process whose memory stays far below the record."""
    size = 200 * 1024 * 1024
    archive = tmp_path / "pax.tar.gz"
    with gzip.open(archive, "wb", compresslevel=1) as out:  # streamed: the test itself never holds 200 MiB
        out.write(_top_headers())
        out.write(_raw_header("././@PaxHeader" if kind == tarfile.XHDTYPE else "././@LongLink", size, kind))
        record = b"%d path=" % size
        out.write(record)
        chunk = b"a" * (1 << 20)
        left = size - len(record) - 1
        while left > 0:
            out.write(chunk[: min(left, len(chunk))])
            left -= len(chunk)
        out.write(b"\n" + b"\0" * (-size % 512))
        out.write(_raw_header(f"{R}/x", 0) + b"\0" * 1024)
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from decodetop.collectors.archive import unpacked\n"
        "from decodetop.errors import UserInputError\n"
        "try:\n"
        "    with unpacked(Path(sys.argv[1])):\n"
        "        print('UNPACKED')\n"
        "except UserInputError as exc:\n"
        "    print(exc)\n"
        # VmHWM: this process's own peak (ru_maxrss survives exec and would count the test worker's memory)
        "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')][0].split()[1]\n"
        "print('MAXRSS_KB', hwm)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(archive)], capture_output=True, text=True, timeout=300, check=False
    )
    out = done.stdout
    assert "extended header (pax or GNU long name) of 209,715,200 bytes" in out, out + done.stderr
    assert out.count("\n") == 2
    peak_mib = int(out.split("MAXRSS_KB")[1]) / 1024
    assert peak_mib < 150, f"peak {peak_mib:.0f} MiB: the 200 MiB record was read"  # main: ~680 MiB
