"""Measure a PyTorch model's layers: the numbers of a profile (docs/spec.md section 2), from the machine it runs on.

* **Layers** are the modules a forward pass calls, in the order it calls them:
  the leaf modules (``nn.MultiheadAttention`` counts as one), or the factory's
  own list of blocks. A forward pre-hook records each layer's inputs.
* **oct**: each layer in step order (:func:`~heterps_cli.profiling.timing.step_order_times`):
  every layer's forward in the model's order, then every backward in reverse, as a training step
  runs them, each layer on copies of its recorded inputs and timed on its own (ones as the output
  gradient; the parameter gradients zeroed between passes, so that each backward adds into them as
  a micro-batch does; an input's gradient computed only where training computes it: for an
  activation, not for the model's data). A layer then finds the caches as a step leaves them,
  where a layer timed alone in a loop finds its own weights still cached. The median of at least
  20 passes. On cpu one unit is one core, so it runs on one thread; on cuda CUDA events time
  it, nothing waiting for the GPU between layers (:class:`~.timing.Clock`). A few whole-model
  steps come first, so that the allocator, the kernels and the caches are warm (their median is
  also reported, beside the sum of the layers), and the passes are taken in :data:`ROUNDS`
  rounds, so that a slow spell of the machine is spread over every layer. A short model gets
  more passes (up to :data:`MAX_RUNS`), until they add up to :data:`MIN_SECONDS`.
* **odt**: what a layer communicates wherever it runs inside its stage, its
  gradient synchronisation (an all-reduce as big as its weights), over the link
  bandwidth: measured (cpu: an all-reduce between two processes over loopback
  gloo; cuda: a pinned host-to-device copy) or given (``--link-gbps``).
  Activations are not in it: they move only at stage boundaries, which docs/spec.md
  section 1b charges from ``input_size`` and the cluster's ``bandwidth_gbps``.
* **activation_size** (docs/spec.md section 1b): the bytes per sample a layer keeps for
  its backward pass, counted with ``torch.autograd.graph.saved_tensors_hooks``
  around one forward of the layer alone, each storage once, its own parameters
  left out (they are training state, counted from ``weight_size``), and apart from
  what autograd made of the parameters alone (autocast's half-precision weight
  copies: ``cast_size``, bytes a batch keeps whatever its samples).
* **sharded**: a module with the attribute ``heterps_sharded = True`` (the zoo's
  CTR embedding tables, which live on parameter servers) is marked ``sharded``.
* **alpha**: a least-squares fit of T(k) = T1 (1 - a + a/k) to each layer's median over
  :data:`~heterps_cli.profiling.timing.FIT_TRIALS` step-order passes at batch B0/k for k = 1, 2, 4
  (those that divide B0): what each of k replicas runs, as the model's k splits a batch between
  replicas (docs/spec.md section 1). When fewer than two k divide B0, the layer fails on a share of
  its inputs' first dimension, or the fit misses its points by more than 10%, the layer gets
  :data:`ALPHA_DEFAULTS` for its kind, marked estimated. However short the layer: a ReLU of tens of
  microseconds whose time barely shrinks with its share is fitted so, not given its kind's 0.8.
* **update**: each layer's optimiser step and gradient reset, timed after every step-order pass's
  backward, layer after layer (:class:`~heterps_cli.profiling.timing.StepOrderUpdates`): where a
  training step takes it, with its state out of the caches.
* **beta** is derived, not measured: odt is the gradient all-reduce, whose
  volume per replica does not shrink with more replicas, so beta is 0; marked
  estimated.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
from dataclasses import dataclass, field

import torch
from torch import nn

from heterps_cli.errors import SIGNALLED, InputError
from heterps_cli.loading import check_name
from heterps_cli.profiling.granularity import settle
from heterps_cli.profiling.links import Link, link_bandwidth
from heterps_cli.profiling.load import Load, advice, between, snapshot
from heterps_cli.profiling.models import (
    Call,
    Model,
    bytes_of,
    detached,
    kind,
    layers_run_alone,
    model_error,
    model_from_spec,
    trace,
)
from heterps_cli.profiling.precision import check_precision, training_at
from heterps_cli.profiling.ties import Tie, find_ties, once_bytes
from heterps_cli.profiling.timing import (
    FIT_SPLITS,
    FIT_TRIALS,
    WARMUP,
    Loss,
    fit_alpha,
    saved_bytes,
    shared_with_previous,
    steady_allocator,
    step_order_times,
    step_times,
    update_time,
)
from heterps_cli.progress import Progress, quiet
from heterps_cli.runtime.synthetic import output_loss

WARMUP_STEPS = 3  # whole-model forward+backward steps before any layer is timed
ROUNDS = 4  # the timed runs of every layer are split over this many interleaved rounds
MIN_SECONDS = 0.25  # short layers get more runs, up to MAX_RUNS, until their runs add up to this
MAX_RUNS = 200
ALPHA_DEFAULTS = {
    "fc": 0.9,
    "conv": 0.9,
    "attention": 0.9,
    "embedding": 0.5,
    "norm": 0.7,
    "activation": 0.8,
    "pool": 0.8,
    "dropout": 0.8,
}


ALPHA_OTHER = 0.8
NOISY_CV = 0.10


def load_model(
    spec: str, batch_size: int, input_shape: tuple[int, ...] | None = None, granularity: str | None = None
) -> Model:
    """A zoo name, ``path/to/file.py:factory`` or ``package.module:factory``; errors are exit-2 InputErrors.
    ``granularity`` (layers, blocks or auto): the layers a profile of it lists, and whether they chain
    (:func:`heterps_cli.profiling.granularity.settle`); None: as the factory gives them, unchecked."""
    model = model_from_spec(spec, batch_size, input_shape)
    check_name(model.name, "MODEL")  # the profile's model: a file name of 300 characters would not read back
    return settle(model, granularity) if granularity is not None else model


@dataclass
class LayerProfile:
    name: str
    kind: str
    input_size: float  # bytes per sample
    weight_size: float  # bytes
    oct: float
    odt: float
    alpha: float
    beta: float
    cv: float  # coefficient of variation of the oct repetitions
    estimated: dict[str, str] = field(default_factory=dict)  # field -> why it is not measured
    fit_residual: float | None = None
    activation_size: float = 0.0  # bytes per sample kept for backward (docs/spec.md section 1b)
    sharded: bool = False  # docs/spec.md section 1b: the module says its weights are split across replicas
    input_saved: float = 0.0  # of activation_size, bytes per sample the layer before also keeps (section 1b)
    cast_size: float = 0.0  # bytes a batch keeps of copies of its weights (autocast's), whatever its samples (1b)
    update: float = 0.0  # docs/spec.md section 1d: seconds of the optimiser step on the layer's weights
    forward: float | None = None  # docs/spec.md section 1g: the forward pass's part of oct, where measured


@dataclass
class Profiled:
    model: str
    resource: str
    device: str
    batch_size: int
    bandwidth: float  # bytes/s
    bandwidth_how: str
    repetitions: int
    layers: list[LayerProfile]
    step: float  # seconds of one whole-model forward+backward step (the median of the warm-up steps)
    notes: list[str] = field(default_factory=list)
    pass_start: float = 0.0  # docs/spec.md section 1d: s from the backward call to its first layer (median)
    all_reduce_latency: float | None = None  # section 1d: s of an all-reduce beyond its bytes, where measured
    transfer_latency: float | None = None  # section 1d: s of a message across a boundary beyond its bytes
    loss: str = "mse"  # the loss timed with the last layer (runtime.synthetic.LOSSES)
    optimizer: str = "sgd"  # the optimiser whose step update times (timing.OPTIMIZERS)
    chain: bool | None = None  # docs/spec.md section 2: whether heterps run can cut between any two layers
    load: Load | None = None  # how busy the machine was while it measured (:mod:`.load`)
    idle_latency: float | None = None  # the idle link's all-reduce latency, where pairs timed all_reduce_latency
    precision: str | None = None  # docs/spec.md section 2: what the layers were timed at (None: not stated)
    degrees: dict[int, list[LayerProfile]] = field(default_factory=dict)  # --tp: per degree, one unit's layers
    ties: list[Tie] = field(default_factory=list)  # docs/spec.md section 1j: tensors several layers hold

    @property
    def total_oct(self) -> float:
        return sum(layer.oct for layer in self.layers)

    @property
    def advice(self) -> list[str]:
        """Why to profile again (:func:`.load.advice`); empty when the machine looked idle."""
        noisy = sum(layer.cv > NOISY_CV for layer in self.layers)
        paired = self.all_reduce_latency if self.idle_latency is not None else None
        return advice(self.load, noisy, len(self.layers), paired, self.idle_latency)


def measure(
    model: Model,
    resource: str,
    *,
    device: str = "cpu",
    repetitions: int = 20,
    link_gbps: float | None = None,
    link: Link | None = None,
    progress: Progress | None = None,
    loss: str = "mse",
    optimizer: str = "sgd",
    precision: str | None = None,
) -> Profiled:
    """Measure every layer of ``model`` (see the module docstring); ``link``: the link as the caller
    measured it (else measured here, or given by ``link_gbps``); ``loss``: the loss a training
    step takes of the model's output (:func:`~heterps_cli.runtime.synthetic.output_loss`; ``mse``,
    what ``heterps run`` trains without a task), timed as the last layer's; ``optimizer``: the one whose
    step each layer's ``update`` times (:data:`~.timing.OPTIMIZERS`); ``precision``: what the model trains
    at (:mod:`.precision`; None: as it is, and the profile says none)."""
    if device == "cuda" and not torch.cuda.is_available():
        raise InputError(None, None, "device", "cuda was asked for, but torch sees no CUDA device here")
    check_precision(precision, device)
    report, B0, started = progress or quiet, len(model.inputs[0]), snapshot()
    report("tracing the model")
    calls, notes = traced_at(model, precision, device)
    link = link if link is not None else link_bandwidth(device, link_gbps, report, notes)
    notes += _allocator_notes()
    placed(model, calls, device)
    threads, modules = torch.get_num_threads(), [model.module, *(call.module for call in calls)]
    current: list[Call] = []  # the layer being run, for the error message
    try:
        with layers_run_alone(model, current), training_at(precision, device, modules):
            if device == "cpu":
                torch.set_num_threads(1)  # one unit of cpu is one core
            step, layers, starts, ties = _timed_layers(
                model, calls, device, repetitions, link.bandwidth, output_loss(loss, B0), optimizer, report, current
            )
    finally:
        torch.set_num_threads(threads)
    return Profiled(
        model.name,
        resource,
        device,
        B0,
        link.bandwidth,
        link.how,
        ROUNDS * -(-repetitions // ROUNDS),
        layers,
        step,
        notes,
        pass_start=statistics.median(starts) if starts else 0.0,
        all_reduce_latency=link.all_reduce_latency,
        transfer_latency=link.transfer_latency,
        loss=loss,
        optimizer=optimizer,
        chain=model.chain,
        load=between(started, snapshot()),
        precision=precision,
        ties=ties,
    )


def tied_layers(calls: list[Call], layers: list[LayerProfile]) -> tuple[list[LayerProfile], list[Tie]]:
    """Section 1j: the tensors several of the traced layers hold, and the layers with each counted once."""
    ties = find_ties([call.module for call in calls], [call.name for call in calls])
    return counted_once(layers, ties), ties


def counted_once(layers: list[LayerProfile], ties: list[Tie]) -> list[LayerProfile]:
    """Section 1j: each tied parameter's bytes in its first holder's ``weight_size`` only; a later holder's
    all-reduce (``odt``, as big as its weights) and optimiser step (``update``) shrink with its weights,
    since the tensor is summed and stepped once."""
    extra = once_bytes(ties, len(layers))
    out = []
    for layer, tied in zip(layers, extra):
        if not tied:
            out.append(layer)
            continue
        kept = max(layer.weight_size - tied, 0.0)
        share = kept / layer.weight_size if layer.weight_size else 0.0
        out.append(dataclasses.replace(layer, weight_size=kept, odt=layer.odt * share, update=layer.update * share))
    return out


def traced_at(model: Model, precision: str | None, device: str) -> tuple[list[Call], list[str]]:
    """:func:`traced`, each layer's recorded input what it gets when the model trains at ``precision``
    (:mod:`.precision`: a layer after a product gets a half-precision tensor under bf16)."""
    with training_at(precision, device, [model.module]):
        return traced(model)


def _allocator_notes() -> list[str]:
    if steady_allocator():
        return []
    return [
        "the C library is not glibc: the allocator could not be kept from returning memory "
        "to the system, so repeat profiles may differ more on layers with large tensors"
    ]


def placed(model: Model, calls: list[Call], device: str) -> None:
    """The model and each layer's recorded inputs moved to ``device``, traced where they were: a copy from
    host memory each run would empty the GPU's queue before every layer."""
    model.module.to(device)
    if device != "cpu":
        for call in calls:
            call.args, call.kwargs = detached(call.args, device), detached(call.kwargs, device)


def _timed_layers(
    model: Model,
    calls: list[Call],
    device: str,
    repetitions: int,
    bandwidth: float,
    loss: Loss | None,
    optimizer: str,
    report: Progress,
    current: list[Call],
) -> tuple[float, list[LayerProfile], list[float], list[Tie]]:
    """The whole model's step (the warm-up's median), each layer's profile, each backward pass's start and
    the tensors several layers hold (section 1j, each counted once in the layers' weights):
    the warm-up steps, the timed rounds, the alpha fit at each batch share; ``current`` holds the layer
    running."""
    B0, total = len(model.inputs[0]), (ROUNDS + 1) * len(calls)  # the timed rounds, then one alpha fit a layer
    report(f"warming up: {WARMUP_STEPS} whole-model steps", completed=0, total=total)
    try:
        step = statistics.median(step_times(model, device, WARMUP_STEPS, warmup=1, loss=loss))
    except SIGNALLED:
        raise
    except BaseException as exc:  # the user's code: sys.exit and its own BaseExceptions too
        raise model_error(model, exc, "the model's forward and backward pass failed") from None
    times, forwards, starts, updates = _time_layers(calls, device, repetitions, report, total, current, loss, optimizer)
    report("alpha fit: every layer in step order at each batch share", completed=ROUNDS * len(calls), total=total)
    shares = _share_times(calls, device, B0, current, loss)
    layers = []
    for i, call in enumerate(calls):
        current[:] = [call]
        at_shares = {k: v[i] for k, v in shares.items()}
        layer = _layer(call, B0, times[i], bandwidth, device, at_shares, statistics.median(updates[i]))
        # each run's forward is part of its total, so the medians keep that order (section 1g)
        layers.append(dataclasses.replace(layer, forward=statistics.median(forwards[i])))
    current[:] = []
    layers, ties = tied_layers(calls, with_shared(layers, shared_with_previous(model, calls, device), B0))
    report("done", completed=total, total=total)
    return step, layers, starts, ties


def with_shared(layers: list[LayerProfile], shared: list[float], B0: int) -> list[LayerProfile]:
    """The layers with ``input_saved``: ``shared`` bytes per batch (:func:`~.timing.shared_with_previous`)
    per sample, at most the layer's activation_size (that is measured on the layer alone, this in one
    whole forward)."""
    return [
        dataclasses.replace(layer, input_saved=min(layer.activation_size, both / B0))
        for layer, both in zip(layers, shared)
    ]


def traced(model: Model) -> tuple[list[Call], list[str]]:
    """The model's layers as :func:`trace` gives them (an exit-2 error if the forward fails or calls no
    layer), and the profile's notes on them so far (the model's own: how its layers were chosen)."""
    try:
        calls = trace(model)
    except SIGNALLED:
        raise
    except BaseException as exc:  # the user's code: sys.exit and its own BaseExceptions too
        raise model_error(model, exc, "the model's forward pass failed") from None
    if not calls:
        raise InputError(None, None, "MODEL", "the forward pass called no layer module")
    return calls, list(model.notes)


def _time_layers(
    calls: list[Call],
    device: str,
    repetitions: int,
    report: Progress,
    total: int,
    current: list[Call],
    loss: Loss | None = None,
    optimizer: str = "sgd",
) -> tuple[list[list[float]], list[list[float]], list[float], list[list[float]]]:
    """Each layer's run times in step order (:func:`~heterps_cli.profiling.timing.step_order_times`), in
    :data:`ROUNDS` rounds (so that a slow moment of the machine spreads over all layers); a short
    model gets more passes, up to :data:`MAX_RUNS`, until they add up to :data:`MIN_SECONDS`;
    ``current`` holds the layer running; ``loss`` is the last layer's (:func:`~.timing.step_order_times`).
    With them, each run's forward seconds (section 1g), its backward pass's start (section 1d) and each
    layer's step of ``optimizer`` (section 1d's ``update``, taken after the backward pass)."""
    per_round = -(-repetitions // ROUNDS)
    times: list[list[float]] = [[] for _ in calls]
    forwards: list[list[float]] = [[] for _ in calls]
    updates: list[list[float]] = [[] for _ in calls]
    starts: list[float] = []
    for r in range(ROUNDS):
        report(f"round {r + 1}/{ROUNDS}: every layer in step order", completed=r * len(calls), total=total)
        passes = per_round
        if r:  # the first round says how many passes add up to MIN_SECONDS
            wanted = MIN_SECONDS / max(sum(statistics.median(t) for t in times), 1e-9)
            passes = max(per_round, min(int(wanted), MAX_RUNS) // ROUNDS)
        got_all = step_order_times(
            calls,
            device,
            passes,
            WARMUP if r == 0 else 1,
            current=current,
            forwards=forwards,
            starts=starts,
            loss=loss,
            updates=updates,
            optimizer=optimizer,
        )
        for i, got in enumerate(got_all):
            assert not isinstance(got, Exception), "step_order_times raises on the whole batch"
            times[i] += got
    return times, forwards, starts, updates


def _share_times(
    calls: list[Call], device: str, B0: int, current: list[Call], loss: Loss | None = None
) -> dict[int, list[float | Exception]]:
    """For each ``k`` of :data:`~heterps_cli.profiling.timing.FIT_SPLITS` that divides ``B0``: each
    layer's median in step order at batch ``B0 / k`` (what each of ``k`` replicas runs), or the
    exception the layer raised there; the last layer's with ``loss`` of its share."""
    out: dict[int, list[float | Exception]] = {}
    for k in (k for k in FIT_SPLITS if B0 % k == 0):
        got = step_order_times(calls, device, FIT_TRIALS, shares=(B0, B0 // k), current=current, loss=loss)
        out[k] = [t if isinstance(t, Exception) else statistics.median(t) for t in got]
    return out


def weight_bytes(module: nn.Module) -> float:
    return float(sum(p.numel() * p.element_size() for p in module.parameters()))


def layer_profile(
    call: Call,
    B0: int,
    oct_: float,
    bandwidth: float,
    alpha: float,
    device: str,
    *,
    cv: float = 0.0,
    estimated: dict[str, str] | None = None,
    residual: float | None = None,
    update: float | None = None,
    forward: float | None = None,
) -> LayerProfile:
    """A layer's profile from its time and alpha: its sizes and section 1b fields from the recorded call,
    odt its gradient all-reduce (as big as its weights) over ``bandwidth`` bytes/s, beta 0 (derived)."""
    weights = weight_bytes(call.module)
    per_batch, copies = saved_bytes(call, device)
    return LayerProfile(
        call.name,
        kind(call.module),
        bytes_of((call.args, call.kwargs)) / B0,
        weights,
        oct_,
        weights / bandwidth,
        alpha,
        0.0,
        cv,
        estimated or {},
        residual,
        activation_size=per_batch / B0,
        cast_size=copies,
        sharded=bool(getattr(call.module, "heterps_sharded", False)),
        update=update_time(call.module, device) if update is None else update,
        forward=forward,
    )


def _layer(
    call: Call,
    B0: int,
    times: list[float],
    bandwidth: float,
    device: str,
    shares: dict[int, float | Exception],
    update: float | None = None,
) -> LayerProfile:
    """The layer's profile from its run times at ``B0`` and ``shares``, its time (or the exception it
    raised) at each batch share ``B0 / k`` for the alpha fit, and its optimiser step (``update``, timed
    in step order; None: :func:`~.timing.update_time`'s, with sgd)."""
    k = kind(call.module)
    oct_ = statistics.median(times)
    cv = statistics.pstdev(times) / statistics.mean(times) if len(times) > 1 else 0.0
    estimated = {}
    alpha, residual = None, None
    splits = sorted(shares)
    best = [t for n in splits if not isinstance(t := shares[n], Exception)]
    failed = next((t for t in shares.values() if isinstance(t, Exception)), None)
    if len(splits) < 2:
        estimated["alpha"] = f"batch {B0} cannot be split between replicas, nothing to fit: default for {k}"
    elif failed is not None:  # the user's layer may not take a share of its inputs' first dimension
        estimated["alpha"] = f"the layer failed on a share of the batch ({type(failed).__name__}): default for {k}"
    else:
        fitted = fit_alpha(splits, best)
        if fitted is not None:
            alpha, residual = fitted
        else:
            estimated["alpha"] = (
                f"the fit over batch shares 1/{', 1/'.join(map(str, splits))} was unusable "
                f"(times {', '.join(f'{t * 1e3:.3g} ms' for t in best)}): default for {k}"
            )
    if alpha is None:
        alpha = ALPHA_DEFAULTS.get(k, ALPHA_OTHER)
    estimated["beta"] = "derived: odt is the gradient all-reduce, which does not shrink with more replicas"
    return layer_profile(
        call, B0, oct_, bandwidth, alpha, device, cv=cv, estimated=estimated, residual=residual, update=update
    )


def python_path_note() -> str:
    return f"torch {torch.__version__}, python {sys.version.split()[0]}"
