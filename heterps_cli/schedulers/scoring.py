"""What every search-based scheduler shares: scoring schedules, ranking them, and where to start.

* :class:`Evaluator` provisions schedules exactly (:func:`~heterps_cli.costmodel.provision`),
  each distinct schedule once per run, in one vectorised call per batch, and
  counts the evaluations (so ``compare`` can give every scheduler the same budget).
* :func:`rewards` ranks scored schedules: cheaper feasible > dearer feasible >
  infeasible, graded by how far each misses its constraints.
* :class:`Best` keeps the best feasible plan seen; :func:`result` turns it into the Plan,
  or into the error that says why there is none.
* :func:`random_schedules` and :func:`heuristic_schedules` are starting points.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from heterps_cli.costmodel import Scores, better, meets_targets, provision
from heterps_cli.errors import SearchFailed
from heterps_cli.formulas import run_cost, sample_hours
from heterps_cli.objective import Objective
from heterps_cli.plan import Plan, make_plan
from heterps_cli.problem import Problem
from heterps_cli.schedulers.base import Clock, Progress, SearchOptions, SolveOptions, quiet
from heterps_cli.schedulers.names import DEFAULT_EVALUATIONS
from heterps_cli.stages import degree_label, label_parts, split_stages, stage_ids, stage_label

CAP = 4.0  # feasible rewards lie in [-CAP, 0); infeasible ones below -CAP - 1
# Under objective time, cost only breaks ties: 1% dearer weighs as much as 0.001% slower.
TIE_BREAK = 1e-3
# Evaluations genetic and random get when no rl run sets the budget: about what rl uses on a
# 32-64 layer model with default settings (``compare`` passes rl's own count instead).


CACHE_BYTES = 256 << 20  # what an Evaluator's cache may hold; never reached up to 1,000 layers (docs/large-models.md)


def _entry_bytes(key: bytes, entry: tuple) -> int:
    return len(key) + entry[3].nbytes + entry[4].nbytes + 400  # 400: the tuple, floats and dict slot


@dataclass
class Provisioned:
    """A batch of schedules provisioned (exact replicas) and scored: what training needs (replicas padded
    to one per layer). Not :class:`~heterps_cli.costmodel.Scores`, the cost model's full per-stage figures."""

    feasible: np.ndarray
    cost: np.ndarray
    throughput: np.ndarray
    used: np.ndarray
    replicas: np.ndarray
    memory_miss: np.ndarray | None = None  # section 1b: summed relative memory excess (None: no limit)


class Evaluator:
    """Exact provisioning of schedules, each distinct schedule scored once per run.

    Samples repeat more and more as the policy sharpens, so most of a late batch
    is a cache hit; ``evaluations`` counts the schedules actually scored. The cache
    keeps a schedule as one byte per layer and only its stages' replica counts: on
    10,000 layers a schedule in int64 with replicas padded to every layer took 160 KB.
    Past :data:`CACHE_BYTES` the oldest entries go (a schedule scored again then counts
    again): a greedy search on 10,000 layers kept 50,000 schedules of thousands of stages, 2.5 GB.
    """

    def __init__(self, problem: Problem):
        self.problem = problem
        self.alone = single_nodes(problem)
        self.cache: OrderedDict[bytes, tuple] = OrderedDict()
        self.bytes = 0  # what the cache holds, about
        self.evaluations = 0
        # Every label a schedule may hold (sections 1, 1g, 1h: up to 6 T D of them) must fit the key.
        most = degree_label(problem.n_types, len(problem.views))
        self._dtype = np.int8 if most <= 127 else np.int16 if most <= 32767 else np.int32

    def key(self, row: np.ndarray) -> bytes:
        """The cache's key for one schedule."""
        return np.asarray(row).astype(self._dtype).tobytes()

    def schedule(self, key: bytes) -> np.ndarray:
        """The schedule a cache key stands for."""
        return np.frombuffer(key, dtype=self._dtype).astype(np.int64)

    def history(self) -> tuple[list[bytes], Provisioned]:
        """Every schedule scored so far (its key, in the order first scored) and its scores, replicas
        left out. Not the schedules themselves: 12,000 of 10,000 layers in int64 are 1 GB."""
        keys = list(self.cache)
        if not keys:
            empty = np.zeros(0)
            return keys, Provisioned(empty.astype(bool), empty, empty, np.zeros((0, self.problem.n_types)), empty)
        feasible, cost, thr, used, _, memory_miss = zip(*self.cache.values())
        return keys, Provisioned(
            np.array(feasible),
            np.array(cost),
            np.array(thr),
            np.stack(used),
            np.zeros((len(keys), 0)),
            np.array(memory_miss),
        )

    def __call__(self, schedules: np.ndarray) -> Provisioned:
        keys = [self.key(row) for row in schedules]
        found = {k: self.cache[k] for k in keys if k in self.cache}
        new = {k: i for i, k in enumerate(keys) if k not in found}
        if new:
            rows = schedules[list(new.values())]
            stages = split_stages(self.problem, rows)
            scores = provision(self.problem, stages)
            for alone, price in self.alone:
                _take_better(self.problem, scores, _on_one_node(self.problem, alone, price, rows))
            self.evaluations += len(rows)
            count = stages.valid.sum(axis=1)
            for j, key in enumerate(new):
                found[key] = self.cache[key] = (
                    bool(scores.feasible[j]),
                    float(scores.cost[j]),
                    float(scores.throughput[j]),
                    scores.used[j].copy(),
                    scores.replicas[j, : count[j]].astype(np.int64),
                    float(scores.memory_miss[j]),
                )
                self.bytes += _entry_bytes(key, found[key])
            while self.bytes > CACHE_BYTES and len(self.cache) > 1:
                key, entry = self.cache.popitem(last=False)
                self.bytes -= _entry_bytes(key, entry)
        feasible, cost, thr, used, replicas, memory_miss = zip(*(found[k] for k in keys))
        padded = np.zeros((len(keys), max(len(r) for r in replicas)))  # per stage, 0 past a row's last
        for i, r in enumerate(replicas):
            padded[i, : len(r)] = r
        return Provisioned(
            np.array(feasible), np.array(cost), np.array(thr), np.stack(used), padded, np.array(memory_miss)
        )


def take_rows(a: Provisioned, b: Provisioned, take: np.ndarray) -> Provisioned:
    """Per schedule, ``b``'s scores where ``take``, else ``a``'s (two scorings of one batch's rows)."""
    width = max(a.replicas.shape[1], b.replicas.shape[1])
    replicas = np.zeros((len(take), width))
    replicas[:, : a.replicas.shape[1]] = a.replicas
    replicas[take] = 0.0
    replicas[take, : b.replicas.shape[1]] = b.replicas[take]
    miss = None if a.memory_miss is None or b.memory_miss is None else np.where(take, b.memory_miss, a.memory_miss)
    return Provisioned(
        np.where(take, b.feasible, a.feasible),
        np.where(take, b.cost, a.cost),
        np.where(take, b.throughput, a.throughput),
        np.where(take[:, None], b.used, a.used),
        replicas,
        miss,
    )


def single_nodes(problem: Problem) -> list[tuple[Problem, float]]:
    """Section 1e: for each node kind with links, the question one node of it asks
    (:meth:`Problem.on_rental`) and its price an hour. A plan that fits one such node runs faster
    there than over the network; the search scores each schedule on them too."""
    nodes = problem.nodes
    if nodes is None:
        return []
    one = np.eye(len(nodes.names), dtype=np.int64)
    # one node holds all its units, so it asks one question
    return [(problem.on_rental(one[k])[0], float(nodes.price[k])) for k in nodes.linked]


def _on_one_node(problem: Problem, alone: Problem, price: float, rows: np.ndarray) -> Scores:
    """Schedules provisioned on one node (its fastest replicas: the node is paid for whole), priced at
    the node's rate and checked against the job's targets."""
    scores = provision(alone, split_stages(alone, rows))
    scores.rate = np.full(len(rows), price)
    scores.cost = run_cost(problem.work, scores.throughput, scores.rate)
    scores.feasible = scores.feasible & meets_targets(problem, scores.throughput, scores.cost)
    return scores


def _take_better(problem: Problem, scores: Scores, other: Scores) -> None:
    """Per schedule, ``other``'s figures where they are feasible and better (in place)."""
    won = other.feasible & (
        ~scores.feasible | better(problem, other.cost, other.throughput, scores.cost, scores.throughput)
    )
    if not won.any():
        return
    for name in ("throughput", "used", "rate", "cost", "feasible", "memory_miss"):
        getattr(scores, name)[won] = getattr(other, name)[won]
    width = max(scores.replicas.shape[1], other.replicas.shape[1])
    replicas = np.zeros((len(won), width))
    replicas[:, : scores.replicas.shape[1]] = scores.replicas
    replicas[won, : other.replicas.shape[1]] = other.replicas[won]
    scores.replicas = replicas


@dataclass
class Best:
    """The best feasible plan seen: by the objective, ties to the faster (cost) or cheaper (time) plan."""

    objective: Objective = Objective.COST
    schedule: np.ndarray | None = None
    replicas: np.ndarray | None = None
    cost: float = math.inf
    throughput: float = 0.0

    @property
    def shown(self) -> str:
        """The best figure so far, for a progress line."""
        if self.schedule is None:
            return "none yet"
        return self.objective.shown(self.cost, self.throughput)

    @property
    def key(self) -> float:
        """Lower is better: the cost, or minus the throughput (inf while none is feasible)."""
        if self.schedule is None:
            return math.inf
        return self.objective.key(self.cost, self.throughput)

    def offer(self, problem: Problem, schedules: np.ndarray, scored: Provisioned) -> None:
        rows = np.flatnonzero(scored.feasible)
        if rows.size == 0:
            return
        cost, thr = scored.cost[rows], scored.throughput[rows]
        order = self.objective.ranked(cost, thr)
        i = int(rows[order[0]])
        if better(problem, scored.cost[i], scored.throughput[i], self.cost, self.throughput):
            stages = int((np.diff(schedules[i]) != 0).sum()) + 1
            self.schedule, self.replicas = schedules[i].copy(), scored.replicas[i, :stages].copy()
            self.cost, self.throughput = float(scored.cost[i]), float(scored.throughput[i])


def result(
    problem: Problem,
    best: Best,
    evaluate: Evaluator,
    *,
    scheduler: str,
    seed: int,
    start: float,
    notes: list[str],
    hint: str,
    interrupted: bool = False,
) -> Plan:
    """The best feasible plan found, or :class:`~heterps_cli.errors.SearchFailed` (with ``hint``).

    ``interrupted``: Ctrl-C cut the search short. The plan says so, and with no
    plan at all the interrupt goes on up (exit 130, not "infeasible")."""
    if best.schedule is None and interrupted:
        raise KeyboardInterrupt
    if best.schedule is None:
        raise SearchFailed(
            f"the {scheduler} scheduler found no feasible plan in {evaluate.evaluations:,} evaluations", hint
        )
    return make_plan(
        problem,
        best.schedule,
        best.replicas,
        scheduler=scheduler,
        seed=seed,
        solve_s=time.perf_counter() - start,
        evaluations=evaluate.evaluations,
        notes=tuple(notes),
        interrupted=interrupted,
    )


@dataclass
class Search:
    """What a search over schedules starts with: its problem and seed, the seed's random stream, the
    clock of its time limit, its progress callback, the evaluator and the best plan so far."""

    problem: Problem
    seed: int
    start: float  # time.perf_counter() when the scheduler started: the plan's solve_s
    out_of_time: Callable[..., bool]  # out_of_time(ahead=0.0): see Clock.out_of_time
    report: Progress
    rng: np.random.Generator
    evaluate: Evaluator
    best: Best

    @classmethod
    def begin(cls, problem: Problem, seed: int, progress: Progress | None, options: SolveOptions | None) -> Search:
        start = time.perf_counter()
        return cls(
            problem,
            seed,
            start,
            Clock.of(options, start).out_of_time,
            progress or quiet,
            np.random.default_rng(seed),
            Evaluator(problem),
            Best(problem.objective),
        )

    def result(self, scheduler: str, notes: list[str], hint: str, interrupted: bool = False) -> Plan:
        """:func:`result` of this search."""
        return result(
            self.problem,
            self.best,
            self.evaluate,
            scheduler=scheduler,
            seed=self.seed,
            start=self.start,
            notes=notes,
            hint=hint,
            interrupted=interrupted,
        )


def evaluation_budget(options: SolveOptions | None) -> int:
    """The cost-model evaluations genetic and random may spend: the option, else :data:`DEFAULT_EVALUATIONS`."""
    given = options.evaluations if isinstance(options, SearchOptions) else None
    return given if given is not None else DEFAULT_EVALUATIONS


def signature(schedule: np.ndarray) -> tuple[int, ...]:
    """The sequence of stage types, e.g. (cpu, v100, cpu) as type indices."""
    return tuple(schedule[np.r_[0, np.flatnonzero(np.diff(schedule)) + 1]].tolist())


def shortfall(problem: Problem, scores: Provisioned) -> np.ndarray:
    """How far each plan misses its constraints, as a sum of relative excesses (0 when it meets them)."""
    miss = np.zeros(len(scores.cost))
    with np.errstate(over="ignore"):  # a target of 1e-300: the ratio overflows to inf, and meets it
        if problem.min_throughput > 0:
            miss += np.maximum(0.0, 1.0 - scores.throughput / problem.min_throughput)
        miss += (np.maximum(0.0, scores.used - problem.limits[None, :]) / problem.limits[None, :]).sum(axis=1)
        if problem.max_cost is not None:
            miss += np.maximum(0.0, scores.cost / problem.max_cost - 1.0)
    if scores.memory_miss is not None and np.isfinite(problem.memory).any():
        miss += scores.memory_miss
    return miss


@dataclass(frozen=True)
class Reference:
    """Scales for the reward: the best cost and throughput of the pre-training pool's plans."""

    cost: float
    throughput: float

    @classmethod
    def of(cls, scores: Provisioned) -> Reference:
        chosen = scores.feasible if scores.feasible.any() else np.ones_like(scores.feasible)
        cost = float(scores.cost[chosen].min())
        return cls(cost=cost if cost > 0 else 1.0, throughput=float(scores.throughput[chosen].max()))


def rewards(problem: Problem, scores: Provisioned, reference: Reference, soft: bool = False) -> np.ndarray:
    """Higher is better: cheaper feasible > dearer feasible > infeasible, graded by the miss.

    Objective ``time`` ranks by ``reference / throughput`` and, among equally
    fast plans, by cost (docs/spec.md section 1: ties go to the cheaper plan). ``soft`` trades
    objective against miss instead (``-ratio - 3 * miss`` for every plan), which
    lets a local search cross mildly infeasible plans when limits bind; only
    feasible plans are ever kept.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        if problem.objective is Objective.TIME:
            ratio = reference.throughput / scores.throughput + TIE_BREAK * scores.cost / reference.cost
        else:
            ratio = scores.cost / reference.cost
    quality = _capped(ratio)
    if soft:
        return quality - 3.0 * shortfall(problem, scores)
    return np.where(scores.feasible, quality, -CAP - 1.0 - shortfall(problem, scores))


def _capped(ratio: np.ndarray) -> np.ndarray:
    """A feasible plan's reward from its ratio to the reference: ``-ratio``, never below ``-CAP``."""
    return -np.minimum(np.nan_to_num(ratio, nan=CAP, posinf=CAP), CAP)


def rewards_to_go(
    problem: Problem, schedules: np.ndarray, scores: Provisioned, reference: Reference, whole: np.ndarray
) -> np.ndarray:
    """``[B, n]``: per layer, the reward of the part of the plan its type choice can change; ``whole``
    is the plans' :func:`rewards` (the training loop has it already).

    Layer ``i``'s choice decides whether it joins layer ``i - 1``'s stage, so it
    changes that stage and every later one, never the stages before. A feasible
    plan's cost is ``W / 3600 / X * sum(price_s * k_s)``, so the cost of the
    stages from layer ``i - 1``'s on is a sum over them; an infeasible plan keeps
    its whole (lower) reward at every layer.
    """
    B = len(schedules)
    _, sid = stage_ids(schedules)
    S = scores.replicas.shape[1]
    stype = np.zeros((B, S), dtype=np.int64)
    stype[np.arange(B)[:, None], sid] = label_parts(problem.n_types, schedules)[0]
    rate = problem.prices[stype] * scores.replicas  # [B, S], 0 past a row's stages
    togo = np.cumsum(rate[:, ::-1], axis=1)[:, ::-1]  # from stage s on
    owner = np.concatenate([np.zeros((B, 1), dtype=np.int64), sid[:, :-1]], axis=1)  # layer i - 1's stage
    with np.errstate(divide="ignore", invalid="ignore"):
        cost = sample_hours(problem.work) / scores.throughput[:, None] * np.take_along_axis(togo, owner, axis=1)
        quality = _capped(cost / reference.cost)
    return np.where(scores.feasible[:, None], quality, whole[:, None])


def rank_advantage(r: np.ndarray) -> np.ndarray:
    """Centred, scaled ranks of the rewards (ties share a rank); ``[B, n]``: of each column.

    Ranks rather than raw rewards: the gap between feasible and infeasible
    samples would otherwise drown the 1-5% cost differences among feasible ones.
    """
    if len(r) < 2:
        return np.zeros_like(r, dtype=float)
    columns = r.reshape(len(r), -1)
    mid = np.empty(columns.shape)
    for j in range(columns.shape[1]):  # a sort per column: --batch may be 65,536, so no B x B comparisons
        ordered = np.sort(columns[:, j])
        left = np.searchsorted(ordered, columns[:, j], side="left")
        mid[:, j] = (left + np.searchsorted(ordered, columns[:, j], side="right")) / 2.0
    out = (mid - mid.mean(axis=0)) / (mid.std(axis=0) + 1e-8)
    return out.reshape(r.shape)


def alphabet(problem: Problem, degrees: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """What a search may put a layer on: ``[L]`` labels, and ``[n, L]`` where each is usable. The types
    (the papers' alphabet); with ``degrees``, each type at each tensor-parallel degree too (section 1h:
    label ``t + degree_label(T, j)``, code ``t + T j``)."""
    views = problem.views if degrees else problem.views[:1]
    T = problem.n_types
    labels = np.concatenate([stage_label(T, np.arange(T), False, j) for j in range(len(views))])
    return labels, np.concatenate([view.usable for view in views], axis=1)


def codes(problem: Problem, schedule: np.ndarray) -> np.ndarray:
    """The :func:`alphabet` codes of a schedule of its labels."""
    T = problem.n_types
    t, _, degree = label_parts(T, schedule)
    return t + T * degree


def random_schedules(problem: Problem, count: int, rng: np.random.Generator, degrees: bool = False) -> np.ndarray:
    """Schedules of 1..max(8, n/3) contiguous segments on random types (so that deep pipelines, which
    fast plans under tight limits need, are sampled too), each layer forced onto a type it can run on;
    with ``degrees``, on random types at random tensor-parallel degrees (:func:`alphabet`)."""
    n = problem.n_layers
    labels, usable = alphabet(problem, degrees)
    most = min(n, max(8, n // 3))
    segments = rng.integers(1, most + 1, size=count)
    # The segments - 1 layers with the smallest random keys start a new segment (never layer 0).
    keys = rng.random((count, n))
    keys[:, 0] = np.inf
    rank = np.argsort(np.argsort(keys, axis=1), axis=1)
    segment = np.cumsum(rank < (segments - 1)[:, None], axis=1, dtype=np.int64)
    types = rng.integers(0, len(labels), size=(count, most))
    out = np.take_along_axis(types, segment, axis=1)
    bad = ~usable[np.arange(n)[None, :], out]
    if bad.any():
        fallback = _per_layer_best(problem, problem.oct * np.maximum(problem.prices, 1e-9)[None, :])
        out = np.where(bad, fallback[None, :], out)
    return labels[out]


def _per_layer_best(problem: Problem, score: np.ndarray) -> np.ndarray:
    return np.where(problem.usable, score, np.inf).argmin(axis=1)


def heuristic_schedules(problem: Problem, degrees: bool = False) -> np.ndarray:
    """Each layer on its cheapest-to-compute, cheapest-overall and fastest type, and each type for all;
    with ``degrees``, also each type at each further tensor-parallel degree for all (section 1h)."""
    price = np.maximum(problem.prices, 1e-9)[None, :]
    rows = [
        _per_layer_best(problem, problem.oct * price),
        _per_layer_best(problem, np.maximum(problem.oct, problem.odt) * price),
        _per_layer_best(problem, np.maximum(problem.oct, problem.odt)),
    ]
    for t in range(problem.n_types):
        rows.append(np.where(problem.usable[:, t], t, rows[0]))
    if np.isfinite(problem.memory).any():  # section 1b: the same, cut where a stage outgrows memory
        weight = np.ones_like(price) if problem.objective is Objective.TIME else price
        rows += [_cut_for_memory(problem, row, weight) for row in rows]
    if degrees:
        T = problem.n_types
        for j, view in enumerate(problem.views[1:], start=1):
            for t in range(T):
                if view.usable[:, t].any():
                    rows.append(np.where(view.usable[:, t], int(stage_label(T, t, False, j)), rows[0]))
    return np.array(rows, dtype=np.int64)


def _cut_for_memory(problem: Problem, row: np.ndarray, price: np.ndarray) -> np.ndarray:
    """``row`` with a layer moved to its cheapest other usable type (fastest, with unit prices) wherever
    its stage would need more memory per replica than a unit has even with all of the type's units."""
    fixed, split = problem.memory_parts
    out = row.copy()
    held = (0.0, 0.0)
    for i in range(problem.n_layers):
        t = out[i]
        held = (held[0] + fixed[i], held[1] + split[i]) if i and out[i - 1] == t else (fixed[i], split[i])
        if i and out[i - 1] == t and held[0] + held[1] / problem.limits[t] > problem.memory[t]:
            others = np.flatnonzero(problem.usable[i] & (np.arange(problem.n_types) != t))
            if others.size:
                out[i] = others[np.argmin((problem.oct[i] * price[0])[others])]
                held = (fixed[i], split[i])
    return out
