"""The GQA kernel's launcher takes its grid and constexprs from the budget layer's `gqa_launch`: over a grid of
shapes, SM counts and every launch shape, each kernel is launched with exactly what the reference below, written
apart, gives: the split by the rule asked ("even", the launcher's code before the move, verbatim; "one wave", its
successor), the combine over every split in one step; the MLA kernel, which took the "even" rule, splits as it
did."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from decodetop.probes.worker.kernels import gqa  # noqa: E402 - after the torch check
from decodetop.probes.worker.kernels.common import interpreted  # noqa: E402
from decodetop.probes.worker.kernels.mla import LOG2E  # noqa: E402

META = torch.device("meta")


@dataclasses.dataclass(frozen=True)
class _OldConfig:
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 3
    programs_per_sm: int = 4
    f16: bool = False
    combine_block: int = 0
    fold_scale: bool = False
    unmasked: bool = False
    lazy_rescale: bool = False
    tma: bool = False
    early_trigger: bool = False


_OLD_SHORT = _OldConfig(block_n=128, num_warps=8, num_stages=3, programs_per_sm=2, f16=True)
_SHORT = _OldConfig(block_n=128, num_warps=8, num_stages=3, programs_per_sm=1, f16=True)
_OLD_LONG = _OldConfig(block_n=128, num_warps=2, num_stages=2, programs_per_sm=4, f16=True)
_LONG_BF16 = _OldConfig(block_n=128, num_warps=2, num_stages=2, programs_per_sm=3, f16=True)


def _old_plan_splits(
    length: int, programs_per_split: int, sms: int, block_n: int, programs_per_sm: int
) -> tuple[int, int]:
    tiles = -(-length // block_n)
    splits = min(tiles, max(1, -(-programs_per_sm * sms // programs_per_split)))
    chunk = -(-tiles // splits) * block_n
    return -(-length // chunk), chunk


def _one_wave_splits(
    length: int, programs_per_split: int, sms: int, block_n: int, programs_per_sm: int
) -> tuple[int, int]:
    tiles = -(-length // block_n)
    splits = max(1, min(tiles, 1024, programs_per_sm * sms // programs_per_split))
    chunk = -(-tiles // splits) * block_n
    return -(-length // chunk), chunk


def _old_next_pow2(n: int) -> int:
    return 1 << max(0, (max(1, n) - 1).bit_length())


def _old_launches(q: Any, k: Any, v: Any, sms: int, config: _OldConfig | None, rule: str) -> list[tuple[object, ...]]:
    """What the launcher passes each kernel: (kernel, grid, scalar arguments, keyword arguments)."""
    batch, heads, q_len, dim = q.shape
    _, kv_heads, length, _ = k.shape
    v_dim = v.shape[-1]
    fp8 = k.dtype == torch.float8_e4m3fn
    if fp8:
        cfg = config or (_OLD_LONG if length >= 16384 else _SHORT)
    else:
        cfg = config or (_LONG_BF16 if length >= 16384 else _SHORT)
    group_rows = heads // kv_heads * q_len
    gp = max(16, _old_next_pow2(group_rows))
    split = _old_plan_splits if rule == "even" else _one_wave_splits
    splits, chunk = split(length, batch * kv_heads, sms, cfg.block_n, cfg.programs_per_sm)
    qc = q.contiguous()
    split_scalars = (
        kv_heads, group_rows, length, chunk, splits, qc.stride(0), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        0.125 * LOG2E,
    )  # fmt: skip
    split_kw = {
        "FP8": fp8, "GP": gp, "D": dim, "DV": v_dim, "BLOCK_N": cfg.block_n, "F16": cfg.f16 and fp8,
        "F32_DOT": interpreted() and not (cfg.f16 and fp8), "num_warps": cfg.num_warps, "num_stages": cfg.num_stages,
        "USE_GDC": False,  # PDL: never on meta tensors outside `collecting` (tests/probes/test_pdl.py)
        "Q8": False,  # the FP8 × FP8 q · kᵀ: a diagnostic form, off in every launch the probe makes
        "FOLD": cfg.fold_scale, "UNMASKED": cfg.unmasked, "LAZY": cfg.lazy_rescale, "TAU": 8.0, "TMA": cfg.tma,
        "EARLY_TRIGGER": cfg.early_trigger,  # the loop forms: each its config field's, off in the defaults
        "DP": dim, "DVP": v_dim,  # the padded d axes: the dims themselves at powers of two (no mask compiled)
    }  # fmt: skip
    block_s = min(cfg.combine_block or 1024, _old_next_pow2(splits))
    lanes = max(8, min(v_dim, 8192 // block_s))
    combine_kw = {"GP": gp, "DV": v_dim, "BLOCK_S": block_s, "DV_BLOCK": lanes, "num_warps": 8, "USE_GDC": False}
    out_stride = heads * q_len * v_dim
    combine_grid = (batch * kv_heads * group_rows, -(-v_dim // lanes))
    return [
        ("split", (batch * kv_heads, splits), split_scalars, split_kw),
        ("combine", combine_grid, (kv_heads, group_rows, splits, out_stride), combine_kw),
    ]


class _Recorder:
    """Stands for a Triton kernel: records the grid and arguments of each launch."""

    def __init__(self, name: str, calls: list[tuple[object, ...]]) -> None:
        self.name, self.calls = name, calls

    def __getitem__(self, grid: tuple[int, ...]) -> Any:
        def launch(*args: object, **kwargs: object) -> None:
            scalars = tuple(a for a in args if not isinstance(a, torch.Tensor))
            self.calls.append((self.name, tuple(grid), scalars, kwargs))

        return launch


def _new_launches(
    q: Any, k: Any, v: Any, sms: int, config: gqa.GqaConfig | None, rule: str, mp: pytest.MonkeyPatch
) -> list:
    calls: list[tuple[object, ...]] = []
    mp.setattr(gqa, "HAVE_TRITON", True)
    mp.setattr(gqa, "_gqa_split_kernel", _Recorder("split", calls), raising=False)
    mp.setattr(gqa, "_gqa_combine_kernel", _Recorder("combine", calls), raising=False)
    batch, heads, q_len, _ = q.shape
    fp8 = k.dtype == torch.float8_e4m3fn
    work = gqa.gqa_workspace(
        batch, heads, k.shape[1], q_len, k.shape[2], v.shape[-1], META, sms=sms, config=config, fp8=fp8, rule=rule
    )
    scales = torch.empty(2, device=META) if k.dtype == torch.float8_e4m3fn else None
    gqa.gqa_decode(q, k, v, sm_scale=0.125, scales=scales, work=work)
    return calls


def _old_of(config: gqa.GqaConfig | None) -> _OldConfig | None:
    return None if config is None else _OldConfig(**dataclasses.asdict(config))


SHAPES = [  # (batch, heads, kv_heads, q_len)
    (1, 8, 1, 1), (1, 64, 8, 1), (2, 32, 8, 1), (3, 40, 8, 2), (8, 64, 8, 4), (64, 16, 2, 1), (512, 8, 8, 1),
]  # fmt: skip
LENGTHS = (1, 128, 129, 4097, 16383, 16384, 131073)
SMS = (1, 132, 170)
CONFIGS = [None, *dict.fromkeys([gqa.FIRST, gqa.SHORT, gqa.LONG, gqa.SHORT_BEFORE, gqa.LONG_BF16, *gqa.SWEEP])]
CONFIGS += [dataclasses.replace(gqa.LONG, block_n=256, **form) for form in gqa.LOOP_FORMS.values()]


@pytest.mark.parametrize("rule", ["even", "one wave"])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "default" if c is None else c.label)
def test_every_launch_takes_the_grid_and_constexprs_of_its_rule(config: gqa.GqaConfig | None, rule: str) -> None:
    with pytest.MonkeyPatch.context() as mp:
        for (batch, heads, kv_heads, q_len), length, sms, fp8 in itertools.product(SHAPES, LENGTHS, SMS, (False, True)):
            dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
            q = torch.empty(batch, heads, q_len, 128, device=META, dtype=torch.bfloat16)
            k = torch.empty(batch, kv_heads, length, 128, device=META, dtype=dtype)
            v = torch.empty(batch, kv_heads, length, 128, device=META, dtype=dtype)
            got = _new_launches(q, k, v, sms, config, rule, mp)
            want = _old_launches(q, k, v, sms, _old_of(config), rule)
            assert got == want, (batch, heads, kv_heads, q_len, length, sms)


def test_the_launch_constants_are_the_ones_the_kernel_ran_with() -> None:
    assert gqa.GqaConfig(**dataclasses.asdict(_OLD_SHORT)) == gqa.SHORT_BEFORE
    assert gqa.GqaConfig(**dataclasses.asdict(_OLD_LONG)) == gqa.LONG
    assert gqa.GqaConfig(**dataclasses.asdict(_SHORT)) == gqa.SHORT
    assert gqa.GqaConfig(**dataclasses.asdict(_LONG_BF16)) == gqa.LONG_BF16
    assert (gqa.LONG_FROM, gqa.BLOCK_N, gqa.PROGRAMS_PER_SM) == (16384, 64, 4)
    assert gqa.GqaConfig(**dataclasses.asdict(_OldConfig())) == gqa.FIRST
    loops = ("fold_scale", "unmasked", "lazy_rescale", "tma", "early_trigger")
    for config in (gqa.FIRST, gqa.SHORT, gqa.LONG, gqa.LONG_BF16, *gqa.SWEEP):  # no loop form by default
        assert not any(getattr(config, name) for name in loops), config


def test_a_workspace_of_another_shape_is_refused() -> None:
    q = torch.empty(2, 64, 1, 128, device=META, dtype=torch.bfloat16)
    k = torch.empty(2, 8, 4097, 128, device=META, dtype=torch.bfloat16)
    work = gqa.gqa_workspace(1, 64, 8, 1, 4097, 128, META, sms=132)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gqa, "HAVE_TRITON", True)
        with pytest.raises(ValueError, match="another shape"):
            gqa.gqa_decode(q, k, k, sm_scale=0.125, work=work)


def _old_mla_plan_splits(
    total: int, programs_per_split: int, sms: int, block_n: int, programs_per_sm: int
) -> tuple[int, int]:
    """The MLA kernel's own split rule before it took the budget layer's (verbatim)."""
    tiles = -(-total // block_n)
    want = max(1, -(-programs_per_sm * sms // programs_per_split))
    splits = min(tiles, want)
    chunk = -(-tiles // splits) * block_n
    return -(-total // chunk), chunk


def test_the_mla_kernel_splits_as_it_did() -> None:
    from decodetop.probes.worker.kernels import mla

    for rows, heads, total, sms, config in itertools.product(
        (1, 2, 32, 128), (8, 16, 128), (1, 64, 2048, 4097, 131073), (1, 132, 170), (mla.FIRST, mla.DEFAULT)
    ):
        work = mla.mla_workspace(rows, heads, total, META, sms=sms, config=config)
        blocks = -(-heads // mla.BLOCK_H)
        want = _old_mla_plan_splits(total, blocks * rows, sms, config.block_n, config.programs_per_sm)
        assert (work.splits, work.chunk) == want, (rows, heads, total, sms, config)
