"""The greedy scheduler: what a practitioner would try first, then a local improvement pass.

The rule: put each layer on the type it can run on with the lowest price x OCT
(cheapest compute per sample) under objective ``cost``, or the lowest OCT
(fastest compute) under objective ``time``; replicas come from the exact
provisioning. Then a local search (:mod:`heterps_cli.schedulers.local`: flip a
layer, recolour a stage, move a boundary, slide a stage) takes the best
improving move until none improves. It is deterministic: ``--seed`` changes
nothing.
"""

from __future__ import annotations

import numpy as np

from heterps_cli.objective import Objective
from heterps_cli.plan import Plan
from heterps_cli.problem import Problem
from heterps_cli.schedulers.base import Progress, SolveOptions
from heterps_cli.schedulers.local import budget_note, polish
from heterps_cli.schedulers.scoring import Reference, Search


def rule_schedule(problem: Problem) -> np.ndarray:
    """Each layer's type by the greedy rule (see the module docstring)."""
    per_sample = problem.oct * (
        np.maximum(problem.prices, 1e-12)[None, :] if problem.objective is Objective.COST else 1.0
    )
    return np.where(problem.usable, per_sample, np.inf).argmin(axis=1).astype(np.int64)


def solve(
    problem: Problem, *, seed: int = 0, progress: Progress | None = None, options: SolveOptions | None = None
) -> Plan:
    search = Search.begin(problem, seed, progress, options)
    evaluate, best = search.evaluate, search.best
    schedule = rule_schedule(problem)
    scored = evaluate(schedule[None])
    best.offer(problem, schedule[None], scored)
    notes = [f"the rule alone: {_figure(problem, scored)}"]
    stopped = polish(
        problem,
        evaluate,
        best,
        Reference.of(scored),
        search.rng,
        starts=[schedule],
        out_of_time=search.out_of_time,
        progress=search.report,
        name="greedy",
    )
    if search.out_of_time():
        notes.append("the local search stopped at the time limit")
    elif stopped:
        notes.append(budget_note(problem))
    return search.result("greedy", notes, hint="use --scheduler rl")


def _figure(problem: Problem, scored) -> str:
    if not scored.feasible[0]:
        return "infeasible"
    return problem.objective.shown(scored.cost[0], scored.throughput[0])
