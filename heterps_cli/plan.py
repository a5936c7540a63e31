"""The plan every scheduler returns (docs/spec.md section 4), built from a schedule and replica counts.

A plan's figures are never taken from a scheduler: :func:`make_plan` recomputes
them with the cost model from the stages, so every scheduler's plan is
checkable in the same way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

import numpy as np

from heterps_cli.costmodel import score, split_stages
from heterps_cli.explain import explanation
from heterps_cli.formulas import activations_held, amdahl, ring_allreduce
from heterps_cli.nodes import place
from heterps_cli.objective import Objective
from heterps_cli.problem import Problem


@dataclass(frozen=True)
class Stage:
    first: int
    last: int
    layers: tuple[str, ...]
    resource: str
    replicas: int
    compute_s: float
    comm_s: float
    throughput: float
    transfer_s: float = 0.0  # section 1b: the stage-boundary part of comm_s (X_s / k)
    memory_gb: float = 0.0  # section 1b: what each replica holds, 1e9 bytes
    # Section 1d, None without a pipeline schedule: compute_s and transfer_s are then per micro-batch,
    # comm_s the gradient all-reduce per step, and these the rest of a step.
    update_s: float | None = None  # the optimiser step
    step_s: float | None = None  # (M + S - 1) (compute_s + transfer_s) + comm_s + update_s
    in_flight: int | None = None  # micro-batches whose activations a replica holds at once
    nodes: dict[str, int] | None = None  # section 1e: replicas on each rented node, by its name KIND#i


@dataclass(frozen=True)
class Plan:
    model: str
    cluster: str
    objective: Objective
    scheduler: str
    seed: int
    batch_size: int
    samples: float
    epochs: float
    min_throughput: float
    max_cost: float | None
    stages: tuple[Stage, ...]
    resources: dict[str, int]
    limits: dict[str, int]
    memory: dict[str, float | None]  # section 1b: the cluster's memory_gb per type (None: not given)
    bandwidth: dict[str, float | None]  # and its bandwidth_gbps
    throughput: float
    bottleneck: int
    time_s: float
    cost_usd: float
    feasible: bool
    solve_s: float
    optimal: bool | None = None  # True only when a scheduler proves it (exact)
    evaluations: int | None = None  # schedules the scheduler scored with the cost model
    notes: tuple[str, ...] = ()  # what a reader should know about how the plan was found
    # exact stopped by --time-limit: how far the plan may be from the optimum, proven (cost:
    # cost / lower bound - 1; time: 1 - throughput / upper bound). None otherwise.
    gap: float | None = None
    micro_batches: int = 0  # section 1d: M per step (0: no pipeline schedule)
    reserved: dict[str, float | None] | None = None  # section 1d: memory_reserved_gb per type, if any is given
    rental: dict[str, int] | None = None  # section 1e: nodes of each kind rented (holding the plan's units)
    rate: float | None = None  # section 1e: USD an hour of the rental
    idle: dict[str, int] | None = None  # section 1e: units of each type the rental holds and the plan leaves unused
    explanation: tuple[str, ...] = ()  # the bottleneck's binding term and what holds it (heterps_cli.explain)
    what_if: tuple[dict, ...] | None = None  # section 1e, --explain: one node more or fewer of each kind
    links: dict[str, float] | None = None  # section 1e: Gbit/s of the node link each type talks over
    # Not written to plan files: they are for the run that made the plan.
    units: dict[str, str] = field(default_factory=dict)  # the cluster's unit label per type
    interrupted: bool = False  # Ctrl-C cut the search short (the notes say so too)

    @property
    def schedule(self) -> list[str]:
        return [s.resource for s in self.stages for _ in range(s.first, s.last + 1)]

    def to_dict(self) -> dict:
        """The plan file's mapping (docs/spec.md section 4, :class:`~heterps_cli.formats.PlanFile`)."""
        from heterps_cli.formats import PlanFile, PlanStage, WhatIf

        pipelined = bool(self.micro_batches)
        stages = [
            PlanStage.model_construct(
                first=s.first,
                last=s.last,
                layers=list(s.layers),
                resource=s.resource,
                replicas=s.replicas,
                compute_s=s.compute_s,
                comm_s=s.comm_s,
                throughput=s.throughput,
                transfer_s=s.transfer_s,
                memory_gb=s.memory_gb,
                update_s=s.update_s if pipelined else None,
                step_s=s.step_s if pipelined else None,
                in_flight=s.in_flight if pipelined else None,
                nodes=dict(s.nodes) if s.nodes is not None else None,
            )
            for s in self.stages
        ]
        return PlanFile.model_construct(
            model=self.model,
            cluster=self.cluster,
            objective=self.objective,
            scheduler=self.scheduler,
            seed=self.seed,
            batch_size=self.batch_size,
            samples=self.samples,
            epochs=self.epochs,
            min_throughput=self.min_throughput,
            max_cost=self.max_cost,
            stages=stages,
            resources=dict(self.resources),
            limits=dict(self.limits),
            memory_gb=dict(self.memory),
            bandwidth_gbps=dict(self.bandwidth),
            memory_reserved_gb=dict(self.reserved) if self.reserved is not None else None,
            rental=dict(self.rental) if self.rental is not None else None,
            rate_usd_per_hour=self.rate,
            idle_units=dict(self.idle) if self.idle is not None else None,
            link_gbps=dict(self.links) if self.links is not None else None,
            global_batch=self.batch_size * self.micro_batches if pipelined else None,
            micro_batches=self.micro_batches if pipelined else None,
            throughput=self.throughput,
            bottleneck=self.bottleneck,
            time_s=self.time_s,
            cost_usd=self.cost_usd,
            feasible=self.feasible,
            optimal=self.optimal,
            evaluations=self.evaluations,
            notes=list(self.notes),
            explanation=list(self.explanation) or None,
            what_if=[WhatIf.model_construct(**w) for w in self.what_if] if self.what_if is not None else None,
            gap=self.gap,
            solve_s=round(self.solve_s, 6),
        ).written()

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, allow_nan=False)  # NaN/Infinity are not JSON


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
    notes: tuple[str, ...] = (),
    interrupted: bool = False,
    rental: dict[str, int] | None = None,
) -> Plan:
    """Build a :class:`Plan` for one schedule (type per layer) and its per-stage replica counts.

    With whole nodes (section 1e) the plan runs on ``rental`` (nodes per kind, holding its units);
    without one, on the best of the cheapest rental holding them and each single node with links
    that holds them (:func:`_rental_for`)."""
    stages = split_stages(problem, np.asarray(schedule)[None, :])
    S = int(stages.valid.sum())
    k = np.zeros(stages.valid.shape)
    k[0, :S] = np.asarray(replicas, dtype=float)
    sc = score(problem, stages, k)
    cluster_bandwidth = problem.bandwidth
    links = None
    if problem.nodes is not None and np.isfinite(sc.rate[0]):
        if rental is None:
            rental = _rental_for(problem, schedule, k, sc)
        counts = problem.nodes.counts(rental)
        over = problem.nodes.links(counts, sc.used[0])
        rate = np.array([float(counts @ problem.nodes.price)])
        if (over > 0).any():
            problem = problem.over_links(counts, sc.used[0])
            stages = split_stages(problem, np.asarray(schedule)[None, :])
            links = {t: float(g * 8 / 1e9) for t, g in zip(problem.types, over) if g > 0}
        sc = score(problem, stages, k, rate=rate)
    else:
        rental = None
    out = tuple(_stage(problem, stages, k, sc, s) for s in range(S))
    idle = None
    if rental is not None:
        assert problem.nodes is not None
        held = problem.nodes.held(rental)
        assert (held >= sc.used[0]).all(), "the rental holds the plan's units"
        idle = {t: int(h - u) for t, h, u in zip(problem.types, held, sc.used[0])}
        idle |= problem.nodes.others_held(problem.nodes.counts(rental))  # section 1e: every unit the rental holds
        placed = place(problem.nodes, problem.types, rental, [(int(stages.type[0, s]), k[0, s]) for s in range(S)])
        out = tuple(replace(stage, nodes=where) for stage, where in zip(out, placed))
    # Section 1e: the nodes' units of types no layer runs on, never used and all there to rent.
    others = {} if problem.nodes is None else problem.nodes.others_held(problem.nodes.available)
    plan = Plan(
        model=problem.model,
        cluster=problem.cluster,
        objective=problem.objective,
        scheduler=scheduler,
        seed=seed,
        batch_size=problem.batch_size,
        samples=problem.samples,
        epochs=problem.epochs,
        min_throughput=problem.min_throughput,
        max_cost=problem.max_cost,
        stages=out,
        resources={t: int(u) for t, u in zip(problem.types, sc.used[0])} | {t: 0 for t in others},
        limits={t: int(n) for t, n in zip(problem.types, problem.limits)} | others,
        memory={t: float(m / 1e9) if np.isfinite(m) else None for t, m in zip(problem.types, problem.memory)},
        bandwidth={t: float(b * 8 / 1e9) if np.isfinite(b) else None for t, b in zip(problem.types, cluster_bandwidth)},
        throughput=float(sc.throughput[0]),
        bottleneck=int(sc.bottleneck[0]),
        time_s=float(sc.time_s[0]),
        cost_usd=float(sc.cost[0]),
        feasible=bool(sc.feasible[0]),
        solve_s=solve_s,
        optimal=optimal,
        evaluations=evaluations,
        notes=notes,
        micro_batches=problem.micro_batches,
        reserved=(
            {t: float(r / 1e9) for t, r in zip(problem.types, problem.reserved)}
            if problem.reserved is not None
            else None
        ),
        units=dict(zip(problem.types, problem.units)),
        interrupted=interrupted,
        rental=rental,
        rate=float(sc.rate[0]) if rental is not None else None,
        idle=idle,
        links=links,
    )
    return replace(plan, explanation=explanation(problem, plan)) if np.isfinite(plan.throughput) else plan


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
    transfer = float(stages.transfer[0, s] / kk)
    state_fixed, state_split = problem.state_parts
    # a stage holds once what two of its layers save; its first layer's share is its own copy
    activations = problem.held_once[a : b + 1].sum() + problem.shared_entry[a]
    if problem.pipelined:
        in_flight = int(stages.in_flight[0, s])
        held = activations_held(in_flight, activations)
        memory = float(amdahl(state_fixed[a : b + 1].sum() + reserved[t], state_split[a : b + 1].sum() + held, kk))
        compute = float(amdahl(stages.micro_serial[0, s], stages.micro_parallel[0, s], kk)) - transfer
        comm = float(ring_allreduce(stages.sync[0, s], kk))
        step = amdahl(stages.sc[0, s], stages.pc[0, s], kk)
        pipeline = {"update_s": float(stages.update[0, s]), "step_s": float(step), "in_flight": in_flight}
    else:
        memory = float(amdahl(state_fixed[a : b + 1].sum(), state_split[a : b + 1].sum() + activations, kk))
        if problem.reserved is not None:
            memory += float(reserved[t])
        compute = float(amdahl(stages.sc[0, s], stages.pc[0, s], kk))
        comm = float(amdahl(stages.sd[0, s], stages.pd[0, s], kk))
    return Stage(
        first=a,
        last=b,
        layers=problem.layer_names[a : b + 1],
        resource=problem.types[t],
        replicas=int(k[0, s]),
        compute_s=compute,
        comm_s=comm,
        throughput=float(sc.stage_throughput[0, s]),
        transfer_s=transfer,
        memory_gb=memory / 1e9,
        **pipeline,
    )
