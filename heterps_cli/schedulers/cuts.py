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

from heterps_cli.costmodel import better, schedule_of_stages, throughput_floor
from heterps_cli.errors import InfeasibleError, TooLarge
from heterps_cli.formats import Plan
from heterps_cli.objective import Objective
from heterps_cli.plan import make_plan
from heterps_cli.problem import Problem
from heterps_cli.schedulers.base import SolveOptions
from heterps_cli.schedulers.scoring import Best, Evaluator, Provisioned, Reference, rewards, take_rows

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


# Stage cells ((layers + 1)^2 x types) up to which the training loop cuts its samples' runs exactly
# (RunCutter): a grid refill per target is then a few milliseconds; 577 layers x 3 types.
CUT_CELLS = 1_000_000


class RunCutter:
    """The exact step inside a search's loop: each sampled schedule's runs of one type cut into stages
    (docs/spec.md section 1: neighbouring stages may share a type) at the least price rate that reaches
    a throughput, by the exact solver's replica grid and a DP over each schedule's own cuts. The
    searches then rank a type order by a plan of its best cut, not of its maximal runs only. Type limits
    are left to the exact provisioning that scores the cut schedule."""

    def __init__(self, problem: Problem):
        from heterps_cli.schedulers.exact.grid import ReplicaGrid
        from heterps_cli.schedulers.exact.kernel import Chain, stage_table

        self.p = problem
        self.grids = [ReplicaGrid(problem, stage_table(problem), Chain.of_types(problem.n_types)) for _ in range(2)]

    @staticmethod
    def of(problem: Problem) -> RunCutter | None:
        """A cutter where the exact step is one DP over stage boundaries at a throughput (no pipeline,
        no nodes, no tensor parallelism, stages not kept maximal) and cheap; else None."""
        simple = not (problem.pipelined or problem.nodes is not None or problem.maximal_stages)
        small = (problem.n_layers + 1) ** 2 * problem.n_types <= CUT_CELLS
        return RunCutter(problem) if simple and small and len(problem.views) == 1 else None

    def __call__(self, types: np.ndarray, target: float, which: int = 0) -> np.ndarray:
        """``[B, n]`` schedules of types cut at ``target`` (labels that keep the cut stages apart, as
        :func:`~heterps_cli.costmodel.labelled`); a row none of whose cuts reaches it stays as it was.
        ``which`` grid serves the target (each keeps its last target: walks upwards are cheap)."""
        B, n = types.shape
        grid = self.grids[which]
        grid.replicas(target)
        rate = grid.rate  # [i, j, t]: stage j..i-1 on t, inf where it cannot reach the target
        starts = np.ones((B, n), dtype=bool)
        starts[:, 1:] = types[:, 1:] != types[:, :-1]
        run = np.cumsum(starts, axis=1)
        f = np.full((B, n + 1), np.inf)
        f[:, 0] = 0.0
        back = np.zeros((B, n + 1), dtype=np.int64)
        for i in range(1, n + 1):
            same = run[:, :i] == run[:, i - 1 : i]  # stage j..i-1 stays in one run
            cost = rate[i, :i, :][np.arange(i)[None, :], types[:, i - 1 : i]]  # [B, i]
            total = np.where(same, f[:, :i] + cost, np.inf)
            back[:, i] = total.argmin(axis=1)
            f[:, i] = total[np.arange(B), back[:, i]]
        out = types.copy()
        for b in np.flatnonzero(np.isfinite(f[:, n])):
            i, cuts = n, []
            while i > 0:
                cuts.append((int(back[b, i]), i))
                i = int(back[b, i])
            for s, (j, i) in enumerate(reversed(cuts)):
                out[b, j:i] = types[b, j] + self.p.n_types * (s % 2)
        return out


def cut_scored(
    evaluate: Evaluator, cutter: RunCutter | None, schedules: np.ndarray, best: Best, reference: Reference | None = None
) -> tuple[np.ndarray, Provisioned]:
    """``schedules`` scored each as the better (by :func:`~.scoring.rewards`) of itself and its type order
    cut exactly by ``cutter`` at the throughput floor and at the ``best`` plan's throughput (objective
    time: just above it, where a cut that reaches is a faster plan): the schedules so scored, the cuts
    in their labels, and their scores. Without a cutter, the schedules and their own scores."""
    scores = evaluate(schedules)
    if cutter is None:
        return schedules, scores
    problem = cutter.p
    reference, types = reference or Reference.of(scores), schedules % problem.n_types
    targets = [throughput_floor(problem)]
    if best.schedule is not None:
        time = problem.objective is Objective.TIME
        targets.append(float(np.nextafter(best.throughput, np.inf)) if time else best.throughput)
    for which, target in enumerate(x for x in targets if x > 0):
        cut = cutter(types, target, which)
        cut_scores = evaluate(cut)
        take = rewards(problem, cut_scores, reference) > rewards(problem, scores, reference)
        schedules, scores = np.where(take[:, None], cut, schedules), take_rows(scores, cut_scores, take)
    return schedules, scores
