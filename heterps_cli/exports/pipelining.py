"""A plan as a ``torch.distributed.pipelining`` script (``heterps export PLAN --to pipelining``).

The script is the plan in PyTorch's own pipeline: ``S x R`` processes (``torchrun --nproc-per-node S*R``),
``R`` the replicas every stage has, each building its stage from the model's chain of layers as
``heterps run`` cuts it (the plan's layers, in its order), a :class:`~torch.distributed.pipelining.PipelineStage`
of it in its replica's pipeline (rank ``s * R + r``: stage ``s``, replica ``r``, the pipeline outermost as
the engines' meshes put it), and PyTorch's ``Schedule1F1B`` (the schedule section 1d charges) over the
plan's micro-batches, each replica training its ``B / R`` samples of each micro-batch of the plan's
``batch_size`` ``B``. The loss is the task's over each micro-batch, the schedule averaging the gradients
over them (its ``scale_grads``), and a stage's replicas average theirs (an all-reduce), so a step
trains what one process trains on the whole global batch.

What the engine cannot express is refused, naming the stage: replicas differing between stages,
tensor-parallel degrees, mixed stages, and recomputation.
"""

from __future__ import annotations

from heterps_cli.engines import ENGINES, unfit
from heterps_cli.errors import InputError
from heterps_cli.formats import Plan


def script(plan: Plan, plan_path: str, micro_batches: int) -> str:
    """The script's text (exit 2 where :func:`unfit` finds anything)."""
    problems = unfit(plan, ENGINES["pipelining"])
    if problems:
        raise InputError(
            plan_path,
            None,
            "stages",
            "torch.distributed.pipelining cannot run this plan as it is: " + "; ".join(problems) + ". Re-plan with "
            "heterps plan --engine pipelining (one replica count for every stage, tp 1, one type a stage, no "
            "recomputation), "
            "or train it with heterps run",
        )
    stages = [list(s.layers) for s in plan.stages]
    replicas = plan.stages[0].replicas
    return _TEMPLATE.format(
        plan=plan_path,
        stages=repr(stages),
        replicas=replicas,
        count=len(stages),
        processes=len(stages) * replicas,
        batch=plan.batch_size,
        micro_batches=micro_batches,
        splits=", ".join(repr(layers[0]) for layers in stages[1:]) or "none",
    )


_TEMPLATE = '''"""{plan} as torch.distributed.pipelining: {count} stages (split before layers {splits}) of
{replicas} replicas each, PyTorch's Schedule1F1B over {micro_batches} micro-batches of {batch} samples a step.
Written by heterps export.

    torchrun --standalone --nproc-per-node {processes} THIS.py --task FILE.py:FACTORY --steps N [--device cuda]

Rank s * {replicas} + r runs stage s, replica r. Rank 0 prints each step's loss (the mean over the step's
samples) as JSON lines: {{"step": k, "loss": x}}.
"""

import argparse
import json
import os

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

from heterps_cli.profiling.granularity import use_layers
from heterps_cli.runtime.chain import trace_chain
from heterps_cli.runtime.task import load_task_model

STAGES = {stages}  # each stage's layers, as the plan names them
REPLICAS = {replicas}  # every stage's
BATCH, MICRO_BATCHES = {batch}, {micro_batches}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--task", required=True, help="FILE.py:FACTORY, the heterps task the plan trains")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (NCCL, a GPU per process)")
    args = parser.parse_args()
    cuda = args.device == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world, count = dist.get_rank(), dist.get_world_size(), len(STAGES)
    if world != count * REPLICAS:
        raise SystemExit(f"the plan has {{count}} stages of {{REPLICAS}} replicas: run it with --nproc-per-node "
                         f"{{count * REPLICAS}}")
    index, replica = divmod(rank, REPLICAS)
    # every rank makes every group, in one order, as new_group asks
    pipes = [dist.new_group([s * REPLICAS + r for s in range(count)]) for r in range(REPLICAS)]
    peers = [dist.new_group([s * REPLICAS + r for r in range(REPLICAS)]) for s in range(count)]
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    torch.manual_seed(args.seed)
    samples_per_step = BATCH * MICRO_BATCHES
    task, model, samples = load_task_model(args.task, BATCH, samples_per_step, args.seed)
    chain = trace_chain(use_layers(model, [name for layers in STAGES for name in layers]))
    module = chain.stage(STAGES[index]).to(device).train()
    stage = PipelineStage(module, index, count, device, group=pipes[replica])
    schedule = Schedule1F1B(stage, MICRO_BATCHES, loss_fn=task.loss)
    optimiser = task.optimizer(module.parameters())
    share = BATCH // REPLICAS
    mine = torch.cat([torch.arange(i * BATCH + replica * share, i * BATCH + (replica + 1) * share)
                      for i in range(MICRO_BATCHES)])  # this replica's samples of each micro-batch
    for step in range(args.steps):
        x, y = samples.take(step, 0, samples_per_step)
        x, y = x[mine], y[mine]
        optimiser.zero_grad()
        losses = []
        if index == 0:
            schedule.step(x.to(device))
        elif index == count - 1:
            schedule.step(target=y.to(device), losses=losses)
        else:
            schedule.step()
        if REPLICAS > 1:  # the stage's replicas average their gradients, as DDP does
            for p in module.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad, group=peers[index])
                    p.grad.div_(REPLICAS)
        optimiser.step()
        loss = torch.zeros(1, device=device)
        if index == count - 1:
            loss += torch.stack([l.detach().float() for l in losses]).mean()
            dist.all_reduce(loss, group=peers[index])
            loss /= REPLICAS
        dist.broadcast(loss, src=(count - 1) * REPLICAS)
        if rank == 0:
            print(json.dumps({{"step": step + 1, "loss": float(loss.cpu())}}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
'''
