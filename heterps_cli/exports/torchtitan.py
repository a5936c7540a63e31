"""A plan as torchtitan's job config (``heterps export PLAN --to torchtitan``), a TOML file for
``--job.config_file``.

torchtitan (its TOML ``JobConfig``, as in its 0.2 releases) runs a pipeline of
``[parallelism] pipeline_parallel_degree`` stages, each the modules of one ``module_fqns_per_model_part``
list (the plan's layer names: the model's own module names where ``heterps profile`` measured it), at
one ``tensor_parallel_degree`` and one ``data_parallel_replicate_degree`` (the plan's replicas, each a
whole copy of its stage; no sharding), under ``pipeline_parallel_schedule`` 1F1B (the schedule section
1d charges). Its batch sizes are per data-parallel rank: a step's ``global_batch_size`` is the plan's
micro-batches times its micro-batch, ``local_batch_size`` a replica's share of it, and
``pipeline_parallel_microbatch_size`` a replica's share of one micro-batch. ``[activation_checkpoint]
mode`` is ``full`` where every stage recomputes, ``none`` where none does. What does not fit is refused,
naming the stage.
"""

from __future__ import annotations

import json

from heterps_cli.engines import ENGINES, placement, unfit
from heterps_cli.errors import InputError
from heterps_cli.formats import Plan

PRECISION = {"bf16": "bfloat16", "fp32": "float32", "tf32": "float32", None: "float32"}


def config(plan: Plan, plan_path: str, micro_batches: int) -> str:
    """The TOML text (exit 2 where the engine's rules or its precisions do not fit the plan)."""
    if plan.precision not in PRECISION:
        raise InputError(plan_path, None, "precision", f"the plan trains at {plan.precision}; torchtitan trains "
                         "at bfloat16 or float32: plan from a profile at bf16, fp32 or tf32 (heterps profile "
                         "--precision), or train it with heterps run")  # fmt: skip
    problems = unfit(plan, ENGINES["torchtitan"])
    if problems:
        raise InputError(plan_path, None, "stages", "torchtitan cannot run this plan as it is: " + "; ".join(problems)
                         + ". Re-plan with heterps plan --engine torchtitan, or train it with heterps run")  # fmt: skip
    first = plan.stages[0]
    share = plan.batch_size // first.replicas
    parts = [list(s.layers) for s in plan.stages]
    lines = [
        f"# {plan_path} as torchtitan's job config: {len(parts)} stages x {first.replicas} data-parallel x tp "
        f"{first.tp or 1}. Written by heterps export.",
        *(f"# {line}" for line in placement(plan)),
        "",
        "[training]",
        f"local_batch_size = {share * micro_batches}",
        f"global_batch_size = {plan.batch_size * micro_batches}",
        f"mixed_precision_param = {json.dumps(PRECISION[plan.precision])}",
        "",
        "[parallelism]",
        f"pipeline_parallel_degree = {len(parts)}",
        f"tensor_parallel_degree = {first.tp or 1}",
        f"data_parallel_replicate_degree = {first.replicas}",
        "data_parallel_shard_degree = 1",
        'pipeline_parallel_schedule = "1F1B"',
        f"pipeline_parallel_microbatch_size = {share}",
        "module_fqns_per_model_part = [",
        *(f"    {json.dumps(part)}," for part in parts),
        "]",
        "",
        "[activation_checkpoint]",
        f'mode = "{"full" if first.recompute else "none"}"',
    ]
    return "\n".join(lines) + "\n"
