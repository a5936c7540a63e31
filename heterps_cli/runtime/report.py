"""A run measured against its plan's prediction: per stage and for the whole pipeline."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass

from heterps_cli.formats import Plan


@dataclass(frozen=True)
class StageReport:
    index: int
    resource: str
    replicas: int
    device: str
    first: str
    last: str
    predicted_compute_s: float  # the plan's CT_s per batch
    predicted_comm_s: float  # the plan's DT_s per batch (section 1d: its all-reduce per step, over M)
    predicted_throughput: float
    compute_s: float  # measured per batch: the slowest replica's forward + backward
    wait_s: float  # blocked: on a neighbour stage, or on the stage's slowest replica (mean over replicas)
    sync_s: float  # the gradient all-reduce among the replicas
    idle_s: float  # the rest of the step: Python between the pieces
    throughput: float  # batch_size / (compute_s + sync_s): what the stage alone could sustain
    predicted_memory_gb: float | None = None  # the plan's memory_gb per replica (section 1b/1d)
    peak_memory_gb: float = 0.0  # measured: the largest of its replicas' (see peak_memory_how)
    peak_memory_how: str = ""
    baseline_memory_gb: float = 0.0  # measured: what that replica held before its model was built
    tp: int = 1  # docs/spec.md section 1h: processes per replica, each a shard of its linear pairs
    data_s: float = 0.0  # reading the task's samples (inputs at the first stage, targets at the last)
    update_s: float = 0.0  # the optimiser step and the gradients' reset (section 1d's update, over M)
    predicted_update_s: float = 0.0  # the plan's update_s per step, over M

    @property
    def ratio(self) -> float:
        return self.throughput / self.predicted_throughput if self.predicted_throughput else float("inf")


@dataclass(frozen=True)
class RunReport:
    plan: str
    model: str
    batch_size: int
    processes: int
    micro_batches: int
    steps: int
    warmup: int
    predicted_throughput: float
    throughput: float  # measured: samples per second over the measured steps
    predicted_bottleneck: int
    bottleneck: int  # the stage whose busy time (compute + sync) per batch is largest
    losses: list[float]  # per step, warm-up included: the mean loss over the step's samples
    stages: list[StageReport]
    first_step: int = 0  # steps done before this run (a resumed run's checkpoint): losses[0] is step first_step + 1
    task: str | None = None  # heterps run --task: the user's model, data, loss and optimiser
    # section 1j: per tensor that several stages hold, how many processes hold a copy, and how many
    # distinct values those copies had at the end (1: bit-equal, one tensor)
    tied: dict[str, dict[str, int]] | None = None
    precision: str = "fp32"  # what it trained at: the plan's (autocast for bf16 and fp16)
    skipped_steps: int = 0  # fp16: steps skipped for gradients that were not finite (the loss scale halved)

    @property
    def ratio(self) -> float:
        return self.throughput / self.predicted_throughput if self.predicted_throughput else float("inf")

    def to_dict(self) -> dict:
        out = asdict(self)
        out["ratio"] = self.ratio
        for stage, data in zip(self.stages, out["stages"]):
            data["ratio"] = stage.ratio
        return out

    def to_json(self) -> str:
        """The report as JSON: a figure that is not finite (a loss gone NaN, a ratio to no prediction) as
        null, since JSON has no NaN or Infinity."""
        return json.dumps(_finite(self.to_dict()), indent=2, allow_nan=False) + "\n"

    @property
    def diverged(self) -> int | None:
        """The first step whose loss is not a finite number, or None."""
        bad = next((i for i, loss in enumerate(self.losses) if not math.isfinite(loss)), None)
        return None if bad is None else self.first_step + bad + 1


def _finite(value):
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(v) for key, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _mean(values: list[float]) -> float:
    """Means, not medians: the throughput is steps over their summed time, the slow steps too, so the
    columns add up to it (a median all-reduce here is a half to a third of the mean; docs/fidelity.md)."""
    return statistics.fmean(values) if values else 0.0


def split_sync(ranks: list[dict]) -> list[dict]:
    """Each rank's measured all-reduce of a step runs from its own arrival to the end, which the ranks
    of its group (a stage's replicas, one shard each) reach together: the last to arrive measures the
    all-reduce alone. That much of each rank's is ``sync``, the rest moves to its ``wait``."""

    def group(r: dict) -> tuple:
        return r["stage"], r.get("tp_rank", 0)

    measured: dict[tuple, list[list[float]]] = {}
    for r in ranks:
        measured.setdefault(group(r), []).append(r["sync"])
    alone = {key: [min(step) for step in zip(*syncs)] for key, syncs in measured.items()}
    return [
        {
            **r,
            "sync": alone[group(r)],
            "wait": [w + (own - least) for w, own, least in zip(r["wait"], r["sync"], alone[group(r)])],
        }
        for r in ranks
    ]


def build_report(
    plan_path: str, plan: Plan, model: str, ranks: list[dict], micro_batches: int, task: str | None = None
) -> RunReport:
    """Each rank's per-step times (``worker.train``), their means over the steps, against the plan's
    figures, per batch of the plan's ``batch_size`` (a step runs ``micro_batches`` of them)."""
    B, M = plan.batch_size, micro_batches
    ranks = split_sync(ranks)
    stages = [_stage_report(plan, s, [r for r in ranks if r["stage"] == s], M) for s in range(len(plan.stages))]
    steps = len(ranks[0]["wall"])
    elapsed = max(sum(r["wall"]) for r in ranks)
    last = len(plan.stages) - 1
    # Section 1h: a sharded replica's processes all compute its loss; its first reports it.
    losses = [
        sum(values) for values in zip(*(r["losses"] for r in ranks if r["stage"] == last and not r.get("tp_rank")))
    ]
    return RunReport(
        plan=plan_path,
        model=model,
        batch_size=B,
        processes=len(ranks),
        micro_batches=micro_batches,
        steps=steps,
        warmup=len(ranks[0]["losses"]) - steps,
        predicted_throughput=plan.throughput,
        throughput=B * M * steps / elapsed if elapsed > 0 else float("inf"),
        predicted_bottleneck=plan.bottleneck,
        bottleneck=max(range(len(stages)), key=lambda i: stages[i].compute_s + stages[i].sync_s),
        losses=losses,
        stages=stages,
        first_step=ranks[0].get("first_step", 0),
        task=task,
        precision=ranks[0].get("precision", "fp32"),
        skipped_steps=ranks[0].get("skipped_steps", 0),
        tied=_tied_copies(ranks),
    )


def _tied_copies(ranks: list[dict]) -> dict[str, dict[str, int]] | None:
    """Section 1j: each tensor several stages hold, its copies and their distinct values at the end (each
    rank's digest of its copy's bytes)."""
    seen: dict[str, list[str]] = {}
    for r in ranks:
        for name, digest in (r.get("tied") or {}).items():
            seen.setdefault(name, []).append(digest)
    return {name: {"copies": len(d), "values": len(set(d))} for name, d in seen.items()} or None


def _stage_report(plan: Plan, s: int, mine: list[dict], M: int) -> StageReport:
    """Stage ``s``'s figures from its ranks' (``mine``): the slowest replica's compute, the others' means,
    per batch of the plan's ``batch_size``."""
    stage = plan.stages[s]
    compute = max(_mean(r["compute"]) for r in mine) / M
    wait = statistics.fmean(_mean(r["wait"]) for r in mine) / M
    sync = statistics.fmean(_mean(r["sync"]) for r in mine) / M
    wall = statistics.fmean(_mean(r["wall"]) for r in mine) / M
    data = statistics.fmean(_mean(r.get("data", [])) for r in mine) / M
    update = statistics.fmean(_mean(r.get("update", [])) for r in mine) / M
    busy = compute + sync
    heaviest = max(mine, key=lambda r: r.get("peak_memory", 0.0))  # the replica whose peak the stage reports
    return StageReport(
        index=s,
        resource=stage.resource,
        replicas=stage.replicas,
        device=mine[0]["device"],
        first=stage.layers[0],
        last=stage.layers[-1],
        predicted_compute_s=stage.compute_s,
        predicted_comm_s=stage.comm_s / plan.micro_batches if plan.micro_batches else stage.comm_s,
        predicted_throughput=stage.throughput,
        compute_s=compute,
        wait_s=wait,
        sync_s=sync,
        idle_s=max(0.0, wall - compute - wait - sync - data - update),
        throughput=plan.batch_size / busy if busy > 0 else float("inf"),
        predicted_memory_gb=stage.memory_gb,
        peak_memory_gb=heaviest.get("peak_memory", 0.0) / 1e9,
        peak_memory_how=mine[0].get("peak_memory_how", ""),
        baseline_memory_gb=heaviest.get("baseline_memory", 0.0) / 1e9,
        tp=stage.tp or 1,
        data_s=data,
        update_s=update,
        predicted_update_s=(stage.update_s or 0.0) / M,
    )
