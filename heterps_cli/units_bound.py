"""The units a throughput needs, proven without a search (docs/exact.md section 5, "the units needed"): where
every plan at one micro-batch reaching a throughput holds more units than the cluster has, weighed per type,
no plan there reaches it. The bound counts what every plan pays, mixed stages (docs/spec.md section 1i) and
whole nodes (section 1e) included: each replica trains at least one sample of each micro-batch at its
type's and degree's pace, waits ``M + S - 1`` slots in a pipeline of ``S`` stages, pays its stage's
optimiser step and, beside other replicas, the gradients' all-reduce among as many replicas as its stage
needs, and holds its training state, its weight copies and its share of the activations in flight within its
unit's memory."""

from __future__ import annotations

import itertools
import weakref
from dataclasses import dataclass

import numpy as np

from heterps_cli.formulas import pipeline_slots
from heterps_cli.problem import Problem

# A relaxation of every type's limit: its units weighed by these factors (a ratio to the others'), each
# tried for every type; the first, all types alike, is the plain count of units.
WEIGHTS = (1.0, *np.geomspace(1 / 16, 16, 17))
# The units bound runs where the model has at most this many layers: its work is n². A question took 2.6 s
# on 2,000 layers (1.6 s before it counted the pipeline's terms), and a 20 s --time-limit there ended at 25-29 s
# with the pruning and the certificate asking it (benchmarks/bench_scale.py); 1,000 layers: a quarter.
WINDOW_LAYERS = 1024
# With three types or more, a type weighed near nothing beside each weighing of another triples the weighings
# (52 to 154 on three types), and the DP's work with them: asked on models of up to this many layers (a question
# on a 256-layer three-type chain took 4.2 s with them, 0.8 s before issue 84's counts).
LIGHT_LAYERS = 128
# Stage counts are bounded in classes [S, next): a plan of S' >= S stages waits at least S's slots and holds
# at least S's micro-batches in flight at each place. Each class is one DP over exactly that many stages;
# above these counts one class holds every plan of that many stages or more.
EXACT_STAGES = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64)
STAGE_CELLS = 4_000_000  # the DPs' work (layers² x stage counts) up to which classes past one are asked
EVERY_COUNT: tuple[int, int | None] = (1, None)  # the class of every plan: one stage or more
# Rounds of the fixed point of a stage's least replicas (_spread): each a pass over its kinds; GPT-Neo's stages
# settle in two to four.
RING_ROUNDS = 12
# Sets of kinds a stage may hold (one degree of each type: 3 degrees on 3 types make 27, and 9 that recompute)
# asked one by one up to this many; past it, every kind at once, a floor on each set's.
MOST_SETS = 64
# The weighings per class of stage counts that came closest to ruling a throughput out with every kind at once,
# asked again with one degree of each type a stage (several times the work a weighing).
CLOSEST = 2


@dataclass(frozen=True)
class Shortfall:
    """Units weighed by ``weights`` (one per type): every plan reaching the throughput with ``stages``
    stages (the class of stage counts that came closest to fitting) needs at least ``need`` of them, the
    cluster has ``have``."""

    weights: np.ndarray
    need: float
    have: float
    stages: tuple[int, int | None] = EVERY_COUNT  # the class [lo, hi) of stage counts (hi None: lo or more)

    @property
    def stage_words(self) -> str:
        """The class's stage counts in words."""
        lo, hi = self.stages
        if self.stages == EVERY_COUNT:
            return "any number of"
        return f"{lo} or more" if hi is None else f"{lo}" if hi == lo + 1 else f"{lo} to {hi - 1}"


def units_short(problem: Problem, throughput: float, by_stages: bool = True, by_sets: bool = True) -> Shortfall | None:
    """Why no plan at the problem's micro-batch ``B`` reaches ``throughput`` ``X`` within its units (None
    where this bound cannot tell; pipelined problems of up to :data:`WINDOW_LAYERS` layers). ``X = 0``: why
    no plan fits at all (its stages' memory within the units, whatever their time).

    A plan of ``S`` stages reaching ``X`` has every stage's step within ``G / X`` (``G = M B``): each
    replica's time a micro-batch times ``M + S - 1``, plus its stage's optimiser step ``U`` and, where the
    stage has ``K >= 2`` replicas, ``2 Y (1 - 1/K)`` of all-reduce (at least its own part's, section 1i: the
    ring runs at its slowest). So a replica of a stage trains at most the ``m(K)`` samples it can in that
    time and holds in its memory, ``m >= 1``, and a stage ``a..b`` whose replicas train the ``B`` samples
    holds at least the replicas and weighed units :func:`_spread` counts (or one replica's ``w d``, where
    one alone trains them all within its time without the all-reduce). The fewest weighed units over every
    cut into ``S`` stages is a shortest path over the layer boundaries; where it exceeds the weighed units
    the cluster has, for some weights, at every stage count, no plan reaches ``X``. ``by_stages=False``: one
    DP at one stage's slots alone (about a tenth of the time where it does not rule ``X`` out; a search's
    pruning asks it).
    ``by_sets=False``: a stage's replicas of any kinds, not one degree of each type (a third of the time)."""
    if not _asks(problem, throughput):
        return None
    found = _passes(problem, throughput, by_stages, by_sets)
    return found if isinstance(found, Shortfall) else None


def counts_left(problem: Problem, throughput: float) -> list[tuple[int, int | None]] | None:
    """The classes of stage counts (``[lo, hi)``, ``hi`` None: ``lo`` or more) in which a plan may reach
    ``throughput`` by :func:`units_short`'s bound (``0``: may fit at all), ``[]`` where it rules out every
    one; None where the bound cannot tell (every count may). Its cheaper form, for a search to prune by: every
    kind at once, without the three-type weighings (a third of the full form's time or less)."""
    if not _asks(problem, throughput):
        return None
    found = _passes(problem, throughput, True, False, light=False)
    return [] if isinstance(found, Shortfall) else found


def may_have(classes: list[tuple[int, int | None]] | None, stages: int) -> bool:
    """Whether :func:`counts_left`'s ``classes`` hold plans of ``stages`` stages."""
    return classes is None or any(lo <= stages and (hi is None or stages < hi) for lo, hi in classes)


def _asks(problem: Problem, throughput: float) -> bool:
    n = problem.n_layers
    return problem.pipelined and 0 < n <= WINDOW_LAYERS and throughput >= 0


def _passes(problem: Problem, X: float, by_stages: bool, by_sets: bool, light: bool = True) -> Shortfall | list:
    """:func:`_left` over every plan at one stage's slots first (one DP: every plan has one stage or more, and
    it rules out at once what it can), then, ``by_stages``, over the classes of stage counts."""
    found = _left(problem, X, [EVERY_COUNT], by_sets, light)
    if not isinstance(found, Shortfall) and by_stages and (classes := _classes(problem)) != [EVERY_COUNT]:
        found = _left(problem, X, classes, by_sets, light)
    return found


def _left(problem: Problem, X: float, classes: list, by_sets: bool, light: bool = True) -> Shortfall | list:
    """The :class:`Shortfall` where every class is ruled out, else the classes left: every kind at once at every
    weighing first; then, for the classes left, one degree of each type a stage at their closest weighings.
    ``light``: the three-type weighings too (:data:`LIGHT_LAYERS`)."""
    kinds = _kinds(problem)
    weights = _weight_rows(problem.n_types, light=light and problem.n_layers <= LIGHT_LAYERS)
    found = _ruled_out(problem, kinds, weights, X, classes, (np.arange(len(kinds.type)),))
    if isinstance(found, Shortfall):
        return found
    left = [classes[c] for c in np.flatnonzero(~found[0])]
    if not (by_sets and several_sets(problem)):
        return left
    closest = np.unique(found[1][~found[0]][:, :CLOSEST])
    again = _ruled_out(problem, kinds, weights[closest], X, left, kinds.sets)
    return again if isinstance(again, Shortfall) else [left[c] for c in np.flatnonzero(~again[0])]


def _ruled_out(
    problem: Problem, kinds: _Kinds, weights: np.ndarray, X: float, classes: list, sets
) -> Shortfall | tuple[np.ndarray, np.ndarray]:
    """The :class:`Shortfall` where every class of stage counts needs more weighed units than the cluster has,
    for some weighing; else which classes some weighing rules out, and each class's weighings, closest first."""
    have = weights @ problem.limits.astype(float)
    fewest = _fewest(problem, kinds, weights, X, classes, sets)  # [C, W]
    excess = (fewest - have[None]) / weights.sum(axis=1)[None]
    rows = np.argmax(excess, axis=1)
    ruled = fewest[np.arange(len(classes)), rows] > have[rows] * (1 + 1e-9)
    if ruled.all():
        c = int(np.argmin(excess[np.arange(len(classes)), rows]))  # the class closest to fitting
        return Shortfall(weights[rows[c]], float(fewest[c, rows[c]]), float(have[rows[c]]), classes[c])
    return ruled, np.argsort(-excess, axis=1)


def several_sets(problem: Problem) -> bool:
    """Whether ``by_sets`` tells :func:`units_short` more: a stage may hold several sets of kinds."""
    return len(_kinds(problem).sets) > 1


def layer_pace(problem: Problem) -> np.ndarray:
    """``[n]``: each layer's least time per micro-batch on a replica training one sample, any type and
    degree (inf where none runs it)."""
    pace = np.full(problem.n_layers, np.inf)
    for view in problem.views:
        serial, parallel, _, _ = view.parts
        pace = np.minimum(pace, np.where(view.runnable, serial + parallel / problem.batch_size, np.inf).min(axis=1))
    return pace


def _classes(problem: Problem) -> list[tuple[int, int | None]]:
    """The stage-count classes ``[lo, hi)`` (``hi`` None: every count from ``lo``) that cover every plan."""
    n = problem.n_layers
    most = int(min(n, problem.limits.sum()))
    counts = [s for s in EXACT_STAGES if s <= most]
    while len(counts) > 1 and n * n * sum(counts) > STAGE_CELLS:
        counts.pop()
    return [(lo, hi) for lo, hi in zip(counts, counts[1:])] + [(counts[-1], None)]


@dataclass(frozen=True)
class _States:
    """The DP's states, every class's at once. The DP cuts from the pipeline's end, so class ``c`` counts the
    stages after the one it adds, ``j = 0..top`` (``top``: the class's last count, or "``lo`` or more" where
    it has no end), each stage charged ``lo``'s slots and exactly the micro-batches in flight its place holds,
    ``min(j + 1, M)`` (1F1B: the ``k``-th of ``S`` stages holds ``S - k``; at least that past ``top``)."""

    cls: np.ndarray  # [S] the class
    held: np.ndarray  # [S] micro-batches in flight of the stage added from this state
    step: np.ndarray  # [S] the state a stage more leads to (-1: past the class's counts)
    final: np.ndarray  # [S] a state whose plans the class holds (its count at least lo)

    @classmethod
    def of(cls, classes: list[tuple[int, int | None]], M: int) -> _States:
        rows: dict[str, list] = {"cls": [], "held": [], "step": [], "final": []}
        for c, (lo, hi) in enumerate(classes):
            top, first = (lo if hi is None else hi - 1), len(rows["cls"])
            for j in range(top + 1):
                rows["cls"].append(c)
                rows["held"].append(min(j + 1, M))
                rows["step"].append(first + j + 1 if j < top else (first + j if hi is None else -1))
                rows["final"].append(j >= lo)
        return cls(*(np.array(rows[f]) for f in ("cls", "held", "step", "final")))


def _fewest(problem: Problem, kinds: _Kinds, weights: np.ndarray, X: float, classes: list, sets) -> np.ndarray:
    """``[C, W]``: per class of stage counts, the fewest weighed units of a cut into as many stages, each
    stage's kinds one of ``sets``."""
    n, B, M = problem.n_layers, problem.batch_size, problem.micro_batches
    states = _States.of(classes, M)
    slots = np.array([pipeline_slots(M, lo) for lo, _ in classes], dtype=float)[:, None, None]
    step = problem.step_samples / X if X > 0 else np.inf  # X = 0: memory alone
    scaled = weights[:, kinds.type] * kinds.degree[None, :]  # [W, K]: a replica's weighed units
    pairs, which = np.unique(np.stack([states.cls, states.held], axis=1), axis=0, return_inverse=True)
    helds, held_of = np.unique(pairs[:, 1], return_inverse=True)
    moves = states.step >= 0
    fewest = np.full((len(weights), len(states.cls), n + 1), np.inf)
    fewest[:, [np.flatnonzero(states.cls == c)[0] for c in range(len(classes))], n] = 0.0
    budget = step / float(slots.min())  # a micro-batch's time at the fewest slots, before U and Y
    for b in range(n, 0, -1):  # from the pipeline's end: each stage a..b-1 before the cuts after it
        going = moves & np.isfinite(fewest[:, :, b]).any(axis=0)  # [S] states some cut reaches at b, to move on
        if not going.any():  # none, or every one reached here has its class's most stages
            continue
        # a stage a..b whose one-sample pace passes the most time a micro-batch may take fits no replica
        first = int(np.searchsorted(kinds.reach, kinds.reach[b] - budget * (1 + 1e-6), side="left"))
        a = np.arange(first, b)
        if not a.size:
            continue
        b1 = np.full(a.size, b)
        overhead = kinds.update[:, b1] - kinds.update[:, a]
        ring = kinds.sync[:, b1] - kinds.sync[:, a] + kinds.latency[:, None]
        alone = kinds.most_samples(problem, a, b1, (step - overhead)[None] / slots) >= B
        asked = np.unique(which[going])  # the (class, in flight) pairs of the states that move
        where = np.zeros(len(pairs), dtype=int)
        where[asked] = np.arange(len(asked))
        fits = kinds.fitting(problem, a, b1, helds)[held_of[asked]]  # [P, K, nb]
        budgets = (step - overhead)[None] / slots[pairs[asked, 0]]  # [P, K, nb] before the all-reduce
        spread = _spread(problem, kinds, a, b1, (budgets, ring / slots[pairs[asked, 0]], fits), weights, sets)
        alone_fits = alone[pairs[asked, 0]] & (fits >= B)
        if (cols := np.flatnonzero(alone_fits.any(axis=(0, 1)))).size:  # one replica may train a micro-batch
            one = np.where(alone_fits[None][..., cols], scaled[:, None, :, None], np.inf).min(axis=2)
            spread[:, :, cols] = np.minimum(spread[:, :, cols], one)
        units = spread[:, where[which]]  # [W, S, nb], valid where the state moves
        reached = fewest[:, :, b, None] + units  # a stage more before each state
        into = states.step[going]
        once = into != np.flatnonzero(going)  # into another state; else a class's "lo or more" stays
        for sel in (once, ~once):  # each target once per assignment
            src, dst = np.flatnonzero(going)[sel], into[sel]
            span = slice(int(a[0]), int(a[-1]) + 1)
            fewest[:, dst, span] = np.minimum(fewest[:, dst, span], reached[:, src])
    final = np.where(states.final[None, :], fewest[:, :, 0], np.inf)  # [W, S]
    return np.stack([final[:, states.cls == c].min(axis=1) for c in range(len(classes))])


def _spread(problem: Problem, kinds: _Kinds, a: np.ndarray, b1: np.ndarray, within, weights, sets) -> np.ndarray:
    """``[W, P, nb]``: the fewest weighed units of a stage ``a..b`` of two replicas or more, each within
    ``budget - 2 (1 - 1/K) ring`` a micro-batch (``[P, K, nb]``, ``K`` the stage's replicas) and ``fits``
    (``within``: the three), its kinds one of ``sets``.

    ``K`` replicas of kind ``k`` training at most ``m_k(K)`` samples each train the ``B`` only where
    ``K m_k(K) >= B``; ``m`` shrinks as ``K`` grows, so the least such ``K`` is ``K_k``, the least fixed
    point of ``K = ceil(B / m_k(K))`` from 2 up (none past ``B``: each replica trains a sample). A stage
    holds each type at one degree (section 1i: each type is one part), a set ``C`` of kinds, so it holds at
    least ``K_C = min_{k in C} K_k`` replicas, each weighing at least the lightest of ``C`` that trains a
    sample at ``K_C``, and its ``B`` samples at the least weight a sample there. Stopped short, the counts
    reached are still floors."""
    B = problem.batch_size
    budget, ring, fits = within
    K = np.full(fits.shape, 2.0)  # [P, K, nb]: each kind's count so far
    for _ in range(RING_ROUNDS):
        m = np.minimum(kinds.most_samples(problem, a, b1, budget - 2 * (1 - 1 / K) * ring), fits)
        with np.errstate(divide="ignore"):
            least = np.maximum(K, np.ceil(B / m * (1 - 1e-12)))  # inf where it trains no sample
        grown = np.where(least <= B, least, K)
        if np.array_equal(grown, K):
            break
        K = grown
    count = np.where(least <= B, K, np.inf)
    # a set's count is one of its kinds' own: with several sets, every kind's samples at each kind's count at once
    at = _at_counts(problem, kinds, a, b1, within, count) if len(sets) > 1 else None
    fewest = np.full((len(weights), *fits.shape[::2]), np.inf)
    for kept in sets:
        own = count[:, kept]  # [P, C, nb]
        least_count = own.min(axis=1)
        if at is None:
            m = _at_counts(problem, kinds, a, b1, within, least_count[:, None])[0][:, kept]
        else:  # the samples at the count of the kind whose count is the set's
            j = kept[np.argmin(own, axis=1)]  # [P, nb]
            m = np.take_along_axis(at[:, :, kept], j[None, :, None, :], axis=0)[0]  # [P, C, nb]
        # a kind's weight is its type's times its degree: the least over a type's kinds first, then over types
        d = kinds.degree[kept][None, :, None]
        per, lightest = (np.full((m.shape[0], weights.shape[1], m.shape[2]), np.inf) for _ in range(2))  # [P, T, nb]
        for t in np.unique(kinds.type[kept]):
            of = kinds.type[kept] == t
            trains = m[:, of] > 0
            per[:, t] = np.where(trains, d[:, of] / np.maximum(m[:, of], 1), np.inf).min(axis=1)
            lightest[:, t] = np.where(trains, d[:, of], np.inf).min(axis=1)
        samples = B * _weighed(weights, per).min(axis=2)  # [W, P, nb]
        with np.errstate(invalid="ignore"):  # 0 x inf where no set trains a sample, masked below
            replicas = _weighed(weights, lightest).min(axis=2) * least_count[None]
        fewest = np.minimum(fewest, np.where(np.isfinite(least_count)[None], np.maximum(samples, replicas), np.inf))
    return fewest


def _weighed(weights: np.ndarray, per: np.ndarray) -> np.ndarray:
    """``[W, P, T, nb]``: each type's ``per`` (``[P, T, nb]``, inf where it trains none) by its weight, still inf
    there where the weight is 0 (a type free to take, not one that trains a sample at no cost)."""
    with np.errstate(invalid="ignore"):  # 0 x inf, masked
        return np.where(np.isfinite(per)[None], weights[:, None, :, None] * per[None], np.inf)


def _at_counts(problem: Problem, kinds: _Kinds, a: np.ndarray, b1: np.ndarray, within, counts) -> np.ndarray:
    """``[J, P, K, nb]``: every kind's samples (:func:`_spread`'s ``m``) in a stage of each ``counts[:, j]``
    replicas (``[P, J, nb]``; inf: none)."""
    budget, ring, fits = within
    counted = np.moveaxis(np.where(np.isfinite(counts), counts, 2.0), 1, 0)[:, :, None, :]  # [J, P, 1, nb]
    return np.minimum(kinds.most_samples(problem, a, b1, budget[None] - 2 * (1 - 1 / counted) * ring[None]), fits)


def _weight_rows(T: int, light: bool = True) -> np.ndarray:
    """``[W, T]``: every type's units alike, then each type's weighed by each of :data:`WEIGHTS`, and each at 0
    (any number of its units: where the others' are too few even then, no plan fits, which a weighing of 1/16
    misses once that type's units weigh as much as the shortfall); with three types or more and ``light``,
    also each type weighed at the lightest while each other one is weighed by each factor (the best weights
    may price a type few plans can use near nothing and the others apart)."""
    rows = [np.ones(T)]
    for t in range(T if T > 1 else 0):
        rows.append(np.where(np.arange(T) == t, 0.0, 1.0))
        for w in WEIGHTS[1:]:
            row = np.ones(T)
            row[t] = w
            rows.append(row)
    for cheap in range(T if T > 2 and light else 0):
        for t in [u for u in range(T) if u != cheap]:
            for w in WEIGHTS[1:]:
                row = np.ones(T)
                row[cheap], row[t] = WEIGHTS[1], w
                rows.append(row)
    return np.array(rows)


@dataclass(frozen=True)
class _Kinds:
    """Every (type, degree) a replica may be, ``K`` of them: prefix sums of each's per-layer terms."""

    type: np.ndarray  # [K]
    degree: np.ndarray  # [K]
    serial: np.ndarray  # [K, n + 1] sums of oct (1 - alpha) over layers 0..i-1
    parallel: np.ndarray  # [K, n + 1] of oct alpha
    unrunnable: np.ndarray  # [K, n + 1] layers 0..i-1 it cannot run
    cap: np.ndarray  # [K, n] the most samples a replica may train of each layer (section 1f)
    start: np.ndarray  # [K] pass start
    message: np.ndarray  # [K] latency a message across a boundary
    rate: np.ndarray  # [K] seconds a byte across a boundary
    sync: np.ndarray  # [K, n + 1] sums of odt: the all-reduce between two replicas
    update: np.ndarray  # [K, n + 1] sums of the optimiser step
    latency: np.ndarray  # [K] all-reduce latency
    memory: np.ndarray  # [K] a unit's bytes
    fixed: np.ndarray  # [K, n + 1] sums of the training state every replica holds, whatever its share
    casts: np.ndarray  # [K, n + 1] sums of the weight copies held per micro-batch in flight
    held: np.ndarray  # [K, n + 1] sums of a batch's activations (each layer's own, less what it shares)
    entry: np.ndarray  # [K, n + 1] what a stage's first layer holds of its input besides (section 1b)
    inputs: np.ndarray  # [K, n + 1] a batch's input bytes of a stage starting at each layer (section 1g)
    again: np.ndarray  # [K] it recomputes (section 1g): its passes hold the forward twice, it holds fewer bytes
    reach: np.ndarray  # [n + 1] sums of :func:`layer_pace`: no replica of any kind is faster on layers 0..i-1
    sets: tuple[np.ndarray, ...]  # the kinds a stage may hold: one of each type (all at once past MOST_SETS)

    def most_samples(self, problem: Problem, a: np.ndarray, b1: np.ndarray, tau) -> np.ndarray:
        """``[K, nb]``: the most samples a replica of each kind trains of each stage on layers ``a..b1-1``
        (``[nb]`` each) within ``tau`` a micro-batch (a scalar, or ``[K, nb]``; 0 where it cannot run them, or not one
        sample in time)."""
        B = problem.batch_size
        messages, bytes_ = problem.boundary_messages, problem.boundary_bytes
        fixed = self.serial[:, b1] - self.serial[:, a] + self.start[:, None]
        fixed = fixed + self.message[:, None] * (messages[a] + messages[b1])[None, :]
        per = self.parallel[:, b1] - self.parallel[:, a] + self.rate[:, None] * (bytes_[a] + bytes_[b1])[None, :]
        room = tau * (1 + 1e-9) - fixed
        with np.errstate(divide="ignore", invalid="ignore"):
            m = np.where(per > 0, np.floor(room * B / per * (1 + 1e-9) + 1e-9), np.where(room >= 0, B, 0))
        m = np.minimum(np.minimum(m, B), self._least_cap(a, b1))
        runs = self.unrunnable[:, b1] == self.unrunnable[:, a]
        return np.where(runs & (room >= 0), np.maximum(m, 0), 0)

    def _least_cap(self, a: np.ndarray, b1: np.ndarray) -> np.ndarray:
        """``[K, nb]``: the least of :attr:`cap` over each stage's layers ``a..b1-1``, the stages all of one
        end (the DP cuts from the pipeline's end)."""
        end = int(b1[0])
        return np.minimum.accumulate(self.cap[:, :end][:, ::-1], axis=1)[:, end - 1 - a]

    def fitting(self, problem: Problem, a: np.ndarray, b1: np.ndarray, in_flight: np.ndarray) -> np.ndarray:
        """``[H, K, nb]``: at each count ``in_flight[h]`` of micro-batches in flight, the most samples of each
        micro-batch whose activations a replica of each kind holds, beside its training state and weight
        copies (sections 1b, 1d; the state sharded over a stage's replicas counted as none; a kind that
        recomputes, section 1g, holds the inputs of every micro-batch in flight, one micro-batch's activations
        and one set of copies). ``B`` where memory is not limited."""
        B = problem.batch_size
        state = self.fixed[:, b1] - self.fixed[:, a]
        casts = self.casts[:, b1] - self.casts[:, a]
        held = self.held[:, b1] - self.held[:, a] + self.entry[:, a]
        h = np.asarray(in_flight, dtype=float)[:, None, None]
        with np.errstate(over="ignore", invalid="ignore"):
            again = self.again[:, None]
            per = np.where(again, h * self.inputs[:, a][None] + held, h * held)
            fixed = np.where(again, state + casts, state + h * casts)
            room = (self.memory[:, None] - fixed * (1 - 1e-9)) * B
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            m = np.where(per > 0, np.floor(room / (per * (1 - 1e-9))), np.where(room >= 0, B, 0))
        return np.where(np.isfinite(self.memory)[:, None], np.clip(np.nan_to_num(m, posinf=B), 0, B), B)


def _prefix(per_layer: np.ndarray) -> np.ndarray:
    return np.concatenate([[0.0], np.cumsum(per_layer)])


# The kinds by problem: a certificate's bisection asks one micro-batch's problem a dozen times.
_KINDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _kinds(problem: Problem) -> _Kinds:
    if (kept := _KINDS.get(problem)) is None:
        kept = _KINDS[problem] = _kinds_of(problem)
    return kept


def _kinds_of(problem: Problem) -> _Kinds:
    start, latency, message = problem.fixed_costs
    rows: dict[str, list] = {f: [] for f in _Kinds.__dataclass_fields__ if f not in ("reach", "sets")}
    for view, again in [(v, again) for v in problem.views for again in (False, True)[: 1 + problem.can_recompute]]:
        serial, parallel = view.recompute_parts if again else view.parts[:2]
        cap = view.share_cap if view.share_cap is not None else np.full(serial.shape, np.inf)
        state, _ = view.state_parts
        for t in range(problem.n_types):
            runs = view.runnable[:, t]
            rows["type"].append(t)
            rows["again"].append(again)
            rows["degree"].append(view.degree)
            rows["serial"].append(_prefix(np.where(runs, serial[:, t], 0.0)))
            rows["parallel"].append(_prefix(np.where(runs, parallel[:, t], 0.0)))
            rows["unrunnable"].append(_prefix(~runs))
            rows["cap"].append(cap[:, t])
            rows["start"].append(float(start[t]))
            rows["message"].append(float(message[t]))
            rows["rate"].append(float(view.boundary_rate[t]))
            rows["sync"].append(_prefix(np.where(runs, view.odt[:, t], 0.0)))
            rows["update"].append(_prefix(np.where(runs, view.update_times[:, t], 0.0)))
            rows["latency"].append(float(latency[t]))
            rows["memory"].append(float(problem.memory[t] - problem.reserved_bytes[t]))
            rows["fixed"].append(_prefix(state))
            rows["casts"].append(_prefix(view.cast_bytes))
            rows["held"].append(_prefix(view.held_once))
            rows["entry"].append(view.shared_entry)
            rows["inputs"].append(np.append(view.stage_inputs, 0.0))
    found = {name: np.array(values) for name, values in rows.items()}
    return _Kinds(**found, reach=_prefix(layer_pace(problem)), sets=_sets(found["type"], found["again"]))


def _sets(types: np.ndarray, again: np.ndarray) -> tuple[np.ndarray, ...]:
    """The sets of kinds (by index) a stage may hold: one kind that recomputes (a stage that recomputes is
    of one type, section 1i's parts never do), or one of each type of those that do not (fewer types only
    take replicas to choose from away, so only whole sets are asked); every kind at once past
    :data:`MOST_SETS`."""
    by_type = [np.flatnonzero((types == t) & ~again) for t in np.unique(types)]
    sets = [np.array(s) for s in itertools.product(*by_type)] + [np.array([k]) for k in np.flatnonzero(again)]
    return tuple(sets) if len(sets) <= MOST_SETS else (np.arange(len(types)),)
