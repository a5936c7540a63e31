"""The model's formulas that every other module uses and none writes out again (docs/spec.md
section 1): a stage's time, its pipeline step, its gradient all-reduce, a replica's memory and the
run's money, each in one home. Each works on numbers and numpy arrays alike, and keeps its order
of operations, so that every figure is the same to the last bit wherever it is computed."""

from __future__ import annotations

import numpy as np

SECONDS_PER_HOUR = 3600.0
# Relative slack for constraint checks, so a plan that meets a limit to the last
# bit in one summation order is not declared infeasible in another.
SLACK = 1e-12


def amdahl(serial, parallel, k):
    """Section 1: ``serial + parallel / k``, the time of a part of a stage on ``k`` replicas (CT and DT,
    a pipeline step, a replica's memory in bytes)."""
    return serial + parallel / k


def share(batch, k):
    """Section 1: ``⌈B/k⌉``, the samples of a batch of ``B`` that the busiest of ``k`` replicas trains
    (a replica trains whole samples: the shares are ``⌈B/k⌉`` and ``⌊B/k⌋``)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.ceil(batch / k)


def stretch(batch, k):
    """Section 1: ``k ⌈B/k⌉ / B``, how much longer than ``1/k`` of the batch the busiest replica's
    share takes (1 exactly when ``k`` divides ``B``)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        s = k * share(batch, k) / batch
    return np.where(np.isfinite(s), s, 1.0)  # no replicas or infinitely many: nothing to stretch


def whole_samples(parallel, per_sample, batch, k):
    """Section 1: the part of ``amdahl(serial, parallel, k)`` that replicas divide, charged at the
    busiest replica's whole-sample share: ``per_sample``, the part of ``parallel`` that is per sample,
    grows by :func:`stretch` (``parallel`` itself when ``k`` divides ``B``; the rest of ``parallel``,
    such as section 1d's all-reduce, is divided by ``k`` as it is)."""
    s = stretch(batch, k)
    with np.errstate(invalid="ignore", over="ignore"):  # kept apart where s is 1, so inf stays inf
        return np.where(s == 1.0, parallel, parallel + per_sample * (s - 1.0))


def stage_throughput(sc, pc, sd, pd, batch_size, k, ps=None, batch=None):
    """Samples per second of a stage with ``k`` replicas: ``B0 / max(CT(k), DT(k))`` (section 1d:
    samples per step over the stage's step time, with ``sd = pd = 0``). With ``batch`` (the batch
    ``B`` its replicas split), the per-sample parts (``ps`` of ``pc``, all of ``pd``) are charged at
    the busiest replica's whole share (:func:`whole_samples`); without it, at ``1/k``."""
    if batch is not None:
        pc, pd = whole_samples(pc, pc if ps is None else ps, batch, k), whole_samples(pd, pd, batch, k)
    with np.errstate(divide="ignore", invalid="ignore"):
        return batch_size / np.maximum(amdahl(sc, pc, k), amdahl(sd, pd, k))


def pipeline_slots(micro_batches, stages):
    """Section 1d: ``M + S - 1``, the micro-batch slots of a step, ``S`` stages filling and draining
    the pipeline around ``M`` micro-batches."""
    return micro_batches + stages - 1.0


def ring_allreduce(sync, k):
    """Section 1d: ``2 Y (k - 1) / k``, a ring all-reduce among ``k`` replicas of what takes ``Y``
    between two."""
    return 2.0 * sync * (1.0 - 1.0 / k)


def pipeline_step(micro_batches, stages, micro_serial, micro_parallel, sync, update):
    """Section 1d: a stage's step time ``(M + S - 1) c(k) + 2 Y (1 - 1/k) + U`` as ``serial + parallel / k``
    (:func:`amdahl`).

    ``c(k) = micro_serial + micro_parallel / k`` is a replica's time per micro-batch (compute and the
    boundary transfer it waits for); ``Y`` is the stage's gradient all-reduce between two replicas
    (:func:`ring_allreduce`); ``U`` its optimiser step. The third part is the per-sample part of
    ``parallel`` (its compute and transfer, not the all-reduce), for :func:`whole_samples`."""
    slots = pipeline_slots(micro_batches, stages)
    with np.errstate(over="ignore", invalid="ignore"):
        per_sample = slots * micro_parallel
        return slots * micro_serial + 2.0 * sync + update, per_sample - 2.0 * sync, per_sample


def mixed_step(micro_batches, stages, micro, sync, replicas, update):
    """Section 1i: a mixed stage's step ``(M + S - 1) c + 2 Y (1 - 1/K) + U`` and its all-reduce, ``c``
    its slowest part's time per micro-batch, ``Y`` and ``U`` its slowest part's all-reduce between two
    replicas and optimiser step, ``K`` every replica of every part."""
    comm = ring_allreduce(sync, replicas)
    return pipeline_slots(micro_batches, stages) * micro + comm + update, comm


def step_parts(micro_batches, stages, compute, transfer, allreduce, update) -> dict[str, float]:
    """Section 1d: the terms of a stage's step, in seconds, that :func:`pipeline_step` adds up, from
    a replica's compute and transfer per micro-batch, its all-reduce and its update per step."""
    return {
        "compute": micro_batches * compute,
        "stage-boundary transfer": micro_batches * transfer,
        "pipeline fill and drain": (stages - 1) * (compute + transfer),
        "gradient synchronisation": allreduce,
        "optimiser step": update,
    }


def activations_held(in_flight, activations, inputs=None):
    """Section 1d: the activation bytes a replica holds, ``in_flight`` micro-batches' worth; with
    section 1g's recomputation (``inputs``: the bytes the stage takes in per micro-batch), the inputs of
    ``in_flight`` micro-batches and one micro-batch's activations, rebuilt for its backward pass."""
    if inputs is None:
        return in_flight * activations
    return in_flight * inputs + activations


def copies_held(in_flight, copies, recompute=False):
    """Section 1b's weight copies ``C_s`` a replica holds: one set per micro-batch in flight (section 1d),
    or, where the stage recomputes (section 1g), the one set its rebuilt micro-batch makes; never split
    across replicas. Elementwise over arrays."""
    return np.where(recompute, copies, in_flight * copies)


def run_cost(work, throughput, rate):
    """USD of ``work`` samples at ``throughput`` samples/s on units that cost ``rate`` USD an hour:
    ``W / X / 3600 · rate`` (docs/spec.md section 1's COST)."""
    return work / throughput / SECONDS_PER_HOUR * rate


def sample_hours(work):
    """``W / 3600``: what a price per sample/s (USD an hour over samples/s) is multiplied by to give the
    run's USD, for the bounds that sum such prices over stages before dividing by a throughput."""
    return work / SECONDS_PER_HOUR
