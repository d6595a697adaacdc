"""Provides the rule that says which all-reduce a serving engine runs at a given TP, message size, GPU generation
and topology, and the all-reduce curve the budget composes from once that choice is made (stdlib only).

`--allreduce` takes three values:

- `nccl`: the all-reduce is NCCL's (what the `allreduce` probe measured through torch.distributed);
- `custom`: a P2P one-shot / two-shot kernel (the class of vLLM's and SGLang's custom all-reduce), timed by the
  `allreduce` probe through torch's symmetric memory (`impl` one_shot / two_shot);
- `auto`: what vLLM (default) or SGLang would run, by their own published rules, cited at each constant below.

`choose_allreduce(choice, message_bytes, topology)` returns an `AllreducePath`: the path, the kernel algorithm
(one-shot / two-shot), and a one-line reason the budget row can show. `engine_allreduce_curve` turns the probe's
per-implementation points into the one curve the composition interpolates, and says which path each size took.

Only intra-node rules are modelled: every engine turns its custom all-reduce off across nodes, so NCCL is the
answer there. Multicast (NVLink SHARP, `multimem`) stays off on shared machines: the rule counts it only when the
topology says multicast is on, and then names it, because the probe measures multimem only behind an opt-in.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

KiB = 1024
MiB = 1024 * 1024

ALLREDUCE_CHOICES = ("auto", "nccl", "custom")
ENGINES = ("vllm", "sglang")
#: Kernel algorithms of the custom path, as the probe names its `impl` values.
ALGORITHMS = ("one_shot", "two_shot", "multimem")

VLLM_CUSTOM_AR_URL = (
    "https://github.com/vllm-project/vllm/blob/main/vllm/distributed/device_communicators/custom_all_reduce.py"
)
VLLM_AR_UTILS_URL = (
    "https://github.com/vllm-project/vllm/blob/main/vllm/distributed/device_communicators/all_reduce_utils.py"
)
VLLM_SYMM_MEM_URL = "https://github.com/vllm-project/vllm/blob/main/vllm/distributed/device_communicators/symm_mem.py"
VLLM_KERNEL_URL = "https://github.com/vllm-project/vllm/blob/main/csrc/custom_all_reduce.cuh"
SGLANG_CUSTOM_AR_URL = (
    "https://github.com/sgl-project/sglang/blob/main/python/sglang/srt/distributed/device_communicators/"
    "custom_all_reduce.py"
)

#: World sizes the custom all-reduce kernels are compiled for: `CustomAllreduce._SUPPORTED_WORLD_SIZES = [2, 4, 6, 8]`
#: in both engines (VLLM_CUSTOM_AR_URL, SGLANG_CUSTOM_AR_URL).
CUSTOM_AR_WORLD_SIZES = (2, 4, 6, 8)
#: Largest message either engine sends through its custom all-reduce by default: vLLM `max_size=8192 * 1024`
#: (VLLM_CUSTOM_AR_URL), SGLang `_MAX_CAR_SIZE = 8192 * 1024` on CUDA (SGLANG_CUSTOM_AR_URL). Strictly below it.
CUSTOM_AR_MAX_BYTES = 8192 * 1024
#: Custom all-reduce needs the message to be a multiple of 16 bytes (`inp_size % 16 != 0` → NCCL, both engines).
CUSTOM_AR_ALIGN_BYTES = 16
#: vLLM caps its custom all-reduce per compute capability and world size when torch symmetric memory is enabled
#: (`CUSTOM_ALL_REDUCE_MAX_SIZES`, VLLM_AR_UTILS_URL); the symm-mem all-reduce covers the sizes above.
VLLM_CUSTOM_AR_MAX_SIZES: Mapping[str, Mapping[int, int]] = {
    "9.0": {2: 64 * MiB, 4: 32 * MiB, 6: MiB // 2, 8: MiB // 4},
    "10.0": {2: 2 * MiB, 4: 2 * MiB, 6: 1 * MiB, 8: 1 * MiB},
    "10.3": {2: 4 * MiB, 4: 4 * MiB, 6: 8 * MiB, 8: 4 * MiB},
}
#: vLLM's torch symmetric-memory all-reduce limits (`SYMM_MEM_ALL_REDUCE_MAX_SIZES`, VLLM_AR_UTILS_URL). The
#: communicator is disabled when the rendezvous has no multicast pointer (VLLM_SYMM_MEM_URL), i.e. with multicast off.
VLLM_SYMM_MEM_MAX_SIZES: Mapping[str, Mapping[int, int]] = {
    "9.0": {2: 64 * MiB, 4: 32 * MiB, 6: 64 * MiB, 8: 64 * MiB},
    "10.0": {2: 8 * MiB, 4: 32 * MiB, 6: 128 * MiB, 8: 128 * MiB},
    "10.3": {2: 4 * MiB, 4: 32 * MiB, 6: 32 * MiB, 8: 64 * MiB},
}
#: World sizes where vLLM's symm-mem all-reduce uses multimem (else two-shot): `_WORLD_SIZES_MULTIMEM`
#: (VLLM_SYMM_MEM_URL).
VLLM_SYMM_MEM_MULTIMEM_WORLD_SIZES: Mapping[str, tuple[int, ...]] = {
    "9.0": (4, 6, 8),
    "10.0": (6, 8),
    "10.3": (6, 8),
}
#: vLLM symm-mem all-reduce needs the message to be a multiple of 4 bytes (`inp_size % 4 != 0`, VLLM_SYMM_MEM_URL).
SYMM_MEM_ALIGN_BYTES = 4
#: One-shot below these sizes on fully connected (NVLink) groups, two-shot above; always one-shot at world size 2
#: (`REDUCE_CASE` in VLLM_KERNEL_URL: `(world_size_ <= 4 && bytes < 512 * 1024) || (world_size_ <= 8 && bytes <
#: 256 * 1024)`; SGLang's sgl-kernel copy of the kernel has the same switch).
ONE_SHOT_BELOW_BYTES: Mapping[int, int] = {4: 512 * KiB, 8: 256 * KiB}


@dataclass(frozen=True)
class AllreduceTopology:
    """What the rule needs to know about the tensor-parallel group (None: not known)."""

    world_size: int
    #: "9.0" for an H100/H200, "10.0" for a B200; None when no GPU was seen.
    compute_capability: str | None = None
    same_node: bool = True
    #: CUDA P2P between every pair of GPUs of the group (what the engines' P2P check tests).
    p2p_all_pairs: bool | None = None
    #: NVLink between every pair (the engines' "fully connected" test through NVML).
    nvlink_all_pairs: bool | None = None
    #: NVLink multicast (NVSwitch SHARP) is available and on. Off on shared machines.
    multicast: bool = False
    #: Why the custom all-reduce could not run on this group ('' when it ran or was not tried).
    custom_unsupported: str = ""


@dataclass(frozen=True)
class AllreducePath:
    """One all-reduce's path: `nccl` or `custom`, the custom kernel's algorithm, why, and the rule's source."""

    path: str
    algorithm: str
    reason: str
    source: str

    @property
    def label(self) -> str:
        """'NCCL', 'custom one-shot', 'custom two-shot', 'custom multimem'."""
        if self.path == "nccl":
            return "NCCL"
        return "custom " + self.algorithm.replace("_", "-")


def _nccl(reason: str, source: str) -> AllreducePath:
    return AllreducePath("nccl", "", reason, source)


def _size_text(nbytes: int) -> str:
    if nbytes >= MiB and nbytes % MiB == 0:
        return f"{nbytes // MiB} MiB"
    if nbytes >= KiB and nbytes % KiB == 0:
        return f"{nbytes // KiB} KiB"
    return f"{nbytes} B"


def custom_algorithm(world_size: int, message_bytes: int, nvlink_all_pairs: bool | None) -> str:
    """one_shot or two_shot, as vLLM's and SGLang's custom kernel pick it (ONE_SHOT_BELOW_BYTES)."""
    if world_size <= 2:
        return "one_shot"
    if nvlink_all_pairs:
        for ranks, below in sorted(ONE_SHOT_BELOW_BYTES.items()):
            if world_size <= ranks and message_bytes < below:
                return "one_shot"
    return "two_shot"


def _gate(topo: AllreduceTopology, engine: str) -> AllreducePath | None:
    """Why the engine's custom all-reduce is off on this group (None: it is on)."""
    src = VLLM_CUSTOM_AR_URL if engine == "vllm" else SGLANG_CUSTOM_AR_URL
    name = "vLLM" if engine == "vllm" else "SGLang"
    why = _group_shape_off(topo, name) or _links_off(topo, name)
    return _nccl(why, src) if why else None


def _group_shape_off(topo: AllreduceTopology, name: str) -> str:
    """Why the group's size or span turns the custom all-reduce off ('' where it does not)."""
    n = topo.world_size
    if n < 2:
        return "one GPU: no all-reduce"
    if not topo.same_node:
        return f"{name} turns its custom all-reduce off when the group spans nodes"
    if n not in CUSTOM_AR_WORLD_SIZES:
        return f"{name} custom all-reduce supports TP {', '.join(map(str, CUSTOM_AR_WORLD_SIZES))} only"
    return ""


def _links_off(topo: AllreduceTopology, name: str) -> str:
    """Why the links between the GPUs (NVLink, P2P) or a failed custom run turn it off ('' where they do not)."""
    if topo.world_size > 2 and not topo.nvlink_all_pairs:
        why = "not known to be" if topo.nvlink_all_pairs is None else "not"
        return f"{name}: custom all-reduce is off on more than two GPUs {why} all NVLink-connected"
    if topo.p2p_all_pairs is False:
        return f"{name}: custom all-reduce is off without GPU P2P between every pair"
    if topo.custom_unsupported:
        return f"custom all-reduce cannot run here ({topo.custom_unsupported})"
    return ""


def _vllm_custom_max(topo: AllreduceTopology) -> int:
    """vLLM's custom all-reduce limit: 8 MiB, capped per GPU generation while symm mem (multicast) is on."""
    limit = CUSTOM_AR_MAX_BYTES
    table = VLLM_CUSTOM_AR_MAX_SIZES.get(topo.compute_capability or "")
    if topo.multicast and table and topo.world_size in table:
        limit = min(limit, table[topo.world_size])
    return limit


def choose_allreduce(
    choice: str, message_bytes: int, topo: AllreduceTopology, *, engine: str = "vllm"
) -> AllreducePath:
    """The path one all-reduce of `message_bytes` takes under `--allreduce choice` on this group."""
    if choice not in ALLREDUCE_CHOICES:
        raise ValueError(f"--allreduce must be one of {', '.join(ALLREDUCE_CHOICES)}, got {choice!r}")
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if message_bytes <= 0:
        raise ValueError(f"all-reduce message size must be positive, got {message_bytes}")
    if choice == "nccl":
        return _nccl("--allreduce nccl", "")
    if choice == "custom":
        if topo.custom_unsupported:
            return _nccl(f"custom all-reduce cannot run here ({topo.custom_unsupported})", "")
        algo = custom_algorithm(topo.world_size, message_bytes, topo.nvlink_all_pairs)
        return AllreducePath("custom", algo, "--allreduce custom", VLLM_KERNEL_URL)
    blocked = _gate(topo, engine)
    return blocked if blocked is not None else _engine_path(message_bytes, topo, engine)


def _engine_path(message_bytes: int, topo: AllreduceTopology, engine: str) -> AllreducePath:
    """What the engine runs where its custom all-reduce is on: custom below its size limit (vLLM: then symmetric
    memory where multicast is on), NCCL above it or for a misaligned message."""
    name = "vLLM" if engine == "vllm" else "SGLang"
    src = VLLM_CUSTOM_AR_URL if engine == "vllm" else SGLANG_CUSTOM_AR_URL
    if message_bytes % CUSTOM_AR_ALIGN_BYTES:
        return _nccl(f"{name}: {message_bytes} B is not a multiple of {CUSTOM_AR_ALIGN_BYTES} B", src)
    limit = _vllm_custom_max(topo) if engine == "vllm" else CUSTOM_AR_MAX_BYTES
    if message_bytes < limit:
        algo = custom_algorithm(topo.world_size, message_bytes, topo.nvlink_all_pairs)
        link = "NVLink" if topo.nvlink_all_pairs else "P2P"
        return AllreducePath(
            "custom",
            algo,
            f"{name} at TP {topo.world_size} over {link}: custom all-reduce below {_size_text(limit)}",
            src,
        )
    symm = _vllm_symm_mem_path(message_bytes, topo) if engine == "vllm" and topo.multicast else None
    return symm if symm is not None else _nccl(f"{name}: NCCL at {_size_text(limit)} and above", src)


def _vllm_symm_mem_path(message_bytes: int, topo: AllreduceTopology) -> AllreducePath | None:
    """vLLM's torch symmetric-memory all-reduce (multimem or two-shot) where the message fits its per-GPU-generation
    limit (None where it does not)."""
    cc = topo.compute_capability or ""
    symm = VLLM_SYMM_MEM_MAX_SIZES.get(cc, {}).get(topo.world_size)
    if symm is None or message_bytes > symm or message_bytes % SYMM_MEM_ALIGN_BYTES:
        return None
    multimem = topo.world_size in VLLM_SYMM_MEM_MULTIMEM_WORLD_SIZES.get(cc, ())
    algo = "multimem" if multimem else "two_shot"
    return AllreducePath(
        "custom",
        algo,
        f"vLLM: torch symmetric-memory {algo.replace('_', '-')} up to {_size_text(symm)} on sm_{cc}",
        VLLM_AR_UTILS_URL,
    )


# --------------------------------------------------------------------------------------------- curves


@dataclass(frozen=True)
class EngineCurve:
    """The all-reduce curve under one choice: (bytes, ms) points, the path at each point, and a summary line."""

    points: tuple[tuple[float, float], ...]
    paths: tuple[tuple[int, AllreducePath], ...]
    summary: str
    notes: tuple[str, ...] = ()

    def path_at(self, message_bytes: int) -> AllreducePath | None:
        """The path of the measured size nearest `message_bytes` from below (or the smallest one)."""
        if not self.paths:
            return None
        best = self.paths[0][1]
        for size, path in self.paths:
            if size <= message_bytes:
                best = path
        return best


def _interp(points: Mapping[float, float], x: float) -> float | None:
    """Linear interpolation inside the measured range only (None outside it)."""
    if x in points:
        return points[x]
    xs = sorted(points)
    if not xs or x < xs[0] or x > xs[-1]:
        return None
    for lo, hi in itertools.pairwise(xs):
        if lo <= x <= hi:
            f = (x - lo) / (hi - lo)
            return points[lo] + f * (points[hi] - points[lo])
    return None


def engine_allreduce_curve(
    choice: str,
    topo: AllreduceTopology,
    nccl_ms: Mapping[float, float],
    custom_ms: Mapping[str, Mapping[float, float]],
    *,
    engine: str = "vllm",
) -> EngineCurve:
    """Merge the probe's NCCL points and its custom points (per algorithm) into one curve under `choice`.

    Each NCCL size takes the chosen path's time; where the path is custom but that algorithm was not measured at
    (or around) the size, the NCCL time stays and a note says so, so a missing custom point never reads as 0.
    """
    points: list[tuple[float, float]] = []
    paths: list[tuple[int, AllreducePath]] = []
    notes: list[str] = []
    custom_sizes = {s for pts in custom_ms.values() for s in pts} if choice != "nccl" else set()
    sizes = sorted(set(nccl_ms) | custom_sizes)
    for size in sizes:
        path = choose_allreduce(choice, max(1, int(size)), topo, engine=engine)
        if path.path == "custom":
            ms = _interp(custom_ms.get(path.algorithm, {}), size)
            if ms is None or not math.isfinite(ms):
                fallback = nccl_ms.get(size)
                if fallback is None:
                    continue
                notes.append(f"{path.label}|{int(size)}")
                path = _nccl(f"{path.label} not measured at {_size_text(int(size))}", path.source)
                ms = fallback
        else:
            found = nccl_ms.get(size)
            if found is None:
                continue
            ms = found
        points.append((float(size), ms))
        paths.append((int(size), path))
    return EngineCurve(tuple(points), tuple(paths), summarize(paths), _unmeasured_notes(notes))


def _unmeasured_notes(items: list[str]) -> tuple[str, ...]:
    """'label|bytes' items → one note per label: 'custom one-shot not measured at 32 MiB–256 MiB (3 sizes): …'."""
    by_label: dict[str, list[int]] = {}
    for item in items:
        label, _, size = item.partition("|")
        by_label.setdefault(label, []).append(int(size))
    out = []
    for label, sizes in by_label.items():
        lo, hi = _size_text(min(sizes)), _size_text(max(sizes))
        where = lo if lo == hi else f"{lo}–{hi} ({len(sizes)} sizes)"
        out.append(f"{label} not measured at {where}: NCCL times kept there")
    return tuple(out)


def summarize(paths: list[tuple[int, AllreducePath]] | tuple[tuple[int, AllreducePath], ...]) -> str:
    """'NCCL 8 B, custom one-shot 16 KiB–1 MiB, NCCL 16 MiB (vLLM at TP 2 over NVLink: …)': the runs of one path in
    size order, with the reason of the first custom run (the first run's where none is custom)."""
    runs: list[tuple[str, int, int, str]] = []
    for size, path in paths:
        if runs and runs[-1][0] == path.label:
            label, lo, _hi, reason = runs[-1]
            runs[-1] = (label, lo, size, reason)
        else:
            runs.append((path.label, size, size, path.reason))
    if not runs:
        return "no all-reduce points"
    if len(runs) == 1:
        return f"{runs[0][0]} ({runs[0][3]})"
    parts = [f"{label} {_size_text(lo)}" + (f"–{_size_text(hi)}" if hi != lo else "") for label, lo, hi, _r in runs]
    custom = [r for r in runs if r[0] != "NCCL"]
    return ", ".join(parts) + f" ({(custom or runs)[0][3]})"


# --------------------------------------------------------------------------------------------- topology


_TOPO_CELL = re.compile(r"^(X|NV\d+|SYS|NODE|PHB|PXB|PIX|SOC|N/A)$")


def nvlink_all_pairs(topology_text: str | None, world_size: int) -> bool | None:
    """Whether the first `world_size` GPUs of `nvidia-smi topo -m` output are NVLink-connected pairwise
    (every off-diagonal cell `NV<n>`); None when the matrix cannot be read."""
    if not topology_text or world_size < 1:
        return None
    rows: list[list[str]] = []
    for line in topology_text.splitlines():
        cells = line.split()
        if not cells or not re.fullmatch(r"GPU\d+", cells[0]):
            continue
        row = [c for c in cells[1:] if _TOPO_CELL.match(c)]
        if "X" in row:  # a matrix row (the header line also starts with GPU0)
            rows.append(row)
    if len(rows) < world_size:
        return None
    for i in range(world_size):
        if len(rows[i]) < world_size:
            return None
        for j in range(world_size):
            if i != j and not rows[i][j].startswith("NV"):
                return False
    return True


def compute_capability_text(major: int, minor: int) -> str:
    """'9.0' from (9, 0): the key of the engines' per-generation tables."""
    return f"{major}.{minor}"
