"""Run several schedulers on one problem with one budget and seed, and measure them against the optimum.

rl runs first: unless a budget is given, genetic and random then get exactly
the number of cost-model evaluations rl used, so the comparison is fair.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from heterps_cli.errors import InfeasibleError
from heterps_cli.plan import Plan
from heterps_cli.problem import Problem
from heterps_cli.schedulers import SCHEDULERS, Budget, Progress, solve

BUDGETED = ("genetic", "random")  # the schedulers whose budget is a number of evaluations


@dataclass(frozen=True)
class Entry:
    scheduler: str
    plan: Plan | None  # None when the scheduler found no feasible plan
    failure: str | None  # why not
    solve_s: float
    gap: float | None = None  # to the exact optimum: cost / optimum - 1, or 1 - throughput / optimum (time)

    def to_dict(self) -> dict:
        plan = self.plan
        return {
            "scheduler": self.scheduler,
            "feasible": plan is not None,
            "cost_usd": plan.cost_usd if plan else None,
            "throughput": plan.throughput if plan else None,
            "resources": plan.resources if plan else None,
            "evaluations": plan.evaluations if plan else None,
            "solve_s": self.solve_s,
            "gap": self.gap,
            "error": self.failure,
            "plan": plan.to_dict() if plan else None,
        }


def compare_schedulers(
    problem: Problem,
    names: list[str],
    *,
    seed: int = 0,
    budget: Budget = Budget(),
    progress: Progress | None = None,
    on_done: Callable[[Entry], None] | None = None,
) -> list[Entry]:
    """Each scheduler in ``names`` on ``problem``; entries in the order of ``names``, gaps filled in.

    ``progress`` is passed to each scheduler with its position prefixed;
    ``on_done(entry)`` is called as each one finishes.
    """
    unknown = [n for n in names if n not in SCHEDULERS]
    if unknown:
        raise ValueError(f"unknown schedulers {unknown}")
    order = sorted(names, key=lambda n: n != "rl")  # stable: rl first, the rest as given
    done: dict[str, Entry] = {}
    for position, name in enumerate(order, 1):
        given = budget
        if name in BUDGETED and budget.evaluations is None and "rl" in done and done["rl"].plan is not None:
            given = replace(budget, evaluations=done["rl"].plan.evaluations)
        own = given.of(name)

        def report(
            description: str,
            completed: float | None = None,
            total: float | None = None,
            _prefix: str = f"[{position}/{len(order)}] ",
        ) -> None:
            if progress is not None:
                progress(_prefix + description, completed=completed, total=total)

        start = time.perf_counter()
        try:
            found, failure = solve(name, problem, seed=seed, progress=report, options=own), None
        except InfeasibleError as exc:
            found, failure = None, str(exc)
        done[name] = Entry(name, found, failure, found.solve_s if found else time.perf_counter() - start)
        if on_done is not None:
            on_done(done[name])
    entries = [done[n] for n in names]
    optimum = done.get("exact")
    if optimum is None or optimum.plan is None:
        if all(e.plan is None for e in entries):
            raise InfeasibleError((optimum or entries[0]).failure)
        return entries
    return [replace(e, gap=gap(problem, e.plan, optimum.plan)) if e.plan else e for e in entries]


def gap(problem: Problem, plan: Plan, optimum: Plan) -> float:
    """How much worse than the optimum: relative extra cost, or relative lost throughput (time)."""
    objective = problem.objective
    return objective.gap(
        objective.figure(plan.cost_usd, plan.throughput), objective.figure(optimum.cost_usd, optimum.throughput)
    )
