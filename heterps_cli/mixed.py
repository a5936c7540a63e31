"""Stages whose replicas are of several types (docs/spec.md section 1i): each type's replicas train their own
share of every micro-batch, the stage waits for the slowest, and all of them sum their gradients in one
ring that runs at its slowest link.

A mixed stage is a one-type stage (its ``resource``, ``replicas``, now training ``samples`` of each
micro-batch) joined by replicas of other types (:class:`Joined`). Each part's terms are those of the same
layers as a one-type stage on the part's type (:func:`~heterps_cli.costmodel.split_stages` on the plan's
schedule with that stage's type changed), charged at the part's busiest replica's share.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from heterps_cli.costmodel import Scores, Stages, replicas_keep_rules, scores_of, split_stages, stage_ids
from heterps_cli.formulas import activations_held, mixed_step, share
from heterps_cli.problem import Problem


@dataclass(frozen=True)
class Joined:
    """Replicas of type ``type`` (an index) in another type's stage, training ``samples`` of each
    micro-batch between them."""

    type: int
    replicas: int
    samples: int


def joined_of(problem: Problem, stages) -> dict[int, tuple[Joined, ...]]:
    r"""A plan's joined parts by stage index (its :class:`~heterps_cli.formats.Stage`\ s), as
    :func:`~heterps_cli.plan.make_plan` takes them."""
    return {
        i: tuple(Joined(problem.types.index(j.resource), j.replicas, j.samples) for j in s.joined)
        for i, s in enumerate(stages)
        if s.joined
    }


@dataclass(frozen=True)
class Part:
    """One type's replicas of a mixed stage and their figures (the busiest replica's, per micro-batch)."""

    type: int
    replicas: int
    samples: int
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


def _as_types(problem: Problem, schedule, s: int, types: list[int]) -> tuple[Stages, int, int, int]:
    """The plan's schedule with stage ``s`` on each of ``types`` (one row each; tp 1, no recomputation),
    split; and the stage's first and last layer and the plan's stage count."""
    base = np.asarray(schedule, dtype=np.int64)
    _, sid = stage_ids(base[None, :])
    layers = np.flatnonzero(sid[0] == s)
    a, b = int(layers[0]), int(layers[-1])
    rows = np.repeat(base[None, :], len(types), axis=0)
    for r, t in enumerate(types):
        rows[r, a : b + 1] = t + problem.n_types * (s % 2)  # the stage's parity kept: the same cuts
    return split_stages(problem, rows), a, b, int(sid[0, -1]) + 1


def _memory_terms(problem: Problem, st: Stages, r: int, s: int, t: int, a: int, b: int) -> tuple[float, float, float]:
    """A replica's bytes of row ``r``'s part as section 1b counts them (also where no type has a memory
    limit): what every replica holds, what all the stage's replicas split, and the activations of the
    whole micro-batch in flight, which a replica holds its share of."""
    fixed, split = problem.state_parts
    activations = problem.held_once[a : b + 1].sum() + problem.shared_entry[a]
    held = activations_held(float(st.in_flight[r, s]), activations)
    return float(fixed[a : b + 1].sum() + problem.reserved_bytes[t]), float(split[a : b + 1].sum()), float(held)


def _measured_cap(problem: Problem, t: int, a: int, b: int) -> float:
    """Section 1f: the most samples a replica on ``t`` may train of layers ``a..b``."""
    return np.inf if problem.share_cap is None else float(problem.share_cap[a : b + 1, t].min())


def part_limits(problem: Problem, st: Stages, r: int, s: int, t: int, a: int, b: int) -> tuple[float, ...]:
    """What bounds a replica's share of row ``r``'s part on ``t`` (:func:`share_limit`): its memory terms
    and the largest size measured."""
    return (*_memory_terms(problem, st, r, s, t, a, b), _measured_cap(problem, t, a, b))


def share_limit(problem: Problem, t: int, limits: tuple[float, ...], replicas: int) -> float:
    """The most samples one replica of a part on ``t`` may train, ``replicas`` in the stage in all: the
    largest size measured (section 1f) and what its memory holds (``limits``: :func:`part_limits`)."""
    fixed, split, held, cap = limits
    room = problem.memory[t] * (1 + 1e-12) - fixed - split / replicas
    if room < 0:  # its state alone does not fit
        return 0.0
    most = np.inf if held <= 0 else np.floor(room * problem.batch_size / held * (1 + 1e-12))
    return float(min(cap, most, problem.batch_size))


def mixed_stage(problem: Problem, schedule, s: int, own: tuple[int, int, int], joined) -> MixedStage:
    """Stage ``s`` of ``schedule`` with ``own`` = (type, replicas, samples) and the ``joined`` parts."""
    wanted = [own, *((j.type, j.replicas, j.samples) for j in joined)]
    st, a, b, S = _as_types(problem, schedule, s, [t for t, _, _ in wanted])
    K = sum(k for _, k, _ in wanted)
    B = problem.batch_size
    parts = []
    for r, (t, k, n) in enumerate(wanted):
        q = float(share(n, k)) / B
        micro = float(st.micro_serial[r, s] + st.micro_parallel[r, s] * q)
        transfer = float(st.transfer[r, s] * q)
        fixed, split, held = _memory_terms(problem, st, r, s, t, a, b)
        memory = fixed + split / K + held * q
        cap = _measured_cap(problem, t, a, b)
        fits = bool(problem.runnable[a : b + 1, t].all()) and memory <= problem.memory[t] * (1 + 1e-12)
        fits &= n >= k and float(share(n, k)) <= cap
        parts.append(Part(t, k, n, micro - transfer, transfer, memory, fits))
    sync = float(max(st.sync[r, s] for r in range(len(wanted))))
    update = float(max(st.update[r, s] for r in range(len(wanted))))
    slowest = max(p.compute_s + p.transfer_s for p in parts)
    step, comm = mixed_step(problem.micro_batches, S, slowest, sync, K, update)
    return MixedStage(tuple(parts), float(step), float(comm), update, problem.step_samples / float(step))


def balanced(problem: Problem, schedule, s: int, parts: list[tuple[int, int]]) -> list[int] | None:
    """Section 1i: the samples of each micro-batch each part ``(type, replicas)`` of stage ``s`` trains so
    that its slowest replica is as fast as it can be: every replica a sample at least, none above what
    its type measured or its memory holds; None where the parts cannot train the micro-batch."""
    types = [t for t, _ in parts]
    st, a, b, _ = _as_types(problem, schedule, s, types)
    if any(not problem.runnable[a : b + 1, t].all() for t in types):
        return None
    K = sum(k for _, k in parts)
    most = [int(share_limit(problem, t, part_limits(problem, st, r, s, t, a, b), K)) for r, (t, _) in enumerate(parts)]
    times = [part_times(problem, st, r, s) for r in range(len(parts))]
    return least_slowest(times, most, [k for _, k in parts], problem.batch_size)


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
            used[0, p.type] += p.replicas
    return scores_of(problem, stages, k, thr_s, used, each, rate, sc.memory_miss)
