"""A plan as DeepSpeed's JSON config (``heterps export PLAN --to deepspeed``), for ``--deepspeed_config``.

DeepSpeed's pipeline engine runs a ``PipelineModule`` of ``num_stages`` stages over the data-parallel
replicas the world size leaves (one degree for every stage), without tensor parallelism of its own. The
config's batch fields are DeepSpeed's: ``train_micro_batch_size_per_gpu`` a replica's share of a
micro-batch, ``gradient_accumulation_steps`` the plan's micro-batches a step, and ``train_batch_size``
their product with the replicas (DeepSpeed checks that identity). The ``pipeline`` section (which
DeepSpeed's parser keeps as given) holds the stage count, each stage's first layer as ``parts`` (the
``PipelineModule``'s own attribute: stage ``s`` holds layers ``parts[s]`` to ``parts[s + 1] - 1``, so an
uneven split is written as it is), the layers' names, and ``activation_checkpoint_interval`` (1 where every
stage recomputes each layer, 0 where none does). ``PipelineModule``'s ``partition_method`` has no way to
take ``parts`` (DeepSpeed#2974): docs/guide/engines.md gives the few lines that set them.
"""

from __future__ import annotations

import json

from heterps_cli.engines import ENGINES, placement, unfit
from heterps_cli.errors import InputError
from heterps_cli.formats import Plan


def config(plan: Plan, plan_path: str, micro_batches: int) -> str:
    """The JSON text (exit 2 where the engine's rules do not fit the plan)."""
    problems = unfit(plan, ENGINES["deepspeed"])
    if problems:
        raise InputError(plan_path, None, "stages", "DeepSpeed cannot run this plan as it is: " + "; ".join(problems)
                         + ". Re-plan with heterps plan --engine deepspeed, or train it with heterps run")  # fmt: skip
    first = plan.stages[0]
    parts = [0]
    for s in plan.stages:
        parts.append(parts[-1] + len(s.layers))
    share = plan.batch_size // first.replicas
    out: dict = {
        "train_batch_size": share * micro_batches * first.replicas,
        "train_micro_batch_size_per_gpu": share,
        "gradient_accumulation_steps": micro_batches,
    }
    if plan.precision == "bf16":
        out["bf16"] = {"enabled": True}
    elif plan.precision == "fp16":
        out["fp16"] = {"enabled": True}
    out["pipeline"] = {
        "stages": len(plan.stages),
        "parts": parts,
        "layers": [list(s.layers) for s in plan.stages],
        "activation_checkpoint_interval": 1 if first.recompute else 0,
        "placement": placement(plan) or [f"every stage on {first.resource}"],
        "from": f"{plan_path}, by heterps export",
    }
    return json.dumps(out, indent=2) + "\n"
