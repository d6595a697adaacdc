"""decodetop's fused kernels and the best-kernel choice: every Triton kernel against its torch form under Triton's
CPU interpreter (a subprocess with TRITON_INTERPRET=1; in CI a missing Triton fails rather than skips), the choice
engine kernel → decodetop Triton → torch (CPU ranks: the torch form, labelled CPU; a fake importable engine module:
its kernel, labelled with its package, version and function), and the kernel class carried from the probe's points
through the read hooks into the budget's segments."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from decodetop.budget.compose import compose_budget
from decodetop.budget.deployment import Deployment
from decodetop.budget.gqa_launch import default_config, facts_from_metrics
from decodetop.budget.inventory import build_inventory
from decodetop.budget.kernels import KernelClass, kernels_short
from decodetop.budget.keys import AttentionKey, KvcastKey, NormKey
from decodetop.budget.measured import KernelTime, MeasuredTime
from decodetop.budget.spec import load_preset
from decodetop.probes.controller import ProbeController
from decodetop.probes.hooks import MeasuredSetBuilder, read_keyed_points
from decodetop.probes.results import MeasurementStatus, ProbeStatus, results_from_json, results_to_json
from decodetop.probes.worker import attention, kvcast, norms
from decodetop.probes.worker.context import ProbeContext
from decodetop.probes.worker.kernels import dsa, engines
from decodetop.probes.worker.kernels import norms as fused_norms
from tests.conftest import require_module
from tests.helpers.env import subprocess_env

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
CHECKS = Path(__file__).with_name("kernel_checks.py")
WHY = "the test extra installs Triton; its interpreter runs the kernels on the CPU"


def _env(tmp_path: Path, *, interpret: bool, extra_path: Path | None = None) -> dict[str, str]:
    paths = [str(p) for p in (extra_path, SRC, ROOT) if p is not None]
    env = {
        **subprocess_env(),
        "PYTHONPATH": os.pathsep.join([*paths, *sys.path]),
        "HOME": str(tmp_path),
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "DECODETOP_STATE_DIR": str(tmp_path / "state"),
    }
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    else:
        env.pop("TRITON_INTERPRET", None)
    return env


def _python(code_or_file: str | Path, args: list[str], env: dict[str, str]) -> str:
    cmd = [sys.executable, str(code_or_file), *args] if isinstance(code_or_file, Path) else [sys.executable, "-c"]
    if not isinstance(code_or_file, Path):
        cmd.append(code_or_file)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-4000:])
    return done.stdout


@pytest.mark.parametrize("check", ["mla", "dsa", "mla_select", "gqa", "norms", "rope", "moe"])
def test_triton_kernel_matches_its_torch_form_under_the_interpreter(check: str, tmp_path: Path) -> None:
    require_module("triton", WHY)
    out = _python(CHECKS, [check], _env(tmp_path, interpret=True))
    assert out.strip().endswith(f"ok {check}")


RUNNERS = textwrap.dedent(
    """
    import json, torch
    from decodetop.budget.keys import AttentionKey, KvcastKey, MoeKey, NormKey
    from decodetop.probes.worker import attention, kvcast, norms
    from decodetop.probes.worker.fused_moe import fused_moe_runner
    from decodetop.probes.worker.context import ProbeContext
    ctx = ProbeContext(rank=0, world_size=1, device=torch.device("cpu"), backend="gloo")
    got = {}
    for name, key in [
        ("gqa_fp8", AttentionKey("gqa", 1, 1, 200, 8, 2, 64, 64, 0, 64, 0, 0, 0, 0, "fp8")),
        ("mla", AttentionKey("mla", 1, 1, 200, 8, 1, 80, 64, 64, 16, 0, 0, 0, 0, "bf16")),
        ("dsa", AttentionKey("mla+dsa", 1, 1, 600, 8, 1, 80, 64, 64, 16, 16, 32, 256, 0, "fp8")),
    ]:
        r = attention.attention_runner(key, ctx, rotate=False)
        r.fn()
        got[name] = [r.kernel.kind, r.kernel.text, r.kv_bytes, dict(r.facts)]
    for op in ("rmsnorm", "add_rmsnorm", "rotary", "silu_mul"):
        r = norms.norm_runner(NormKey(op, 2, 256, "bf16"), ctx)
        r.fn()
        got[op] = [r.kernel.kind, r.kernel.text, r.moved_bytes]
    r = kvcast.kvcast_write_runner(KvcastKey("dsa_index", 1, 128, 64, "fp8"), ctx)
    r.fn()
    got["kv_write"] = [r.kernel.kind, r.kernel.text]
    r = fused_moe_runner(MoeKey(1, 2, 8, 2, 128, 64, "bf16", 0), ctx, rotate=False)
    got["moe"] = [r.kernel.kind, r.kernel.text]
    print(json.dumps(got))
    """
)


def test_probe_runners_pick_the_triton_kernels_where_triton_runs(tmp_path: Path) -> None:
    require_module("triton", WHY)
    got = json.loads(_python(RUNNERS, [], _env(tmp_path, interpret=True)).strip().splitlines()[-1])
    for name in ("gqa_fp8", "mla", "dsa", "rmsnorm", "add_rmsnorm", "rotary", "silu_mul", "kv_write", "moe"):
        assert got[name][0] == "triton", (name, got[name])
        assert got[name][1].startswith("decodetop Triton: ")
    assert "FP8 cache read as FP8" in got["gqa_fp8"][1]
    assert got["gqa_fp8"][2] == 2 * 2 * 201 * 64 * 1  # K and V at one byte a value: half the BF16 bytes
    key = AttentionKey("gqa", 1, 1, 200, 8, 2, 64, 64, 0, 64, 0, 0, 0, 0, "fp8")
    facts = facts_from_metrics(got["gqa_fp8"][3], key)  # the launch the reader gets back from the point's metrics
    assert facts is not None and facts.sm_count == 1 and facts.config == default_config(201, "fp8")
    assert not got["mla"][3] and not got["dsa"][3]
    assert "radix top-k" in got["dsa"][1] and "read once" in got["mla"][1]
    assert got["silu_mul"][1] == "decodetop Triton: SiLU-and-mul (one launch)"
    assert got["silu_mul"][2] == 2 * (2 * 256 + 256) * 2  # 2 tokens: the gate_up row read once, the output written


CARRY = textwrap.dedent(
    """
    import json, torch
    from decodetop.budget.keys import AttentionKey
    from decodetop.probes.worker import attention
    from decodetop.probes.worker.context import ProbeContext
    from decodetop.probes.worker.kernels import dsa
    torch.manual_seed(5)
    rows, heads, dim, length, topk = 2, 16, 64, 3000, 700
    works = {s: dsa.dsa_workspace(rows, length, topk, torch.device("cpu"), scheme=s, select_block=256)
             for s in ("radix8", "radix8-carry")}
    got = {"steps": [], "left": {}}
    for step in range(2):
        q = torch.randn(rows, heads, dim).to(torch.bfloat16)
        w = torch.rand(rows, heads)
        keys = (torch.randn(rows, length, dim) * 2).to(torch.float8_e4m3fn)
        ks = torch.rand(rows, length) + 0.5
        same = {}
        for scheme, work in works.items():
            work.indices.fill_(-7)
            idx = dsa.dsa_topk(q, w, keys, ks, topk, work=work).sort(dim=-1).values
            want = work.scores.topk(topk, dim=-1).indices.int().sort(dim=-1).values
            same[scheme] = torch.equal(idx, want)
            got["left"][scheme] = int(work.work.count_nonzero())
        got["steps"].append(same)
    key = AttentionKey("mla+dsa", 1, 1, 600, 8, 1, 80, 64, 64, 16, 16, 32, 256, 0, "bf16")
    ctx = ProbeContext(rank=0, world_size=1, device=torch.device("cpu"), backend="gloo")
    variant = attention.AttentionVariant(dsa_scheme="radix8-carry")
    r = attention.triton_attention_runner(key, ctx, 601, rotate=False, variant=variant)  # checked as it is built
    r.fn()
    r.fn()
    got["runner"] = r.kernel.text
    print(json.dumps(got))
    """
)


def test_the_carry_top_k_selects_the_top_k_twice_on_one_workspace_and_leaves_it_zero(tmp_path: Path) -> None:
    """`radix8-carry` has no memset (`dsa.dsa_prepare`): each step must leave its workspace zero for the next, and
    pick torch.topk's set of the scores each time (random scores: no ties); radix8's passes leave theirs unzeroed."""
    require_module("triton", WHY)
    got = json.loads(_python(CARRY, [], _env(tmp_path, interpret=True)).strip().splitlines()[-1])
    assert got["steps"] == [{"radix8": True, "radix8-carry": True}] * 2
    assert got["left"]["radix8-carry"] == 0 and got["left"]["radix8"] > 0
    assert "radix top-k" in got["runner"]


HALF = textwrap.dedent(
    """
    import json, sys, torch
    from decodetop.probes.worker.kernels import dsa, dsa_keys, dsa_ticket
    torch.manual_seed(11)
    scheme = SCHEME
    sixteen = scheme == "half16-ticket"
    got = {"cases": [], "paths": [], "hist": []}

    def path(scores, topk):
        if sixteen:
            n = int(dsa_ticket.half16_candidates(scores, topk).max())
            cap = dsa_ticket.HALF16_CANDIDATES
            if n <= min(dsa_ticket.HALF16_RANK, cap):
                return "rank"
            return "registers" if n <= min(dsa_ticket.HALF16_FINISH_BLOCK, cap) else ("buffer" if n <= cap else "row")
        n = int(dsa_ticket.half_candidates(scores, topk).max())
        return "registers" if n <= min(dsa_ticket.HALF_FINISH_BLOCK, dsa_ticket.HALF_CANDIDATES) else (
            "buffer" if n <= dsa_ticket.HALF_CANDIDATES else "row")

    def histograms(work):
        # the scoring kernel's, in torch
        work.work[:, : dsa_keys.DIGIT_BINS] = dsa_ticket.half_histogram(work.scores)
        if sixteen:
            at = dsa_ticket.HALF16_AT
            work.work[:, at : at + dsa_ticket.HALF16_BINS] = dsa_ticket.half16_histogram(work.scores)

    def select(name, scores, topk):
        rows, length = scores.shape
        work = dsa.dsa_workspace(rows, length, topk, torch.device("cpu"), sms=4, scheme=scheme)
        for step in range(2):  # the second on the workspace the first left
            work.scores.copy_(scores if step == 0 else scores[:, torch.randperm(length)])
            histograms(work)
            work.indices.fill_(-7)
            idx = dsa.dsa_select(work, topk).long()
            chosen = torch.gather(work.scores, 1, idx).sort(dim=-1).values
            best = work.scores.topk(topk, dim=-1).values.sort(dim=-1).values
            distinct = all(row.unique().numel() == topk for row in idx) and int(idx.min()) >= 0
            right = bool(distinct and torch.equal(chosen, best))
            got["cases"].append([name, step, right, int(work.work.count_nonzero())])
        got["paths"].append([name, path(scores, topk)])

    def cases():
        inf = float("inf")
        spikes = torch.randn(1, 4000)
        spikes[0, :100], spikes[0, 100:200] = inf, -inf
        select("just above k", torch.randn(1, 2049), 2048)
        select("4K, two rows", torch.randn(2, 4096), 2048)
        select("32K", torch.randn(1, 32768).abs() * 3, 2048)
        select("negative", -torch.rand(2, 3000) - 1, 700)
        select("mixed", torch.randn(1, 5000) - 0.5, 2048)
        select("many ties", torch.randint(-3, 4, (2, 4000)).float(), 1000)
        select("all equal", torch.zeros(1, 3000), 700)
        select("all equal, 400", torch.zeros(1, 400), 100)
        select("all equal, 6000", torch.full((1, 6000), 2.5), 2048)
        select("all equal, long", torch.zeros(1, 9000), 2048)
        select("beyond fp16", torch.randn(2, 5000) * 1e6, 2048)
        select("inf", spikes, 150)
        select("inf, taken", spikes, 60)
        select("subnormal", torch.randn(1, 4096) * 1e-6, 2048)
        # ~128 scores a 16-bit key, distinct in fp32 (noise far below FP16's half step at 1: 2^-11); ~64 a value
        select("tied at t16", 1 + torch.randint(0, 32, (1, 4096)) * 0.25 + torch.randn(1, 4096) * 1e-5, 2000)
        select("tied in fp32", torch.randint(0, 64, (1, 4096)).float(), 2000)

    cases()
    # small: every path of the finishing program
    if sixteen:
        dsa_ticket.HALF16_CANDIDATES, dsa_ticket.HALF16_RANK, dsa_ticket.HALF16_FINISH_BLOCK = 512, 64, 128
    else:
        dsa_ticket.HALF_CANDIDATES, dsa_ticket.HALF_FINISH_BLOCK = 512, 256
    cases()
    if sixteen:
        dsa_ticket.HALF16_CANDIDATES, dsa_ticket.HALF16_RANK, dsa_ticket.HALF16_FINISH_BLOCK = 4096, 256, 1024
    else:
        dsa_ticket.HALF_CANDIDATES, dsa_ticket.HALF_FINISH_BLOCK = 8192, 4096
    # the scoring kernel's histograms, exactly the torch forms'; the whole step through dsa_topk
    for rows, q_len, length, topk in ((1, 2, 4096, 2048), (1, 1, 20000, 2048)):
        work = dsa.dsa_workspace(rows * q_len, length, topk, torch.device("cpu"), scheme=scheme)
        for step in range(2):
            q = torch.randn(rows * q_len, 16, 64).to(torch.bfloat16)
            w = torch.rand(rows * q_len, 16) - 0.2
            keys = (torch.randn(rows, length, 64) * 2).to(torch.float8_e4m3fn)
            ks = torch.rand(rows, length) + 0.5
            dsa.dsa_scores(q, w, keys, ks, work, q_len=q_len)
            same_hist = torch.equal(work.work[:, : dsa_keys.DIGIT_BINS], dsa_ticket.half_histogram(work.scores))
            if sixteen:
                hist16 = work.work[:, dsa_ticket.HALF16_AT : dsa_ticket.HALF16_AT + dsa_ticket.HALF16_BINS]
                same_hist = same_hist and torch.equal(hist16, dsa_ticket.half16_histogram(work.scores))
            work.indices.fill_(-7)
            idx = dsa.dsa_select(work, topk).long()
            chosen = torch.gather(work.scores, 1, idx).sort(dim=-1).values
            best = work.scores.topk(topk, dim=-1).values.sort(dim=-1).values
            got["hist"].append([length, step, same_hist, torch.equal(chosen, best), int(work.work.count_nonzero())])
    print(json.dumps(got))
    """
)


def test_the_half_ticket_top_k_selects_exactly_in_one_launch_on_every_path(tmp_path: Path) -> None:
    """`half8-ticket` (`dsa_ticket._half8_select_kernel`): torch.topk's set (as sorted values: ties may pick any) over
    lengths just above k to 32K, negative, mixed, tied, all-equal, beyond FP16's range and infinite scores, two
    steps on one workspace left zero after each; with small capacities every path of the finishing program runs
    (candidates in registers, looped over the buffer, the overflow fallback over the score row); the scoring
    kernel's FP16-digit histogram equals the torch form's (`dsa_ticket.half_histogram`)."""
    require_module("triton", WHY)
    got = json.loads(
        _python(HALF.replace("SCHEME", repr("half8-ticket")), [], _env(tmp_path, interpret=True))
        .strip()
        .splitlines()[-1]
    )
    bad = [case for case in got["cases"] if not case[2] or case[3]]
    assert not bad and len(got["cases"]) == 64, bad
    default, small = dict(got["paths"][:16]), dict(got["paths"][16:])
    assert default["all equal, 6000"] == "buffer" and default["all equal, long"] == "row", default
    assert small["all equal, 400"] == "buffer" and small["all equal"] == "row", small
    assert {*default.values(), *small.values()} == {"registers", "buffer", "row"}
    assert got["hist"] and all(h[2] and h[3] and not h[4] for h in got["hist"]), got["hist"]


def test_the_half16_ticket_top_k_ranks_its_candidates_and_leaves_every_bin_zero(tmp_path: Path) -> None:
    """`half16-ticket` (`dsa_ticket._half16_select_kernel`), on half8-ticket's cases: torch.topk's set, two steps on one
    workspace left all zero after each (the 16-bit histogram's 65536 bins included: each program zeroes its share,
    the last one the threshold's top byte's); random scores rank their few candidates (`dsa_ticket._half_rank`), many
    equal ones fall back to the radix loops over the buffer or the score row; the scoring kernel's 16-bit
    histogram by per-element atomics equals the torch form's (`dsa_ticket.half16_histogram`)."""
    require_module("triton", WHY)
    got = json.loads(
        _python(HALF.replace("SCHEME", repr("half16-ticket")), [], _env(tmp_path, interpret=True))
        .strip()
        .splitlines()[-1]
    )
    bad = [case for case in got["cases"] if not case[2] or case[3]]
    assert not bad and len(got["cases"]) == 64, bad
    default, small = dict(got["paths"][:16]), dict(got["paths"][16:])
    for name in ("just above k", "4K, two rows", "32K", "negative", "mixed", "subnormal"):
        assert default[name] == "rank", (name, default)
    assert default["tied at t16"] == default["tied in fp32"] == "rank" and small["tied at t16"] != "rank", small
    assert default["all equal, 6000"] == "row" and default["all equal, 400"] == "registers", default
    assert small["many ties"] == "row" and small["all equal, 400"] == "buffer", small
    assert {*default.values(), *small.values()} == {"rank", "registers", "buffer", "row"}, (default, small)
    assert got["hist"] and all(h[2] and h[3] and not h[4] for h in got["hist"]), got["hist"]


def test_silu_mul_column_blocks_fill_the_gpu_and_stay_in_their_range() -> None:
    """One decode token's row splits into the narrowest blocks (a 1-token row is otherwise a handful of programs);
    a batch keeps the widest; a narrow row never takes a block wider than itself, nor one below the narrowest."""
    sms = 132  # an H200's
    assert fused_norms.silu_mul_block(1, 14336, sms) == fused_norms.SILU_MIN_BLOCK
    assert fused_norms.silu_mul_block(1, 53248, sms) == fused_norms.SILU_MIN_BLOCK
    assert fused_norms.silu_mul_block(256, 14336, sms) == fused_norms.SILU_MAX_BLOCK
    # 8 tokens: 8 × 14336 / 512 = 224 programs < 4 per SM, 8 × 14336 / 256 = 448 still fewer: the narrowest
    assert fused_norms.silu_mul_block(8, 14336, sms) == fused_norms.SILU_MIN_BLOCK
    # 64 tokens: 64 × 14336 / 1024 = 896 programs ≥ 528, 2048 would give 448
    assert fused_norms.silu_mul_block(64, 14336, sms) == 1024
    assert fused_norms.silu_mul_block(4096, 300, sms) == 512  # no wider than the row's power of two
    assert fused_norms.silu_mul_block(1, 3, 1) == fused_norms.SILU_MIN_BLOCK
    for tokens, width in ((1, 300), (7, 14336), (1, 53248)):  # the grid covers every column
        block = fused_norms.silu_mul_block(tokens, width, sms)
        assert block & (block - 1) == 0 and -(-width // block) * block >= width


def test_silu_and_mul_refuses_shapes_it_would_misread() -> None:
    require_module("triton", WHY)
    x = torch.zeros(2, 8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"\[tokens, 2 × width\]"):
        fused_norms.silu_and_mul(torch.zeros(2, 7, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="writes \\[2, 4\\]"):
        fused_norms.silu_and_mul(x, out=torch.zeros(2, 8, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="writes"):
        fused_norms.silu_and_mul(x, out=torch.zeros(2, 4, dtype=torch.float16))
    with pytest.raises(ValueError, match="contiguous"):
        fused_norms.silu_and_mul(torch.zeros(8, 2, dtype=torch.bfloat16).t())
    with pytest.raises(ValueError, match="power of two"):
        fused_norms.silu_and_mul(x, block=384)


def test_dsa_prepare_zeroes_the_workspace_except_where_the_scheme_leaves_it_zero() -> None:
    for scheme in dsa.SCHEMES:
        work = dsa.dsa_workspace(1, 4096, 2048, torch.device("cpu"), sms=4, scheme=scheme)
        assert work.work.shape == (1, dsa.SCHEME_INTS[scheme]) and not work.work.any()
        work.work.fill_(3)
        dsa.dsa_prepare(work)
        assert bool(work.work.any()) == (scheme in dsa.SELF_ZEROING), scheme
    assert dsa.SCHEMES[0] == "radix8-carry"  # faster than radix8 on an H200 at 4K–128K
    assert dsa.SCHEMES[1:3] == ("half16-ticket", "half8-ticket")  # the one-launch selections


def variant_label_fused() -> str:
    return attention.AttentionVariant().label("mla+dsa", "radix8-fused")


def test_the_dsa_scheme_goes_by_context_unless_one_is_named() -> None:
    """half16-ticket's one select launch below `LONG_SCHEME_FROM` tokens, radix8-fused from there (the H200's
    figures, docs/benchmarks.md "Kernels, ninth round"); a named scheme is kept, and the probe's note says which
    ran; where one list of positions is wanted (`dsa_topk`) radix8-carry stands in for radix8-fused."""
    cpu = torch.device("cpu")
    short = dsa.dsa_workspace(1, dsa.LONG_SCHEME_FROM - 1, 2048, cpu, sms=4)
    long = dsa.dsa_workspace(1, dsa.LONG_SCHEME_FROM, 2048, cpu, sms=4)
    named = dsa.dsa_workspace(1, 4097, 2048, cpu, sms=4, scheme="radix8")
    assert (short.scheme, long.scheme, named.scheme) == ("half16-ticket", "radix8-fused", "radix8")
    assert variant_label_fused().startswith("top-k radix8-fused, selecting split, 1 chunks per SM")
    with pytest.raises(ValueError, match="selects inside the sparse MLA"):
        dsa.dsa_select(long, 2048)
    assert short.work.shape[1] == dsa.SCHEME_INTS["half16-ticket"] and long.work.shape[1] == dsa.CARRY8_INTS
    variant = attention.AttentionVariant()
    assert variant.label("mla+dsa", "half16-ticket").startswith("top-k half16-ticket, ")
    assert variant.label("mla+dsa").startswith("top-k by context, ")
    assert attention.AttentionVariant(dsa_scheme="radix8").label("mla+dsa", "half16-ticket").startswith("top-k radix8,")
    with pytest.raises(ValueError, match="not one of"):
        dsa.dsa_workspace(1, 4097, 2048, cpu, sms=4, scheme="radix9")


@pytest.fixture
def cpu_ctx() -> Iterator[ProbeContext]:
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("this test is about CPU ranks without Triton's interpreter")
    engines.forget()
    yield ProbeContext(rank=0, world_size=1, device=torch.device("cpu"), backend="gloo")
    engines.forget()


def test_cpu_ranks_time_the_torch_form_labelled_cpu(cpu_ctx: ProbeContext) -> None:
    gqa = AttentionKey("gqa", 1, 1, 64, 4, 2, 32, 32, 0, 32, 0, 0, 0, 0, "fp8")
    for runner in (
        attention.attention_runner(gqa, cpu_ctx, rotate=False),
        norms.norm_runner(NormKey("add_rmsnorm", 1, 64, "bf16"), cpu_ctx),
        norms.norm_runner(NormKey("silu_mul", 3, 64, "bf16"), cpu_ctx),
        kvcast.kvcast_write_runner(KvcastKey("gqa", 1, 64, 16, "bf16"), cpu_ctx),
    ):
        assert runner.kernel is not None and runner.kernel.kind == "cpu"
        assert runner.kernel.text.startswith("CPU: torch ops: ")
        runner.fn()
    assert "FP8 cache cast to bf16" in attention.attention_runner(gqa, cpu_ctx, rotate=False).kernel.text  # type: ignore[union-attr]


FAKE_NORM = textwrap.dedent(
    '''
    """A stand-in for FlashInfer's norm module: the same functions and argument order, in plain torch."""
    import torch


    def rmsnorm(input, weight, eps=1e-6):
        return torch.nn.functional.rms_norm(input, (input.shape[-1],), weight, eps)


    def fused_add_rmsnorm(input, residual, weight, eps=1e-6):
        residual.add_(input)
        input.copy_(torch.nn.functional.rms_norm(residual, (input.shape[-1],), weight, eps))
    '''
)

SILU_AND_MUL = textwrap.dedent(
    """
    import torch


    def _silu_and_mul(input):
        d = input.shape[-1] // 2
        return torch.nn.functional.silu(input[..., :d]) * input[..., d:]
    """
)

#: Fake engine packages, file → text: each the real one's function names and argument order, in plain torch.
FAKE_ENGINES: dict[str, dict[str, str]] = {
    "flashinfer": {
        "__init__.py": '__version__ = "0.0.1+fake"\n',
        "norm.py": FAKE_NORM,
        "activation.py": SILU_AND_MUL
        + textwrap.dedent(
            """

            def silu_and_mul(input, out=None, enable_pdl=None):
                out = torch.empty_like(input[..., : input.shape[-1] // 2]) if out is None else out
                return out.copy_(_silu_and_mul(input))
            """
        ),
    },
    "sgl_kernel": {
        "__init__.py": '__version__ = "0.0.2+fake"\n'
        + SILU_AND_MUL
        + textwrap.dedent(
            """

            def silu_and_mul(input, out=None):
                out = torch.empty_like(input[..., : input.shape[-1] // 2]) if out is None else out
                return out.copy_(_silu_and_mul(input))
            """
        ),
    },
    "vllm": {  # importing vllm._C registers the custom op torch.ops._C.silu_and_mul(out, input)
        "__init__.py": '__version__ = "0.0.3+fake"\n',
        "_C.py": SILU_AND_MUL
        + textwrap.dedent(
            """
            _LIB = torch.library.Library("_C", "FRAGMENT")
            _LIB.define("silu_and_mul(Tensor(a!) out, Tensor input) -> ()")


            def silu_and_mul(out, input):
                out.copy_(_silu_and_mul(input))


            _LIB.impl("silu_and_mul", silu_and_mul, "CompositeExplicitAutograd")
            """
        ),
    },
}


def _fake_engine(root: Path, package: str) -> Path:
    """A folder holding the fake `package` alone (the first importable candidate of each op it has)."""
    pkg = root / f"fake_{package}" / package
    pkg.mkdir(parents=True)
    for name, text in FAKE_ENGINES[package].items():
        (pkg / name).write_text(text)
    return pkg.parent


@pytest.fixture
def fake_engine(tmp_path: Path) -> Path:
    """A fake `flashinfer` package (version 0.0.1+fake) with `flashinfer.norm` and `flashinfer.activation`."""
    return _fake_engine(tmp_path, "flashinfer")


PICK = textwrap.dedent(
    """
    import json, torch
    from decodetop.budget.keys import NormKey
    from decodetop.probes.worker import norms
    from decodetop.probes.worker.context import ProbeContext
    ctx = ProbeContext(rank=0, world_size=1, device=torch.device("cpu"), backend="gloo")
    r = norms.norm_runner(NormKey(KEY_OP, 2, 256, "bf16"), ctx)
    r.fn()
    print(json.dumps(r.kernel.to_dict()))
    """
)


def _pick(op: str, env: dict[str, str]) -> KernelClass:
    """The kernel class of the norms runner of `op` in a fresh rank process with `env`."""
    return KernelClass.from_dict(
        json.loads(_python(PICK.replace("KEY_OP", repr(op)), [], env).strip().splitlines()[-1])
    )


@pytest.mark.parametrize(
    ("package", "op", "label"),
    [
        ("flashinfer", "add_rmsnorm", "flashinfer 0.0.1+fake flashinfer.norm.fused_add_rmsnorm"),
        ("flashinfer", "silu_mul", "flashinfer 0.0.1+fake flashinfer.activation.silu_and_mul"),
        ("sgl_kernel", "silu_mul", "sgl_kernel 0.0.2+fake sgl_kernel.silu_and_mul"),
        ("vllm", "silu_mul", "vllm 0.0.3+fake torch.ops._C.silu_and_mul"),
    ],
)
def test_an_importable_engine_kernel_is_picked_and_labelled(package: str, op: str, label: str, tmp_path: Path) -> None:
    """Each engine's kernel is called as its package publishes it: the runner checks its output (NaN-poisoned where
    it is written out of place) against the torch form before the class is returned."""
    fake = _fake_engine(tmp_path, package)
    assert _pick(op, _env(tmp_path, interpret=False, extra_path=fake)).text == f"engine kernel: {label}"
    assert _pick(op, _env(tmp_path, interpret=False)).kind == "cpu"  # no engine, no Triton on a CPU rank
    off = _env(tmp_path, interpret=False, extra_path=fake)
    off["DECODETOP_ENGINE_KERNELS"] = "0"
    assert _pick(op, off).kind == "cpu"


@pytest.mark.parametrize("op", ["add_rmsnorm", "silu_mul"])
def test_without_an_engine_the_triton_kernel_is_picked(op: str, fake_engine: Path, tmp_path: Path) -> None:
    require_module("triton", WHY)
    assert _pick(op, _env(tmp_path, interpret=True)).kind == "triton"
    assert _pick(op, _env(tmp_path, interpret=True, extra_path=fake_engine)).kind == "engine"  # the engine first


@pytest.mark.slow
def test_engine_class_travels_from_the_ranks_into_the_budget(
    fake_engine: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("CPU ranks without Triton's interpreter")
    monkeypatch.syspath_prepend(str(fake_engine))  # spawned ranks start with the parent's sys.path
    key = "norms:op=add_rmsnorm,tokens=1,width=64,dtype=bf16"
    with ProbeController(device="cpu", cpu_ranks=1, rank_log=tmp_path / "ranks.log") as pc:
        res = pc.run("norms", {"keys": [key], "cpu_samples": 2}, timeout_s=120)
    assert res.status is ProbeStatus.OK, (res.message, res.traceback)
    [best, alt] = res.measurements
    assert best.status is MeasurementStatus.OK and best.params["role"] == "budget"
    assert best.kernel is not None and best.kernel.kind == "engine" and best.kernel.package == "flashinfer"
    assert alt.params["role"] == "alternative" and alt.kernel is not None and alt.kernel.kind == "cpu"
    [back] = results_from_json(results_to_json([res]))  # the class survives the JSON round trip
    assert back.measurements[0].kernel == best.kernel
    builder = MeasuredSetBuilder()
    read_keyed_points(back, builder)
    timed = builder.build().times[key]
    # the faster of the two counts, the other stays beside it (on CPU ranks either may be faster)
    assert timed.kernel in (best.kernel, alt.kernel)
    assert {timed.kernel.kind if timed.kernel else "", *(a.kernel.kind for a in timed.alternatives)} == {
        "engine",
        "cpu",
    }


def test_budget_segments_say_which_kernel_class_each_figure_came_from() -> None:
    spec = load_preset("llama-3.1-70b")
    inv = build_inventory(spec, Deployment(tp=8, batch=1, context_len=4096))
    triton = KernelClass("triton", "fused add + RMSNorm (one launch)")
    torch_cls = KernelClass("torch", "add, F.rms_norm")
    measured: dict[str, MeasuredTime] = {}
    norm_keys = [op.key for op in inv.ops if isinstance(op.key, NormKey)]
    assert norm_keys
    for k in norm_keys:
        alt = (KernelTime(torch_cls, 0.007),) if k.op == "add_rmsnorm" else ()
        measured[k.key_id] = MeasuredTime(0.002, 0.002, 0.002, kernel=triton, alternatives=alt)
    budget = compose_budget(inv, measured)
    seg = budget.segment("norms")
    assert seg is not None and seg.kernels == (triton,)
    assert kernels_short(seg.kernels) == "Triton"
    assert seg.torch_ms is not None and seg.ms is not None and seg.torch_ms > seg.ms
    assert "torch ops would take" in seg.kernel_text and "decodetop Triton" in seg.kernel_text
    doc = budget.to_dict()
    norms_doc = next(s for s in doc["segments"] if s["component"] == "norms")
    assert norms_doc["kernels"] == [triton.to_dict()] and norms_doc["torch_ms"] == seg.torch_ms
    gemm = budget.segment("attention")  # nothing measured there: no class said, no torch figure
    assert gemm is not None and gemm.kernels == () and gemm.torch_ms is None


def test_the_fastest_kernel_class_of_a_key_counts_and_the_others_stay_beside_it() -> None:
    triton = KernelClass("triton", "GQA decode split-K")
    sdpa = KernelClass("torch", "SDPA (enable_gqa)")
    builder = MeasuredSetBuilder()
    builder.offer("k", MeasuredTime(0.016, 0.015, 0.017, kernel=triton))
    builder.offer("k", MeasuredTime(0.013, 0.012, 0.014, kernel=sdpa))
    builder.offer("k", MeasuredTime(0.020, 0.019, 0.021, kernel=triton))  # a slower sample of the same class
    timed = builder.build().times["k"]
    assert timed.kernel == sdpa and timed.median_ms == 0.013
    assert timed.alternatives == (KernelTime(triton, 0.016),)


FP8_INDEXER = textwrap.dedent(
    """
    import json, torch
    from decodetop.probes.worker.kernels import dsa
    torch.manual_seed(11)
    heads, dim, length = 32, 64, 700
    q = torch.randn(1, heads, dim).to(torch.bfloat16)
    w = torch.rand(1, heads)
    keys = (torch.randn(1, length, dim) * 2).to(torch.float8_e4m3fn)
    ks = torch.rand(1, length) + 0.5
    got = {}
    for q8 in (True, False):
        work = dsa.dsa_workspace(1, length, 100, torch.device("cpu"), sms=4, q8=q8)
        dsa.dsa_prepare(work)
        scores = dsa.dsa_scores(q, w, keys, ks, work)
        for ref_q8 in (True, False):
            ref = dsa.reference_scores(q, w, keys, ks, q8=ref_q8)
            got[f"{q8}/{ref_q8}"] = float((scores - ref).norm() / ref.norm())
    print(json.dumps(got))
    """
)


def test_the_fp8_indexer_multiplies_q_quantized_per_head(tmp_path: Path) -> None:
    """The FP8 × FP8 product (the default, `DsaWorkspace.q8`) gives the scores of q quantized per head to E4M3, not
    the FP16 product's: each form matches its own torch form and the other only to FP8's rounding."""
    require_module("triton", WHY)
    got = json.loads(_python(FP8_INDEXER, [], _env(tmp_path, interpret=True)).strip().splitlines()[-1])
    assert got["True/True"] < 1e-5, got  # the same E4M3 values, exact products: only the sums' order differs
    assert got["False/False"] < 2e-3, got  # the torch form's bmm rounds its products' sums to BF16
    assert 3e-3 < got["True/False"] < 5e-2, got  # FP8's 3 mantissa bits on q: a few parts in a hundred at most


def test_quantize_query_scales_each_head_to_e4m3s_range() -> None:
    q = torch.randn(2, 4, 64).to(torch.bfloat16) * torch.tensor([1e-3, 1.0, 30.0, 0.0]).view(1, 4, 1)
    w = torch.rand(2, 4)
    q8, w8 = dsa.quantize_query(q, w)
    peak = q8.abs().amax(-1)
    assert torch.allclose(peak[:, :3], torch.full_like(peak[:, :3], 448.0)) and not peak[:, 3].any()
    scale = q.float().abs().amax(-1).clamp_min(1e-12) / 448.0
    assert torch.allclose(w8, w * scale)
    back = q8 * scale.unsqueeze(-1)
    assert float((back - q.float()).norm() / q.float().norm()) < 0.07  # E4M3: 3 mantissa bits


def test_the_fp8_indexer_needs_a_gpu_that_multiplies_fp8(monkeypatch: pytest.MonkeyPatch) -> None:
    """FP8 × FP8 from sm_89; an A100 (sm_80) multiplies in FP16 instead, and says so in the workspace (`q8`)."""
    from decodetop.probes.worker.kernels import common

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    cuda = torch.device("cuda", 0)
    for capability, supported in (((8, 0), False), ((8, 9), True), ((9, 0), True), ((12, 0), True)):
        monkeypatch.setattr(common, "device_capability", lambda _d, c=capability: c)
        assert common.fp8_mma_supported(cuda) is supported, capability
    assert common.fp8_mma_supported(torch.device("meta"))
    assert not common.fp8_mma_supported(torch.device("cpu"))
    assert not dsa.dsa_workspace(1, 4096, 2048, torch.device("cpu"), sms=4).q8
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert common.fp8_mma_supported(torch.device("cpu"))
    assert dsa.dsa_workspace(1, 4096, 2048, torch.device("cpu"), sms=4).q8


GQA_Q8 = textwrap.dedent(
    """
    import json, torch
    from decodetop.probes.worker.kernels import gqa
    torch.manual_seed(0)
    batch, kv_heads, group, length, dim = 1, 2, 8, 700, 128
    q = torch.randn(batch, kv_heads * group, 1, dim).to(torch.bfloat16)
    k = torch.randn(batch, kv_heads, length, dim).to(torch.float8_e4m3fn)
    v = torch.randn(batch, kv_heads, length, dim).to(torch.float8_e4m3fn)
    scales = torch.tensor([0.5, 0.25])
    qf = q.float()
    step = qf.abs().amax(-1, keepdim=True).clamp_min(1e-12) / 448.0
    q_e4m3 = ((qf / step).to(torch.float8_e4m3fn).float() * step).to(torch.bfloat16)
    got = {}
    for q8 in (False, True):
        out = gqa.gqa_decode(q, k, v, sm_scale=dim**-0.5, scales=scales, q8=q8).float().clone()
        for name, query in (("bf16", q), ("e4m3", q_e4m3)):
            ref = gqa.reference_gqa(query, k, v, sm_scale=dim**-0.5, scales=scales).float()
            got[f"{q8}/{name}"] = float((out - ref).norm() / ref.norm())
    try:
        gqa.gqa_decode(q, k.to(torch.bfloat16), v.to(torch.bfloat16), sm_scale=dim**-0.5, q8=True)
    except ValueError as exc:
        got["bf16 cache"] = str(exc)
    print(json.dumps(got))
    """
)


def test_gqa_fp8_query_form_matches_its_torch_form(tmp_path: Path) -> None:
    """The diagnostic FP8 × FP8 q · kᵀ (`gqa_decode(q8=True)`, benchmarks/kernels/gqa_fp8_query.py) attends with q
    rounded to E4M3 per row: as close to the torch form over that q as the FP16 form is to the plain one."""
    require_module("triton", WHY)
    got = json.loads(_python(GQA_Q8, [], _env(tmp_path, interpret=True)).strip().splitlines()[-1])
    assert got["False/bf16"] < 1e-2 and got["True/e4m3"] < 1e-2, got
    assert got["True/bf16"] > 2 * got["True/e4m3"], got  # it really multiplies the rounded q
    assert got["bf16 cache"] == "GQA's FP8 × FP8 q · kᵀ needs an FP8 cache"
