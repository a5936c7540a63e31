"""A plan as Megatron-LM's arguments (``heterps export PLAN --to megatron --profile PROFILE``).

Megatron-LM builds a GPT as an embedding, ``--num-layers`` decoder layers and an output layer with the
loss, and cuts it into ``--pipeline-model-parallel-size`` stages; ``--pipeline-model-parallel-layout``
says which of them each stage holds, in its documented notation (``E`` the embedding, ``t`` a decoder
layer, ``L`` the output layer and loss, stages split by ``|``, ``X*n`` for ``n`` of ``X``, commas
cosmetic), so an uneven split is written as it is, never rounded. The profile's layer types say which
of the plan's layers is which: the first is the embedding, the last the output layer and the loss (with
the ``norm`` layers right before it: Megatron's final layer norm is part of ``L``), every other one of one
type, a decoder layer.

Megatron runs every stage at one tensor-parallel degree and one data-parallel degree (the replicas),
each replica at ``--micro-batch-size`` samples of a micro-batch; ``--global-batch-size`` is a step's
samples. Recomputation is one setting for every stage. What does not fit is refused, naming the stage.
"""

from __future__ import annotations

import re
import shlex

from heterps_cli.engines import ENGINES, placement, unfit
from heterps_cli.errors import InputError
from heterps_cli.figures import plural
from heterps_cli.formats import Plan, Profile


def layout(plan: Plan, profile: Profile, plan_path: str, profile_path: str) -> str:
    """``--pipeline-model-parallel-layout`` of the plan's stages (exit 2 where a layer is neither)."""
    types = {layer.name: layer.type for layer in profile.layers}
    names = [name for s in plan.stages for name in s.layers]
    if len(names) < 3 or any(n not in types for n in names):
        missing = [n for n in names if n not in types][:3]
        raise InputError(profile_path, None, "layers", f"does not give the plan's layers {missing or names}: "
                         "give the profile the plan was made from")  # fmt: skip
    tail = 1  # L: the output layer and the loss, with the final layer norm before it (Megatron's post-process)
    while tail < len(names) - 2 and types[names[-1 - tail]] == "norm":
        tail += 1
    ends = {"E": {names[0]}, "L": set(names[-tail:])}
    middle = {types[n] for n in names[1:-tail]}
    if len(middle) != 1:
        raise InputError(
            plan_path,
            None,
            "stages",
            "Megatron-LM builds an embedding, decoder layers of one kind and an output layer (after a final norm); "
            f"this plan's layers between those are of the types {sorted(middle)}: train it with heterps run",
        )
    if not set(names[-tail:]) <= set(plan.stages[-1].layers):
        held = ", ".join(names[-tail:])
        raise InputError(plan_path, None, "stages", f"the last stage must hold the final norm and the output layer "
                         f"({held}), as Megatron-LM's L does: re-plan, or train it with heterps run")  # fmt: skip
    stages = []
    for s in plan.stages:
        symbols = ["E" if n in ends["E"] else "L" if n in ends["L"] else "t" for n in s.layers]
        head = "E," if symbols[0] == "E" else ""
        last = ",L" if symbols[-1] == "L" else ""
        count = sum(1 for x in symbols if x == "t")
        body = f"t*{count}" if count > 1 else "t" * count
        stages.append((head + body + last).strip(","))
    return "|".join(stages)


def arguments(plan: Plan, profile: Profile, plan_path: str, profile_path: str, micro_batches: int) -> str:
    """The arguments, one flag a line, ready to paste after ``pretrain_gpt.py`` (exit 2 where :func:`unfit`
    finds anything)."""
    problems = unfit(plan, ENGINES["megatron"])
    if problems:
        raise InputError(plan_path, None, "stages", "Megatron-LM cannot run this plan as it is: " + "; ".join(problems)
                         + ". Re-plan with heterps plan --engine megatron, or train it with heterps run")  # fmt: skip
    first = plan.stages[0]
    split = layout(plan, profile, plan_path, profile_path)
    decoders = sum(int(n or 1) for n in re.findall(r"t(?:\*(\d+))?", split))
    flags = [
        ("--tensor-model-parallel-size", first.tp or 1),
        ("--pipeline-model-parallel-size", len(plan.stages)),
        ("--num-layers", decoders),
        ("--pipeline-model-parallel-layout", split),
        ("--micro-batch-size", plan.batch_size // first.replicas),
        ("--global-batch-size", plan.batch_size * micro_batches),
    ]
    if first.recompute:
        flags += [("--recompute-granularity", "full"), ("--recompute-method", "uniform"), ("--recompute-num-layers", 1)]
    precision = {"bf16": ["--bf16"], "fp16": ["--fp16"]}.get(plan.precision or "", [])
    names = [name for s in plan.stages for name in s.layers]
    tied = any({names[0], names[-1]} <= set(t.layers) for t in profile.ties or [])
    untied = [] if tied else ["--untie-embeddings-and-output-weights"]  # Megatron ties them by default
    lines = [f"{flag} {shlex.quote(str(value))}" for flag, value in flags] + precision + untied
    said = f"# {plan_path}: {plural(len(plan.stages), 'stage')} x {first.replicas} data-parallel x tp {first.tp or 1}"
    where = "".join(f"# {line}\n" for line in placement(plan))
    return said + "\n" + where + " \\\n".join(lines) + "\n"
