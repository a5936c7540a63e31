"""The random scheduler: the best of N random valid schedules, the floor any method must beat.

Schedules are drawn as 1 to max(8, n/3) contiguous segments on random types
(:func:`~heterps_cli.schedulers.scoring.random_schedules`), each layer on a
type it can run on, and provisioned exactly. N is the evaluation budget
(``SearchOptions.evaluations``: ``compare`` gives it what rl used): distinct
schedules scored, drawn in batches until N are scored or three batches in a
row find no new one.
"""

from __future__ import annotations

import numpy as np

from heterps_cli.plan import Plan
from heterps_cli.problem import Problem
from heterps_cli.schedulers.base import Progress, SolveOptions
from heterps_cli.schedulers.scoring import (
    Evaluator,
    Search,
    evaluation_budget,
    random_schedules,
)

CHUNK = 1024


def solve(
    problem: Problem, *, seed: int = 0, progress: Progress | None = None, options: SolveOptions | None = None
) -> Plan:
    search = Search.begin(problem, seed, progress, options)
    rng, evaluate, best = search.rng, search.evaluate, search.best
    budget = evaluation_budget(options)
    notes, drawn, dry = [], 0, 0
    while evaluate.evaluations < budget:
        if search.out_of_time():
            notes.append(f"stopped at the time limit after {evaluate.evaluations:,} schedules")
            break
        if dry >= 3:  # a small model has fewer distinct schedules than the budget
            notes.append(f"only {evaluate.evaluations:,} distinct schedules found in {drawn:,} draws")
            break
        schedules = random_schedules(problem, CHUNK, rng, degrees=True)
        drawn += CHUNK
        fresh = _new_rows(schedules, evaluate)[: budget - evaluate.evaluations]
        if len(fresh):
            best.offer(problem, fresh, evaluate(fresh))
        dry = 0 if len(fresh) else dry + 1
        search.report(
            f"random: {evaluate.evaluations:,}/{budget:,} schedules", completed=evaluate.evaluations, total=budget
        )
    return search.result("random", notes, hint="give it more --evaluations")


def _new_rows(schedules: np.ndarray, evaluate: Evaluator) -> np.ndarray:
    """The distinct rows of ``schedules`` not scored yet, in the order drawn (so the budget is exact)."""
    keep, keys = [], set()
    for i, row in enumerate(schedules):
        key = evaluate.key(row)
        if key not in evaluate.cache and key not in keys:
            keys.add(key)
            keep.append(i)
    return schedules[keep]
