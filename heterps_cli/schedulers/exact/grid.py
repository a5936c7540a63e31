"""The exact solver's replica grid at a bottleneck throughput (docs/exact.md section 2): for every
contiguous stage and DP type, the fewest replicas reaching the target, what they give, their price
rate and their share of the cost bound. The DP (:mod:`.kernel`) runs over these arrays.

A replica count only grows with the target, so a grid is raised to a higher target by recomputing only
the cells that fall short of it; a bisection, which also asks lower targets than the last, raises the
grid of the highest target below the one asked that it kept (:data:`SNAPSHOTS`, from its first question
below on) rather than filling a new one (docs/exact.md section 3, "Speed")."""

from __future__ import annotations

import numpy as np

from heterps_cli.costmodel import cost_lower_bound
from heterps_cli.formulas import stage_throughput
from heterps_cli.problem import Problem
from heterps_cli.replica_counts import fixed_replicas, min_replicas
from heterps_cli.schedulers.exact.kernel import Chain
from heterps_cli.schedulers.exact.terms import Table

SNAPSHOTS = 3  # grids kept at earlier targets: a bisection needs the one at its floor
SNAPSHOT_CELLS = 1_000_000  # a grid larger keeps none: each copy is four arrays of 8 bytes a cell
FILLS_KEPT = 4  # limit-free fills a table keeps (the targets a walk over rentals asks each of them)
FILL_CELLS = 250_000  # a grid larger keeps none on its table (each fill: four arrays of 8 bytes a cell)


class ReplicaGrid:
    """``K``, ``reach``, ``rate`` and ``bound``, each ``[i, j, t]`` for stage ``j..i-1`` on DP type ``t``,
    at the last target asked (:meth:`replicas`); inf where a stage cannot reach it."""

    def __init__(self, problem: Problem, table: Table, chain: Chain):
        self.p = problem
        self.tab = table
        self.chain = chain
        self.price = problem.prices[chain.base] * chain.widths  # per DP type: a replica's (section 1h)
        self.unit_limit = problem.limits[chain.base] // chain.widths  # the replicas its type holds
        self.type_index = np.arange(len(chain.base))[None, None, :]
        self.target: float | None = None  # the target the arrays below were computed for
        self.K: np.ndarray = np.empty(0)  # replicas
        self.reach: np.ndarray = np.empty(0)  # their throughput
        self.rate: np.ndarray = np.empty(0)  # their price rate
        self.bound: np.ndarray = np.empty(0)  # costmodel.cost_lower_bound per stage
        self.kept: list[tuple[float, tuple[np.ndarray, ...]]] = []  # (target, copies of the four arrays)
        self.descended = False  # asked below its target once: a bisection, which copies pay for

    def replicas(self, target: float) -> np.ndarray:
        """``K[i, j, t]``: the fewest replicas with which stage ``j..i-1`` on ``t`` reaches ``target``
        within its type's limit and memory (inf: none). Read-only; valid until the next call."""
        if self.target is not None and target < self.target:
            self.descended = True
            below = [kept for kept in self.kept if kept[0] <= target]
            if below:
                self.target, arrays = max(below, key=lambda kept: kept[0])
                for mine, copy in zip((self.K, self.reach, self.rate, self.bound), arrays):
                    np.copyto(mine, copy)
            else:
                self.target = None
        if self.target is None:
            self._fill(target)
        elif target > self.target:
            self._keep()
            # Only cells whose throughput falls short of the new target change; replica counts only
            # grow with the target, so the others keep theirs exactly.
            cells = np.flatnonzero(self.reach < target)
            if cells.size:
                self._raise(cells, target)
        self.target = target
        return self.K

    def _keep(self) -> None:
        """Keep a copy of the grid at its target, for a later question below the next one (once a question
        went below: a walk only rises, and copying at every step took a tenth of a frontier's time)."""
        if not self.descended or self.K.size > SNAPSHOT_CELLS or any(kept[0] == self.target for kept in self.kept):
            return
        assert self.target is not None
        self.kept = [
            *self.kept[-(SNAPSHOTS - 1) :],
            (self.target, tuple(a.copy() for a in (self.K, self.reach, self.rate, self.bound))),
        ]

    def _fill(self, target: float) -> None:
        """The whole grid for ``target``. On a small table that keeps fills (:attr:`.kernel.Table.fills`),
        its limit-free fill at ``target``, made once for every solver sharing it, with this solver's limits
        applied; else filled a block of ends at a time, so that the temporaries of the closed form take a
        block's memory, not the grid's (a 2,000-layer grid is 96 MB per array)."""
        shape = self.tab.sc.shape
        if self.K.shape != shape:
            self.K, self.reach, self.rate, self.bound = (np.empty(shape) for _ in range(4))
        mine = (self.K, self.reach, self.rate, self.bound)
        if self.K.size > FILL_CELLS or self.tab.fills is None:
            block = max(1, 2_000_000 // max(1, shape[1] * shape[2]))
            for lo in range(0, shape[0], block):
                rows = slice(lo, lo + block)
                for array, part in zip(mine, self._filled(rows, target, self.unit_limit)):
                    array[rows] = part
            return
        free = self._limit_free(target)
        fits = free[0] <= self.unit_limit[None, None, :]  # inf (no count reaches it) never fits
        for array, part in zip(mine, free):
            np.copyto(array, np.where(fits, part, np.inf))

    def _limit_free(self, target: float) -> tuple[np.ndarray, ...]:
        """The four arrays at ``target`` with no type's limit applied, kept on the table for the solvers
        that share it."""
        key = (target, self.p.step_samples, self.p.batch_size, self.price.tobytes(), self.p.fixed.replicas)
        fills = self.tab.fills
        assert fills is not None, "only a table that keeps fills is filled limit-free"
        if key not in fills:
            while len(fills) >= FILLS_KEPT:
                del fills[next(iter(fills))]
            fills[key] = self._filled(slice(None), target, np.full(len(self.price), np.inf))
            for array in fills[key]:
                array.flags.writeable = False
        return fills[key]

    def _filled(self, rows: slice, target: float, limit: np.ndarray) -> tuple[np.ndarray, ...]:
        """``K``, ``reach``, ``rate`` and ``bound`` of the stages ending at ``rows``, at most ``limit``
        replicas of each DP type."""
        t = self.tab
        K = self._counts(t.sc[rows], t.pc[rows], t.sd[rows], t.pd[rows], target, t.min_k[rows], t.ps[rows])
        K = np.where(t.ok[rows] & (K <= limit[None, None, :]), K, np.inf)
        lo = range(t.sc.shape[0])[rows].start
        cells = np.arange(lo * K.shape[1] * K.shape[2], lo * K.shape[1] * K.shape[2] + K.size)
        reach = self._throughput(cells, K.ravel()).reshape(K.shape)
        return K, reach, self._priced(K, self.type_index), self._per_stage_bound(K, reach, self.type_index)

    def _raise(self, cells: np.ndarray, target: float) -> None:
        t = self.tab
        types = cells % len(self.chain.base)
        sc, pc, sd, pd, ps = (a.ravel()[cells] for a in (t.sc, t.pc, t.sd, t.pd, t.ps))
        k = self._counts(sc, pc, sd, pd, target, t.min_k.ravel()[cells], ps)
        k = np.where(k <= self.unit_limit[types], k, np.inf)
        self.K.ravel()[cells] = k
        self.reach.ravel()[cells] = self._throughput(cells, k)
        self.rate.ravel()[cells] = self._priced(k, types)
        self.bound.ravel()[cells] = self._per_stage_bound(k, self.reach.ravel()[cells], types)

    def _counts(self, sc, pc, sd, pd, target, at_least, ps) -> np.ndarray:
        """The fewest replicas reaching ``target``; under a shape fixing every stage's (section 1k), those
        where they reach it."""
        p = self.p
        if p.fixed.replicas is not None:
            return fixed_replicas(sc, pc, sd, pd, p.step_samples, target, at_least, ps, p.batch_size, p.fixed.replicas)
        return min_replicas(sc, pc, sd, pd, p.step_samples, target, at_least, ps, p.batch_size)

    def _throughput(self, cells: np.ndarray, k: np.ndarray) -> np.ndarray:
        """The throughput of each cell with ``k`` replicas; inf where it has none (it never changes again)."""
        t = self.tab
        sc, pc, sd, pd, ps = (a.ravel()[cells] for a in (t.sc, t.pc, t.sd, t.pd, t.ps))
        finite = np.isfinite(k)
        with np.errstate(invalid="ignore"):
            thr = stage_throughput(sc, pc, sd, pd, self.p.step_samples, np.where(finite, k, 1.0), ps, self.p.batch_size)
        return np.where(finite, thr, np.inf)

    def _priced(self, K: np.ndarray, types: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore"):  # a free type times an unreachable stage
            return np.where(np.isfinite(K), self.price[types] * K, np.inf)

    def _per_stage_bound(self, K: np.ndarray, reach: np.ndarray, types: np.ndarray) -> np.ndarray:
        """costmodel.cost_lower_bound per stage (inf where a stage cannot reach the target)."""
        return np.where(np.isfinite(K), cost_lower_bound(self.price[types], K, reach, self.p.batch_size), np.inf)
