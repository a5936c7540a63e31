"""What would reach a throughput no plan reaches within the units there are: the units a plan needs
beyond them, or the term that caps the fastest plan even on many more (the exact solver's error for an
infeasible ``--min-throughput``, with limits per type or with whole nodes)."""

from __future__ import annotations

import numpy as np

import heterps_cli.schedulers.exact.walks as walks
from heterps_cli.costmodel import throughput_floor
from heterps_cli.errors import TooLarge
from heterps_cli.figures import count
from heterps_cli.objective import Objective
from heterps_cli.plan import make_plan
from heterps_cli.problem import Problem
from heterps_cli.schedulers.exact.pipeline import solver_for
from heterps_cli.schedulers.exact.step import schedule_of
from heterps_cli.stages import label_parts

MORE_UNITS = 100  # an infeasible throughput is tried again on this many times every limit


def more_units(problem: Problem, nodes: bool = False) -> str:
    """What would reach the required throughput when no plan does within the limits (``nodes``: the
    units every available node holds): the units a plan needs beyond them, or, when even
    :data:`MORE_UNITS` times every limit is not enough, the term of the bottleneck that caps it there
    (a synchronisation that grows with replicas, say)."""
    more_of = "offer more nodes" if nodes else "raise the limits"
    give_up = f"Lower the required throughput (--min-throughput) or {more_of}"
    more = problem.replace(limits=problem.limits * MORE_UNITS, min_throughput=0.0, max_cost=None, nodes=None)
    try:
        best, _ = walks.max_throughput(solver_for(more.replace(objective=Objective.TIME), None))
    except TooLarge:
        best = None
    if best is None:
        return give_up
    floor = throughput_floor(problem)
    every = "the units of every node" if nodes else "every limit"
    if best.throughput < floor:
        plan = make_plan(more, schedule_of(more, best.stages), best.replicas, scheduler="exact")
        assert plan.explanation is not None, "a plan of finite throughput explains itself"
        why = f"{plan.explanation[0]}; {plan.explanation[1]}"
        return (
            f"With {MORE_UNITS} times {every} the fastest plan reaches only {count(best.throughput, 1)} "
            f"samples/s: {why}. Lower the required throughput (--min-throughput)"
        )
    cheapest = solver_for(more.replace(objective=Objective.COST), None).cheapest(floor)
    if cheapest is None or not cheapest.within:
        return give_up
    used = np.zeros(problem.n_types, dtype=np.int64)
    for (_, _, label), k in zip(cheapest.stages, cheapest.replicas):
        t, _, degree = label_parts(problem.n_types, np.array(label))  # sections 1g, 1h: a stage's label
        used[int(t)] += int(k) * int(problem.widths[int(degree)])
    there = "every node holds" if nodes else "the limit is"
    over = [
        f"{count(int(u))} {problem.types[t]} ({there} {count(int(problem.limits[t]))})"
        for t, u in enumerate(used)
        if u > problem.limits[t]
    ]
    lower = "lower the required throughput (--min-throughput)"
    return f"The cheapest plan that reaches it needs {', '.join(over)}: {more_of}, or {lower}"
