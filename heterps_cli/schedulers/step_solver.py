"""The exact solver's questions at a bottleneck throughput, and its walks over it (docs/exact.md).

For a fixed bottleneck throughput ``X`` every stage's cheapest replica count is
known in closed form, so the cheapest schedule reaching ``X`` is a shortest path
over stage boundaries: ``f[i, t]`` = cheapest way to run layers ``0..i-1`` with
the last stage on type ``t`` (the next stage must change type, docs/spec.md section 1).

Type limits couple the stages. When the unconstrained path breaks a limit, the
DP is re-run with the units of each type it overuses as part of the state (a
dense array per boundary and type), again while the answer overuses another
type: a plan cheapest under some of the limits that honours them all is the
cheapest. :class:`StepSolver` answers "the cheapest plan reaching ``X``" at
rising ``X`` cheaply, which :mod:`heterps_cli.frontier` walks too.

Over ``X`` (see costmodel's docstring): objective ``cost`` walks the right ends of
the price-rate steps upwards from ``min_throughput`` and stops at the first ``X``
no plan reaches or where a lower bound (a DP over the continuous relaxation)
exceeds the best cost. Objective ``time`` bisects for the largest reachable
``X`` (reachability only shrinks as ``X`` grows), then finishes by exact jumps;
the cheapest plan at that ``X`` breaks ties. With ``max_cost`` it walks every
step instead, since the budget is not monotone in ``X``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from heterps_cli.costmodel import (
    SLACK,
    cost_lower_bound,
    meets_targets,
    min_replicas,
    throughput_floor,
)
from heterps_cli.figures import count
from heterps_cli.formulas import run_cost, sample_hours, stage_throughput
from heterps_cli.problem import Problem
from heterps_cli.schedulers.base import Progress
from heterps_cli.schedulers.chain_dp import (
    MAX_STATE_CELLS,
    Candidate,
    Chain,
    _chain_dp,
    _chain_dp_limited,
    _Table,
    _table,
)

PENALTY_DOUBLINGS = 12  # penalty doublings that look for a plan within every limit at one relaxed step


class StepSolver:
    """Cheapest plan at a given bottleneck throughput, over all schedules, within the limits."""

    def __init__(
        self,
        problem: Problem,
        progress: Progress | None,
        table: _Table | None = None,
        relax: bool = True,
        chain: Chain | None = None,
    ):
        self.p = problem
        self.relax = relax  # False: refuse (TooLarge) rather than relax a limit (see cheapest)
        self.tab = _table(problem) if table is None else table
        # The DP's types (the table's last axis): the resource types, or section 1d's (type, place) pairs.
        self.chain = chain or Chain.of_types(problem.n_types)
        self.price = problem.prices[self.chain.base]  # per DP type
        self.unit_limit = problem.limits[self.chain.base]
        self.progress = progress
        self.evaluations = 0
        # Types whose limits the DP stopped tracking (too many states): see cheapest. While any is
        # relaxed, the candidates are lower bounds, and the plans found within every limit are kept.
        self.relaxed: set[int] = set()
        self.cheapest_found: Candidate | None = None  # the cheapest within every limit and the targets
        self.fastest_found: Candidate | None = None  # the fastest within every limit and the targets
        self.type_index = np.arange(len(self.chain.base))[None, None, :]
        self._target: float | None = None  # the target the grid below was computed for
        # The grid for _target (see replicas): replicas, their throughput, price rate and cost bound.
        self._K: np.ndarray = np.empty(0)
        self._reach: np.ndarray = np.empty(0)
        self._rate: np.ndarray = np.empty(0)
        self._bound: np.ndarray = np.empty(0)

    def replicas(self, target: float) -> np.ndarray:
        """``K[i, j, t]``: the fewest replicas with which stage ``j..i-1`` on ``t`` reaches ``target``
        within its type's limit and memory (inf: none). Read-only; valid until the next call."""
        if self._target is None or target < self._target:
            self._fill(target)
        elif target > self._target:
            # Walks go upwards: only cells whose throughput falls short of the new target change.
            # Replica counts only grow with the target, so the others keep theirs exactly.
            cells = np.flatnonzero(self._reach < target)
            if cells.size:
                self._raise(cells, target)
        self._target = target
        return self._K

    def _fill(self, target: float) -> None:
        """The whole grid for ``target``, a block of ends at a time: the temporaries of the closed
        form then take a block's memory, not the grid's (a 2,000-layer grid is 96 MB per array)."""
        t = self.tab
        shape = t.sc.shape
        if self._K.shape != shape:
            self._K, self._reach, self._rate, self._bound = (np.empty(shape) for _ in range(4))
        block = max(1, 2_000_000 // max(1, shape[1] * shape[2]))
        for lo in range(0, shape[0], block):
            rows = slice(lo, lo + block)
            K = min_replicas(t.sc[rows], t.pc[rows], t.sd[rows], t.pd[rows], self.p.step_samples, target, t.min_k[rows])
            K = np.where(t.ok[rows] & (K <= self.unit_limit[None, None, :]), K, np.inf)
            cells = np.arange(lo * shape[1] * shape[2], lo * shape[1] * shape[2] + K.size)
            self._K[rows] = K
            self._reach[rows] = self._throughput(cells, K.ravel()).reshape(K.shape)
            self._rate[rows] = self._priced(K, self.type_index)
            self._bound[rows] = self._per_stage_bound(K, self._reach[rows], self.type_index)

    def _raise(self, cells: np.ndarray, target: float) -> None:
        t = self.tab
        types = cells % len(self.chain.base)
        sc, pc, sd, pd = (a.ravel()[cells] for a in (t.sc, t.pc, t.sd, t.pd))
        k = min_replicas(sc, pc, sd, pd, self.p.step_samples, target, t.min_k.ravel()[cells])
        k = np.where(k <= self.unit_limit[types], k, np.inf)
        self._K.ravel()[cells] = k
        self._reach.ravel()[cells] = self._throughput(cells, k)
        self._rate.ravel()[cells] = self._priced(k, types)
        self._bound.ravel()[cells] = self._per_stage_bound(k, self._reach.ravel()[cells], types)

    def _throughput(self, cells: np.ndarray, k: np.ndarray) -> np.ndarray:
        """The throughput of each cell with ``k`` replicas; inf where it has none (it never changes again)."""
        t = self.tab
        sc, pc, sd, pd = (a.ravel()[cells] for a in (t.sc, t.pc, t.sd, t.pd))
        finite = np.isfinite(k)
        with np.errstate(invalid="ignore"):
            thr = stage_throughput(sc, pc, sd, pd, self.p.step_samples, np.where(finite, k, 1.0))
        return np.where(finite, thr, np.inf)

    def _priced(self, K: np.ndarray, types: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore"):  # a free type times an unreachable stage
            return np.where(np.isfinite(K), self.price[types] * K, np.inf)

    def _per_stage_bound(self, K: np.ndarray, reach: np.ndarray, types: np.ndarray) -> np.ndarray:
        """costmodel.cost_lower_bound per stage (inf where a stage cannot reach the target)."""
        return np.where(np.isfinite(K), cost_lower_bound(self.price[types], K, reach), np.inf)

    def lower_bound(self, target: float) -> float:
        """No plan reaching ``target`` or any higher throughput costs less than this."""
        self.replicas(target)
        value, _ = _chain_dp(self._bound, self.chain)
        return sample_hours(self.p.work) * value

    def cheapest(self, target: float) -> Candidate | None:
        """The plan of least price rate reaching ``target`` within the limits (None: no plan does).

        Exact unless honouring the binding limits needs more than :data:`MAX_STATE_CELLS` states.
        Then the limit of the tracked type with the most units is relaxed (:attr:`relaxed`, for
        the rest of the search) and the answer is the cheapest plan within the other limits: a
        lower bound, since every plan within all limits is among those it chose from. A plan
        within every limit is then looked for by pricing the overused types higher
        (:meth:`_repair`), and the best such plans are kept (:attr:`cheapest_found`).
        """
        self.evaluations += 1
        if self.progress:
            self.progress(f"exact: DP {self.evaluations} at {count(target, 1)} samples/s")
        p = self.p
        K = self.replicas(target)
        _, stages = _chain_dp(self._rate, self.chain)
        if stages is None:
            return None
        tracked: set[int] = set()
        while over := self._overused(stages, K) - self.relaxed:
            # Track the units of every type the best plan so far overuses, and solve again: a
            # plan that is cheapest while honouring only some limits and honours them all is
            # the cheapest. A type that was never overused needs no state.
            tracked |= over
            state = self._state(tracked)
            while self.relax and self._states(state) > MAX_STATE_CELLS:
                self.relaxed.add(max(tracked - self.relaxed, key=lambda t: p.limits[t]))
                tracked -= self.relaxed
                state = self._state(tracked)
            stages = self._limited(K, self.price, state)
            if stages is None:
                return None
        found = self._candidate(stages, K)
        # Every plan within all limits is kept (the steps before a relaxation are exact and count too).
        within = found if found.within else self._repair(K, stages, tracked)
        if within is not None:
            self._keep(within)
        return found

    def _candidate(self, stages, K) -> Candidate:
        p = self.p
        k = [int(K[i, j, t]) for j, i, t in stages]
        thr = min(float(self._reach[i, j, t]) for j, i, t in stages)
        rate = sum(self.price[t] * kk for (_, _, t), kk in zip(stages, k))
        return Candidate(stages, k, thr, run_cost(p.work, thr, rate), rate, not self._overused(stages, K))

    def _repair(self, K: np.ndarray, stages, tracked: set[int]) -> Candidate | None:
        """A plan within every limit at the current target, if pricing the overused (relaxed) types
        higher finds one: a heuristic, used only while limits are relaxed."""
        price = self.price.astype(float).copy()
        state = self._state(tracked)
        for _ in range(PENALTY_DOUBLINGS):
            over = np.isin(self.chain.base, list(self._overused(stages, K)))
            if not over.any():
                return self._candidate(stages, K)
            price[over] = np.maximum(2 * price[over], max(float(price.max()), 1.0) / 8)
            stages = self._limited(K, price, state)
            if stages is None:
                return None
        return None

    def _limited(self, K: np.ndarray, prices: np.ndarray, state: tuple[list[int], int | None]):
        """:func:`_chain_dp_limited`, or the plain DP when every limit it would track is relaxed."""
        if state[0] or state[1] is not None:
            return _chain_dp_limited(K, prices, self.p.limits, *state, self.chain)
        with np.errstate(invalid="ignore"):
            return _chain_dp(np.where(np.isfinite(K), prices[None, None, :] * K, np.inf), self.chain)[1]

    def _keep(self, cand: Candidate) -> None:
        if not meets_targets(self.p, cand.throughput, cand.cost):
            return
        kept = self.cheapest_found
        if kept is None or (cand.cost, -cand.throughput) < (kept.cost, -kept.throughput):
            self.cheapest_found = cand
        kept = self.fastest_found
        if kept is None or (-cand.throughput, cand.cost) < (-kept.throughput, kept.cost):
            self.fastest_found = cand

    def _states(self, state: tuple[list[int], int | None]) -> int:
        n1, _, T = self.tab.sc.shape
        return n1 * T * math.prod(int(self.p.limits[t]) + 1 for t in state[0])

    def _state(self, tracked: set[int]) -> tuple[list[int], int | None]:
        """The types whose units the limit-aware DP tracks, and the one it caps, for ``tracked`` limits.

        Either exactly the ``tracked`` types, or every type but one priced type, left out of the
        state and "capped": the DP then minimises its units and checks its limit at the end (its
        cost is its price times its units). Capping the type with the most units usually gives
        far fewer states: that is the choice whenever it does."""
        p = self.p
        state = sorted(tracked)
        priced = [t for t in range(p.n_types) if p.prices[t] > 0]
        if not priced:
            return state, None
        capped = max(priced, key=lambda t: p.limits[t])
        others = [t for t in range(p.n_types) if t != capped]

        def cells(types: list[int]) -> int:
            return math.prod(int(p.limits[t]) + 1 for t in types)

        if cells(others) < cells(state) or len(tracked) == p.n_types:
            return others, capped
        return state, None

    def _used(self, stages, K) -> np.ndarray:
        used = np.zeros(self.p.n_types)
        for j, i, t in stages:
            used[self.chain.base[t]] += K[i, j, t]
        return used

    def _overused(self, stages, K) -> set[int]:
        return set(np.flatnonzero(self._used(stages, K) > self.p.limits).tolist())

    # -- the two objectives -------------------------------------------------

    def min_cost(
        self, out_of_time: Callable[[], bool] = lambda: False, incumbent: Candidate | None = None
    ) -> tuple[Candidate | None, float]:
        """The cheapest plan, and a proven lower bound on the optimum's cost: the plan's own cost
        when the walk finished, less when ``out_of_time()`` stopped it first.

        A coarse scan first (targets at least 2% apart) finds a plan close to the best, so that the
        walk's skip rule, which grows with how far a step's plan is from the best, takes long jumps.
        With an ``incumbent`` (a plan found elsewhere), only plans that beat it are looked for, and
        it is returned itself when none does.
        """
        floor = throughput_floor(self.p)
        best, end, late = self._walk(floor, math.inf, incumbent, 1.02, 4, out_of_time)
        if best is None:
            return None, math.inf
        if late:  # the scan jumped: only what lies above the floor is bounded
            return best, min(best.cost, self.lower_bound(floor))
        if best.cost <= 0:
            return best, 0.0  # free: nothing is cheaper
        best, stop, late = self._walk(floor, end, best, 1.0, 8, out_of_time)
        assert best is not None, "the walk starts from the scan's plan and only replaces it"
        if late:  # every step below where it stopped was walked (or skipped as unable to win)
            return best, min(best.cost, self.lower_bound(stop))
        return best, best.cost

    def _walk(
        self,
        target: float,
        end: float,
        best: Candidate | None,
        stride: float,
        far: int,
        out_of_time: Callable[[], bool],
    ) -> tuple[Candidate | None, float, bool]:
        """Walk the right ends of the price-rate steps from ``target`` while below ``end``, each
        next target at least ``stride`` times the last; (best plan, the last target, out of time).

        It stops early where nothing from the target on can beat the best: no plan reaches the
        target, or the lower bound there reaches the best cost. The bound only rises with the
        target, so checking it less often only delays the stop: once in ``far`` steps while it is
        below 90% of the best cost (on 1,000 layers that halves the walk's DPs).
        """
        since, every = 0, 1  # cheapest-plan steps since the bound was last checked; check every `every`
        while target < end:
            cand = self.cheapest(target)
            if cand is None:
                return best, target, False
            if best is None or cand.cost < best.cost or (cand.cost == best.cost and cand.throughput > best.throughput):
                best = cand
            if out_of_time():
                return best, target, True
            if best.cost <= 0:
                return best, target, False
            since += 1
            if since >= every:
                since, bound = 0, self.lower_bound(target)
                if bound >= best.cost * (1 - SLACK):
                    return best, target, False
                every = 1 if bound >= 0.9 * best.cost else far
            # cand's price rate is the least any plan this fast can have, so a plan with
            # throughput X costs at least W * rate / X: below the skip point none can win.
            skip = cand.cost * cand.throughput / best.cost * (1 - SLACK)
            target = max(float(np.nextafter(cand.throughput, np.inf)), target * stride, skip)
        return best, target, False

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
            value, stages = _chain_dp(np.where(finite, K * w[self.chain.base][None, None, :], np.inf), self.chain)
            if stages is None or value > float(w @ p.limits) * (1 + SLACK):
                return None
            used = self._used(stages, K)
            if (used <= p.limits).all():
                return self._candidate(stages, K)
            w = np.where(used > p.limits, 2 * w, w)
        return self.cheapest(target)

    def speed_bound(self) -> float:
        return speed_bound(self.p)

    def max_throughput(
        self, out_of_time: Callable[[], bool] = lambda: False, at_least: float = 0.0
    ) -> tuple[Candidate | None, float]:
        """Fastest plan within the limits (cheapest among the fastest), ignoring max_cost, and a
        proven upper bound on the fastest throughput: the plan's own when the search finished.
        ``at_least``: only a plan at least that fast is wanted (None when there is none)."""
        lo = self.reaching(at_least) if at_least > 0 else self.cheapest(0.0)
        if lo is None:
            return None, 0.0
        return self._bisect(lo, out_of_time)

    def _bisect(
        self, lo: Candidate, out_of_time: Callable[[], bool], hi: float | None = None
    ) -> tuple[Candidate, float]:
        """From ``lo``, a plan within the limits: bisect for the largest reachable throughput, then the
        cheapest of the fastest plans, and the proven upper bound (``hi``: one known already)."""
        hi = self.speed_bound() if hi is None else hi
        floor = lo.throughput
        # After a "no", the first throughput above the floor is asked once: when no plan reaches it,
        # the floor is the fastest, and the bisection need not close in on it from above.
        ceiling, probed, said_no = math.inf, None, False
        while hi > floor * (1 + 1e-7):
            if out_of_time():  # the best plan known to exist, at least as fast as required
                return self.cheapest(max(floor, throughput_floor(self.p))) or lo, hi
            if said_no and probed != floor:
                probed = floor
                found = self.reaching(float(np.nextafter(floor, np.inf)))
                if found is None:
                    ceiling = floor
                    break
                floor, said_no = min(found.throughput, hi), False
                continue
            mid = float(np.sqrt(floor * hi))
            found = self.reaching(mid)
            if found is None:
                hi, said_no = mid, True
            else:  # the plan that proves it may reach beyond mid
                floor, said_no = max(mid, min(found.throughput, hi)), False
        # Exact finish: the cheapest plan at the bracket's floor, then jump past each
        # plan's own throughput while some plan still reaches it.
        best = self.cheapest(floor) or lo
        while best.throughput < ceiling and (cand := self.cheapest(float(np.nextafter(best.throughput, np.inf)))):
            best = cand
            if out_of_time():
                return best, hi
        return best, best.throughput

    def max_throughput_within_budget(
        self, out_of_time: Callable[[], bool] = lambda: False
    ) -> tuple[Candidate | None, float]:
        """The fastest plan within max_cost, and an upper bound on the fastest throughput."""
        best, target, budget = None, 0.0, self.p.max_cost
        assert budget is not None, "a budget search needs max_cost"
        while (cand := self.cheapest(target)) is not None:
            if cand.cost <= budget * (1 + SLACK):
                if best is None or cand.throughput > best.throughput:
                    best = cand
            target = float(np.nextafter(cand.throughput, np.inf))
            if best is not None and out_of_time():
                return best, self.speed_bound()
        return best, best.throughput if best is not None else 0.0


def speed_bound(problem: Problem) -> float:
    """No plan is faster than this: its slowest layer alone on all the units of its best type."""
    sc, pc, sd, pd = problem.parts
    alone = stage_throughput(sc, pc, sd, pd, problem.batch_size, problem.limits[None, :].astype(float))
    return float(np.where(problem.runnable, alone, 0.0).max(axis=1).min())


def schedule_of(problem: Problem, stages) -> np.ndarray:
    sched = np.zeros(problem.n_layers, dtype=np.int64)
    for j, i, t in stages:
        sched[j:i] = t
    return sched
