"""Provides PCI config-space decoding (PCIe capability, MaxPayload/MaxReadReq, link, ACS) and sysfs PCI discovery.

Offsets and masks come from the kernel's include/uapi/linux/pci_regs.h (docs/reference/healthchecks.md §2 [PCIREGS]).
Everything is little-endian. Reads go through `HostRoot`; nothing here ever writes config space."""

from __future__ import annotations

import re
from dataclasses import dataclass

from decodetop.collectors.hostroot import HostRoot

HEADER_ONLY_BYTES = 64
"""pci-sysfs.c pci_read_config(): without CAP_SYS_ADMIN in the init user namespace only the 64-byte header reads."""
LEGACY_CONFIG_BYTES = 256
"""Conventional PCI config space; no extended capabilities (no ACS) below this size."""
EXTENDED_CONFIG_BYTES = 4096
"""Full PCIe config space."""

_PCI_STATUS = 0x06
_PCI_STATUS_CAP_LIST = 0x10
_PCI_CAPABILITY_LIST = 0x34
_PCI_CAP_ID_EXP = 0x10
_PCI_EXT_CAP_START = 0x100
_PCI_EXT_CAP_ID_ACS = 0x000D
_MAX_CAP_STEPS = 48
"""docs/reference/healthchecks.md §2.2: cap the walk (broken devices loop); 48 is the kernel's PCI_FIND_CAP_TTL."""
_MAX_EXT_CAP_STEPS = (EXTENDED_CONFIG_BYTES - _PCI_EXT_CAP_START) // 8
"""pci_find_next_ext_capability(): at most (4096-256)/8 headers fit."""

NVIDIA_VENDOR_ID = 0x10DE
DISPLAY_CLASS = 0x03
"""PCI base class 0x03 (display controller): 0x0300 VGA, 0x0302 3D controller (datacenter GPUs)."""

LINK_SPEED_GTS = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}
"""pci_regs.h PCI_EXP_LNKSTA_CLS_*: speed code → GT/s."""

PORT_TYPES = {
    0: "endpoint",
    1: "legacy endpoint",
    4: "root port",
    5: "switch upstream",
    6: "switch downstream",
    7: "PCIe-to-PCI bridge",
    8: "PCI-to-PCIe bridge",
    9: "RC integrated endpoint",
    10: "RC event collector",
}
"""pci_regs.h PCI_EXP_TYPE_*."""

ACS_BITS = (
    (0x01, "SrcValid"),
    (0x02, "TransBlk"),
    (0x04, "ReqRedir"),
    (0x08, "CmpltRedir"),
    (0x10, "UpstreamFwd"),
    (0x20, "EgressCtrl"),
    (0x40, "DirectTrans"),
)
"""pci_regs.h PCI_ACS_SV..PCI_ACS_DT, named as lspci prints them."""
ACS_P2P_REDIRECT_MASK = 0x04 | 0x08 | 0x20
"""RR, CR and EC redirect peer traffic to the root complex (docs/reference/healthchecks.md §2.4, [NCCL-TS],
[OGKM-1135])."""


class PciConfigError(ValueError):
    """Config space too short or inconsistent to decode; the message says what is missing."""


def _payload_bytes(code: int) -> int | None:
    """Size = 128 << code for codes 0-5; 6 and 7 are reserved (docs/reference/healthchecks.md §2.3)."""
    return 128 << code if 0 <= code <= 5 else None


@dataclass(frozen=True)
class PcieCapability:
    """The decoded PCI Express capability (ID 0x10)."""

    offset: int
    port_type: int
    devcap_mps_bytes: int | None
    mps_bytes: int | None
    mrrs_bytes: int | None
    relaxed_ordering: bool
    ext_tag: bool
    no_snoop: bool
    link_cap_speed_gts: float | None
    link_cap_width: int
    link_speed_gts: float | None
    link_width: int

    @property
    def port_type_name(self) -> str:
        """'endpoint', 'root port', ... as lspci names them."""
        return PORT_TYPES.get(self.port_type, f"type {self.port_type}")


@dataclass(frozen=True)
class AcsCapability:
    """The ACS extended capability (ID 0x000D): capability and control registers."""

    offset: int
    capability: int
    control: int

    @property
    def redirects_p2p(self) -> bool:
        """Whether RR, CR or EC is set: peer-to-peer traffic is sent up to the root complex."""
        return bool(self.control & ACS_P2P_REDIRECT_MASK)

    def describe_control(self) -> str:
        """'SrcValid+ TransBlk- ReqRedir+ ...' like lspci's ACSCtl line."""
        return " ".join(f"{name}{'+' if self.control & bit else '-'}" for bit, name in ACS_BITS)


@dataclass(frozen=True)
class PciConfig:
    """What a config-space dump tells: identity, the capability list, PCIe and ACS registers."""

    size_bytes: int
    vendor_id: int
    device_id: int
    class_code: int
    header_type: int
    capability_ids: tuple[int, ...]
    pcie: PcieCapability | None
    extended_ids: tuple[int, ...]
    acs: AcsCapability | None

    @property
    def header_only(self) -> bool:
        """Only the 64-byte header came back: capabilities need host root (CAP_SYS_ADMIN in the init userns)."""
        return self.size_bytes < LEGACY_CONFIG_BYTES

    @property
    def has_extended_space(self) -> bool:
        """Whether extended config space (and thus ACS) could be read."""
        return self.size_bytes >= EXTENDED_CONFIG_BYTES


def _u8(data: bytes, off: int) -> int:
    if off + 1 > len(data):
        raise PciConfigError(f"config space truncated: need byte 0x{off:x}, have {len(data)} bytes")
    return data[off]


def _u16(data: bytes, off: int) -> int:
    if off + 2 > len(data):
        raise PciConfigError(f"config space truncated: need bytes 0x{off:x}-0x{off + 1:x}, have {len(data)} bytes")
    return int.from_bytes(data[off : off + 2], "little")


def _u32(data: bytes, off: int) -> int:
    if off + 4 > len(data):
        raise PciConfigError(f"config space truncated: need bytes 0x{off:x}-0x{off + 3:x}, have {len(data)} bytes")
    return int.from_bytes(data[off : off + 4], "little")


def decode_config(data: bytes) -> PciConfig:
    """Decode a config-space dump (64, 256 or 4096 bytes). Raises PciConfigError on anything inconsistent."""
    size = len(data)
    if size < HEADER_ONLY_BYTES:
        raise PciConfigError(f"config space truncated: {size} bytes, the header alone is {HEADER_ONLY_BYTES}")
    vendor = _u16(data, 0x00)
    if vendor in (0xFFFF, 0x0000):
        raise PciConfigError(f"vendor id 0x{vendor:04x}: device absent or config space unreadable")
    device = _u16(data, 0x02)
    class_code = int.from_bytes(data[0x09:0x0C], "little")
    header_type = data[0x0E] & 0x7F
    cap_ids: list[int] = []
    pcie: PcieCapability | None = None
    ext_ids: list[int] = []
    acs: AcsCapability | None = None
    if size >= LEGACY_CONFIG_BYTES and _u16(data, _PCI_STATUS) & _PCI_STATUS_CAP_LIST:
        ptr = _u8(data, _PCI_CAPABILITY_LIST) & 0xFC
        seen: set[int] = set()
        steps = 0
        while ptr and ptr not in seen and steps < _MAX_CAP_STEPS:
            if ptr < 0x40:
                raise PciConfigError(f"capability pointer 0x{ptr:02x} points into the header")
            seen.add(ptr)
            steps += 1
            cap_id = _u8(data, ptr)
            cap_ids.append(cap_id)
            if cap_id == _PCI_CAP_ID_EXP and pcie is None:
                pcie = _decode_pcie(data, ptr)
            ptr = _u8(data, ptr + 1) & 0xFC
    if size >= EXTENDED_CONFIG_BYTES and pcie is not None:
        off = _PCI_EXT_CAP_START
        seen_ext: set[int] = set()
        for _ in range(_MAX_EXT_CAP_STEPS):
            header = _u32(data, off)
            if header in (0, 0xFFFFFFFF) or off in seen_ext:
                break
            seen_ext.add(off)
            cap_id = header & 0xFFFF
            ext_ids.append(cap_id)
            if cap_id == _PCI_EXT_CAP_ID_ACS and acs is None:
                acs = AcsCapability(off, _u16(data, off + 4), _u16(data, off + 6))
            nxt = (header >> 20) & 0xFFC
            if nxt == 0:
                break
            if nxt < _PCI_EXT_CAP_START:
                raise PciConfigError(f"extended capability pointer 0x{nxt:03x} below 0x100")
            off = nxt
    return PciConfig(size, vendor, device, class_code, header_type, tuple(cap_ids), pcie, tuple(ext_ids), acs)


def _decode_pcie(data: bytes, p: int) -> PcieCapability:
    flags = _u16(data, p + 2)
    devcap = _u32(data, p + 4)
    devctl = _u16(data, p + 8)
    lnkcap = _u32(data, p + 0x0C)
    lnksta = _u16(data, p + 0x12)
    return PcieCapability(
        offset=p,
        port_type=(flags >> 4) & 0xF,
        devcap_mps_bytes=_payload_bytes(devcap & 0x7),
        mps_bytes=_payload_bytes((devctl >> 5) & 0x7),
        mrrs_bytes=_payload_bytes((devctl >> 12) & 0x7),
        relaxed_ordering=bool(devctl & 0x0010),
        ext_tag=bool(devctl & 0x0100),
        no_snoop=bool(devctl & 0x0800),
        link_cap_speed_gts=LINK_SPEED_GTS.get(lnkcap & 0xF),
        link_cap_width=(lnkcap >> 4) & 0x3F,
        link_speed_gts=LINK_SPEED_GTS.get(lnksta & 0xF),
        link_width=(lnksta >> 4) & 0x3F,
    )


# -- sysfs ----------------------------------------------------------------------------------------------------

_BDF_RE = re.compile(r"^(?:([0-9a-fA-F]{4,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")


def normalize_bdf(text: str) -> str:
    """'00000000:3B:00.0' (NVML) or '3b:00.0' → '0000:3b:00.0' (sysfs). Raises ValueError otherwise."""
    match = _BDF_RE.match(text.strip())
    if match is None:
        raise ValueError(f"not a PCI address: {text.strip()[:30]!r}")
    domain = int(match.group(1) or "0", 16)
    return f"{domain:04x}:{match.group(2).lower()}:{match.group(3).lower()}.{match.group(4)}"


def is_bdf(text: str) -> bool:
    """Whether `text` looks like a sysfs PCI address ('0000:3b:00.0')."""
    return bool(re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", text))


def parse_link_speed(text: str) -> float | None:
    """'16.0 GT/s PCIe' → 16.0; '' or 'Unknown' → None (procfs sysfs/pci_device.go); garbage → ValueError."""
    value = text.strip()
    if not value or value.startswith("Unknown"):
        return None
    match = re.match(r"^(\d+(?:\.\d+)?) GT/s", value)
    if match is None:
        raise ValueError(f"unrecognised link speed {value[:30]!r}")
    return float(match.group(1))


@dataclass(frozen=True)
class PciDevice:
    """A PCI function as sysfs shows it."""

    bdf: str
    sysfs_path: str
    """realpath on the host: /sys/devices/pci0000:00/0000:00:01.1/.../0000:03:00.0."""
    vendor_id: int
    device_id: int
    class_code: int

    @property
    def is_nvidia_gpu(self) -> bool:
        """NVIDIA vendor id with a display base class (VGA 0x0300 or 3D 0x0302)."""
        return self.vendor_id == NVIDIA_VENDOR_ID and (self.class_code >> 16) == DISPLAY_CLASS

    def sysfs(self, name: str) -> str:
        """Host path of attribute `name` of this device."""
        return f"/sys/bus/pci/devices/{self.bdf}/{name}"


def _hex_attr(root: HostRoot, path: str) -> int:
    text = root.read_text(path).strip()
    try:
        return int(text, 16)
    except ValueError:
        raise ValueError(f"{path}: expected a hex number, got {text[:20]!r}") from None


def list_pci_devices(root: HostRoot) -> list[PciDevice]:
    """Every PCI function under /sys/bus/pci/devices (unreadable ones skipped)."""
    devices: list[PciDevice] = []
    for bdf in root.try_listdir("/sys/bus/pci/devices"):
        base = f"/sys/bus/pci/devices/{bdf}"
        try:
            devices.append(
                PciDevice(
                    bdf=bdf,
                    sysfs_path=root.realpath(base),
                    vendor_id=_hex_attr(root, f"{base}/vendor"),
                    device_id=_hex_attr(root, f"{base}/device"),
                    class_code=_hex_attr(root, f"{base}/class"),
                )
            )
        except (OSError, ValueError):
            continue
    return devices


def find_gpus(root: HostRoot) -> list[PciDevice]:
    """NVIDIA GPUs from sysfs: vendor 0x10de and a display class 0x03xxxx (audio and bridges are left out)."""
    return [d for d in list_pci_devices(root) if d.is_nvidia_gpu]


def upstream_bdfs(device: PciDevice) -> list[str]:
    """The bridges above `device`, nearest the root complex first (docs/reference/healthchecks.md §2.6)."""
    parts = device.sysfs_path.split("/")
    return [p for p in parts if is_bdf(p) and p != device.bdf]


def root_complex(device: PciDevice) -> str:
    """The 'pci0000:00' host-bridge component of the device's sysfs path ('' when absent)."""
    for part in device.sysfs_path.split("/"):
        if part.startswith("pci") and ":" in part:
            return part
    return ""


def read_config(root: HostRoot, bdf: str) -> PciConfig:
    """Decode /sys/bus/pci/devices/<bdf>/config (OSError when unreadable, PciConfigError when garbage)."""
    return decode_config(root.read_bytes(f"/sys/bus/pci/devices/{bdf}/config"))
