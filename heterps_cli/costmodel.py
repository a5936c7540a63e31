"""The HeterPS cost model (docs/spec.md section 1), vectorised over batches of schedules.

A *schedule* is an int array ``[n_layers]`` of resource-type indices; a batch
is ``[B, n_layers]``. Stages are maximal runs of one type. For a stage,

    CT(k) = sc + pc / k      DT(k) = sd + pd / k      ET(k) = max(CT, DT)

where ``sc, pc, sd, pd`` are the summed serial/parallel halves of its layers'
OCT and ODT (``Problem.parts``); this is docs/spec.md section 1's per-layer Amdahl sum, regrouped.

Exact provisioning rests on one fact: an optimal plan's bottleneck throughput
``X`` equals ``thr_s(k)`` for some stage ``s`` and count ``k``, and once ``X`` is
fixed every stage's cheapest sufficient ``k`` is independent of the others
(:func:`min_replicas`, a closed form). Cost ``= W * rate(X) / X`` with ``rate`` a
non-decreasing step function of ``X``, so on each step the right end is best.
:func:`provision` walks those right ends upwards: evaluate at ``X``, jump to just
above the plan's actual throughput, stop when the limits break (feasibility only
shrinks as ``X`` grows) or when a lower bound on every later cost exceeds the
best found. Each jump adds at least one replica, so the walk is finite.

docs/spec.md section 1b (optional fields) fits in without changing any of this: a
stage's boundary transfer ``X_s`` joins its parallel communication ``pd`` (it is
divided by ``k``), and its memory need ``fixed + split / k`` gives a second
closed-form lower bound on ``k`` (:func:`min_memory_replicas`), so "the fewest
replicas reaching ``X``" becomes the larger of the two. Throughput and memory
both only improve as ``k`` grows, so every argument above still holds.

docs/spec.md section 1d (a pipeline schedule of ``M`` micro-batches per step) fits in
the same way: a stage's time per step ``(M + S - 1) c(k) + 2 Y (1 - 1/k) + U`` is
again ``serial + parallel / k``, with ``parallel`` negative when the gradient
all-reduce outgrows the compute replicas divide (then one replica is fastest,
and :func:`_need` says so). Its step time ``k T(k) = k serial + parallel`` still
never falls as ``k`` grows, which is all :func:`cost_lower_bound` needs. ``S`` and a
stage's place in the pipeline are known for a whole schedule; the exact solver,
which builds schedules stage by stage, carries them (:mod:`.schedulers.exact.pipeline`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from heterps_cli.formulas import (
    activations_held,
    amdahl,
    pipeline_step,
    run_cost,
    sample_hours,
    share,
    stage_throughput,
    stretch,
    whole_samples,
)
from heterps_cli.objective import Objective
from heterps_cli.problem import SLACK, Problem


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


def _whole_monotone(k, holds, batch):
    """As :func:`_whole`, for a ``holds`` that never fails again once it holds (memory): bisected, as the
    fewest may fall between :func:`next_whole`'s counts."""
    lo = np.where(k <= batch, k, np.inf)
    top = holds(np.full(np.shape(lo), float(batch)))
    lo = np.where(np.isfinite(lo) & ~top, np.inf, lo)
    hi = np.where(np.isfinite(lo), float(batch), lo)
    while True:
        open_ = np.isfinite(lo) & (lo < hi)
        if not open_.any():
            return lo
        mid = np.where(open_, np.floor((lo + hi) / 2), 1.0)
        ok = holds(mid)
        hi = np.where(open_ & ok, mid, hi)
        lo = np.where(open_ & ~ok, mid + 1, lo)


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
    return _whole_monotone(real, lambda k: memory_fits(fixed, split, memory, k, activations, batch), batch)


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


@dataclass
class Stages:
    """A batch of schedules split into stages, padded to ``S`` columns (``valid`` marks real ones)."""

    schedules: np.ndarray  # [B, n]
    sc: np.ndarray  # [B, S]
    pc: np.ndarray
    sd: np.ndarray
    pd: np.ndarray
    type: np.ndarray  # [B, S] type index, 0 in padding
    first: np.ndarray  # [B, S] first layer index
    last: np.ndarray  # [B, S] last layer index
    valid: np.ndarray  # [B, S]
    runnable: np.ndarray  # [B] every layer is on a type that can run it
    # Section 1b (zeros, zeros, zeros and ones when the cluster gives no bandwidth or memory):
    transfer: np.ndarray  # [B, S] X_s, bytes moved at the boundaries / bandwidth (already in pd)
    mem_fixed: np.ndarray  # [B, S] bytes every replica holds
    mem_split: np.ndarray  # [B, S] bytes split across the replicas
    min_k: np.ndarray  # [B, S] the fewest replicas whose memory fits (inf: none within any count)
    # Section 1d (zeros without a pipeline schedule): the parts of a stage's step time.
    micro_serial: np.ndarray  # [B, S] compute per micro-batch that replicas do not divide
    micro_parallel: np.ndarray  # [B, S] compute and boundary transfer per micro-batch that they do
    sync: np.ndarray  # [B, S] Y: the gradient all-reduce between two replicas, per step
    update: np.ndarray  # [B, S] U: the optimiser step, per step
    in_flight: np.ndarray  # [B, S] micro-batches whose activations a replica holds at once (1 without)
    # Section 1's whole samples: the parts the busiest replica's share of a batch sets.
    ps: np.ndarray  # [B, S] the part of pc that is per sample (pc itself but under section 1d)
    mem_act: np.ndarray  # [B, S] the part of mem_split that is activations
    recompute: np.ndarray  # [B, S] section 1g: the stage recomputes its activations
    width: np.ndarray  # [B, S] section 1h: units per replica (its tensor-parallel degree)

    def take(self, rows) -> Stages:
        return Stages(*(getattr(self, f)[rows] for f in self.__dataclass_fields__))


PARITIES = 3  # a stage's label is its type plus p x n_types, p < PARITIES, so two stages on one type stay two


def recompute_label(n_types: int) -> int:
    """Section 1g: what a stage's label adds when the stage recomputes its activations."""
    return PARITIES * n_types


def degree_label(n_types: int, index: int) -> int:
    """Section 1h: what a stage's label adds when the stage runs at the ``index``-th of the problem's
    tensor-parallel degrees (0: tp 1)."""
    return 2 * PARITIES * n_types * index


def stage_label(n_types: int, t, again, index) -> np.ndarray:
    """The label of a stage on type ``t``, recomputing where ``again``, at degree ``index`` (elementwise)."""
    return (
        np.asarray(t, dtype=np.int64)
        + recompute_label(n_types) * np.asarray(again, dtype=np.int64)
        + degree_label(n_types, 1) * np.asarray(index, dtype=np.int64)
    )


def label_parts(n_types: int, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A schedule's labels read back: each layer's type, whether its stage recomputes (section 1g), and
    the index of its stage's tensor-parallel degree (section 1h)."""
    labels = np.asarray(labels, dtype=np.int64)
    return labels % n_types, (labels // recompute_label(n_types)) % 2 == 1, labels // degree_label(n_types, 1)


def labelled(n_types: int, stages) -> np.ndarray:
    """A schedule that keeps apart the ``stages`` given as ``(first, end, type)`` (``end`` exclusive,
    in order): each layer holds its stage's type, plus ``n_types`` on every other stage, so that two
    neighbouring stages on one type stay two (:func:`split_stages` reads a label modulo the types;
    a schedule of plain types makes each maximal run one stage, as the papers do)."""
    sched = np.zeros(max(end for _, end, _ in stages), dtype=np.int64)
    for s, (first, end, t) in enumerate(stages):
        sched[first:end] = t + n_types * (s % 2)
    return sched


def schedule_of_stages(problem: Problem, stages) -> np.ndarray:
    """:func:`labelled` for a plan's ``stages`` (each with ``first``, ``last``, ``resource``, one of
    the problem's types, ``recompute`` and ``tp``), so that the cost model reads them as the plan cuts
    them. ValueError for a degree the problem does not offer."""
    T, degrees = problem.n_types, problem.degrees
    out = []
    for s in stages:
        if (s.tp or 1) not in degrees:
            raise ValueError(f"tp {s.tp} is not one of the degrees the profile offers ({', '.join(map(str, degrees))})")
        label = stage_label(T, problem.types.index(s.resource), bool(s.recompute), degrees.index(s.tp or 1))
        out.append((s.first, s.last + 1, int(label)))
    return labelled(T, out)


def stage_ids(schedules: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``[B, n]`` schedules: where a stage starts (bool), and each layer's stage index."""
    starts = np.ones(schedules.shape, dtype=bool)
    starts[:, 1:] = schedules[:, 1:] != schedules[:, :-1]
    return starts, np.cumsum(starts, axis=1) - 1


def _transfer(problem: Problem, valid, first, last, stype, sdegree) -> np.ndarray:
    """Sections 1b, 1h: ``X_s``, each stage's boundary bytes at its type's and degree's
    :attr:`~Problem.boundary_rate` (zeros when the cluster gives no bandwidth: the paper's model pays
    nothing for this)."""
    if not np.isfinite(problem.bandwidth).any():
        return np.zeros(valid.shape)
    bytes_ = problem.boundary_bytes
    rate = np.stack([view.boundary_rate for view in problem.views])[sdegree, stype]
    return np.where(valid, (bytes_[first] + bytes_[last + 1]) * rate, 0.0)


def _pipelined(problem: Problem, micro, sid: np.ndarray, valid: np.ndarray):
    """Section 1d: each stage's step as ``serial + parallel / k`` from its ``micro`` terms, and the
    micro-batches in flight on it (``min(S - s, M)`` for stage ``s`` of ``S``)."""
    count = sid[:, -1:] + 1  # S of each row
    S = valid.shape[1]
    in_flight = np.where(valid, np.minimum(count - np.arange(S)[None, :], problem.micro_batches), 1.0)
    serial, parallel, per_sample = pipeline_step(problem.micro_batches, count, *micro)
    return serial, parallel, per_sample, in_flight


def _memory(
    problem: Problem, flat: np.ndarray, shape: tuple[int, int], valid, first, stype, in_flight, recompute, pick
):
    """Section 1b: per stage, the bytes every replica holds, the bytes split across them (with section
    1d's micro-batches in flight), the activations among those, and the fewest replicas whose memory
    fits. ``pick(view -> [n] array)``: each layer's figure at its stage's degree (section 1h)."""
    B, S = shape

    def summed(part):
        return np.bincount(flat, weights=part.ravel(), minlength=B * S).reshape(B, S)

    # A stage holds once what two of its layers save; its first layer's share is its own copy.
    shared = pick(lambda v: v.shared_bytes)
    entry = np.where(valid, np.take_along_axis(shared, np.where(valid, first, 0), axis=1), 0.0)
    with np.errstate(over="ignore", invalid="ignore"):
        activations = summed(pick(lambda v: v.held_once)) + entry
        if problem.pipelined:  # the activations of in_flight micro-batches (section 1g: their inputs)
            inputs = np.where(valid, problem.stage_inputs[np.where(valid, first, 0)], 0.0)
            activations = np.where(
                recompute, activations_held(in_flight, activations, inputs), activations_held(in_flight, activations)
            )
        mem_fixed = summed(pick(lambda v: v.state_parts[0]))
        mem_split = summed(pick(lambda v: v.state_parts[1])) + activations
    if problem.reserved is not None:
        mem_fixed = mem_fixed + np.where(valid, problem.reserved_bytes[stype], 0.0)
    fewest = min_memory_replicas(mem_fixed, mem_split, problem.memory[stype], activations, problem.batch_size)
    return mem_fixed, mem_split, activations, np.where(valid, fewest, 1.0)


def split_stages(problem: Problem, schedules) -> Stages:
    """Group each schedule's layers into stages and sum their cost terms, all in numpy. A stage is a
    maximal run of one label: a type, plus ``n_types`` on every other stage (:func:`labelled`), plus
    its recomputation and tensor-parallel degree (:func:`stage_label`)."""
    starts, sid, sched, again, degree = _stages_and_labels(problem, schedules)
    B, S = sid.shape[0], int(sid.max()) + 1
    flat = (np.arange(B)[:, None] * S + sid).ravel()
    pick = _Picker(problem.views, sched, degree)
    per_layer = [pick(lambda v, i=i: v.parts[i]) for i in range(4)]  # [B, n] each
    if again.any():  # section 1g: a recomputing stage's compute holds its forward twice
        per_layer[:2] = [
            np.where(again, pick(lambda v, i=i: v.recompute_parts[i]), c) for i, c in enumerate(per_layer[:2])
        ]
    sc, pc, sd, pd = (np.bincount(flat, weights=part.ravel(), minlength=B * S).reshape(B, S) for part in per_layer)
    at = _StageOf(sid, S)
    stype, recompute, sdegree = at.value(sched), at.value(again), at.value(degree)
    first, last = at.first(starts), at.last()
    valid = np.arange(S)[None, :] <= sid[:, -1:]
    runnable = _runnable(pick, again)
    transfer = _transfer(problem, valid, first, last, stype, sdegree)
    zeros: np.ndarray = np.zeros((B, S))
    in_flight, ps = np.ones((B, S)), pc
    micro: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] = (zeros, zeros, zeros, zeros)
    if problem.pipelined:
        micro = _micro_terms(problem, pick, flat, (sc, pc), valid, stype, first, last, transfer)
        sc, pc, ps, in_flight = _pipelined(problem, micro, sid, valid)
        sd = pd = zeros
    else:
        pd = pd + transfer
    mem_fixed, mem_split, mem_act, min_k = _memory_terms(problem, flat, valid, first, stype, in_flight, recompute, pick)
    return Stages(
        sched,
        sc,
        pc,
        sd,
        pd,
        stype,
        first,
        last,
        valid,
        runnable,
        transfer,
        mem_fixed,
        mem_split,
        min_k,
        *micro,
        in_flight,
        ps,
        mem_act,
        recompute,
        problem.widths[sdegree],
    )


def _stages_and_labels(problem: Problem, schedules):
    """Where each schedule's stages start and each layer's stage (:func:`stage_ids`), then each layer's
    type, recomputation and tensor-parallel degree (:func:`label_parts`), checked against the problem."""
    sched = np.atleast_2d(np.asarray(schedules, dtype=np.int64))
    if sched.shape[1] != problem.n_layers:
        raise ValueError(f"schedules have {sched.shape[1]} layers, the problem {problem.n_layers}")
    starts, sid = stage_ids(sched)
    sched, again, degree = label_parts(problem.n_types, sched)
    if degree.max(initial=0) >= len(problem.views):
        raise ValueError(
            f"a label names tensor-parallel degree {int(degree.max())}, the problem has {len(problem.views)}"
        )
    return starts, sid, sched, again, degree


class _Picker:
    """``pick(get)``: ``[B, n]``, each layer's figure (``get(view)``, ``[n, T]`` or ``[n]``) on its type at its
    stage's tensor-parallel degree."""

    def __init__(self, views, sched: np.ndarray, degree: np.ndarray):
        self.views, self.sched, self.degree = views, sched, degree
        self.layers = np.arange(sched.shape[1])[None, :]

    def __call__(self, get) -> np.ndarray:
        out = None
        for j, view in enumerate(self.views):
            here = self.degree == j
            if j and not here.any():
                continue
            part = get(view)
            value = part[self.layers, self.sched] if part.ndim == 2 else part[self.layers]
            value = np.broadcast_to(value, self.sched.shape)
            out = value if out is None else np.where(here, value, out)
        assert out is not None
        return out


class _StageOf:
    """Per-layer ``[B, n]`` figures as per-stage ``[B, S]`` ones (stage ids ``sid``)."""

    def __init__(self, sid: np.ndarray, S: int):
        B, n = sid.shape
        self.sid, self.shape = sid, (B, S)
        self.rows = np.broadcast_to(np.arange(B)[:, None], (B, n))
        self.layers = np.broadcast_to(np.arange(n)[None, :], (B, n))

    def value(self, per_layer: np.ndarray) -> np.ndarray:
        """Each stage's value, which all its layers share (a later layer's written over an earlier's)."""
        out = np.zeros(self.shape, dtype=per_layer.dtype)
        out[self.rows, self.sid] = per_layer
        return out

    def first(self, starts: np.ndarray) -> np.ndarray:
        out = np.zeros(self.shape, dtype=np.int64)
        out[self.rows[starts], self.sid[starts]] = self.layers[starts]
        return out

    def last(self) -> np.ndarray:
        return self.value(self.layers.astype(np.int64))


def _runnable(pick, again: np.ndarray) -> np.ndarray:
    """``[B]``: whether every layer runs where its schedule puts it, and, in a recomputing stage (section
    1g, under a pipeline), has a forward time."""
    runnable = np.asarray(pick(lambda v: v.runnable).all(axis=1))
    if again.any():
        runnable &= (~again | pick(lambda v: v.recomputable & v.can_recompute)).all(axis=1)
    return runnable


def _memory_terms(problem: Problem, flat, valid, first, stype, in_flight, recompute, pick):
    """Section 1b's memory per stage (what every replica holds, what splits across them, the activations)
    and the fewest replicas each stage needs, for its memory and (section 1f) so that no replica trains
    above a size measured on its type."""
    B, S = valid.shape
    zeros = np.zeros((B, S))
    mem_fixed, mem_split, mem_act, min_k = zeros, zeros, zeros, np.ones((B, S))
    if np.isfinite(problem.memory).any():
        mem_fixed, mem_split, mem_act, min_k = _memory(
            problem, flat, (B, S), valid, first, stype, in_flight, recompute, pick
        )
    if any(view.share_cap is not None for view in problem.views):
        most = np.ones(B * S)
        np.maximum.at(most, flat, pick(share_floor).ravel())
        min_k = np.maximum(min_k, np.where(valid, most.reshape(B, S), 1.0))
    return mem_fixed, mem_split, mem_act, min_k


def _micro_terms(problem: Problem, pick, flat, computes, valid, stype, first, last, transfer):
    """Section 1d's terms per stage and micro-batch: serial and parallel compute (with the stage's fixed
    start and its boundary messages' latency, and its transfer), the gradient sync with its latency, and
    the update."""
    B, S = valid.shape
    sc, pc = computes
    sync, update = (
        np.bincount(flat, weights=pick(get).ravel(), minlength=B * S).reshape(B, S)
        for get in (lambda v: v.odt, lambda v: v.update_times)
    )
    start, latency, message = (np.where(valid, fixed[stype], 0.0) for fixed in problem.fixed_costs)
    messages = problem.boundary_messages[first] + problem.boundary_messages[last + 1]
    # odt: the all-reduce between two replicas (beta unused)
    return sc + start + message * messages, pc + transfer, sync + latency, update


@dataclass
class Scores:
    """Every figure of docs/spec.md section 1 for a batch of provisioned schedules."""

    replicas: np.ndarray  # [B, S] (0 in padding)
    stage_throughput: np.ndarray  # [B, S] (inf in padding)
    throughput: np.ndarray  # [B]
    bottleneck: np.ndarray  # [B] stage index
    used: np.ndarray  # [B, T] units of each type
    rate: np.ndarray  # [B] USD per hour
    time_s: np.ndarray  # [B]
    cost: np.ndarray  # [B] USD
    within_limits: np.ndarray  # [B] units within the limits, and every replica within its memory
    feasible: np.ndarray  # [B] every constraint of the problem holds
    memory_miss: np.ndarray  # [B] summed relative memory excess of the stages (0 when all fit)


def used_per_type(problem: Problem, stages: Stages, replicas) -> np.ndarray:
    """Units of each type per schedule: ``[B, T]``."""
    B, T = stages.type.shape[0], problem.n_types
    index = (np.arange(B)[:, None] * T + stages.type).ravel()
    weights = np.where(stages.valid, replicas * stages.width, 0.0).ravel()  # section 1h: a replica's units
    return np.bincount(index, weights=weights, minlength=B * T).reshape(B, T)


def most_replicas(problem: Problem, stages: Stages) -> np.ndarray:
    """``[B, S]``: the replicas each stage's type holds for it alone (section 1h: its units over its width)."""
    return (problem.limits[stages.type] // stages.width).astype(float)


def stage_throughputs(problem: Problem, stages: Stages, replicas) -> np.ndarray:
    """``[B, S]`` samples/s of every stage with the given replica counts (inf in padding)."""
    k = np.where(stages.valid, replicas, 1.0)
    thr = stage_throughput(
        stages.sc, stages.pc, stages.sd, stages.pd, problem.step_samples, k, stages.ps, problem.batch_size
    )
    return np.where(stages.valid, thr, np.inf)


def score(problem: Problem, stages: Stages, replicas, rate: np.ndarray | None = None) -> Scores:
    """Throughput, time, cost and feasibility of schedules with the given replica counts (``rate``:
    USD an hour of each schedule's rental, where it is not the cheapest holding its units)."""
    k = np.where(stages.valid, np.asarray(replicas, dtype=float), 0.0)
    each = replicas_keep_rules(problem, stages, k)
    miss = np.zeros(len(k))
    if np.isfinite(problem.memory).any():
        with np.errstate(divide="ignore", invalid="ignore"):
            need = memory_need(
                stages.mem_fixed, stages.mem_split, np.maximum(k, 1.0), stages.mem_act, problem.batch_size
            )
            over = np.where(stages.valid, np.maximum(need / problem.memory[stages.type] - 1.0, 0.0), 0.0)
        miss = np.nan_to_num(over, nan=0.0, posinf=1e300).sum(axis=1)
    thr_s = stage_throughputs(problem, stages, k)
    return scores_of(problem, stages, k, thr_s, used_per_type(problem, stages, k), each, rate, miss)


def replicas_keep_rules(problem: Problem, stages: Stages, k) -> np.ndarray:
    """``[B, S]``: each stage has the replicas its memory and measured sizes need (``min_k``), and no more
    than the batch has samples (section 1: whole samples)."""
    return (k >= np.maximum(stages.min_k, 1)) & (k <= problem.batch_size)


def scores_of(problem: Problem, stages: Stages, k, thr_s, used, each, rate, miss) -> Scores:
    """Section 1's plan figures from each stage's throughput (``thr_s``), the units of each type
    (``used``) and whether each stage's replicas keep its rules (``each``, ``[B, S]``; padding ignored):
    what :func:`score` and a plan with mixed stages (:func:`~heterps_cli.mixed.mixed_scores`) share."""
    bottleneck = np.argmin(thr_s, axis=1)
    thr = thr_s[np.arange(len(k)), bottleneck]
    if rate is None:
        rate = used @ problem.prices if problem.nodes is None else problem.nodes.cover(used)[0]
    with np.errstate(divide="ignore", invalid="ignore"):
        time_s = problem.work / thr
        cost = run_cost(problem.work, thr, rate)
    fits = (used <= problem.limits[None, :]).all(axis=1)
    within = np.asarray(fits & np.where(stages.valid, each, True).all(axis=1))
    feasible = stages.runnable & within & meets_targets(problem, thr, cost)
    return Scores(k, thr_s, thr, bottleneck, used, rate, time_s, cost, within, feasible, miss)


def throughput_floor(problem: Problem) -> float:
    """The least throughput that meets ``min_throughput``, with :data:`SLACK` slack.

    The slack matters when the target equals a plan's throughput in exact
    arithmetic (say, the throughput of one replica per stage) and the float sums
    land one ulp below it.
    """
    return problem.min_throughput * (1 - SLACK)


def meets_targets(problem: Problem, throughput, cost):
    ok = np.asarray(throughput) >= throughput_floor(problem)
    if problem.max_cost is not None:
        ok &= np.asarray(cost) <= problem.max_cost * (1 + SLACK)
    return ok


def cost_lower_bound(price, replicas, throughput, batch):
    """Per stage, a lower bound on ``price * k' / X'`` for every target ``X' >= X``.

    ``replicas`` are the fewest reaching ``X`` and ``throughput`` what they give.
    Any ``X' >= X`` needs ``k' >= replicas`` with ``thr(k') >= X'``, so
    ``k'/X' >= k'/thr(k') = k' ET(k') / B0 >= replicas / throughput`` because
    ``k ET(k) = max(k sc + pc, k sd + pd)`` never falls as ``k`` grows. Summed
    over a plan's stages this bounds the cost of every faster plan (times W/3600).

    Under whole samples (section 1) that holds of the times under real division, which are at least
    the whole-sample times over :func:`~heterps_cli.formulas.stretch` (its serial terms are never
    negative), hence the division by it: 1 where ``replicas`` divide ``batch``.
    """
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(price > 0, price * replicas / throughput / stretch(batch, replicas), 0.0)


def better(problem: Problem, cost, thr, best_cost, best_thr):
    """Is (cost, thr) a better plan than (best_cost, best_thr) under the problem's objective?"""
    if problem.objective is Objective.TIME:
        return (thr > best_thr) | ((thr == best_thr) & (cost < best_cost))
    return (cost < best_cost) | ((cost == best_cost) & (thr > best_thr))


def _replicas_at(problem: Problem, stages: Stages, target) -> tuple[np.ndarray, np.ndarray]:
    """Fewest replicas per stage reaching ``target`` (per row), 0 in padding; and whether they fit the limits."""
    limit = most_replicas(problem, stages)
    k = min_replicas(
        stages.sc,
        stages.pc,
        stages.sd,
        stages.pd,
        problem.step_samples,
        np.asarray(target)[:, None],
        stages.min_k,
        stages.ps,
        problem.batch_size,
    )
    k = np.where(stages.valid, np.where(k <= limit, k, np.inf), 0.0)
    ok = stages.runnable & np.isfinite(k).all(axis=1)
    k = np.where(np.isfinite(k), k, 0.0)
    ok &= (used_per_type(problem, stages, k) <= problem.limits).all(axis=1)
    return k, ok


def _step_past(problem: Problem, stages: Stages, k, thr_s, thr) -> tuple[np.ndarray, np.ndarray]:
    """The fewest replicas just above the plan ``k`` (stage throughputs ``thr_s``, throughput ``thr``),
    given that ``k`` are the fewest reaching something at most ``thr``: on each bottleneck stage the
    next count with a smaller share of the batch (:func:`next_whole`, one more unless that one shares
    it alike), the others as they are; and whether those fit the limits. Where one more gains a stage
    nothing, the plan is dearer and as fast (the closed form would say no count reaches past ``thr``).
    Two numpy calls where :func:`_replicas_at` makes forty."""
    ahead = np.where(stages.valid & (thr_s == thr[:, None]), next_whole(problem.batch_size, np.maximum(k, 1.0)), k)
    whole = np.isfinite(ahead).all(axis=1)  # a bottleneck whose replicas take one sample each cannot step
    ahead = np.where(np.isfinite(ahead), ahead, k)
    return ahead, whole & np.asarray((used_per_type(problem, stages, ahead) <= problem.limits).all(axis=1))


# fastest_replicas bisects to this relative width, then steps exactly to the fastest plan: the answer is the
# same at any width (checked on 2,000 random schedules of each benchmark instance, from 1e-13 to 1e-2), the
# time is not (1e-13: 1.14 s for those schedules; 1e-6: 0.59 s; 1e-2: 10 s, each step adds one replica to a
# bottleneck stage). With the steps made by adding those replicas instead of by the closed form: 1e-6 0.61 s,
# 1e-5 0.55 s, 1e-4 0.73 s; on the batches of a chain64x4-tight rl run 3.7 s (closed-form steps, 1e-6),
# 3.2 s (1e-5), 3.1 s (1e-4), 5.7 s (1e-3).
BRACKET = 1e-5


def fastest_replicas(problem: Problem, stages: Stages) -> np.ndarray:
    """Per schedule, the replicas of its fastest plan within the limits, cheapest among the fastest.

    Reaching a throughput only gets harder as it grows, so every row bisects
    (geometrically, all rows at once) between one replica per stage and every
    stage on all its type's units; then it takes the fewest replicas reaching the
    bracket's floor and steps past that plan's own throughput while it can (one
    more replica on each bottleneck stage). Rows where one replica per stage
    already breaks a limit keep one per stage.
    """
    B = stages.type.shape[0]
    ones = np.where(stages.valid, 1.0, 0.0)
    k, fits = _replicas_at(problem, stages, np.zeros(B))
    lo = stage_throughputs(problem, stages, np.maximum(k, 1.0)).min(axis=1)
    hi = stage_throughputs(problem, stages, most_replicas(problem, stages)).min(axis=1)
    hi = np.maximum(hi, lo)
    for _ in range(80):
        open_ = fits & (hi > lo * (1 + BRACKET))
        if not open_.any():
            break
        mid = np.sqrt(lo * hi)
        _, ok = _replicas_at(problem, stages, mid)
        lo = np.where(open_ & ok, mid, lo)
        hi = np.where(open_ & ~ok, mid, hi)
    k, ok = _replicas_at(problem, stages, lo)
    k = np.where((fits & ok)[:, None], k, ones)
    thr_s = stage_throughputs(problem, stages, np.maximum(k, 1.0))
    thr = thr_s.min(axis=1)
    for _ in range(int(problem.limits.sum()) + 1):  # exact finish: a handful of steps at most
        # A step that gains nothing, or breaks a limit, ends the row.
        ahead, within = _step_past(problem, stages, k, thr_s, thr)
        ahead_s = stage_throughputs(problem, stages, np.maximum(ahead, 1.0))
        ahead_thr = ahead_s.min(axis=1)
        ok = fits & (ahead_thr > thr) & within
        if not ok.any():
            break
        k = np.where(ok[:, None], ahead, k)
        thr_s = np.where(ok[:, None], ahead_s, thr_s)
        thr = np.where(ok, ahead_thr, thr)
    return k


# provision's walk (objective cost) seeds the rows still walking after SEED_AFTER plans with the cheapest
# of SEEDS plans spread over their range of throughputs. Most walks end at once where limits bind, so
# the seed waits for those to drop out; on a 64 x 3 rl run's batches the rest walked 39 plans on average,
# the best one found at the 32nd, and every plan before it was walked one at a time because the skip
# had nothing cheap to measure against. Measured on those batches: 2.5 s without, 2.1 s with (8 seeds: 2.0 s,
# but on chain64x4-tight 4.7 s against 4.4 s).
SEED_AFTER = 2
SEEDS = 4
# A walk steps by _step_past, with the closed form (which also takes the skip) every CLOSED_EVERY
# steps; in between it may visit plans the skip would have passed, none of which can win. Measured on
# a 64 x 3 rl run's batches: 2.1 s with the closed form at every step, 1.8 s every 2nd, 1.7 s every 3rd
# to 8th; the replicas are the same.
CLOSED_EVERY = 4


def _seed(problem: Problem, stages: Stages, price) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row, the replicas, cost and throughput of the cheapest of :data:`SEEDS` plans at throughputs
    spread geometrically from its slowest plan to its fastest (inf cost where none meets the targets)."""
    R = len(price)
    k, _ = _replicas_at(problem, stages, np.full(R, throughput_floor(problem)))
    lo = stage_throughputs(problem, stages, np.maximum(k, 1.0)).min(axis=1)
    hi = np.maximum(stage_throughputs(problem, stages, most_replicas(problem, stages)).min(axis=1), lo)
    with np.errstate(divide="ignore", invalid="ignore"):  # a model of no work: lo is inf, and no seed
        grid = lo[:, None] * (hi / lo)[:, None] ** (np.arange(1, SEEDS + 1) / SEEDS)
    each = np.repeat(np.arange(R), SEEDS)
    wide = stages.take(each)
    k, ok = _replicas_at(problem, wide, grid.ravel())
    thr = stage_throughputs(problem, wide, np.maximum(k, 1.0)).min(axis=1)
    cost = run_cost(problem.work, thr, (price[each] * k).sum(axis=1))
    cost = np.where(ok & meets_targets(problem, thr, cost), cost, np.inf).reshape(R, SEEDS)
    col = np.argmin(cost, axis=1)
    pick = np.arange(R) * SEEDS + col
    return k[pick], cost[np.arange(R), col], thr[pick]


def _next_targets(problem: Problem, thr, rate, best_cost):
    """Where each walk of :func:`provision` goes next: just past its plan's throughput, and under
    objective cost past every target that cannot win."""
    target = np.nextafter(thr, np.inf)
    if problem.objective is Objective.COST:
        # A plan with throughput X' costs at least W * rate / X' (faster plans need at least
        # this rate), so targets below W * rate / best_cost cannot win: skip them.
        with np.errstate(divide="ignore", invalid="ignore"):
            skip = sample_hours(problem.work) * rate / best_cost * (1 - SLACK)
        target = np.where(np.isfinite(skip), np.maximum(target, skip), target)
    return target


def provision(problem: Problem, stages: Stages) -> Scores:
    """Exact replica counts for each schedule of the batch, under the problem's objective.

    Infeasible schedules get the fastest replica counts the limits allow (so a
    caller can see how far they miss); their ``feasible`` flag is False.

    Two shortcuts change the work, not the answer: walks still going after
    :data:`SEED_AFTER` plans are seeded with a good plan (:func:`_seed`), and
    between closed forms a step adds one replica to each bottleneck stage
    (:data:`CLOSED_EVERY`).
    """
    if problem.objective is Objective.TIME and problem.max_cost is None:
        return score(problem, stages, fastest_replicas(problem, stages))
    B = stages.type.shape[0]
    best_k = np.where(stages.valid, 1.0, 0.0)
    best_cost = np.full(B, np.inf)
    best_thr = np.zeros(B)
    # The walk goes on only for the rows still active, gathered into a smaller batch as rows drop out:
    # the walks' lengths differ widely (a few steps to hundreds), and the long tail was most of the work.
    rows = np.flatnonzero(stages.runnable)
    live = stages.take(rows)
    price = np.where(live.valid, problem.prices[live.type], 0.0)
    target = np.full(len(rows), throughput_floor(problem))
    k = thr_s = thr = np.zeros(0)  # the first step takes the closed form
    for step in range(int(problem.limits.sum()) + 2):
        if len(rows) == 0:
            break
        if step == SEED_AFTER and problem.objective is Objective.COST:
            seed_k, seed_cost, seed_thr = _seed(problem, live, price)
            won = better(problem, seed_cost, seed_thr, best_cost[rows], best_thr[rows])
            at = rows[won]
            best_k[at], best_cost[at], best_thr[at] = seed_k[won], seed_cost[won], seed_thr[won]
        if step % CLOSED_EVERY == 0:
            k, active = _replicas_at(problem, live, target)
        else:
            k, active = _step_past(problem, live, k, thr_s, thr)  # a plan that gains nothing cannot win
        thr_s = stage_throughputs(problem, live, np.maximum(k, 1.0))
        rate = (price * k).sum(axis=1)
        if problem.objective is Objective.COST:
            # No plan at least as fast as the target can cost less than this bound.
            bound = sample_hours(problem.work) * cost_lower_bound(price, k, thr_s, problem.batch_size).sum(axis=1)
            active &= bound < best_cost[rows] * (1 - SLACK)
        thr = thr_s.min(axis=1)
        cost = run_cost(problem.work, thr, rate)
        take = active & meets_targets(problem, thr, cost) & better(problem, cost, thr, best_cost[rows], best_thr[rows])
        won = rows[take]
        best_k[won], best_cost[won], best_thr[won] = k[take], cost[take], thr[take]
        target = _next_targets(problem, thr, rate, best_cost[rows])
        if not active.all():
            rows, live, price, target = rows[active], live.take(active), price[active], target[active]
            k, thr_s, thr = k[active], thr_s[active], thr[active]
    missed = ~np.isfinite(best_cost)
    if missed.any():
        best_k[missed] = fastest_replicas(problem, stages.take(missed))
    return score(problem, stages, best_k)
