"""``heterps run``: train with a plan on real processes (torch.distributed) and measure it.

:func:`run_plan` checks everything it can before a process starts (the plan's
layers against the model's chain, the device of every resource type, the
number of processes), then runs the plan locally (:mod:`.launch`) or as one
rank of a ``torchrun`` job, and reports measured against predicted (:mod:`.report`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

from heterps_cli.errors import InputError
from heterps_cli.progress import Progress, quiet

if TYPE_CHECKING:
    from heterps_cli.formats import Plan
    from heterps_cli.runtime.placement import Process
    from heterps_cli.runtime.report import RunReport

DEVICE = re.compile(r"cpu|cuda(:[0-9]+)?", re.ASCII)  # fullmatch: no trailing newline, no other digits
MAX_DEFAULT_MICRO_BATCHES = 64
DEFAULT_CHECKPOINT_EVERY = 100
DEFAULT_WARMUP = 2  # steps a run without a task takes first and does not measure


def check_options(
    model: str | None,
    task: str | None,
    checkpoint_dir: str | None,
    checkpoint_every: int | None,
    resume: bool,
    timeout_s: float | None = None,
) -> None:
    """What ``heterps run`` and ``heterps launch`` refuse of their options before any work: a timeout
    out of range, a model beside a task, checkpoint options without a folder, a model or task file that
    is not there, a checkpoint folder no save could use (:func:`.checkpoint.check_folder`)."""
    import heterps_cli.runtime.checkpoint as checkpoint

    if timeout_s is not None and not 1.0 <= timeout_s <= 86_400.0:  # gloo counts whole ms, up to a day here
        raise InputError(None, None, "timeout", f"must be 1 to 86,400 seconds (got {timeout_s!r})")
    if task is not None and model is not None:
        raise InputError(None, None, "--task", "a task gives its own model: leave --model out")
    if (checkpoint_every is not None or resume) and checkpoint_dir is None:
        raise InputError(None, None, "--checkpoint-dir", "--checkpoint-every and --resume need --checkpoint-dir")
    if checkpoint_dir is not None:
        checkpoint.check_folder(checkpoint_dir)
    for flag, spec in (("--model", model), ("--task", task)):
        where, sep, _ = (spec or "").rpartition(":")
        if sep and where.endswith(".py") and not os.path.isfile(where):
            raise InputError(where, None, flag, "file not found")


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
        if not sep or not name or not DEVICE.fullmatch(device):
            raise InputError(
                None, None, "--map", f"{entry!r} is not TYPE=cpu, TYPE=cuda or TYPE=cuda:N (e.g. --map v100=cuda:0)"
            )
        out[name] = device
    return out


def devices_for(types: list[str], mapping: dict[str, str]) -> dict[str, str]:
    """The device of every resource type the plan uses (:func:`mapped`), each GPU present here."""
    devices = mapped(types, mapping)
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


def mapped(types: list[str], mapping: dict[str, str], strict: bool = False) -> dict[str, str]:
    """The device of every resource type the plan uses; a type named ``cpu`` defaults to the CPU. With
    ``strict`` (``heterps launch``, whose scripts fail on every node at once), a mapped type the plan
    does not use is refused too: a misspelt type would leave the real one unmapped."""
    unknown = [t for t in mapping if t not in types] if strict else []
    if unknown:
        raise InputError(
            None,
            None,
            "--map",
            f"the plan uses no resource type {', '.join(unknown)}: its types are {', '.join(types)}",
        )
    missing = [t for t in types if t not in mapping and t != "cpu"]
    if missing:
        raise InputError(
            None,
            None,
            "--map",
            f"no device for resource type{'s' if len(missing) > 1 else ''} {', '.join(missing)}: say what each "
            f"means on this machine, e.g. {' '.join(f'--map {t}=cuda:0' for t in missing[:2])} (or =cpu)",
        )
    return {t: mapping.get(t, "cpu") for t in types}


def check_gpus_unshared(stages: list[list[tuple[str, int]]], devices: dict[str, str], gpus: int) -> None:
    """Refuse a local run that puts two replicas of one stage on one GPU: their gradients are summed
    over NCCL, which refuses two ranks on one device ("Duplicate GPU detected"). Locally rank ``r``
    mapped to ``cuda`` runs on ``cuda:(r mod gpus)``, ranks going stage by stage. Each stage is its
    parts, ``(resource, processes)`` (several where types mix, section 1i; a stage with a replica on the
    CPU sums over gloo, which minds no shared GPU)."""
    rank = 0
    for i, parts in enumerate(stages):
        on = []
        for resource, replicas in parts:
            device = devices[resource]
            on += [device if ":" in device or not device.startswith("cuda") else f"cuda:{(rank + j) % max(gpus, 1)}"
                   for j in range(replicas)]  # fmt: skip
            rank += replicas
        if len(on) > 1 and all(d.startswith("cuda") for d in on) and len(set(on)) < len(on):
            kinds = " and ".join(f"{n} of {r}" for r, n in parts)
            mapped = ", ".join(f"{r} to {devices[r]}" for r, _ in parts)
            raise InputError(
                None,
                None,
                "--map",
                f"stage {i} has {kinds} replicas, mapped {mapped}, but only {len(set(on))} GPU(s) for its "
                f"{len(on)} ({', '.join(sorted(set(on)))}): NCCL sums a stage's gradients and refuses two processes "
                "on one GPU. Map the type to cpu, run under torchrun with one GPU per process, or plan with a "
                "lower limit for it",
            )


def run_plan(
    plan_path: str,
    model: str | None = None,
    *,
    mapping: dict[str, str] | None = None,
    input_shape: tuple[int, ...] | None = None,
    steps: int = 10,
    warmup: int = DEFAULT_WARMUP,
    micro_batches: int | None = None,
    threads: int = 1,
    max_processes: int | None = None,
    seed: int = 0,
    lr: float = 0.01,
    timeout_s: float = 120.0,
    placed: bool = False,
    task: str | None = None,
    checkpoint_dir: str | None = None,
    checkpoint_every: int | None = None,
    resume: bool = False,
    progress: Progress | None = None,
) -> RunReport | None:
    """``heterps run``: train with the plan (one process per replica) and measure it against its
    prediction; a :class:`~.report.RunReport` (None on a torchrun rank other than 0). ``model``
    defaults to the one the plan names. With ``task`` (:mod:`.task`), the user's model, data, loss and
    optimiser train for ``steps`` steps in all (the first ``warmup`` of this run unmeasured); without,
    synthetic data trains for ``warmup`` + ``steps``. ``checkpoint_dir`` (:mod:`.checkpoint`): save
    every ``checkpoint_every`` steps and after the last; ``resume``: start from the newest there.
    (Over 60 lines by its signature alone: ``heterps run``'s options, one a line.)"""
    import heterps_cli.runtime.checkpoint as checkpoint
    from heterps_cli.loading import load_plan
    from heterps_cli.runtime.launch import launch_local, run_torchrun, torchrun_env
    from heterps_cli.runtime.precision import check_devices
    from heterps_cli.runtime.report import build_report
    from heterps_cli.runtime.worker import RunConfig

    report = progress or quiet
    check_options(model, task, checkpoint_dir, checkpoint_every, resume, timeout_s)
    plan, doc = load_plan(plan_path)
    model = task or model or plan.model  # a measured profile names its model as --model spells it
    devices = devices_for(plan.types_used, mapping or {})
    check_devices(plan.precision, devices, plan_path)  # the plan's precision, on every device a stage runs on
    env = torchrun_env()
    under_torchrun, coordinating = env is not None, env is None or env[0] == 0
    order = _processes(plan, plan_path, devices, placed, max_processes, under_torchrun)
    root = checkpoint.prepare(checkpoint_dir) if checkpoint_dir is not None else None
    report(f"loading {model} and checking it against the plan")
    M = micro_batches if micro_batches is not None else plan.micro_batches or default_micro_batches(len(plan.stages))
    check_runnable(plan, doc, model, task, input_shape=input_shape, micro_batches=M, seed=seed)
    total = steps if task is not None else warmup + steps
    shape = _shape(plan)
    meta = _checkpoint_meta(shape, M, seed, checkpoint.spec_identity(model))
    with _checkpoints(root, resume, meta, total, coordinating, report) as (start, resume_from, replanned):
        cfg = RunConfig(
            model=model,
            input_shape=input_shape,
            devices=devices,
            micro_batches=M,  # section 1d: the plan's own M unless given
            steps=steps,
            warmup=warmup,
            threads=threads,
            seed=seed,
            lr=lr,
            timeout_s=timeout_s,
            **shape,
            task=task,
            total_steps=total,
            start_step=start,
            checkpoint_dir=os.path.abspath(root) if root is not None else None,
            checkpoint_every=checkpoint_every or DEFAULT_CHECKPOINT_EVERY,
            resume_from=resume_from,
            resume_replanned=replanned,
            precision=plan.precision,
            checkpoint_meta=tuple(meta.items()),
        )
        result = run_torchrun(cfg, order, report) if under_torchrun else launch_local(cfg, report)
        if result is None:
            return None
        return build_report(plan_path, plan, model, result["ranks"], cfg.layout().micro_batches, task)


def _shape(plan) -> dict:
    """The plan's stages as :class:`~.worker.RunConfig` holds them: their types, replicas and layers, the
    batch, and per stage whether it recomputes, its tensor-parallel degree and (section 1i) its parts."""
    return {
        "batch_size": plan.batch_size,
        "stages": tuple((s.resource, s.replicas, tuple(s.layers)) for s in plan.stages),
        "recompute": tuple(bool(s.recompute) for s in plan.stages),
        "tp": tuple(s.tp or 1 for s in plan.stages),
        "parts": tuple(_parts(s) for s in plan.stages),
    }


def _checkpoint_meta(shape: dict, micro_batches: int, seed: int, model: str) -> dict:
    """What a checkpoint says of the run that wrote it, for a resumed run to match."""
    meta = {"stages": [[r, k, list(layers)] for r, k, layers in shape["stages"]], "batch_size": shape["batch_size"]}
    meta.update(micro_batches=micro_batches, seed=seed, model=model, tp=list(shape["tp"]))
    if any(shape["parts"]):  # section 1i: a checkpoint of a mixed stage is its replicas' of those types (and degrees)
        meta["parts"] = [[[t, k, n, *([d] if d > 1 else [])] for t, k, n, d in stage] for stage in shape["parts"]]
    return meta


def _parts(stage) -> tuple[tuple[str, int, int, int], ...]:
    """Section 1i: a mixed stage's parts as ``(type, replicas, samples, degree)``, its own first; () for one
    type."""
    return tuple((p.resource, p.replicas, p.samples, p.tp or 1) for p in stage.parts) if stage.joined else ()


@contextmanager
def _checkpoints(
    root: Path | None, resume: bool, meta: dict, total: int, coordinating: bool, report: Progress
) -> Iterator[tuple[int, str | None, bool]]:
    """Where the run starts (steps done, the checkpoint folder to resume from) while the checkpoint folder's
    lock is held (by the launcher, or rank 0 under torchrun): the newest checkpoint with ``resume``,
    else a folder without checkpoints (:func:`.checkpoint.refuse_fresh`)."""
    import heterps_cli.runtime.checkpoint as checkpoint
    from heterps_cli.runtime.whole import MODEL_FILE

    if root is None:
        yield 0, None, False
        return
    with checkpoint.locked(root) if coordinating else nullcontext():
        if not resume:
            if coordinating:
                checkpoint.refuse_fresh(root)
            yield 0, None, False
            return
        found = checkpoint.latest(root, meta)
        if found is None:
            report(f"no complete checkpoint in {root}: starting at step 1")
            yield 0, None, False
            return
        if found[2]:
            report(f"resuming {found[1]} under this plan: its weights and optimiser state re-cut from {MODEL_FILE}")
        if found[0] >= total:
            raise InputError(
                str(found[1]),
                None,
                "--steps",
                f"the checkpoint has done {found[0]} steps, and the run trains {total} in all: nothing left to "
                "train (raise --steps to train further)",
            )
        yield found[0], str(found[1]), found[2]


def single_process_losses(
    model: str, samples: int, steps: int, *, input_shape=None, seed: int = 0, lr: float = 0.01
) -> list[float]:
    """The losses of the same training in one process, the whole model at once, ``samples`` per step
    (a run's batch size times its micro-batches): what a run must match."""
    import torch

    from heterps_cli.profiling.measure import load_model
    from heterps_cli.runtime.chain import trace_chain
    from heterps_cli.runtime.synthetic import per_sample_loss, target_for

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


def task_losses(
    task: str, samples: int, steps: int, *, seed: int = 0, precision: str | None = None
) -> tuple[list[float], dict]:
    """The task trained in one process, the whole model at once, ``samples`` per step in the run's data
    order (:class:`~.task.Samples`): the losses a run must match, and the final weights. At ``precision``
    bf16 or fp16 as PyTorch's own mixed precision trains on the CPU: the forward and the loss under
    autocast, fp16's loss scaled by ``torch.amp.GradScaler``."""
    import contextlib

    import torch

    from heterps_cli.profiling.precision import HALF
    from heterps_cli.runtime.task import Samples, load_task

    torch.manual_seed(seed)
    loaded = load_task(task)
    data = Samples(loaded.data, samples, seed, loaded.shuffle)
    module = loaded.model.train()
    optimiser = loaded.optimizer(module.parameters())
    scaler = torch.amp.GradScaler("cpu", enabled=precision == "fp16")
    losses = []
    for step in range(steps):
        x, y = data.take(step, 0, samples)
        half = torch.autocast("cpu", dtype=HALF[precision]) if precision in HALF else contextlib.nullcontext()
        with half:
            loss = loaded.loss(module(x), y)
        optimiser.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimiser)
        scaler.update()
        losses.append(float(loss.detach()))
    return losses, module.state_dict()


def check_runnable(
    plan: Plan,
    doc,
    model: str,
    task: str | None,
    *,
    input_shape: tuple[int, ...] | None = None,
    micro_batches: int | None = None,
    seed: int = 0,
) -> None:
    """What ``run`` checks before any process starts, so that ``launch`` refuses what ``run`` would:
    the model (``task``'s, else ``model``) is a chain whose layers are the plan's, cut where the plan
    cuts; a tp stage holds linear layers to shard; a task's data, loss and optimiser work on a batch."""
    M = micro_batches if micro_batches is not None else plan.micro_batches or default_micro_batches(len(plan.stages))
    if task is not None:
        _check_task(plan, doc, task, M, seed)
    else:
        _check_model(plan, doc, model, input_shape, seed)


def _check_task(plan: Plan, doc, task: str, micro_batches: int, seed: int) -> None:
    """The task's model is a chain whose layers are the plan's; its data give (input, target) pairs its
    model and loss take; its optimiser builds one. Run here, on a batch, before any process starts."""
    import torch

    from heterps_cli.errors import SIGNALLED
    from heterps_cli.profiling.granularity import use_layers
    from heterps_cli.runtime.chain import check_plan_layers, trace_chain
    from heterps_cli.runtime.task import load_task_model
    from heterps_cli.runtime.tied import check_plan_ties

    torch.manual_seed(seed)
    loaded, model, samples = load_task_model(task, plan.batch_size, plan.batch_size * micro_batches, seed)
    names = [name for s in plan.stages for name in s.layers]
    chain = trace_chain(use_layers(model, names))
    check_plan_layers(chain, [s.layers for s in plan.stages], doc.path)
    _check_shardable(plan, doc, chain)
    check_plan_ties(plan, doc, chain)
    x, y = samples.take(0, 0, min(2, plan.batch_size))  # what the data raise is said by Samples
    try:
        loss = loaded.loss(chain.stage(chain.names)(x), y)
        if not (isinstance(loss, torch.Tensor) and loss.numel() == 1 and loss.requires_grad):
            raise TypeError(f"the loss must be a tensor of one value that requires grad, not {loss!r:.80}")
        made = loaded.optimizer([torch.nn.Parameter(torch.zeros(1))])
        if not isinstance(made, torch.optim.Optimizer):
            raise TypeError(f"the optimizer must build a torch.optim.Optimizer, not {type(made).__name__}")
    except SIGNALLED:
        raise
    except InputError:
        raise
    except Exception as exc:
        raise InputError(
            None, None, "--task", f"{task}: on its first two samples, {type(exc).__name__}: {exc}"
        ) from None


def _check_model(plan: Plan, doc, model: str, input_shape: tuple[int, ...] | None, seed: int) -> None:
    """The model is a chain whose layers are the plan's, in its order; a stage at tp > 1 (section 1h)
    holds linear layers to shard."""
    import torch

    from heterps_cli.profiling.granularity import use_layers
    from heterps_cli.profiling.measure import load_model
    from heterps_cli.runtime.chain import check_plan_layers, trace_chain
    from heterps_cli.runtime.tied import check_plan_ties

    torch.manual_seed(seed)
    names = [name for s in plan.stages for name in s.layers]
    chain = trace_chain(use_layers(load_model(model, plan.batch_size, input_shape), names))
    check_plan_layers(chain, [s.layers for s in plan.stages], doc.path)
    _check_shardable(plan, doc, chain)
    check_plan_ties(plan, doc, chain)


def _check_shardable(plan: Plan, doc, chain) -> None:
    """A stage at tp > 1 (section 1h), or whose parts run at several degrees (1i), holds linear layers to
    shard at its largest degree."""
    from heterps_cli.runtime.sharding import shardable

    for i, stage in enumerate(plan.stages):
        part, degree = max(((n, p.tp or 1) for n, p in enumerate(stage.parts)), key=lambda x: x[1])
        if degree == 1:
            continue
        if shardable(chain.stage(stage.layers), degree) is None:
            field = ("stages", i, "tp") if part == 0 else ("stages", i, "joined", part - 1, "tp")
            raise doc.error(
                field,
                f"stage {i} runs at tensor-parallel degree {degree}, but its layers hold no pair of linear "
                f"layers (a Linear, element-wise layers, a Linear) whose inner width {degree} divides, which is "
                "what heterps run shards (torch.distributed.tensor.parallel): plan that stage at tp 1",
            )


def _processes(
    plan: Plan, plan_path: str, devices: dict[str, str], placed: bool, max_processes: int | None, under_torchrun: bool
) -> list[Process] | None:
    """Refuse a plan these processes cannot run (a GPU shared, too many processes; a replica with no
    sample is refused where the plan is read, loading.load_plan); with ``placed``, the order
    torchrun's ranks take (docs/guide/running.md)."""
    import torch

    world = plan.processes  # a process per shard and joined replica
    if not under_torchrun and any(d.startswith("cuda") for d in devices.values()):
        check_gpus_unshared([list(s.units_by_type.items()) for s in plan.stages], devices, torch.cuda.device_count())
    order = None
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
