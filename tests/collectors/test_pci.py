"""PCI config-space decoding: worked examples from docs/reference/healthchecks.md §2, the fixture images, and
garbage."""

from __future__ import annotations

import contextlib
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from decodetop.collectors.hostroot import HostRoot
from decodetop.collectors.pci import (
    PciConfigError,
    decode_config,
    find_gpus,
    normalize_bdf,
    parse_link_speed,
    read_config,
    upstream_bdfs,
)
from tests.conftest import load_host_generator

bf = load_host_generator()


def _endpoint(devctl: int, *, size: int = 4096, lnksta_speed: int = 5) -> bytes:
    spec = bf.PciSpec("0000:03:00.0", 0x10DE, 0x2335, 0x030200, 0, bf.Link(5, 16, lnksta_speed, 16), 1, devctl)
    spec.config_bytes = size
    return bf.build_config(spec)


def test_worked_example_devctl_0x2930() -> None:
    """docs/reference/healthchecks.md §2.3: DevCtl 0x2930 → MRRS 512 B, MPS 256 B, RlxdOrd+, ExtTag+, NoSnoop+."""
    cfg = decode_config(_endpoint(0x2930))
    assert cfg.pcie is not None
    assert cfg.pcie.mrrs_bytes == 512 and cfg.pcie.mps_bytes == 256
    assert cfg.pcie.relaxed_ordering and cfg.pcie.ext_tag and cfg.pcie.no_snoop
    assert cfg.pcie.port_type_name == "endpoint"
    assert cfg.pcie.offset == 0x78
    assert cfg.capability_ids == (0x01, 0x05, 0x10, 0x11)
    assert cfg.pcie.link_cap_speed_gts == 32.0 and cfg.pcie.link_cap_width == 16
    assert cfg.vendor_id == 0x10DE and cfg.class_code == 0x030200


@pytest.mark.parametrize("code", range(6))
def test_mrrs_codes(code: int) -> None:
    cfg = decode_config(_endpoint(0x0020 | (code << 12)))
    assert cfg.pcie is not None and cfg.pcie.mrrs_bytes == 128 << code


def test_reserved_mrrs_code_is_none() -> None:
    cfg = decode_config(_endpoint(0x7000))
    assert cfg.pcie is not None and cfg.pcie.mrrs_bytes is None


def test_acs_on_bridge() -> None:
    spec = bf.PciSpec("0000:02:00.0", 0x1000, 0xC030, 0x060400, 6, bf.Link(5, 16, 5, 16), 2, 0x2120, 0x001D)
    cfg = decode_config(bf.build_config(spec))
    assert cfg.acs is not None and cfg.acs.redirects_p2p
    assert cfg.acs.describe_control().startswith("SrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+")
    assert cfg.pcie is not None and cfg.pcie.port_type_name == "switch downstream"


def test_header_only_and_legacy_sizes() -> None:
    header = decode_config(_endpoint(0x2930, size=64))
    assert header.header_only and header.pcie is None
    legacy = decode_config(_endpoint(0x2930, size=256))
    assert not legacy.header_only and legacy.pcie is not None and legacy.acs is None and not legacy.has_extended_space


def test_truncated_config_raises() -> None:
    with pytest.raises(PciConfigError, match="truncated"):
        decode_config(_endpoint(0x2930)[:40])
    with pytest.raises(PciConfigError, match="absent"):
        decode_config(b"\xff" * 4096)


def test_capability_loop_terminates() -> None:
    data = bytearray(_endpoint(0x2930))
    data[0x78 + 1] = 0x60  # Express points back to PM: a loop
    cfg = decode_config(bytes(data))
    assert cfg.capability_ids == (0x01, 0x05, 0x10)


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=0, max_size=600).map(lambda b: b if len(b) < 300 else b.ljust(4096, b"\x01")))
def test_decoder_never_crashes_on_garbage(data: bytes) -> None:
    try:
        cfg = decode_config(data)
    except PciConfigError:
        return
    assert cfg.size_bytes == len(data)


@settings(max_examples=150, deadline=None)
@given(st.binary(min_size=0, max_size=640), st.integers(0x40, 0xFC))
def test_decoder_with_cap_list_bit_on_random_bytes(data: bytes, ptr: int) -> None:
    """Random capability and extended-capability bytes behind a valid header: decoded or PciConfigError."""
    buf = bytearray(data.ljust(4096, b"\0"))
    struct.pack_into("<HH", buf, 0, 0x10DE, 0x2335)
    struct.pack_into("<H", buf, 6, 0x0010)
    buf[0x34] = ptr
    with contextlib.suppress(PciConfigError):
        decode_config(bytes(buf))


def test_link_speed_and_bdf_parsing() -> None:
    assert parse_link_speed("16.0 GT/s PCIe\n") == 16.0
    assert parse_link_speed("2.5 GT/s PCIe") == 2.5
    assert parse_link_speed("Unknown") is None and parse_link_speed("") is None
    with pytest.raises(ValueError):
        parse_link_speed("fast")
    assert normalize_bdf("00000000:3B:00.0") == "0000:3b:00.0"
    assert normalize_bdf("3b:00.1") == "0000:3b:00.1"
    with pytest.raises(ValueError):
        normalize_bdf("3b:00")


def test_fixture_discovery_and_bridge_walk(hosts: Path) -> None:
    root = HostRoot(hosts / "epyc-motivating" / "root")
    gpus = find_gpus(root)
    assert [g.bdf for g in gpus] == ["0000:03:00.0", "0000:04:00.0"]
    assert gpus[0].sysfs_path == "/sys/devices/pci0000:00/0000:00:01.1/0000:01:00.0/0000:02:00.0/0000:03:00.0"
    assert upstream_bdfs(gpus[0]) == ["0000:00:01.1", "0000:01:00.0", "0000:02:00.0"]
    cfg = read_config(root, "0000:03:00.0")
    assert cfg.pcie is not None and cfg.pcie.mrrs_bytes == 512
