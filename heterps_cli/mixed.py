"""Stages whose replicas are of several types (docs/spec.md section 1i): each type's replicas train their own
share of every micro-batch, the stage waits for the slowest, and all of them sum their gradients in one
ring that runs at its slowest link.

A mixed stage is a one-type stage (its ``resource``, ``replicas``, ``tp``, now training ``samples`` of each
micro-batch) joined by replicas of other types, each type at its own tensor-parallel degree (:class:`Joined`).
Each part's terms are those of the same layers as a one-type stage on the part's type at the part's degree
(:func:`~heterps_cli.stages.split_stages` on the plan's schedule with that stage's type and degree
changed), charged at the part's busiest replica's share.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from heterps_cli.costmodel import Scores, replicas_keep_rules, scores_of
from heterps_cli.formulas import activations_held, copies_held, mixed_step, share
from heterps_cli.problem import Problem
from heterps_cli.stages import Stages, split_stages, stage_ids, stage_label


@dataclass(frozen=True)
class Joined:
    """Replicas of type ``type`` (an index) in another type's stage, training ``samples`` of each
    micro-batch between them, each replica ``tp`` units (section 1h's degree, one of the problem's)."""

    type: int
    replicas: int
    samples: int
    tp: int = 1


def joined_of(problem: Problem, stages) -> dict[int, tuple[Joined, ...]]:
    r"""A plan's joined parts by stage index (its :class:`~heterps_cli.formats.Stage`\ s), as
    :func:`~heterps_cli.plan.make_plan` takes them."""
    return {
        i: tuple(Joined(problem.types.index(j.resource), j.replicas, j.samples, j.tp or 1) for j in s.joined)
        for i, s in enumerate(stages)
        if s.joined
    }


def with_own(problem: Problem, stages: Stages, k, s: int, joined) -> tuple[Joined, ...]:
    """Stage ``s``'s parts: its own replicas (``k[s]`` of its type at its degree, training what the
    ``joined`` parts leave of the micro-batch), then ``joined``."""
    B = problem.batch_size
    own = Joined(int(stages.type[0, s]), int(k[s]), B - sum(p.samples for p in joined), int(stages.width[0, s]))
    return (own, *joined)


@dataclass(frozen=True)
class Part:
    """One type's replicas of a mixed stage and their figures (the busiest replica's, per micro-batch)."""

    type: int
    replicas: int
    samples: int
    tp: int
    compute_s: float
    transfer_s: float
    memory: float  # bytes a replica holds
    fits: bool  # runnable, within memory, a share the profile measured (section 1f)


@dataclass(frozen=True)
class MixedStage:
    parts: tuple[Part, ...]  # the stage's own type first
    step_s: float
    comm_s: float  # the ring all-reduce over every replica, at the slowest part's pace
    update_s: float
    throughput: float


class Splits:
    """Stage ``s`` of one schedule on each of ``ways`` = (type, degree) (one row each, no recomputation),
    split; and the stage's first and last layer and the schedule's stage count. Kept per ``(s, ways)``:
    a climb (:mod:`~heterps_cli.schedulers.mixing`) asks for the same few hundreds of times."""

    def __init__(self, problem: Problem, schedule) -> None:
        self.problem = problem
        self.schedule = np.asarray(schedule, dtype=np.int64)
        self._kept: dict[tuple, tuple[Stages, int, int, int]] = {}

    def __call__(self, s: int, ways: list[tuple[int, int]]) -> tuple[Stages, int, int, int]:
        key = (s, tuple(ways))
        if key not in self._kept:
            self._kept[key] = self._split(s, ways)
        return self._kept[key]

    def _split(self, s: int, ways: list[tuple[int, int]]) -> tuple[Stages, int, int, int]:
        problem, base = self.problem, self.schedule
        _, sid = stage_ids(base[None, :])
        layers = np.flatnonzero(sid[0] == s)
        a, b = int(layers[0]), int(layers[-1])
        rows = np.repeat(base[None, :], len(ways), axis=0)
        T = problem.n_types
        for r, (t, d) in enumerate(ways):  # the stage's parity kept: the same cuts
            rows[r, a : b + 1] = int(stage_label(T, t, False, problem.degrees.index(d))) + T * (s % 2)
        return split_stages(problem, rows), a, b, int(sid[0, -1]) + 1


def _memory_terms(problem: Problem, st: Stages, r: int, s: int, t: int, d: int, a: int, b: int):
    """A unit's bytes of row ``r``'s part on ``t`` at degree ``d`` as section 1b counts them (also where no
    type has a memory limit): what every replica holds, what all the stage's replicas split, and the
    activations of the whole micro-batch in flight, which a replica holds its share of."""
    view = problem.view_at(d)
    fixed, split = view.state_parts
    activations = view.held_once[a : b + 1].sum() + view.shared_entry[a]
    held = activations_held(float(st.in_flight[r, s]), activations)
    casts = copies_held(float(st.in_flight[r, s]), view.cast_bytes[a : b + 1].sum())
    own = fixed[a : b + 1].sum() + casts + problem.reserved_bytes[t]
    return float(own), float(split[a : b + 1].sum()), float(held)


def _measured_cap(problem: Problem, t: int, d: int, a: int, b: int) -> float:
    """Section 1f: the most samples a replica on ``t`` at degree ``d`` may train of layers ``a..b``."""
    cap = problem.view_at(d).share_cap
    return np.inf if cap is None else float(cap[a : b + 1, t].min())


def runs_at(problem: Problem, t: int, d: int, a: int, b: int) -> bool:
    """Whether layers ``a..b`` run on ``t`` at degree ``d`` (section 1h: where every layer gives it)."""
    return bool(problem.view_at(d).runnable[a : b + 1, t].all())


def part_limits(problem: Problem, st: Stages, r: int, s: int, way: tuple[int, int], a: int, b: int):
    """What bounds a replica's share of row ``r``'s part on ``way`` = (type, degree) (:func:`share_limit`):
    its memory terms and the largest size measured."""
    t, d = way
    return (*_memory_terms(problem, st, r, s, t, d, a, b), _measured_cap(problem, t, d, a, b))


def share_limit(problem: Problem, t: int, limits: tuple[float, ...], replicas: int) -> float:
    """The most samples one replica of a part on ``t`` may train, ``replicas`` in the stage in all: the
    largest size measured (section 1f) and what its memory holds (``limits``: :func:`part_limits`)."""
    fixed, split, held, cap = limits
    room = problem.memory[t] * (1 + 1e-12) - fixed - split / replicas
    if room < 0:  # its state alone does not fit
        return 0.0
    most = np.inf if held <= 0 else np.floor(room * problem.batch_size / held * (1 + 1e-12))
    return float(min(cap, most, problem.batch_size))


def mixed_stage(problem: Problem, schedule, s: int, parts, splits: Splits | None = None) -> MixedStage:
    """Stage ``s`` of ``schedule`` made of ``parts`` (:class:`Joined`, its own type's first); ``splits``:
    the schedule's, where they are kept."""
    st, a, b, S = (splits or Splits(problem, schedule))(s, [(p.type, p.tp) for p in parts])
    K = sum(p.replicas for p in parts)
    B = problem.batch_size
    out = []
    for r, p in enumerate(parts):
        t, k, n, d = p.type, p.replicas, p.samples, p.tp
        q = float(share(n, k)) / B
        micro = float(st.micro_serial[r, s] + st.micro_parallel[r, s] * q)
        transfer = float(st.transfer[r, s] * q)
        fixed, split, held = _memory_terms(problem, st, r, s, t, d, a, b)
        memory = fixed + split / K + held * q
        fits = runs_at(problem, t, d, a, b) and memory <= problem.memory[t] * (1 + 1e-12)
        fits &= n >= k and float(share(n, k)) <= _measured_cap(problem, t, d, a, b)
        out.append(Part(t, k, n, d, micro - transfer, transfer, memory, fits))
    sync = float(max(st.sync[r, s] for r in range(len(parts))))
    update = float(max(st.update[r, s] for r in range(len(parts))))
    slowest = max(p.compute_s + p.transfer_s for p in out)
    step, comm = mixed_step(problem.micro_batches, S, slowest, sync, K, update)
    return MixedStage(tuple(out), float(step), float(comm), update, problem.step_samples / float(step))


def balanced(
    problem: Problem, schedule, s: int, parts: list[tuple[int, int, int]], splits: Splits | None = None
) -> list[int] | None:
    """Section 1i: the samples of each micro-batch each part ``(type, replicas, degree)`` of stage ``s``
    trains so that its slowest replica is as fast as it can be: every replica a sample at least, none
    above what its type measured or its memory holds; None where the parts cannot train the micro-batch."""
    st, a, b, _ = (splits or Splits(problem, schedule))(s, [(t, d) for t, _, d in parts])
    if any(not runs_at(problem, t, d, a, b) for t, _, d in parts):
        return None
    K = sum(k for _, k, _ in parts)
    most = [
        int(share_limit(problem, t, part_limits(problem, st, r, s, (t, d), a, b), K))
        for r, (t, _, d) in enumerate(parts)
    ]
    times = [part_times(problem, st, r, s) for r in range(len(parts))]
    return least_slowest(times, most, [k for _, k, _ in parts], problem.batch_size)


def part_times(problem: Problem, st: Stages, r: int, s: int) -> np.ndarray:
    """``[B]``: a replica's time per micro-batch of row ``r``'s stage ``s`` at a share of 1, 2, ... B samples."""
    B = problem.batch_size
    return st.micro_serial[r, s] + st.micro_parallel[r, s] * np.arange(1, B + 1) / B


def least_slowest(times: list[np.ndarray], most: list[int], replicas: list[int], B: int) -> list[int] | None:
    """The samples of a micro-batch of ``B`` each part trains (``replicas[p]`` replicas, each at most
    ``most[p]`` samples, taking ``times[p][n - 1]`` at a share of ``n``) that make the slowest replica
    fastest; None where they cannot cover it. A part's time grows with its share, so the least slowest
    time is one of the shares' times: the least at which the parts' largest shares cover ``B``."""
    if any(m < 1 for m in most) or sum(k * m for k, m in zip(replicas, most)) < B:
        return None
    taus = np.unique(np.concatenate([t[:m] for t, m in zip(times, most)]))

    def largest(tau: float) -> list[int]:  # each part's largest share within tau
        return [int(np.searchsorted(t[:m], tau, side="right")) for t, m in zip(times, most)]

    def covers(tau: float) -> bool:
        x = largest(tau)
        return min(x) >= 1 and sum(k * y for k, y in zip(replicas, x)) >= B

    lo, hi = 0, len(taus) - 1  # covers(taus[hi]): every part at its most
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if covers(taus[mid]) else (mid + 1, hi)
    x = largest(taus[lo])
    samples = [k * y for k, y in zip(replicas, x)]
    extra = sum(samples) - B
    for i in np.argsort([-t[y - 1] for t, y in zip(times, x)]):  # the slowest part gives back first
        give = min(extra, samples[i] - replicas[i])
        samples[i] -= give
        extra -= give
    return samples


def mixed_scores(
    problem: Problem, stages: Stages, sc: Scores, mixed: dict[int, MixedStage], rate: np.ndarray | None = None
) -> Scores:
    """``sc`` (one schedule's scores) with the ``mixed`` stages' throughputs, every part's units, and each
    mixed stage held to its parts' rules where a one-type stage is held to its replica count's; priced at
    ``rate`` (USD an hour, a rental's), else its units' (with nodes: the cheapest rental holding them)."""
    thr_s = sc.stage_throughput.copy()
    used = sc.used.copy()
    k = sc.replicas
    each = replicas_keep_rules(problem, stages, k)
    for s, m in mixed.items():
        thr_s[0, s] = m.throughput
        each[0, s] = all(p.fits for p in m.parts)
        for p in m.parts[1:]:
            used[0, p.type] += p.replicas * p.tp
    return scores_of(problem, stages, k, thr_s, used, each, rate, sc.memory_miss)
