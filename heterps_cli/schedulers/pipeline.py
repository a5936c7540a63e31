"""The exact optimum under a pipeline schedule (docs/spec.md section 1d).

Section 1d's stage time depends on two things a stage alone does not know: ``S``,
the plan's number of stages (the fill and drain of the pipeline: ``M + S - 1``
slots of a micro-batch), and its place in the pipeline (stage ``s`` of ``S``
holds ``min(S - s, M)`` micro-batches of activations under 1F1B). So the exact
solver is run once per stage count ``S`` (:func:`stage_grid`), on "types" that
pair a resource type with ``r``, the stages from this one to the last: a stage
on ``(t, r)`` may only come right before one on ``(t', r - 1)``, ``t' != t``
(:class:`~heterps_cli.schedulers.exact.Chain`), and the chain ends at ``r = 1``.

Every plan of the grid for ``S`` has at most ``S`` stages and is charged as if
it had ``S``: at least what it really takes, exactly when it has ``S``. So the
best over all ``S`` of each question the solver asks ("the cheapest plan
reaching ``X``", "is ``X`` reachable", a cost bound) is that question's exact
answer, and :class:`PipelineSolver` answers them so; the walks over ``X`` are
:class:`~heterps_cli.schedulers.exact.StepSolver`'s own, unchanged.
"""

from __future__ import annotations

import numpy as np

from heterps_cli.costmodel import min_memory_replicas, pipeline_terms, score, split_stages
from heterps_cli.errors import InputError
from heterps_cli.figures import count
from heterps_cli.problem import Problem
from heterps_cli.schedulers.base import Progress
from heterps_cli.schedulers.exact import (
    MAX_GRID_CELLS,
    Candidate,
    Chain,
    StepSolver,
    _Table,
    boundary_transfer,
    grid_cells,
    most_stages,
    runnable_spans,
    schedule_of,
    spans,
)


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
    """:class:`StepSolver`'s questions answered over every stage count (see the module's docstring)."""

    def __init__(
        self,
        problem: Problem,
        progress: Progress | None,
        relax: bool = True,
        grids: list[tuple[_Table, Chain]] | None = None,
    ):
        cells = grid_cells(problem)
        if cells > MAX_GRID_CELLS:
            raise InputError(
                None,
                None,
                "exact scheduler",
                f"under a pipeline schedule the exact solver would hold {cells:,} stage cells for "
                f"{problem.n_layers:,} layers x {problem.n_types} types x up to {most_stages(problem):,} stages, more "
                f"than it may use ({MAX_GRID_CELLS:,}); use --scheduler greedy or rl, or profile the model at a "
                "coarser granularity (fewer, larger layers)",
            )
        self.p = problem
        self.progress = progress
        self.relax = relax
        self.evaluations = 0
        # One grid per stage count S = 1, 2, ...; another solver of the same problem may share them (read-only).
        if grids is None:
            grids = [stage_grid(problem, S) for S in range(1, most_stages(problem) + 1)]
        self.grids = grids
        self.subs = [StepSolver(problem, None, table, relax, chain) for table, chain in grids]

    # The aggregated state StepSolver's walks read.
    @property
    def relaxed(self) -> set[int]:  # type: ignore[override]
        return set().union(*(sub.relaxed for sub in self.subs))

    @property
    def cheapest_found(self) -> Candidate | None:  # type: ignore[override]
        found = [self._true(sub, c) for sub in self.subs if (c := sub.cheapest_found) is not None]
        return min(found, key=lambda c: (c.cost, -c.throughput), default=None)

    @property
    def fastest_found(self) -> Candidate | None:  # type: ignore[override]
        found = [self._true(sub, c) for sub in self.subs if (c := sub.fastest_found) is not None]
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
        if self.progress:
            self.progress(
                f"exact: DP {self.evaluations} at {count(target, 1)} samples/s, up to {len(self.grids)} stages"
            )
        best: Candidate | None = None
        for sub in self.subs:
            cand = sub.cheapest(target)
            if cand is None:
                continue
            cand = self._true(sub, cand)
            if best is None or (cand.rate, -cand.throughput) < (best.rate, -best.throughput):
                best = cand
        return best

    def lower_bound(self, target: float) -> float:
        return min(sub.lower_bound(target) for sub in self.subs)

    def reachable(self, target: float) -> bool:
        return any(sub.reachable(target) for sub in self.subs)

    def speed_bound(self) -> float:
        """A stage's step is at least ``M`` micro-batches of each of its layers' compute on all of its
        type's units, so no plan is faster than its slowest layer alone there."""
        serial, parallel, _, _ = self.p.parts
        with np.errstate(divide="ignore"):
            alone = self.p.batch_size / (serial + parallel / self.p.limits[None, :].astype(float))
        return float(np.where(self.p.runnable, alone, 0.0).max(axis=1).min())


def solver_for(
    problem: Problem, progress: Progress | None = None, relax: bool = True, like: StepSolver | None = None
) -> StepSolver:
    """The exact solver's question-answerer for ``problem``'s model; sharing the stage grids of ``like``,
    a solver of the same problem, when given (they are only read)."""
    if problem.pipelined:
        return PipelineSolver(problem, progress, relax, like.grids if isinstance(like, PipelineSolver) else None)
    return StepSolver(problem, progress, like.tab if like is not None else None, relax=relax)
