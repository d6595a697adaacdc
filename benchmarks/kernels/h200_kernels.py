"""decodetop's kernels on one GPU, in one call: each component timed under CUDA-graph replay (the probe's own runners
and timer: `time_runner`, inputs rotated above 2× L2) in every launch-shape variant — the first version's beside the
new ones, so the table shows the change — each variant checked against its torch form at the timed shape before it
is timed (the runners' own checks), then `tests/probes/kernel_checks.py --big` on the kernels whose code changed.
With the bytes each must move and the roofline (bytes / measured copy bandwidth). Prints a short table last and
writes everything to --json as each section finishes; one deadline for the whole run (--deadline), sections in
order of what matters most.

Sections: copy bandwidth; MLA + DSA attention at GLM-5's TP-8 shard (8 heads, index top-k 2048) at 0, 4K, 32K and 128K,
the default (the indexer's product FP8 × FP8, the `radix8-carry` top-k) beside the one-launch `half16-ticket` and
`half8-ticket` top-k, the
indexer in FP16 and radix8's top-k with its memset; GQA at Llama-3.1-70B's shard with an FP8 KV cache over
`kernels.gqa.SHORT`, `LONG` and `SWEEP` at 4K–128K (and BF16 against SDPA); dense MLA at DeepSeek-V3's TP-8 (16 heads)
shard over `kernels.mla.SWEEP` (and TP-1, 128 heads); GLM-5's DSA path in parts (scores, + top-k, under the default,
half16-ticket, half8-ticket and radix8 with its memset; the whole attention is the row above; half16's and half8's
top-k rows note the finishing program's candidates and path); the fused-MoE kernel with its tiles
tuned over the candidates against last round's tiles and the default tiles (Mixtral-8x7B TP 1 and 2, Qwen3-235B-A22B,
DeepSeek-V3 TP 8); the rope + KV write as the kvcast probe times it; the checks. `--skip` leaves sections out, `--only`
keeps the attention and MoE rows of the components whose label holds one of its parts, `--variants` the attention and
DSA parts rows whose variant label holds one of its parts, `--contexts` the attention rows at those contexts.

`--pdl both` times each attention variant and the tuned MoE kernels with programmatic dependent launch (the default
on sm_90+, `kernels.common.pdl_enabled`) and again without (`pdl_disabled`), built and timed in each, the two side
by side (`us` and `no_pdl_us` in a row; the kernel class says ', PDL' where it ran); `--pdl off` times without only.
Everything else runs in the first of the modes.

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 \
        PYTHONPATH=src python3 benchmarks/kernels/h200_kernels.py --json $OUT/kernels.json --deadline 90
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "probes"))

from decodetop.budget.keys import AttentionKey, KvcastKey, MoeKey  # noqa: E402
from decodetop.probes.worker import attention, kvcast  # noqa: E402
from decodetop.probes.worker import fused_moe as fm  # noqa: E402
from decodetop.probes.worker.attention import AttentionVariant  # noqa: E402
from decodetop.probes.worker.context import ProbeContext  # noqa: E402
from decodetop.probes.worker.kernels import common, dsa, dsa_ticket, gqa, mla  # noqa: E402
from decodetop.probes.worker.kernels import norms as fnorms  # noqa: E402
from decodetop.probes.worker.kernels import rope as frope  # noqa: E402
from decodetop.probes.worker.kernels import tiles as tile_store  # noqa: E402
from decodetop.probes.worker.kernels.tiles import Tiles  # noqa: E402
from decodetop.probes.worker.ops import OpRunner, time_runner  # noqa: E402
from decodetop.probes.worker.timing import time_events  # noqa: E402

CONTEXTS = (0, 4096, 16384, 32768, 65536, 131072)
BUDGET_MS = 40.0
SAMPLES = 30
#: --smoke: CPU tensors under Triton's interpreter, tiny contexts and experts (the script's own paths, not timings).
SMOKE = False
#: time.monotonic() after which no further row starts (--deadline).
DEADLINE = math.inf
#: --only: attention and MoE rows whose component label holds one of these (empty: every row).
ONLY: tuple[str, ...] = ()
#: --defaults-only: of the attention variants, only the probe's defaults.
DEFAULTS_ONLY = False
#: --variants: of the attention variants and DSA parts, only those whose label holds one of these (empty: all; the
#: default scheme's DSA parts count as "default").
VARIANTS: tuple[str, ...] = ()
#: --contexts: of the attention rows, only those at these contexts (empty: every shape's own).
CONTEXTS_ONLY: tuple[int, ...] = ()
#: --pdl: the launch modes each PDL-capable row is timed in, the first the row's own figure ("on": the default,
#: PDL where the GPU has it; "off": inside `kernels.common.pdl_disabled`).
PDL_CHOICES = {"on": ("on",), "off": ("off",), "both": ("on", "off")}
PDL_MODES: tuple[str, ...] = PDL_CHOICES["on"]


@contextlib.contextmanager
def pdl_mode(mode: str) -> Iterator[None]:
    """The block with PDL as the mode says ("off": `pdl_disabled`; "on": as the GPU has it)."""
    with common.pdl_disabled() if mode == "off" else contextlib.nullcontext():
        yield


def first_mode() -> contextlib.AbstractContextManager[None]:
    """The mode every row that is timed once runs in."""
    return pdl_mode(PDL_MODES[0])


def timed_modes(build: Callable[[], OpRunner], modes: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The runner built and timed in each mode (`PDL_MODES`): the first mode's `timed` fields, its build seconds
    (`build_s`) and its mode (`pdl`), then a second mode's time as `no_pdl_*` beside it and what it saved."""
    row: dict[str, Any] = {}
    for index, mode in enumerate(modes or PDL_MODES):
        with pdl_mode(mode):
            t0 = time.time()
            runner = build()
            built_s = time.time() - t0
            got = timed(runner)
            del runner
        free()
        if index == 0:
            row.update(got, build_s=built_s, pdl=mode)
        else:
            row.update({f"no_pdl_{k}": got[k] for k in ("us", "p10_us", "p90_us", "kernel")})
            row["pdl_saved_us"] = got["us"] - row["us"]
    return row


def wanted(label: str) -> bool:
    return not ONLY or any(part in label for part in ONLY)


def wanted_variant(name: str) -> bool:
    return not VARIANTS or any(part in name for part in VARIANTS)


def dev() -> torch.device:
    return torch.device("cpu") if SMOKE else torch.device("cuda", 0)


def ctx() -> ProbeContext:
    return ProbeContext(rank=0, world_size=1, device=dev(), backend="gloo" if SMOKE else "nccl")


def contexts(full: tuple[int, ...]) -> tuple[int, ...]:
    return (0, 300) if SMOKE else full


def copy_gbps() -> float:
    """Device-to-device copy of 1 GiB, bytes read + written over the median time."""
    if SMOKE:
        return 1.0
    src = torch.empty(1 << 29, dtype=torch.float16, device="cuda").normal_()
    dst = torch.empty_like(src)
    us = statistics.median(time_events(lambda: dst.copy_(src), 5, 10, warmup=3))
    return 2 * src.numel() * 2 / us / 1e3


def timed(runner: OpRunner) -> dict[str, Any]:
    t = time_runner(ctx(), runner, budget_ms=BUDGET_MS, max_samples=SAMPLES)
    med = t.median_us
    return {
        "us": med,
        "p10_us": sorted(t.samples)[len(t.samples) // 10],
        "p90_us": sorted(t.samples)[len(t.samples) * 9 // 10],
        "method": t.method,
        "moved_bytes": runner.moved_bytes,
        "kv_bytes": runner.kv_bytes,
        "weight_bytes": runner.weight_bytes,
        "gbps": runner.moved_bytes / med / 1e3 if med else 0.0,
        "kernel": runner.kernel.text if runner.kernel else "",
        "note": runner.note,
    }


def free() -> None:
    if not SMOKE:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def att_key(kind: str, context: int, **kw: Any) -> AttentionKey:
    base: dict[str, Any] = {
        "kind": kind,
        "batch": 1,
        "q_len": 1,
        "context": context,
        "heads": 8,
        "kv_heads": 1,
        "head_dim": 576,
        "v_head_dim": 512,
        "kv_lora_rank": 512,
        "rope_dim": 64,
        "index_heads": 0,
        "index_head_dim": 0,
        "index_topk": 0,
        "window": 0,
        "kv_dtype": "bf16",
    }
    base.update(kw)
    return AttentionKey(**base)


FIRST = AttentionVariant(gqa=gqa.FIRST, mla=mla.FIRST, dsa_scheme="radix11", dsa_select_block=2048)
NEW = AttentionVariant()
INDEXER_FP16 = AttentionVariant(dsa_q8=False)
HALF_TICKET = AttentionVariant(dsa_scheme="half8-ticket")
HALF16_TICKET = AttentionVariant(dsa_scheme="half16-ticket")
CARRY = AttentionVariant(dsa_scheme="radix8-carry")
FUSED = AttentionVariant(dsa_scheme="radix8-fused")
MEMSET = AttentionVariant(dsa_scheme="radix8", dsa_q8=False)


def glm_fields() -> dict[str, Any]:
    """GLM-5 TP-8's attention key fields (index top-k 2048; 128 under --smoke, so its contexts of 300 select)."""
    return {"heads": 8, "index_heads": 32, "index_head_dim": 128, "index_topk": 128 if SMOKE else 2048}


def attention_shapes() -> list[tuple[str, str, dict[str, Any], tuple[int, ...], list[tuple[str, Any]]]]:
    """(label, kind, key fields, contexts, [(variant name, AttentionVariant, or 'torch' for the torch form)])."""
    glm = glm_fields()
    llama = {"heads": 64, "kv_heads": 8, "head_dim": 128, "v_head_dim": 128}
    gqa_configs = dict.fromkeys([gqa.SHORT, gqa.LONG, *gqa.SWEEP])
    gqa_sweep = [("default: by context", NEW), *((f"split {c.label}", AttentionVariant(gqa=c)) for c in gqa_configs)]
    mla_sweep = [(f"split {c.label}", AttentionVariant(mla=c)) for c in dict.fromkeys([mla.DEFAULT, *mla.SWEEP])]
    dsa_pair = [
        ("default: top-k by context, select auto, indexer fp8", NEW),
        ("radix8-carry, select auto, indexer fp8", CARRY),
        ("radix8-fused, select auto, indexer fp8", FUSED),
        ("half16-ticket, select auto, indexer fp8", HALF16_TICKET),
        ("half8-ticket, select auto, indexer fp8", HALF_TICKET),
        ("radix8-carry, select auto, indexer fp16", INDEXER_FP16),
        ("radix8 (memset), select auto, indexer fp16", MEMSET),
    ]
    return [
        ("GLM-5 TP8 MLA+DSA", "mla+dsa", glm, contexts((0, 4096, 32768, 65536, 131072)), dsa_pair),
        ("Llama-70B GQA fp8", "gqa", {**llama, "kv_dtype": "fp8"}, contexts((32768, 65536, 131072, 4096)), gqa_sweep),
        ("Llama-70B GQA fp8", "gqa", {**llama, "kv_dtype": "fp8"}, contexts((32768,)), [("torch", "torch")]),
        (
            "Llama-70B GQA bf16",
            "gqa",
            llama,
            contexts((32768, 131072)),
            [("first split", FIRST), ("new split", NEW), ("torch", "torch")],
        ),
        ("DeepSeek-V3 TP8 MLA", "mla", {"heads": 16}, contexts((131072,)), mla_sweep),
        ("DeepSeek-V3 TP8 MLA", "mla", {"heads": 16}, contexts((4096, 32768)), mla_sweep[:2]),
        ("DeepSeek-V3 TP1 MLA", "mla", {"heads": 128}, contexts((131072,)), mla_sweep[:2]),
    ]


def attention_rows(copy: float, out: dict[str, Any]) -> list[dict[str, Any]]:
    """Each attention shape at each context in each variant (decodetop's Triton kernels, checked by their runners
    before timing; 'torch': the torch form)."""
    rows: list[dict[str, Any]] = []
    for label, kind, kw, ctxs, variants in attention_shapes():
        if not wanted(label):
            continue
        for context in ctxs:
            if CONTEXTS_ONLY and context not in CONTEXTS_ONLY:
                continue
            key = att_key(kind, context, **kw)
            for name, variant in variants:
                if (DEFAULTS_ONLY and not name.startswith("default")) or not wanted_variant(name):
                    continue
                row: dict[str, Any] = {"component": label, "context": context, "variant": name}
                if time.monotonic() > DEADLINE:
                    row["error"] = "skipped: the run's deadline"
                    rows.append(row)
                    continue
                try:
                    length = context + 1
                    if variant == "torch":  # no Triton kernel: timed once
                        build = partial(attention.torch_attention_runner, key, ctx(), length, rotate=True)
                        row.update(timed_modes(build, PDL_MODES[:1]))
                    else:
                        build = partial(
                            attention.triton_attention_runner, key, ctx(), length, rotate=True, variant=variant
                        )
                        row.update(timed_modes(build))
                except Exception as exc:
                    row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                    traceback.print_exc()
                free()
                if "us" in row:
                    row["roofline_us"] = row["moved_bytes"] / copy / 1e3
                    row["copy_pct"] = 100 * row["gbps"] / copy
                rows.append(row)
                print(json.dumps(row), flush=True)
                out["attention"] = rows
    return rows


def dsa_parts_rows(copy: float, out: dict[str, Any]) -> list[dict[str, Any]]:
    """GLM-5 TP-8's DSA path in parts, the default (FP8 indexer, `radix8-carry`), the one-launch selections
    (`half16-ticket`, `half8-ticket`, FP8 indexer) and the form before them (FP16 indexer, `radix8`), the selection
    checked by the attention rows' runners: the indexer scores (with the first histogram; radix8's after its
    workspace memset), + the radix top-k; the whole attention (+ sparse MLA split and combine) is the attention
    rows'; each part's time is the difference of two rows."""
    rows: list[dict[str, Any]] = []
    glm = glm_fields()
    for context in contexts((32768, 131072)):
        key = att_key("mla+dsa", context, **glm)
        m = attention._mla_inputs(key, ctx(), context + 1, rotate=True)
        assert m.q_idx is not None and m.w_idx is not None
        for scheme, q8 in ((dsa.SCHEMES[0], True), ("half16-ticket", True), ("half8-ticket", True), ("radix8", False)):
            work = dsa.dsa_workspace(1, context + 1, m.attended, dev(), scheme=scheme, q8=q8)
            dsa_parts(m, work, context, copy, rows)
        del m
        free()
    out["dsa_parts"] = rows
    return rows


def dsa_parts(m: Any, work: dsa.DsaWorkspace, context: int, copy: float, rows: list[dict[str, Any]]) -> None:
    """One workspace's two part rows (see `dsa_parts_rows`). A scheme that leaves its workspace zero has no memset
    (`dsa.dsa_prepare`); its scores alone run on a workspace of their own, which they leave unzeroed."""
    alone = replace(work, work=torch.zeros_like(work.work)) if work.scheme in dsa.SELF_ZEROING else work

    def scores(work: dsa.DsaWorkspace = alone) -> None:
        _, index_keys, key_scales = m.caches.next()
        dsa.dsa_prepare(work)
        dsa.dsa_scores(m.q_idx, m.w_idx, index_keys, key_scales, work)

    def topk() -> None:
        scores(work)
        dsa.dsa_select(work, m.attended)

    index_bytes = (context + 1) * (128 + 4)
    product = ", indexer " + ("fp8" if work.q8 else ("fp16" if work.f16 else "bf16"))
    memset = "" if work.scheme in dsa.SELF_ZEROING else "memset + "
    for name, fn in ((f"{memset}scores", scores), (f"{memset}scores + top-k", topk)):
        variant = f"{name}{product}, {work.scheme}"
        if not (wanted_variant(variant) or (work.scheme == dsa.SCHEMES[0] and wanted_variant("default"))):
            continue
        row: dict[str, Any] = {"component": "GLM-5 TP8 DSA parts", "context": context, "variant": variant}
        if time.monotonic() > DEADLINE:
            row["error"] = "skipped: the run's deadline"
        else:
            try:
                row.update(timed(OpRunner(fn, index_bytes, 0.0, len(m.caches))))
                row["roofline_us"] = index_bytes / copy / 1e3
                row["copy_pct"] = 100 * row["gbps"] / copy
                if work.scheme in dsa.HALF_SCHEMES and work.selects and "top-k" in name:
                    row.update(half_path(work, m.attended))
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                traceback.print_exc()
        rows.append(row)
        print(json.dumps(row), flush=True)


def half_path(work: dsa.DsaWorkspace, topk: int) -> dict[str, Any]:
    """Which path `half8-ticket`'s or `half16-ticket`'s finishing program took on the last scores timed: the
    candidates at the threshold (`dsa_ticket.half_candidates`, `dsa_ticket.half16_candidates`) against its rank
    select (half16), its register block and its buffer."""
    if work.scheme == "half16-ticket":
        n = int(dsa_ticket.half16_candidates(work.scores, topk).max())
        cap = dsa_ticket.HALF16_CANDIDATES
        fin = (
            "rank"
            if n <= dsa_ticket.HALF16_RANK
            else ("registers" if n <= dsa_ticket.HALF16_FINISH_BLOCK else "buffer loop")
        )
        path = fin if n <= cap else "score row"
        return {"half_candidates": n, "half_path": path, "variant_note": f"{n} candidates: {path}"}
    n = int(dsa_ticket.half_candidates(work.scores, topk).max())
    path = (
        "registers"
        if n <= dsa_ticket.HALF_FINISH_BLOCK
        else ("buffer" if n <= dsa_ticket.HALF_CANDIDATES else "score row")
    )
    return {"half_candidates": n, "half_path": path, "variant_note": f"{n} candidates: {path}"}


def norm_rows(out: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for width in (4096, 5120, 6144, 7168, 8192):
        for add in (True, False):
            x = torch.randn(1, width, device=dev()).to(torch.bfloat16)
            r = torch.randn(1, width, device=dev()).to(torch.bfloat16)
            w = torch.randn(width, device=dev()).to(torch.bfloat16)
            o, ro = torch.empty_like(x), torch.empty_like(x)
            res = r if add else None
            fused = OpRunner(
                lambda x=x, w=w, res=res, o=o, ro=ro: fnorms.rmsnorm(x, w, 1e-6, residual=res, out=o, residual_out=ro),
                4 * width * 2,
                0.0,
            )
            slow = OpRunner(
                lambda x=x, w=w, res=res: fnorms.reference_rmsnorm(x, w, 1e-6, residual=res), 4 * width * 2, 0.0
            )
            row: dict[str, Any] = {"component": "add_rmsnorm" if add else "rmsnorm", "width": width}
            try:
                row["us"] = timed(fused)["us"]
                row["torch_us"] = timed(slow)["us"]
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                traceback.print_exc()
            rows.append(row)
            print(json.dumps(row), flush=True)
    out["norms"] = rows
    return rows


def rope_rows(out: dict[str, Any]) -> list[dict[str, Any]]:
    """Fused rope + KV write, one token: Llama-70B TP1 (64 q / 8 kv heads × 128, BF16 and FP8 cache), GLM-5 TP8
    MLA (8 q_pe heads × 64, one latent row of 576 with rope on its last 64)."""
    rows = []
    d = dev()
    shapes = [
        ("rope+KV write Llama-70B bf16", 64, 128, 8, 128, 128, 128, 0, 0, torch.bfloat16),
        ("rope+KV write Llama-70B fp8", 64, 128, 8, 128, 128, 128, 0, 0, torch.float8_e4m3fn),
        ("rope+KV write GLM-5 TP8 MLA", 8, 64, 1, 576, 0, 64, 0, 512, torch.bfloat16),
    ]
    for label, hq, qd, hkv, kd, vd, rot, offq, offk, dtype in shapes:
        slots_n = 65536
        q = torch.randn(1, hq, qd, device=d).to(torch.bfloat16)
        k = torch.randn(1, hkv, kd, device=d).to(torch.bfloat16)
        v = torch.randn(1, hkv, vd, device=d).to(torch.bfloat16) if vd else None
        cos, sin = torch.rand(8192, rot // 2, device=d), torch.rand(8192, rot // 2, device=d)
        pos = torch.tensor([4000], device=d)
        slots = torch.tensor([12345], device=d)
        kc = torch.zeros(slots_n, hkv, kd, device=d).to(dtype)
        vc = torch.zeros(slots_n, hkv, vd, device=d).to(dtype) if vd else None
        sc = torch.tensor([0.05, 0.05], device=d) if dtype == torch.float8_e4m3fn else None
        spec = frope.RopeSpec(rot, offq, offk)

        def fused(q=q, k=k, v=v, cos=cos, sin=sin, pos=pos, slots=slots, kc=kc, vc=vc, sc=sc, spec=spec) -> None:  # noqa: PLR0917
            frope.rope_kv_write(
                q, k, v, rope=spec, cos=cos, sin=sin, positions=pos, slots=slots, k_cache=kc, v_cache=vc, scales=sc
            )

        def slow(q=q, k=k, v=v, cos=cos, sin=sin, pos=pos, slots=slots, kc=kc, vc=vc, sc=sc, spec=spec) -> None:  # noqa: PLR0917
            frope.reference_rope_kv_write(q, k, v, spec, cos, sin, pos, slots, kc, vc, sc)

        moved = q.numel() * 4 + k.numel() * 3 + (v.numel() * 3 if v is not None else 0)
        row: dict[str, Any] = {"component": label}
        try:
            row["us"] = timed(OpRunner(fused, moved, 0.0))["us"]
            row["torch_us"] = timed(OpRunner(slow, moved, 0.0))["us"]
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            traceback.print_exc()
        rows.append(row)
        print(json.dumps(row), flush=True)
    out["rope"] = rows
    return rows


#: Last round's tuned tiles per shape (benchmarks/results/kernels/kernel_tiles_h200_sweep1.json: gate_up, down).
LAST_ROUND_TILES = {
    "MoE Mixtral-8x7B TP1": (Tiles(16, 512), Tiles(16, 1024)),
    "MoE Qwen3-235B-A22B TP1": (Tiles(8, 256), Tiles(16, 256)),
    "MoE DeepSeek-V3 TP8": (Tiles(8, 512, 4, 0, 2), Tiles(16, 256)),
    "MoE Mixtral-8x7B TP2": (Tiles(16, 512), Tiles(16, 1024)),
}


def _moe_fixed(key: MoeKey, tiles: tuple[Tiles, Tiles] | None, *, memsets: bool = False) -> dict[str, Any]:
    """The kernels with fixed tiles (None: `pick_block_n`'s default) on the probe's tensors, checked, timed
    (`memsets`: the earlier form, a memset before each split kernel)."""
    experts, bufs, w_bytes = fm._moe_tensors(key, ctx(), rotate=True)
    call = partial(fm.fused_moe, h=bufs.h, ys=bufs.ys, out=bufs.out, tiles=tiles, memsets=memsets)

    def run(experts=experts, bufs=bufs) -> torch.Tensor:
        w13, w2 = experts.next()
        return call(bufs.x, w13, w2, bufs.ids, bufs.wts)

    w13, w2 = experts.items[0]
    bufs.out.fill_(float("nan"))
    got = call(bufs.x, w13, w2, bufs.ids, bufs.wts).float()
    want = fm.reference_moe(bufs.x, w13, w2, bufs.ids, bufs.wts).float()
    err = float((got - want).abs().max())
    if not err <= fm.CHECK_RTOL * float(want.abs().max()):
        raise RuntimeError(f"fused MoE with tiles {tiles} differs from the reference: max |Δ| {err:.3g}")
    return timed(OpRunner(run, w_bytes, 0.0, len(experts), weight_bytes=w_bytes))


def _tuned_tiles(key: MoeKey) -> tuple[Tiles, Tiles] | None:
    """The tiles the runner chose for `key` on this GPU (the tile store; None under --smoke: nothing is tuned)."""
    if SMOKE:
        return None
    shape = tile_store.shape_id(key.tokens, key.top_k, key.hidden, key.intermediate, key.dtype)
    found = tile_store.lookup(torch.cuda.get_device_name(0), shape)
    return (found.gate_up, found.down) if found is not None else None


def moe_rows(copy: float, out: dict[str, Any]) -> list[dict[str, Any]]:
    """Each MoE shape: tiles tuned over the new candidates (the probe's runner, tile store under the state dir),
    the same tiles with the memsets of the earlier form (`tuned_memsets_us`: what dropping them saved), then last
    round's tiles and the default tiles through the same kernels."""
    rows = []
    shapes = [
        ("MoE Mixtral-8x7B TP1", MoeKey(1, 2, 8, 2, 4096, 14336, "bf16", 0)),
        ("MoE Qwen3-235B-A22B TP1", MoeKey(1, 8, 128, 8, 4096, 1536, "bf16", 0)),
        ("MoE DeepSeek-V3 TP8", MoeKey(1, 8, 256, 8, 7168, 256, "bf16", 0)),
        ("MoE Mixtral-8x7B TP2", MoeKey(1, 2, 8, 2, 4096, 7168, "bf16", 0)),
    ]
    if SMOKE:
        shapes = [("tiny", MoeKey(1, 2, 8, 2, 256, 128, "bf16", 0))]
    for label, key in shapes:
        if not wanted(label):
            continue
        row: dict[str, Any] = {"component": label, "weight_mib": 0.0}
        if time.monotonic() > DEADLINE:
            row["error"] = "skipped: the run's deadline"
            rows.append(row)
            continue
        try:
            row.update(timed_modes(partial(fm.fused_moe_runner, key, ctx(), rotate=True)))
            row["tune_s"] = row.pop("build_s")  # the first build tunes the tiles, the next reads them back
            with first_mode():
                row["tuned_memsets_us"] = _moe_fixed(key, _tuned_tiles(key), memsets=True)["us"]
                free()
                if label in LAST_ROUND_TILES:
                    row["last_round_tiles_us"] = _moe_fixed(key, LAST_ROUND_TILES[label])["us"]
                    free()
                row["default_tiles_us"] = _moe_fixed(key, None)["us"]
            row["weight_mib"] = row["weight_bytes"] / 2**20
            row["copy_pct"] = 100 * (row["weight_bytes"] / row["us"] / 1e3) / copy
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            traceback.print_exc()
        free()
        rows.append(row)
        print(json.dumps(row), flush=True)
        out["moe"] = rows
    return rows


def kvcast_rows(out: dict[str, Any]) -> list[dict[str, Any]]:
    """The rope + KV write as the kvcast probe times it for the inventory's one fused op (Triton, checked by its
    runner; and the torch form)."""
    rows = []
    keys = [
        ("rope + KV write Llama-70B bf16", KvcastKey("gqa", 1, 2048, 4096, "bf16")),
        ("rope + KV write Llama-70B fp8", KvcastKey("gqa", 1, 2048, 4096, "fp8")),
        ("rope + KV write GLM-5 MLA", KvcastKey("mla", 1, 576, 4096, "bf16")),
    ]
    for label, key in keys:
        row: dict[str, Any] = {"component": label}
        try:
            row["us"] = timed(kvcast.triton_write_runner(key, ctx()))["us"]
            row["torch_us"] = timed(kvcast.torch_write_runner(key, ctx()))["us"]
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            traceback.print_exc()
        rows.append(row)
        print(json.dumps(row), flush=True)
    out["kvcast"] = rows
    return rows


#: The checks of the kernels whose code changed this round (tests/probes/kernel_checks.py): PDL in every chain.
CHANGED_CHECKS = ("gqa", "mla", "dsa", "moe")


def checks(out: dict[str, Any], *, big: bool) -> None:
    import kernel_checks

    results = {}
    for name in CHANGED_CHECKS:
        if time.monotonic() > DEADLINE:
            results[name] = "skipped: the run's deadline"
            continue
        try:
            torch.manual_seed(sum(map(ord, name)))
            kernel_checks.CHECKS[name](big)
            results[name] = "ok"
        except Exception as exc:
            results[name] = f"FAILED {type(exc).__name__}: {str(exc)[:300]}"
            traceback.print_exc()
        print(f"check {name}: {results[name]}", flush=True)
        free()
    out["checks"] = results


def table(out: dict[str, Any], copy: float) -> str:
    lines = [f"copy bandwidth {copy:.0f} GB/s; checks: {out.get('checks')}; PDL {out.get('pdl')}"]

    def f(v: Any, nd: int = 1) -> str:
        return "-" if v is None else (f"{v:.{nd}f}" if isinstance(v, float) else str(v))

    lines.append("component               ctx      µs no-PDL µs roof µs %copy  variant")
    for r in out.get("attention", []) + out.get("dsa_parts", []):
        lines.append(
            f"{r['component']:<22} {r['context']:>6} {f(r.get('us')):>7} {f(r.get('no_pdl_us')):>9} "
            f"{f(r.get('roofline_us')):>7} {f(r.get('copy_pct'), 0):>4}  {r['variant'][:44]} "
            f"{r.get('pdl', '')} {r.get('variant_note', '')} {r.get('error', '')[:50]}"
        )
    for r in out.get("moe", []):
        lines.append(
            f"{r['component']:<22} {f(r.get('weight_mib'), 0):>4}MiB {f(r.get('us')):>7} "
            f"no-PDL {f(r.get('no_pdl_us'))} memsets {f(r.get('tuned_memsets_us'))} "
            f"last {f(r.get('last_round_tiles_us'))} "
            f"default {f(r.get('default_tiles_us'))} {f(r.get('copy_pct'), 0)}% "
            f"{r.get('error', r.get('note', ''))[-70:]}"
        )
    for r in out.get("kvcast", []) + out.get("norms", []) + out.get("rope", []):
        lines.append(
            f"{r['component']:<30} {f(r.get('us'), 2):>7} torch {f(r.get('torch_us'), 2):>7} {r.get('error', '')}"
        )
    return "\n".join(lines)


def in_first_mode(section: Callable[..., object], *args: Any, **kwargs: Any) -> object:
    """A section that times or checks each kernel once, in the first PDL mode."""
    with first_mode():
        return section(*args, **kwargs)


def main(argv: list[str] | None = None) -> int:
    global SMOKE, DEADLINE, ONLY, CHANGED_CHECKS, DEFAULTS_ONLY, CONTEXTS_ONLY, PDL_MODES, VARIANTS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument(
        "--skip",
        default="norms,rope",
        help="comma-separated sections to skip: attention,dsa_parts,moe,kvcast,checks,norms,rope",
    )
    ap.add_argument("--smoke", action="store_true", help="CPU tensors under TRITON_INTERPRET=1, tiny shapes")
    ap.add_argument("--deadline", type=float, default=math.inf, help="seconds after which no further row starts")
    ap.add_argument("--only", default="", help="comma-separated parts of component labels: only those rows")
    ap.add_argument("--checks", default=",".join(CHANGED_CHECKS), help="kernel checks to run (kernel_checks.py)")
    ap.add_argument("--defaults-only", action="store_true", help="of the attention variants, the defaults only")
    ap.add_argument("--contexts", default="", help="comma-separated contexts: only the attention rows at those")
    ap.add_argument("--variants", default="", help="comma-separated parts of variant labels: only those rows")
    ap.add_argument(
        "--pdl",
        choices=sorted(PDL_CHOICES),
        default="on",
        help="time the attention variants and the tuned MoE kernels with PDL (on: the default where the GPU has "
        "it), without (off), or both side by side",
    )
    args = ap.parse_args(argv)
    PDL_MODES = PDL_CHOICES[args.pdl]
    CONTEXTS_ONLY = tuple(int(c) for c in args.contexts.split(",") if c.strip())
    SMOKE = args.smoke
    ONLY = tuple(filter(None, args.only.split(",")))
    DEFAULTS_ONLY = args.defaults_only
    VARIANTS = tuple(filter(None, args.variants.split(",")))
    CHANGED_CHECKS = tuple(filter(None, args.checks.split(",")))
    DEADLINE = time.monotonic() + args.deadline
    skip = set(filter(None, args.skip.split(",")))
    out: dict[str, Any] = {
        "gpu": "CPU (smoke)" if SMOKE else torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "pdl": {"modes": list(PDL_MODES), "on_this_gpu": common.pdl_enabled(dev())},
    }
    copy = copy_gbps()
    out["copy_gbps"] = copy
    print(f"copy {copy:.0f} GB/s", flush=True)
    sections: list[tuple[str, Callable[[], object]]] = [
        ("attention", lambda: attention_rows(copy, out)),
        ("dsa_parts", lambda: in_first_mode(dsa_parts_rows, copy, out)),
        ("moe", lambda: moe_rows(copy, out)),
        ("kvcast", lambda: kvcast_rows(out)),
        ("checks", lambda: in_first_mode(checks, out, big=not SMOKE)),
        ("norms", lambda: norm_rows(out)),
        ("rope", lambda: rope_rows(out)),
    ]
    for name, run in sections:
        if name in skip:
            continue
        t0 = time.time()
        try:
            run()
        except Exception as exc:
            out[f"{name}_error"] = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
        out[f"{name}_s"] = time.time() - t0
        args.json.write_text(json.dumps(out, indent=1, default=str))
    print(table(out, copy))
    return 0 if math.isfinite(copy) else 1


if __name__ == "__main__":
    sys.exit(main())
