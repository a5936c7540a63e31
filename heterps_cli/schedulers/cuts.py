"""The heuristics' plans in the whole plan space (docs/spec.md section 1): a search chooses each
layer's type, and the exact solver then cuts each run of one type into stages (neighbouring stages may
share a type) and provisions them, on the problem with every layer held to the type the search chose.
The searches score schedules of maximal runs, as the papers do; this last step alone is exact."""

from __future__ import annotations

import time

import numpy as np

from heterps_cli.costmodel import better, schedule_of_stages
from heterps_cli.errors import InfeasibleError, TooLarge
from heterps_cli.formats import Plan
from heterps_cli.plan import make_plan
from heterps_cli.problem import Problem
from heterps_cli.schedulers.base import SolveOptions


def cut_exactly(problem: Problem, plan: Plan, time_limit: float | None) -> Plan:
    """``plan`` with each of its types' runs cut into stages and provisioned exactly, where that is
    better under the objective; else ``plan``. Within ``time_limit`` seconds (None: none); a model too
    long for the exact solver's grid keeps the search's plan."""
    if problem.maximal_stages or plan.interrupted or (time_limit is not None and time_limit <= 0):
        return plan
    from heterps_cli.schedulers.exact.scheduler import solve as exact_solve

    start = time.perf_counter()
    chosen = np.zeros_like(problem.runnable)
    chosen[np.arange(problem.n_layers), [problem.types.index(t) for t in plan.schedule]] = True
    held = problem.replace(runnable=problem.runnable & chosen)
    try:
        cut = exact_solve(held, options=SolveOptions(time_limit=time_limit))
    except (InfeasibleError, TooLarge):
        return plan
    if not cut.feasible or not better(problem, cut.cost_usd, cut.throughput, plan.cost_usd, plan.throughput):
        return plan
    return make_plan(
        problem,
        schedule_of_stages(problem.types, cut.stages),
        [s.replicas for s in cut.stages],
        scheduler=plan.scheduler,
        seed=plan.seed,
        solve_s=(plan.solve_s or 0.0) + time.perf_counter() - start,
        optimal=None,
        evaluations=plan.evaluations,
        notes=[*plan.notes, "the exact solver cut its types' runs into stages and set their replicas"],
        rental=cut.rental,
    )
