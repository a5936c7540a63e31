"""The shortest-path DP over stage boundaries that the exact solver runs, on the stage terms of
:mod:`.terms`: :class:`Chain` says which stage may follow which, :func:`chain_dp` is the recurrence of
docs/exact.md section 3, and :func:`chain_dp_limited` the same with the units of binding types in the
state. :mod:`.step` asks them its questions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from heterps_cli.errors import TooLarge
from heterps_cli.problem import Problem

if TYPE_CHECKING:
    from heterps_cli.schedulers.exact.terms import Table

# Cells (boundaries x types x tracked unit counts) the limit-aware DP may hold: its two tables take
# 16 bytes a cell, 0.96 GB (1,000 x 4 layers with loose limits needs 48 M: 13 s, 1.3 GB in all).
# Past it, the solver relaxes the largest limits instead (StepSolver.cheapest).
MAX_STATE_CELLS = 60_000_000


@dataclass(frozen=True)
class Chain:
    """Which stage may follow which in the DP. Its "types" are the resource types themselves, or
    (section 1d, :mod:`.pipeline`) a type paired with the stage's place in the pipeline."""

    base: np.ndarray  # [P] the resource type of each DP type
    follows: np.ndarray  # [P, P] bool: a stage on [a] may come right before one on [b]
    starts: np.ndarray  # [P] bool: may run the first layer
    ends: np.ndarray  # [P] bool: may run the last layer
    # [P] the stage label of each DP type in a schedule (stages.labelled): its type, plus
    # stages.recompute_label where the stage recomputes its activations (section 1g); None: base
    label: np.ndarray | None = None
    # [P] section 1h: the units of its type one replica of each DP type holds (None: one each)
    width: np.ndarray | None = None

    @property
    def labels(self) -> np.ndarray:
        return self.base if self.label is None else self.label

    @property
    def widths(self) -> np.ndarray:
        return np.ones(len(self.base), dtype=np.int64) if self.width is None else self.width

    @staticmethod
    def of_types(n_types: int, maximal: bool = False) -> Chain:
        """Sections 1 and 1b: any type after any type; with ``maximal`` (the papers' space) never the
        same type twice in a row, as stages are then maximal runs."""
        every = np.ones(n_types, dtype=bool)
        follows = ~np.eye(n_types, dtype=bool) if maximal else np.ones((n_types, n_types), dtype=bool)
        return Chain(np.arange(n_types), follows, every, every)

    @cached_property
    def before(self) -> list[list[int]]:
        """For each DP type, the DP types whose stage may come right before it."""
        return [np.flatnonzero(self.follows[:, t]).tolist() for t in range(len(self.base))]

    @cached_property
    def shared_before(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """The DP types grouped by the types that may come before them, each set once: (that set, the
        types it comes before). A pipeline's stages at one place share theirs (section 1d)."""
        sets: dict[tuple[int, ...], list[int]] = {}
        for t, rest in enumerate(self.before):
            if rest:
                sets.setdefault(tuple(rest), []).append(t)
        return [(np.array(rest, dtype=np.int64), np.array(types, dtype=np.int64)) for rest, types in sets.items()]

    @cached_property
    def groups(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """:attr:`shared_before` where its sets are pairwise disjoint (a pipeline's places): the sets one
        after another, where each starts, and each DP type's group (-1: nothing comes before it); None
        where the sets overlap."""
        owner = np.full(len(self.base), -1, dtype=np.int64)
        for g, (_, types) in enumerate(self.shared_before):
            owner[types] = g
        order = np.concatenate([rest for rest, _ in self.shared_before]) if self.shared_before else np.empty(0)
        if not order.size or np.unique(order).size < order.size:
            return None
        starts = np.cumsum([0] + [len(rest) for rest, _ in self.shared_before])[:-1]
        return order.astype(np.int64), starts, owner


@dataclass
class Candidate:
    stages: list[tuple[int, int, int]]  # (first layer, end layer exclusive, type)
    replicas: list[int]
    throughput: float
    cost: float
    rate: float  # USD per hour of all its units
    within: bool = True  # within every limit (False only for a bound while limits are relaxed)
    rental: dict[str, int] | None = None  # section 1e: the nodes it was found on (the frontier's walk)


def chain_dp(C: np.ndarray, chain: Chain | None = None):
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
    chain = chain or Chain.of_types(T, True)
    f = np.full((n1, T), np.inf)
    g = np.full((n1, T), np.inf)  # g[j, t]: best f[j, t'] over the t' that may come before t
    g[0] = np.where(chain.starts, 0.0, np.inf)
    arg_j = np.zeros((n1, T), dtype=np.int64)
    others = chain.follows.T  # [t, t']: t' may come before t
    groups = chain.groups
    least = np.full(len(groups[1]) + 1 if groups is not None else 0, np.inf)  # each group's, then inf
    cols = np.arange(T)
    for i in range(1, n1):
        total = g[:i] + C[i, :i]
        j = total.argmin(axis=0)
        arg_j[i], f[i] = j, total[j, cols]
        if groups is not None:  # one minimum per group: a pipeline's T x places types, not their square
            order, starts, owner = groups
            np.minimum.reduceat(f[i, order], starts, out=least[:-1])
            g[i] = least[owner]
        else:
            g[i] = np.where(others, f[i][None, :], np.inf).min(axis=1)
    last = np.where(chain.ends, f[-1], np.inf)
    t = int(last.argmin())
    value = float(f[-1, t])
    if not np.isfinite(value):
        return np.inf, None
    stages, i = [], n1 - 1
    while i > 0:
        j = int(arg_j[i, t])
        stages.append((j, i, t))
        if j > 0:  # the first of the types that may come before t to hold g's value, as argmin picks
            t = next(u for u in chain.before[t] if f[j, u] == g[j, t])
        i = j
    return value, stages[::-1]


def chain_dp_limited(
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
    chain = chain or Chain.of_types(T, True)
    base = chain.base
    # With no tracked type (the capped one alone, as when one type's stages overuse its limit) the state
    # keeps one cell, so that f and g stay arrays the loop can write into.
    dims = tuple(int(limits[t]) + 1 for t in tracked) or (1,)
    cells = int(np.prod(dims))
    if n1 * T * cells > MAX_STATE_CELLS:
        raise TooLarge(
            "exact scheduler",
            f"the exact solver would need {n1 * T * cells:,} states to honour the binding limits of "
            f"{len(tracked)} resource types, more than it may use ({MAX_STATE_CELLS:,}); "
            "lower the limits of the scarce types or use another scheduler",
        )
    type_axis = {t: a for a, t in enumerate(tracked)}
    axis = {p: type_axis[int(base[p])] for p in range(T) if int(base[p]) in type_axis}  # DP type -> state axis
    width = chain.widths  # section 1h: a replica's units
    weight = prices.astype(float).copy()  # per DP type: a replica's price
    price_of = {int(base[p]): float(prices[p]) / float(width[p]) for p in range(T)}  # per unit of each type
    if capped is not None:  # count its units: exact integers, compared with the limit at the end
        weight[base == capped] = width[base == capped]
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


GATHER_CELLS = 2_000_000  # values one gather of the limited DP holds at once (16 MB)


def _limited_tables(K: np.ndarray, weight: np.ndarray, axis: dict[int, int], dims: tuple[int, ...], chain: Chain):
    """The forward pass of :func:`chain_dp_limited`: ``f[i, t, *units]`` and ``g`` as in :func:`chain_dp`.

    For each end ``i``, every feasible (start ``j``, type ``t``) is one row of a gather: ``g[j, t]``
    shifted by the stage's units along ``t``'s axis (or plus its weighted replicas where ``t`` is not
    tracked), and ``f[i, t]`` the least of its rows. Where it fits the budget of one table, ``g`` is kept
    with ``dims`` cells of inf before each tracked axis, so that a shift past the axis's start reads inf
    and a row is one flat gather (a third faster); else a mask drops those cells. This loop is the
    solver's hot path: one gather and one grouped ``min`` per end, however many starts, types and replica
    counts (docs/exact.md section 3, "Speed").
    """
    n1, _, T = K.shape
    C = math.prod(dims)
    wide = n1 * T * math.prod(2 * d for d in dims) <= MAX_STATE_CELLS
    pad = dims if wide else tuple(0 for _ in dims)
    padded = tuple(d + p for d, p in zip(dims, pad))
    P = math.prod(padded)
    f = np.full((n1, T, C), np.inf)
    g = np.full((n1 * T, P), np.inf)  # g[j * T + t]: best f[j, t'] over t' != t (the next stage is on t)
    pstrides = np.append(np.cumprod((1, *padded[::-1]))[-2::-1], 0)  # C order; the untracked row: 0
    # each cell's units along each tracked axis, and a last row of zeros for the untracked types
    coords = np.vstack([*(c.ravel() for c in np.indices(dims)), np.zeros(C, dtype=np.int64)])
    inner = (coords[:-1] + np.array(pad, dtype=np.int64)[:, None]).T @ pstrides[:-1]  # where each cell is in g
    g[np.flatnonzero(chain.starts), inner[0]] = 0.0  # g[0, t] at no units
    along = np.array([axis.get(t, len(dims)) for t in range(T)])  # each type's axis, len(dims): untracked
    units = np.where(along < len(dims), chain.widths, 0)  # a replica's units along its axis
    reach = np.append(np.array(dims, dtype=np.int64), 0)  # a shift this far reads only the padding
    added = np.where(along < len(dims), 0.0, weight)  # an untracked type's weight per replica
    flat_g = g.ravel()
    Kt = K.transpose(0, 2, 1)  # [i, t, j]
    rows = max(1, GATHER_CELLS // C)
    for i in range(1, n1):
        tt, jj = np.nonzero(np.isfinite(Kt[i, :, :i]))  # sorted by type, then start
        if not tt.size:
            continue
        k = Kt[i, tt, jj]
        shift = np.minimum((k * units[tt]).astype(np.int64), reach[along[tt]])
        offset = (jj * T + tt) * P - shift * pstrides[along[tt]]
        for lo in range(0, tt.size, rows):
            ts = tt[lo : lo + rows]
            at = offset[lo : lo + rows, None] + inner[None, :]
            if wide:
                values = flat_g[at]
            else:
                fits = coords[along[ts]] >= shift[lo : lo + rows, None]
                values = np.where(fits, flat_g[np.where(fits, at, 0)], np.inf)
            if (plus := added[ts] * k[lo : lo + rows]).any():
                values += plus[:, None]
            first = np.flatnonzero(np.r_[True, ts[1:] != ts[:-1]])
            present = ts[first]
            f[i, present] = np.minimum(f[i, present], np.minimum.reduceat(values, first, axis=0))
        for rest, types in chain.shared_before:  # each set of predecessors once
            g[(i * T + types)[:, None], inner[None, :]] = f[i, rest].min(axis=0)
    shaped = g.reshape((n1, T, *padded))[(slice(None), slice(None), *(slice(p, None) for p in pad))]
    return f.reshape((n1, T, *dims)), shaped


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
                src[axis[t]] -= k * int(chain.widths[t])
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


def limited_dp(problem: Problem, chain: Chain, K: np.ndarray, prices: np.ndarray, state: tuple[list[int], int | None]):
    """:func:`chain_dp_limited`, or the plain DP when every limit it would track is relaxed."""
    if state[0] or state[1] is not None:
        return chain_dp_limited(K, prices, problem.limits, *state, chain)
    with np.errstate(invalid="ignore"):
        return chain_dp(np.where(np.isfinite(K), prices[None, None, :] * K, np.inf), chain)[1]


def state_cells(problem: Problem, table: Table, state: tuple[list[int], int | None]) -> int:
    """The cells of :func:`chain_dp_limited`'s arrays for ``state``."""
    n1, _, T = table.sc.shape
    return n1 * T * math.prod(int(problem.limits[t]) + 1 for t in state[0])


def limit_state(problem: Problem, tracked: set[int]) -> tuple[list[int], int | None]:
    """The types whose units the limit-aware DP tracks, and the one it caps, for ``tracked`` limits.

    Either exactly the ``tracked`` types, or every type but one priced type, left out of the
    state and "capped": the DP then minimises its units and checks its limit at the end (its
    cost is its price times its units). Capping the type with the most units usually gives
    far fewer states: that is the choice whenever it does."""
    p = problem
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


def units_used(problem: Problem, chain: Chain, stages, K) -> np.ndarray:
    """Units of each resource type the DP's ``stages`` take with replicas ``K``."""
    used = np.zeros(problem.n_types)
    for j, i, t in stages:
        used[chain.base[t]] += K[i, j, t] * chain.widths[t]
    return used


def overused(problem: Problem, chain: Chain, stages, K) -> set[int]:
    """The resource types whose limits ``stages`` break."""
    return set(np.flatnonzero(units_used(problem, chain, stages, K) > problem.limits).tolist())
