"""The heuristics' plans in the whole plan space (docs/spec.md section 1): a search chooses each
layer's type, and the exact solver then cuts each run of one type into stages (neighbouring stages may
share a type) and provisions them, on the problem with every layer held to the type the search chose
except those within :data:`NEAR` layers of a change of type, which may take any type. The searches
score schedules of maximal runs, as the papers do, and so may change type only to cut a run into
two stages (one layer on another type between two runs of one type): the freedom at the changes lets
the exact step undo that. This last step alone is exact."""

from __future__ import annotations

import time

import numpy as np

from heterps_cli.costmodel import better, schedule_of_stages
from heterps_cli.errors import InfeasibleError, TooLarge
from heterps_cli.formats import Plan
from heterps_cli.plan import make_plan
from heterps_cli.problem import Problem
from heterps_cli.schedulers.base import SolveOptions

NEAR = 2  # layers each side of a change of type that the exact step may put on any type


def cut_exactly(problem: Problem, plan: Plan, time_limit: float | None) -> Plan:
    """``plan`` with each of its types' runs cut into stages and provisioned exactly, where that is
    better under the objective; else ``plan``. Within ``time_limit`` seconds (None: none); a model too
    long for the exact solver's grid keeps the search's plan."""
    if problem.maximal_stages or plan.interrupted or (time_limit is not None and time_limit <= 0):
        return plan
    from heterps_cli.schedulers.exact.scheduler import solve as exact_solve

    start = time.perf_counter()
    schedule = np.array([problem.types.index(t) for t in plan.schedule])
    chosen = np.zeros_like(problem.runnable)
    chosen[np.arange(problem.n_layers), schedule] = True
    for change in np.flatnonzero(np.diff(schedule)) + 1:
        chosen[max(0, change - NEAR) : change + NEAR] = True
    held = problem.each_degree(lambda view: {"runnable": view.runnable & chosen})
    try:
        cut = exact_solve(held, options=SolveOptions(time_limit=time_limit))
    except (InfeasibleError, TooLarge):
        return plan
    if not cut.feasible or not better(problem, cut.cost_usd, cut.throughput, plan.cost_usd, plan.throughput):
        return plan
    return make_plan(
        problem,
        schedule_of_stages(problem, cut.stages),
        [s.replicas for s in cut.stages],
        scheduler=plan.scheduler,
        seed=plan.seed,
        solve_s=(plan.solve_s or 0.0) + time.perf_counter() - start,
        optimal=None,
        evaluations=plan.evaluations,
        notes=[
            *plan.notes,
            f"the exact solver cut its types' runs into stages, chose the types within {NEAR} layers of each "
            "change of type, and set the replicas",
        ],
        rental=cut.rental,
    )
