"""A writer of synthetic PyTorch-profiler-shaped traces, streamed to disk (tests and the trace benchmarks; no part of
the product).

The events mimic what torch.profiler writes for an eager decode step: a `ProfilerStep#N` user annotation per step,
`nn.Module` python_function frames, aten cpu_ops with `Input Dims`, `cudaLaunchKernel` runtime calls linked by
correlation id to kernels on stream 7, flow (`ac2g`) events and plain python_function frames (which the reader
drops). Kernel names are real ones from the H200 fixtures. The file is written event by event, so generating a
300 MB trace needs no more memory than reading one.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

GEMM = "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT"
LM_HEAD_GEMM = "nvjet_sm90_tst_256x8_64x6_2x1_v_bz_TNT"
ATTENTION = "cudnn_generated_fort_native_sdpa_sm80_flash_fprop_wmma_f16_knob_3_64x64x128_4x1x1_cga1x1x1_kernel0_0"
ADD = (
    "void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<c10::BFloat16>, "
    "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul>)"
)
RSQRT = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::rsqrt_kernel_cuda(at::TensorIteratorBase&)::"
    "{lambda()#2}::operator()() const::{lambda()#2}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul> >"
)
SILU = (
    "void at::native::vectorized_elementwise_kernel<8, at::native::(anonymous namespace)::silu_kernel("
    "at::TensorIteratorBase&)::{lambda()#1}::operator()() const::{lambda()#6}::operator()() const::"
    "{lambda(c10::BFloat16)#1}, std::array<char*, 3ul> >"
)
TOPK = "void vllm::moe::topk_softmax<8, 256>(float const*, bool const*, int*, float*, int*, int, int, int)"
FUSED_MOE = "fused_moe_kernel"
NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
ARGMAX = (
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<c10::BFloat16, at::native::ArgMaxOps<float>, "
    "unsigned int, long, 4, 4> >(at::native::ReduceOp<c10::BFloat16, at::native::ArgMaxOps<float>, unsigned int, "
    "long, 4, 4>)"
)


@dataclass(frozen=True)
class SynthSpec:
    """Shape of the synthetic decode: layers per step, timings (µs) and switches for the segmentation tests."""

    layers: int = 4
    hidden: int = 2048
    vocab: int = 32000
    kernel_us: float = 10.0
    launch_gap_us: float = 4.0
    step_gap_us: float = 300.0
    markers: bool = True
    marker_name: str = "ProfilerStep#{step}"
    """Name of the per-step user annotation ({step} is replaced by the step number)."""
    modules: bool = True
    extra_kernels_every_step: bool = False
    """Step k gets k extra elementwise kernels: kernel counts differ, so only gaps can split the steps."""
    moe: bool = False
    """MoE layers: router top-k, then fused_moe GEMMs around the activation, instead of the dense MLP."""
    allreduce: bool = False
    """Tensor-parallel layers: an NCCL all-reduce after attention and after the MLP."""
    allreduce_us: float | None = None
    """Duration of each all-reduce kernel (default `kernel_us`): a fast TP rank waits in it for a slow one."""
    long_first_step: int = 0
    """Kernels added to step 0 only (a prefill-like step among decode steps)."""
    odd_kernel: str | None = None
    """A kernel name no rule knows, launched once per step (tests that unclassified time is shown)."""


class _Writer:
    def __init__(self, out: IO[str], spec: SynthSpec) -> None:
        self.out = out
        self.spec = spec
        self.first = True
        self.corr = 1000
        self.ext = 1
        self.cpu_t = 1_000_000.0
        self.gpu_t = 1_000_000.0
        self.events = 0
        self.chars = 0

    def emit(self, event: dict[str, Any]) -> None:
        text = ("" if self.first else ",\n") + json.dumps(event, separators=(",", ":"))
        self.out.write(text)
        self.chars += len(text)
        self.first = False
        self.events += 1

    def span(self, cat: str, name: str, ts: float, dur: float, **args: Any) -> None:
        event: dict[str, Any] = {"ph": "X", "cat": cat, "name": name, "pid": 11, "tid": 11, "ts": ts, "dur": dur}
        if args:
            event["args"] = args
        self.emit(event)

    def kernel(self, name: str, dims: list[list[int]] | None, frames: list[str]) -> tuple[float, float]:
        """One aten op launching one kernel, inside `frames` (module names), in host and GPU time."""
        s = self.spec
        start = self.cpu_t
        self.cpu_t += s.launch_gap_us
        self.corr += 1
        self.ext += 1
        op_args: dict[str, Any] = {"External id": self.ext, "Record function id": 0, "Ev Idx": self.ext}
        if dims is not None:
            op_args["Input Dims"] = dims
            op_args["Input type"] = ["c10::BFloat16", "c10::BFloat16"]
        for frame in frames:  # a plain Python frame (dropped by the reader) and the module frame (kept)
            self.span("python_function", "torch/nn/modules/module.py(1780): _call_impl", start, s.launch_gap_us)
            self.span("python_function", frame, start, s.launch_gap_us - 0.2)
        op = "aten::mm" if dims is not None else "aten::add"
        self.span("cpu_op", op, start, s.launch_gap_us - 0.5, **op_args)
        launch_ts = start + 1.0
        self.span("cuda_runtime", "cudaLaunchKernel", launch_ts, 2.0, correlation=self.corr, cbid=211)
        self.gpu_t = max(self.gpu_t, launch_ts + 2.0)
        self.emit({"ph": "s", "id": self.corr, "pid": 11, "tid": 11, "ts": launch_ts, "cat": "ac2g", "name": "ac2g"})
        k_start = self.gpu_t
        dur = s.allreduce_us if name == NCCL and s.allreduce_us is not None else s.kernel_us
        self.span(
            "kernel",
            name,
            k_start,
            dur,
            **{"External id": self.ext, "device": 0, "stream": 7, "correlation": self.corr, "grid": [132, 1, 1]},
        )
        self.gpu_t += dur
        return start, self.cpu_t


def _layer_frames(spec: SynthSpec, step: int, layer: int) -> Iterator[tuple[str, list[list[int]] | None, str]]:
    h = spec.hidden
    yield RSQRT, None, "LlamaRMSNorm"
    for _ in range(4):
        yield GEMM, [[1, h], [h, h]], "LlamaAttention"
    yield ATTENTION, None, "LlamaAttention"
    if spec.allreduce:
        yield NCCL, None, ""
    yield ADD, None, ""
    yield RSQRT, None, "LlamaRMSNorm"
    if spec.moe:
        yield TOPK, None, "MixtralSparseMoeBlock"
        yield FUSED_MOE, None, "MixtralSparseMoeBlock"
        yield SILU, None, "MixtralSparseMoeBlock"
        yield FUSED_MOE, None, "MixtralSparseMoeBlock"
    else:
        yield GEMM, [[1, h], [h, 4 * h]], "LlamaMLP"
        yield SILU, None, "LlamaMLP"
        yield GEMM, [[1, 4 * h], [4 * h, h]], "LlamaMLP"
    if spec.allreduce:
        yield NCCL, None, ""
    yield ADD, None, ""


def write_synthetic_trace(path: str | Path, target_bytes: int, spec: SynthSpec | None = None) -> tuple[int, int]:
    """Write decode steps until the (uncompressed) JSON reaches `target_bytes`; returns (steps, events).

    A name ending in `.gz` is gzipped. Every step has `layers` × 12 kernels + final norm + lm_head + argmax
    (+ extras).
    """
    spec = spec or SynthSpec()
    path = Path(path)
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "wt", encoding="utf-8") as out:
        out.write('{"schemaVersion":1,"deviceProperties":[{"id":0,"name":"NVIDIA H200"}],"traceEvents":[\n')
        writer = _Writer(out, spec)
        written = 0
        step = 0
        while written < target_bytes or step < 2:
            step_start = writer.cpu_t
            first_ext = writer.ext
            for layer in range(spec.layers):
                for name, dims, module in _layer_frames(spec, step, layer):
                    frames = [f"nn.Module: {module}_{layer}"] if spec.modules and module else []
                    writer.kernel(name, dims, frames)
            writer.kernel(RSQRT, None, ["nn.Module: LlamaRMSNorm_99"] if spec.modules else [])  # final norm
            lm_frames = ["nn.Module: LlamaForCausalLM_0"] if spec.modules else []
            writer.kernel(LM_HEAD_GEMM, [[1, spec.hidden], [spec.hidden, spec.vocab]], lm_frames)
            writer.kernel(ARGMAX, None, [])
            extra = step if spec.extra_kernels_every_step else 0
            for _ in range(extra + (spec.long_first_step if step == 0 else 0)):
                writer.kernel(ADD, None, [])
            if spec.odd_kernel:
                writer.kernel(spec.odd_kernel, None, [])
            if spec.markers:
                dur = writer.cpu_t - step_start
                writer.span(
                    "user_annotation", spec.marker_name.format(step=step), step_start, dur, **{"External id": first_ext}
                )
            writer.cpu_t = max(writer.cpu_t, writer.gpu_t) + spec.step_gap_us
            writer.gpu_t = writer.cpu_t
            step += 1
            written = writer.chars
        out.write('\n],"traceName":"synthetic","displayTimeUnit":"ms"}\n')
    return step, writer.events
