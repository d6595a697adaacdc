"""The fused rope + KV-write kernel (`kernels.rope`) at rotary dims that are not powers of two, under Triton's CPU
interpreter against its torch form: Phi-3's 96 of 96, partial 48 of 96, heads of 80, partial 64 of 128, 48 dims from
offset 80 (as MLA's k_pe lies at the end of its row), an FP8 cache, the plain rotary and the plain KV write; BF16,
three tokens, several heads. Every output lies in a larger NaN buffer: the queries in one with a NaN token row past
the last, the caches NaN in every slot the write must leave alone (each written slot is followed by one, and the
cache ends in one), so a store past a row's end shows. Odd rotary dims, rotary dims past the row and cos/sin tables
of another width are refused with one line; the norms probe's rotary runs in Triton on rows of 96 and 80 and
passes odd rows over."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import pytest

from tests.conftest import require_module
from tests.helpers.interpreter import interpreted_call

torch = pytest.importorskip("torch")

from decodetop.budget.keys import NormKey  # noqa: E402 - after the torch check
from decodetop.probes.worker import norms  # noqa: E402
from decodetop.probes.worker.context import ProbeContext, UnsupportedError  # noqa: E402
from decodetop.probes.worker.kernels import rope  # noqa: E402
from decodetop.probes.worker.kernels.common import CHECK_REL_ERR  # noqa: E402

WHY = "the test extra installs Triton; its interpreter runs the kernels on the CPU"
META = torch.device("meta")
CPU = ProbeContext(rank=0, world_size=1, device=torch.device("cpu"), backend="gloo")
TOKENS = 3
#: The slots the tokens are written to, in a cache of `CACHE_SLOTS`: each is followed by an unwritten slot.
SLOTS = (2, 6, 4)
CACHE_SLOTS = 9
POSITIONS = 64


class Case(NamedTuple):
    """One launch's shapes: query heads × dims, KV heads × key dims and value dims (0: none), the rotary spec."""

    q_heads: int
    q_dim: int
    kv_heads: int
    k_dim: int
    v_dim: int
    rope: rope.RopeSpec
    fp8: bool = False


CASES = {
    "96 of 96": Case(4, 96, 2, 96, 96, rope.RopeSpec(96)),
    "48 of 96": Case(4, 96, 2, 96, 96, rope.RopeSpec(48)),
    "80 of 80": Case(5, 80, 2, 80, 80, rope.RopeSpec(80)),
    "64 of 128": Case(4, 128, 2, 128, 128, rope.RopeSpec(64)),
    "48 from 80 of 128, no values": Case(3, 128, 1, 128, 0, rope.RopeSpec(48, 80, 80)),
    "96 of 96, FP8 cache": Case(4, 96, 2, 96, 96, rope.RopeSpec(96), fp8=True),
    "plain rotary 96": Case(3, 96, 0, 0, 0, rope.RopeSpec(96)),
    "plain KV write 80": Case(0, 0, 2, 80, 80, rope.RopeSpec(80)),
}


def _rel(got: Any, want: Any) -> float:
    """‖got − want‖ / ‖want‖ in fp32 (inf where got is not finite)."""
    got, want = got.float(), want.float()
    if not got.isfinite().all():
        return float("inf")
    return float((got - want).norm() / want.norm())


def _poisoned_cache(case: Case, dim: int) -> Any:
    """A cache of `CACHE_SLOTS` × KV heads × `dim`, NaN everywhere (FP8: its NaN, 0x7F)."""
    cache = torch.full((CACHE_SLOTS, case.kv_heads, dim), float("nan"))
    return cache.to(torch.float8_e4m3fn if case.fp8 else torch.bfloat16)


def _one(case: Case) -> float:
    """The worst relative error of the case's outputs against the torch form (inf where a guard was written)."""
    half = case.rope.rot // 2
    cos, sin = torch.rand(POSITIONS, half), torch.rand(POSITIONS, half)
    pos = torch.randint(0, POSITIONS, (TOKENS,))
    slots = torch.tensor(SLOTS)
    q_buf = torch.full((TOKENS + 1, case.q_heads, case.q_dim), float("nan"), dtype=torch.bfloat16)
    q_buf[:TOKENS] = torch.randn(TOKENS, case.q_heads, case.q_dim)
    q = q_buf[:TOKENS] if case.q_heads else None
    k = torch.randn(TOKENS, case.kv_heads, case.k_dim).to(torch.bfloat16) if case.kv_heads else None
    v = torch.randn(TOKENS, case.kv_heads, case.v_dim).to(torch.bfloat16) if case.kv_heads and case.v_dim else None
    k_cache = _poisoned_cache(case, case.k_dim) if k is not None else None
    v_cache = _poisoned_cache(case, case.v_dim) if v is not None else None
    scales = torch.tensor([0.05, 0.04]) if case.fp8 else None
    refs = [t.clone() if t is not None else None for t in (q, k_cache, v_cache)]
    rope.rope_kv_write(
        q, k, v, rope=case.rope, cos=cos, sin=sin, positions=pos, slots=slots,
        k_cache=k_cache, v_cache=v_cache, scales=scales,
    )  # fmt: skip
    rope.reference_rope_kv_write(refs[0], k, v, case.rope, cos, sin, pos, slots, refs[1], refs[2], scales)
    errors = [0.0]
    if q is not None and refs[0] is not None:
        errors.append(_rel(q, refs[0]) if q_buf[TOKENS].isnan().all() else float("inf"))
    others = [s for s in range(CACHE_SLOTS) if s not in SLOTS]
    for got, want in ((k_cache, refs[1]), (v_cache, refs[2])):
        if got is not None and want is not None:
            errors.append(_rel(got[slots], want[slots]) if got[others].float().isnan().all() else float("inf"))
    return max(errors)


def padded_errors() -> dict[str, float]:
    """Every case's worst relative error, by name (run under the interpreter)."""
    torch.manual_seed(0)
    return {name: _one(case) for name, case in CASES.items()}


def rotary_runner_kinds() -> dict[str, list[str]]:
    """The norms probe's rotary runner at rows of 96 and 80 values (not whole 64-dim heads): its kernel class."""
    got = {}
    for width in (96, 80):
        runner = norms.norm_runner(NormKey("rotary", 2, width, "bf16"), CPU)
        runner.fn()
        assert runner.kernel is not None
        got[str(width)] = [runner.kernel.kind, runner.kernel.text]
    return got


def test_the_kernel_takes_rotary_dims_that_are_not_powers_of_two() -> None:
    require_module("triton", WHY)
    got = interpreted_call(Path(__file__), "padded_errors()")
    assert sorted(got) == sorted(CASES)
    bad = {name: err for name, err in got.items() if not err < CHECK_REL_ERR}
    assert not bad, bad


def test_the_norms_probe_rotates_rows_that_are_not_powers_of_two_in_triton() -> None:
    require_module("triton", WHY)
    got = interpreted_call(Path(__file__), "rotary_runner_kinds()")
    for width in ("96", "80"):
        assert got[width] == ["triton", "decodetop Triton: rotary in place (one launch)"], got


def _refused(spec: rope.RopeSpec, q_dim: int, k_dim: int, table: int) -> str:
    q = torch.empty(1, 4, q_dim, device=META, dtype=torch.bfloat16)
    k = torch.empty(1, 2, k_dim, device=META, dtype=torch.bfloat16)
    cos = torch.empty(POSITIONS, table, device=META)
    slots = torch.zeros(1, device=META, dtype=torch.int64)
    cache = torch.empty(4, 2, k_dim, device=META, dtype=torch.bfloat16)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rope, "HAVE_TRITON", True)
        with pytest.raises(ValueError) as err:
            rope.rope_kv_write(q, k, None, rope=spec, cos=cos, sin=cos, positions=slots, slots=slots, k_cache=cache)
    return str(err.value)


@pytest.mark.parametrize(
    ("spec", "q_dim", "k_dim", "table", "line"),
    [
        (rope.RopeSpec(95), 96, 96, 47, "rotary dims must be even and not negative (rotate-half pairs), got 95"),
        (rope.RopeSpec(-2), 96, 96, 1, "rotary dims must be even and not negative (rotate-half pairs), got -2"),
        (rope.RopeSpec(128), 96, 128, 64, "rotary dims [0, 128) do not fit in a query head of 96 values"),
        (rope.RopeSpec(48, 0, 64), 96, 96, 24, "rotary dims [64, 112) do not fit in a key row of 96 values"),
        (rope.RopeSpec(48, -8, 0), 96, 96, 24, "rotary dims [-8, 40) do not fit in a query head of 96 values"),
        (
            rope.RopeSpec(96),
            96,
            96,
            64,
            "cos/sin tables must be [positions, 48] for 96 rotary dims, got (64, 64) and (64, 64)",
        ),
    ],
)
def test_rotary_dims_the_kernel_does_not_take_are_refused(
    spec: rope.RopeSpec, q_dim: int, k_dim: int, table: int, line: str
) -> None:
    assert _refused(spec, q_dim, k_dim, table) == line


def test_the_norms_probe_passes_odd_rotary_rows_over_to_the_torch_form() -> None:
    with pytest.raises(UnsupportedError) as err:
        norms._triton_rotary(NormKey("rotary", 2, 99, "bf16"), CPU)
    assert str(err.value) == "rotary over rows of 99: odd, not 64-dim heads nor rotate-half pairs"
