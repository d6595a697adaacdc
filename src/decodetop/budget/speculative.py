"""Provides a decode step that drafts with a separate draft model: the model verifying 1 + k tokens per sequence,
plus k steps of the draft model at one token per sequence (stdlib only).

    step = verify(model, q_len = 1 + k) + k × draft(draft model, q_len = 1)
    tokens per step = the accept length

The draft model's ops join the step's inventory with their count × k and their names marked "draft model …", in
the components they belong to, so the one composition prices them from the same curves (a small draft model's
shapes are usually transferred from the big model's: labelled so) and every surface shows where its time goes.
Engines run the draft with the model's TP where its heads split so (SGLang's EAGLE/standalone drafters), else on
one GPU; the draft's KV cache has the model's context.
"""

from __future__ import annotations

import dataclasses

from decodetop.budget.deployment import Deployment
from decodetop.budget.inventory import StepInventory, build_inventory
from decodetop.budget.spec import ModelSpec
from decodetop.errors import UserInputError


def draft_deployment(draft: ModelSpec, dep: Deployment) -> Deployment:
    """The draft model's deployment: one token per sequence, the model's batch and context, its TP where the draft's
    heads split so (else TP 1), no expert parallelism, no speculation of its own."""
    for tp in (dep.tp, 1):
        candidate = Deployment(
            tp=tp,
            batch=dep.batch,
            context_len=dep.context_len,
            kv_dtype=dep.kv_dtype,
            launch_mode=dep.launch_mode,
            allreduce=dep.allreduce,
        )
        try:
            candidate.validate(draft)
        except UserInputError:
            continue
        return candidate
    raise UserInputError(f"draft model {draft.name}: cannot be served at TP {dep.tp} or on one GPU")


def with_draft_model(verify: StepInventory, draft: ModelSpec) -> StepInventory:
    """`verify` (the model's step verifying 1 + k tokens, `Deployment.draft_model`) with `k` steps of `draft`."""
    dep = verify.deployment
    if not dep.speculative or not dep.draft_model:
        raise UserInputError("a draft model needs speculative decoding (--accept-length) with draft_model set")
    steps = dep.n_draft
    drafted = build_inventory(draft, draft_deployment(draft, dep))
    ops = tuple(
        dataclasses.replace(op, name=f"draft model {op.name}", count=op.count * steps, layers="draft")
        for op in drafted.ops
    )
    note = (
        f"Draft model {draft.name}: {steps} step(s) of one token per sequence at TP {drafted.deployment.tp}, "
        f"{drafted.resident_weight_bytes / 1e9:.3g} GB of weights per GPU beside the model's."
    )
    return dataclasses.replace(
        verify,
        ops=verify.ops + ops,
        resident_weight_bytes=verify.resident_weight_bytes + drafted.resident_weight_bytes,
        assumptions=(*verify.assumptions, note),
    )
