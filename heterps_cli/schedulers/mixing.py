"""Section 1i's search: replicas of other types join a plan's slowest stage (``plan --mixed-stages``).

From any scheduler's plan of one-type stages, a hill climb: at each step, every way to give the slowest
stage ``e`` more replicas of another type (``e`` a power of two, or all there are), taken from the units
the plan leaves idle or from another stage of that type, each with the split of the micro-batch that
makes its slowest part fastest (:func:`~heterps_cli.mixed.balanced`); the best that makes the plan faster
within every constraint is kept, until none does. Objective time only: under objective cost the plan is
returned as found.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from heterps_cli.costmodel import schedule_of_stages, score, split_stages
from heterps_cli.mixed import Joined, mixed_scores, mixed_stage
from heterps_cli.objective import Objective
from heterps_cli.plan import Plan, make_plan
from heterps_cli.problem import Problem

MOST_STEPS = 64  # joins of the slowest stage; each step tries every type, count and source
Move = tuple[np.ndarray, dict[int, tuple[Joined, ...]]]  # replicas per stage, joined parts by stage


def can_mix(problem: Problem) -> str | None:
    """Why ``problem``'s plans cannot mix types in a stage (None: they can)."""
    if problem.n_types < 2:
        return "the cluster has one type"
    if problem.nodes is not None:
        return "mixed stages are not planned on clusters of whole nodes yet"
    if not problem.pipelined:
        return "mixed stages need a pipeline schedule (a global batch)"
    if problem.objective is not Objective.TIME:
        return "mixed stages are searched under objective time only"
    return None


def mix(problem: Problem, plan: Plan, deadline: float = np.inf) -> tuple[Plan, str]:
    """``plan`` with replicas of other types joining its slowest stages where that makes it faster, and
    what was done, in words."""
    if (why := can_mix(problem)) is not None or not plan.feasible:
        return plan, why or "the plan breaks a constraint"
    problem = problem.at_micro_batch(plan.batch_size)
    schedule = schedule_of_stages(problem, plan.stages)
    stages = split_stages(problem, schedule[None, :])
    k = np.array([float(s.replicas) for s in plan.stages])
    joined: dict[int, tuple[Joined, ...]] = {}
    best = _score(problem, schedule, stages, k, joined)
    start = best
    for _ in range(MOST_STEPS):
        if time.monotonic() > deadline or best is None:
            break
        moves = _moves(problem, schedule, stages, k, joined)
        found = max(
            ((_score(problem, schedule, stages, kk, jj), kk, jj) for kk, jj in moves),
            key=lambda c: -np.inf if c[0] is None else c[0],
            default=None,
        )
        if found is None or found[0] is None or found[0] <= best * (1 + 1e-9):
            break
        best, k, joined = found
    if not joined:
        return plan, "no stage is faster with replicas of another type"
    mixed = make_plan(problem, schedule, k, scheduler=plan.scheduler, seed=plan.seed, joined=joined, notes=plan.notes)
    said = "; ".join(_joined_words(problem, plan.stages[s], int(k[s]), parts) for s, parts in sorted(joined.items()))
    said += f" (section 1i): {start:,.1f} -> {best:,.1f} samples/s"
    return mixed.but(solve_s=plan.solve_s, evaluations=plan.evaluations), said


def _joined_words(problem: Problem, stage, own: int, parts: tuple[Joined, ...]) -> str:
    """Why a stage mixes types, in words: who joins it, and what each part trains."""
    B = problem.batch_size
    mine = B - sum(p.samples for p in parts)
    others = ", ".join(f"{p.replicas} {problem.types[p.type]} replica(s) train {p.samples}" for p in parts)
    return (
        f"stage {stage.first}-{stage.last} is the slowest on one type: {others} of each micro-batch of {B} beside "
        f"its {own} {stage.resource} replica(s), which train {mine}, each type's share as large as keeps it no "
        "slower than the stage's slowest part"
    )


def _score(problem: Problem, schedule, stages, k: np.ndarray, joined: dict) -> float | None:
    """The plan's throughput (None where it breaks a constraint)."""
    kk = np.zeros(stages.valid.shape)
    kk[0, : len(k)] = k
    sc = score(problem, stages, kk)
    if joined:
        parts = {s: mixed_stage(problem, schedule, s, _own(problem, stages, kk, s, j), j) for s, j in joined.items()}
        sc = mixed_scores(problem, stages, sc, parts)
    return float(sc.throughput[0]) if sc.feasible[0] else None


def _own(problem: Problem, stages, k: np.ndarray, s: int, parts: tuple[Joined, ...]) -> tuple[int, int, int]:
    return int(stages.type[0, s]), int(k[0, s]), problem.batch_size - sum(p.samples for p in parts)


def _moves(problem: Problem, schedule, stages, k: np.ndarray, joined: dict):
    """Every way to join more replicas of another type to the slowest stage (:mod:`this module's <.>`
    rule), with as many more of its own type's idle units, as (replicas per stage, joined parts)."""
    from heterps_cli.mixed import balanced

    kk = np.zeros(stages.valid.shape)
    kk[0, : len(k)] = k
    sc = score(problem, stages, kk)
    slowest = int(np.argmin(sc.stage_throughput[0, : len(k)]))
    if joined:
        parts = {s: mixed_stage(problem, schedule, s, _own(problem, stages, kk, s, j), j) for s, j in joined.items()}
        sc = mixed_scores(problem, stages, sc, parts)
        slowest = int(np.argmin(sc.stage_throughput[0, : len(k)]))
    b = int(slowest)
    if stages.width[0, b] > 1 or stages.recompute[0, b]:
        return
    own_type = int(stages.type[0, b])
    free = problem.limits - sc.used[0]
    have = {p.type: p for p in joined.get(b, ())}
    for u in range(problem.n_types):
        if u == own_type:
            continue
        sources: list[tuple[int | None, int]] = [(None, int(free[u]))]  # (donor stage, units it can give)
        sources += [(s, int(k[s]) - 1) for s in range(len(k)) if s != b and stages.type[0, s] == u and s not in joined]
        for donor, most in sources:
            for e in _counts(most):
                for grow in (0, *_counts(int(free[own_type]))):  # its own type's idle units may join it too
                    move = (b, u, e, donor, grow)
                    yield from _joined_move(problem, schedule, stages, k, joined, balanced, move, have)


def _joined_move(problem, schedule, stages, k, joined, balanced: Callable, move: tuple, have):
    b, u, e, donor, grow = move
    other = [(p.type, p.replicas) for p in joined.get(b, ()) if p.type != u]
    count = e + (have[u].replicas if u in have else 0)
    parts = [(int(stages.type[0, b]), int(k[b]) + grow), *other, (u, count)]
    samples = balanced(problem, schedule, b, parts)
    if samples is None:
        return
    new_k = k.copy()
    new_k[b] += grow
    if donor is not None:
        new_k[donor] -= e
    new_joined = dict(joined)
    new_joined[b] = tuple(Joined(t, r, n) for (t, r), n in zip(parts[1:], samples[1:]))
    yield new_k, new_joined


def _counts(most: int) -> list[int]:
    """1, 2, 4, ... up to ``most``, and ``most`` itself."""
    out, e = [], 1
    while e < most:
        out.append(e)
        e *= 2
    return [*out, most] if most >= 1 else []


def what_if(problem: Problem, plan: Plan) -> list[dict]:
    """``plan --explain`` for a plan with mixed stages: with each type's limit one higher and one lower, the
    exact solver's plan over one-type stages with replicas of other types joined as :func:`mix` joins
    them (the same search as the plan's, at its micro-batch)."""
    from heterps_cli.schedulers.exact.scheduler import what_if as exact_what_if

    return exact_what_if(problem, plan, then=lambda there, found: mix(there, found)[0])
