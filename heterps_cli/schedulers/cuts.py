"""The heuristics' plans in the whole plan space (docs/spec.md section 1): a search chooses each
layer's type, and the exact solver then cuts each run of one type into stages (neighbouring stages may
share a type) and provisions them, on the problem with every layer held to the type the search chose
except those within :data:`NEAR` layers of a change of type, which may take any type. genetic,
greedy and random score schedules of maximal runs, as the papers do, and so may change type only to
cut a run into two stages (one layer on another type between two runs of one type): the freedom at
the changes lets the exact step undo that. This last step alone is exact.

rl and tapp also cut inside their loop: every schedule they score is scored as well with its runs cut
exactly at a throughput (:class:`RunCutter`, :func:`cut_scored`), so that a type order is ranked by
its best cut (docs/schedulers/rl.md)."""

from __future__ import annotations

import time

import numpy as np

from heterps_cli.costmodel import better, throughput_floor
from heterps_cli.errors import InfeasibleError, TooLarge
from heterps_cli.formats import Plan
from heterps_cli.objective import Objective
from heterps_cli.plan import make_plan
from heterps_cli.problem import Problem
from heterps_cli.schedulers.base import SolveOptions
from heterps_cli.schedulers.scoring import Best, Evaluator, Provisioned, Reference, rewards, take_rows
from heterps_cli.stages import label_parts, schedule_of_stages, stage_ids

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


# The training loop cuts its samples' runs exactly (RunCutter) where every span's best cut at a target,
# (layers + 1)^3 x types / 2 DP cells, is at most this: 173 layers of 3 types, 0.05 s a target.
CUT_CELLS = 8_000_000


class RunCutter:
    """The exact step inside a search's loop: each sampled schedule's runs of one type cut into stages
    (docs/spec.md section 1: neighbouring stages may share a type) at the least price rate that reaches
    a throughput. The rate is a sum over stages, so each run's best cut is its own: at each target, one
    DP over the exact solver's replica grid gives every span's best cut on every type, and a schedule's
    cut is its runs' (type limits are left to the exact provisioning that scores the cut schedule)."""

    def __init__(self, problem: Problem):
        from heterps_cli.schedulers.exact.grid import ReplicaGrid
        from heterps_cli.schedulers.exact.kernel import Chain
        from heterps_cli.schedulers.exact.terms import stage_table

        self.p = problem
        self.grid = ReplicaGrid(problem, stage_table(problem), Chain.of_types(problem.n_types))
        self.spans: dict[float, tuple[np.ndarray, np.ndarray]] = {}  # by target: best and back (see _spans)

    @staticmethod
    def of(problem: Problem) -> RunCutter | None:
        """A cutter where the exact step is one DP over stage boundaries at a throughput (no pipeline,
        no nodes, no tensor parallelism, stages not kept maximal) and cheap; else None."""
        simple = not (problem.pipelined or problem.nodes is not None or problem.maximal_stages)
        small = (problem.n_layers + 1) ** 3 * problem.n_types / 2 <= CUT_CELLS
        return RunCutter(problem) if simple and small and len(problem.views) == 1 else None

    def _spans(self, target: float) -> tuple[np.ndarray, np.ndarray]:
        """``best[j0, i, t]``: the least price rate of layers ``j0..i-1`` on ``t`` cut into stages that each
        reach ``target`` (inf: none); ``back[j0, i, t]``: where that cut's last stage starts."""
        if target not in self.spans:
            if len(self.spans) >= 4:  # the floor and the best plan's throughput, as it moves
                self.spans.pop(next(iter(self.spans)))
            self.grid.replicas(target)
            rate = self.grid.rate  # [i, j, t]: stage j..i-1 on t, inf where it cannot reach the target
            n1, T = rate.shape[0], rate.shape[2]
            best = np.full((n1, n1, T), np.inf)
            best[np.arange(n1), np.arange(n1)] = 0.0
            back = np.zeros((n1, n1, T), dtype=np.int64)
            for i in range(1, n1):
                total = best[:i, :i, :] + rate[i, :i, :][None]  # [j0, j, t]: the last stage j..i-1
                back[:i, i, :] = total.argmin(axis=1)
                best[:i, i, :] = np.take_along_axis(total, back[:i, i : i + 1, :], axis=1)[:, 0, :]
            self.spans[target] = best, back
        return self.spans[target]

    def __call__(self, types: np.ndarray, target: float) -> np.ndarray:
        """``[B, n]`` schedules of types cut at ``target`` (labels that keep the cut stages apart, as
        :func:`~heterps_cli.stages.labelled`); a row some run of which no cut lets reach it stays as
        it was."""
        best, back = self._spans(target)
        B, n = types.shape
        row, first = np.nonzero(stage_ids(types)[0])  # every run, row by row
        end = np.append(first[1:], n)
        end[np.append(row[1:] != row[:-1], True)] = n  # a row's last run ends at the last layer
        t = types[row, first]
        reached = np.ones(B, dtype=bool)
        np.logical_and.at(reached, row, np.isfinite(best[first, end, t]))
        cut = np.zeros((B, n + 1), dtype=bool)
        at = end.copy()
        while (going := at > first).any():  # walk each run's cut back from its end
            at[going] = back[first[going], at[going], t[going]]
            cut[row[going], at[going]] = True
        parity = (np.cumsum(cut[:, :n], axis=1) - 1) % 2
        return np.where(reached[:, None], types + self.p.n_types * parity, types)


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
    reference, types = reference or Reference.of(scores), label_parts(problem.n_types, schedules)[0]
    targets = [throughput_floor(problem)]
    if best.schedule is not None:
        time = problem.objective is Objective.TIME
        targets.append(float(np.nextafter(best.throughput, np.inf)) if time else best.throughput)
    for target in (x for x in targets if x > 0):
        cut = cutter(types, target)
        cut_scores = evaluate(cut)
        take = rewards(problem, cut_scores, reference) > rewards(problem, scores, reference)
        schedules, scores = np.where(take[:, None], cut, schedules), take_rows(scores, cut_scores, take)
    return schedules, scores
