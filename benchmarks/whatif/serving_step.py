"""An independently written serving-form decode step of one rank's shard of a dense Llama-form model, in plain torch
(no decodetop code): the reference the what-if predictions are checked against at shapes the acceptance table does
not use.

Per layer: RMSNorm (`F.rms_norm`), the fused QKV projection, rotary embedding of q and k, the new token's K and V
written into a static cache, decode attention of the query heads grouped per KV head over the cached tokens (SDPA:
the group folded into the query axis, as serving kernels read each KV head once; and a split-KV decode, flash-decoding
in plain torch: the context cut into chunks of `SPLIT_CHUNK` tokens, each chunk's scores, softmax statistics and
partial output computed by batched matmuls over (sequence, KV head, chunk), the partials merged by their log-sum-exp,
as a serving engine's decode kernel spreads a long context over the GPU; and PyTorch's FlexAttention, compiled, whose
decode kernel splits the context itself; the fastest counts), the output projection
and the residual, RMSNorm, the fused gate/up projection, SiLU × up, the down projection and the residual; then the final
norm, the shard's lm_head and a greedy argmax. The shard of TP t holds heads / t query heads, kv_heads / t KV heads,
intermediate / t and vocab / t (no all-reduce: one GPU times the compute of one rank). BF16 weights and cache.

The step is captured in one CUDA graph and replayed (CUDA events around `--replays` replays, `--repeats` times, the
median per step), as an engine runs decode; on CPU it runs eagerly at tiny widths (smoke test only). With `--parts`,
the fastest form is timed twice more, once without its elementwise chain (the RMSNorms, rope, the KV write, SiLU ×
up) and once without its attention, so that each one's share of the step is a difference of two timed steps. With
`--compile`, the fastest form's step is also compiled by `torch.compile` (Inductor fuses the RMSNorms, rope, the KV
write and SiLU × up into Triton kernels, as an engine's fused kernels do) and captured the same way; the faster of the
eager and the compiled step counts, and both are kept.

Shapes come from the campaign's JSON (`whatif.py` writes its predictions under "serving"):

    python3 benchmarks/whatif/serving_step.py --predicted /tmp/w/whatif.json --json /tmp/w/serving.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 - torch's own spelling

ATTENTION_FORMS = ("sdpa", "split", "flash-split", "flex")
"""The decode attention timed: SDPA over the grouped queries, the split-KV decode in matmuls (`Shard._split_attend`),
and the split-KV decode over PyTorch's flash kernel (`Shard._flash_split_attend`, GPU only). SDPA's
flash kernel gives one program per sequence and KV head and does not split the context (4 × 64K on a TP-4 shard: 8
programs on 132 SMs, 3.5 ms of the step); two whole-context matmuls around a softmax reduce the context inside one
GEMM per (sequence, KV head) and were slower still (10.5 ms; benchmarks/results/whatif/h200x1/serving.json).
FlexAttention (`torch.nn.attention.flex_attention`, compiled, GPU only) picks its own split-KV decode kernel for a
one-token query with the group of a KV head packed into its rows
(https://pytorch.org/blog/flexattention-for-inference/)."""
GPU_FORMS = ("flash-split", "flex")
"""The forms that run on a GPU only."""
SPLIT_TOLERANCE = 0.02
"""Largest relative difference of the split-KV output from SDPA's: BF16 partial outputs over 128 chunks."""
SPLIT_CHUNK = 512
"""Tokens per chunk of the split-KV decode: 128 chunks at 64K, (sequence × KV head × chunk) programs enough to fill an
H200's 132 SMs from batch 1 on one KV head; a chunk's [group × 512] scores stay small."""
ROPE_THETA = 500000.0
"""Llama-3.1's rope_theta (its config.json); only the values of cos/sin depend on it, not the time."""


class Shard:
    """One rank's weights and KV cache of a dense Llama-form model at TP `tp`, and its decode step."""

    def __init__(
        self,
        shape: Mapping[str, int],
        device: torch.device,
        dtype: torch.dtype,
        attention: str = "sdpa",
        *,
        elementwise: bool = True,
        attend: bool = True,
    ) -> None:
        self.attention = attention
        self.elementwise = elementwise
        """False: the step without its RMSNorms, rope, KV write and SiLU × up (`--parts`)."""
        self.attend = attend
        """False: the step without its attention (`--parts`)."""
        tp = shape["tp"]
        self.layers = shape["layers"]
        self.hidden = shape["hidden"]
        self.d = shape["head_dim"]
        self.hq = shape["heads"] // tp
        self.hkv = max(1, shape["kv_heads"] // tp)
        inter = shape["intermediate"] // tp
        vocab = -(-shape["vocab"] // tp)
        self.batch, self.context = shape["batch"], shape["context"]
        g = torch.Generator(device=device).manual_seed(0)  # drawn where they live: billions of values per shard

        def w(*size: int) -> torch.Tensor:
            return (torch.randn(*size, generator=g, device=device) * 0.02).to(dtype)

        qkv_out = (self.hq + 2 * self.hkv) * self.d
        self.wqkv = [w(qkv_out, self.hidden) for _ in range(self.layers)]
        self.wo = [w(self.hidden, self.hq * self.d) for _ in range(self.layers)]
        self.wgu = [w(2 * inter, self.hidden) for _ in range(self.layers)]
        self.wdown = [w(self.hidden, inter) for _ in range(self.layers)]
        self.norm1 = [torch.ones(self.hidden, device=device, dtype=dtype) for _ in range(self.layers)]
        self.norm2 = [torch.ones(self.hidden, device=device, dtype=dtype) for _ in range(self.layers)]
        self.final_norm = torch.ones(self.hidden, device=device, dtype=dtype)
        self.lm_head = w(vocab, self.hidden)
        self.embed = w(vocab, self.hidden)
        self.length = self.context + 1  # the cached tokens and the new one
        chunk = SPLIT_CHUNK if attention in ("split", "flash-split") else 1
        self.chunks = -(-self.length // chunk)
        cache = (self.batch, self.hkv, self.chunks * chunk, self.d)  # padded to whole chunks (masked off)
        self.k_cache = [torch.randn(cache, device=device, dtype=dtype) for _ in range(self.layers)]
        self.v_cache = [torch.randn(cache, device=device, dtype=dtype) for _ in range(self.layers)]
        pos = torch.tensor([float(self.context)], device=device)
        inv = 1.0 / ROPE_THETA ** (torch.arange(0, self.d, 2, device=device, dtype=torch.float32) / self.d)
        ang = pos[:, None] * inv[None, :]
        self.cos = torch.cat([ang.cos(), ang.cos()], dim=-1).to(dtype)
        self.sin = torch.cat([ang.sin(), ang.sin()], dim=-1).to(dtype)
        self.pos = self.context
        self.tokens = torch.zeros(self.batch, dtype=torch.long, device=device)
        pad = torch.arange(self.chunks * chunk, device=device) >= self.length
        self.pad_mask = torch.zeros(self.chunks * chunk, device=device).masked_fill(pad, float("-inf"))
        self.pad_mask = self.pad_mask.view(1, 1, self.chunks, 1, chunk)

    def _rope(self, x: torch.Tensor) -> torch.Tensor:
        half = self.d // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * self.cos + rotated * self.sin

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Decode attention of the grouped queries [b, kv heads, group, d] over the cache: SDPA (flash: one block
        per batch × KV head, no split over the context), or the split-KV decode."""
        if self.attention == "sdpa":
            return F.scaled_dot_product_attention(q, k, v)
        if self.attention == "flash-split":
            return self._flash_split_attend(q, k, v)
        if self.attention == "flex":
            return self._flex_attend(q, k, v)
        return self._split_attend(q, k, v)

    @staticmethod
    def _flex_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """FlexAttention over the grouped queries: query head j reads KV head j // group (`enable_gqa`), which is the
        order of `q`'s (KV head, group) axes flattened."""
        b, hkv, group, d = q.shape
        out = _flex()(q.reshape(b, hkv * group, 1, d), k, v, enable_gqa=True)
        return out.view(b, hkv, group, d)

    def _flash_split_attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Flash-decoding over PyTorch's own flash kernel (`aten._scaled_dot_product_flash_attention`, which returns
        each row's log-sum-exp): the whole chunks of the context as the kernel's head axis (a view of the padded
        cache, nothing copied) and the remainder as a second call, the partial outputs merged by their log-sum-exp,
        as FlashDecoding merges its splits (https://crfm.stanford.edu/2023/10/12/flashdecoding.html)."""
        b, hkv, group, d = q.shape
        c = SPLIT_CHUNK
        full, rest = divmod(self.length, c)
        outs, lses = [], []
        flash = torch.ops.aten._scaled_dot_product_flash_attention
        if full:
            kc = k[:, :, : full * c].reshape(b * hkv, full, c, d)
            vc = v[:, :, : full * c].reshape(b * hkv, full, c, d)
            qc = q.reshape(b * hkv, 1, group, d).expand(b * hkv, full, group, d)
            out, lse = flash(qc, kc, vc)[:2]
            outs.append(out.float())
            lses.append(lse)
        if rest:
            span = slice(full * c, self.length)
            kr = k[:, :, span].reshape(b * hkv, 1, rest, d)
            vr = v[:, :, span].reshape(b * hkv, 1, rest, d)
            out, lse = flash(q.reshape(b * hkv, 1, group, d), kr, vr)[:2]
            outs.append(out.float())
            lses.append(lse)
        part, lse = torch.cat(outs, dim=1), torch.cat(lses, dim=1)  # [b·hkv, S, group, d], [b·hkv, S, group]
        weight = torch.softmax(lse, dim=1).unsqueeze(-1)
        return (part * weight).sum(dim=1).view(b, hkv, group, d).to(v.dtype)

    def _split_attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Flash-decoding in plain torch: per (sequence, KV head, chunk) the chunk's scores (one batched matmul over
        all of them), their max and sum of exponentials and the chunk's partial output (a second batched matmul);
        then the partials rescaled to the common max and summed, divided by the summed weights."""
        b, hkv, _group, d = q.shape
        chunk = k.shape[2] // self.chunks
        kc = k.view(b, hkv, self.chunks, chunk, d)
        vc = v.view(b, hkv, self.chunks, chunk, d)
        scores = (q.unsqueeze(2) @ kc.transpose(-1, -2)).float() * d**-0.5 + self.pad_mask  # [b, hkv, S, g, c]
        m = scores.amax(dim=-1, keepdim=True)
        p = torch.exp(scores - m)
        partial = (p.to(v.dtype) @ vc).float()  # [b, hkv, S, g, d]
        weight = torch.exp(m - m.amax(dim=2, keepdim=True))  # each chunk against the largest max
        out = (partial * weight).sum(dim=2) / (p.sum(dim=-1, keepdim=True) * weight).sum(dim=2)
        return out.to(v.dtype)

    def _cached(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer `i`'s K and V: the whole padded cache for the split form (its pad masked), the tokens for SDPA."""
        if self.attention in ("split", "flash-split"):
            return self.k_cache[i], self.v_cache[i]
        return self.k_cache[i][:, :, : self.length], self.v_cache[i][:, :, : self.length]

    def step(self) -> torch.Tensor:
        """One decode step of the shard: the next token of each sequence."""
        b, d = self.batch, self.d
        x = F.embedding(self.tokens, self.embed)
        for i in range(self.layers):
            h = self._norm(x, self.norm1[i])
            qkv = h @ self.wqkv[i].t()
            q, k, v = qkv.split([self.hq * d, self.hkv * d, self.hkv * d], dim=-1)
            q, k = q.reshape(b, self.hq, d), k.reshape(b, self.hkv, d)
            if self.elementwise:
                q, k = self._rope(q), self._rope(k)
                self.k_cache[i][:, :, self.pos] = k
                self.v_cache[i][:, :, self.pos] = v.view(b, self.hkv, d)
            qg = q.view(b, self.hkv, self.hq // self.hkv, d)  # the group of a KV head as its query axis
            att = self._attend(qg, *self._cached(i)) if self.attend else qg
            x = x + att.reshape(b, self.hq * d) @ self.wo[i].t()
            h = self._norm(x, self.norm2[i])
            gate, up = (h @ self.wgu[i].t()).chunk(2, dim=-1)
            x = x + (F.silu(gate) * up if self.elementwise else up) @ self.wdown[i].t()
        logits = self._norm(x, self.final_norm) @ self.lm_head.t()
        return logits.float().argmax(dim=-1)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """RMSNorm, or `x` itself in the step without its elementwise chain."""
        return F.rms_norm(x, (self.hidden,), weight, eps=1e-5) if self.elementwise else x


_FLEX: list[Any] = []
"""FlexAttention compiled once for the run (an uncompiled call runs its slow reference path)."""


def _flex() -> Any:
    if not _FLEX:
        from torch.nn.attention.flex_attention import flex_attention

        _FLEX.append(torch.compile(flex_attention, dynamic=False))
    return _FLEX[0]


def time_graph(shard: Shard, replays: int, repeats: int, compiled: bool = False) -> list[float]:
    """ms per step of the captured step, one figure per repeat (CUDA events around `replays` replays); `compiled`:
    the step compiled by `torch.compile` first (compiled during the warm-up, before capture)."""
    if compiled:  # a fresh cache per step compiled: the shapes and parts of a run exceed dynamo's recompile limit,
        torch._dynamo.reset()  # past which it runs the step eagerly without saying so in the figures
    step = torch.compile(shard.step, dynamic=False) if compiled else shard.step
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm the kernels' choices (and compile) before capture
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = (
            torch.cuda.Event(enable_timing=True),
            torch.cuda.Event(enable_timing=True),
        )
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / replays)
    del graph, out
    return times


def time_eager(shard: Shard, replays: int, repeats: int, compiled: bool = False) -> list[float]:
    """ms per step run eagerly (CPU smoke test: host clock around `replays` steps; `compiled` is GPU only)."""
    if compiled:
        raise ValueError("--compile times a captured GPU step; the CPU smoke test runs eagerly")
    shard.step()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(replays):
            shard.step()
        times.append((time.perf_counter() - t0) * 1000 / replays)
    return times


def split_error(shard: Shard) -> float:
    """Largest |split-KV − SDPA| of layer 0's attention for a random query, over the largest |SDPA| (the split form
    is checked before it is timed: a fast wrong kernel proves nothing)."""
    g = torch.Generator(device="cpu").manual_seed(1)
    q = torch.randn(shard.batch, shard.hkv, shard.hq // shard.hkv, shard.d, generator=g)
    q = q.to(device=shard.k_cache[0].device, dtype=shard.k_cache[0].dtype)
    k, v = shard.k_cache[0], shard.v_cache[0]
    want = F.scaled_dot_product_attention(q, k[:, :, : shard.length], v[:, :, : shard.length]).float()
    got = shard._attend(q, k, v).float()
    return float((got - want).abs().max()) / max(float(want.abs().max()), 1e-30)


def _figures(times: Sequence[float]) -> dict[str, float]:
    """Median, p10 and p90 ms of one form's repeats."""
    ordered = sorted(times)
    return {
        "ms": statistics.median(ordered),
        "p10_ms": ordered[max(0, len(ordered) // 10)],
        "p90_ms": ordered[min(len(ordered) - 1, (9 * len(ordered)) // 10)],
    }


def measure(  # noqa: PLR0917 - one measurement's settings
    shape: Mapping[str, Any],
    device: torch.device,
    replays: int,
    repeats: int,
    parts: bool = False,
    compiled: bool = False,
) -> dict[str, Any]:
    """One shape's step with each attention form (`ATTENTION_FORMS`): median, p10 and p90 ms over the repeats; the
    fastest form's figures are the step's (an engine runs its fastest decode kernel). A form that fails on this
    torch is kept with its error and not timed. `compiled`: the fastest form's step compiled too (key
    "<form>+compiled"). `parts`: the fastest step without its elementwise chain and without its attention too, and
    the differences."""
    forms: dict[str, dict[str, Any]] = {}
    timer = time_graph if device.type == "cuda" else time_eager
    for form in ATTENTION_FORMS:
        if form in GPU_FORMS and device.type != "cuda":
            continue
        shard = Shard(shape, device, torch.bfloat16, attention=form)
        try:
            check = split_error(shard) if form != "sdpa" else None
            if check is not None and not check <= SPLIT_TOLERANCE:
                raise RuntimeError(f"{form} decode differs from SDPA by {check:.3g} (relative)")
            figures = _figures(timer(shard, replays, repeats))
        except Exception as exc:  # a form this torch cannot run is reported, the others still count
            if form == "sdpa":
                raise
            forms[form] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
            print(f"    {form}: not timed ({forms[form]['error'][:160]})", file=sys.stderr, flush=True)
        else:
            forms[form] = {**({"relative_error_vs_sdpa": check} if check is not None else {}), **figures}
        del shard
        if device.type == "cuda":
            torch.cuda.empty_cache()
    timed_forms = [f for f in forms if "ms" in forms[f]]
    best = min(timed_forms, key=lambda f: forms[f]["ms"])
    if compiled:
        shard = Shard(shape, device, torch.bfloat16, attention=best)
        try:
            forms[f"{best}+compiled"] = _figures(timer(shard, replays, repeats, compiled=True))
        except Exception as exc:  # kept with its error, the eager figures still count
            forms[f"{best}+compiled"] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        del shard
        if device.type == "cuda":
            torch.cuda.empty_cache()
        best = min((f for f in forms if "ms" in forms[f]), key=lambda f: forms[f]["ms"])
    timed = "CUDA graph replay, events" if device.type == "cuda" else "eager, host clock (smoke only)"
    out = {**forms[best], "attention": best, "forms": forms, "timed": timed}
    if parts:
        out["parts"] = _parts(shape, device, replays, repeats, best, forms[best]["ms"])
    return out


def _parts(  # noqa: PLR0917 - one measurement's settings
    shape: Mapping[str, Any], device: torch.device, replays: int, repeats: int, form: str, full_ms: float
) -> dict[str, float]:
    """The step in `form` ("<attention>" or "<attention>+compiled") without its elementwise chain and without its
    attention (median ms), and the share of each (the full step's `full_ms` less the step without it)."""
    timer = time_graph if device.type == "cuda" else time_eager
    attention, _, compiled = form.partition("+")
    out: dict[str, float] = {}
    for name, kw in (("elementwise", {"elementwise": False}), ("attention", {"attend": False})):
        shard = Shard(shape, device, torch.bfloat16, attention=attention, **kw)
        ms = statistics.median(timer(shard, replays, repeats, compiled=bool(compiled)))
        out[f"without_{name}_ms"] = ms
        out[f"{name}_ms"] = full_ms - ms
        del shard
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return out


def table(rows: Sequence[Mapping[str, Any]]) -> str:
    lines = [
        "| serving-form step (compute of one rank) | independent ms | predicted ms | error | 80 % range | inside |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        p, m, lo, hi = r["predicted_ms"], r["measured"]["ms"], *r["range_ms"]
        lines.append(
            f"| {r['name']} | {m:.3f} | {p:.3f} | {(p / m - 1) * 100:+.1f} % | {lo:.3f}–{hi:.3f} | "
            f"{'yes' if lo <= m <= hi else 'no'} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--predicted",
        required=True,
        help="the campaign's JSON (its 'serving' list: shapes, predictions)",
    )
    ap.add_argument("--json", metavar="PATH", help="write the shapes with their measured steps here")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--parts", action="store_true", help="time the elementwise chain's and attention's shares too")
    ap.add_argument("--compile", action="store_true", help="time the fastest form's step compiled by torch.compile too")
    args = ap.parse_args(argv)
    name = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    doc = json.loads(Path(args.predicted).read_text(encoding="utf-8"))
    shapes = doc.get("serving") or []
    if not shapes:
        print(f"{args.predicted}: no 'serving' shapes to time", file=sys.stderr)
        return 2
    rows = []
    for shape in shapes:
        measured = measure(shape["shape"], device, args.replays, args.repeats, args.parts, args.compile)
        rows.append(
            {
                **shape,
                "measured": measured,
                "error": shape["predicted_ms"] / measured["ms"] - 1,
            }
        )
        print(f"  {shape['name']}: {measured['ms']:.3f} ms measured ({measured['attention']}), "
              f"{shape['predicted_ms']:.3f} predicted",
              file=sys.stderr, flush=True)  # fmt: skip
        for part, ms in measured.get("parts", {}).items():
            print(f"    {part}: {ms:.3f} ms", file=sys.stderr, flush=True)
        out = {"what": "serving-form step", "device": name, "rows": rows}
        if device.type == "cuda":
            out["gpu"] = torch.cuda.get_device_name(device)
        if args.json:  # after every shape: a run cut short keeps what it timed
            Path(args.json).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
