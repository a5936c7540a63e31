"""Section 1i's exact optimum over mixed stages, where the space is small (``plan -s exact``, mixed stages offered).

A stage's step depends only on its layers, its place ``s`` among ``S`` stages, the micro-batch and the units
it holds of each type (a one-type stage: at its best degree and recomputation; a mixed one: at its best
split, :func:`~heterps_cli.mixed.least_slowest`). So, for each micro-batch and each ``S``, one DP over
(stages so far, layers so far, units of every type used, exactly) keeps the least slowest step; the plan's
cost is then its units' price over its throughput, and the best final cell by the objective is the optimum
(docs/exact.md, "Mixed stages"). The state is every type's units, so the DP runs where their product is
small (:data:`MOST_WORK`); elsewhere the climb of :mod:`~heterps_cli.schedulers.mixing` answers, with a gap.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass

import numpy as np

from heterps_cli.costmodel import better, meets_targets, replicas_keep_rules, stage_throughputs
from heterps_cli.formulas import mixed_step, run_cost
from heterps_cli.mixed import Joined, least_slowest, part_limits, part_times, runs_at, share_limit
from heterps_cli.objective import Objective
from heterps_cli.plan import Plan, make_plan
from heterps_cli.problem import Problem
from heterps_cli.schedulers.base import Clock
from heterps_cli.stages import labelled, split_stages, stage_label

MOST_WORK = 5_000_000  # :func:`_work`'s units: about 2 s on one core (benchmarks/bench_mixed.py)


@dataclass(frozen=True)
class Option:
    """How a stage reaches its step with a vector of units: one type's ``way`` (degree index, recomputes)
    and replicas, or mixed ``parts`` ``(type, replicas, samples, degree)``, none recomputing."""

    step: float
    way: tuple[int, bool] | None
    parts: tuple[tuple[int, int, int, int], ...]


def why_not(problem: Problem) -> str | None:
    """Why the DP does not run on ``problem`` (None: it does)."""
    if problem.nodes is not None:
        return "on whole nodes the units are the rental's"
    if problem.maximal_stages:
        return "--maximal-stages"
    if problem.ties:
        return "the model has tied tensors (section 1j)"
    if (work := _work(problem)) > MOST_WORK:
        return (
            f"its DP's work ({problem.n_layers} layers, {_cells(problem):,} vectors of every type's units) is "
            f"{work:,}, more than {MOST_WORK:,}"
        )
    return None


def _cells(problem: Problem) -> int:
    return math.prod(int(x) + 1 for x in problem.limits)


def _work(problem: Problem) -> int:
    """What the DP's time grows with: its stage tables' entries (every place of every span of layers at
    every stage count, times the vectors a stage may hold), each relaxed over up to every cell."""
    n, B = problem.n_layers, max(problem.micro_batch_choices)
    spans = sum(S * n * (n + 1) // 2 for S in range(1, n + 1))
    most = B * max(problem.degrees)  # a mixed stage's units: B replicas at most, each of at most D units
    mixed = min(math.comb(problem.n_types + most, most), _cells(problem)) * len(problem.degrees) ** problem.n_types
    one_type = sum(min(int(x), B) for x in problem.limits) * len(problem.stage_ways)
    return len(problem.micro_batch_choices) * spans * (mixed + one_type) * (1 + _cells(problem) // 100)


@dataclass(frozen=True)
class Finals:
    """The DP's last cells for ``S`` stages at one micro-batch: for every vector of units used (flat),
    the best plan's throughput and cost, and whether it meets the job's floor and budget."""

    problem: Problem  # at the micro-batch
    S: int
    throughput: np.ndarray  # [C]
    cost: np.ndarray  # [C]
    ok: np.ndarray  # [C]
    value: dict
    tables: dict

    def plan(self, u: int, scheduler: str, seed: int, problem: Problem | None = None) -> Plan:
        """The plan of cell ``u`` (:func:`_back`), its figures by the cost model, for ``problem`` (this one
        with another objective or floor) where given."""
        shape = tuple(int(x) + 1 for x in self.problem.limits)
        chosen = _back(self.value, self.tables, shape, self.S, self.problem.n_layers, u)
        return _plan(problem or self.problem, chosen, scheduler, seed)


def finals(problem: Problem, clock: Clock) -> list[Finals] | None:
    """The DP's last cells for every micro-batch and stage count (None: the clock ran out)."""
    out = []
    for batch in problem.micro_batch_choices:
        at = problem.at_micro_batch(batch)
        splits: dict = {}
        for S in range(1, problem.n_layers + 1):
            if clock.out_of_time():
                return None
            found = _run(at, S, splits)
            if found is not None:
                out.append(found)
    return out


def optimum(problem: Problem, clock: Clock, scheduler: str, seed: int) -> Plan | None:
    """The best plan of mixed and one-type stages by the problem's objective (None: none meets the job,
    or the clock ran out, which the caller tells apart with ``clock``)."""
    return best_of(problem, finals(problem, clock) or [], scheduler, seed)


def why_none(problem: Problem, found: list[Finals]) -> str | None:
    """Why no plan meets the job though some run (None where none runs): the binding constraint, and the
    best figure a plan of mixed and one-type stages reaches."""
    from heterps_cli.figures import count, usd

    runs = [(f, u) for f in found for u in np.flatnonzero(f.throughput > 0)]  # a cell no plan reaches: 0
    if not runs:
        return None
    fastest = max(float(f.throughput[u]) for f, u in runs)
    limits = ", ".join(f"{t} <= {int(n)}" for t, n in zip(problem.types, problem.limits))
    if fastest < problem.min_throughput * (1 - 1e-12):
        return (
            f"no plan reaches the required {count(problem.min_throughput, 1)} samples/s within the limits "
            f"({limits}), mixed stages included: the fastest reaches {count(fastest, 1)} samples/s; raise the "
            "limits, or lower the required throughput (--min-throughput)"
        )
    reaching = [float(f.cost[u]) for f, u in runs if f.throughput[u] >= problem.min_throughput * (1 - 1e-12)]
    return (
        f"no plan meets the budget of {usd(problem.max_cost or 0.0)}, mixed stages included: the cheapest plan "
        f"that meets the rest of the job costs {usd(min(reaching))}; raise --max-cost"
    )


def best_of(problem: Problem, found: list[Finals], scheduler: str, seed: int) -> Plan | None:
    """The best plan of the DP's last cells by the problem's objective (None: none meets the job)."""
    best: tuple[float, float, Finals, int] | None = None
    for f in found:
        if not f.ok.any():
            continue
        order = (-f.throughput, f.cost) if problem.objective is Objective.TIME else (f.cost, -f.throughput)
        u = int(np.lexsort(tuple(np.where(f.ok, key, np.inf) for key in reversed(order)))[0])
        thr, cost = float(f.throughput[u]), float(f.cost[u])
        if best is None or better(problem, cost, thr, best[1], best[0]):
            best = (thr, cost, f, u)
    return None if best is None else best[2].plan(best[3], scheduler, seed)


def _run(problem: Problem, S: int, splits: dict) -> Finals | None:
    """The DP for ``S`` stages at the problem's micro-batch (None: no plan of ``S`` stages runs); ``splits``:
    the mixed parts' best splits found so far at this micro-batch."""
    shape = tuple(int(x) + 1 for x in problem.limits)
    tables = _stage_tables(problem, S, shape, splits)
    if not tables:
        return None
    n, C = problem.n_layers, math.prod(shape)
    grid = _grid(shape)
    value = {(0, 0): np.where(np.arange(C) == 0, 0.0, np.inf)}  # (stages, layers) -> least slowest step per u
    for s in range(S):
        for (ss, a), cur in list(value.items()):
            if ss != s or not np.isfinite(cur).any():
                continue
            for b in range(a, n - (S - s - 1)):
                if (s, a, b) in tables:
                    _relax(value.setdefault((s + 1, b + 1), np.full(C, np.inf)), cur, tables[s, a, b][0], grid, shape)
    last = value.get((S, n))
    if last is None or not np.isfinite(last).any():
        return None
    units = grid.astype(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        thr = problem.step_samples / last
        cost = run_cost(problem.work, thr, units @ problem.prices)
    ok = np.isfinite(last) & meets_targets(problem, thr, cost)
    return Finals(problem, S, thr, cost, ok, value, tables)


@functools.cache
def _grid(shape: tuple[int, ...]) -> np.ndarray:
    """``[C, T]``: every vector of units, by flat index (the same for every micro-batch and stage count)."""
    return np.array(list(np.ndindex(shape)), dtype=np.int64).reshape(-1, len(shape))


def _relax(out: np.ndarray, cur: np.ndarray, steps: np.ndarray, grid: np.ndarray, shape: tuple[int, ...]) -> None:
    """``out[u + v] = min(out[u + v], max(cur[u], steps[v]))`` over every ``u``, ``v`` within the limits
    (``grid[i]``: flat index ``i``'s vector of units)."""
    us, vs = np.flatnonzero(np.isfinite(cur)), np.flatnonzero(np.isfinite(steps))
    total = grid[us][:, None, :] + grid[vs][None, :, :]
    keep = (total < np.array(shape)).all(axis=2)
    where = np.ravel_multi_index(tuple(total[keep].T), shape)
    vals = np.maximum(cur[us][:, None], steps[vs][None, :])[keep]
    np.minimum.at(out, where, vals)


def _back(value: dict, tables: dict, shape: tuple[int, ...], S: int, n: int, u: int) -> list:
    """The stages of the DP's path to unit vector ``u`` (flat) after ``S`` stages of ``n`` layers: at each
    stage, a start and a vector whose value is the one kept (the DP copies values, so they are equal)."""
    out, i, at = [], n, np.array(np.unravel_index(u, shape))
    for s in range(S, 0, -1):
        want = value[s, i][int(np.ravel_multi_index(tuple(at), shape))]
        found = None
        for a in range(s - 1, i):
            if (s - 1, a, i - 1) not in tables or (s - 1, a) not in value:
                continue
            steps, options = tables[s - 1, a, i - 1]
            for v in np.flatnonzero(np.isfinite(steps)):
                rest = at - np.array(np.unravel_index(v, shape))
                if (rest >= 0).all():
                    before = value[s - 1, a][int(np.ravel_multi_index(tuple(rest), shape))]
                    if max(before, steps[v]) == want:
                        found = (a, options[int(v)], rest)
                        break
            if found is not None:
                break
        assert found is not None, "the DP's path is lost"
        a, option, at = found
        out.append((a, i - 1, option))
        i = a
    return out[::-1]


def _stage_tables(problem: Problem, S: int, shape: tuple[int, ...], splits: dict) -> dict:
    """For every stage ``s`` of ``S`` over layers ``a..b``: each unit vector's least step (inf: none) and
    how (:class:`Option`), as ``{(s, a, b): (steps [C], {flat index: Option})}``."""
    n, T = problem.n_layers, problem.n_types
    spans = [
        (s, a, b)
        for s in range(S)
        for a in (range(s, n) if s else [0])
        for b in (range(a, n - (S - s - 1)) if s < S - 1 else [n - 1])
    ]
    ways = problem.stage_ways
    rows, keys = [], []
    for s, a, b in spans:
        for t in range(T):
            for j, again in ways:
                rows.append(_row(problem, S, s, a, b, int(stage_label(T, t, again, j))))
                keys.append((s, a, b, t, j, again))
    st = split_stages(problem, np.array(rows))
    tables: dict = {}
    _one_type(problem, st, keys, shape, tables)
    row_of = {key: r for r, key in enumerate(keys)}
    for s, a, b in spans:
        first = {
            (t, problem.degrees[j]): row_of[s, a, b, t, j, False] for t in range(T) for j, again in ways if not again
        }
        _mixed(problem, st, S, (s, a, b), first, shape, tables, splits)
    return tables


def _row(problem: Problem, S: int, s: int, a: int, b: int, label: int) -> np.ndarray:
    """A schedule whose stage ``s`` of ``S`` is layers ``a..b`` labelled ``label`` (the others: fillers,
    whose figures are not read)."""
    n = problem.n_layers
    before = [(i, i + 1) for i in range(s - 1)] + ([(s - 1, a)] if s else [])
    after = [(b + 1 + i, b + 2 + i) for i in range(S - s - 2)] + ([(b + 1 + max(S - s - 2, 0), n)] if s < S - 1 else [])
    cuts = [(x, y, 0) for x, y in before] + [(a, b + 1, label)] + [(x, y, 0) for x, y in after]
    return labelled(problem.n_types, cuts)


def _entry(tables: dict, key: tuple, shape: tuple[int, ...], flat: int, option: Option) -> None:
    """Keep ``option`` for the vector of units ``flat`` of stage ``key`` where no faster one is kept."""
    steps, options = tables.setdefault(key, (np.full(math.prod(shape), np.inf), {}))
    if option.step < steps[flat]:
        steps[flat], options[flat] = option.step, option


def _one_type(problem: Problem, st, keys: list, shape: tuple[int, ...], tables: dict) -> None:
    """Every row's one-type stage (``keys[r]`` = (s, a, b, type, degree index, recomputes)) at every replica
    count its type's limit allows, its step by the cost model; all rows at once for each count."""
    s_of = np.array([key[0] for key in keys])
    rows = np.arange(len(keys))
    runs = np.array([_runs(problem, key) for key in keys], dtype=bool)
    width = np.array([int(problem.widths[key[4]]) for key in keys])
    most = np.array([min(int(problem.limits[key[3]]) // w, problem.batch_size) for key, w in zip(keys, width)])
    for k in range(1, int(most.max(initial=0)) + 1):
        kk = np.full(st.valid.shape, float(k))
        keep = replicas_keep_rules(problem, st, kk)[rows, s_of]
        thr = stage_throughputs(problem, st, kk)[rows, s_of]
        good = runs & keep & (k <= most) & (thr > 0) & np.isfinite(thr)
        for r in np.flatnonzero(good):
            s, a, b, t, j, again = keys[r]
            v = tuple(k * int(width[r]) if x == t else 0 for x in range(problem.n_types))
            parts = ((t, k, problem.batch_size, int(width[r])),)
            option = Option(problem.step_samples / float(thr[r]), (j, again), parts)
            _entry(tables, (s, a, b), shape, int(np.ravel_multi_index(v, shape)), option)


def _runs(problem: Problem, key: tuple) -> bool:
    """Whether a stage of ``key`` = (s, a, b, type, degree index, recomputes) can run, as split_stages reads it."""
    _, a, b, t, j, again = key
    if not runs_at(problem, t, problem.degrees[j], a, b):
        return False
    view = problem.views[j]
    return not again or bool(view.can_recompute and view.recomputable[a : b + 1, t].all())


def _mixed(problem: Problem, st, S: int, span: tuple, first: dict, shape: tuple[int, ...], tables: dict, splits: dict):
    """Every vector of two types or more, each type's units at each degree that divides them (section 1i):
    its parts' best split and the step. A part's times, all-reduce and update are its layers' alone; only
    its memory (the micro-batches in flight) and the bubble depend on the stage's place, so a split found
    once serves every ``S`` (``splits``)."""
    s, a, b = span
    B = problem.batch_size
    ways = [(t, d) for (t, d) in first if runs_at(problem, t, d, a, b)]
    times = {w: part_times(problem, st, first[w], s) for w in ways}
    limits = {w: part_limits(problem, st, first[w], s, w, a, b) for w in ways}
    sync = {w: float(st.sync[first[w], s]) for w in ways}
    update = {w: float(st.update[first[w], s]) for w in ways}
    for v, flat in _mixed_vectors(shape, B * max(problem.degrees)):
        used = tuple(t for t in range(problem.n_types) if v[t])
        degrees = [[d for d in problem.degrees if v[t] % d == 0 and (t, d) in times] for t in used]
        for ds in itertools.product(*degrees):
            ks = tuple(int(v[t]) // d for t, d in zip(used, ds))
            K = sum(ks)
            if K > B:
                continue
            parts = tuple(zip(used, ds))
            most = tuple(int(share_limit(problem, t, limits[t, d], K)) for t, d in parts)
            key = (a, b, parts, ks, most)
            if key not in splits:
                splits[key] = _split(times, sync, update, parts, ks, most, B)
            if splits[key] is None:
                continue
            slowest, y, u, chosen = splits[key]
            step, _ = mixed_step(problem.micro_batches, S, slowest, y, K, u)
            _entry(tables, span, shape, flat, Option(float(step), None, chosen))


def _split(times: dict, sync: dict, update: dict, ways: tuple, ks: tuple, most: tuple, B: int) -> tuple | None:
    """A mixed stage's best split (:func:`~heterps_cli.mixed.least_slowest`) of parts on ``ways`` = (type,
    degree) of ``ks`` replicas: its slowest part's time per micro-batch, the slowest all-reduce and update,
    and its parts ``(type, replicas, samples, degree)`` (the most replicas own the stage)."""
    samples = least_slowest([times[w] for w in ways], list(most), list(ks), B)
    if samples is None:
        return None
    slowest = max(float(times[w][-(-n // k) - 1]) for w, n, k in zip(ways, samples, ks))
    parts = sorted(((t, k, n, d) for (t, d), k, n in zip(ways, ks, samples)), key=lambda p: (-p[1], p[0]))
    return slowest, max(sync[w] for w in ways), max(update[w] for w in ways), tuple(parts)


@functools.cache
def _mixed_vectors(shape: tuple[int, ...], most: int) -> tuple[tuple[tuple[int, ...], int], ...]:
    """The vectors of units a mixed stage may hold (two types or more, at most ``most`` units), each with
    its flat index."""
    ranges = [range(min(n - 1, most) + 1) for n in shape]
    return tuple(
        (v, int(np.ravel_multi_index(v, shape)))
        for v in itertools.product(*ranges)
        if sum(v) <= most and sum(x > 0 for x in v) >= 2
    )


def _plan(problem: Problem, chosen: list, scheduler: str, seed: int) -> Plan:
    """The plan of the DP's stages, its figures by the cost model (:func:`~heterps_cli.plan.make_plan`)."""
    T = problem.n_types
    cuts, replicas, joined = [], [], {}
    for s, (a, b, option) in enumerate(chosen):
        t, k, _, d = option.parts[0]
        j, again = option.way or (problem.degrees.index(d), False)
        cuts.append((a, b + 1, int(stage_label(T, t, again, j))))
        replicas.append(k)
        if len(option.parts) > 1:
            joined[s] = tuple(Joined(u, m, n, d) for u, m, n, d in option.parts[1:])
    schedule = labelled(T, cuts)
    return make_plan(problem, schedule, replicas, scheduler=scheduler, seed=seed, joined=joined, optimal=True)
