"""The plan every scheduler returns (docs/spec.md section 4, :class:`~heterps_cli.formats.Plan`, the one
schema of a plan and its file), built from a schedule and replica counts.

A plan's figures are never taken from a scheduler: :func:`make_plan` recomputes
them with the cost model from the stages, so every scheduler's plan is
checkable in the same way.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from heterps_cli.costmodel import score
from heterps_cli.explain import explanation
from heterps_cli.formats import PLAN_FORMAT, Joined, Plan, Stage
from heterps_cli.formulas import activations_held, amdahl, copies_held, ring_allreduce, whole_samples
from heterps_cli.mixed import MixedStage, mixed_scores, mixed_stage, with_own
from heterps_cli.nodes import place
from heterps_cli.objective import Objective
from heterps_cli.problem import Problem
from heterps_cli.stages import split_stages
from heterps_cli.ties import split_terms


def make_plan(
    problem: Problem,
    schedule,
    replicas,
    *,
    scheduler: str,
    seed: int = 0,
    solve_s: float = 0.0,
    optimal: bool | None = None,
    evaluations: int | None = None,
    notes: tuple[str, ...] | list[str] = (),
    interrupted: bool = False,
    rental: dict[str, int] | None = None,
    joined: dict | None = None,
) -> Plan:
    """Build a :class:`Plan` for one schedule (type per layer) and its per-stage replica counts.

    With whole nodes (section 1e) the plan runs on ``rental`` (nodes per kind, holding its units);
    without one, on the best of the cheapest rental holding them and each single node with links
    that holds them (:func:`_rental_for`). ``joined``: section 1i, by stage index, the replicas of other
    types that join it (:class:`~heterps_cli.mixed.Joined`)."""
    stages = split_stages(problem, np.asarray(schedule)[None, :])
    S = int(stages.valid.sum())
    k = np.zeros(stages.valid.shape)
    k[0, :S] = np.asarray(replicas, dtype=float)
    sc = score(problem, stages, k)
    cluster_bandwidth = problem.bandwidth
    mixed = _mixed(problem, schedule, stages, k, joined or {})
    if mixed:
        sc = mixed_scores(problem, stages, sc, mixed)
    problem, stages, sc, rental, links = _on_rental(problem, schedule, k, stages, sc, rental)
    if mixed and rental is not None:  # on the rental: its links, its price
        mixed = _mixed(problem, schedule, stages, k, joined or {})
        sc = mixed_scores(problem, stages, sc, mixed, rate=sc.rate)
    out, idle, where = _placed(problem, stages, k, sc, rental, mixed)
    out = [_with_parts(problem, stage, mixed[s], where.get(s)) if s in mixed else stage for s, stage in enumerate(out)]
    plan = Plan.model_construct(
        **job_fields(problem),
        scheduler=scheduler,
        seed=seed,
        stages=out,
        **_per_type(problem, cluster_bandwidth, sc.used[0]),
        rental=rental,
        rate_usd_per_hour=float(sc.rate[0]) if rental is not None else None,
        idle_units=idle,
        link_gbps=links,
        throughput=float(sc.throughput[0]),
        bottleneck=int(sc.bottleneck[0]),
        time_s=float(sc.time_s[0]),
        cost_usd=float(sc.cost[0]),
        feasible=bool(sc.feasible[0]),
        optimal=optimal,
        evaluations=evaluations,
        notes=list(notes),
        solve_s=solve_s,
        format=PLAN_FORMAT,
    ).of_run(dict(zip(problem.types, problem.units)), interrupted)
    return plan.but(explanation=list(explanation(problem, plan))) if np.isfinite(plan.throughput) else plan


def job_fields(problem: Problem) -> dict:
    """The plan's fields that repeat the job it answers: the model, the cluster, the objective and the
    targets, the batch (and under a pipeline its global batch and micro-batches), the precision."""
    pipelined = problem.pipelined
    return {
        "model": problem.model,
        "cluster": problem.cluster,
        "objective": problem.objective,
        "batch_size": problem.batch_size,
        "samples": problem.samples,
        "epochs": problem.epochs,
        "min_throughput": problem.min_throughput,
        "max_cost": problem.max_cost,
        "global_batch": problem.step_samples if pipelined else None,
        "maximal_stages": True if problem.maximal_stages else None,
        "precision": problem.precision,
        "micro_batches": problem.micro_batches if pipelined else None,
    }


def _mixed(problem: Problem, schedule, stages, k: np.ndarray, joined: dict) -> dict[int, MixedStage]:
    """Section 1i: each joined stage's parts and figures (``stages``: the schedule's, split); ValueError
    where the plan cannot mix types."""
    if not joined:
        return {}
    if not problem.pipelined:
        raise ValueError("stages mix types only under a pipeline schedule (a global batch)")
    out = {}
    for s, parts in joined.items():
        if stages.recompute[0, s]:
            raise ValueError(f"stage {s} mixes types without recomputation only")
        out[s] = mixed_stage(problem, schedule, s, with_own(problem, stages, k[0], s, parts))
    return out


def _with_parts(problem: Problem, stage: Stage, m: MixedStage, where: list | None) -> Stage:
    """A one-type stage's entry with section 1i's parts: its own replicas' figures, the stage's step, and
    where each joined part's replicas run (section 1e)."""
    own, *others = m.parts
    joined = [
        Joined(
            resource=problem.types[p.type],
            replicas=p.replicas,
            samples=p.samples,
            tp=p.tp if p.tp > 1 else None,
            compute_s=p.compute_s,
            transfer_s=p.transfer_s,
            memory_gb=p.memory / 1e9,
            nodes=where[i] if where is not None else None,
        )
        for i, p in enumerate(others)
    ]
    return stage.model_copy(
        update={
            "samples": own.samples,
            "joined": joined,
            "compute_s": own.compute_s,
            "transfer_s": own.transfer_s,
            "memory_gb": own.memory / 1e9,
            "comm_s": m.comm_s,
            "step_s": m.step_s,
            "update_s": m.update_s,
            "throughput": m.throughput,
        }
    )


def _on_rental(problem: Problem, schedule, k: np.ndarray, stages, sc, rental: dict[str, int] | None):
    """Section 1e: (problem, stages, scores, rental, links) of the plan on its rental, the node links
    its types talk over in the problem and the rental's price in the scores; as given without nodes."""
    if problem.nodes is None or not np.isfinite(sc.rate[0]):
        return problem, stages, sc, None, None
    if rental is None:
        rental = _rental_for(problem, schedule, k, sc)
    links = None
    counts = problem.nodes.counts(rental)
    over = problem.nodes.links(counts, sc.used[0])
    rate = np.array([float(counts @ problem.nodes.price)])
    if (over > 0).any():
        problem = problem.over_links(counts, sc.used[0])
        stages = split_stages(problem, np.asarray(schedule)[None, :])
        links = {t: float(g * 8 / 1e9) for t, g in zip(problem.types, over) if g > 0}
    return problem, stages, score(problem, stages, k, rate=rate), rental, links


def _placed(problem: Problem, stages, k: np.ndarray, sc, rental: dict[str, int] | None, mixed: dict):
    """The plan's stages and, on a rental (section 1e), the units of each type it leaves idle, each
    stage's replicas placed on the rental's nodes, and where each mixed stage's joined parts run."""
    S = int(stages.valid.sum())
    out = [_stage(problem, stages, k, sc, s) for s in range(S)]
    if rental is None:
        return out, None, {}
    assert problem.nodes is not None
    held = problem.nodes.held(rental)
    assert (held >= sc.used[0]).all(), "the rental holds the plan's units"
    idle = {t: int(h - u) for t, h, u in zip(problem.types, held, sc.used[0])}
    idle |= problem.nodes.others_held(problem.nodes.counts(rental))  # section 1e: every unit the rental holds
    wanted = [(int(stages.type[0, s]), k[0, s], int(stages.width[0, s])) for s in range(S)]
    parts = [(s, p) for s in sorted(mixed) for p in mixed[s].parts[1:]]  # section 1i: placed after the stages
    placed = place(problem.nodes, problem.types, rental, [*wanted, *((p.type, p.replicas, p.tp) for _, p in parts)])
    where: dict[int, list] = {}
    for (s, _), nodes in zip(parts, placed[S:]):
        where.setdefault(s, []).append(nodes)
    return [stage.model_copy(update={"nodes": at}) for stage, at in zip(out, placed[:S])], idle, where


def _per_type(problem: Problem, bandwidth: np.ndarray, used: np.ndarray) -> dict:
    """The plan's figures per type: units used of each limit, and the cluster's memory, bandwidth and
    reserved memory (section 1b, 1d) as its file gives them."""
    # Section 1e: the nodes' units of types no layer runs on, never used and all there to rent.
    others = {} if problem.nodes is None else problem.nodes.others_held(problem.nodes.available)
    return {
        "resources": {t: int(u) for t, u in zip(problem.types, used)} | {t: 0 for t in others},
        "limits": {t: int(n) for t, n in zip(problem.types, problem.limits)} | others,
        "memory_gb": {t: float(m / 1e9) if np.isfinite(m) else None for t, m in zip(problem.types, problem.memory)},
        "bandwidth_gbps": {t: float(b * 8 / 1e9) if np.isfinite(b) else None for t, b in zip(problem.types, bandwidth)},
        "memory_reserved_gb": (
            {t: float(r / 1e9) for t, r in zip(problem.types, problem.reserved)}
            if problem.reserved is not None
            else None
        ),
    }


def _rental_for(problem: Problem, schedule, k: np.ndarray, sc) -> dict[str, int]:
    """The rental a plan found without one runs on: the cheapest holding its units, or a single node
    with links that holds them, whichever the objective prefers (on one node the same plan is no
    slower, and may be dearer an hour)."""
    nodes = problem.nodes
    assert nodes is not None
    options = [nodes.rental(sc.used[0])]
    options += [
        {nodes.names[k]: 1}
        for k in nodes.linked
        if (nodes.units[k] >= sc.used[0]).all() and options[0] != {nodes.names[k]: 1}
    ]
    if len(options) == 1:
        return options[0]

    def rank(rental: dict[str, int]) -> tuple:
        counts = nodes.counts(rental)
        there = problem.over_links(counts, sc.used[0])
        s = score(there, split_stages(there, np.asarray(schedule)[None, :]), k, rate=np.array([counts @ nodes.price]))
        cost, thr = float(s.cost[0]), float(s.throughput[0])
        return (not bool(s.feasible[0]), *((cost, -thr) if problem.objective is Objective.COST else (-thr, cost)))

    return min(options, key=rank)


def _stage(problem: Problem, stages, k: np.ndarray, sc, s: int) -> Stage:
    """Stage ``s`` of the one schedule in ``stages`` with ``k`` replicas: its figures as the plan file shows them."""
    kk = max(k[0, s], 1.0)
    a, b = int(stages.first[0, s]), int(stages.last[0, s])
    t = int(stages.type[0, s])
    reserved = problem.reserved_bytes
    pipeline: dict = {}
    B = problem.batch_size  # a replica trains whole samples of each batch: the busiest sets the figures

    def whole(parallel, per_sample):
        return whole_samples(parallel, per_sample, B, kk)

    transfer = float(whole(stages.transfer[0, s], stages.transfer[0, s]) / kk)
    width = int(stages.width[0, s])  # section 1h: the sizes are one unit's share at the stage's degree
    view = problem.view_at(width)
    state_fixed, state_split = view.state_parts
    own = state_fixed[a : b + 1].sum() + float(problem.tie_state(a, b))  # section 1j: a tied parameter's copy
    # a stage holds once what two of its layers save; its first layer's share is its own copy
    activations = view.held_once[a : b + 1].sum() + view.shared_entry[a]
    again = bool(stages.recompute[0, s])  # section 1g
    casts = view.cast_bytes[a : b + 1].sum()  # section 1b
    if problem.pipelined:
        in_flight = int(stages.in_flight[0, s])
        held = activations_held(in_flight, activations, problem.stage_inputs[a] if again else None)
        own += copies_held(in_flight, casts, again)
        memory = float(amdahl(own + reserved[t], whole(state_split[a : b + 1].sum() + held, held), kk))
        micro = stages.micro_parallel[0, s]
        compute = float(amdahl(stages.micro_serial[0, s], whole(micro, micro), kk)) - transfer
        comm = float(ring_allreduce(stages.sync[0, s], kk))
        step = amdahl(stages.sc[0, s], whole(stages.pc[0, s], stages.ps[0, s]), kk)
        pipeline = {"update_s": float(stages.update[0, s]), "step_s": float(step), "in_flight": in_flight}
    else:
        own += casts
        memory = float(amdahl(own, whole(state_split[a : b + 1].sum() + activations, activations), kk))
        if problem.reserved is not None:
            memory += float(reserved[t])
        compute = float(amdahl(stages.sc[0, s], whole(stages.pc[0, s], stages.ps[0, s]), kk))
        comm = float(amdahl(stages.sd[0, s], whole(stages.pd[0, s], stages.pd[0, s]), kk))
    return Stage.model_construct(
        first=a,
        last=b,
        layers=list(problem.layer_names[a : b + 1]),
        resource=problem.types[t],
        replicas=int(k[0, s]),
        compute_s=compute,
        comm_s=comm,
        throughput=float(sc.stage_throughput[0, s]),
        transfer_s=transfer,
        memory_gb=memory / 1e9,
        recompute=True if again else None,
        tp=width if width > 1 else None,
        **_tied(problem, a, b, t),
        **pipeline,
    )


def _tied(problem: Problem, a: int, b: int, t: int) -> dict[str, Any]:
    """Section 1j: ``tied_s``, the seconds per step stage ``a..b`` on ``t`` spends keeping the tensors it
    shares with other stages one, where it shares any."""
    if not problem.ties or not split_terms(problem.ties, a, b)[1]:
        return {}
    return {"tied_s": float(problem.tie_seconds(a, b, t))}
