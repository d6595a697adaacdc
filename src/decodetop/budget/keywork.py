"""Provides the work one measurement key stands for (bytes it moves, FLOPs it does) and its roofline time on given
hardware: what the curve engine (`decodetop.budget.curves`) divides by a measured time to get an efficiency, and
multiplies back when it holds that efficiency beyond the measured grid or carries it to a shape never measured.

The bytes and FLOPs follow the step inventory's ops (`decodetop.budget.inventory`) from the key alone, so a key a
probe measured and a key a what-if asks for are priced the same way (`tests/budget/test_keywork.py` checks them
against the inventory). Roofline time = max(bytes / memory bandwidth, FLOPs / matrix peak of the dtype);
collectives take the roofline's collective time (latency + bus-bandwidth term).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from decodetop.budget.deployment import ACTIVATION_BYTES, KV_BYTES
from decodetop.budget.keys import (
    AllreduceKey,
    AttentionKey,
    GemmKey,
    KvcastKey,
    LaunchKey,
    MoeKey,
    NormKey,
    ProbeKey,
    RoutingKey,
    SamplingKey,
)
from decodetop.budget.quant import WeightFormat, bits_per_weight
from decodetop.budget.roofline import Hardware, collective_time_us

_FORMAT_OF_DTYPE = {
    "bf16": WeightFormat.BF16,
    "fp16": WeightFormat.FP16,
    "fp32": WeightFormat.FP32,
    "fp8": WeightFormat.FP8_TENSOR,
    "nvfp4": WeightFormat.NVFP4,
    "mxfp4": WeightFormat.MXFP4,
}
MATRIX_PEAK_FACTOR = {"fp8": 2.0, "nvfp4": 4.0}
"""Matrix peak of a dtype over BF16's: FP8 tensor cores run twice BF16's rate (NVIDIA H200 datasheet: FP8 3,958
against BF16 1,979 TFLOPS with sparsity), FP4 twice FP8's (the RTX PRO 6000 row of `decodetop.budget.gpus`: 4,000
FP4 AI TOPS with sparsity = 8 × its dense BF16). MXFP4 experts run weight-only with BF16 activations (BF16 rate)."""
DSA_INDEX_SCALE_GROUP = 128
"""One FP32 scale per 128 index-key values (the inventory's DSA layout, docs/reference/models.md §7)."""


@dataclass(frozen=True)
class KeyWork:
    """Bytes one instance of a key's op moves and the FLOPs it does, and the dtype whose matrix peak applies."""

    moved_bytes: float
    flops: float
    matrix_dtype: str = "bf16"


def weight_bytes_per_value(dtype: str) -> float:
    """Stored bytes per weight of a probe dtype (scales included: `decodetop.budget.quant.bits_per_weight`)."""
    fmt = _FORMAT_OF_DTYPE.get(dtype, WeightFormat.BF16)
    return bits_per_weight(fmt) / 8.0


def key_work(key: ProbeKey) -> KeyWork:
    """The work of one instance of `key` (collectives and launches move nothing the roofline prices by bandwidth)."""
    work = _WORK.get(type(key))
    if work is None:
        raise TypeError(f"no work model for {key!r}")
    return work(key)


def _norm_work(key: NormKey) -> KeyWork:
    rw = key.tokens * key.width * ACTIVATION_BYTES * (2 if key.op == "add_rmsnorm" else 1)
    return KeyWork(2.0 * rw, 4.0 * key.tokens * key.width)


def _routing_work(key: RoutingKey) -> KeyWork:
    weights = key.hidden * key.n_experts * weight_bytes_per_value(key.dtype)
    moved = weights + key.tokens * key.hidden * ACTIVATION_BYTES + key.tokens * key.n_experts * 4.0
    return KeyWork(moved, 2.0 * key.tokens * key.hidden * key.n_experts, key.dtype)


def _sampling_work(key: SamplingKey) -> KeyWork:
    weights = key.vocab_shard * key.hidden * weight_bytes_per_value(key.dtype)
    moved = weights + key.tokens * (key.hidden + key.vocab_shard) * ACTIVATION_BYTES
    return KeyWork(moved, 2.0 * key.tokens * key.hidden * key.vocab_shard, key.dtype)


def _kvcast_work(key: KvcastKey) -> KeyWork:
    return KeyWork(key.tokens * key.width * (ACTIVATION_BYTES + KV_BYTES.get(key.kv_dtype, 1)), 0.0)


def _collective_work(key: AllreduceKey) -> KeyWork:
    return KeyWork(float(key.bytes), 0.0)


def _launch_work(_key: LaunchKey) -> KeyWork:
    return KeyWork(0.0, 0.0)


def _gemm_work(key: GemmKey) -> KeyWork:
    weights = key.batch * key.n * key.k * weight_bytes_per_value(key.dtype)
    activations = key.batch * key.m * (key.k + key.n) * ACTIVATION_BYTES
    dtype = key.dtype if key.dtype in MATRIX_PEAK_FACTOR else "bf16"
    return KeyWork(weights + activations, 2.0 * key.batch * key.m * key.n * key.k, dtype)


def _attention_work(key: AttentionKey) -> KeyWork:
    """KV (and DSA index) bytes read over the attended tokens, the query read and the output written."""
    kvb = KV_BYTES.get(key.kv_dtype, 2)
    length = key.context + key.q_len
    m = key.batch * key.q_len
    if key.kind == "gqa":
        attended = min(length, key.window) if key.window else length
        kv = key.batch * attended * 2 * key.kv_heads * key.head_dim * kvb
        io = m * key.heads * (key.head_dim + key.v_head_dim) * ACTIVATION_BYTES
        flops = 2.0 * m * key.heads * attended * (key.head_dim + key.v_head_dim)
        return KeyWork(kv + io, flops)
    lora = key.kv_lora_rank or key.v_head_dim
    attended = min(length, key.index_topk) if key.index_topk else length
    kv = key.batch * attended * key.head_dim * kvb
    index = 0.0
    flops = 2.0 * m * key.heads * attended * (key.head_dim + lora)
    if key.index_topk:
        per_token = key.index_head_dim + 4 * math.ceil(key.index_head_dim / DSA_INDEX_SCALE_GROUP)
        index = key.batch * length * per_token
        flops += 2.0 * m * key.index_heads * length * key.index_head_dim
    io = m * key.heads * (key.head_dim + lora) * ACTIVATION_BYTES
    return KeyWork(kv + index + io, flops)


def attention_cache_bytes(key: AttentionKey) -> int:
    """Bytes of KV cache (and DSA index keys) an attention probe holds for `key`: every sequence's whole context,
    whatever a window or a top-k lets the kernel read (what the point costs in memory, and what its offsets span)."""
    kvb = KV_BYTES.get(key.kv_dtype, 2)
    tokens = key.batch * (key.context + key.q_len)
    if key.kind == "gqa":
        return tokens * 2 * key.kv_heads * key.head_dim * kvb
    per_token = key.head_dim * kvb
    if key.index_topk:
        per_token += key.index_head_dim + 4 * math.ceil(key.index_head_dim / DSA_INDEX_SCALE_GROUP)
    return tokens * per_token


def _moe_work(key: MoeKey) -> KeyWork:
    """The touched experts' gate_up and down weights, the tokens in and out; FLOPs of every routed token (an upper
    bound under EP, where only the local share of the routed tokens lands here: decode MoE is memory-bound)."""
    per_expert = 3.0 * key.hidden * key.intermediate * weight_bytes_per_value(key.dtype)
    if key.bias:
        per_expert += 3.0 * key.intermediate * ACTIVATION_BYTES
    moved = key.experts_active * per_expert + 2.0 * key.tokens * key.hidden * ACTIVATION_BYTES
    routed = key.tokens * min(key.top_k, max(1, key.experts_active))
    dtype = key.dtype if key.dtype in MATRIX_PEAK_FACTOR else "bf16"
    return KeyWork(moved, 2.0 * routed * 3 * key.hidden * key.intermediate, dtype)


_WORK: dict[type, Callable[[Any], KeyWork]] = {
    GemmKey: _gemm_work,
    AttentionKey: _attention_work,
    MoeKey: _moe_work,
    NormKey: _norm_work,
    RoutingKey: _routing_work,
    SamplingKey: _sampling_work,
    KvcastKey: _kvcast_work,
    AllreduceKey: _collective_work,
    LaunchKey: _launch_work,
}


def roofline_ms(key: ProbeKey, hardware: Hardware) -> float:
    """The fastest one instance of `key` can run on `hardware`, in ms (never 0: at least a nanosecond, so an
    efficiency is always defined)."""
    if isinstance(key, AllreduceKey):
        return max(1e-6, collective_time_us(key.collective, key.bytes, key.ranks, hardware) / 1e3)
    work = key_work(key)
    ms = work.moved_bytes / (hardware.mem_bandwidth_gbps * 1e9) * 1e3
    if hardware.bf16_dense_tflops:
        peak = hardware.bf16_dense_tflops * MATRIX_PEAK_FACTOR.get(work.matrix_dtype, 1.0)
        ms = max(ms, work.flops / (peak * 1e12) * 1e3)
    return max(1e-6, ms)
