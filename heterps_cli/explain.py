"""Why a plan is as fast as it is: the term that binds its bottleneck stage, and what keeps that stage
from more replicas (docs/spec.md section 4, ``explanation``). Every figure is the plan's own, so
``check`` recomputes the text with the rest."""

from __future__ import annotations

import numpy as np

from heterps_cli.costmodel import stage_throughputs
from heterps_cli.figures import count, usd
from heterps_cli.formulas import (
    SLACK,
    amdahl,
    pipeline_slots,
    ring_allreduce,
    share,
    step_parts,
    stretch,
    whole_samples,
)
from heterps_cli.objective import Objective
from heterps_cli.problem import Problem
from heterps_cli.replica_counts import next_whole
from heterps_cli.stages import schedule_of_stages, split_stages


def terms(stage, micro_batches: int, stages: int, again: float = 0.0) -> dict[str, float]:
    """The parts of a stage's time per batch (sections 1, 1b) or per step (section 1d), in seconds.
    Without a pipeline schedule compute and communication overlap (the stage takes the larger);
    with one they add up. ``again``: of a micro-batch's compute, the forward pass a recomputing stage
    runs a second time (section 1g), its own term."""
    if not micro_batches:
        return {
            "compute": stage.compute_s,
            "gradient synchronisation": stage.comm_s - stage.transfer_s,
            "stage-boundary transfer": stage.transfer_s,
        }
    parts = step_parts(micro_batches, stages, stage.compute_s, stage.transfer_s, stage.comm_s, stage.update_s or 0.0)
    if again > 0:
        parts["compute"] = micro_batches * (stage.compute_s - again)
        parts["recomputed forward"] = micro_batches * again
    return parts


def binding(stage, micro_batches: int, stages: int, again: float = 0.0) -> tuple[str, float, float]:
    """(term, its seconds, the stage's seconds) of the term that takes most of the stage's time."""
    parts = terms(stage, micro_batches, stages, again)
    if not micro_batches:
        total = max(stage.compute_s, stage.comm_s)
        if stage.compute_s >= stage.comm_s:
            return "compute", stage.compute_s, total
        comm = {k: v for k, v in parts.items() if k != "compute"}
        name = max(comm, key=lambda k: comm[k])
        return name, comm[name], total
    name = max(parts, key=lambda k: parts[k])
    return name, parts[name], sum(parts.values())


def explanation(problem: Problem, plan) -> tuple[str, ...]:
    """Two lines: the bottleneck and its binding term; what keeps it from going faster."""
    b = plan.bottleneck
    stage = plan.stages[b]
    M, S = plan.micro_batches, len(plan.stages)
    again = _forward_again(problem, plan, b) if stage.recompute and M else 0.0
    name, seconds, total = binding(stage, M, S, again)
    on = f"{stage.resource} tp{stage.tp}" if stage.tp else stage.resource  # section 1h: replicas of tp units
    where = f"stage {b} ({on} × {count(stage.replicas)}, layers {stage.first}-{stage.last})"
    if M:
        first = f"{where} sets the throughput: {name} takes {_s(seconds)} of its {_s(total)} per step"
        if again > 0 and name != "recomputed forward":  # section 1g: the price of the memory it saves
            first += f" (its recomputed forward pass {_s(M * again)})"
    else:
        other, other_s = ("communication", stage.comm_s) if name == "compute" else ("compute", stage.compute_s)
        overlap = f", and {other} ({_s(other_s)}) overlaps it" if other_s > 0 else f", with no {other}"
        first = f"{where} sets the throughput: {name} takes {_s(seconds)} a batch{overlap}"
    return first, _held_by(problem, plan, b)


FEW_SAMPLES = 8  # a replica's share under which a plan's speed-up rests on alpha more than on any measure
MANY_REPLICAS = 4


def split_notes(problem: Problem, plan) -> list[str]:
    """One line on the stages that split every micro-batch over many replicas into a few samples each, a
    figure users read as wrong: their speed-up is section 1's Amdahl term, as good as the profile's alpha."""
    B, found = plan.batch_size, []
    for i, stage in enumerate(plan.stages):
        if stage.replicas < MANY_REPLICAS or share(B, stage.replicas) >= FEW_SAMPLES:
            continue
        t, view = problem.types.index(stage.resource), problem.view_at(stage.tp or 1)  # section 1h: its degree's
        oct_ = view.oct[stage.first : stage.last + 1, t]
        alpha = view.alpha[stage.first : stage.last + 1, t]
        found.append((i, stage.replicas, float(np.sum(oct_ * alpha) / np.sum(oct_)) if np.sum(oct_) > 0 else 0.0))
    if not found:
        return []
    which = ", ".join(f"{i} ({count(k)} replicas, alpha {a:.2f})" for i, k, a in found)
    return [
        f"stage{'s' if len(found) > 1 else ''} {which} split{'' if len(found) > 1 else 's'} each batch of "
        f"{count(B)} samples into fewer than {count(FEW_SAMPLES)} a replica: the speed-up is Amdahl's with alpha, the "
        "share of the compute that replicas divide (compute-weighted), which an estimated profile takes as the "
        "layer kind's default guess: measure alpha on the device (heterps profile) before renting that many"
    ]


def _forward_again(problem: Problem, plan, b: int) -> float:
    """Section 1g: seconds of a micro-batch's compute that stage ``b``'s busiest replica spends running its
    forward pass again (its compute recomputing, less the same stage's without)."""
    plain = [s.model_copy(update={"recompute": None}) if i == b else s for i, s in enumerate(plan.stages)]
    k = float(plan.stages[b].replicas)
    per = []
    for stages in (plan.stages, plain):
        split = split_stages(problem, schedule_of_stages(problem, stages)[None, :])
        micro = float(split.micro_parallel[0, b] - split.transfer[0, b])
        per.append(float(amdahl(split.micro_serial[0, b], whole_samples(micro, micro, problem.batch_size, k), k)))
    return max(per[0] - per[1], 0.0)


def _held_by(problem: Problem, plan, b: int) -> str:
    stage = plan.stages[b]
    if stage.joined:
        return _mixed_held_by(problem, plan, stage)
    t = problem.types.index(stage.resource)
    used, limit = plan.resources[stage.resource], int(problem.limits[t])
    width = stage.tp or 1  # section 1h: another replica takes this many units
    if used + width > limit:
        held = "the cluster's nodes hold" if problem.nodes is not None else "the limit allows"
        return f"it has no more {stage.resource} to take: the plan uses all {count(limit)} units {held}"
    if plan.idle_units is not None and not plan.idle_units.get(stage.resource):
        # one more replica needs another node, which may also move its all-reduce off a node's links
        return (
            f"its rental has no {stage.resource} left: another replica needs another node "
            "(plan --explain gives one node more of each kind)"
        )
    B = plan.batch_size
    if stage.replicas >= B:
        each = f"its {count(stage.replicas)} replicas train one sample each of the batch of {count(B)}"
        return f"{each}: no more can share it"
    more = int(next_whole(B, stage.replicas)) - stage.replicas
    if used + more * width > limit:
        return (
            f"{_another(more, B, stage.replicas)} would split the batch of {count(B)} finer, and the plan uses "
            f"{count(used)} of the {count(limit)} {stage.resource} units the limit allows"
        )
    faster, why = _one_more(problem, plan, b, more)
    if faster <= stage.throughput * (1 + SLACK):
        return f"{_another(more, B, stage.replicas)} would not make it faster ({count(faster)} samples/s): {why}"
    if problem.max_cost is not None and plan.cost_usd >= problem.max_cost * (1 - 1e-6):
        return f"the budget: the plan spends {usd(plan.cost_usd)} of {usd(problem.max_cost)}"
    if problem.objective is Objective.COST:
        need = f"meets the required {count(problem.min_throughput)} samples/s" if problem.min_throughput > 0 else ""
        return (
            f"the objective is cost{': the plan ' + need if need else ''}; "
            f"{_another(more, B, stage.replicas, stage.resource)} there would reach {count(faster)} samples/s "
            "and cost more"
        )
    return f"{_another(more, B, stage.replicas, stage.resource)} there would reach {count(faster)} samples/s"


def _mixed_held_by(problem: Problem, plan, stage) -> str:
    """Section 1i: what holds a mixed bottleneck stage back: its types' idle units, if any."""
    types = [stage.resource, *(j.resource for j in stage.joined)]
    idle = {r: int(problem.limits[problem.types.index(r)]) - plan.resources[r] for r in types}
    mixes = f"it mixes {' and '.join(types)}, each type's share of the micro-batch as large as keeps it no slower"
    if not any(idle.values()):
        return f"{mixes}; the plan uses every unit of each that the limits allow"
    spare = ", ".join(f"{count(n)} {r}" for r, n in idle.items() if n)
    return (
        f"{mixes}; {spare} unit(s) stay idle, which the plan found no faster way to use (plan --explain's "
        "what-if gives each type's limit one higher and one lower)"
    )


def _another(more: int, batch: int, k: int, resource: str = "") -> str:
    """ "another replica", or the fewest more that split the batch finer (section 1's whole samples)."""
    kind = f"{resource} " if resource else ""
    if more == 1:
        return f"another {kind}replica"
    return (
        f"{more} more {kind}replicas (fewer would leave the busiest with {count(int(share(batch, k)))} samples as now)"
    )


def _one_more(problem: Problem, plan, b: int, more: int = 1) -> tuple[float, str]:
    """The bottleneck stage's throughput with ``more`` replicas more (the others as they are), and what
    they change: the gradient all-reduce they add against the compute they save (section 1d),
    or the part of the stage's time that replicas do not divide."""
    stages = split_stages(problem, schedule_of_stages(problem, plan.stages)[None, :])
    k = np.zeros(stages.valid.shape)
    k[0, : len(plan.stages)] = [s.replicas for s in plan.stages]
    now = float(k[0, b])
    k[0, b] += more
    faster = float(stage_throughputs(problem, stages, k)[0, b])
    B = problem.batch_size
    shrink = float(stretch(B, now)) / now - float(stretch(B, now + more)) / (now + more)
    if problem.pipelined:
        slots = pipeline_slots(plan.micro_batches, len(plan.stages))
        saved = slots * float(stages.micro_parallel[0, b]) * shrink
        added = float(ring_allreduce(stages.sync[0, b], now + more) - ring_allreduce(stages.sync[0, b], now))
        return faster, (
            f"its gradient all-reduce would grow by {_s(added)} a step, more than the {_s(saved)} of compute "
            "and transfer it would save"
        )
    serial = max(float(stages.sc[0, b]), float(stages.sd[0, b]))
    return faster, f"{_s(serial)} of its time per batch does not shrink with replicas (oct (1 - alpha), odt (1 - beta))"


def _s(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"
