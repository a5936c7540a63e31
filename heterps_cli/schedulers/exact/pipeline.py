"""The exact optimum under a pipeline schedule (docs/spec.md section 1d).

Section 1d's stage time depends on two things a stage alone does not know: ``S``,
the plan's number of stages (the fill and drain of the pipeline: ``M + S - 1``
slots of a micro-batch), and its place in the pipeline (stage ``s`` of ``S``
holds ``min(S - s, M)`` micro-batches of activations under 1F1B). So the exact
solver is run once per stage count ``S`` (:func:`stage_grid`), on "types" that
pair a resource type with ``r``, the stages from this one to the last: a stage
on ``(t, r)`` may only come right before one on ``(t', r - 1)``, ``t' != t``
(:class:`~heterps_cli.schedulers.exact.kernel.Chain`), and the chain ends at ``r = 1``.

Every plan of the grid for ``S`` has at most ``S`` stages and is charged as if
it had ``S``: at least what it really takes, exactly when it has ``S``. So the
best over all ``S`` of each question the solver asks ("the cheapest plan
reaching ``X``", "is ``X`` reachable", a cost bound) is that question's exact
answer, and :class:`PipelineSolver` answers them so; the walks over ``X`` are
:mod:`.walks`'s own. A stage's step is at least
``M + S - 1`` micro-batches of the model's slowest layer on all of its type's units, so only
the stage counts that can reach ``X`` are asked, and their grids are built when first asked.

The two objectives' walks run one stage count at a time instead (:func:`.walks.min_cost_by_stages`,
:func:`.walks.max_throughput_by_stages`): the optimum is the best of each grid's optimum, since a plan of
``s`` stages is charged exactly in grid ``s`` and no less in any other. Before grid ``S`` is built, a
relaxation bounds every plan of ``S`` stages or more (:func:`at_least_grid`: ``M + S - 1`` slots, one
micro-batch in flight), and once it cannot beat the best plan found, no larger ``S`` can either. Each
grid is dropped when its walk ends, so the walks hold one grid at a time.
"""

from __future__ import annotations

import math
import time

import numpy as np

from heterps_cli.costmodel import score
from heterps_cli.errors import TooLarge
from heterps_cli.figures import count
from heterps_cli.formulas import SLACK, amdahl, pipeline_slots
from heterps_cli.problem import Problem
from heterps_cli.schedulers.base import Progress
from heterps_cli.schedulers.exact.kernel import Candidate, Chain, chain_dp
from heterps_cli.schedulers.exact.step import StepSolver, schedule_of
from heterps_cli.schedulers.exact.terms import (
    MAX_GRID_CELLS,
    Table,
    at_least_grid,
    most_stages,
    stage_grid,
    stage_table,
)
from heterps_cli.stages import split_stages
from heterps_cli.units_bound import counts_left, may_have


def _slowest_layer(problem: Problem) -> float:
    """The least time of the slowest layer's micro-batch: every stage holds some layer, and runs it no
    faster than on all of its type's units, at any degree (section 1h)."""
    fastest = np.full(problem.oct.shape, np.inf)
    for view in problem.views:
        serial, parallel, _, _ = view.parts
        most = (problem.limits // view.degree)[None, :].astype(float)
        with np.errstate(divide="ignore", invalid="ignore"):
            alone = np.where(view.runnable & (most > 0), amdahl(serial, parallel, np.maximum(most, 1)), np.inf)
        fastest = np.minimum(fastest, alone)
    return float(fastest.min(axis=1).max())


class PipelineSolver(StepSolver):
    """:class:`StepSolver`'s questions answered over every stage count that can reach the throughput
    asked (see the module's docstring); a stage count's grid is built when a question first needs it."""

    def __init__(
        self,
        problem: Problem,
        progress: Progress | None,
        relax: bool = True,
        grids: dict[int, tuple[Table, Chain]] | None = None,
        floor_grids: dict[int, tuple[Table, Chain]] | None = None,
        shared: bool = False,
    ):
        self.p = problem
        self.shared = shared  # solvers that differ only in their limits share its tables: they keep fills
        self.progress = progress
        self.relax = relax
        self.evaluations = 0
        self.most = most_stages(problem)
        self.grids: dict[int, tuple[Table, Chain]] = {} if grids is None else grids  # by S; may be shared, read-only
        self.floor_grids: dict[int, tuple[Table, Chain]] = {} if floor_grids is None else floor_grids  # by S
        self.subs: dict[int, StepSolver] = {}
        self.floors: dict[int, StepSolver] = {}  # by S: the solver on at_least_grid(S)
        self.dropped_relaxed: set[int] = set()  # what the solvers of dropped grids found (the properties below)
        self.dropped_found: list[tuple[StepSolver, Candidate]] = []
        self.fastest: tuple[Candidate | None, float] | None = None  # max_throughput's, once finished
        self.slowest_layer = _slowest_layer(problem)
        self.refused: str | None = None  # why a walk stopped short of a stage count's grid (TooLarge's words)
        self.left: CountsLeft | None = None  # where set (the budget walk), cheapest skips the counts it rules out

    def stage_counts(self, target: float) -> range:
        """The stage counts ``S`` whose plans can reach ``target``: a stage's step is at least
        ``(M + S - 1)`` micro-batches of its slowest layer on all of its type's units."""
        M, step = self.p.micro_batches, self.p.step_samples
        if target <= 0 or self.slowest_layer <= 0:
            return self.of_shape(range(1, self.most + 1))
        with np.errstate(divide="ignore", over="ignore"):
            slots = step / (target * self.slowest_layer) * (1 + 1e-9)  # (M + S - 1) at most, rounding spared
        if not np.isfinite(slots):
            return self.of_shape(range(1, self.most + 1))
        return self.of_shape(range(1, min(self.most, int(slots) - M + 1) + 1))

    def of_shape(self, counts: range) -> range:
        """Section 1k: of ``counts``, the shape's stage count alone where it fixes one."""
        S = self.p.fixed.stages
        return counts if S is None else range(S, S + 1) if S in counts else range(0)

    def slot_bound(self, S: int) -> float:
        """No plan of ``S`` stages or more, nor any plan of grid ``S``, is faster than this: each stage
        takes ``M + S - 1`` slots of at least its slowest layer on all of its type's units."""
        with np.errstate(divide="ignore", over="ignore"):
            slowest = pipeline_slots(self.p.micro_batches, S) * self.slowest_layer
            return float(np.float64(self.p.step_samples) / slowest)

    def at_least(self, S: int) -> StepSolver:
        """The solver on :func:`at_least_grid`: its "no plan reaches X" and its cost bounds hold for
        every plan of ``S`` stages or more."""
        if S not in self.floors:
            if S not in self.floor_grids:
                table, chain = at_least_grid(self.p, S)
                self.floor_grids[S] = _kept_fills(table, self.shared), chain
            table, chain = self.floor_grids[S]
            self.floors[S] = StepSolver(self.p, None, table, self.relax, chain)
        return self.floors[S]

    def drop(self, S: int) -> None:
        """Forget grid ``S`` and its solver, keeping what it found within every limit."""
        sub = self.subs.pop(S, None)
        self.grids.pop(S, None)
        if sub is not None:
            self.dropped_relaxed |= sub.relaxed
            self.dropped_found += [(sub, c) for c in (sub.cheapest_found, sub.fastest_found) if c is not None]

    def sub(self, S: int) -> StepSolver:
        """The solver on the grid of ``S`` stages, built now if no question needed it before."""
        if S not in self.subs:
            if S not in self.grids:
                _room_for(self.p, self.grids, [S])
                table, chain = stage_grid(self.p, S)
                self.grids[S] = _kept_fills(table, self.shared), chain
            table, chain = self.grids[S]
            self.subs[S] = StepSolver(self.p, None, table, self.relax, chain)
        return self.subs[S]

    @property
    def relaxed(self) -> set[int]:  # type: ignore[override]  # aggregated, as the walks read it
        return self.dropped_relaxed.union(*(sub.relaxed for sub in self.subs.values()))

    def _found(self) -> list[Candidate]:
        held = [(sub, c) for _, sub in sorted(self.subs.items()) for c in (sub.cheapest_found, sub.fastest_found)]
        return [true_candidate(self.p, sub, c) for sub, c in self.dropped_found + held if c is not None]

    @property
    def cheapest_found(self) -> Candidate | None:  # type: ignore[override]
        return min(self._found(), key=lambda c: (c.cost, -c.throughput), default=None)

    @property
    def fastest_found(self) -> Candidate | None:  # type: ignore[override]
        return min(self._found(), key=lambda c: (-c.throughput, c.cost), default=None)

    def cheapest(self, target: float) -> Candidate | None:
        self.evaluations += 1
        counts = self.stage_counts(target)
        if self.progress:
            self.progress(f"exact: DP {self.evaluations} at {count(target, 1)} samples/s, up to {len(counts)} stages")
        best: Candidate | None = None
        for S in counts:
            floor = self.at_least(S)  # its answers hold for every plan of S stages or more
            if best is None:
                if not floor.reachable(target):
                    break
            else:
                floor.replicas(target)
                # S stages or more, each at least the relaxation's cheapest stage: a bound that grows with S
                least = max(chain_dp(floor.grid.rate, floor.chain)[0], S * float(floor.grid.rate.min()))
                if least * (1 - SLACK) > best.rate:
                    break
            if self.left is not None and not self.left.may(S, target):
                continue  # the units bound: no plan of S stages reaches the target
            sub = self.sub(S)
            cand = sub.cheapest(target)
            if cand is None or (best is not None and cand.rate > best.rate):
                continue  # scoring keeps the DP's rate: only a tie needs the real throughput
            cand = true_candidate(self.p, sub, cand)
            if best is None or (cand.rate, -cand.throughput) < (best.rate, -best.throughput):
                best = cand
        return best

    def lower_bound(self, target: float) -> float:
        best = math.inf
        for S in self.stage_counts(target):
            if self.at_least(S).lower_bound(target) >= best:
                break
            best = min(best, self.sub(S).lower_bound(target))
        return best

    def reachable(self, target: float) -> bool:
        for S in self.stage_counts(target):
            if not self.at_least(S).reachable(target):
                return False
            if self.sub(S).reachable(target):
                return True
        return False

    def speed_bound(self) -> float:
        """A stage's step is at least ``M`` micro-batches of each of its layers' compute on all of its
        type's units, so no plan is faster than its slowest layer alone there (division is monotone,
        so this is the per-type figure's best over types and worst over layers, bit for bit)."""
        with np.errstate(divide="ignore"):
            return float(np.float64(self.p.batch_size) / self.slowest_layer)


def true_candidate(problem: Problem, sub: StepSolver, cand: Candidate) -> Candidate:
    """``cand`` (a plan of ``sub``'s grid) with resource types for DP types, and the figures its
    real stage count gives."""
    return scored(problem, sub, cand)[0]


def scored(problem: Problem, sub: StepSolver, cand: Candidate) -> tuple[Candidate, bool]:
    """:func:`true_candidate`, and whether the plan is within every limit and memory in its real figures."""
    stages = [(j, i, int(sub.chain.labels[t])) for j, i, t in cand.stages]
    split = split_stages(problem, schedule_of(problem, stages)[None, :])
    k = np.zeros(split.valid.shape)
    k[0, : len(stages)] = cand.replicas
    figures = score(problem, split, k)
    true = Candidate(
        stages, list(cand.replicas), float(figures.throughput[0]), float(figures.cost[0]), cand.rate, cand.within
    )
    return true, bool(figures.within_limits[0]) and _keeps_shape(
        problem, [int(sub.chain.base[t]) for *_, t in cand.stages]
    )


def _keeps_shape(problem: Problem, types: list[int]) -> bool:
    """Section 1k: a plan on ``types`` (each stage's) has the shape's stage count and stage types: a plan
    of a relaxation, which knows neither, is no witness otherwise."""
    if problem.fixed.stages is not None and len(types) != problem.fixed.stages:
        return False
    wanted = problem.fixed.stage_types or ()
    return all(w < 0 or w == t for w, t in zip(wanted, types))


def walking(solver: PipelineSolver, S: int) -> StepSolver:
    """The solver of grid ``S``, its progress naming the stage count."""
    sub = solver.sub(S)
    if solver.progress is not None:
        progress = solver.progress

        def with_stages(description: str, completed: float | None = None, total: float | None = None) -> None:
            progress(f"{description}, {S} stages", completed, total)

        sub.progress = with_stages
    return sub


def _room_for(problem: Problem, built, counts) -> None:
    """Refuse (exit 2) before building grids for ``counts`` that would pass :data:`MAX_GRID_CELLS`
    with those already built."""
    cells = sum(_cells(problem, S) for S in set(built) | set(counts))
    if cells > MAX_GRID_CELLS:
        raise TooLarge(
            "exact scheduler",
            f"under a pipeline schedule the exact solver would hold {cells:,} stage cells for "
            f"{problem.n_layers:,} layers x {problem.n_types} types x up to {max(counts):,} stages, more than it "
            f"may use ({MAX_GRID_CELLS:,}); use --scheduler greedy or rl, or profile the model at a coarser "
            "granularity (fewer, larger layers)",
        )


def _cells(problem: Problem, stages: int) -> int:
    """Cells of the grid for ``stages`` stages."""
    return (problem.n_layers + 1) ** 2 * problem.n_types * len(problem.stage_ways) * stages


def _kept_fills(table: Table, shared: bool) -> Table:
    """``table``, keeping its limit-free fills where solvers that differ only in their limits share it."""
    if shared:
        table.fills = {}
    return table


def solver_for(
    problem: Problem,
    progress: Progress | None = None,
    relax: bool = True,
    like: StepSolver | None = None,
    shared: bool = False,
) -> StepSolver:
    """The exact solver's question-answerer for ``problem``'s model; sharing the stage grids (and their
    relaxations) of ``like``, a solver of the same terms, when given (they are only read). ``shared``: the
    tables it builds will be shared by solvers that differ only in their limits (rentals of whole nodes)."""
    if problem.pipelined:
        if isinstance(like, PipelineSolver):
            return PipelineSolver(problem, progress, relax, like.grids, like.floor_grids, shared)
        return PipelineSolver(problem, progress, relax, shared=shared)
    table = like.tab if like is not None else _kept_fills(stage_table(problem), shared)
    return StepSolver(problem, progress, table, relax=relax)


# Seconds of searching before the units bound is first asked which stage counts to skip: about one question's
# time on a 50-layer chain of two types (0.1-0.2 s; its grids take 0.01-0.15 s each).
FIRST_QUESTION = 0.1


class CountsLeft:
    """The stage counts in which a plan may reach a target by the units bound (:func:`counts_left`); below the
    last target asked, every count may. A count ruled out at a lower target stays ruled out, so the bound is
    asked again only where a count it leaves is about to be searched at a higher target, and only once the
    search has taken as long as the last question on a problem of its size did (:data:`FIRST_QUESTION`
    before any), so that it never costs much more than the search it prunes: a search that ends sooner
    never asks it. What it skips has no plan as fast, so the plan found does not depend on when it is
    asked."""

    def __init__(self, problem) -> None:
        self.p, self.at = problem, -1.0
        self.left: list[tuple[int, int | None]] | None = None  # None: every count may
        self.size = (problem.n_layers, problem.n_types)
        self.asked, self.took = time.perf_counter(), _TOOK.get(self.size, FIRST_QUESTION)

    def may(self, S: int, target: float) -> bool:
        if target < self.at:  # what was ruled out higher up may be reached here
            return True
        now = time.perf_counter()
        if now - self.asked >= self.took and target > self.at and may_have(self.left, S):
            self.at, self.left = target, counts_left(self.p, target * (1 - 1e-9))
            self.asked = time.perf_counter()
            self.took = _TOOK[self.size] = self.asked - now
        return may_have(self.left, S)


_TOOK: dict[tuple[int, int], float] = {}  # the last question's seconds, by (layers, types)
