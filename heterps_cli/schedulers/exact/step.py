"""The exact solver's questions at a bottleneck throughput (docs/exact.md).

For a fixed bottleneck throughput ``X`` every stage's cheapest replica count is
known in closed form, so the cheapest schedule reaching ``X`` is a shortest path
over stage boundaries: ``f[i, t]`` = cheapest way to run layers ``0..i-1`` with
the last stage on type ``t`` (the next stage must change type, docs/spec.md section 1).

Type limits couple the stages. When the unconstrained path breaks a limit, the
DP is re-run with the units of each type it overuses as part of the state (a
dense array per boundary and type), again while the answer overuses another
type: a plan cheapest under some of the limits that honours them all is the
cheapest. :class:`StepSolver` answers "the cheapest plan reaching ``X``" at
rising ``X`` cheaply, which :mod:`.walks` and :mod:`heterps_cli.frontier` walk.
"""

from __future__ import annotations

import numpy as np

from heterps_cli.costmodel import meets_targets
from heterps_cli.figures import count
from heterps_cli.formulas import SLACK, run_cost, sample_hours, stage_throughput
from heterps_cli.problem import Problem
from heterps_cli.schedulers.base import Progress
from heterps_cli.schedulers.exact.grid import ReplicaGrid
from heterps_cli.schedulers.exact.kernel import (
    MAX_STATE_CELLS,
    Candidate,
    Chain,
    chain_dp,
    limit_state,
    limited_dp,
    overused,
    state_cells,
    units_used,
)
from heterps_cli.schedulers.exact.terms import Table, stage_table
from heterps_cli.stages import labelled

PENALTY_DOUBLINGS = 12  # penalty doublings that look for a plan within every limit at one relaxed step


class StepSolver:
    """Cheapest plan at a given bottleneck throughput, over all schedules, within the limits."""

    def __init__(
        self,
        problem: Problem,
        progress: Progress | None,
        table: Table | None = None,
        relax: bool = True,
        chain: Chain | None = None,
    ):
        self.p = problem
        self.relax = relax  # False: refuse (TooLarge) rather than relax a limit (see cheapest)
        self.tab = stage_table(problem) if table is None else table
        # The DP's types (the table's last axis): the resource types, or section 1d's (type, place) pairs.
        self.chain = chain or Chain.of_types(problem.n_types, problem.maximal_stages)
        self.grid = ReplicaGrid(problem, self.tab, self.chain)
        self.price = self.grid.price
        self.progress = progress
        self.evaluations = 0
        # Types whose limits the DP stopped tracking (too many states): see cheapest. While any is
        # relaxed, the candidates are lower bounds, and the plans found within every limit are kept.
        self.relaxed: set[int] = set()
        self.cheapest_found: Candidate | None = None  # the cheapest within every limit and the targets
        self.fastest_found: Candidate | None = None  # the fastest within every limit and the targets

    def replicas(self, target: float) -> np.ndarray:
        """:meth:`.grid.ReplicaGrid.replicas` of this solver's grid."""
        return self.grid.replicas(target)

    def lower_bound(self, target: float) -> float:
        """No plan reaching ``target`` or any higher throughput costs less than this."""
        self.replicas(target)
        value, _ = chain_dp(self.grid.bound, self.chain)
        return sample_hours(self.p.work) * value

    def cheapest(self, target: float) -> Candidate | None:
        """The plan of least price rate reaching ``target`` within the limits (None: no plan does).

        Exact unless honouring the binding limits needs more than :data:`MAX_STATE_CELLS` states.
        Then the limit of the tracked type with the most units is relaxed (:attr:`relaxed`, for
        the rest of the search) and the answer is the cheapest plan within the other limits: a
        lower bound, since every plan within all limits is among those it chose from. A plan
        within every limit is then looked for by pricing the overused types higher
        (:func:`_repair`), and the best such plans are kept (:attr:`cheapest_found`).
        """
        self.evaluations += 1
        if self.progress:
            self.progress(f"exact: DP {self.evaluations} at {count(target, 1)} samples/s")
        p = self.p
        K = self.replicas(target)
        _, stages = chain_dp(self.grid.rate, self.chain)
        if stages is None:
            return None
        tracked: set[int] = set()
        while over := overused(p, self.chain, stages, K) - self.relaxed:
            # Track the units of every type the best plan so far overuses, and solve again: a
            # plan that is cheapest while honouring only some limits and honours them all is
            # the cheapest. A type that was never overused needs no state.
            tracked |= over
            state = limit_state(p, tracked)
            while self.relax and state_cells(p, self.tab, state) > MAX_STATE_CELLS:
                self.relaxed.add(max(tracked - self.relaxed, key=lambda t: p.limits[t]))
                tracked -= self.relaxed
                state = limit_state(p, tracked)
            stages = limited_dp(p, self.chain, K, self.price, state)
            if stages is None:
                return None
        found = self.candidate(stages, K)
        # Every plan within all limits is kept (the steps before a relaxation are exact and count too).
        within = found if found.within else _repair(self, K, stages, tracked)
        if within is not None:
            self._keep(within)
        return found

    def candidate(self, stages, K) -> Candidate:
        """The DP's ``stages`` with replicas ``K`` as a plan: its throughput, cost, price rate, and
        whether it is within every limit."""
        p = self.p
        k = [int(K[i, j, t]) for j, i, t in stages]
        thr = min(float(self.grid.reach[i, j, t]) for j, i, t in stages)
        rate = sum(self.price[t] * kk for (_, _, t), kk in zip(stages, k))
        return Candidate(stages, k, thr, run_cost(p.work, thr, rate), rate, not overused(p, self.chain, stages, K))

    def _keep(self, cand: Candidate) -> None:
        if not meets_targets(self.p, cand.throughput, cand.cost):
            return
        kept = self.cheapest_found
        if kept is None or (cand.cost, -cand.throughput) < (kept.cost, -kept.throughput):
            self.cheapest_found = cand
        kept = self.fastest_found
        if kept is None or (-cand.throughput, cand.cost) < (-kept.throughput, kept.cost):
            self.fastest_found = cand

    def reachable(self, target: float) -> bool:
        """Does some plan reach ``target`` within the limits?"""
        return self.reaching(target) is not None

    def reaching(self, target: float) -> Candidate | None:
        """A plan that reaches ``target`` within the limits, or None when none does.

        First a few Lagrangian rounds, each one cheap DP over weighted units
        ``sum_t w_t k_t``: a plan that fits proves "yes"; a weighted minimum above
        ``sum_t w_t N_t`` proves "no" (every plan within the limits would be below
        it). Weights of overused types double each round. Undecided: the exact DP.
        """
        p = self.p
        K = self.replicas(target)
        finite = np.isfinite(K)
        w = 1.0 / np.maximum(p.limits, 1).astype(float)  # any positive weights prove it; a type may have none
        for _ in range(8):
            units = w[self.chain.base] * self.chain.widths  # section 1h: a replica's units, weighted
            value, stages = chain_dp(np.where(finite, K * units[None, None, :], np.inf), self.chain)
            if stages is None or value > float(w @ p.limits) * (1 + SLACK):
                return None
            used = units_used(self.p, self.chain, stages, K)
            if (used <= p.limits).all():
                return self.candidate(stages, K)
            w = np.where(used > p.limits, 2 * w, w)
        return self.cheapest(target)

    def speed_bound(self) -> float:
        return speed_bound(self.p)


def _repair(solver: StepSolver, K: np.ndarray, stages, tracked: set[int]) -> Candidate | None:
    """A plan within every limit at the current target, if pricing the overused (relaxed) types
    higher finds one: a heuristic, used only while limits are relaxed."""
    price = solver.price.astype(float).copy()
    state = limit_state(solver.p, tracked)
    for _ in range(PENALTY_DOUBLINGS):
        over = np.isin(solver.chain.base, list(overused(solver.p, solver.chain, stages, K)))
        if not over.any():
            return solver.candidate(stages, K)
        price[over] = np.maximum(2 * price[over], max(float(price.max()), 1.0) / 8)
        stages = limited_dp(solver.p, solver.chain, K, price, state)
        if stages is None:
            return None
    return None


def speed_bound(problem: Problem) -> float:
    """No plan is faster than this: its slowest layer alone on all the units of its best type."""
    sc, pc, sd, pd = problem.parts
    alone = stage_throughput(sc, pc, sd, pd, problem.batch_size, problem.limits[None, :].astype(float))
    return float(np.where(problem.runnable, alone, 0.0).max(axis=1).min())


def schedule_of(problem: Problem, stages) -> np.ndarray:
    """The schedule of the DP's ``stages`` (``(first, end, type)`` each), each kept a stage of its own."""
    return labelled(problem.n_types, stages)
