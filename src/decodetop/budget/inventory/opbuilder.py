"""Provides `OpBuilder`: turns a model's modules and a deployment into `Op`s (GEMMs, norms, collectives, KV writes),
merging the same op of different layers into one with a count; and the kernel counts each kind of op launches."""

# ruff: noqa: PLR0917 - the op makers take a shape row positionally, like the Op they build
from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from decodetop.budget.components import Component
from decodetop.budget.deployment import ACTIVATION_BYTES, KV_BYTES, Deployment
from decodetop.budget.inventory.step import Op
from decodetop.budget.keys import AllreduceKey, GemmKey, KvcastKey, NormKey
from decodetop.budget.quant import WeightFormat
from decodetop.budget.spec import ModelSpec, WeightModule

KERNELS_PER_OP: dict[str, int] = {
    "gemm": 1,
    "act_quant": 1,  # dynamic per-token FP8 / NVFP4 activation quantization before a low-precision GEMM
    "norm": 1,
    "kv_write": 1,
    "attention_gqa": 1,  # FlashInfer/FA decode kernel
    "attention_mla": 1,  # absorbed MLA decode over the latent cache
    "attention_mla_dsa": 3,  # indexer logits, top-k selection, sparse MLA
    "routing": 2,  # router GEMM + (grouped) top-k
    "moe": 5,  # align/sort, gate_up grouped GEMM, activation, down grouped GEMM, combine
    "collective": 1,
    "sampling": 3,  # lm_head GEMM, logits processing, sampling / argmax
}
"""Kernels launched per op instance: estimates of what SGLang/vLLM launch (a profiler trace gives the real count)."""


def _ranges(layers: Iterable[int]) -> str:
    items = sorted(set(layers))
    if not items:
        return "-"
    parts: list[str] = []
    start = prev = items[0]
    for v in [*items[1:], None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if v is not None:
            start = prev = v
    return ",".join(parts)


def low_precision(dtype: str) -> bool:
    # MXFP4 experts (gpt-oss) run weight-only with BF16 activations; FP8 and NVFP4 quantize activations too.
    return dtype in ("fp8", "nvfp4")


class OpBuilder:
    """Collects the ops of one decode step; the same op of different layers (same name, key and bytes) merges into
    one with a count and its layer ranges."""

    def __init__(self, spec: ModelSpec, dep: Deployment) -> None:
        self.spec = spec
        self.dep = dep
        self.kv_dtype = dep.resolved_kv_dtype(spec)
        self.kvb = KV_BYTES[self.kv_dtype]
        self.tp = dep.tp
        self.h_rank = max(1, spec.n_heads // dep.tp)
        self.kv_rank = max(1, spec.n_kv_heads // dep.tp) if spec.attention_kind == "gqa" else 1
        self._ops: dict[tuple[object, ...], tuple[Op, list[int], set[int]]] = {}
        self._recording: list[tuple[tuple[object, ...], Op, int | None]] | None = None
        self.moe_layers = set(spec.moe_layers)
        self.sliding_layers = set(spec.sliding_layers)
        mods: dict[tuple[int, str], WeightModule] = {}
        for m in (*spec.modules, *spec.mtp_modules):
            mods[(m.layer, m.kind)] = m
        self.mods = mods

    def mod(self, layer: int, kind: str) -> WeightModule:
        return self.mods[(layer, kind)]

    def record(self) -> list[tuple[tuple[object, ...], Op, int | None]]:
        """Keep every op added from now on (until `stop_recording`), with its layer: one layer's ops, to replay for
        the other layers of its kind (`replay`)."""
        self._recording = []
        return self._recording

    def stop_recording(self) -> None:
        self._recording = None

    def replay(self, recorded: Iterable[tuple[tuple[object, ...], Op, int | None]], layer: int) -> None:
        """Add `recorded` ops again as layer `layer`'s (those of no layer stay of none): what building a layer of
        the same kind would add, without building its ops again."""
        for merge, op, at in recorded:
            self._merge(merge, op, None if at is None else layer)

    def add(self, op: Op, layer: int | None) -> None:
        """Record one op; identical ops (same name, key, bytes) of different layers merge into one with a count."""
        merge = (op.name, op.component, op.kind, op.key, op.weight_bytes, op.kv_bytes, op.dtype, layer is None)
        if self._recording is not None:
            self._recording.append((merge, op, layer))
        self._merge(merge, op, layer)

    def _merge(self, merge: tuple[object, ...], op: Op, layer: int | None) -> None:
        entry = self._ops.get(merge)
        if entry is None:
            self._ops[merge] = (op, [op.count], {layer} if layer is not None else set())
        else:
            entry[1][0] += op.count
            if layer is not None:
                entry[2].add(layer)

    def ops(self) -> tuple[Op, ...]:
        out = []
        for op, count, layers in self._ops.values():
            label = op.layers if not layers else _ranges(layers)
            if layers and min(layers) >= self.spec.n_layers:
                label = "mtp"
            out.append(dataclasses.replace(op, count=count[0], layers=label))
        return tuple(out)

    # --- op makers -------------------------------------------------------------------------------------------

    def gemm(
        self,
        name: str,
        comp: Component,
        layer: int | None,
        m: int,
        n: int,
        k: int,
        fmt: WeightFormat,
        weight_bytes: float,
        batch: int = 1,
        count: int = 1,
    ) -> None:
        dtype = fmt.probe_dtype
        kernels = KERNELS_PER_OP["gemm"] + (KERNELS_PER_OP["act_quant"] if low_precision(dtype) else 0)
        shape = f"[{m}×{k}]·[{k}×{n}]" + (f" ×{batch}" if batch > 1 else "")
        op = Op(
            name,
            comp,
            "bmm" if batch > 1 else "gemm",
            shape,
            dtype,
            count,
            weight_bytes,
            0.0,
            weight_bytes + batch * m * k * ACTIVATION_BYTES,
            batch * m * n * ACTIVATION_BYTES,
            2.0 * batch * m * n * k,
            kernels,
            GemmKey(m, n, k, batch, dtype),
            "-",
        )
        self.add(op, layer)

    def linear(
        self, name: str, comp: Component, layer: int, m: int, mods: list[WeightModule], share: float, count: int = 1
    ) -> None:
        """A GEMM over one or more fused modules of the same format; this rank holds `share` of each's rows."""
        n = max(1, sum(round(md.out_features * share) for md in mods))
        wbytes = sum(md.bytes_for(1, share) for md in mods)
        self.gemm(name, comp, layer, m, n, mods[0].in_features, mods[0].fmt, wbytes, count=count)

    def row_linear(self, name: str, comp: Component, layer: int, m: int, md: WeightModule, count: int = 1) -> None:
        """A row-parallel GEMM: input features split over TP ranks."""
        k = max(1, md.in_features // self.tp)
        self.gemm(name, comp, layer, m, md.out_features, k, md.fmt, md.bytes_for(1, 1.0, 1 / self.tp), count=count)

    def norm(
        self, name: str, op: str, comp: Component, layer: int | None, tokens: int, width: int, count: int = 1
    ) -> None:
        rw = tokens * width * ACTIVATION_BYTES
        reads = rw * (2 if op == "add_rmsnorm" else 1)
        writes = rw * (2 if op == "add_rmsnorm" else 1)
        shape = f"[{tokens}×{width}]"
        self.add(
            Op(
                name,
                comp,
                "norm",
                shape,
                "bf16",
                count,
                0.0,
                0.0,
                reads,
                writes,
                4.0 * tokens * width,
                KERNELS_PER_OP["norm"],
                NormKey(op, tokens, width, "bf16"),
                "-",
            ),
            layer,
        )

    def collective(self, name: str, kind: str, layer: int | None, nbytes: int, count: int = 1) -> None:
        if self.tp <= 1:
            return
        op = Op(
            name,
            Component.COMMUNICATION,
            kind,
            f"{nbytes} B × {self.tp} ranks",
            "bf16",
            count,
            0.0,
            0.0,
            float(nbytes),
            float(nbytes),
            0.0,
            KERNELS_PER_OP["collective"],
            AllreduceKey(kind, nbytes, self.tp, "bf16"),
            "-",
        )
        self.add(op, layer)

    def kv_write(
        self,
        name: str,
        layer: int,
        layout: str,
        tokens: int,
        width: int,
        kvb: float,
        kv_dtype: str,
        count: int = 1,
        rope: int = 0,
    ) -> None:
        """The cache write of `tokens` rows of `width`; with `rope` (values per token), the rotary embedding of the
        query and key heads in the same op (one kernel: engines fuse them, and the kvcast probe times its gqa and
        mla keys as decodetop's fused rope + KV write)."""
        rope_io = tokens * rope * ACTIVATION_BYTES  # rotated in place: read and written
        op = Op(
            name,
            Component.ATTENTION,
            "kv_write",
            f"[{tokens}×{width}] → cache" + (f", rope on {rope}" if rope else ""),
            kv_dtype,
            count,
            0.0,
            0.0,
            tokens * width * ACTIVATION_BYTES + rope_io,
            tokens * width * kvb + rope_io,
            3.0 * tokens * rope,
            KERNELS_PER_OP["kv_write"],
            KvcastKey(layout, tokens, width, self.dep.context_len, kv_dtype),
            "-",
        )
        self.add(op, layer)
