"""``heterps run``: train with a plan on real processes (torch.distributed) and measure it.

:func:`run_plan` checks everything it can before a process starts (the plan's
layers against the model's chain, the device of every resource type, the
number of processes), then runs the plan locally (:mod:`.launch`) or as one
rank of a ``torchrun`` job, and reports measured against predicted (:mod:`.report`).
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

from heterps_cli.errors import InputError
from heterps_cli.progress import Progress, quiet

if TYPE_CHECKING:
    from heterps_cli.formats import Plan
    from heterps_cli.runtime.placement import Process
    from heterps_cli.runtime.report import RunReport

DEVICE = re.compile(r"^(cpu|cuda(:\d+)?)$")
MAX_DEFAULT_MICRO_BATCHES = 64


def default_micro_batches(stages: int) -> int:
    """For a plan without micro_batches: the fill and drain idle a stage (S - 1) / (M + S - 1) of a
    step, with M = 16 (S - 1) that is 1/17 (6%) at any depth. One stage needs no pipeline. Capped, as
    a longer step only adds to the time between optimiser steps."""
    return max(1, min(16 * (stages - 1), MAX_DEFAULT_MICRO_BATCHES))


def parse_map(entries: list[str]) -> dict[str, str]:
    """``TYPE=DEVICE`` entries (``--map``) as a dict."""
    out: dict[str, str] = {}
    for entry in entries:
        name, sep, device = entry.partition("=")
        if not sep or not name or not DEVICE.match(device):
            raise InputError(
                None, None, "--map", f"{entry!r} is not TYPE=cpu, TYPE=cuda or TYPE=cuda:N (e.g. --map v100=cuda:0)"
            )
        out[name] = device
    return out


def devices_for(types: list[str], mapping: dict[str, str]) -> dict[str, str]:
    """The device of every resource type the plan uses; a type named ``cpu`` defaults to the CPU."""
    missing = [t for t in types if t not in mapping and t != "cpu"]
    if missing:
        raise InputError(
            None,
            None,
            "--map",
            f"no device for resource type{'s' if len(missing) > 1 else ''} {', '.join(missing)}: say what each "
            f"means on this machine, e.g. {' '.join(f'--map {t}=cuda:0' for t in missing[:2])} (or =cpu)",
        )
    devices = {t: mapping.get(t, "cpu") for t in types}
    if any(d.startswith("cuda") for d in devices.values()):
        import torch

        if not torch.cuda.is_available():
            raise InputError(None, None, "--map", "CUDA is not available on this machine: map the types to cpu")
        count = torch.cuda.device_count()
        for t, d in devices.items():
            if d.startswith("cuda:") and int(d[5:]) >= count:
                raise InputError(
                    None, None, "--map", f"{t}={d}: this machine has {count} GPU(s), cuda:0 to cuda:{count - 1}"
                )
    return devices


def check_gpus_unshared(stages: list[tuple[str, int]], devices: dict[str, str], gpus: int) -> None:
    """Refuse a local run that puts two replicas of one stage on one GPU: their gradients are summed
    over NCCL, which refuses two ranks on one device ("Duplicate GPU detected"). Locally rank ``r``
    mapped to ``cuda`` runs on ``cuda:(r mod gpus)``, ranks going stage by stage."""
    rank = 0
    for i, (resource, replicas) in enumerate(stages):
        device = devices[resource]
        if device.startswith("cuda") and replicas > 1:
            on = [device if ":" in device else f"cuda:{(rank + j) % max(gpus, 1)}" for j in range(replicas)]
            if len(set(on)) < replicas:
                raise InputError(
                    None,
                    None,
                    "--map",
                    f"stage {i} has {replicas} replicas of {resource}, mapped to {device}, but only "
                    f"{len(set(on))} GPU(s) for them here ({', '.join(sorted(set(on)))}): NCCL sums a stage's "
                    "gradients and refuses two processes on one GPU. Map the type to cpu, run under torchrun "
                    "with one GPU per process, or plan with a lower limit for it",
                )
        rank += replicas


def run_plan(
    plan_path: str,
    model: str | None = None,
    *,
    mapping: dict[str, str] | None = None,
    input_shape: tuple[int, ...] | None = None,
    steps: int = 10,
    warmup: int = 2,
    micro_batches: int | None = None,
    threads: int = 1,
    max_processes: int | None = None,
    seed: int = 0,
    lr: float = 0.01,
    timeout_s: float = 120.0,
    placed: bool = False,
    progress: Progress | None = None,
) -> RunReport | None:
    """``heterps run``: train with the plan (one process per replica) and measure it against its
    prediction; a :class:`~.report.RunReport` (None on a torchrun rank other than 0). ``model``
    defaults to the one the plan names."""
    from heterps_cli.formats import load_plan
    from heterps_cli.runtime.launch import launch_local, run_torchrun, torchrun_env
    from heterps_cli.runtime.report import build_report
    from heterps_cli.runtime.worker import RunConfig

    report = progress or quiet
    if not 1.0 <= timeout_s <= 86_400.0:  # gloo counts whole milliseconds, up to a day here
        raise InputError(None, None, "timeout", f"must be 1 to 86,400 seconds (got {timeout_s!r})")
    plan, doc = load_plan(plan_path)
    model = model or plan.model  # a measured profile names its model as --model spells it
    types = list(dict.fromkeys(s.resource for s in plan.stages))
    devices = devices_for(types, mapping or {})
    under_torchrun = torchrun_env() is not None
    order = _processes(plan, plan_path, devices, placed, max_processes, under_torchrun)
    report(f"loading {model} and checking it against the plan")
    _check_model(plan, doc, model, input_shape, seed)
    cfg = RunConfig(
        model=model,
        input_shape=input_shape,
        batch_size=plan.batch_size,
        stages=tuple((s.resource, s.replicas, tuple(s.layers)) for s in plan.stages),
        devices=devices,
        micro_batches=micro_batches
        if micro_batches is not None
        else plan.micro_batches or default_micro_batches(len(plan.stages)),  # section 1d: the plan's own M
        steps=steps,
        warmup=warmup,
        threads=threads,
        seed=seed,
        lr=lr,
        timeout_s=timeout_s,
        recompute=tuple(bool(s.recompute) for s in plan.stages),
        tp=tuple(s.tp or 1 for s in plan.stages),
    )
    result = run_torchrun(cfg, order) if under_torchrun else launch_local(cfg, report)
    if result is None:
        return None
    return build_report(plan_path, plan, model, result["ranks"], cfg.layout().micro_batches)


def single_process_losses(
    model: str, samples: int, steps: int, *, input_shape=None, seed: int = 0, lr: float = 0.01
) -> list[float]:
    """The losses of the same training in one process, the whole model at once, ``samples`` per step
    (a run's batch size times its micro-batches): what a run must match."""
    import torch

    from heterps_cli.profiling.measure import load_model
    from heterps_cli.runtime.chain import trace_chain
    from heterps_cli.runtime.worker import per_sample_loss, target_for

    torch.manual_seed(seed)
    loaded = load_model(model, samples, input_shape)
    chain = trace_chain(loaded)
    module = chain.stage(chain.names).train()
    optimiser = torch.optim.SGD(module.parameters(), lr=lr)
    target = target_for(chain.outputs[-1].shape, samples, seed)
    losses = []
    for _ in range(steps):
        loss = per_sample_loss(module(loaded.inputs[0]), target, samples)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(float(loss.detach()))
    return losses


def _check_model(plan: Plan, doc, model: str, input_shape: tuple[int, ...] | None, seed: int) -> None:
    """The model is a chain whose layers are the plan's, in its order; a stage at tp > 1 (section 1h)
    holds linear layers to shard."""
    import torch

    from heterps_cli.profiling.granularity import use_layers
    from heterps_cli.profiling.measure import load_model
    from heterps_cli.runtime.chain import check_plan_layers, trace_chain
    from heterps_cli.runtime.sharding import shardable

    torch.manual_seed(seed)
    names = [name for s in plan.stages for name in s.layers]
    chain = trace_chain(use_layers(load_model(model, plan.batch_size, input_shape), names))
    check_plan_layers(chain, [s.layers for s in plan.stages], doc.path)
    for i, stage in enumerate(plan.stages):
        if not stage.tp:
            continue
        if shardable(chain.stage(stage.layers), stage.tp) is None:
            raise doc.error(
                ("stages", i, "tp"),
                f"stage {i} runs at tensor-parallel degree {stage.tp}, but its layers hold no pair of linear "
                f"layers (a Linear, element-wise layers, a Linear) whose inner width {stage.tp} divides, which is "
                "what heterps run shards (torch.distributed.tensor.parallel): plan that stage at tp 1",
            )


def _processes(
    plan: Plan, plan_path: str, devices: dict[str, str], placed: bool, max_processes: int | None, under_torchrun: bool
) -> list[Process] | None:
    """Refuse a plan these processes cannot run (a GPU shared, too many processes; a replica with no
    sample is refused where the plan is read, formats.load_plan); with ``placed``, the order
    torchrun's ranks take (docs/guide/running.md)."""
    import torch

    world = sum(s.units for s in plan.stages)  # section 1h: a process per shard
    if not under_torchrun and any(d.startswith("cuda") for d in devices.values()):
        check_gpus_unshared([(s.resource, s.units) for s in plan.stages], devices, torch.cuda.device_count())
    order = None
    if placed and any(s.tp for s in plan.stages):
        raise InputError(
            plan_path, None, "--placed", "--placed does not place tensor-parallel replicas (tp in the plan) yet"
        )
    if placed:
        from heterps_cli.runtime.placement import processes

        if not under_torchrun:
            why = "heterps launch writes the commands; here heterps run starts every process itself"
            raise InputError(None, None, "--placed", f"--placed is for a run under torchrun, one node each ({why})")
        try:
            order = processes(plan.stages)
        except ValueError as exc:
            raise InputError(plan_path, None, "stages", f"--placed: {exc} (plan on a cluster with nodes)") from None
    limit = max_processes if max_processes is not None else (os.cpu_count() or 1)
    if not under_torchrun and world > limit:
        raise InputError(
            plan_path,
            None,
            "stages",
            f"the plan runs as {world} processes (one per replica, or per shard of a tensor-parallel replica), "
            f"more than --max-processes {limit}: "
            "raise --max-processes, run it on a cluster under torchrun, or plan with lower limits",
        )
    return order
