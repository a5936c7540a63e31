"""Schedules cut into stages (docs/spec.md section 1), vectorised over a batch of schedules: each
stage's label (its type, tensor-parallel degree and whether it recomputes) and its layers' summed
terms, :class:`Stages`, which :mod:`.costmodel` provisions and scores."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from heterps_cli.formulas import activations_held, copies_held, pipeline_step
from heterps_cli.problem import Problem
from heterps_cli.replica_counts import min_memory_replicas, share_floor


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
    problem: Problem, flat: np.ndarray, shape: tuple[int, int], valid, bounds, stype, in_flight, recompute, pick
):
    """Section 1b: per stage, the bytes every replica holds, the bytes split across them (with section
    1d's micro-batches in flight), the activations among those, and the fewest replicas whose memory
    fits. ``pick(view -> [n] array)``: each layer's figure at its stage's degree (section 1h)."""
    B, S = shape
    first, last = bounds

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
        casts = summed(pick(lambda v: v.cast_bytes))
        if problem.pipelined:
            casts = copies_held(in_flight, casts, recompute)
        mem_fixed = summed(pick(lambda v: v.state_parts[0])) + casts
        if problem.ties:  # section 1j: a stage's own copy of a tied parameter its first holder counts
            mem_fixed = mem_fixed + np.where(valid, problem.tie_state(first, np.where(valid, last, 0)), 0.0)
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
    tied = np.where(valid, problem.tie_seconds(first, last, stype), 0.0) if problem.ties else zeros  # section 1j
    if problem.pipelined:
        micro = _micro_terms(problem, pick, flat, (sc, pc), valid, stype, first, last, transfer)
        micro = (*micro[:3], micro[3] + tied)  # once a step, after the flush, as the optimiser step
        sc, pc, ps, in_flight = _pipelined(problem, micro, sid, valid)
        sd = pd = zeros
    else:
        pd, sd = pd + transfer, sd + tied
    mem_fixed, mem_split, mem_act, min_k = _memory_terms(
        problem, flat, valid, (first, last), stype, in_flight, recompute, pick
    )
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


def _memory_terms(problem: Problem, flat, valid, bounds, stype, in_flight, recompute, pick):
    """Section 1b's memory per stage (what every replica holds, what splits across them, the activations)
    and the fewest replicas each stage needs, for its memory and (section 1f) so that no replica trains
    above a size measured on its type; ``bounds``: each stage's first and last layer."""
    B, S = valid.shape
    zeros = np.zeros((B, S))
    mem_fixed, mem_split, mem_act, min_k = zeros, zeros, zeros, np.ones((B, S))
    if np.isfinite(problem.memory).any():
        mem_fixed, mem_split, mem_act, min_k = _memory(
            problem, flat, (B, S), valid, bounds, stype, in_flight, recompute, pick
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
