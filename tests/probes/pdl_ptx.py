"""decodetop's PDL kernels compiled for sm_90 on the CPU (Triton's NVIDIA backend needs no GPU to compile), one
specialization of each, run in a subprocess without the interpreter by tests/probes/test_pdl.py: with `USE_GDC`
True the PTX waits (`griddepcontrol.wait`) before its first global load or store and lets the next grid start
(`griddepcontrol.launch_dependents`); with it False the PTX holds neither. Prints one JSON line per kernel.

    PYTHONPATH=src python3 tests/probes/pdl_ptx.py
"""

from __future__ import annotations

import importlib
import json
import re
import sys

import torch

from decodetop.budget.keys import AttentionKey, MoeKey, parse_key_id
from decodetop.probes.worker import attention, fused_moe
from decodetop.probes.worker.context import ProbeContext
from decodetop.probes.worker.kernels import common, dsa

GQA = (
    "attention:kind=gqa,batch=1,q_len=1,context={c},heads=64,kv_heads=8,head_dim=128,v_head_dim=128,"
    "kv_lora_rank=0,rope_dim=0,index_heads=0,index_head_dim=0,index_topk=0,window=0,kv_dtype=fp8"
)
DSA = (
    "attention:kind=mla+dsa,batch=1,q_len=1,context=4096,heads=8,kv_heads=1,head_dim=576,v_head_dim=512,"
    "kv_lora_rank=512,rope_dim=64,index_heads=32,index_head_dim=128,index_topk=2048,window=0,kv_dtype=bf16"
)
MOE = "moe:tokens=1,top_k=8,experts_local=256,experts_active=8,hidden=7168,intermediate=256,dtype=bf16,bias=0"
#: The kernels that opt in to PDL (`launch(..., pdl=True)`): every one of them must be collected here.
PDL_KERNELS = {
    "_gqa_split_kernel",
    "_gqa_combine_kernel",
    "_mla_split_kernel",
    "_mla_combine_kernel",
    "_mla_select_split_kernel",
    "_score_kernel",
    "_radix8_kernel",
    "_compact8_kernel",
    "_radix_pass_kernel",
    "_compact_kernel",
    "_carry8_kernel",
    "_compact8_carry_kernel",
    "_half8_select_kernel",
    "_half16_select_kernel",
    "_gate_up_kernel",
    "_gate_up_mma_kernel",
    "_down_kernel",
    "_combine_kernel",
}
#: The PDL kernels whose first global access may be a load before the wait of what was written at least two grids
#: back (the scores, `kernels.dsa._carry_keys`; the query, `kernels.mla_select`): their first store or atomic still
#: comes after it.
EARLY_LOADS = {"_compact8_carry_kernel", "_mla_select_split_kernel"}
POINTERS = {"bfloat16": "*bf16", "float8_e4m3fn": "*fp8e4nv", "float32": "*fp32", "int32": "*i32", "int64": "*i64"}
OPTIONS = ("num_warps", "num_stages", "launch_pdl")
GLOBAL_ACCESS = re.compile(r"\b(ld|st|red|atom)(\.[a-z0-9]+)*\.global|\bcp\.async\.")
GLOBAL_WRITE = re.compile(r"\b(st|red|atom)(\.[a-z0-9]+)*\.global")


def requests(pdl: bool) -> dict[str, common.CompileRequest]:
    """One collected request per PDL kernel: GQA over an FP8 cache, GLM-5's DSA path under every radix scheme and
    fused MoE, on meta tensors sized for 132 SMs."""
    ctx = ProbeContext(rank=0, world_size=1, device=torch.device("meta"), backend="gloo")
    dsa_key = parse_key_id(DSA)
    moe_key = parse_key_id(MOE)
    assert isinstance(dsa_key, AttentionKey) and isinstance(moe_key, MoeKey)
    with common.collecting(132, pdl=pdl) as found:
        for key_id in (GQA.format(c=4096), DSA):
            key = parse_key_id(key_id)
            assert isinstance(key, AttentionKey)
            attention.launch_triton_once(key, key.context + 1, ctx)
        for scheme in dsa.SCHEMES:  # launch_triton_once above ran the one its context takes
            variant = attention.AttentionVariant(dsa_scheme=scheme)
            inputs = attention._mla_inputs(dsa_key, ctx, 4097, rotate=False)
            run, _, _ = attention._mla_triton(inputs, ctx.device, variant)
            run()
        fused_moe.launch_triton_once(moe_key, "no GPU", ctx)
    one: dict[str, common.CompileRequest] = {}
    for request in found.requests.values():
        one.setdefault(request.name, request)
    return one


def ptx(request: common.CompileRequest) -> str:
    """The request compiled for sm_90 (`triton.compile`, no launch)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = getattr(importlib.import_module(request.module), request.name)
    kwargs = dict(request.kwargs)
    signature: dict[str, str] = {}
    for name, arg in zip(fn.arg_names, request.args, strict=False):
        if isinstance(arg, common.TensorArg):
            signature[name] = POINTERS[arg.dtype]
        elif isinstance(arg, float):
            signature[name] = "fp32"
        else:
            assert isinstance(arg, int) and not isinstance(arg, bool), (name, arg)
            signature[name] = "i32" if -(2**31) <= arg < 2**31 else "i64"
    constexprs = {name: kwargs[name] for name in fn.arg_names[len(request.args) :]}
    signature |= dict.fromkeys(constexprs, "constexpr")
    options = {k: v for k, v in kwargs.items() if k in OPTIONS}
    source = ASTSource(fn=fn, signature=signature, constexprs=constexprs)
    return str(triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"])


def order(text: str) -> dict[str, int | None]:
    """Line numbers of the first wait, the first trigger, the first global access and the first global write."""
    lines = text.splitlines()
    wait = next((i for i, line in enumerate(lines) if "griddepcontrol.wait" in line), None)
    trigger = next((i for i, line in enumerate(lines) if "griddepcontrol.launch_dependents" in line), None)
    first = next((i for i, line in enumerate(lines) if GLOBAL_ACCESS.search(line)), None)
    write = next((i for i, line in enumerate(lines) if GLOBAL_WRITE.search(line)), None)
    return {"wait": wait, "trigger": trigger, "first_global": first, "first_write": write}


def main() -> int:
    for pdl in (True, False):
        found = requests(pdl)
        missing = PDL_KERNELS - set(found)
        assert not missing, f"not collected: {sorted(missing)}"
        for name in sorted(PDL_KERNELS):
            kwargs = dict(found[name].kwargs)
            row = {"kernel": name, "pdl": pdl, "USE_GDC": kwargs.get("USE_GDC"), "launch_pdl": "launch_pdl" in kwargs}
            row["early_loads"] = name in EARLY_LOADS
            print(json.dumps(row | order(ptx(found[name]))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
