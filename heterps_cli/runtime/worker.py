"""One process of a run: one replica of one stage, trained with a 1F1B schedule, and timed.

Every step, the batch's micro-batches go through the stage in the 1F1B order
(docs/spec.md section 1d): as many forwards as there are stages after this one,
then one forward and one backward in turn, then the last backwards; activations
come in from the stage before and go out to the stage after, by interval
overlap (:mod:`heterps_cli.runtime.layout`), and gradients the other way. A
micro-batch's activations are kept only until its backward. After the last
backward the stage's replicas sum their gradients and each takes the same
optimiser step: a flush, so training is synchronous and the loss is that of one
process running the whole model.

The loss of a sample is the mean squared error between the model's output and a
fixed random target (:mod:`.synthetic`); a replica's loss is the sum over its samples divided by the
samples of the whole step. Summing gradients over replicas therefore gives exactly the
gradient of the whole batch's mean loss, even when shards differ in size. With a
task (``--task``, :mod:`.task`), the samples and targets are the task's, read a step
at a time, and the loss is the task's mean over a replica's share, weighted by that
share of the step: the same sum.

Times per step: ``compute`` (the stage's layers, forward and backward),
``wait`` (blocked receiving activations or gradients, or until the neighbour has
received what this replica sent: the neighbour's work, the pipeline's fill and
drain, and the transfer itself), ``sync`` (the gradient all-reduce among the
stage's replicas), ``data`` (reading a task's samples), ``update`` (the optimiser
step and the gradients' reset), and ``idle`` (the rest of the step: Python between
the pieces).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.checkpoint import checkpoint

from heterps_cli.runtime.layout import Layout, layout
from heterps_cli.runtime.precision import Precision
from heterps_cli.runtime.sharding import block_dims, boundary_parts, local_of, part_length, shardable, whole_of
from heterps_cli.runtime.synthetic import per_sample_loss, target_for
from heterps_cli.runtime.tied import ReplicaBuffers, TiedSums, drop_copies, fill_copies
from heterps_cli.runtime.whole import MODEL_FILE, OPTIMIZER_FILE, Names, gather, names_of, stage_part


@dataclass(frozen=True)
class RunConfig:
    """What every process needs to know; picklable, the same for every rank."""

    model: str
    input_shape: tuple[int, ...] | None
    batch_size: int
    stages: tuple[tuple[str, int, tuple[str, ...]], ...]  # (resource, replicas, layers)
    devices: dict[str, str]  # resource type -> cpu, cuda or cuda:i
    micro_batches: int
    steps: int
    warmup: int
    threads: int = 1
    seed: int = 0
    lr: float = 0.01
    timeout_s: float = 120.0
    recompute: tuple[bool, ...] = ()  # docs/spec.md section 1g: per stage (none: no stage recomputes)
    tp: tuple[int, ...] = ()  # section 1h: processes per replica, per stage (none: one each)
    parts: tuple[
        tuple[tuple[str, int, int, int], ...], ...
    ] = ()  # section 1i: per stage, (type, replicas, samples, tp)
    task: str | None = None  # FILE.py:FACTORY (runtime.task): the user's model, data, loss and optimiser
    total_steps: int | None = None  # steps trained in all, from step 0 (default: warmup + steps)
    start_step: int = 0  # the steps a resumed run's checkpoint had done
    checkpoint_dir: str | None = None
    checkpoint_every: int = 100
    resume_from: str | None = None  # the checkpoint folder to start from
    resume_replanned: bool = False  # written under another plan: resumed from its model.pt (runtime.whole)
    precision: str | None = None  # the plan's (runtime.precision): autocast for bf16 and fp16, TF32 for tf32
    checkpoint_meta: tuple[tuple[str, object], ...] = ()  # what complete.json says of the run
    progress_file: str | None = None  # locally: where the reporting rank writes its line per step

    @property
    def last_step(self) -> int:
        return self.total_steps if self.total_steps is not None else self.warmup + self.steps

    def layout(self) -> Layout:
        stages = [(r, k, list(layers)) for r, k, layers in self.stages]
        return layout(stages, self.batch_size, self.micro_batches, self.tp, self.parts)


@dataclass
class Times:
    """Each measured step's seconds, by what they were spent on (:mod:`.report` reads them)."""

    compute: list[float] = field(default_factory=list)
    wait: list[float] = field(default_factory=list)
    sync: list[float] = field(default_factory=list)
    data: list[float] = field(default_factory=list)
    update: list[float] = field(default_factory=list)
    wall: list[float] = field(default_factory=list)

    def add(self, compute: float, wait: float, sync: float, data: float, update: float, wall: float) -> None:
        for kept, seconds in zip(dataclasses.fields(self), (compute, wait, sync, data, update, wall)):
            getattr(self, kept.name).append(seconds)


def device_for(name: str, local_rank: int | None) -> torch.device:
    """``cuda`` alone means this process's own GPU: the local rank's, modulo the GPUs present."""
    if name == "cuda":
        count = torch.cuda.device_count()
        return torch.device("cuda", (local_rank or 0) % max(count, 1))
    return torch.device(name)


def _generators(device: torch.device) -> dict:
    return {"cpu": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}


def _synchronise(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory(device: torch.device) -> tuple[float, str]:
    """Bytes this process held at its peak, and what that figure is: CUDA, the allocator's peak over the
    measured steps (tensors only); CPU, the process's peak resident memory since
    :func:`baseline_memory` (Linux's VmHWM, reset there), which also counts the interpreter, torch
    and the warm-up steps; elsewhere since the process started (ru_maxrss)."""
    if device.type == "cuda":
        return float(torch.cuda.max_memory_allocated(device)), "CUDA allocator peak"
    try:
        with open("/proc/self/status") as status:
            kib = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
        return float(kib) * 1024, "peak resident memory since the model was built (VmHWM)"
    except (OSError, ValueError, IndexError, StopIteration):
        import resource

        return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024, "peak resident memory (ru_maxrss)"


def baseline_memory(device: torch.device) -> float:
    """Bytes this process holds before its stage's model is built, in :func:`peak_memory`'s measure:
    on CPU the interpreter, torch and the process group (the part ``memory_reserved_gb`` stands
    for); on CUDA the allocator's tensors so far (none). On Linux it also resets the process's
    peak to what is resident now, so that a higher peak while torch was imported cannot stand in
    for the stage's."""
    if device.type == "cuda":
        return float(torch.cuda.memory_allocated(device))
    try:
        with open("/proc/self/statm") as statm:
            resident = float(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return peak_memory(device)[0]  # no /proc: the peak so far, an upper bound on what is resident now
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")  # resets VmHWM (Linux 4.0 and later)
    except OSError:
        pass
    return resident


def gradient_buckets(params: Sequence[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """Flat tensors, one per dtype, that every parameter's ``.grad`` is a view into, so the stage's
    all-reduce runs in place: packing the gradients into a fresh tensor and unpacking them again
    each step cost more than the all-reduce itself on a CPU (new pages each time), a cost the
    model does not charge. DDP's ``gradient_as_bucket_view`` does the same."""
    buckets = []
    for dtype in dict.fromkeys(p.dtype for p in params):
        members = [p for p in params if p.dtype == dtype]
        flat = torch.zeros(sum(p.numel() for p in members), dtype=dtype, device=device)
        offset = 0
        for p in members:
            p.grad = flat[offset : offset + p.numel()].view_as(p)
            offset += p.numel()
        buckets.append(flat)
    return buckets


def shard_stage(module: nn.Module, group, device: torch.device, what: str, width: int) -> None:
    """Shard ``module``'s :func:`matrix_pairs` over ``group``, ``width`` processes
    (torch.distributed.tensor.parallel); the rest of its layers run whole on every shard (``heterps run``
    checked that it has some)."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    pairs = shardable(module, width)
    assert pairs is not None, f"{what} has no linear layers to shard"
    mesh = DeviceMesh.from_group(group, device.type)
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    parallelize_module(module, mesh, {name: styles[style]() for name, style in pairs.items()})


def _run_id() -> str:
    """This run's id, rank 0's random one on every rank: what each checkpoint file carries."""
    import uuid

    said = [uuid.uuid4().hex if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(said, src=0)
    return str(said[0])


def train(rank: int, cfg: RunConfig, local_rank: int | None = None) -> dict:
    """Run this rank's part of ``cfg`` in an initialised process group; what it measured. The first
    ``warmup`` steps this process runs are not measured (at least one is, where it runs any)."""
    replica = _Replica(rank, cfg, local_rank)
    first, last = cfg.start_step, cfg.last_step
    measured_from = first + min(cfg.warmup, max(0, last - first - 1))
    for step in range(first, last):
        if step == measured_from:
            dist.barrier()
            if replica.device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(replica.device)
        replica.step(step, measured=step >= measured_from)
        if cfg.checkpoint_dir and ((step + 1) % cfg.checkpoint_every == 0 or step + 1 == last):
            replica.sums.tied.check_equal()
            replica.checkpoints.save(replica.module, replica.optimiser, step + 1)
    dist.barrier()
    return {**_result(replica), "tied": replica.sums.tied.digests()}  # section 1j: is each tied tensor one?


def _process_groups(lay: Layout, devices: dict[str, str]) -> tuple[dict, dict, dict]:
    """Every rank creates every stage's groups, in the same order (torch.distributed requires it): per
    stage and block, the replicas that sum its gradients; per replica at tp > 1, its shards; per stage
    of several degrees, all its processes, which sum what every shard holds whole."""
    sync_groups, shard_groups, whole_groups = {}, {}, {}
    for s in lay.stages:
        on_gpus = all(devices[s.kind(r)].startswith("cuda") for r in range(s.replicas))
        backend = "nccl" if on_gpus else "gloo"  # section 1i: a stage on CPUs and GPUs sums on the hosts
        for i in range(s.blocks) if s.replicas > 1 else ():
            sync_groups[s.index, i] = dist.new_group(s.data_parallel(i), backend=backend)
        for r in range(s.replicas):
            if s.width(r) > 1:
                shard_groups[s.index, r] = dist.new_group(s.members(r), backend=backend)
        if s.uneven:
            everyone = list(range(s.first_rank, s.first_rank + s.processes))
            whole_groups[s.index] = dist.new_group(everyone, backend=backend)
    return sync_groups, shard_groups, whole_groups


def _model_of(cfg: RunConfig, lay: Layout):
    """The whole model every process builds (its stage is cut from it): the task's, with the task and its
    samples, or the zoo's or the user's module (no task, no samples)."""
    from heterps_cli.profiling.measure import load_model

    if cfg.task is not None:
        from heterps_cli.runtime.task import load_task_model

        return load_task_model(cfg.task, lay.batch_size, lay.samples, cfg.seed)
    return None, load_model(cfg.model, lay.samples, cfg.input_shape), None


class _Boundaries:
    """This process's sends and receives across its stage's boundaries: with each overlapping replica of
    the stage before and after, its part of the micro-batch (section 1h: a sharded replica's shards
    share the sends, and gather what they receive inside the node)."""

    def __init__(self, lay: Layout, stage, replica: int, tp_rank: int, device: torch.device, shard_group):
        self.lay, self.stage, self.replica, self.tp_rank = lay, stage, replica, tp_rank
        self.width, self.device, self.shard_group = stage.width(replica), device, shard_group
        self.handles: list = []  # this step's sends, waited on before the all-reduce

    def receive(self, source_stage, j: int, tag: int, boundary) -> tuple[torch.Tensor, float]:
        """This process's part of each overlapping replica's tensor, from the shard of it that sends that
        part; at tp > 1 the replica's shards then gather the whole inside the node (section 1h)."""
        pieces, waited, d = [], 0.0, self.width
        for r, lo, hi in self.lay.overlapping(self.stage, self.replica, source_stage, j):
            shape = (hi - lo, *boundary.shape)
            mine = torch.empty(part_length(shape, d) if d > 1 else shape, dtype=boundary.dtype)
            start = time.perf_counter()
            src = source_stage.first_of(r) + self.tp_rank % source_stage.width(r)
            dist.recv(mine, src=src, tag=tag)
            if d > 1:
                mine = mine.to(self.device)
                parts = [torch.empty_like(mine) for _ in range(d)]
                dist.all_gather(parts, mine, group=self.shard_group)
                pieces.append(whole_of(parts, shape))
            else:
                pieces.append(mine.reshape(shape))
            waited += time.perf_counter() - start
        return torch.cat(pieces).to(self.device), waited

    def send(self, tensor: torch.Tensor, offset: int, target_stage, j: int, tag: int) -> None:
        """Each process of each overlapping replica of ``target_stage`` its part (section 1h); a sharded
        replica's shards hold the same activations and gradients at its boundaries, so they share the
        sends: part ``c`` from shard ``c mod tp``."""
        host = tensor.detach().cpu()
        for r, lo, hi in self.lay.overlapping(self.stage, self.replica, target_stage, j):
            parts = boundary_parts(host[lo - offset : hi - offset], target_stage.width(r))
            for c, part in enumerate(parts):
                if c % self.width == self.tp_rank:
                    self.handles.append(dist.isend(part, dst=target_stage.first_of(r) + c, tag=tag))

    def wait(self) -> float:
        """The seconds until this step's sends are received (waiting on them, like a receive)."""
        start = time.perf_counter()
        for handle in self.handles:
            handle.wait()
        self.handles.clear()
        return time.perf_counter() - start


class _Sums:
    """What this process sums with the others of its stage: the gradients after a step's backward
    passes, and the step's loss."""

    def __init__(
        self, module: nn.Module, dims: dict, stage, held: Sequence[int], width: int, device, sync, whole, tied
    ):
        self.tied = tied  # section 1j: the tensors this stage shares with others, summed over all their holders
        params = [p for p in module.parameters() if p.requires_grad and id(p) not in tied.held]
        self.module, self.dims, self.width = module, dims, width
        self.group = sync.get((stage.index, held[0]))
        # section 1i: at several degrees, each block of a sharded weight is summed among its holders
        self.block_groups = [sync[stage.index, j] for j in held] if stage.uneven else []
        self.whole_group = whole.get(stage.index)
        # section 1j: the first replica's buffers; at several degrees (1i) among all the stage's processes
        self.replica_buffers = (
            ReplicaBuffers(module, self.whole_group, stage.first_rank)
            if stage.uneven
            else ReplicaBuffers(module, self.group, stage.data_parallel(held[0])[0])
        )
        # A sharded parameter's gradient is a DTensor, which a flat bucket cannot view: summed one by one.
        self.params = params if stage.blocks > 1 else []
        one_by_one = self.group is None or stage.blocks > 1
        self.buckets = gradient_buckets(params, device) if not one_by_one else []

    def gradients(self) -> None:
        """Every gradient summed among the replicas that hold it."""
        for bucket in self.buckets:
            dist.all_reduce(bucket, group=self.group)
        if self.block_groups:
            self.blocks()
        elif self.group is not None:  # section 1h: each shard's gradients, with the same shard of the others
            for p in self.params:
                if p.grad is not None:
                    dist.all_reduce(local_of(p.grad), group=self.group)
        self.tied.gradients()
        self.buffers()

    def buffers(self) -> None:
        """Once the step's forwards are done: the first replica's buffers where a forward changed them, and
        each buffer shared with other stages as its first holder's stage has it (section 1j)."""
        self.replica_buffers.after_step()
        self.tied.after_step()

    def blocks(self) -> None:
        """Section 1i, a stage whose replicas run at several degrees: each block of a sharded weight's
        gradient summed among the processes that hold it, one per replica; a weight every shard holds whole,
        among all the stage's processes, each a ``1/tp`` of its replica's (the degrees are powers of two:
        exact)."""
        for name, p in self.module.named_parameters():
            if p.grad is None:
                continue
            grad = local_of(p.grad)
            dim = self.dims.get(name)
            if dim is None:
                grad.div_(self.width)
                dist.all_reduce(grad, group=self.whole_group)
                continue
            for chunk, group in zip(grad.tensor_split(len(self.block_groups), dim=dim), self.block_groups):
                block = chunk.contiguous()
                dist.all_reduce(block, group=group)
                chunk.copy_(block)

    def loss(self, loss: torch.Tensor) -> None:
        """The step's loss summed over the last stage's replicas' shares, in place."""
        if self.whole_group is not None:  # section 1i: every process of the stage, each its replica's 1/tp
            dist.all_reduce(loss.div_(self.width), group=self.whole_group)
        elif self.group is not None:
            dist.all_reduce(loss, group=self.group)


class _TaskData:
    """The task's samples this replica trains, a step's read at its first micro-batch, in one read
    (:meth:`~.task.Samples.take_each`)."""

    def __init__(self, samples, lay: Layout, stage, replica: int, device: torch.device):
        self.samples, self.lay, self.stage, self.replica, self.device = samples, lay, stage, replica, device
        self.read_step = -1  # the step whose samples are read, and each micro-batch's
        self.read: list[tuple[torch.Tensor, torch.Tensor]] = []

    def take(self, step: int, j: int) -> tuple[torch.Tensor, torch.Tensor, float]:
        """Micro-batch ``j`` of step ``step``: its inputs and targets, on the device, and the seconds that
        took."""
        start = time.perf_counter()
        if self.read_step != step:
            shards = [self.lay.shard(self.stage, self.replica, i) for i in range(self.lay.micro_batches)]
            self.read = self.samples.take_each(step, shards)
            self.read_step = step
        x, y = self.read[j]
        x, y = x.to(self.device), y.to(self.device)
        return x, y, time.perf_counter() - start


class _Synthetic:
    """The data of a run without a task: the model's example inputs, on the first stage, and a fixed
    target, on the last, each on the device from the start, as a loader that prefetches leaves them (a
    pageable copy per micro-batch took mlp's H100 step 1.5x)."""

    def __init__(self, inputs: torch.Tensor | None, target: torch.Tensor | None, lay: Layout, stage, replica: int):
        self.inputs, self.target, self.lay, self.stage, self.replica = inputs, target, lay, stage, replica

    def take(self, step: int, j: int) -> tuple[torch.Tensor | None, torch.Tensor | None, float]:
        """Micro-batch ``j``'s inputs (on the first stage) and target (on the last): every step's the same."""
        a, b = self.lay.shard(self.stage, self.replica, j)
        inputs = self.inputs[a:b] if self.inputs is not None else None
        return inputs, self.target[a:b] if self.target is not None else None, 0.0


class _Checkpoints:
    """This process's part of the run's checkpoints (:mod:`.checkpoint`)."""

    def __init__(self, cfg: RunConfig, lay: Layout, rank: int, stage, replica: int, tp_rank: int, device, crossing):
        self.cfg, self.lay, self.rank, self.stage, self.replica, self.tp_rank = cfg, lay, rank, stage, replica, tp_rank
        self.width, self.device, self.crossing = stage.width(replica), device, crossing
        self.run_id = _run_id() if cfg.checkpoint_dir else None
        self.names: Names | None = None  # the model's own names of every stage's tensors (:meth:`resume`)

    def resume(self, module: nn.Module, optimiser, names: Names) -> None:
        """Kept: the model's names of every stage's tensors, for the saves; restored: the run's checkpoint,
        where it resumes."""
        self.names = names
        if self.cfg.resume_from is not None:
            self.restore(module, optimiser, Path(self.cfg.resume_from))

    def save(self, module: nn.Module, optimiser, steps_done: int) -> None:
        """A checkpoint after ``steps_done`` steps: the stage's first replica writes its weights and
        optimiser state, every process its generators' state, then rank 0 completes it."""
        import heterps_cli.runtime.checkpoint as checkpoint

        assert self.cfg.checkpoint_dir is not None and self.run_id is not None
        root, run = self.cfg.checkpoint_dir, self.run_id
        where = checkpoint.staging(root, steps_done, run)
        if self.replica == self.stage.first_at(self.width):  # section 1i: one replica of each degree
            mine = checkpoint.stage_file(where, self.stage, self.width, self.tp_rank)
            state = drop_copies(checkpoint.stage_state(module, optimiser), module, self.crossing, self.stage.index)
            checkpoint.save(state, mine, run, steps_done)
        checkpoint.save(_generators(self.device), checkpoint.rng_file(where, self.rank), run, steps_done)
        dist.barrier()
        if self.rank == 0:
            names = [*checkpoint.file_names(self.lay), MODEL_FILE, OPTIMIZER_FILE]
            self._save_whole(where, run, steps_done)
            checkpoint.complete(root, steps_done, run, names, dict(self.cfg.checkpoint_meta))

    def _save_whole(self, where: Path, run: str, steps_done: int) -> None:
        """Rank 0, once every stage's files are staged: the model's state in its own names and the optimiser's
        by parameter name (:mod:`.whole`), joined from them."""
        import heterps_cli.runtime.checkpoint as checkpoint

        assert self.names is not None
        # A tied tensor another stage's file leaves out (section 1j) is in its first holder's, an earlier
        # stage's, which gather reads first: the files are read as they are.
        stages = []
        for s in self.lay.stages:
            d = s.degrees[0]
            stages.append([checkpoint.read(checkpoint.stage_file(where, s, d, r)) for r in range(d)])
        model, optimizer = gather(stages, self.names)
        checkpoint.save(model, where / MODEL_FILE, run, steps_done, stamped=False)
        checkpoint.save(optimizer, where / OPTIMIZER_FILE, run, steps_done, stamped=False)

    def restore(self, module: nn.Module, optimiser, where: Path) -> None:
        """The weights, optimiser state and generators of checkpoint folder ``where``."""
        import heterps_cli.runtime.checkpoint as checkpoint

        mark = checkpoint.read_mark(where)
        if self.cfg.resume_replanned:  # another plan's: this stage's part of the whole model
            assert self.names is not None
            model = checkpoint.read(where / MODEL_FILE, mark, stamped=False)
            optimizer = checkpoint.read(where / OPTIMIZER_FILE, mark, stamped=False)
            names = self.names.stages[self.stage.index]
            state = stage_part(module, names, model, optimizer, where / MODEL_FILE)
            checkpoint.load_stage_state(module, optimiser, state, where / MODEL_FILE)
            # each process's generators were another plan's processes': drawn afresh from the seed and step
            torch.manual_seed(self.cfg.seed + mark["steps_done"])
            return
        path = checkpoint.stage_file(where, self.stage, self.width, self.tp_rank)

        def stage_state(index: int) -> dict:  # section 1j: a tied tensor is in its first holder's stage file
            other = checkpoint.stage_file(where, self.lay.stages[index], 1, 0)
            return checkpoint.read(other, mark)

        state = fill_copies(checkpoint.read(path, mark), stage_state)
        checkpoint.load_stage_state(module, optimiser, state, path)
        path = checkpoint.rng_file(where, self.rank)
        checkpoint.set_generators(checkpoint.read(path, mark), self.device, path)


def _say(cfg: RunConfig, line: str) -> None:
    """A step's line: on standard error under torchrun, to the launcher's progress file locally."""
    if cfg.progress_file is None:
        print(f"heterps run: {line}", file=sys.stderr, flush=True)
    else:
        with open(cfg.progress_file, "a") as f:
            f.write(line + "\n")


def _data_of(
    samples, chain, model, cfg: RunConfig, lay: Layout, stage, replica: int, device: torch.device
) -> _TaskData | _Synthetic:
    """What this replica trains on: the task's ``samples``, or without a task (None), the model's example
    inputs on the first stage and a fixed random target on the last (:func:`~.synthetic.target_for`)."""
    if samples is not None:
        return _TaskData(samples, lay, stage, replica, device)
    last = stage.index == len(lay.stages) - 1
    target = target_for(chain.outputs[-1].shape, lay.samples, cfg.seed).to(device) if last else None
    inputs = model.inputs[0].to(device) if stage.index == 0 else None
    return _Synthetic(inputs, target, lay, stage, replica)


def _timed(device: torch.device, *work) -> float:
    """The seconds ``work`` takes, each in turn, the device's queue included."""
    start = time.perf_counter()
    for part in work:
        part()
    _synchronise(device)
    return time.perf_counter() - start


class _Replica:
    """One rank: a replica of one stage, its neighbours in the pipeline, and what it measured."""

    def __init__(self, rank: int, cfg: RunConfig, local_rank: int | None):
        from heterps_cli.profiling.granularity import use_layers
        from heterps_cli.runtime.chain import trace_chain

        torch.set_num_threads(cfg.threads)
        lay = self.lay = cfg.layout()
        stage, self.replica = lay.place(rank)
        self.rank, self.stage, self.tp_rank, self.width = rank, stage, lay.tp_rank(rank), stage.width(self.replica)
        self.device = device_for(cfg.devices[stage.kind(self.replica)], local_rank)
        sync_groups, shard_groups, whole_groups = _process_groups(lay, cfg.devices)
        torch.manual_seed(cfg.seed)
        self.baseline = baseline_memory(self.device)
        self.task, model, samples = _model_of(cfg, lay)
        self.precision = Precision(cfg.precision, self.device)
        with Precision(cfg.precision, torch.device("cpu")).autocast():  # the boundaries' types as trained
            chain = trace_chain(use_layers(model, [name for *_, layers in cfg.stages for name in layers]))
        names = names_of(model.module, [chain.stage(s.layers) for s in lay.stages])  # before any is moved or sharded
        self.module = chain.stage(stage.layers).to(self.device).train()
        dims = block_dims(self.module, stage.blocks) if stage.uneven else {}  # of the weights whole
        shard_group = shard_groups.get((stage.index, self.replica))
        if self.width > 1:  # section 1h: the stage's matrix pairs sharded over this replica's processes
            shard_stage(self.module, shard_group, self.device, f"stage {stage.index}", self.width)
        # section 1g: keep the stage's input only, and run its forward again in the backward pass
        self.recompute = bool(cfg.recompute and cfg.recompute[stage.index])
        weights, held = self.module.parameters(), stage.held_blocks(self.replica, self.tp_rank)
        self.optimiser = self.task.optimizer(weights) if self.task is not None else torch.optim.SGD(weights, lr=cfg.lr)
        tied = TiedSums(chain, lay, stage, self.module, cfg.devices)  # section 1j: tensors other stages hold
        self.sums = _Sums(self.module, dims, stage, held, self.width, self.device, sync_groups, whole_groups, tied)
        self.boundaries = _Boundaries(lay, stage, self.replica, self.tp_rank, self.device, shard_group)
        self._neighbours(chain)
        self.cfg, self.step_index = cfg, 0
        self.data = _data_of(samples, chain, model, cfg, lay, stage, self.replica, self.device)
        self.reporting = self.last and self.replica == 0 and self.tp_rank == 0
        self.checkpoints = _Checkpoints(cfg, lay, rank, stage, self.replica, self.tp_rank, self.device, tied.crossing)
        self.checkpoints.resume(self.module, self.optimiser, names)
        self.M = lay.micro_batches
        self.warm = min(len(lay.stages) - 1 - stage.index, self.M)  # 1F1B: forwards before the first backward
        self.times = Times()
        self.losses: list[float] = []
        self.kept: dict[int, tuple] = {}  # micro-batch -> (input, output, first sample): forward done, backward not
        self.acc = {"compute": 0.0, "wait": 0.0, "loss": 0.0, "data": 0.0}  # this step's sums

    def _neighbours(self, chain) -> None:
        """The stages before and after this one and the tensors crossing to them."""
        lay, stage = self.lay, self.stage
        self.last = stage.index == len(lay.stages) - 1
        self.before = lay.stages[stage.index - 1] if stage.index > 0 else None
        self.after = lay.stages[stage.index + 1] if not self.last else None
        self.incoming = chain.output_after(self.before.layers[-1]) if self.before else None
        self.outgoing = chain.output_after(stage.layers[-1])

    def forward(self, j: int) -> None:
        a, b = self.lay.shard(self.stage, self.replica, j)
        x, target = None, None
        if self.before is None or self.last:
            x, target, took = self.data.take(self.step_index, j)
            self.acc["data"] += took
        if self.before is not None:
            x, waited = self.boundaries.receive(self.before, j, j, self.incoming)
            self.acc["wait"] += waited
            if x.is_floating_point():
                x.requires_grad_(True)
        _synchronise(self.device)
        start = time.perf_counter()
        with self.precision.autocast():
            y = checkpoint(self.module, x, use_reentrant=False) if self.recompute else self.module(x)
            if self.last and self.task is not None:  # a mean over the shard, weighted to its share of the step
                y = self.task.loss(y, target) * ((b - a) / self.lay.samples)
            elif self.last:
                assert target is not None
                y = per_sample_loss(y, target, self.lay.samples)
        _synchronise(self.device)
        self.acc["compute"] += time.perf_counter() - start
        if self.last:
            self.acc["loss"] += float(y.detach())
            y = self.precision.scaled(y)
        else:  # in the type the chain was traced in (a GPU's autocast may choose otherwise than the CPU's)
            self.boundaries.send(y.to(self.outgoing.dtype), a, self.after, j, j)
        self.kept[j] = (x, y, a)

    def backward(self, j: int) -> None:
        x, y, a = self.kept.pop(j)  # its activations are freed once its backward is done
        gradient = None
        if self.after is not None and self.outgoing.dtype.is_floating_point:
            gradient, waited = self.boundaries.receive(self.after, j, self.M + j, self.outgoing)
            self.acc["wait"] += waited
        _synchronise(self.device)
        start = time.perf_counter()
        if y.requires_grad and (self.last or gradient is not None):
            y.backward(gradient.to(y.dtype) if gradient is not None else None)  # sent in the traced type
        _synchronise(self.device)
        self.acc["compute"] += time.perf_counter() - start
        if self.before is not None and x.is_floating_point():
            grad = x.grad if x.grad is not None else torch.zeros_like(x)
            self.boundaries.send(grad, a, self.before, j, self.M + j)

    def step(self, index: int, measured: bool) -> None:
        """Step ``index``: 1F1B over the micro-batches, the sends, the stage's all-reduce, the update."""
        self.step_index = index
        self.acc.update(compute=0.0, wait=0.0, loss=0.0, data=0.0)
        began = time.perf_counter()
        self.kept.clear()
        M, warm = self.M, self.warm
        # 1F1B (docs/spec.md section 1d): `warm` forwards, then one forward and one backward in turn,
        # then the remaining backwards; micro-batches go backward in the order they went forward.
        for j in range(warm):
            self.forward(j)
        for j in range(warm, M):
            self.forward(j)
            self.backward(j - warm)
        for j in range(M - warm, M):
            self.backward(j)
        self.acc["wait"] += self.boundaries.wait()
        # No barrier first, as a trainer has none: this also counts the wait for the stage's slowest
        # replica, which the report takes apart (report.split_sync).
        sync = _timed(self.device, self.sums.gradients)
        step = lambda: self.precision.step(self.optimiser)  # noqa: E731
        update = _timed(self.device, step, lambda: self.optimiser.zero_grad(set_to_none=False))
        self.losses.append(self.acc["loss"])
        wall = time.perf_counter() - began
        if measured:
            self.times.add(self.acc["compute"], self.acc["wait"], sync, self.acc["data"], update, wall)
        if self.task is not None and self.last:
            self.tell(index, wall)

    def tell(self, index: int, wall: float) -> None:
        """The step's loss over all its samples (the last stage's replicas' shares summed), said by the
        last stage's first process: on standard error under torchrun, to the launcher locally."""
        loss = torch.tensor([self.acc["loss"]], device=self.device)  # NCCL sums a GPU stage's: on its GPU
        self.sums.loss(loss)
        if self.reporting:
            _say(
                self.cfg,
                f"step {index + 1}/{self.cfg.last_step}: loss {float(loss):.6g}, "
                f"{self.lay.samples / wall:,.1f} samples/s at the last stage",
            )


def _result(replica: _Replica) -> dict:
    """What one rank measured, for the report."""
    peak, how = peak_memory(replica.device)
    return {
        "peak_memory": peak,
        "baseline_memory": replica.baseline,
        "peak_memory_how": how,
        "rank": replica.rank,
        "stage": replica.stage.index,
        "replica": replica.replica,
        "tp_rank": replica.tp_rank,
        "device": str(replica.device),
        "losses": replica.losses,
        **dataclasses.asdict(replica.times),
        "first_step": replica.cfg.start_step,
        "precision": replica.precision.name,
        "skipped_steps": replica.precision.skipped,
    }


def run_rank(rank: int, world_size: int, init_method: str | None, cfg: RunConfig, local_rank: int | None) -> dict:
    """Join the process group, train, and gather every rank's measurements; rank 0 gets them all.

    The C library's allocator is kept from handing back freed memory, as ``heterps profile`` keeps
    it while timing layers (:func:`~heterps_cli.profiling.timing.steady_allocator`), so that both
    measure a steady loop that reuses its memory: otherwise each micro-batch's activations land on
    fresh pages, whose faults cost mlp's data-parallel replicas at batch 64 10.6-11.4 ms of compute
    per micro-batch against 9.1-10.6 ms (docs/fidelity.md)."""
    from heterps_cli.profiling.timing import steady_allocator

    steady_allocator()
    dist.init_process_group(
        "gloo", init_method=init_method, rank=rank, world_size=world_size, timeout=timedelta(seconds=cfg.timeout_s)
    )
    try:
        started = time.perf_counter()
        mine = train(rank, cfg, local_rank)
        mine["elapsed"] = time.perf_counter() - started
        gathered: list = [None] * world_size
        dist.all_gather_object(gathered, mine)
        dist.barrier()  # no rank leaves while another still talks to it
        return {"ranks": gathered}
    finally:
        dist.destroy_process_group()


def _watch_parent(parent: int) -> None:
    """Exit when the launcher is gone (killed outright): never leave an orphan behind."""
    while True:
        if os.getppid() != parent:
            os._exit(1)
        time.sleep(0.5)


def spawned(rank: int, world_size: int, port: int, cfg: RunConfig, out_dir: str, parent: int) -> None:
    """The entry point of a process ``heterps run`` starts locally.

    Ctrl-C reaches every process of the terminal's group: the launcher handles it
    and ends the workers, so they ignore it. What a worker fails with goes to
    ``rank{N}.err`` for the launcher to report; rank 0's results to ``result.json``.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.stdout = sys.stderr  # the user's model may print: stdout is the launcher's (run --json)
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    out = Path(out_dir)
    try:
        result = run_rank(rank, world_size, f"tcp://127.0.0.1:{port}", cfg, rank)
        if rank == 0:
            partial = out / "result.tmp"
            partial.write_text(json.dumps(result))
            partial.replace(out / "result.json")
    except BaseException as exc:
        from heterps_cli.errors import InputError

        text = str(exc) if isinstance(exc, InputError) else f"{type(exc).__name__}: {exc}"
        (out / f"rank{rank}.err").write_text(text + "\n\n" + traceback.format_exc())
        os._exit(1)
    # gloo's threads may still be winding down: leaving without C++ destructors avoids their
    # occasional "terminate called without an active exception" abort at exit.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
