"""Provides the fused-MoE kernel's tile choice per GPU and shape (torch side): tuned once by timing each candidate
tile on the probe's own tensors, kept under the state directory (`decodetop.paths.state_dir()/kernel_tiles.json`),
and read back on the next run, so a shape is tuned once per GPU model.

The store is a JSON object {GPU name: {shape: {"gate_up": [rows, step, warps, stages, splits, mma], "down": [...],
"gate_up_us": …, "down_us": …, "tried": n, "form": "late" | "early" | "fold", "step_us": …}}} (mma 1: the gate_up
kernel's `tl.dot` form; form: how the kernels meet, `FORMS`, timed as a whole step; an entry without it reads as
the late form). Entries of three numbers
(from before stages and splits) read as Triton's default stages and one split, entries of five (from before the
`tl.dot` form) as the reduction form; writes have six. Writes take an advisory lock beside the file, re-read and
merge, then replace the file atomically, so two probe processes keep each other's entries; an unreadable or
malformed store is ignored (the shape is tuned again) and left in place, never overwritten.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import statistics
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from decodetop import jsonio
from decodetop.atomic import write_text_atomic
from decodetop.errors import UserInputError
from decodetop.paths import state_dir
from decodetop.probes.worker.timing import time_graph

#: Reduction elements each program streams per step by default: 256 bf16 = 512 B per row, whole 128-B sectors, as
#: vLLM's fused_moe configs pick BLOCK_SIZE_K 64–256 for small M
#: (https://github.com/vllm-project/vllm/tree/main/vllm/model_executor/layers/fused_moe/configs).
BLOCK_K = 256


@dataclass(frozen=True)
class Tiles:
    """Tile shape of one kernel: output rows per program, reduction elements per step, warps per program, software
    pipeline stages (0: Triton's default), the parts the reduction is split into (each part a program, added
    with atomics), and whether the gate_up kernel takes its products with `tl.dot` (`mma`: the token padded to the
    dot's 16 rows, so Triton pipelines the weight loads through shared memory; the down kernel has no such form)."""

    block_n: int
    block_k: int = BLOCK_K
    num_warps: int = 4
    num_stages: int = 0
    split_k: int = 1
    mma: bool = False

    def as_list(self) -> list[int]:
        """The store's six numbers (mma as 0 or 1)."""
        return [self.block_n, self.block_k, self.num_warps, self.num_stages, self.split_k, int(self.mma)]

    @property
    def text(self) -> str:
        """'16×512/4w', '16×512/4w/4st', '16×256/4w split 4', '32×256/4w/3st mma'."""
        out = f"{self.block_n}×{self.block_k}/{self.num_warps}w"
        if self.num_stages:
            out += f"/{self.num_stages}st"
        out += f" split {self.split_k}" if self.split_k > 1 else ""
        return out + (" mma" if self.mma else "")


#: The gate_up kernel's `tl.dot` form (`Tiles.mma`): 16–64 rows (the gate_up rows of the reduction form's
#: candidates that are whole MMA tiles) over 128–512 elements per step in 3–4 pipeline stages, whole or split in
#: 2–4, for the shapes with few rows per slot whose reduction loop keeps one tile in flight per program
#: (DeepSeek-V3's TP-8 slice at 67 % of copy bandwidth on an H200 with the reduction form: docs/benchmarks.md,
#: "Kernels, fourth round"). Each stage in flight holds the padded token and the gate and up tiles in shared memory,
#: (16 + 2·rows) · step · 2 B, and Triton 3.9 keeps stages − 1 of them (compiled for sm_90 on the CPU: 36–108 KiB
#: over BF16 weights, the most for 64×128 in 4 stages; 216 KiB over FP32) of the 227 KB a block may hold on sm_90
#: (CUDA C++ Programming Guide, "Technical Specifications per Compute Capability":
#: https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html#features-and-technical-specifications); a tile
#: that does not fit a GPU fails to compile and the tuner skips it.
MMA_CANDIDATES = (
    Tiles(16, 256, 4, 3, 1, True),
    Tiles(32, 256, 4, 3, 1, True),
    Tiles(16, 512, 4, 3, 1, True),
    Tiles(32, 128, 4, 4, 1, True),
    Tiles(64, 128, 4, 4, 1, True),
    Tiles(16, 256, 4, 4, 2, True),
    Tiles(32, 256, 4, 3, 2, True),
    Tiles(16, 128, 4, 4, 4, True),
    Tiles(64, 128, 8, 3, 1, True),
)
#: Larger programs for the `early` form's down kernel: 128 rows over 8 warps, so that one wave of programs holds
#: most of a short down projection's weights in registers before its wait (DeepSeek-V3's TP-8 slice: 8 slots ×
#: 7168 rows → 448 programs, 3.4 per SM on an H200's 132, each its rows' whole 256-wide slice in one 256 step).
PREFETCH_CANDIDATES = (Tiles(128, 256, 8), Tiles(128, 128, 8))
#: Tiles the tuner tries per kernel (`decodetop.probes.worker.kernels.tiles`): rows per program 8–64 and 128–1024
#: elements per step, the ranges vLLM's fused_moe configs use at small M
#: (https://github.com/vllm-project/vllm/tree/main/vllm/model_executor/layers/fused_moe/configs), 4 or 8 warps;
#: then longer steps and split reductions, for the projections that one tile in flight per program or too few
#: programs left under copy bandwidth on an H200 (Mixtral's down projection at 67 %, DeepSeek-V3's TP-8 slice at
#: 45 %: docs/benchmarks.md, "Kernels"); then fewer rows over longer steps (more bytes in flight per program, the
#: loop being unpipelined) for Qwen3-235B's 1536-wide and Mixtral's TP-2 projections, at 85–88 % of copy in the
#: second round. (Deeper pipelines compile to the same code: Triton 3.9 pipelines no load of this loop, whose
#: products are reduced, not dotted.) Last, the `mma` ones, for gate_up only.
TILE_CANDIDATES = (
    Tiles(8, 256),
    Tiles(16, 256),
    Tiles(32, 256),
    Tiles(16, 512),
    Tiles(32, 128),
    Tiles(64, 128),
    Tiles(32, 256, 8),
    Tiles(64, 256, 8),
    Tiles(16, 1024),
    Tiles(32, 512, 8),
    Tiles(8, 512, 4, 0, 2),
    Tiles(16, 512, 4, 0, 2),
    Tiles(16, 256, 4, 0, 4),
    Tiles(32, 256, 4, 0, 4),
    Tiles(64, 256, 8, 0, 2),
    Tiles(8, 512),
    Tiles(32, 512),
    Tiles(8, 1024),
    Tiles(16, 1024, 8),
    Tiles(8, 1024, 4, 0, 2),
    *PREFETCH_CANDIDATES,
    *MMA_CANDIDATES,
)

#: Tiles the tuner tries over FP4 experts (`decodetop.probes.worker.fp4`): the reduction-form candidates, every step
#: a whole number of MXFP4's 32-value and NVFP4's 16-value scale blocks (the FP4 kernels read no `tl.dot` form),
#: then 2048 values per step: a 4-bit row moves a quarter of a bf16 row's bytes a value, so these move per step
#: what the 512-wide bf16 ones do (and hold as many decoded values per thread as the 1024-wide ones).
FP4_CANDIDATES = (
    *(t for t in TILE_CANDIDATES if not t.mma),
    Tiles(8, 2048),
    Tiles(16, 2048, 8),
    Tiles(8, 2048, 4, 0, 2),
)


#: How the kernels of one step meet (the tuner times each whole and keeps the fastest per shape): `late`, the form
#: measured on the H200 through the fourth round (each kernel's `gdc_launch_dependents` after its loop, the down
#: kernel's loads after its `gdc_wait`); `early` (each trigger right after the wait, so the next grid's programs
#: become resident while this one streams, and the down kernel's id, router weight and first weight tile loaded
#: before its wait); `fold` (the early form's two kernels, the combine folded into the down kernel by tickets: one
#: launch fewer).
FORM_LATE = "late"
FORM_EARLY = "early"
FORM_FOLD = "fold"
FORMS = (FORM_LATE, FORM_EARLY, FORM_FOLD)


STORE_NAME = "kernel_tiles.json"
#: Calls per captured graph and replays timed per candidate (median): the choice is between tiles that differ by
#: 10 % or more; a few hundred µs per candidate. Graph replay, as the probe times the op: with events around eager
#: launches a kernel of 30 µs or less is timed at the host's launch pace (seen on an H200: 30 µs for either
#: kernel of Qwen3-30B-A3B's experts, 30 µs for both together).
TUNE_OPS = 8
TUNE_SAMPLES = 3
#: A captured graph at least this long needs no more calls in it: its replay's fixed cost (~15 µs,
#: docs/reference/probes.md §3) is under 2 % of it. A candidate whose one call is longer (GLM-5's routed experts
#: at 64 tokens: ~4 ms a call, 16.8 GB of weights) is timed with one call per graph and one warm-up, so the
#: tuner's GPU time at large token counts falls from ~42 calls a candidate to ~8 (8.2 s of the GLM-5 plan's
#: key at 64 tokens × 2048 wide went to tuning: docs/benchmarks.md, "The acceptance campaign on one H200").
TUNE_GRAPH_US = 1000.0


def store_path() -> Path:
    """The tile store under the state directory."""
    return state_dir() / STORE_NAME


@dataclass(frozen=True)
class TileChoice:
    """The tiles of the two kernels for one shape, their times (µs per call, each kernel alone), whether they came
    from the store, the form the kernels meet in (`FORMS`) and the whole step's µs in it (0: not timed whole)."""

    gate_up: Tiles
    down: Tiles
    gate_up_us: float
    down_us: float
    tried: int
    cached: bool
    form: str = FORM_LATE
    step_us: float = 0.0

    @property
    def text(self) -> str:
        """'tiles gate_up 32×256/4w (41.2 µs), down 16×256/4w (20.3 µs), form early (55.0 µs a step), tuned over 8
        candidates' (or 'from the tile store')."""

        def one(t: Tiles) -> str:
            return t.text

        origin = "from the tile store" if self.cached else f"tuned over {self.tried} candidates"
        step = f" ({self.step_us:.1f} µs a step)" if self.step_us > 0 else ""
        return (
            f"tiles gate_up {one(self.gate_up)} ({self.gate_up_us:.1f} µs), down {one(self.down)} "
            f"({self.down_us:.1f} µs), form {self.form}{step}, {origin}"
        )


#: The kernels' version in the store's keys: choices made for an earlier kernel (v1: SiLU in gate_up, no splits; v2:
#: memsets before split reductions, no `tl.dot` form of gate_up; v3: no forms, tiles chosen by each kernel alone)
#: are tuned again.
KERNEL_VERSION = 4
#: Whole-step timings of the tuner (`tune`'s `launch_step`): the fastest gate_up tiles alone × the fastest down
#: tiles alone (and `PREFETCH_CANDIDATES`, which may be slow alone and fast with their loads before the wait),
#: each in every form: 2 × (3 + 2) × forms graphs, a few ms.
STEP_GATE_UP = 2
STEP_DOWN = 3


def shape_id(tokens: int, top_k: int, hidden: int, inter: int, dtype: str) -> str:
    """The store's key of one shape (with the kernels' version)."""
    return f"tokens={tokens},top_k={top_k},hidden={hidden},inter={inter},dtype={dtype},kernel=v{KERNEL_VERSION}"


def _read_store(path: Path) -> dict[str, Any]:
    """The store as an object ({} when missing, unreadable or malformed: the shape is tuned again)."""
    if not path.exists():
        return {}
    try:
        data = jsonio.load_json_object(path)
    except (UserInputError, OSError):
        return {}
    return data


#: How many numbers a stored tile may have: (rows, step, warps), + (stages, splits), + (mma).
_STORED_LENGTHS = (3, 5, 6)


def _tiles(value: object) -> Tiles | None:
    """A stored tile of three, five or six numbers (None: malformed)."""
    if not isinstance(value, list) or len(value) not in _STORED_LENGTHS:
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in value) or min(value[:3]) < 1:
        return None
    if len(value) >= 5 and (value[3] < 0 or value[4] < 1):
        return None
    if len(value) == 6 and value[5] not in (0, 1):
        return None
    rows, step, warps, *rest = value
    stages, splits = rest[:2] if rest else (0, 1)
    return Tiles(rows, step, warps, stages, splits, mma=len(value) == 6 and value[5] == 1)


def lookup(gpu: str, shape: str, path: Path | None = None) -> TileChoice | None:
    """The stored choice for `shape` on `gpu` (None: not stored, or malformed)."""
    entry = _read_store(path or store_path()).get(gpu, {})
    found = entry.get(shape) if isinstance(entry, dict) else None
    if not isinstance(found, dict):
        return None
    up, down = _tiles(found.get("gate_up")), _tiles(found.get("down"))
    up_us, down_us = _micros(found.get("gate_up_us")), _micros(found.get("down_us"))
    form = found.get("form", FORM_LATE)  # an entry without one was chosen for the late form
    step_us = _micros(found.get("step_us", 0.0))
    if up is None or down is None or up_us is None or down_us is None or step_us is None or form not in FORMS:
        return None
    tried = found.get("tried")
    tried_n = tried if isinstance(tried, int) and not isinstance(tried, bool) else 0
    return TileChoice(up, down, up_us, down_us, tried_n, True, form, step_us)


def _micros(value: object) -> float | None:
    """A stored time in µs: a finite number ≥ 0 (None for anything else, a bool, or an integer past float's
    range, as a crafted store may hold)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        out = float(value)
    except OverflowError:
        return None
    return out if math.isfinite(out) and out >= 0 else None


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def remember(gpu: str, shape: str, choice: TileChoice, path: Path | None = None) -> None:
    """Add `choice` to the store (locked re-read, merge, atomic replace); a store that exists but does not read
    as an object is left alone (nothing stored is lost)."""
    target = path or store_path()
    with _locked(target):
        if target.exists():
            try:
                data = jsonio.load_json_object(target)
            except (UserInputError, OSError):
                return
        else:
            data = {}
        per_gpu = data.get(gpu)
        if not isinstance(per_gpu, dict):
            per_gpu = {}
        per_gpu[shape] = {
            "gate_up": choice.gate_up.as_list(),
            "down": choice.down.as_list(),
            "gate_up_us": choice.gate_up_us,
            "down_us": choice.down_us,
            "tried": choice.tried,
            "form": choice.form,
            "step_us": choice.step_us,
        }
        data[gpu] = per_gpu
        write_text_atomic(target, jsonio.dumps_strict(data) + "\n")


def _time(fn: Callable[[], None]) -> float:
    """µs per call, median of TUNE_SAMPLES replays of a graph of as many calls (≤ TUNE_OPS) as make it
    TUNE_GRAPH_US long, after one replay of a one-call graph that says how long a call takes."""
    (one,) = time_graph(fn, 1, 1, warmup=1)
    ops = max(1, min(TUNE_OPS, math.ceil(TUNE_GRAPH_US / max(one, 1e-3))))
    return statistics.median(time_graph(fn, ops, TUNE_SAMPLES, warmup=2 if ops > 1 else 1))


#: Builds one whole step's launches (all kernels of one call) for (gate_up tiles, down tiles, form).
StepLauncher = Callable[[Tiles, Tiles, str], Callable[[], None]]


def _timed_each(launcher: Callable[[Tiles], Callable[[], None]], tried: Sequence[Tiles]) -> list[tuple[float, Tiles]]:
    """(µs, tiles) of each tile that ran (a tile that fails to compile or run is skipped), fastest first."""
    timed: list[tuple[float, Tiles]] = []
    for tiles in tried:
        try:
            timed.append((_time(launcher(tiles)), tiles))
        except Exception:
            torch.cuda.synchronize()
            continue
    if not timed:
        raise RuntimeError("no candidate tile of the fused-MoE kernel ran here")
    return sorted(timed, key=lambda item: item[0])


def tune(
    launch_gate_up: Callable[[Tiles], Callable[[], None]],
    launch_down: Callable[[Tiles], Callable[[], None]],
    candidates: Sequence[Tiles] = TILE_CANDIDATES,
    launch_step: StepLauncher | None = None,
    forms: Sequence[str] = FORMS,
) -> TileChoice:
    """Time every candidate tile of each kernel alone (CUDA graphs; a tile that fails to compile or run is skipped)
    and keep the fastest of each (the `mma` candidates are gate_up's only); with `launch_step`, then time whole
    steps, the fastest `STEP_GATE_UP` gate_up tiles × the fastest `STEP_DOWN` down tiles and the
    `PREFETCH_CANDIDATES`, in each of `forms` (a form changes where the kernels meet, so only a whole step times
    it), and keep the fastest step (the late form with each kernel's fastest tiles where no step ran)."""
    ups = _timed_each(launch_gate_up, candidates)
    downs = _timed_each(launch_down, [t for t in candidates if not t.mma])
    (up_us, up), (down_us, down) = ups[0], downs[0]
    if launch_step is None:
        return TileChoice(up, down, up_us, down_us, len(candidates), False)
    alone = {("gate_up", t): us for us, t in ups} | {("down", t): us for us, t in downs}
    down_tiles = [t for _, t in downs[:STEP_DOWN]]
    down_tiles += [t for t in PREFETCH_CANDIDATES if ("down", t) in alone and t not in down_tiles]
    steps: list[tuple[float, Tiles, Tiles, str]] = []
    for _, up_t in ups[:STEP_GATE_UP]:
        for down_t in down_tiles:
            for form in forms:
                try:
                    steps.append((_time(launch_step(up_t, down_t, form)), up_t, down_t, form))
                except Exception:
                    torch.cuda.synchronize()
                    continue
    if not steps:
        return TileChoice(up, down, up_us, down_us, len(candidates), False)
    step_us, up, down, form = min(steps, key=lambda item: item[0])
    return TileChoice(up, down, alone["gate_up", up], alone["down", down], len(candidates), False, form, step_us)


def choose(
    gpu: str,
    shape: str,
    launch_gate_up: Callable[[Tiles], Callable[[], None]],
    launch_down: Callable[[Tiles], Callable[[], None]],
    launch_step: StepLauncher | None = None,
    candidates: Sequence[Tiles] = TILE_CANDIDATES,
) -> TileChoice:
    """The stored choice, else a fresh `tune` over `candidates` that is then stored (a store that cannot be written
    only loses the memory of it: the choice is still used)."""
    found = lookup(gpu, shape)
    if found is not None:
        return found
    choice = tune(launch_gate_up, launch_down, candidates, launch_step=launch_step)
    with contextlib.suppress(OSError):
        remember(gpu, shape, choice)
    return choice
