"""Local improvement of schedules: the neighbourhood every heuristic polishes its answer in.

Four kinds of move, all scored in one vectorised call per round:

* put one layer on another type;
* put a whole stage on another type (which may merge it with a neighbour);
* move a boundary between two stages to any layer between their outer ends;
* slide a stage's window along the chain, its neighbours taking up the slack.

The last two move many layers at once: shifting a stage by several layers one
layer at a time often passes through worse plans, so a one-layer search stalls
in front of the better placement. When none of these improves, a wider move is
tried: put any run of up to :data:`SEGMENT` layers on another type (a new stage
inside another, or one stage grown over its neighbours); any improvement sends
the search back to the cheap moves (variable neighbourhood descent).

Outside the papers' space (docs/spec.md section 1) the cheap moves also cut a stage in two
on its type, join two neighbouring stages on one type, and put a stage on another type without
joining a neighbour: its schedules hold stage labels (:func:`heterps_cli.stages.labelled`, a type
plus a multiple of the number of types), so that two neighbouring stages on one type stay two.

The search climbs a score that ranks feasible plans by the objective and
infeasible plans below them by how far they miss, so a walk can also climb
into feasibility. :func:`kick` perturbs a schedule for iterated local search,
and :func:`polish` runs the whole thing: a descent from each promising start,
then kicks and descents from the best plan, then :func:`window_search`, which
re-plans every window of :data:`WINDOW` layers in every way with up to three
stages inside. Where limits bind so hard that no descent reaches a feasible
plan, or the best plan uses all of some type, :func:`price_repair` searches
another way: with the limits loosened and the overused types made dearer
(for rl and tapp, again from the kicks' best plan if it still uses all of a type).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable

import numpy as np

from heterps_cli.objective import Objective
from heterps_cli.problem import Problem
from heterps_cli.progress import Progress, quiet
from heterps_cli.schedulers.cuts import RunCutter, cut_scored
from heterps_cli.schedulers.scoring import (
    Best,
    Evaluator,
    Reference,
    heuristic_schedules,
    rewards,
    signature,
)
from heterps_cli.stages import PARITIES, label_parts, stage_label

SEGMENT = 12  # longest run of layers the wide move recolours
# The most one polish may score, in schedules x layers: a round of moves scores ~n schedules of n
# layers, so without a bound the polish of a 10,000-layer model ran for hours. At 10,000 layers
# this is 50,000 schedules (about 2 minutes on 2 cores); up to 1,000 layers it has not bound on
# any benchmark instance (docs/large-models.md). --time-limit bounds it in seconds.
SEARCH_CELLS = 500_000_000
MOVE_BYTES = 16_000_000  # the most one batch of moves may hold (int64 rows of the whole schedule); scoring
# a batch takes about 20 times that in temporaries (measured: 2 GB at 2,000 layers with 64 MB)


def _stages(schedule: np.ndarray) -> list[tuple[int, int]]:
    bounds = [0, *(np.flatnonzero(np.diff(schedule)) + 1).tolist(), len(schedule)]
    return list(zip(bounds[:-1], bounds[1:]))


# A move is one or two runs of layers put on a type each, a row (a1, z1, t1, a2, z2, t2) of layers
# [a1, z1) on t1 and [a2, z2) on t2 (a2 == z2: one run). Moves are listed in numpy and made into
# schedules only a batch at a time: made one row at a time in Python, the wide moves of a 64-layer
# model took 5.5 ms a round (now 0.8 ms), and every row was checked layer by layer.


def _before(flags: np.ndarray) -> np.ndarray:
    """Per layer ``i`` (0 to n), how many of the layers before it are flagged (per column, if any):
    layers ``[a, z)`` hold ``_before(flags)[z] - _before(flags)[a]``."""
    counts = np.zeros((len(flags) + 1, *flags.shape[1:]), dtype=np.int64)
    np.cumsum(flags, axis=0, out=counts[1:])
    return counts


def _runs_ok(problem: Problem, schedule: np.ndarray, moves: np.ndarray) -> np.ndarray:
    """Does each move give a schedule whose every layer is on a type that can run it?"""
    T = problem.n_types
    cu = _before(~problem.usable)  # [n + 1, T]
    cb = _before(~problem.usable[np.arange(problem.n_layers), schedule % T])  # [n + 1], as the schedule stands
    a1, z1, t1, a2, z2, t2 = moves.T
    t1, t2 = t1 % T, t2 % T
    outside = cb[-1] - (cb[z1] - cb[a1]) - (cb[z2] - cb[a2])
    inside = cu[z1, t1] - cu[a1, t1] + cu[z2, t2] - cu[a2, t2]
    return (outside == 0) & (inside == 0)


LABELS = PARITIES  # stage labels per type: a stage between two others on its type needs a third


def labelled_moves(problem: Problem) -> bool:
    """Whether moves may cut or join stages on one type (and recompute a stage, or change its degree:
    sections 1g, 1h): outside the papers' space, and while every label fits the byte per layer the
    evaluator keeps."""
    return not problem.maximal_stages and LABELS * problem.n_types * 2 * len(problem.views) <= 256


def _apart(problem: Problem, t, *others, again=False, degree=0) -> np.ndarray:
    """A label of type ``t`` that is none of ``others`` (labels, or -1 for none), per element: the
    type itself where it is free; ``again`` (per element): the stage recomputes (section 1g);
    ``degree``: the index of its tensor-parallel degree (section 1h)."""
    t = stage_label(problem.n_types, t, again, degree)
    out = np.full(t.shape, -1, dtype=np.int64)
    for p in range(LABELS - 1, -1, -1):  # written last, the smallest free label wins
        label = t + p * problem.n_types
        free = np.ones(t.shape, dtype=bool)
        for other in others:
            free &= label != np.asarray(other)
        out = np.where(free, label, out)
    return out


def _one_run(a, z, t) -> np.ndarray:
    a, z, t = (np.asarray(x, dtype=np.int64).ravel() for x in (a, z, t))
    zero = np.zeros_like(a)
    return np.stack([a, z, t, zero, zero, zero], axis=1)


def _neighbour_moves(problem: Problem, schedule: np.ndarray) -> np.ndarray:
    """The moves of :func:`neighbours`, in a fixed order (with repeats)."""
    n, T = problem.n_layers, problem.n_types
    types = schedule % T
    layer, t = (x.ravel() for x in np.meshgrid(np.arange(n), np.arange(T), indexing="ij"))
    keep = t != types[layer]
    moves = [_one_run(layer[keep], layer[keep] + 1, t[keep])]
    stages = _stages(schedule)
    for a, z in stages:
        if z - a > 1:
            others = np.flatnonzero(np.arange(T) != types[a])
            moves.append(_one_run(np.full(len(others), a), np.full(len(others), z), others))
    if labelled_moves(problem):
        moves += _stage_moves(problem, schedule, stages)
    for (a, m), (_, z) in zip(stages, stages[1:]):
        moved = np.setdiff1d(np.arange(a + 1, z), [m])  # the boundary to any layer between the outer ends
        later = moved > m
        moves.append(
            _one_run(np.where(later, m, moved), np.where(later, moved, m), np.where(later, schedule[a], schedule[m]))
        )
    for (p, a), (_, z), (_, q) in zip(stages, stages[1:], stages[2:]):
        shift = np.setdiff1d(np.arange(p + 1 - a, q - z), [0])  # the middle stage slid along
        left, mine, right = schedule[p], schedule[a], schedule[z]
        ahead = shift > 0
        zero = np.zeros_like(shift)
        moves.append(
            np.stack(
                [
                    np.where(ahead, a, a + shift),
                    np.where(ahead, a + shift, np.minimum(a, z + shift)),
                    np.where(ahead, left, mine) + zero,
                    np.where(ahead, np.maximum(z, a + shift), z + shift),
                    np.where(ahead, z + shift, z),
                    np.where(ahead, mine, right) + zero,
                ],
                axis=1,
            )
        )
    listed = np.concatenate(moves)
    return listed[_runs_ok(problem, schedule, listed)]


def _stage_moves(problem: Problem, schedule: np.ndarray, stages: list[tuple[int, int]]) -> list[np.ndarray]:
    """Section 1's whole space: cut each stage in two on its type (a new label from the cut to its
    end, run the same way: sections 1g, 1h), join each stage to the previous one on the same type, and
    put each stage on every other type without joining either neighbour."""
    n, T = problem.n_layers, problem.n_types
    types, again, degree = label_parts(T, schedule)
    moves = []
    for a, z in stages:
        after = schedule[z] if z < n else -1
        cut = np.arange(a + 1, z)
        if cut.size:
            label = _apart(problem, np.full(cut.size, types[a]), schedule[a], after, again=again[a], degree=degree[a])
            moves.append(_one_run(cut, np.full(cut.size, z), label))
        before = schedule[a - 1] if a > 0 else -1
        others = np.flatnonzero(np.arange(T) != types[a])
        label = _apart(problem, others, before, after)
        moves.append(_one_run(np.full(others.size, a), np.full(others.size, z), label))
    for (a, m), (_, z) in zip(stages, stages[1:]):
        if types[a] == types[m]:  # one label over both (run as the first), none of their outer neighbours'
            before, after = schedule[a - 1] if a > 0 else -1, schedule[z] if z < n else -1
            label = _apart(problem, types[a], before, after, again=again[a], degree=degree[a])
            moves.append(_one_run(a, z, label))
    views = problem.views
    for a, z in stages:
        before, after = schedule[a - 1] if a > 0 else -1, schedule[z] if z < n else -1
        here = views[degree[a]]
        # section 1g: each stage that can, recomputing or not, apart from its neighbours
        if here.can_recompute and here.recomputable[a:z, types[a]].all():
            label = _apart(problem, types[a], before, after, again=not again[a], degree=degree[a])
            moves.append(_one_run(a, z, label))
        for j, view in enumerate(views):  # section 1h: each stage at every other degree its layers have
            if j != degree[a] and view.runnable[a:z, types[a]].all():
                keep = again[a] and view.can_recompute and view.recomputable[a:z, types[a]].all()
                moves.append(_one_run(a, z, _apart(problem, types[a], before, after, again=keep, degree=j)))
    return [m[m[:, 2] >= 0] for m in moves]


def _wide_moves(problem: Problem, schedule: np.ndarray) -> np.ndarray:
    """The moves of :func:`wide_neighbours`: every run of 2..SEGMENT layers on every other type it can
    run on, in a fixed order."""
    n, T = problem.n_layers, problem.n_types
    a, length, t = (
        x.ravel() for x in np.meshgrid(np.arange(n), np.arange(2, SEGMENT + 1), np.arange(T), indexing="ij")
    )
    z = a + length
    a, z, t = a[z <= n], z[z <= n], t[z <= n]
    cu, same = _before(~problem.usable), _before(schedule[:, None] % T == np.arange(T))
    keep = (cu[z, t] == cu[a, t]) & (same[z, t] - same[a, t] < z - a)
    return _one_run(a[keep], z[keep], t[keep])


def _made(schedule: np.ndarray, moves: np.ndarray) -> np.ndarray:
    """The schedules ``moves`` make from ``schedule``: ``[m, n]``."""
    layers = np.arange(len(schedule))
    rows = np.repeat(schedule[None], len(moves), axis=0)
    for a, z, t in (moves[:, :3].T, moves[:, 3:].T):
        inside = (layers >= a[:, None]) & (layers < z[:, None])
        rows = np.where(inside, t[:, None], rows)
    return rows


def neighbours(problem: Problem, schedule: np.ndarray) -> np.ndarray:
    """Every distinct schedule one move away that runs each layer on a type it can run on."""
    return _distinct(_made(schedule, _neighbour_moves(problem, schedule)), problem.n_layers)


def wide_neighbours(problem: Problem, schedule: np.ndarray) -> np.ndarray:
    """Every schedule with one run of 2..SEGMENT layers put on another (runnable) type."""
    return _distinct(_made(schedule, _wide_moves(problem, schedule)), problem.n_layers)


def _distinct(rows: np.ndarray, n: int) -> np.ndarray:
    if len(rows) == 0:
        return np.zeros((0, n), dtype=np.int64)
    stacked = np.asarray(rows, dtype=np.int64)
    if stacked.max() > 255:
        return np.unique(stacked, axis=0)
    # Each row as one n-byte string: sorting those bytes is the rows' lexicographic order (so the
    # same result as np.unique(axis=0)), ten times faster than its column-by-column sort at 64 layers.
    keys = np.ascontiguousarray(stacked.astype(np.uint8)).view(np.dtype((np.void, n)))[:, 0]
    return stacked[np.unique(keys, return_index=True)[1]]


def _batches(moves: Callable[[Problem, np.ndarray], np.ndarray], problem: Problem, schedule: np.ndarray):
    """The moves from ``schedule`` in batches of distinct rows: one batch (sorted, as ``np.unique``
    gives them) while all of them fit in :data:`MOVE_BYTES`; else batches that do, in the order
    they are listed, so that a model of thousands of layers never holds them all at once."""
    n = problem.n_layers
    listed = moves(problem, schedule)
    size = len(listed) if 8 * n * n * problem.n_types * 2 <= MOVE_BYTES else max(16, MOVE_BYTES // (8 * n))
    for lo in range(0, max(len(listed), 1), max(size, 1)):
        yield _distinct(_made(schedule, listed[lo : lo + size]), n)


def improve(
    problem: Problem,
    schedule: np.ndarray,
    score: Callable[[np.ndarray], np.ndarray],
    max_rounds: int = 200,
    out_of_time: Callable[[], bool] = lambda: False,
) -> tuple[np.ndarray, float]:
    """Steepest ascent from ``schedule`` under ``score`` (higher is better); (schedule, score).

    ``out_of_time()`` is asked before every batch of moves: on thousands of layers one round
    scores thousands of neighbours, and a whole ascent can take minutes."""
    current = np.asarray(schedule, dtype=np.int64)
    value = float(score(current[None])[0])
    for _ in range(max_rounds):
        if out_of_time():
            break
        for moves in (_neighbour_moves, _wide_moves):
            found, found_value = None, value
            for candidates in _batches(moves, problem, current):
                if len(candidates) == 0:
                    continue
                values = score(candidates)
                i = int(values.argmax())
                if values[i] > (found_value if found is not None else value + 1e-12 * abs(value)):
                    found, found_value = candidates[i].copy(), float(values[i])
                if out_of_time():
                    break
            if found is not None:
                current, value = found, found_value
                break
        else:
            break
    return current, value


WINDOW = 14  # window_search: layers re-planned at once
WINDOW_ROWS = 200_000  # ... with up to 2 changes of type inside while windows x ways stay under this, else fewer


def _ways(width: int, n_types: int, cuts: int) -> int:
    """How many rows :func:`_patterns` has."""
    return sum(math.comb(width - 1, k) * n_types * (n_types - 1) ** k for k in range(cuts + 1))


@functools.lru_cache(maxsize=8)
def _patterns(width: int, n_types: int, cuts: int) -> np.ndarray:
    """Every way to run ``width`` layers on ``n_types`` types with at most ``cuts`` changes of type."""
    rows = []
    for k in range(cuts + 1):
        for at in itertools.combinations(range(1, width), k):
            bounds = (0, *at, width)
            for types in itertools.product(range(n_types), repeat=k + 1):
                if all(x != y for x, y in zip(types, types[1:])):
                    rows.append(np.repeat(types, np.diff(bounds)))
    return np.array(rows, dtype=np.int64)


def window_search(
    problem: Problem,
    schedule: np.ndarray,
    score: Callable[[np.ndarray], np.ndarray],
    out_of_time: Callable[[], bool] = lambda: False,
) -> tuple[np.ndarray, float]:
    """Re-plan every window of :data:`WINDOW` consecutive layers in every way with up to three stages
    inside (fewer where that many ways over all windows would pass :data:`WINDOW_ROWS`: many types or
    layers; none past it with one), take the best improvement and descend from it (:func:`improve`);
    repeat until none improves.

    Where limits bind, a cheaper plan can differ from a local optimum by three stages at once (on
    chain64x3-bandwidth: cpu | a100 x9 | v100 x4 where the optimum has v100 x4 | cpu x4 | v100 x6),
    each step towards it dearer; no move of :func:`improve` and no kick reached it on any seed."""
    n, T = problem.n_layers, problem.n_types
    width = min(WINDOW, n)
    starts = n - width + 1
    current = np.asarray(schedule, dtype=np.int64)
    value = float(score(current[None])[0])
    # Counted before any is built: 14 layers on 100 types with two changes is 76 million ways.
    fitting = [c for c in (2, 1, 0) if starts * _ways(width, T, c) <= WINDOW_ROWS]
    if not fitting:
        return current, value
    patterns = _patterns(width, T, fitting[0])
    per_batch = max(1, MOVE_BYTES // (8 * n * len(patterns)))
    while not out_of_time():
        found, found_value = None, value + 1e-12 * abs(value)
        for lo in range(0, starts, per_batch):
            rows = []
            for a in range(lo, min(starts, lo + per_batch)):
                block = np.repeat(current[None], len(patterns), axis=0)
                block[:, a : a + width] = patterns
                rows.append(block[problem.usable[np.arange(n), block % T].all(axis=1)])
            candidates = _distinct(np.concatenate(rows), n)
            values = score(candidates)
            i = int(values.argmax())
            if values[i] > found_value:
                found, found_value = candidates[i].copy(), float(values[i])
            if out_of_time():
                break
        if found is None:
            break
        current, value = improve(problem, found, score, out_of_time=out_of_time)
    return current, value


def kick(problem: Problem, schedule: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A random jump out of a local optimum: half the time two stages trade types, otherwise one run of
    2..8 layers put on another runnable type.

    The trade is for limits that bind: when every unit of a100 and v100 is in use, a plan with them the
    other way round is a two-place change that no single move makes (chain64x3-bandwidth and
    chain64x4-tight ended 5-6% off the optimum for want of it)."""
    n = problem.n_layers
    row = schedule.copy()
    stages = _stages(schedule)
    if len(stages) > 2 and rng.random() < 0.5:
        for _ in range(20):
            i, j = rng.choice(len(stages), 2, replace=False)
            (a, b), (c, d) = stages[i], stages[j]
            mine, theirs = schedule[a], schedule[c]
            T = problem.n_types
            if mine % T != theirs % T and problem.usable[a:b, theirs % T].all() and problem.usable[c:d, mine % T].all():
                row[a:b], row[c:d] = theirs, mine
                return row
    for _ in range(20):
        length = int(rng.integers(2, min(8, n) + 1)) if n > 1 else 1
        a = int(rng.integers(0, n - length + 1))
        types = np.flatnonzero(problem.usable[a : a + length].all(axis=0))
        types = types[types != row[a] % problem.n_types]
        if types.size:
            row[a : a + length] = rng.choice(types)
            return row
    return row


def polish_starts(problem: Problem, evaluate: Evaluator, reference: Reference, count: int) -> list[np.ndarray]:
    """The best-rewarded schedule of each of the ``count`` best stage-type sequences scored so far,
    then the heuristic schedules whose sequences are not among them.

    A local search cannot turn a cpu|a100|cpu plan into a cpu|v100|cpu one when
    every step in between is worse; starting one search per sequence can.
    """
    keys, scored = evaluate.history()
    chosen: list[np.ndarray] = []
    seen: set[tuple[int, ...]] = set()
    for i in np.argsort(-rewards(problem, scored, reference), kind="stable"):
        if len(chosen) == count:
            break
        row = evaluate.schedule(keys[i])
        if signature(row) not in seen:
            seen.add(signature(row))
            chosen.append(row)
    for row in heuristic_schedules(problem):
        if signature(row) not in seen:
            seen.add(signature(row))
            chosen.append(row.copy())
    return chosen


PRICE_REPAIR_SEARCHES = 12  # price_repair: at most this many searches, each with the overused types' prices doubled
RELAXED_LIMITS = 4  # price_repair searches with every type's limit this many times larger


def price_repair(
    problem: Problem,
    start: np.ndarray,
    check: Callable[[np.ndarray], bool],
    evaluate: Evaluator,
    out_of_time: Callable[[], bool] = lambda: False,
) -> None:
    """Look for a plan within the limits from ``start`` by penalty, not by the shortfall (objective cost).

    Maximising the shortfall's reachable throughput stalls where limits bind
    hard: on ``chain64x4-tight`` every descent ended 4% short of the target with
    one CPU stage on 465 of the 480 cores, while the cheap plans that meet it
    spread the cores over ten stages. So: descend on the cost with every limit
    :data:`RELAXED_LIMITS` times larger, where the target is easy to meet; if
    the plan uses more of a type than the real limit, double that type's price
    and descend again from it, up to :data:`PRICE_REPAIR_SEARCHES` times. ``check(row)``
    takes each round's plan to the real problem (:func:`polish` descends from
    it by the shortfall, which closes a small overuse) and says whether it
    found what the repair is for (a feasible plan, or one better than the best
    so far), which ends the repair; the relaxed scorings are added to
    ``evaluate``'s count.
    """
    prices, row = problem.prices.astype(float), np.asarray(start, dtype=np.int64)
    floor = 0.1 * max(float(prices.max()), 1e-9)  # a free type gets a price once it is overused
    for _ in range(PRICE_REPAIR_SEARCHES):
        if out_of_time():
            return
        relaxed = problem.replace(prices=prices, limits=problem.limits * RELAXED_LIMITS)
        scored = Evaluator(relaxed)
        reference = Reference.of(scored(np.concatenate([row[None], heuristic_schedules(relaxed)])))

        def score(rows: np.ndarray, relaxed=relaxed, scored=scored, reference=reference) -> np.ndarray:
            return rewards(relaxed, scored(rows), reference)

        row, _ = improve(relaxed, row, score, out_of_time=out_of_time)
        evaluate.evaluations += scored.evaluations
        if check(row):
            return
        over = scored(row[None]).used[0] > problem.limits
        if not over.any():
            return  # within the limits and still infeasible: the penalty cannot help
        prices = np.where(over, np.maximum(2 * prices, floor), prices)


def search_budget(n_layers: int, share: int = 1) -> int:
    """How many schedules of ``n_layers`` layers a local search may score: :data:`SEARCH_CELLS`
    (schedules x layers), or ``1 / share`` of it for one of ``share`` searches that split it."""
    return SEARCH_CELLS // share // n_layers


def budget_note(problem: Problem) -> str:
    """What a plan's notes say when :func:`polish` stopped at :data:`SEARCH_CELLS`."""
    return (
        f"the local search stopped at its budget, {search_budget(problem.n_layers):,} schedules scored "
        f"on {problem.n_layers:,} layers ({SEARCH_CELLS:,} schedules x layers)"
    )


def polish(
    problem: Problem,
    evaluate: Evaluator,
    best: Best,
    reference: Reference,
    rng: np.random.Generator,
    *,
    starts: list[np.ndarray],
    kicks: int = 0,
    extra_kicks: int = 0,
    windows: bool = False,
    repair_again: bool = False,
    out_of_time: Callable[[], bool] = lambda: False,
    progress: Progress | None = None,
    name: str = "local search",
    cutter: RunCutter | None = None,
) -> bool:
    """Local search from each of ``starts``, then iterated local search; improves ``best`` in place.
    True when it stopped at its budget, :data:`SEARCH_CELLS` (``out_of_time()`` stops it too).

    Each descent climbs the hard reward, then the soft one (which may cross
    mildly infeasible plans), then the hard one again from the best plan. The
    kicks perturb the best plan (while none is feasible, the least infeasible
    schedule) and descend again: ``kicks`` of them once a plan is feasible. With
    ``extra_kicks`` (a search that starts with no feasible plan), up to
    ``kicks + extra_kicks`` in all, stopping once ``kicks`` in a row bring no
    improvement: such a search keeps looking, and keeps improving a plan it
    found late, while one that started feasible stops as soon as usual.
    With ``repair_again``, when the kicks' best plan uses all of some type (objective cost), the price
    repair runs once more from it. With ``windows``, :func:`window_search` from the best plan comes last
    (greedy, the quick first answer, leaves both out: from its plans a 64-layer, 4-type model took 12 s
    of window sweeps instead of 2 s). With a ``cutter`` (rl's and tapp's), every schedule is scored as
    the better of itself and its runs cut exactly (:func:`~.cuts.cut_scored`).
    """
    search = _Polish(problem, evaluate, best, reference, out_of_time, progress or quiet, name, cutter)
    for begin in starts:
        if search.stop() and best.schedule is not None:
            break
        search.descend(begin)
    cost = problem.objective is Objective.COST
    # The repair also runs when the best plan uses all of some type: on chain64x4-tight the policy's
    # feasible samples (17-26% off) led the descents to plans 5.6-9.8% off, the repair to 3.0-6.4%.
    if cost and (best.schedule is None or search.binding()) and not search.stop():
        search.repair(polish_starts(problem, evaluate, reference, 1)[0])
    search.kicks(rng, kicks, extra_kicks)
    # Once more from the kicks' best plan: on chain64x4-tight seed 0 the kicks ended 6.07% off with v100
    # and t4 all in use, and three places to change at once; the repair from there went to 3.73%.
    if repair_again and cost and best.schedule is not None and search.binding() and not search.stop():
        search.repair(best.schedule)
    if windows and best.schedule is not None and not search.stop():
        search.report(f"{name}: re-planning windows of {WINDOW} layers")
        window_search(problem, best.schedule, search.scorer(soft=False), out_of_time=search.stop)
    return search.spent()


class _Polish:
    """:func:`polish`'s state and phases: descents, the price repair and the kicks, within one budget."""

    def __init__(self, problem, evaluate, best, reference, out_of_time, report, name, cutter=None):
        self.problem, self.evaluate, self.best, self.reference = problem, evaluate, best, reference
        self.out_of_time, self.report, self.name = out_of_time, report, name
        self.cutter: RunCutter | None = cutter  # each schedule also scored by its runs cut exactly (cuts.py)
        # While no plan is feasible, the kicks start from the best-rewarded schedule scored so far;
        # it is kept up to date here rather than found again in the whole cache for every kick.
        self.least_bad: list = []  # [reward, schedule] once the kicks need it
        self.scored_before = evaluate.evaluations
        self.budget = search_budget(problem.n_layers)

    def spent(self) -> bool:
        return self.evaluate.evaluations - self.scored_before > self.budget

    def stop(self) -> bool:
        return self.out_of_time() or self.spent()

    def scorer(self, soft: bool) -> Callable[[np.ndarray], np.ndarray]:
        problem, best, reference, least_bad = self.problem, self.best, self.reference, self.least_bad

        def score(rows: np.ndarray) -> np.ndarray:
            kept, scored = cut_scored(self.evaluate, self.cutter, rows, best, reference)
            best.offer(problem, kept, scored)
            self.report(
                f"{self.name}: local search · {self.evaluate.evaluations - self.scored_before:,} schedules scored "
                f"(at most {self.budget:,}) · best {best.shown}"
            )
            if least_bad and best.schedule is None:
                hard = rewards(problem, scored, reference)
                i = int(hard.argmax())
                if hard[i] > least_bad[0]:
                    least_bad[:] = [float(hard[i]), rows[i].copy()]
            return rewards(problem, scored, reference, soft=soft)

        return score

    def descend(self, begin: np.ndarray) -> None:
        """The hard reward, then the soft one (which may cross mildly infeasible plans), then the hard one
        again from the best plan."""
        found, _ = improve(self.problem, begin, self.scorer(soft=False), out_of_time=self.stop)
        improve(self.problem, found, self.scorer(soft=True), out_of_time=self.stop)
        if self.best.schedule is not None:
            improve(self.problem, self.best.schedule, self.scorer(soft=False), out_of_time=self.stop)

    def binding(self) -> bool:
        """Does the best plan use all of some type?"""
        best = self.best
        return best.schedule is not None and bool(
            (self.evaluate(best.schedule[None]).used[0] >= self.problem.limits).any()
        )

    def repair(self, start: np.ndarray) -> None:
        self.report(f"{self.name}: searching with the limits loosened and overused types dearer")
        before = self.best.key

        def check(row: np.ndarray) -> bool:
            improve(self.problem, row, self.scorer(soft=False), out_of_time=self.stop)  # the last few units
            return self.best.key < before  # a (better) feasible plan

        price_repair(self.problem, start, check, self.evaluate, self.stop)

    def kicks(self, rng: np.random.Generator, kicks: int, extra_kicks: int) -> None:
        """Perturb the best plan (or the least infeasible schedule) and descend again. Measured on the
        tight instances: a plan first found late in the kicks was 5-10% off, and more kicks while they
        still improve it brought it to the optimum on some seeds."""
        problem, best = self.problem, self.best
        if best.schedule is None:
            row = polish_starts(problem, self.evaluate, self.reference, 1)[0]
            self.least_bad[:] = [float(rewards(problem, self.evaluate(row[None]), self.reference)[0]), row]
        unimproved = 0
        for _ in range(kicks + extra_kicks):
            if self.stop() or unimproved >= kicks:
                break
            anchor = best.schedule if best.schedule is not None else self.least_bad[1]
            before = best.key
            self.descend(kick(problem, anchor, rng))
            if best.schedule is not None:
                unimproved = 0 if extra_kicks and best.key < before else unimproved + 1
