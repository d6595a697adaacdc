"""Provides N12 (NVIDIA device majors vs /proc/devices vs the device cgroup, docs/reference/healthchecks.md §3) and N8
(Xid events in the kernel log)."""

from __future__ import annotations

import contextlib
import dataclasses
import re
from dataclasses import dataclass

from decodetop.collectors.checks.context import HostContext, guarded, unless_root
from decodetop.collectors.checks.parsers import (
    DeviceRule,
    ProcDevices,
    parse_device_rule,
    parse_devices_list,
    parse_proc_devices,
    parse_xids,
)
from decodetop.collectors.checks.result import CheckResult, Status
from decodetop.collectors.hostroot import KmsgUnreadableError

NVIDIA_FIXED_MAJOR = 195
"""nvidia and nvidiactl use the fixed major 195; nvidia-modprobe hard-codes it ([NCT-324])."""

SYMPTOM = (
    "NVML works but CUDA init fails: nvidia-smi and NVML need only major 195 and keep working, while cuInit() "
    "fails with 999 (CUDA_ERROR_UNKNOWN) because /dev/nvidia-uvm is stale or blocked by the device cgroup."
)
"""docs/reference/healthchecks.md §3: the symptom worth stating verbatim in the UI ([NCT-1934])."""

_LXC_ALLOW_RE = re.compile(r"^\s*lxc\.cgroup2?\.devices\.allow\s*[:=]\s*(.+?)\s*$")
"""Proxmox writes `key: value`, plain LXC `key = value` (docs/reference/healthchecks.md §3.4)."""

DCGM_NOTE = "DCGM's 'Permissions and OS-related blocks' deployment check covers the same failure class."

_NODE_PATTERNS = (
    "/dev/nvidia[0-9]*",
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
    "/dev/nvidia-caps/*",
)


def live_major_for(node: str, devices: ProcDevices) -> tuple[int | None, str]:
    """The registered major a node should carry, and the /proc/devices name it comes from.

    Driver 550.40 renamed 'nvidia-frontend' to 'nvidia'/'nvidiactl', so both spellings count ([NCT-324]).
    """
    name = node.rsplit("/", 1)[1]
    if node.startswith("/dev/nvidia-caps/"):
        candidates = ["nvidia-caps"]
    elif name == "nvidia-uvm-tools":
        candidates = ["nvidia-uvm"]  # minor 1 of the nvidia-uvm major (nvidia-modprobe)
    elif name in ("nvidiactl", "nvidia-modeset") or (name.startswith("nvidia") and name[6:].isdigit()):
        # nvidiactl is 195:255 and nvidia-modeset 195:254, both under the fixed 195 major.
        candidates = [name if name == "nvidiactl" else "nvidia", "nvidia", "nvidia-frontend"]
    else:
        candidates = [name]
    for candidate in candidates:
        major = devices.char_major(candidate)
        if major is not None:
            return major, candidate
    return None, candidates[0]


@dataclass(frozen=True)
class NodeFinding:
    """One /dev/nvidia* node and what is wrong with it ('' when nothing)."""

    node: str
    kind: str
    major: int
    minor: int
    live_major: int | None
    problem: str


def _cgroup_v1_rules(ctx: HostContext) -> tuple[tuple[DeviceRule, ...] | None, str]:
    """The devices.list of this process's cgroup (v1), and where it came from."""
    cgroup_text = ctx.root.try_read_text("/proc/self/cgroup") or ""
    rel = "/"
    for line in cgroup_text.splitlines():
        fields = line.split(":", 2)
        if len(fields) == 3 and "devices" in fields[1].split(","):
            rel = fields[2] or "/"
    candidates = [f"/sys/fs/cgroup/devices{rel.rstrip('/')}/devices.list", "/sys/fs/cgroup/devices/devices.list"]
    for path in candidates:
        text = ctx.root.try_read_text(path)
        if text is not None:
            return parse_devices_list(text), path
    return None, candidates[0]


def _with_problem(finding: NodeFinding, extra: str) -> NodeFinding:
    """`finding` with `extra` added to its problem."""
    return dataclasses.replace(finding, problem=f"{finding.problem}; {extra}" if finding.problem else extra)


def _node_findings(ctx: HostContext, nodes: list[str], devices: ProcDevices) -> list[NodeFinding]:
    """Each node's device number against the live major of its driver."""
    findings: list[NodeFinding] = []
    for node in nodes:
        rdev = ctx.root.stat_rdev(node)
        if rdev is None or rdev.kind != "c":
            findings.append(NodeFinding(node, "?", -1, -1, None, "not a character device"))
            continue
        live, name = live_major_for(node, devices)
        problem = ""
        if live is None:
            problem = f"no '{name}' driver registered in /proc/devices"
        elif rdev.major != live:
            problem = f"stale major {rdev.major} (live {name} is {live})"
        findings.append(NodeFinding(node, rdev.kind, rdev.major, rdev.minor, live, problem))
    return findings


def _open_problem(errno_name: str, major: int) -> str:
    """What a failed cgroup-v2 open probe says about a node."""
    if errno_name == "EPERM":
        return "open: EPERM, the device cgroup blocks it"
    if errno_name in ("ENXIO", "ENODEV"):
        return f"open: {errno_name}, no driver behind major {major} (stale)"
    if errno_name == "EACCES":
        # Mode bits are checked before the device cgroup (inode_permission), so EACCES hides the
        # cgroup's answer: not a failure, but the cgroup could not be tested as this user.
        return "open: EACCES (file mode; cgroup not testable as this user)"
    if errno_name == "UNRECORDED":
        return "open outcome not recorded"
    return f"open: {errno_name}"


CGROUP_UNREAD = "unreadable: the allow-list was not judged"
"""How N12 says that the cgroup-v1 devices.list could not be read (the nodes' majors still are)."""


def _cgroup_findings(ctx: HostContext, findings: list[NodeFinding]) -> tuple[list[NodeFinding], str]:
    """The findings with the device cgroup's verdict added (v1 devices.list, or the v2 open probe), and a note."""
    if ctx.root.is_dir("/sys/fs/cgroup/devices"):
        rules, where = _cgroup_v1_rules(ctx)
        if rules is None:
            return findings, f"cgroup v1 but {where} {CGROUP_UNREAD}"
        return [
            _with_problem(f, f"not allowed rw by {where}")
            if f.major >= 0 and not any(r.covers("c", f.major, f.minor, "rw") for r in rules)
            else f
            for f in findings
        ], f"cgroup v1 {where}"
    if ctx.root.exists("/sys/fs/cgroup/cgroup.controllers"):
        out: list[NodeFinding] = []
        for f in findings:
            probe = ctx.root.open_probe(f.node) if f.major >= 0 else None
            out.append(f if probe is None or probe.ok else _with_problem(f, _open_problem(probe.errno_name, f.major)))
        return out, "cgroup v2 (open probe)"
    return findings, "no device cgroup found"


def _judge_nodes(
    ctx: HostContext, findings: list[NodeFinding], registered: str, cgroup_note: str
) -> tuple[Status, str, str]:
    """N12's status, observed text and fix from the node findings."""
    bad = [f for f in findings if f.problem and "EACCES" not in f.problem and "not recorded" not in f.problem]
    soft = [f for f in findings if f.problem and f not in bad]
    listing = "; ".join(f"{f.node} {f.major}:{f.minor} {f.problem}" for f in bad + soft)
    if bad:
        observed = f"NVML works but CUDA init fails: {listing} [/proc/devices: {registered}; {cgroup_note}]"
        fix = (
            "Recreate stale nodes (nvidia-modprobe -u -c0, or bind-mount the host's /dev/nvidia-uvm) and update the "
            "container's allow rule to the live major (lxc.cgroup2.devices.allow: c <major>:* rwm). " + DCGM_NOTE
        )
        return Status.FAIL, observed, fix
    if soft:
        status = Status.INFO if all("EACCES" in f.problem for f in soft) else Status.UNKNOWN
        fix = unless_root(
            ctx.root,
            "Run as root to test the device cgroup; check the node's mode and group (video/render).",
            "Check the node's mode and group (video/render).",
        )
        return status, f"{listing} [/proc/devices: {registered}; {cgroup_note}]", fix
    if not findings:
        return (
            Status.WARN,
            f"driver registered ({registered}) but no /dev/nvidia* nodes",
            "nvidia-modprobe -u -c0 creates the nodes; in a container, bind-mount them from the host.",
        )
    if cgroup_note.endswith(CGROUP_UNREAD):  # the majors match, the allow-list is unknown: never a pass
        return Status.UNKNOWN, f"{len(findings)} node(s) match live majors ({registered}); {cgroup_note}", ""
    return Status.PASS, f"{len(findings)} node(s) match live majors ({registered}); {cgroup_note}", ""


@guarded("N12", "NVIDIA device nodes and cgroup")
def check_device_majors(ctx: HostContext) -> list[CheckResult]:
    """N12: every /dev/nvidia* node carries the live major and the device cgroup allows it (rw)."""
    title = "NVIDIA device nodes and cgroup"
    expected = "each /dev/nvidia* major = its live major in /proc/devices, and allowed rw by the device cgroup"
    devices = parse_proc_devices(ctx.root.read_text("/proc/devices"))
    nvidia_majors = [(m, n) for m, n in devices.char if n.startswith("nvidia")]
    nodes = sorted({node for pattern in _NODE_PATTERNS for node in ctx.root.device_nodes(pattern)})
    registered = ", ".join(f"{n} {m}" for m, n in nvidia_majors) or "none"
    if not nvidia_majors and not nodes:
        result = CheckResult(
            "N12",
            title,
            Status.INFO,
            "no nvidia driver in /proc/devices and no /dev/nvidia* nodes",
            expected,
            facts={"nvidia_majors": "none"},
        )
        return [result, *_host_side(ctx, devices)]
    findings, cgroup_note = _cgroup_findings(ctx, _node_findings(ctx, nodes, devices))
    status, observed, fix = _judge_nodes(ctx, findings, registered, cgroup_note)
    result = CheckResult(
        "N12",
        title,
        status,
        observed,
        expected,
        SYMPTOM,
        fix,
        subject="/dev/nvidia*",
        facts={"nvidia_majors": registered},
    )
    return [result, *_host_side(ctx, devices)]


def _lxc_configs(ctx: HostContext) -> list[str]:
    """Container config files under the configured folders (Proxmox `<id>.conf`, plain LXC `<name>/config`)."""
    configs: list[str] = []
    for directory in ctx.lxc_config_paths:
        if directory.endswith("/lxc") and directory.startswith("/etc/pve"):
            configs += [f"{directory}/{n}" for n in ctx.root.try_listdir(directory) if n.endswith(".conf")]
        else:
            configs += [f"{directory}/{n}/config" for n in ctx.root.try_listdir(directory)]
    return configs


def _allow_rules(text: str) -> list[DeviceRule]:
    """The device allow rules of one container config (lines that do not parse are skipped)."""
    rules: list[DeviceRule] = []
    for line in text.splitlines():
        match = _LXC_ALLOW_RE.match(line)
        if match is not None:
            with contextlib.suppress(ValueError):
                rules.append(parse_device_rule(match.group(1)))
    return rules


def _rule_problems(rules: list[DeviceRule], devices: ProcDevices) -> list[str]:
    """Live nvidia majors the rules do not allow, and rules for majors no driver holds."""
    live = {m: n for m, n in devices.char if n.startswith("nvidia")}
    unallowed = [f"{n} {m}" for m, n in sorted(live.items()) if not any(r.covers("c", m, 0, "rw") for r in rules)]
    registered = {m for m, _ in devices.char}
    rule_majors = {r.major for r in rules if r.major is not None and r.kind in ("c", "a")}
    dead = sorted(m for m in rule_majors if m not in registered and m != NVIDIA_FIXED_MAJOR)
    problems = []
    if unallowed:
        problems.append("live majors not allowed: " + ", ".join(unallowed))
    if dead:
        problems.append("rules for unregistered majors: " + ", ".join(map(str, dead)))
    return problems


def _host_side(ctx: HostContext, devices: ProcDevices) -> list[CheckResult]:
    """§3.4: on an LXC/Proxmox host, container allow rules vs the live nvidia majors."""
    results: list[CheckResult] = []
    for path in _lxc_configs(ctx):
        rules = _allow_rules(ctx.root.try_read_text(path) or "")
        if not rules:
            continue
        problems = _rule_problems(rules, devices)
        results.append(
            CheckResult(
                f"N12:{path}",
                "Container config allows live NVIDIA majors",
                Status.FAIL if problems else Status.PASS,
                "; ".join(problems) or f"{len(rules)} allow rule(s) cover every live nvidia major",
                "every live nvidia* major allowed; no rule for a major no driver holds",
                SYMPTOM,
                "Update the container's lxc.cgroup2.devices.allow rules to the majors in /proc/devices. " + DCGM_NOTE
                if problems
                else "",
                subject=path,
            )
        )
    return results


XID_FAIL = frozenset({48, 63, 64, 79})
"""docs/reference/healthchecks.md N8: 48 DBE, 63/64 page retirement / row remap, 79 fell off the bus ([XID], [DPR])."""


@guarded("N8", "Xid events in the kernel log")
def check_xids(ctx: HostContext) -> list[CheckResult]:
    """N8: no Xid since boot; 48, 63, 64, 79 fail; other codes warn."""
    title = "Xid events in the kernel log"
    expected = "no Xid since boot"
    try:
        records = ctx.root.read_kmsg()
    except OSError as exc:
        # unreadable on the host itself (live, or as the archive recorded it) reads the same; else not collected
        on_host = ctx.root.is_live or isinstance(exc, KmsgUnreadableError)
        return [
            CheckResult(
                "N8",
                title,
                Status.UNKNOWN if ctx.gpus else Status.INFO,
                f"kernel log unreadable: {exc}" if on_host else f"dev/kmsg (not collected): {exc}",
                expected,
                "Reading the kernel log needs CAP_SYSLOG when kernel.dmesg_restrict=1.",
                unless_root(ctx.root, "Run as root, or check", "Check") + " `journalctl -k | grep Xid` on the host.",
            )
        ]
    events = parse_xids(records)
    if not events:
        return [CheckResult("N8", title, Status.PASS, f"no Xid in {len(records)} kernel-log records", expected)]
    codes = sorted({e.code for e in events})
    status = Status.FAIL if any(c in XID_FAIL for c in codes) else Status.WARN
    per_gpu: dict[str, list[int]] = {}
    for event in events:
        per_gpu.setdefault(event.pci, []).append(event.code)
    observed = "; ".join(f"{pci}: Xid {', '.join(map(str, sorted(set(c))))}" for pci, c in per_gpu.items())
    return [
        CheckResult(
            "N8",
            title,
            status,
            f"{len(events)} Xid event(s): {observed}; last: {events[-1].line[:120]}",
            expected,
            "Xids are the driver's error reports: 48 is a double-bit ECC error, 63/64 page retirement or row "
            "remapping, 79 a GPU that fell off the bus.",
            "Look each code up in NVIDIA's Xid catalog; 48/63/64 need a GPU reset, 79 a reseat or RMA.",
            facts={"xids": ",".join(map(str, codes))},
        )
    ]


DEVICE_CHECKS = (check_device_majors, check_xids)
