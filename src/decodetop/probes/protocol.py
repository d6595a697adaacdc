"""Provides the picklable messages between the probe controller and its ranks (stdlib only, no torch).

Controller → rank (one duplex pipe per rank): `RunProbe`, `Shutdown`.
Rank → controller: `Ready` once the rank has joined the group, `Progress` while a probe runs (rank 0 only),
`RankDone` when the rank's part of a probe ends (its `RankOutput`, or its error and traceback), `Fatal` when the
rank cannot go on (it failed to start or join the group).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from decodetop.probes.results import Environment, RankOutput

#: Variables every rank gets unless the user set them: NVLink multicast off. On shared multi-GPU hosts a program
#: that uses multicast can put the host's GPUs out of service (docs/reference/h200-machine.md, device KINDS.md).
RANK_ENV_DEFAULTS: Mapping[str, str] = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


@dataclass(frozen=True)
class RankConfig:
    """Everything a spawned rank needs to join the group (picklable; passed as the process argument)."""

    rank: int
    world_size: int
    device_kind: str  # "cuda" or "cpu"
    store_path: str  # FileStore file in the controller's private temp dir: no fixed port needed
    env: Mapping[str, str] = field(default_factory=dict)  # set in the rank before torch is imported
    extra_probe_modules: tuple[str, ...] = ()
    parent_pid: int = 0  # the rank exits when this process goes away
    join_timeout_s: float = 120.0
    log_path: str = ""  # the rank's fd 1 and 2 go here (appended), never to the terminal; "" leaves them


@dataclass(frozen=True)
class RunProbe:
    """Run `module.run(ctx, params)` on every rank; `seq` matches the replies to the command."""

    seq: int
    probe: str
    module: str
    params: Mapping[str, Any]


@dataclass(frozen=True)
class Shutdown:
    """Free CUDA graphs, leave the process group (with a deadline) and exit."""

    destroy_timeout_s: float = 2.0


@dataclass(frozen=True)
class Ready:
    """The rank joined the group; rank 0 also sends the environment."""

    rank: int
    environment: Environment | None = None
    warnings: int = 0
    """Python warnings the rank showed while starting (written to the rank log)."""


@dataclass(frozen=True)
class Progress:
    """Progress of the running probe, e.g. text="512 KiB", done=8, total=14."""

    seq: int
    rank: int
    probe: str
    text: str
    done: int = 0
    total: int = 0

    def line(self) -> str:
        """A one-line rendering: 'allreduce 8/14 512 KiB'."""
        count = f" {self.done}/{self.total}" if self.total else ""
        text = f" {self.text}" if self.text else ""
        return f"{self.probe}{count}{text}"


@dataclass(frozen=True)
class RankDone:
    """The rank finished its part of probe `seq`: its output, or its error."""

    seq: int
    rank: int
    output: RankOutput | None = None
    error: str | None = None
    traceback: str | None = None
    warnings: int = 0
    """Python warnings the rank showed during this probe (written to the rank log)."""


@dataclass(frozen=True)
class Fatal:
    """The rank cannot continue (failed to start or to join the group)."""

    rank: int
    error: str
    traceback: str | None = None
