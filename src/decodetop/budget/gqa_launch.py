"""Provides the launch geometry of decodetop's GQA split-K decode kernel as a pure function of the shape and the SM
count: its launch shapes (`GqaConfig`; `SHORT` and `LONG` by context, `default_config`), the split of the context
over programs (`plan_splits`, the MLA kernel's rule too) and the grids that follow (`gqa_launch`). The kernel's
launcher (`decodetop.probes.worker.kernels.gqa`) takes its grid and constexprs from here, and the curve engine tells
the kernel's launch regimes apart with the same functions (`launch_regime`), so the two cannot disagree; a results
file records each point's launch (`launch_metrics`, read back by `facts_from_metrics`). Stdlib only."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from decodetop.budget.keys import AttentionKey

#: Tokens per tile ([64 × 128] K and V tiles: 16 KB each in BF16, 8 KB in FP8).
BLOCK_N = 64
#: Programs per SM wanted for the split.
PROGRAMS_PER_SM = 4
#: The query rows of one program are padded to a power of two of at least this (the rows `tl.dot` needs).
MIN_GROUP_ROWS = 16
#: Partials one program of the one-step combine holds (split partials × value lanes, fp32: 32 registers a thread
#: over its 8 warps), so that one step covers up to `MAX_SPLITS` splits without spilling.
COMBINE_ELEMS = 8192
#: Fewest value lanes one combine program takes (32-byte sectors of fp32).
MIN_COMBINE_LANES = 8
#: Most splits of one pair: the one-step combine's reach.
MAX_SPLITS = COMBINE_ELEMS // MIN_COMBINE_LANES
#: Split rules, as a results file records them (`launch_split_rule`): "even" (splits × pairs ≈ programs_per_sm × SMs,
#: rounded up, each program whole tiles: every point measured before this rule) and "one wave" (`one_wave_splits`).
SPLIT_RULES = ("even", "one wave")
SPLIT_RULE = "one wave"
#: The split kernel's loop forms, `GqaConfig`'s boolean fields after the combine's step, and how a label names
#: each (in this order).
LOOP_OPTIONS = {
    "fold_scale": "scale in q",
    "unmasked": "unmasked tiles",
    "lazy_rescale": "lazy rescale",
    "tma": "TMA",
    "early_trigger": "early trigger",
}
#: The lazy rescale's threshold in log2 units: the running max stays until a row's grows past it, so the
#: probabilities and sums it leaves unscaled stay below 2^8 (FlashAttention-4's conditional rescaling, threshold
#: 8.0: https://github.com/Dao-AILab/flash-attention, flash_attn/cute).
LAZY_RESCALE_LOG2 = 8.0


@dataclass(frozen=True)
class GqaConfig:
    """The split kernel's launch shape and arithmetic."""

    block_n: int = BLOCK_N
    """Tokens per K/V tile."""
    num_warps: int = 4
    num_stages: int = 3
    """Software-pipeline depth of the tile loop (3: Triton's default on Hopper)."""
    programs_per_sm: int = PROGRAMS_PER_SM
    f16: bool = False
    """FP8 caches: convert to FP16 and multiply in FP16 (BF16 caches ignore it)."""
    combine_block: int = 0
    """Split partials per step of the combine kernel (a power of two; 0: every split in one online-softmax step,
    the loads of m, l and the partial rows in flight together: the first version took 16 per step over two passes,
    four dependent round trips at 32 splits; the third round 64, nine steps at 513 splits)."""
    fold_scale: bool = False
    """The loop forms (`LOOP_OPTIONS`; all off: the loop measured so far). The score scale (sm_scale · k_scale ·
    log2 e) multiplied into q once before the loop, so the loop multiplies no score."""
    unmasked: bool = False
    """Whole tiles without a mask (unmasked loads, no select on the scores), then at most one masked tail tile at
    the context's end: every split's chunk is whole tiles, only the last split's may end inside one."""
    lazy_rescale: bool = False
    """Keep the running max unless some row's grew by more than `LAZY_RESCALE_LOG2` (log2 units); rescale the
    accumulator and sum only then (one scalar branch a tile)."""
    tma: bool = False
    """Load the K and V tiles through TMA tensor descriptors (`tl.make_tensor_descriptor`): no per-element
    address arithmetic, the context's end zero-filled by the copy."""
    early_trigger: bool = False
    """Under PDL, let the combine launch (`gdc_launch_dependents`) before the tile loop instead of after it: its
    programs wait in `gdc_wait` for the split's completion either way."""

    @property
    def label(self) -> str:
        """'64 tok/4w/3st/4 per SM, fp16'."""
        opts = ["fp16"] if self.f16 else []
        opts += [f"combine {self.combine_block} a step"] if self.combine_block else []
        opts += [text for name, text in LOOP_OPTIONS.items() if getattr(self, name)]
        base = f"{self.block_n} tok/{self.num_warps}w/{self.num_stages}st/{self.programs_per_sm} per SM"
        return ", ".join([base, *opts])

    @property
    def shape(self) -> GqaConfig:
        """The split kernel's shape alone (the combine's step left at its default)."""
        return replace(self, combine_block=0)


def config_from_label(text: str) -> GqaConfig | None:
    """The `GqaConfig` whose `label` `text` is (None for any other text): how results written before the launch
    was recorded name it in their note ('split 128 tok/8w/3st/2 per SM, fp16; …')."""
    head, *opts = (part.strip() for part in text.split(","))
    fields = head.split("/")
    if len(fields) != 4 or not fields[0].endswith(" tok") or not fields[3].endswith(" per SM"):
        return None
    try:
        block_n, warps = int(fields[0][: -len(" tok")]), int(fields[1].removesuffix("w"))
        stages, per_sm = int(fields[2].removesuffix("st")), int(fields[3][: -len(" per SM")])
    except ValueError:
        return None
    f16, combine = False, 0
    loop = {text: name for name, text in LOOP_OPTIONS.items()}
    forms: dict[str, bool] = {}
    for opt in opts:
        if opt == "fp16":
            f16 = True
        elif opt.startswith("combine ") and opt.endswith(" a step") and opt[8:-7].isdigit():
            combine = int(opt[8:-7])
        elif opt in loop:
            forms[loop[opt]] = True
        else:
            return None
    config = GqaConfig(block_n, warps, stages, per_sm, f16, combine, **forms)
    return config if config.label == text else None


#: The first version's shape (H200: 39.0 µs for an FP8 cache at 32K, docs/benchmarks.md "Kernels").
FIRST = GqaConfig()
#: The shapes the probe runs, by context (`default_config`), the fastest of the H200 sweeps of
#: `benchmarks/kernels/h200_kernels.py` (Llama-3.1-70B, FP8 cache; docs/benchmarks.md, "Kernels, third round"):
#: `SHORT` below `LONG_FROM` cached tokens, `LONG` from there (30.3 µs at 32K and 81.4 at 128K, against 30.7 and
#: 93.9 for `SHORT`): fewer warps a program issue fewer instructions per cached token (the row max and sum cross
#: fewer warps), more programs per SM hide the latency instead. `SHORT` runs one program per SM: at two (the shape
#: before, `SHORT_BEFORE`) a BF16 cache's second program waited a whole wave (its K tiles take 136 KB of an H200
#: SM's 228 KB under Triton 3.6), and over FP8 the split in twice the programs of one tile each took as long or
#: longer at 2–32 pairs (8 pairs × 4K: 9.41 µs against 8.84; docs/benchmarks.md, "Kernels, fifth round").
SHORT = GqaConfig(block_n=128, num_warps=8, num_stages=3, programs_per_sm=1, f16=True)
LONG = GqaConfig(block_n=128, num_warps=2, num_stages=2, programs_per_sm=4, f16=True)
LONG_FROM = 16384
#: `LONG` over a BF16 cache, at the three programs an H200 SM holds (72 KB of shared memory each, against 40 KB
#: over FP8): its fourth waited a wave (32 pairs × 4K: 28.8 µs against 22.9).
LONG_BF16 = GqaConfig(block_n=128, num_warps=2, num_stages=2, programs_per_sm=3, f16=True)
#: The short-context shape until the fifth kernel round, over either cache: how older results read.
SHORT_BEFORE = GqaConfig(block_n=128, num_warps=8, num_stages=3, programs_per_sm=2, f16=True)


def default_config(length: int, kv_dtype: str = "bf16") -> GqaConfig:
    """The launch shape the probe runs over `length` cached tokens of a `kv_dtype` cache."""
    if length < LONG_FROM:
        return SHORT
    return LONG if kv_dtype == "fp8" else LONG_BF16


def default_config_before(length: int, _kv_dtype: str = "bf16") -> GqaConfig:
    """The launch shape the probe ran before the fifth kernel round (one pair of shapes over either cache): how
    older results read."""
    return LONG if length >= LONG_FROM else SHORT_BEFORE


def next_pow2(n: int) -> int:
    """The smallest power of two ≥ n (≥ 1): Triton block shapes are powers of two."""
    return 1 << max(0, (max(1, n) - 1).bit_length())


def plan_splits(
    length: int, programs_per_split: int, sms: int, block_n: int = BLOCK_N, programs_per_sm: int = PROGRAMS_PER_SM
) -> tuple[int, int]:
    """(splits, tokens per split): splits × `programs_per_split` ≈ `programs_per_sm` × `sms`, whole tiles (≥ 1 tile,
    at most one split per tile)."""
    if min(length, programs_per_split, sms, block_n, programs_per_sm) < 1:
        raise ValueError(f"split needs positive sizes: {length=}, {programs_per_split=}, {sms=}, {block_n=}")
    tiles = -(-length // block_n)
    splits = min(tiles, max(1, -(-programs_per_sm * sms // programs_per_split)))
    chunk = -(-tiles // splits) * block_n
    return -(-length // chunk), chunk


def one_wave_splits(length: int, pairs: int, sms: int, block_n: int, programs_per_sm: int) -> tuple[int, int]:
    """(splits, tokens per split) of the "one wave" rule: as many splits of whole tiles as keep every SM at
    `programs_per_sm` programs or fewer (one wave: ⌊programs_per_sm · sms / pairs⌋, at most one per tile and
    `MAX_SPLITS`, at least one), so that the time grows with each program's tiles, never by a program more on the
    busiest SM. The "even" rule (`plan_splits`) rounded the splits up: wherever the pairs did not divide
    `programs_per_sm` × SMs, the busiest SM ran one program more than the rest."""
    if min(length, pairs, sms, block_n, programs_per_sm) < 1:
        raise ValueError(f"split needs positive sizes: {length=}, {pairs=}, {sms=}, {block_n=}, {programs_per_sm=}")
    tiles = -(-length // block_n)
    splits = max(1, min(tiles, MAX_SPLITS, programs_per_sm * sms // pairs))
    chunk = -(-tiles // splits) * block_n
    return -(-length // chunk), chunk


@dataclass(frozen=True)
class GqaLaunch:
    """One launch of the split and combine kernels over `pairs` (sequence, KV head) pairs of `length_tokens` cached
    tokens each: the shape, the split, and the grids and constexprs that follow."""

    config: GqaConfig
    pairs: int
    length_tokens: int
    sm_count: int
    splits: int
    tokens_per_split: int
    group_rows: int
    """Query rows of one KV head: q heads per KV head × new tokens."""
    v_dim: int = 128
    split_rule: str = SPLIT_RULE

    @property
    def group_pad_rows(self) -> int:
        """The split kernel's GP constexpr: the group's rows padded to a power of two ≥ `MIN_GROUP_ROWS`."""
        return max(MIN_GROUP_ROWS, next_pow2(self.group_rows))

    @property
    def combine_block(self) -> int:
        """The combine kernel's BLOCK_S constexpr: split partials per step (every split in one step, unless the
        shape names a step)."""
        return min(self.config.combine_block or MAX_SPLITS, next_pow2(self.splits))

    @property
    def combine_lanes(self) -> int:
        """The combine kernel's value lanes per program (its DV_BLOCK constexpr, a power of two: the V head dim
        padded to one, the last block's lanes past it masked): as many as `COMBINE_ELEMS` partials allow beside the
        step's splits."""
        return max(MIN_COMBINE_LANES, min(next_pow2(self.v_dim), COMBINE_ELEMS // self.combine_block))

    @property
    def split_grid(self) -> tuple[int, int]:
        """The split kernel's grid: (pairs, splits)."""
        return (self.pairs, self.splits)

    @property
    def combine_grid(self) -> tuple[int, int]:
        """The combine kernel's grid: every query row of every pair × its value lanes in blocks."""
        return (self.pairs * self.group_rows, -(-self.v_dim // self.combine_lanes))

    @property
    def split_programs(self) -> int:
        return self.pairs * self.splits

    @property
    def tiles_per_program(self) -> int:
        return self.tokens_per_split // self.config.block_n

    @property
    def programs_per_busiest_sm(self) -> int:
        """Split programs on the busiest SM when the grid is spread evenly: where this grows by one, every program
        of the busiest SMs waits on another (a step in time)."""
        return -(-self.split_programs // self.sm_count)

    @property
    def work_tiles(self) -> float:
        """The tiles a one-wave launch's time follows: the busiest SM's chain of them (tiles per program × its
        programs), on which every tile waits on the one before, plus the tiles each SM streams on average (the split
        programs' tiles over the SMs), which share its bandwidth. The two counts in one unit, unweighted. On the
        H200's curves the time climbs in the steps of the first (docs/benchmarks.md, "Kernels, fifth round") and
        between them with the second; interpolated in this sum, a GQA point left out of three campaigns' curves was
        predicted within 1.5–1.9 % median, against 1.8–2.2 % in roofline terms ("The attention leave-one-out in
        the launch's work")."""
        chain = self.tiles_per_program * self.programs_per_busiest_sm
        return chain + self.split_programs * self.tiles_per_program / self.sm_count

    @property
    def combine_steps(self) -> int:
        """Dependent steps of one combine program over the splits."""
        return -(-self.splits // self.combine_block)


def gqa_launch(
    batch: int,
    heads: int,
    kv_heads: int,
    q_len: int,
    length: int,
    *,
    sms: int,
    config: GqaConfig | None = None,
    v_dim: int = 128,
    kv_dtype: str = "bf16",
    rule: str = SPLIT_RULE,
) -> GqaLaunch:
    """The launch of `batch` sequences of `q_len` new tokens over `length` cached ones of a `kv_dtype` cache on
    `sms` SMs, split by `rule` for `config` (None: `default_config`)."""
    if rule not in SPLIT_RULES:
        raise ValueError(f"unknown GQA split rule {rule!r} (known: {', '.join(SPLIT_RULES)})")
    config = config or default_config(length, kv_dtype)
    pairs = batch * kv_heads
    split = plan_splits if rule == "even" else one_wave_splits
    splits, chunk = split(length, pairs, sms, config.block_n, config.programs_per_sm)
    return GqaLaunch(config, pairs, length, sms, splits, chunk, heads // kv_heads * q_len, v_dim, rule)


def attended_tokens(key: AttentionKey) -> int:
    """Cached tokens one decode of `key` attends: its context and new tokens, within its window (the attention
    probe's rule, `decodetop.probes.worker.attention`)."""
    length = key.context + key.q_len
    return min(length, key.window) if key.window else length


def key_launch(
    key: AttentionKey,
    sms: int,
    config: GqaConfig | None = None,
    *,
    rule: str = SPLIT_RULE,
) -> GqaLaunch:
    """The launch of GQA key `key` on `sms` SMs split by `rule` (`config` None: `default_config`)."""
    length = attended_tokens(key)
    return gqa_launch(
        key.batch, key.heads, key.kv_heads, key.q_len, length, sms=sms, config=config, v_dim=key.v_head_dim,
        kv_dtype=key.kv_dtype, rule=rule,
    )  # fmt: skip


@dataclass(frozen=True)
class GqaLaunchFacts:
    """What a GQA point's launch was, as its results file records it: the shape, the SM count it was split over and
    the split rule (with the key, enough to recompute the whole launch: `key_launch`)."""

    config: GqaConfig
    sm_count: int
    split_rule: str = "even"
    """The rule of every point recorded before the rule was (`SPLIT_RULES`)."""

    def launch(self, key: AttentionKey) -> GqaLaunch:
        """`key`'s launch under these facts."""
        return key_launch(key, self.sm_count, self.config, rule=self.split_rule)


LAUNCH_METRICS = ("block_n", "num_warps", "num_stages", "programs_per_sm", "f16", "combine_block", *LOOP_OPTIONS)
"""The config fields a GQA measurement records as `launch_<field>` metrics, beside `launch_sm_count`,
`launch_split_rule` (its index in `SPLIT_RULES`) and the split that came of them
(`launch_splits`, `launch_tokens_per_split`), which a reader checks against the rule. A loop form's metric
(`LOOP_OPTIONS`) that a point does not record is off: every point recorded before the forms were."""


def launch_metrics(launch: GqaLaunch) -> dict[str, float]:
    """The metrics a GQA measurement records its launch with (`LAUNCH_METRICS`)."""
    out = {f"launch_{name}": float(getattr(launch.config, name)) for name in LAUNCH_METRICS}
    out |= {
        "launch_sm_count": float(launch.sm_count),
        "launch_split_rule": float(SPLIT_RULES.index(launch.split_rule)),
        "launch_splits": float(launch.splits),
        "launch_tokens_per_split": float(launch.tokens_per_split),
    }
    return out


def facts_from_metrics(metrics: Mapping[str, float], key: AttentionKey) -> GqaLaunchFacts | None:
    """The launch facts `key`'s measurement records in its metrics (None where it records none, or where its
    recorded split rule gives another split than the one recorded: the facts then belong to another kernel's rule;
    no recorded rule is the "even" one, every point's before the rule was recorded)."""
    names = [f"launch_{n}" for n in (*LAUNCH_METRICS, "sm_count", "splits", "tokens_per_split")]
    absent_off = {f"launch_{n}": 0.0 for n in LOOP_OPTIONS}
    ints = [v for v in (_whole(metrics.get(n, absent_off.get(n))) for n in names) if v is not None]
    rule = _whole(metrics.get("launch_split_rule", 0.0))
    if rule is None or rule >= len(SPLIT_RULES) or len(ints) != len(names):
        return None
    block_n, warps, stages, per_sm, f16, combine, *forms = ints[: len(LAUNCH_METRICS)]
    sms, splits, per_split = ints[len(LAUNCH_METRICS) :]
    if min(block_n, warps, stages, per_sm, sms) < 1 or any(on > 1 for on in forms):
        return None
    loop = {name: bool(on) for name, on in zip(LOOP_OPTIONS, forms, strict=True)}
    config = GqaConfig(block_n, warps, stages, per_sm, bool(f16), combine, **loop)
    facts = GqaLaunchFacts(config, sms, SPLIT_RULES[rule])
    got = facts.launch(key)
    return facts if (got.splits, got.tokens_per_split) == (splits, per_split) else None


def _whole(value: float | None) -> int | None:
    """A recorded whole number ≥ 0 (None where none was recorded, or where it is no such number)."""
    if value is None or not math.isfinite(value) or value < 0 or value != int(value):
        return None
    return int(value)


def facts_from_note(note: str, sm_count: int) -> GqaLaunchFacts | None:
    """The launch facts of a GQA measurement written before the launch was recorded: its note opens with the launch
    shape's label ('split 128 tok/8w/3st/2 per SM, fp16; …') and its results' environment gives the SM count. Such
    a label does not tell the combine's step (16 partials by default before the third kernel round,
    docs/benchmarks.md "Kernels, third round"), only the split's shape."""
    head = note.split(";", 1)[0].strip()
    config = config_from_label(head[len("split ") :]) if head.startswith("split ") else None
    return GqaLaunchFacts(config, sm_count) if config is not None and sm_count >= 1 else None


LaunchRule = Callable[[int, str], GqaConfig]
"""The launch shape a kernel takes over a number of cached tokens of a cache of a KV dtype."""


@dataclass(frozen=True)
class CurveLaunch:
    """How one curve's points were launched: the shape by cached tokens, and the GPU and split rule they share."""

    config_of: LaunchRule
    sm_count: int
    split_rule: str

    def launch(self, key: AttentionKey) -> GqaLaunch:
        """The launch the curve's kernel takes at `key`."""
        config = self.config_of(attended_tokens(key), key.kv_dtype)
        return key_launch(key, self.sm_count, config, rule=self.split_rule)


def launch_rule(points: Iterable[tuple[AttentionKey, GqaLaunchFacts]]) -> CurveLaunch | None:
    """How one curve's points, given as (key, recorded facts), were launched: by today's `default_config` where
    every shape is the one it gives, by the rule before (`default_config_before`), by a fixed shape where every
    point has it (results of an earlier kernel version); None where the points have no facts, disagree on the GPU
    or split rule, or mix shapes by another rule."""
    found = list(points)
    if not found or len({(f.sm_count, f.split_rule) for _k, f in found}) != 1:
        return None
    gpu = (found[0][1].sm_count, found[0][1].split_rule)
    for rule in (default_config, default_config_before):
        if all(f.config.shape == rule(attended_tokens(k), k.kv_dtype).shape for k, f in found):
            return CurveLaunch(rule, *gpu)
    shapes = {f.config.shape for _k, f in found}
    if len(shapes) == 1:
        fixed = shapes.pop()
        return CurveLaunch(lambda _n, _dtype: fixed, *gpu)
    return None


@dataclass(frozen=True)
class LaunchRegime:
    """Where a GQA kernel's time runs on one line: one split shape and as many programs on the busiest SM. On the
    H200's recorded curves the time steps where either changes (docs/benchmarks.md, "Leave-one-out across the GQA
    kernel's launch regimes"), so a figure interpolated between points of two regimes spans a step."""

    shape: GqaConfig
    programs_per_busiest_sm: int


def launch_regime(launch: GqaLaunch) -> LaunchRegime:
    """The regime `launch` runs in."""
    return LaunchRegime(launch.config.shape, launch.programs_per_busiest_sm)
