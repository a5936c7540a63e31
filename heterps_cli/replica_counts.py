"""How many replicas a stage needs, in closed form (docs/spec.md sections 1, 1b and 1f): the fewest
that reach a throughput (the Amdahl term ``serial + parallel / k``, :func:`min_replicas`), that hold
its memory (``fixed + split / k``, :func:`min_memory_replicas`), and that each train whole samples
(:func:`next_whole`). The cost model and the exact solver both provision with these."""

from __future__ import annotations

import numpy as np

from heterps_cli.formulas import SLACK, amdahl, share, stage_throughput, whole_samples
from heterps_cli.problem import Problem


def _need(serial, parallel, tau):
    """Smallest real k with ``serial + parallel / k <= tau`` (inf when no k can)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        gap = tau - serial
        k = np.ceil(parallel / gap)
    # parallel <= 0: more replicas never help (section 1d's all-reduce can outgrow what they divide)
    return np.where(parallel > 0, np.where(gap > 0, k, np.inf), np.where(serial + parallel <= tau, 1.0, np.inf))


def next_whole(batch, k):
    """The fewest replicas above ``k`` whose whole-sample share of a batch of ``batch`` is smaller
    (``k + 1`` unless ``k + 1`` replicas share it as ``k`` do; inf once ``k`` replicas take one
    sample each): the only counts between which a stage's time can fall (section 1)."""
    s = share(batch, k)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(s > 1, np.ceil(batch / (s - 1)), np.inf)


def _whole(k, holds, batch):
    """From ``k``, the fewest replicas for which ``holds`` under real division (so no fewer can hold
    under whole samples), the fewest for which it holds under whole samples, at most ``batch`` (inf if
    none). Between two counts that share a batch alike only what ``k`` divides as it is changes (section
    1d's all-reduce grows), so past ``k`` only :func:`next_whole`'s counts can hold first."""
    k = np.where(k <= batch, k, np.inf)
    while True:
        finite = np.isfinite(k)
        pending = finite & ~holds(np.where(finite, k, 1.0))
        if not pending.any():
            return k
        k = np.where(pending, next_whole(batch, np.where(finite, k, 1.0)), k)


def _whole_monotone(k, holds_at, batch):
    """As :func:`_whole`, for a test that never fails again once it holds (memory): bisected, as the
    fewest may fall between :func:`next_whole`'s counts. ``holds_at(cells, counts)`` tests the flat
    ``cells`` at ``counts``: each round tests only the cells still open (on a 2,000-layer grid most are
    settled at once, by the count under real division)."""
    lo = np.where(k <= batch, k, np.inf).ravel()
    cells = np.flatnonzero(np.isfinite(lo))
    top = holds_at(cells, np.full(len(cells), float(batch)))
    lo[cells[~top]] = np.inf
    cells = cells[top]
    at_once = holds_at(cells, lo[cells])  # where the count under real division holds, it is the fewest
    cells = cells[~at_once]
    low, high = lo[cells], np.full(len(cells), float(batch))
    while cells.size:
        mid = np.floor((low + high) / 2)
        ok = holds_at(cells, mid)
        high, low = np.where(ok, mid, high), np.where(ok, low, mid + 1)
        done = low >= high
        lo[cells[done]] = low[done]
        cells, low, high = cells[~done], low[~done], high[~done]
    return lo.reshape(np.shape(k))


def min_replicas(sc, pc, sd, pd, batch_size, target, at_least=1.0, ps=None, batch=None):
    """The smallest integer ``k >= at_least`` with ``stage_throughput(k) >= target`` (inf if none).

    Closed form from the Amdahl terms, then corrected by one step either way so
    the answer agrees bit for bit with :func:`stage_throughput`. ``at_least`` is
    memory's own lower bound (section 1b); the last check then also catches a
    section 1d stage that more replicas slow down, which that bound can push
    past the target. With ``batch``, a replica trains whole samples of it (``ps``: the part of
    ``pc`` that is per sample, all of it when not given) and at most ``batch`` replicas share it:
    the count under real division bounds it from below (:func:`_whole`).
    """
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # a tiny target: every k reaches it
        tau = np.divide(batch_size, np.asarray(target, dtype=float))

    def reaches(k):
        return stage_throughput(sc, pc, sd, pd, batch_size, k) >= target

    real = _least(np.maximum(_need(sc, pc, tau), _need(sd, pd, tau)), reaches, at_least)
    if batch is None:
        return real

    def reaches_whole(k):
        return stage_throughput(sc, pc, sd, pd, batch_size, k, ps, batch) >= target

    return _whole(real, reaches_whole, batch)


def fixed_replicas(sc, pc, sd, pd, batch_size, target, at_least, ps, batch, d):
    """Section 1k: ``d`` where ``d`` replicas reach ``target`` within memory (``at_least <= d``) and
    ``batch`` (``d <= batch``), inf elsewhere: every stage's replicas fixed at one data-parallel degree."""
    with np.errstate(invalid="ignore"):
        reached = stage_throughput(sc, pc, sd, pd, batch_size, float(d), ps, batch) >= target
    return np.where(
        reached & (np.asarray(at_least) <= d) & (batch is None or (d <= batch and batch % d == 0)), float(d), np.inf
    )


def memory_need(fixed, split, k, activations=None, batch=None):
    """Bytes one replica of ``k`` holds: ``fixed + split / k`` (section 1b), with ``batch`` the part of
    ``split`` that is ``activations`` charged at the replica's whole-sample share."""
    if batch is not None:
        split = whole_samples(split, activations, batch, k)
    with np.errstate(divide="ignore", invalid="ignore"):
        return amdahl(fixed, split, k)


def memory_fits(fixed, split, memory, k, activations=None, batch=None):
    """Does one replica of ``k`` hold :func:`memory_need` within ``memory`` (section 1b)?"""
    return memory_need(fixed, split, k, activations, batch) <= memory * (1 + SLACK)


def share_floor(problem: Problem) -> np.ndarray:
    """``[n, T]``: the fewest replicas a stage holding each layer on each type needs so that each trains
    at most the largest size measured there (section 1f), ``ceil(B / cap)``; 1 where no cap binds."""
    if problem.share_cap is None:
        return np.ones((problem.n_layers, problem.n_types))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(np.isfinite(problem.share_cap), np.ceil(problem.batch_size / problem.share_cap), 1.0)


def share_floor_spans(problem: Problem) -> np.ndarray | None:
    """``[i, j, t]``: :func:`share_floor` of stage ``j..i-1``, the most any of its layers needs; None where
    no cap binds (every stage may take one replica)."""
    if problem.share_cap is None:
        return None
    floor = share_floor(problem)
    n, T = floor.shape
    out = np.ones((n + 1, n + 1, T))
    for j in range(n):
        out[j + 1 :, j] = np.maximum.accumulate(floor[j:], axis=0)
    return out


def min_memory_replicas(fixed, split, memory, activations=None, batch=None):
    """The smallest integer ``k >= 1`` whose replicas each fit ``memory`` (inf if none; 1 without a limit).

    Closed form, then corrected by one step either way so that it agrees bit for
    bit with :func:`memory_fits`; with ``batch``, at most ``batch`` and under whole samples.
    """
    real = _least(_need(fixed, split, memory * (1 + SLACK)), lambda k: memory_fits(fixed, split, memory, k))
    if batch is None:
        return real
    shape = np.shape(real)
    given = activations is not None
    operands = [np.broadcast_to(x, shape) for x in (fixed, split, memory, activations if given else 0.0)]

    def holds_at(cells, k):
        f, s, m, a = (x[np.unravel_index(cells, shape)] for x in operands)
        return memory_fits(f, s, m, k, a if given else None, batch)

    return _whole_monotone(real, holds_at, batch)


def _least(closed_form, holds, at_least=1.0):
    """The smallest integer ``k >= at_least`` for which ``holds(k)`` (inf if none), from an Amdahl closed
    form that rounding may leave one off either way: corrected by one step so the answer agrees bit
    for bit with ``holds``. The last check also catches a ``holds`` that fails again above ``at_least``
    (a section 1d stage that more replicas slow down)."""
    k = np.maximum(closed_form, 1.0)
    finite = np.isfinite(k)
    safe = np.where(finite, k, 1.0)
    k = np.where(finite & ~holds(safe), k + 1, k)
    safe = np.where(finite, k, 2.0)
    lower = finite & (k > 1) & holds(np.maximum(safe - 1, 1))
    k = np.maximum(np.where(lower, k - 1, k), at_least)
    safe = np.where(np.isfinite(k), k, 1.0)
    return np.where(holds(safe), k, np.inf)
