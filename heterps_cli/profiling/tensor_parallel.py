"""``heterps profile --tp 2,4``: each layer measured as ``heterps run`` runs it at those tensor-parallel degrees.

At degree ``d`` a replica is ``d`` units (docs/spec.md section 1h): ``d`` processes,
one per cpu core (gloo) or per GPU (nccl), each run with one shard of every
layer's pairs of linear layers (``torch.distributed.tensor.parallel``, as
``heterps run`` shards a stage: :func:`heterps_cli.runtime.worker.shard_stage`),
the rest of the layer whole. Each process times the layer's forward and backward,
its all-reduces included, the same number of times; the slowest process's median
is the layer's time, since a replica's step waits for its last unit. A layer with
no such pair runs whole on every unit: its times and sizes at ``d`` are those
measured at 1. One unit's sizes (its weights, the bytes it keeps) are those of one
shard, counted as an estimate counts them (:func:`~heterps_cli.runtime.sharding.one_shard`).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
import tempfile
from datetime import timedelta
from pathlib import Path

import torch

from heterps_cli.errors import InputError
from heterps_cli.profiling.measure import LayerProfile, Profiled, layer_profile, load_model, placed, traced_at
from heterps_cli.profiling.models import Call, Model
from heterps_cli.profiling.precision import training_at
from heterps_cli.profiling.processes import run_together, usable_cores
from heterps_cli.profiling.timing import Loss, timed
from heterps_cli.progress import Progress, quiet
from heterps_cli.runtime.sharding import one_shard, shardable
from heterps_cli.runtime.synthetic import output_loss

JOIN_TIMEOUT_S = 300.0
WARMUP = 3  # runs of each layer before the timed ones: the first all-reduces also connect the processes


def check_degrees(degrees: tuple[int, ...], device: str) -> None:
    """Exit 2 where this machine has fewer units than a degree asks for: a cpu core or a GPU each."""
    if not degrees:
        return
    if device == "cuda":
        have, what = (torch.cuda.device_count() if torch.cuda.is_available() else 0), "GPUs torch sees here"
    else:
        have, what = usable_cores(), "cores this process may use"
    if max(degrees) > have:
        raise InputError(
            None,
            None,
            "--tp",
            f"degree {max(degrees)} runs one process per unit, and there are {have} {what}: measure the "
            "degrees this machine has, or estimate the others (heterps profile estimate --tp)",
        )


def with_degrees(
    measured: Profiled, model: Model, args: dict, degrees: tuple[int, ...], progress: Progress | None = None
) -> Profiled:
    """``measured`` with its layers at each of ``degrees`` (``args``: the model's spec and how to load and
    time it, as the processes of :mod:`.processes` take them)."""
    if not degrees:
        return measured
    report = progress or quiet
    device = measured.device
    model.module.to("cpu")  # traced where its inputs are, then moved, as measure() does
    calls, _ = traced_at(model, measured.precision, device)
    placed(model, calls, device)
    found: dict[int, list[LayerProfile]] = {}
    for n, d in enumerate(degrees):
        report(f"tp {d}: {d} processes, one shard each", completed=n, total=len(degrees))
        with tempfile.TemporaryDirectory(prefix="heterps-tp-") as tmp:
            outs = [Path(tmp) / f"rank{i}.json" for i in range(d)]
            run_together({**args, "degree": d}, outs, module=__name__)
            times = json.loads(outs[0].read_text())
        found[d] = [
            _at_degree(call, layer, times.get(call.name), d, measured) for call, layer in zip(calls, measured.layers)
        ]
    report("done", completed=len(degrees), total=len(degrees))
    return dataclasses.replace(measured, degrees=found)


def _at_degree(call: Call, layer: LayerProfile, times: list[float] | None, d: int, measured: Profiled) -> LayerProfile:
    """One unit's profile of the layer at degree ``d``: the one measured at 1 where it has no pair to shard,
    else the shard's sizes with the times its processes took."""
    if times is None:
        return layer
    oct_, forward = times
    with one_shard(call.module, d) as pairs, training_at(measured.precision, measured.device, [call.module]):
        assert pairs is not None  # the processes timed only layers with pairs
        shard = layer_profile(
            call,
            measured.batch_size,
            oct_,
            measured.bandwidth,
            layer.alpha,
            measured.device,
            estimated={**layer.estimated, "alpha": "that of degree 1"},
            forward=forward,
        )
    return dataclasses.replace(shard, input_saved=min(layer.input_saved, shard.activation_size))


def _timed_shard(module: torch.nn.Module, call: Call, device: str, runs: int, loss: Loss | None) -> list[float]:
    """The medians of the forward-and-backward and of the forward alone, over ``runs`` after :data:`WARMUP`;
    every process of the degree runs as many, so their all-reduces pair up."""
    forwards: list[float] = []
    totals = timed(module, lambda: call.fresh(device), device, runs, WARMUP, loss, forwards)
    return [statistics.median(totals), statistics.median(forwards)]


def _worker(args: dict, out: Path) -> int:
    try:
        _unit(args, out)
    except InputError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    return 0


def _unit(args: dict, out: Path) -> None:
    """One unit of a replica at ``args["degree"]``: every layer with pairs, sharded and timed; the first
    writes the slowest unit's times."""
    import torch.distributed as dist

    from heterps_cli.runtime.worker import shard_stage

    rank, degree, device = args["index"], args["degree"], args["device"]
    if device == "cuda":
        torch.cuda.set_device(rank)
    else:
        torch.set_num_threads(1)  # one unit of cpu is one core
    model = load_model(args["spec"], args["batch_size"], tuple(args["input_shape"] or ()) or None, args["granularity"])
    calls, _ = traced_at(model, args.get("precision"), device)
    dist.init_process_group(
        "nccl" if device == "cuda" else "gloo",
        init_method=f"tcp://127.0.0.1:{args['port']}",
        rank=rank,
        world_size=degree,
        timeout=timedelta(seconds=JOIN_TIMEOUT_S),
    )
    unit = torch.device(device, rank) if device == "cuda" else torch.device("cpu")
    loss = output_loss(args.get("loss", "mse"), args["batch_size"])
    times = {}
    try:
        for i, call in enumerate(calls):
            if shardable(call.module, degree) is None:
                continue
            module = call.module.to(unit)
            shard_stage(module, dist.group.WORLD, unit, call.name, degree)
            dist.barrier()  # each layer's runs start together: none times its partner's last layer
            with training_at(args.get("precision"), device, [module]):
                mine = _timed_shard(module, call, device, args["repetitions"], loss if i == len(calls) - 1 else None)
            slowest = torch.tensor(mine, dtype=torch.float64, device=unit)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            times[call.name] = slowest.tolist()
    finally:
        dist.destroy_process_group()
    if rank == 0:
        out.write_text(json.dumps(times))


if __name__ == "__main__":
    sys.exit(_worker(json.loads(sys.argv[1]), Path(sys.argv[2])))
