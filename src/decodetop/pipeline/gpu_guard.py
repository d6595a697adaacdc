"""Provides `GpuGuard`: whether the GPUs a probe group would use are held by other processes (a serving engine), and
the user's consent to probe them anyway; `HeldGpus`, what it found, in the words the screen and the command line
show; `GpusHeldError`, the refusal every surface raises (stdlib only).

A GPU others use is not probed without consent: `decodetop probe` refuses (exit 2) unless `--force`; the exporter
skips the cycle and says why (`decodetop_exporter_part_failing{part="probes"}`) unless `--force`; the live UI does
not start probes on its own (the serving-time view: the stored budget, the server's observed step and the traced
bar) and asks before a key runs them, because probes compete with production traffic; `--force` gives that consent
for the whole session. Every probe run checks again just before it starts (`decodetop.pipeline.plan_runner`).
NVML is read through `decodetop.probes.gpuinfo.compute_processes` (the one place that lists them); nothing here
blocks an event loop when called from a worker, and nothing changes a GPU.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from decodetop.collectors.nvml import Nvml
from decodetop.errors import UserInputError
from decodetop.probes import gpuinfo
from decodetop.probes.gpuinfo import GpuInfo, GpuProcess
from decodetop.textfmt import format_bytes

PROCESSES_NAMED = 3
"""At most this many processes are named in the one line (the rest are counted)."""
COMPETE = "they compete with production traffic"
"""Why a key must ask first: probes take GPU time, memory bandwidth and links from the engine while they run."""


@dataclass(frozen=True)
class HeldGpus:
    """The probe group's GPUs that other processes hold memory on, and those processes."""

    gpus: tuple[int, ...]
    """CUDA indices of the held GPUs, in order."""
    processes: tuple[GpuProcess, ...]

    @property
    def who(self) -> str:
        """ "GPU 0, 1 are in use by other processes (pid 1329 python3, pid 1330 python3)"."""
        names = []
        for proc in self.processes[:PROCESSES_NAMED]:
            name = "" if proc.name in ("", "?") else f" {proc.name}"  # "?": not readable by this user
            names.append(f"pid {proc.pid}{name}")
        more = len(self.processes) - PROCESSES_NAMED
        if more > 0:
            names.append(f"+{more} more")
        verb = "is" if len(self.gpus) == 1 else "are"
        return f"GPU {', '.join(map(str, self.gpus))} {verb} in use by other processes ({', '.join(names)})"

    def line(self) -> str:
        """The header line of the serving-time view: why probes did not start and how to run them anyway."""
        return f"{self.who}: probes not started; press R to run them anyway — {COMPETE}"

    def short_line(self) -> str:
        """The header in one short line, for terminals under 40 rows (the details, `b`, say the rest)."""
        return f"GPU {', '.join(map(str, self.gpus))} in use by other processes: probes not started (R runs them)"

    def refusal(self) -> str:
        """Why one probe run was refused (the probe's row): the GPUs became busy after the UI started."""
        return f"{self.who}: not probed; press r (R for all) to confirm and run anyway, or start with --force"

    def command_line(self) -> str:
        """The refusal of a headless command (`decodetop probe`, the exporter): every process with its memory."""
        who = "; ".join(
            f"GPU {p.cuda_index}: pid {p.pid} ({p.name}"
            + (f", {format_bytes(p.used_memory_bytes)}" if p.used_memory_bytes is not None else "")
            + ")"
            for p in self.processes
        )
        return f"other processes hold GPU memory ({who}); pass --force to probe anyway"


class GpusHeldError(UserInputError):
    """A probe run refused: other processes hold the GPUs and the user has not consented (exit 2 in a command).
    `held` is what was found (None when the GPUs could not be looked at: a reason not to probe them either)."""

    def __init__(self, held: HeldGpus | None, message: str = "") -> None:
        super().__init__(message or (held.command_line() if held is not None else "the GPUs could not be checked"))
        self.held = held

    @property
    def screen_text(self) -> str:
        """The words of the live UI's probe row (its keys), or the message where nothing was found."""
        return self.held.refusal() if self.held is not None else str(self)


class GpuGuard:
    """Looks for other processes on the probe group's GPUs and holds the user's consent to probe them anyway.

    gpus: the CUDA GPUs the probe group would use (empty for CPU ranks). own_pids: the probe ranks' pids (they hold
    memory on those GPUs too, and are ours). forced: `--force` (consent for the session). nvml: the NVML to read
    (None: the process's shared one)."""

    def __init__(
        self,
        gpus: Callable[[], Sequence[GpuInfo]],
        *,
        own_pids: Callable[[], Sequence[int]] = tuple,
        forced: bool = False,
        nvml: Nvml | None = None,
    ) -> None:
        self.gpus = gpus
        self.own_pids = own_pids
        self.nvml = nvml
        self._consent = threading.Event()
        if forced:
            self._consent.set()

    @property
    def forced(self) -> bool:
        """True once the user consented (`--force`, or the confirmation modal): probes run beside other processes."""
        return self._consent.is_set()

    def allow(self) -> None:
        """The user confirmed: from now on probes run even where other processes hold the GPUs (any thread)."""
        self._consent.set()

    def held(self, own_pids: Sequence[int] = ()) -> HeldGpus | None:
        """The held GPUs and their processes now, or None when every GPU is free (blocking: NVML process lists;
        call it from a worker). A group that cannot be resolved (a --gpus index not on this host) holds nothing
        here: the probe run says why it cannot start."""
        try:
            gpus = list(self.gpus())
        except UserInputError:
            return None
        if not gpus:
            return None
        busy = gpuinfo.compute_processes(gpus, exclude_pids=(os.getpid(), *self.own_pids(), *own_pids), nvml=self.nvml)
        if not busy:
            return None
        return HeldGpus(gpus=tuple(sorted({p.cuda_index for p in busy})), processes=tuple(busy))

    def check(self, own_pids: Sequence[int] = ()) -> None:
        """Before a probe run: raise `GpusHeldError` where other processes hold the GPUs and the user has not consented
        (or where the GPUs could not be looked at); return where the run may start."""
        if self.forced:
            return
        try:
            held = self.held(own_pids)
        except Exception as exc:  # a failed look at the GPUs is a reason not to probe them
            why = f"could not check the GPUs for other processes ({type(exc).__name__}: {exc})"
            raise GpusHeldError(None, f"{why}; pass --force to probe anyway") from None
        if held is not None:
            raise GpusHeldError(held)

    def refusal(self, own_pids: Sequence[int] = ()) -> str | None:
        """`check` in the live UI's words (its keys), for a probe row: why a run must not start now, or None."""
        try:
            self.check(own_pids)
        except GpusHeldError as exc:
            return exc.screen_text
        return None
