"""The exact optimum over all schedules and replica counts (``--scheduler exact``).

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
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from heterps_cli.costmodel import (
    SLACK,
    cost_lower_bound,
    meets_targets,
    min_memory_replicas,
    min_replicas,
    stage_throughput,
    throughput_floor,
)
from heterps_cli.errors import InfeasibleError, InputError, SearchGaveUp
from heterps_cli.figures import count, number, usd
from heterps_cli.plan import Plan, make_plan
from heterps_cli.problem import Problem
from heterps_cli.schedulers.base import Progress, SolveOptions
from heterps_cli.schedulers.scoring import limit_reached

# Cells (boundaries x types x tracked unit counts) the limit-aware DP may hold: its two tables take
# 16 bytes a cell, 0.96 GB (1,000 x 4 layers with loose limits needs 48 M: 13 s, 1.3 GB in all).
# Past it, the solver relaxes the largest limits instead (StepSolver.cheapest).
MAX_STATE_CELLS = 60_000_000
REPAIR_ROUNDS = 12  # penalty doublings that look for a plan within every limit at one relaxed step


@dataclass
class _Table:
    """Cost terms of every contiguous stage: index ``[i, j, t]`` = layers ``j..i-1`` on type ``t``.

    End first: the DP reads all the stages that end at one boundary at a time, and
    in this order they are contiguous (twice as fast at 1,000 layers)."""

    sc: np.ndarray
    pc: np.ndarray
    sd: np.ndarray
    pd: np.ndarray  # with the stage-boundary transfer (section 1b), which depends on j, i and t only
    ok: np.ndarray  # j < i and every layer of the stage can run on t
    min_k: np.ndarray  # the fewest replicas whose memory fits (section 1b; 1 without a limit, inf: none)


@dataclass(frozen=True)
class Chain:
    """Which stage may follow which in the DP. Its "types" are the resource types themselves, or
    (section 1d, :mod:`.pipeline`) a type paired with the stage's place in the pipeline."""

    base: np.ndarray  # [P] the resource type of each DP type
    follows: np.ndarray  # [P, P] bool: a stage on [a] may come right before one on [b]
    starts: np.ndarray  # [P] bool: may run the first layer
    ends: np.ndarray  # [P] bool: may run the last layer

    @staticmethod
    def of_types(n_types: int) -> Chain:
        """Sections 1 and 1b: any type, but never the same type twice in a row (stages are maximal)."""
        every = np.ones(n_types, dtype=bool)
        return Chain(np.arange(n_types), ~np.eye(n_types, dtype=bool), every, every)

    @cached_property
    def before(self) -> list[list[int]]:
        """For each DP type, the DP types whose stage may come right before it."""
        return [np.flatnonzero(self.follows[:, t]).tolist() for t in range(len(self.base))]


# Cells of the stage grid ((layers + 1)^2 x types) the solver may hold: each costs about 90 bytes
# over the table and the grid's arrays (2,000 x 3 layers: 12 M cells, 1.1 GB measured), so this
# keeps it under 2 GB.
MAX_GRID_CELLS = 20_000_000


def most_stages(problem: Problem) -> int:
    """No plan has more stages than layers, nor than units (each stage takes one at least)."""
    return int(min(problem.n_layers, problem.limits.sum()))


def grid_cells(problem: Problem) -> int:
    """Stage cells the solver's grids hold: one grid, or under a pipeline schedule (section 1d,
    :mod:`.pipeline`) one per stage count ``S``, on ``S`` times the types."""
    cells = (problem.n_layers + 1) ** 2 * problem.n_types
    if problem.pipelined:
        S = most_stages(problem)
        cells *= S * (S + 1) // 2
    return cells


def too_large(problem: Problem) -> bool:
    """Whether the model is too long for the exact solver's stage grid (:data:`MAX_GRID_CELLS`)."""
    return grid_cells(problem) > MAX_GRID_CELLS


def spans(per_layer: np.ndarray) -> np.ndarray:
    """``[i, j]``: the sum over layers ``j..i-1``, added up from ``j`` as a plan's own figures are.
    A difference of prefix sums loses a stage's small times beside a huge one earlier in the
    chain (9.2e18 + 0.002 - 9.2e18 = 0), and then a plan that breaks a constraint looks fine."""
    n1 = per_layer.shape[0] + 1
    out = np.zeros((n1, n1, per_layer.shape[1]))
    with np.errstate(over="ignore"):  # inf where sizes overflow: ruled out below
        for j in range(n1 - 1):
            out[j + 1 :, j] = np.cumsum(per_layer[j:], axis=0)
    return out


def boundary_transfer(problem: Problem) -> np.ndarray:
    """``[i, j, t]``: section 1b's ``X_s`` of stage ``j..i-1`` on ``t`` (0 without bandwidths)."""
    n1 = problem.n_layers + 1
    if not np.isfinite(problem.bandwidth).any():
        return np.zeros((n1, n1, problem.n_types))
    bytes_ = problem.boundary_bytes  # into the stage before layer j, out of it before layer i (a sum: symmetric)
    with np.errstate(invalid="ignore"):
        return (bytes_[:, None, None] + bytes_[None, :, None]) / problem.bandwidth[None, None, :]


def runnable_spans(problem: Problem) -> np.ndarray:
    """``[i, j, t]``: ``j < i``, and every layer of stage ``j..i-1`` can run on ``t``."""
    n1 = problem.n_layers + 1
    below = np.tril(np.ones((n1, n1), dtype=bool), k=-1)[:, :, None]  # j < i
    return below & (spans((~problem.runnable).astype(float)) == 0)


def _table(problem: Problem) -> _Table:
    n, T = problem.n_layers, problem.n_types
    if too_large(problem):
        cells = (n + 1) ** 2 * T
        raise InputError(
            None,
            None,
            "exact scheduler",
            f"the exact solver would hold {cells:,} stage cells for {n:,} layers x {T} types (about "
            f"{cells * 90 / 1e9:.1f} GB), more than it may use ({MAX_GRID_CELLS:,}); use --scheduler greedy or rl, "
            "or profile the model at a coarser granularity (fewer, larger layers)",
        )
    ok = runnable_spans(problem)
    sc, pc, sd, pd = (spans(part) for part in problem.parts)
    if np.isfinite(problem.bandwidth).any():
        pd = pd + boundary_transfer(problem)
    min_k = np.ones((n + 1, n + 1, T))
    if np.isfinite(problem.memory).any():
        fixed, split = (spans(part[:, None]) for part in problem.memory_parts)
        if problem.reserved is not None:
            fixed = fixed + problem.reserved_bytes[None, None, :]
        with np.errstate(invalid="ignore"):
            min_k = min_memory_replicas(fixed, split, problem.memory[None, None, :])
    return _Table(sc, pc, sd, pd, ok, min_k)


@dataclass
class Candidate:
    stages: list[tuple[int, int, int]]  # (first layer, end layer exclusive, type)
    replicas: list[int]
    throughput: float
    cost: float
    rate: float  # USD per hour of all its units
    within: bool = True  # within every limit (False only for a bound while limits are relaxed)


def _chain_dp(C: np.ndarray, chain: Chain | None = None):
    """Cheapest chain of stages covering all layers; ``C[i, j, t]`` prices stage ``j..i-1`` on ``t``.

    Returns (value, [(j, i, t), ...]) or (inf, None). The recurrence (docs/exact.md,
    section 3) is a shortest path over stage boundaries::

        f[i, t] = min over j < i of  g[j, t] + C[i, j, t],    g[j, t] = min over t' != t of f[j, t']

    where ``f[i, t]`` is the cheapest way to run layers ``0..i-1`` with the last
    stage on ``t``, and ``g[0, t] = 0``. ``t' != t`` keeps stages maximal (two
    consecutive stages on one type would be one stage); a :class:`Chain` says more generally
    which ``t'`` may come before ``t``, and which types may start and end the chain.
    """
    n1, _, T = C.shape
    chain = chain or Chain.of_types(T)
    f = np.full((n1, T), np.inf)
    g = np.full((n1, T), np.inf)  # g[j, t]: best f[j, t'] over t' != t (the next stage is on t)
    g[0] = np.where(chain.starts, 0.0, np.inf)
    arg_j = np.zeros((n1, T), dtype=np.int64)
    prev_t = np.zeros((n1, T), dtype=np.int64)
    others = chain.follows.T  # [t, t']: t' may come before t
    cols = np.arange(T)
    for i in range(1, n1):
        total = g[:i] + C[i, :i]
        j = total.argmin(axis=0)
        arg_j[i], f[i] = j, total[j, cols]
        choice = np.where(others, f[i][None, :], np.inf)
        prev_t[i], g[i] = choice.argmin(axis=1), choice.min(axis=1)
    last = np.where(chain.ends, f[-1], np.inf)
    t = int(last.argmin())
    value = float(f[-1, t])
    if not np.isfinite(value):
        return np.inf, None
    stages, i = [], n1 - 1
    while i > 0:
        j = int(arg_j[i, t])
        stages.append((j, i, t))
        t, i = int(prev_t[j, t]), j
    return value, stages[::-1]


def _chain_dp_limited(
    K: np.ndarray,
    prices: np.ndarray,
    limits: np.ndarray,
    tracked: list[int],
    capped: int | None,
    chain: Chain | None = None,
):
    """Cheapest chain whose units per type respect ``limits``; a list of (j, i, t) or None.

    The units of each ``tracked`` type are part of the state (a dense array per
    boundary and last type); the value is the price rate of the other types.
    ``capped``, when given, is the only untracked type: the value then counts its
    units, and its limit is checked at the end (docs/exact.md, section 3, "Limits").
    """
    n1, _, T = K.shape
    chain = chain or Chain.of_types(T)
    base = chain.base
    dims = tuple(int(limits[t]) + 1 for t in tracked)
    cells = int(np.prod(dims)) if dims else 1
    if n1 * T * cells > MAX_STATE_CELLS:
        raise InputError(
            None,
            None,
            "exact scheduler",
            f"the exact solver would need {n1 * T * cells:,} states to honour the binding limits of "
            f"{len(tracked)} resource types, more than it may use ({MAX_STATE_CELLS:,}); "
            "lower the limits of the scarce types or use another scheduler",
        )
    type_axis = {t: a for a, t in enumerate(tracked)}
    axis = {p: type_axis[int(base[p])] for p in range(T) if int(base[p]) in type_axis}  # DP type -> state axis
    weight = prices.astype(float).copy()  # per DP type
    price_of = {int(base[p]): float(prices[p]) for p in range(T)}
    if capped is not None:
        weight[base == capped] = 1.0  # count units: exact integers, compared with the limit at the end
    f, g = _limited_tables(K, weight, axis, dims, chain)
    grids = np.meshgrid(*[np.arange(d) for d in dims], indexing="ij") if dims else []
    extra = sum((price_of[t] * grids[a] for t, a in type_axis.items()), np.zeros(dims))
    ends = np.asarray(chain.ends).reshape((T,) + (1,) * len(dims))
    if capped is None:
        total = np.where(ends, f[-1] + extra[None], np.inf)
    else:
        total = np.where(ends & (f[-1] <= limits[capped]), f[-1] * price_of[capped] + extra[None], np.inf)
    flat = int(total.argmin())
    if not np.isfinite(total.flat[flat]):
        return None
    t, *cell = (int(c) for c in np.unravel_index(flat, total.shape))
    return _backtrack(K, f, g, weight, axis, t, cell, chain)


def _limited_tables(K: np.ndarray, weight: np.ndarray, axis: dict[int, int], dims: tuple[int, ...], chain: Chain):
    """The forward pass of :func:`_chain_dp_limited`: ``f[i, t, *units]`` and ``g`` as in :func:`_chain_dp`.

    For a fixed end ``i`` and type ``t``, the feasible starts ``j`` are cut into
    runs of consecutive starts with equal replica count (a stage needs fewer
    replicas the shorter it is, so runs are long): each run is reduced with one
    ``min`` and shifted once along its type's units axis. This loop is the
    solver's hot path: the runs are found for all ``(i, t)`` at once up front,
    so that the loop itself makes only the numpy calls that do arithmetic.
    """
    n1, _, T = K.shape
    shape = (n1, T) + dims
    f = np.full(shape, np.inf)
    g = np.full(shape, np.inf)  # g[j, t]: best f[j, t'] over t' != t (the next stage is on t)
    g[(0, slice(None)) + (0,) * len(dims)] = np.where(chain.starts, 0.0, np.inf)
    others = chain.before
    # Every feasible (i, t, j), sorted by end, type and start; a run starts where any of them
    # breaks (another end or type, a gap in the starts, another replica count).
    Kt = K.transpose(0, 2, 1)  # [i, t, j]
    ii, tt, jj = np.nonzero(np.isfinite(Kt))
    kk = Kt[ii, tt, jj].astype(np.int64)
    pair = ii * T + tt
    cut = np.ones(len(jj) + 1, dtype=bool)
    cut[1:-1] = (pair[1:] != pair[:-1]) | (jj[1:] != jj[:-1] + 1) | (kk[1:] != kk[:-1])
    starts = np.flatnonzero(cut)
    run_k = kk[starts[:-1]].tolist()
    run_lo, run_hi = jj[starts[:-1]].tolist(), (jj[starts[1:] - 1] + 1).tolist()
    pair_first = np.searchsorted(pair[starts[:-1]], np.arange(n1 * T + 1)).tolist()
    # shifts[a][k] = (destination, source) index pairs that add k units along tracked axis a
    shifts = []
    for a, d in enumerate(dims):
        pairs = []
        for k in range(d):
            dst, src = [slice(None)] * len(dims), [slice(None)] * len(dims)
            dst[a], src[a] = slice(k, None), slice(0, d - k)
            pairs.append((tuple(dst), tuple(src)))
        shifts.append(pairs)
    least = np.minimum.reduce
    for i in range(1, n1):
        for t in range(T):
            first, last = pair_first[i * T + t], pair_first[i * T + t + 1]
            if first == last:
                continue
            out = f[i, t]
            along = axis.get(t)
            for r in range(first, last):
                k, lo, hi = run_k[r], run_lo[r], run_hi[r]
                group = g[lo, t] if hi - lo == 1 else least(g[lo:hi, t], axis=0)
                if along is None:
                    np.minimum(out, group + weight[t] * k, out=out)
                elif k < dims[along]:
                    dst, src = shifts[along][k]
                    np.minimum(out[dst], group[src], out=out[dst])
        fi = f[i]
        for t in range(T):
            rest = others[t]
            if rest:
                np.minimum(fi[rest[0]], fi[rest[-1]], out=g[i, t])
                for u in rest[1:-1]:
                    np.minimum(g[i, t], fi[u], out=g[i, t])
    return f, g


def _backtrack(
    K: np.ndarray,
    f: np.ndarray,
    g: np.ndarray,
    weight: np.ndarray,
    axis: dict[int, int],
    t: int,
    cell: list[int],
    chain: Chain,
) -> list[tuple[int, int, int]]:
    """The stages of the chain that ends on type ``t`` with tracked units ``cell``: walking back,
    at each boundary the predecessor that produced the stored value."""
    n1, _, T = K.shape
    stages, i = [], n1 - 1
    while i > 0:
        value = f[(i, t, *cell)]
        for j in np.flatnonzero(np.isfinite(K[i, :i, t])):
            k = int(K[i, j, t])
            src = list(cell)
            if t in axis:
                src[axis[t]] -= k
                if src[axis[t]] < 0 or g[(j, t, *src)] != value:
                    continue
            elif g[(j, t, *src)] + weight[t] * k != value:
                continue
            break
        else:  # pragma: no cover - the forward pass guarantees a predecessor
            raise AssertionError("limited DP backtrack lost its predecessor")
        stages.append((int(j), i, t))
        cell, i = src, int(j)
        if i > 0:
            t = next(u for u in chain.before[t] if f[(i, u, *cell)] == g[(i, t, *cell)])
    return stages[::-1]


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
        self.relax = relax  # False: refuse (InputError) rather than relax a limit (see cheapest)
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
        return self.p.work / 3600.0 * value

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
        return Candidate(stages, k, thr, p.work / thr / 3600.0 * rate, rate, not self._overused(stages, K))

    def _repair(self, K: np.ndarray, stages, tracked: set[int]) -> Candidate | None:
        """A plan within every limit at the current target, if pricing the overused (relaxed) types
        higher finds one: a heuristic, used only while limits are relaxed."""
        price = self.price.astype(float).copy()
        state = self._state(tracked)
        for _ in range(REPAIR_ROUNDS):
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

    def min_cost(self, out_of_time: Callable[[], bool] = lambda: False) -> tuple[Candidate | None, float]:
        """The cheapest plan, and a proven lower bound on the optimum's cost: the plan's own cost
        when the walk finished, less when ``out_of_time()`` stopped it first.

        A coarse scan first (targets at least 2% apart) finds a plan close to the best, so that the
        walk's skip rule, which grows with how far a step's plan is from the best, takes long jumps.
        """
        floor = throughput_floor(self.p)
        best, end, late = self._walk(floor, math.inf, None, 1.02, 4, out_of_time)
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
        """Does some plan reach ``target`` within the limits?

        First a few Lagrangian rounds, each one cheap DP over weighted units
        ``sum_t w_t k_t``: a plan that fits proves "yes"; a weighted minimum above
        ``sum_t w_t N_t`` proves "no" (every plan within the limits would be below
        it). Weights of overused types double each round. Undecided: the exact DP.
        """
        p = self.p
        K = self.replicas(target)
        finite = np.isfinite(K)
        w = 1.0 / p.limits.astype(float)
        for _ in range(8):
            value, stages = _chain_dp(np.where(finite, K * w[self.chain.base][None, None, :], np.inf), self.chain)
            if stages is None or value > float(w @ p.limits) * (1 + SLACK):
                return False
            used = self._used(stages, K)
            if (used <= p.limits).all():
                return True
            w = np.where(used > p.limits, 2 * w, w)
        return self.cheapest(target) is not None

    def speed_bound(self) -> float:
        return speed_bound(self.p)

    def max_throughput(self, out_of_time: Callable[[], bool] = lambda: False) -> tuple[Candidate | None, float]:
        """Fastest plan within the limits (cheapest among the fastest), ignoring max_cost, and a
        proven upper bound on the fastest throughput: the plan's own when the search finished."""
        lo = self.cheapest(0.0)
        if lo is None:
            return None, 0.0
        hi = self.speed_bound()
        floor = lo.throughput
        while hi > floor * (1 + 1e-7):
            if out_of_time():  # the best plan known to exist, at least as fast as required
                return self.cheapest(max(floor, throughput_floor(self.p))) or lo, hi
            mid = float(np.sqrt(floor * hi))
            if self.reachable(mid):
                floor = mid
            else:
                hi = mid
        # Exact finish: the cheapest plan at the bracket's floor, then jump past each
        # plan's own throughput while some plan still reaches it.
        best = self.cheapest(floor) or lo
        while (cand := self.cheapest(float(np.nextafter(best.throughput, np.inf)))) is not None:
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


def infeasible_error(problem: Problem, solver: StepSolver) -> InfeasibleError:
    """Explain why no plan meets the constraints, with the best figure that can be reached."""
    fastest, _ = solver.max_throughput()
    if fastest is None:
        blocked = _memory_blocked(problem)
        if blocked is not None:
            return InfeasibleError(blocked)
        return InfeasibleError(
            "no plan fits the cluster's limits even with one replica per stage: "
            f"the limits ({_limits(problem)}) are too small for this model"
        )
    if fastest.throughput < throughput_floor(problem):
        cap, why = serial_cap(problem)
        if cap < throughput_floor(problem):
            fix = f"{why}. No number of units changes that: lower the required throughput (--min-throughput)"
        else:
            fix = "Lower the required throughput (--min-throughput) or raise the limits"
        return InfeasibleError(
            f"no plan reaches the required {count(problem.min_throughput, 1)} samples/s within the limits "
            f"({_limits(problem)}); the fastest possible plan reaches {count(fastest.throughput, 1)} samples/s "
            f"(costing {usd(fastest.cost)}). {fix}."
        )
    from heterps_cli.schedulers.pipeline import solver_for

    cheapest, _ = solver_for(problem.replace(objective="cost", max_cost=None), None).min_cost()
    assert cheapest is not None, "the fastest plan meets the throughput, so a cheapest one exists"
    assert problem.max_cost is not None, "within the limits and the throughput, only the budget can rule a plan out"
    return InfeasibleError(
        f"no plan costs at most {usd(problem.max_cost)}: the cheapest plan that reaches "
        f"{count(problem.min_throughput, 1)} samples/s costs {usd(cheapest.cost)} "
        f"({count(cheapest.throughput, 1)} samples/s). Raise the budget (--max-cost)."
    )


def serial_cap(problem: Problem) -> tuple[float, str]:
    """The throughput no plan passes on any number of units, and why: the layer whose serial part
    (compute ``oct (1 - alpha)`` or gradient synchronisation ``odt (1 - beta)``, which replicas do
    not divide) is the largest even on its best type, alone in a stage. Sections 1 and 1b only (inf
    under section 1d, whose all-reduce grows with replicas)."""
    if problem.pipelined:
        return math.inf, ""
    serial_c, _, serial_d, _ = problem.parts
    serial = np.where(problem.usable, np.maximum(serial_c, serial_d), np.inf)
    best_t = np.argmin(serial, axis=1)
    per_layer = serial[np.arange(problem.n_layers), best_t]
    layer = int(np.argmax(per_layer))
    t = int(best_t[layer])
    if not per_layer[layer] > 0:
        return math.inf, ""
    sync = serial_d[layer, t] >= serial_c[layer, t]
    term = (
        f"gradient synchronisation, odt x (1 - beta) = {serial_d[layer, t]:.3g} s"
        if sync
        else f"serial compute, oct x (1 - alpha) = {serial_c[layer, t]:.3g} s"
    )
    cap = problem.batch_size / float(per_layer[layer])
    return cap, (
        f"Layer {problem.layer_names[layer]} caps every plan at {count(cap, 1)} samples/s: its {term} per batch "
        f"of {problem.batch_size:,} on {problem.types[t]}, its fastest type, does not shrink with replicas"
    )


def _memory_blocked(problem: Problem) -> str | None:
    """Why memory alone rules a plan out: the first layer no type can hold even alone on all its
    units (section 1b), with what it needs per replica where it comes closest; None if every layer fits."""
    if not np.isfinite(problem.memory).any():
        return None
    fixed, split = problem.memory_parts
    limits = problem.limits.astype(float)
    for layer in np.flatnonzero(~problem.fits_alone.any(axis=1)):
        need = fixed[layer] + split[layer] / limits  # per replica on every unit of each type
        ratio = np.where(problem.runnable[layer], need / problem.memory, np.inf)
        t = int(np.argmin(ratio))
        largest = float(np.max(np.where(np.isfinite(problem.memory), problem.memory, 0.0)))
        name = problem.layer_names[layer]
        if not np.isfinite(need[t]):
            return (
                f"layer {name} needs more memory than a float can count (state_factor x weight_size and "
                "batch_size x activation_size overflow): give its real sizes"
            )
        shard = "" if problem.sharded[layer] else "mark it `sharded: true`, "
        return (
            f"layer {name} needs {need[t] / 1e9:,.3g} GB per replica on {problem.types[t]} "
            f"(memory {number(problem.memory[t] / 1e9)} GB) even on all {int(limits[t]):,} units; the largest memory "
            f"on offer is {number(largest / 1e9)} GB: {shard}add memory, or allow more replicas"
        )
    return None


def diagnose(problem: Problem, failure: str, hint: str, time_limit: float | None = None) -> InfeasibleError:
    """The error for a heuristic that found no feasible plan: the true reason if there is none,
    else the heuristic's failure, the optimum it missed and ``hint`` (what to try in it; where the
    exact solver can run, the message points to it too). The exact
    search gets ``time_limit`` seconds (None: all it needs; 0 or less: none, and the error says so)."""
    out_of_time = time_limit is not None and time_limit <= 0
    if too_large(problem):  # only the heuristic's own words
        return SearchGaveUp(f"{failure}{' within the time limit' if out_of_time else ''}: {hint}")
    if out_of_time:
        return SearchGaveUp(
            f"{failure} within the time limit: {hint}; --scheduler exact says whether a feasible plan exists"
        )
    try:
        found = solve(problem, options=SolveOptions(time_limit=time_limit))
    except InfeasibleError as exc:
        return exc
    except InputError:  # the binding limits need more states than the solver may hold
        return SearchGaveUp(f"{failure}: {hint}")
    return SearchGaveUp(
        f"{failure}, but a feasible plan exists (the exact solver finds one costing {usd(found.cost_usd)} "
        f"at {count(found.throughput, 1)} samples/s): {hint}, or use --scheduler exact"
    )


def _limits(problem: Problem) -> str:
    return ", ".join(f"{t} <= {n}" for t, n in zip(problem.types, problem.limits))


def solve(
    problem: Problem, *, seed: int = 0, progress: Progress | None = None, options: SolveOptions | None = None
) -> Plan:
    """The provably cheapest (``cost``) or fastest (``time``) plan; raises InfeasibleError if none.

    With ``options.time_limit``, a search that has not finished by then returns its best plan
    with ``optimal: false`` and the proven ``gap`` to the optimum (cost / lower bound - 1, or
    1 - throughput / upper bound) instead of running on.
    """
    from heterps_cli.schedulers.pipeline import solver_for  # it builds on this module

    start = time.perf_counter()
    limit = options.time_limit if options is not None else None
    out_of_time = limit_reached(start, options)
    solver = solver_for(problem, progress)
    if problem.objective == "cost":
        best, bound = solver.min_cost(out_of_time)
        if best is not None and not meets_targets(problem, best.throughput, best.cost):
            best = None
    else:
        search = solver.max_throughput if problem.max_cost is None else solver.max_throughput_within_budget
        best, bound = search(out_of_time)
        if best is not None and best.throughput < throughput_floor(problem):
            best = None
    if best is None:
        raise infeasible_error(problem, solver)
    why = f"exact stopped at the --time-limit of {limit or 0:g} s before proving this plan optimal"
    if not best.within:
        # The search ran on relaxed limits: its best is a bound, and the plan is the best one found
        # within every limit.
        best = solver.cheapest_found if problem.objective == "cost" else solver.fastest_found
        names = ", ".join(problem.types[t] for t in sorted(solver.relaxed))
        if best is None:
            raise InputError(
                None,
                None,
                "exact scheduler",
                f"honouring the limits of {names} needs more than {MAX_STATE_CELLS:,} states, and no plan "
                "within every limit was found without them; use --scheduler rl or genetic, or lower the limits",
            )
        why = (
            f"exact relaxed the limits of {names} (honouring them needs more than {MAX_STATE_CELLS:,} states), "
            "so it could not prove this plan optimal"
        )
    if problem.objective == "cost":
        gap = float(best.cost / bound - 1) if bound > 0 else 0.0
    else:
        gap = float(1 - best.throughput / bound) if bound > 0 else 0.0
    proved = bool(gap <= 1e-12)
    notes: tuple[str, ...] = ()
    if not proved:
        what = (
            f"no plan costs less than {usd(bound)}"
            if problem.objective == "cost"
            else f"no plan is faster than {count(bound, 1)} samples/s"
        )
        notes = (f"{why}: {what}, so it is within {100 * gap:.2f}% of the optimum",)
    plan = make_plan(
        problem,
        schedule_of(problem, best.stages),
        best.replicas,
        scheduler="exact",
        seed=seed,
        solve_s=time.perf_counter() - start,
        optimal=proved,
        notes=notes,
    )
    assert plan.feasible, "the exact solver produced a plan that breaks a constraint"
    return plan if proved else replace(plan, gap=gap)
