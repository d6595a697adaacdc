"""Provides the CPU power-management checks C1-C9 of docs/reference/healthchecks.md (scaling driver, amd_pstate,
intel_pstate, governor, EPP, boost, cpuidle, deep C-states, kernel cmdline). Inside a VM or container they report
info."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from decodetop.collectors.checks.context import HostContext, guarded
from decodetop.collectors.checks.parsers import cmdline_value, parse_cmdline, parse_int, parse_name, parse_word
from decodetop.collectors.checks.result import CheckResult, Status

CPU = "/sys/devices/system/cpu"
FAMILY_ZEN5 = 0x1A
"""amd-pstate.c amd_pstate_init(): on a server PM profile the driver loads by itself only from family 0x1A."""
C8_LATENCY_LIMIT_US = 1
"""docs/reference/healthchecks.md C8: warn when a state with exit latency above 1 µs is enabled and its usage grows."""


def _policies(ctx: HostContext) -> list[str]:
    """cpufreq policy directories, falling back to per-CPU cpufreq dirs (docs/reference/healthchecks.md C1)."""
    policies = ctx.root.glob(f"{CPU}/cpufreq/policy[0-9]*")
    if policies:
        return sorted(policies, key=lambda p: int(p.rsplit("policy", 1)[1]))
    return [p for p in ctx.root.glob(f"{CPU}/cpu[0-9]*/cpufreq") if ctx.root.is_dir(p)]


def _not_exposed(ctx: HostContext, what: str) -> str:
    """'no cpufreq directory: not exposed in this VM' or the bare-metal wording."""
    if ctx.virt.guest:
        return f"{what}: not exposed in this {ctx.virt.describe()}"
    return f"{what} (driver not loaded, or firmware owns P-states)"


def _summarize(values: list[str]) -> str:
    """['a','a','b'] → 'a (2), b (1)'; one distinct value prints alone."""
    counts = Counter(values)
    if len(counts) == 1:
        return next(iter(counts))
    return ", ".join(f"{v} ({n})" for v, n in counts.most_common())


def _cpu_fact(ctx: HostContext) -> dict[str, str]:
    if ctx.cpu is None:
        return {}
    return {"cpu": ctx.cpu.model_name, "cpu_vendor": ctx.cpu.vendor, "cpu_family": str(ctx.cpu.family)}


@guarded("C1", "CPU scaling driver")
def check_scaling_driver(ctx: HostContext) -> list[CheckResult]:
    """C1: amd-pstate(-epp) on AMD Zen 2+, intel_pstate on Intel; acpi-cpufreq on EPYC warns."""
    title = "CPU scaling driver"
    expected = "amd-pstate-epp (or amd-pstate) on AMD EPYC; intel_pstate on Intel; all policies alike"
    why = (
        "amd-pstate is the kernel's low-latency interface that passes performance hints straight to the CPU "
        "(CPPC); acpi-cpufreq steps through a few ACPI P-states on the governor's schedule."
    )
    policies = _policies(ctx)
    if not policies:
        return [
            CheckResult(
                "C1",
                title,
                Status.INFO,
                _not_exposed(ctx, "no cpufreq directory"),
                expected,
                why,
                "Nothing to do inside a guest; on bare metal check the BIOS (OS-controlled P-states / CPPC).",
                facts={"scaling_driver": "none", **_cpu_fact(ctx)},
            )
        ]
    drivers = [parse_word(ctx.root.read_text(f"{p}/scaling_driver"), f"{p}/scaling_driver") for p in policies]
    distinct = sorted(set(drivers))
    observed = _summarize(drivers)
    facts = {"scaling_driver": ",".join(distinct), **_cpu_fact(ctx)}
    status = Status.PASS
    fix = ""
    cpu = ctx.cpu
    if len(distinct) > 1:
        status = Status.WARN
        fix = "Policies use different drivers: check the kernel cmdline and cpufreq modules."
    elif cpu is not None and cpu.is_epyc_class and distinct[0] == "acpi-cpufreq":
        status = Status.WARN
        fix = (
            "Boot with amd_pstate=active (kernel >= 6.3; on Zen 4 and older servers the driver does not load "
            "without it), then set the performance governor (tuned latency-performance)."
        )
    else:
        native = (cpu is not None and cpu.is_amd and distinct[0] in ("amd-pstate-epp", "amd-pstate")) or (
            cpu is not None and cpu.is_intel and distinct[0] in ("intel_pstate", "intel_cpufreq")
        )
        status = Status.PASS if native else Status.INFO
    return [
        CheckResult(
            "C1",
            title,
            ctx.guest_status(status),
            f"{observed} on {len(policies)} policies" + (f" ({cpu.model_name})" if cpu else ""),
            expected,
            why,
            fix,
            facts=facts,
        )
    ]


@guarded("C2", "amd_pstate mode")
def check_amd_pstate(ctx: HostContext) -> list[CheckResult]:
    """C2: amd_pstate status `active`; explain a missing driver on Zen 4 and older servers."""
    title = "amd_pstate mode"
    expected = "active (EPP) with the performance governor"
    cpu = ctx.cpu
    if cpu is None or not cpu.is_amd:
        vendor = cpu.vendor if cpu else "unknown CPU"
        return [CheckResult("C2", title, Status.INFO, f"not applicable ({vendor})", expected, subject="host")]
    params = parse_cmdline(ctx.root.try_read_text("/proc/cmdline") or "")
    on_cmdline = cmdline_value(params, "amd_pstate")
    status_text = ctx.root.try_read_text(f"{CPU}/amd_pstate/status")
    why = (
        "In active mode the CPU picks frequencies itself from the EPP hint with sub-millisecond reaction; the "
        "other modes or acpi-cpufreq leave ramp-up to the OS governor."
    )
    cmd_note = f"; cmdline amd_pstate={on_cmdline}" if on_cmdline is not None else "; no amd_pstate= on the cmdline"
    if status_text is None:
        family = cpu.family if cpu.family is not None else -1
        reason = "amd_pstate driver not loaded"
        if family < FAMILY_ZEN5 and on_cmdline is None:
            reason += (
                f" (family 0x{family:x} < 0x1A: mainline amd_pstate_init() refuses a server/undefined ACPI PM "
                "profile unless amd_pstate=<mode> is on the cmdline, so the kernel fell back to acpi-cpufreq)"
            )
        if not _policies(ctx):
            status = Status.INFO
            reason = _not_exposed(ctx, "no amd_pstate directory")
        else:
            status = Status.WARN
        return [
            CheckResult(
                "C2",
                title,
                ctx.guest_status(status),
                reason + cmd_note,
                expected,
                why,
                "Add amd_pstate=active to the kernel cmdline (GRUB_CMDLINE_LINUX), update-grub, reboot.",
                facts={"amd_pstate": "absent"},
            )
        ]
    mode = parse_word(status_text, f"{CPU}/amd_pstate/status")
    status = Status.PASS if mode == "active" else Status.WARN
    return [
        CheckResult(
            "C2",
            title,
            ctx.guest_status(status),
            mode + cmd_note,
            expected,
            why,
            ""
            if status == Status.PASS
            else "echo active > /sys/devices/system/cpu/amd_pstate/status, or boot with amd_pstate=active.",
            facts={"amd_pstate": mode},
        )
    ]


@guarded("C3", "intel_pstate")
def check_intel_pstate(ctx: HostContext) -> list[CheckResult]:
    """C3: intel_pstate active/passive, no_turbo=0, min_perf_pct=100."""
    title = "intel_pstate"
    expected = "status active or passive, no_turbo 0, min_perf_pct 100"
    cpu = ctx.cpu
    if cpu is None or not cpu.is_intel:
        vendor = cpu.vendor if cpu else "unknown CPU"
        return [CheckResult("C3", title, Status.INFO, f"not applicable ({vendor})", expected)]
    base = f"{CPU}/intel_pstate"
    status_text = ctx.root.try_read_text(f"{base}/status")
    if status_text is None:
        return [
            CheckResult(
                "C3",
                title,
                Status.INFO if ctx.virt.guest or not _policies(ctx) else Status.WARN,
                _not_exposed(ctx, "no intel_pstate directory"),
                expected,
                "intel_pstate drives HWP, the CPU's own fast P-state control.",
                "Check intel_pstate=disable on the cmdline and the BIOS HWP setting.",
                facts={"intel_pstate": "absent"},
            )
        ]
    mode = parse_word(status_text, f"{base}/status")
    no_turbo = parse_int(ctx.root.read_text(f"{base}/no_turbo"), f"{base}/no_turbo")
    min_pct = parse_int(ctx.root.read_text(f"{base}/min_perf_pct"), f"{base}/min_perf_pct")
    problems = []
    if mode not in ("active", "passive"):
        problems.append(f"status {mode}")
    if no_turbo != 0:
        problems.append("turbo disabled")
    if min_pct < 100:
        problems.append(f"min_perf_pct {min_pct}")
    return [
        CheckResult(
            "C3",
            title,
            ctx.guest_status(Status.WARN if problems else Status.PASS),
            f"status {mode}, no_turbo {no_turbo}, min_perf_pct {min_pct}",
            expected,
            "A floor below 100% lets cores drop frequency between decode steps; turbo off costs single-thread speed.",
            "tuned-adm profile latency-performance (sets min_perf_pct=100)" if problems else "",
            facts={"intel_pstate": mode, "no_turbo": str(no_turbo), "min_perf_pct": str(min_pct)},
        )
    ]


@guarded("C4", "CPU governor and frequency limits")
def check_governor(ctx: HostContext) -> list[CheckResult]:
    """C4: performance governor everywhere and scaling_max_freq == cpuinfo_max_freq."""
    title = "CPU governor and frequency limits"
    expected = "governor performance on every policy; scaling_max_freq = cpuinfo_max_freq"
    policies = _policies(ctx)
    if not policies:
        return [CheckResult("C4", title, Status.INFO, _not_exposed(ctx, "no cpufreq policies"), expected)]
    governors: list[str] = []
    capped: list[str] = []
    for p in policies:
        governors.append(parse_word(ctx.root.read_text(f"{p}/scaling_governor"), f"{p}/scaling_governor"))
        smax = parse_int(ctx.root.read_text(f"{p}/scaling_max_freq"), f"{p}/scaling_max_freq")
        cmax = parse_int(ctx.root.read_text(f"{p}/cpuinfo_max_freq"), f"{p}/cpuinfo_max_freq")
        if smax < cmax:
            capped.append(f"{p.rsplit('/', 1)[1]} {smax // 1000}/{cmax // 1000} MHz")
    bad_gov = [g for g in governors if g != "performance"]
    observed = f"governor {_summarize(governors)}"
    if capped:
        observed += f"; capped: {', '.join(capped[:3])}" + (f" (+{len(capped) - 3})" if len(capped) > 3 else "")
    facts = {"governor": ",".join(sorted(set(governors))), "freq_capped_policies": str(len(capped))}
    if ctx.root.is_live:
        observed += _psutil_now()
    status = Status.WARN if bad_gov or capped else Status.PASS
    return [
        CheckResult(
            "C4",
            title,
            ctx.guest_status(status),
            observed,
            expected,
            "Other governors lower the clock between bursts; the host-side work of each decode step (scheduling, "
            "kernel launches) then runs on a slow core.",
            "cpupower frequency-set -g performance (or tuned-adm profile latency-performance); remove caps."
            if status != Status.PASS
            else "",
            facts=facts,
        )
    ]


def _psutil_now() -> str:
    """'; now 2412 MHz avg, load 0.31' from psutil: live host only (psutil reads the real /sys and /proc, so a
    copied tree never goes through it). Not a fact: it changes from run to run and would clutter baseline diffs."""
    try:
        import psutil
    except ImportError:
        return ""
    try:
        freq = psutil.cpu_freq()
        load1 = psutil.getloadavg()[0]
    except (OSError, RuntimeError, NotImplementedError):
        return ""
    mhz = f"now {freq.current:.0f} MHz avg, " if freq is not None and freq.current else ""
    return f"; {mhz}load {load1:.2f}"


@guarded("C5", "Energy-performance preference")
def check_epp(ctx: HostContext) -> list[CheckResult]:
    """C5: EPP `performance` on every policy that exposes one."""
    title = "Energy-performance preference"
    expected = "performance"
    policies = _policies(ctx)
    if not policies:
        return [CheckResult("C5", title, Status.INFO, _not_exposed(ctx, "no cpufreq policies"), expected)]
    values = [
        parse_word(text, f"{p}/energy_performance_preference")
        for p in policies
        if (text := ctx.root.try_read_text(f"{p}/energy_performance_preference")) is not None
    ]
    if not values:
        return [
            CheckResult(
                "C5",
                title,
                Status.INFO,
                "no energy_performance_preference (driver without EPP, e.g. acpi-cpufreq or amd-pstate passive)",
                expected,
                facts={"epp": "absent"},
            )
        ]
    bad = [v for v in values if v != "performance"]
    return [
        CheckResult(
            "C5",
            title,
            ctx.guest_status(Status.WARN if bad else Status.PASS),
            _summarize(values),
            expected,
            "The EPP hint tells the CPU how eagerly to raise clocks; balance_* hints ramp slowly after idle.",
            "Set the performance governor (in amd-pstate active mode it pins EPP to performance), or write "
            "performance to energy_performance_preference."
            if bad
            else "",
            facts={"epp": ",".join(sorted(set(values)))},
        )
    ]


@guarded("C6", "Boost / turbo")
def check_boost(ctx: HostContext) -> list[CheckResult]:
    """C6: boost enabled and the same everywhere (mixed boost within a CCD can hold cores below nominal)."""
    title = "Boost / turbo"
    expected = "enabled, the same on every policy"
    values: dict[str, int] = {}
    global_text = ctx.root.try_read_text(f"{CPU}/cpufreq/boost")
    if global_text is not None:
        values["global"] = parse_int(global_text, f"{CPU}/cpufreq/boost")
    for p in _policies(ctx):
        text = ctx.root.try_read_text(f"{p}/boost")
        if text is not None:
            values[p.rsplit("/", 1)[1]] = parse_int(text, f"{p}/boost")
    no_turbo = ctx.root.try_read_text(f"{CPU}/intel_pstate/no_turbo")
    if no_turbo is not None:
        values["intel_pstate"] = 1 - parse_int(no_turbo, f"{CPU}/intel_pstate/no_turbo")
    if not values:
        return [CheckResult("C6", title, Status.INFO, _not_exposed(ctx, "no boost control"), expected)]
    distinct = set(values.values())
    if len(distinct) > 1:
        off = sorted(k for k, v in values.items() if v == 0)
        status, observed = Status.WARN, f"mixed: off on {', '.join(off[:4])}" + (" ..." if len(off) > 4 else "")
    elif distinct == {1}:
        status, observed = Status.PASS, f"enabled ({len(values)} control{'s' if len(values) > 1 else ''})"
    else:
        status, observed = Status.INFO, f"disabled ({len(values)} control{'s' if len(values) > 1 else ''})"
    return [
        CheckResult(
            "C6",
            title,
            ctx.guest_status(status),
            observed,
            expected,
            "On Zen 4 and older, mixing boost on and off within one CCD can leave the non-boost cores below "
            "nominal; boost off costs single-thread speed on the host path.",
            "echo 1 > /sys/devices/system/cpu/cpufreq/boost" if status != Status.PASS else "",
            facts={"boost": "mixed" if len(distinct) > 1 else str(next(iter(distinct)))},
        )
    ]


@guarded("C7", "cpuidle driver and governor")
def check_cpuidle_driver(ctx: HostContext) -> list[CheckResult]:
    """C7: report the cpuidle driver and governor."""
    base = f"{CPU}/cpuidle"
    driver_text = ctx.root.try_read_text(f"{base}/current_driver")
    gov_text = ctx.root.try_read_text(f"{base}/current_governor_ro")
    if gov_text is None:
        gov_text = ctx.root.try_read_text(f"{base}/current_governor")
    if driver_text is None:
        observed = _not_exposed(ctx, "no cpuidle directory")
        driver = "absent"
        governor = ""
    else:
        driver = parse_word(driver_text, f"{base}/current_driver")
        governor = parse_word(gov_text, f"{base}/current_governor") if gov_text else "?"
        observed = f"driver {driver}, governor {governor}"
        if driver == "none" and ctx.virt.guest:
            observed += f" (no idle states exposed in this {ctx.virt.short()})"
    return [
        CheckResult(
            "C7",
            "cpuidle driver and governor",
            Status.INFO,
            observed,
            "reported only (acpi_idle on AMD, intel_idle on Intel, haltpoll in KVM guests)",
            "processor.max_cstate= only affects acpi_idle and intel_idle.max_cstate= only intel_idle (C9).",
            facts={"cpuidle_driver": driver, "cpuidle_governor": governor},
        )
    ]


@dataclass(frozen=True)
class IdleState:
    """One cpuidle state aggregated over CPUs."""

    index: int
    name: str
    latency_us: int
    enabled_cpus: int
    cpus: int
    usage_before: int
    usage_after: int

    @property
    def usage_growth(self) -> int:
        """Entries into this state during the sampling interval, summed over CPUs."""
        return self.usage_after - self.usage_before


def read_idle_states(ctx: HostContext) -> list[IdleState]:
    """Every cpuidle state, aggregated over CPUs, with `usage` sampled twice `sample_interval_s` apart."""
    cpus = [c for c in ctx.root.glob(f"{CPU}/cpu[0-9]*") if ctx.root.is_dir(f"{c}/cpuidle")]
    per_state: dict[int, dict[str, object]] = {}
    usage_paths: list[tuple[int, str]] = []
    for cpu_dir in cpus:
        for state_dir in ctx.root.glob(f"{cpu_dir}/cpuidle/state[0-9]*"):
            index = int(state_dir.rsplit("state", 1)[1])
            name = parse_name(ctx.root.read_text(f"{state_dir}/name"), f"{state_dir}/name")
            latency = parse_int(ctx.root.read_text(f"{state_dir}/latency"), f"{state_dir}/latency")
            disable = parse_int(ctx.root.read_text(f"{state_dir}/disable"), f"{state_dir}/disable")
            entry = per_state.setdefault(index, {"name": name, "latency": latency, "enabled": 0, "cpus": 0})
            entry["latency"] = max(int(str(entry["latency"])), latency)
            entry["cpus"] = int(str(entry["cpus"])) + 1
            if disable == 0:
                entry["enabled"] = int(str(entry["enabled"])) + 1
            usage_paths.append((index, f"{state_dir}/usage"))
    before: dict[int, int] = {}
    for index, path in usage_paths:
        before[index] = before.get(index, 0) + parse_int(ctx.root.read_text(path), path)
    if usage_paths and ctx.root.is_live and ctx.sample_interval_s > 0:
        ctx.sleep(ctx.sample_interval_s)
    after: dict[int, int] = {}
    for index, path in usage_paths:
        after[index] = after.get(index, 0) + parse_int(ctx.root.read_text_later(path), path)
    return [
        IdleState(
            index=i,
            name=str(e["name"]),
            latency_us=int(str(e["latency"])),
            enabled_cpus=int(str(e["enabled"])),
            cpus=int(str(e["cpus"])),
            usage_before=before.get(i, 0),
            usage_after=after.get(i, 0),
        )
        for i, e in sorted(per_state.items())
    ]


@guarded("C8", "Deep C-states")
def check_deep_cstates(ctx: HostContext) -> list[CheckResult]:
    """C8: every state with exit latency > 1 µs is disabled, or enabled but unused (a PM-QoS limit holds)."""
    title = "Deep C-states"
    expected = f"states with exit latency > {C8_LATENCY_LIMIT_US} µs disabled or not entered (PM-QoS limit)"
    why = (
        "Waking a core from a deep C-state costs the state's exit latency (its `latency` file, in µs); a decode "
        "step whose host thread idles between kernel launches pays it again and again."
    )
    states = read_idle_states(ctx)
    if not states:
        return [
            CheckResult(
                "C8",
                title,
                Status.INFO,
                _not_exposed(ctx, "no cpuidle states"),
                expected,
                why,
                facts={"deep_cstates": "none"},
            )
        ]
    deep = [s for s in states if s.latency_us > C8_LATENCY_LIMIT_US]
    sampled = ctx.root.has_later_sample()
    interval = f"{ctx.sample_interval_s:g} s" if ctx.root.is_live else "the recorded interval"
    used = [s for s in deep if s.enabled_cpus and s.usage_growth > 0]
    enabled = [s for s in deep if s.enabled_cpus]
    parts = [
        f"{s.name} ({s.latency_us} µs) enabled on {s.enabled_cpus}/{s.cpus} CPUs, +{s.usage_growth} entries"
        for s in enabled
    ]
    if not deep:
        status, observed = Status.PASS, f"no state deeper than {C8_LATENCY_LIMIT_US} µs"
    elif not enabled:
        status, observed = Status.PASS, "deep states disabled: " + ", ".join(s.name for s in deep)
    elif not sampled:
        status, observed = Status.UNKNOWN, "; ".join(parts) + " (usage sampled once: growth unknown)"
    elif used:
        status, observed = Status.WARN, "; ".join(parts) + f" in {interval}"
    else:
        status, observed = (
            Status.PASS,
            "; ".join(parts) + f" in {interval}: enabled but not entered (a PM-QoS limit holds)",
        )
    return [
        CheckResult(
            "C8",
            title,
            ctx.guest_status(status),
            observed,
            expected,
            why,
            "tuned-adm profile latency-performance (force_latency=1 through /dev/cpu_dma_latency), or disable "
            "the states: cpupower idle-set -D 2."
            if status == Status.WARN
            else "",
            facts={"deep_cstates_enabled": ",".join(s.name for s in enabled) or "none"},
        )
    ]


_CMDLINE_KEYS = (
    "amd_pstate",
    "intel_pstate",
    "processor.max_cstate",
    "intel_idle.max_cstate",
    "idle",
    "iommu",
    "amd_iommu",
    "intel_iommu",
    "numa_balancing",
    "transparent_hugepage",
    "isolcpus",
    "nohz_full",
)
"""docs/reference/healthchecks.md C9: the parameters worth reporting ([KPARAMS], [GRACE], [NCCL-TS])."""


@guarded("C9", "Kernel cmdline")
def check_cmdline(ctx: HostContext) -> list[CheckResult]:
    """C9: report the tuning parameters; warn on ones that cannot take effect with the running drivers."""
    text = ctx.root.read_text("/proc/cmdline")
    params = parse_cmdline(text)
    found = [(k, cmdline_value(params, k)) for k in _CMDLINE_KEYS if cmdline_value(params, k) is not None]
    driver = (ctx.root.try_read_text(f"{CPU}/cpuidle/current_driver") or "").strip()
    conflicts: list[str] = []
    if cmdline_value(params, "processor.max_cstate") is not None and driver == "intel_idle":
        conflicts.append("processor.max_cstate has no effect with intel_idle")
    if cmdline_value(params, "intel_idle.max_cstate") is not None and driver == "acpi_idle":
        conflicts.append("intel_idle.max_cstate has no effect with acpi_idle")
    pstate = cmdline_value(params, "amd_pstate")
    if pstate and ctx.cpu is not None and not ctx.cpu.is_amd:
        conflicts.append("amd_pstate= on a non-AMD CPU")
    iommu_on = cmdline_value(params, "intel_iommu") == "on" or cmdline_value(params, "amd_iommu") == "on"
    if not ctx.virt.guest and iommu_on and cmdline_value(params, "iommu") != "pt":
        conflicts.append("IOMMU forced on without iommu=pt (GPU DMA is translated)")
    observed = " ".join(f"{k}={v}" if v else k for k, v in found) or "none of the tuning parameters"
    if ctx.virt.container:
        observed += " (the host's cmdline, seen from the container)"
    if conflicts:
        observed += "; " + "; ".join(conflicts)
    return [
        CheckResult(
            "C9",
            "Kernel cmdline",
            ctx.guest_status(Status.WARN if conflicts else Status.INFO),
            observed,
            "reported; on bare metal iommu=pt or the IOMMU off; no parameter that the running drivers ignore",
            "Cmdline parameters decide the P-state and idle drivers before anything else can.",
            "Edit GRUB_CMDLINE_LINUX, update-grub, reboot." if conflicts else "",
            facts={"cmdline_params": " ".join(f"{k}={v}" if v else k for k, v in found)},
        )
    ]


CPU_CHECKS = (
    check_scaling_driver,
    check_amd_pstate,
    check_intel_pstate,
    check_governor,
    check_epp,
    check_boost,
    check_cpuidle_driver,
    check_deep_cstates,
    check_cmdline,
)
