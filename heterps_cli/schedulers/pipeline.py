"""The exact optimum under a pipeline schedule (docs/spec.md section 1d).

Section 1d's stage time depends on two things a stage alone does not know: ``S``,
the plan's number of stages (the fill and drain of the pipeline: ``M + S - 1``
slots of a micro-batch), and its place in the pipeline (stage ``s`` of ``S``
holds ``min(S - s, M)`` micro-batches of activations under 1F1B). So the exact
solver is run once per stage count ``S`` (:func:`stage_grid`), on "types" that
pair a resource type with ``r``, the stages from this one to the last: a stage
on ``(t, r)`` may only come right before one on ``(t', r - 1)``, ``t' != t``
(:class:`~heterps_cli.schedulers.chain_dp.Chain`), and the chain ends at ``r = 1``.

Every plan of the grid for ``S`` has at most ``S`` stages and is charged as if
it had ``S``: at least what it really takes, exactly when it has ``S``. So the
best over all ``S`` of each question the solver asks ("the cheapest plan
reaching ``X``", "is ``X`` reachable", a cost bound) is that question's exact
answer, and :class:`PipelineSolver` answers them so; the walks over ``X`` are
:class:`~heterps_cli.schedulers.step_solver.StepSolver`'s own. A stage's step is at least
``M + S - 1`` micro-batches of the model's slowest layer on all of its type's units, so only
the stage counts that can reach ``X`` are asked, and their grids are built when first asked.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from heterps_cli.costmodel import min_memory_replicas, pipeline_terms, score, split_stages
from heterps_cli.errors import TooLarge
from heterps_cli.figures import count
from heterps_cli.problem import Problem
from heterps_cli.schedulers.base import Progress
from heterps_cli.schedulers.chain_dp import (
    MAX_GRID_CELLS,
    Candidate,
    Chain,
    _Table,
    boundary_transfer,
    most_stages,
    runnable_spans,
    spans,
)
from heterps_cli.schedulers.step_solver import StepSolver, schedule_of


def stage_grid(problem: Problem, stages: int) -> tuple[_Table, Chain]:
    """The stage table and chain for plans of at most ``stages`` stages: DP type ``(r - 1) T + t`` is a
    stage on ``t`` with ``r`` stages from it to the last."""
    n1, T = problem.n_layers + 1, problem.n_types
    serial, parallel, _, _ = problem.parts
    micro_serial = spans(serial)
    micro_parallel = spans(parallel) + boundary_transfer(problem)
    sync, update = spans(problem.odt), spans(problem.update_times)
    sc, pc = pipeline_terms(problem.micro_batches, stages, micro_serial, micro_parallel, sync, update)
    places = np.arange(1, stages + 1)  # r
    min_k = np.ones((n1, n1, T * stages))
    if np.isfinite(problem.memory).any():
        state_fixed, state_split = (spans(part[:, None]) for part in problem.state_parts)
        activations = spans(problem.activation_bytes[:, None])
        fixed = state_fixed + problem.reserved_bytes[None, None, :] if problem.reserved is not None else state_fixed
        held = np.minimum(places, problem.micro_batches)
        shape = (n1, n1, stages, T)
        with np.errstate(over="ignore", invalid="ignore"):
            split = state_split[:, :, None, :] + held[None, None, :, None] * activations[:, :, None, :]
            min_k = min_memory_replicas(
                np.broadcast_to(fixed[:, :, None, :], shape),
                np.broadcast_to(split, shape),
                problem.memory[None, None, None, :],
            ).reshape(n1, n1, stages * T)
    sc, pc, ok = (np.tile(a, (1, 1, stages)) for a in (sc, pc, runnable_spans(problem)))  # the same at every r
    zeros = np.zeros((n1, n1, T * stages))
    table = _Table(sc, pc, zeros, zeros, ok, min_k)
    base = np.tile(np.arange(T), stages)
    place = np.repeat(places, T)
    follows = (base[:, None] != base[None, :]) & (place[None, :] == place[:, None] - 1)
    return table, Chain(base, follows, np.ones(T * stages, dtype=bool), place == 1)


class PipelineSolver(StepSolver):
    """:class:`StepSolver`'s questions answered over every stage count that can reach the throughput
    asked (see the module's docstring); a stage count's grid is built when a question first needs it."""

    def __init__(
        self,
        problem: Problem,
        progress: Progress | None,
        relax: bool = True,
        grids: dict[int, tuple[_Table, Chain]] | None = None,
    ):
        self.p = problem
        self.progress = progress
        self.relax = relax
        self.evaluations = 0
        self.most = most_stages(problem)
        # Grids by stage count S; another solver of the same problem may share them (read-only).
        self.grids: dict[int, tuple[_Table, Chain]] = {} if grids is None else grids
        self.subs: dict[int, StepSolver] = {}
        serial, parallel, _, _ = problem.parts
        with np.errstate(divide="ignore", invalid="ignore"):
            fastest = np.where(problem.runnable, serial + parallel / problem.limits[None, :].astype(float), np.inf)
        # Every stage holds some layer, and runs a micro-batch of it no faster than on all of its type's units.
        self.slowest_layer = float(fastest.min(axis=1).max())

    def stage_counts(self, target: float) -> range:
        """The stage counts ``S`` whose plans can reach ``target``: a stage's step is at least
        ``(M + S - 1)`` micro-batches of its slowest layer on all of its type's units."""
        M, step = self.p.micro_batches, self.p.step_samples
        if target <= 0 or self.slowest_layer <= 0:
            return range(1, self.most + 1)
        with np.errstate(divide="ignore", over="ignore"):
            slots = step / (target * self.slowest_layer) * (1 + 1e-9)  # (M + S - 1) at most, rounding spared
        if not np.isfinite(slots):
            return range(1, self.most + 1)
        return range(1, min(self.most, int(slots) - M + 1) + 1)

    def sub(self, S: int) -> StepSolver:
        """The solver on the grid of ``S`` stages, built now if no question needed it before."""
        if S not in self.subs:
            if S not in self.grids:
                self._room_for([S])
                self.grids[S] = stage_grid(self.p, S)
            table, chain = self.grids[S]
            self.subs[S] = StepSolver(self.p, None, table, self.relax, chain)
        return self.subs[S]

    def _room_for(self, counts) -> None:
        """Refuse (exit 2) before building grids for ``counts`` that would pass :data:`MAX_GRID_CELLS`
        with those already built."""
        cells = sum(_cells(self.p, S) for S in set(self.grids) | set(counts))
        if cells > MAX_GRID_CELLS:
            raise TooLarge(
                "exact scheduler",
                f"under a pipeline schedule the exact solver would hold {cells:,} stage cells for "
                f"{self.p.n_layers:,} layers x {self.p.n_types} types x up to {max(counts):,} stages, more than it "
                f"may use ({MAX_GRID_CELLS:,}); use --scheduler greedy or rl, or profile the model at a coarser "
                "granularity (fewer, larger layers)",
            )

    def subs_for(self, target: float, every: bool = True):
        """(S, its solver) for every stage count that can reach ``target``, fewest stages first; with
        ``every``, refused at once when their grids will not all fit (a caller that may stop early
        builds them as it goes)."""
        counts = self.stage_counts(target)
        if every:
            self._room_for(counts)
        for S in counts:
            yield S, self.sub(S)

    # The aggregated state StepSolver's walks read.
    @property
    def relaxed(self) -> set[int]:  # type: ignore[override]
        return set().union(*(sub.relaxed for sub in self.subs.values()))

    @property
    def cheapest_found(self) -> Candidate | None:  # type: ignore[override]
        found = [self._true(sub, c) for _, sub in sorted(self.subs.items()) if (c := sub.cheapest_found) is not None]
        return min(found, key=lambda c: (c.cost, -c.throughput), default=None)

    @property
    def fastest_found(self) -> Candidate | None:  # type: ignore[override]
        found = [self._true(sub, c) for _, sub in sorted(self.subs.items()) if (c := sub.fastest_found) is not None]
        return min(found, key=lambda c: (-c.throughput, c.cost), default=None)

    def _true(self, sub: StepSolver, cand: Candidate) -> Candidate:
        """``cand`` (a plan of ``sub``'s grid) with resource types for DP types, and the figures its
        real stage count gives."""
        stages = [(j, i, int(sub.chain.base[t])) for j, i, t in cand.stages]
        split = split_stages(self.p, schedule_of(self.p, stages)[None, :])
        k = np.zeros(split.valid.shape)
        k[0, : len(stages)] = cand.replicas
        figures = score(self.p, split, k)
        return Candidate(
            stages, list(cand.replicas), float(figures.throughput[0]), float(figures.cost[0]), cand.rate, cand.within
        )

    def cheapest(self, target: float) -> Candidate | None:
        self.evaluations += 1
        counts = self.stage_counts(target)
        if self.progress:
            self.progress(f"exact: DP {self.evaluations} at {count(target, 1)} samples/s, up to {len(counts)} stages")
        best: Candidate | None = None
        for _, sub in self.subs_for(target):
            cand = sub.cheapest(target)
            if cand is None:
                continue
            cand = self._true(sub, cand)
            if best is None or (cand.rate, -cand.throughput) < (best.rate, -best.throughput):
                best = cand
        return best

    def lower_bound(self, target: float) -> float:
        return min((sub.lower_bound(target) for _, sub in self.subs_for(target)), default=math.inf)

    def reachable(self, target: float) -> bool:
        return any(sub.reachable(target) for _, sub in self.subs_for(target, every=False))

    def speed_bound(self) -> float:
        """A stage's step is at least ``M`` micro-batches of each of its layers' compute on all of its
        type's units, so no plan is faster than its slowest layer alone there (division is monotone,
        so this is the per-type figure's best over types and worst over layers, bit for bit)."""
        with np.errstate(divide="ignore"):
            return float(np.float64(self.p.batch_size) / self.slowest_layer)

    def max_throughput(self, out_of_time: Callable[[], bool] = lambda: False) -> tuple[Candidate | None, float]:
        """:meth:`StepSolver.max_throughput`, bracketed from the first plan of the fewest stages rather
        than the cheapest of all (which would build every stage count's grid)."""
        for S in range(1, self.most + 1):
            first = self.sub(S).cheapest(0.0)
            if first is not None:
                return self._bisect(self._true(self.sub(S), first), out_of_time)
        return None, 0.0


def _cells(problem: Problem, stages: int) -> int:
    """Cells of the grid for ``stages`` stages."""
    return (problem.n_layers + 1) ** 2 * problem.n_types * stages


def solver_for(
    problem: Problem, progress: Progress | None = None, relax: bool = True, like: StepSolver | None = None
) -> StepSolver:
    """The exact solver's question-answerer for ``problem``'s model; sharing the stage grids of ``like``,
    a solver of the same problem, when given (they are only read)."""
    if problem.pipelined:
        return PipelineSolver(problem, progress, relax, like.grids if isinstance(like, PipelineSolver) else None)
    return StepSolver(problem, progress, like.tab if like is not None else None, relax=relax)
