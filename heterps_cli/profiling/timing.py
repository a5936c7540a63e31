"""Timing a layer on its recorded inputs: forward and backward runs, batch shares for the alpha fit,
the optimiser step and the bytes it saves for backward (docs/guide/profiling.md)."""

from __future__ import annotations

import ctypes
import ctypes.util
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from heterps_cli.profiling.models import Call, Model, tensors_of

WARMUP = 3
FIT_TRIALS = 9  # step-order passes per batch share for the alpha fit; each layer's median is kept
FIT_SPLITS = (1, 2, 4)  # the alpha fit times the layer at batch B0/k: one of k replicas' share
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc mallopt parameters (malloc.h)


def steady_allocator() -> bool:
    """Make glibc's malloc reuse freed memory instead of returning it to the system.

    By default a large tensor is either fresh memory from ``mmap`` (page faults:
    a 2 ms ReLU took 6.5 ms) or reused heap memory, depending on the process's
    history of allocations, so two profiles of one model disagreed by up to 3x
    on a layer, and ctr's layers summed to a quarter of its whole step. With mmap
    off and trimming off, every run after the warm-up reuses memory, as a steady
    training loop with a caching allocator does (CUDA's caches by design).
    False where the C library is not glibc; the profile then says so.
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, 1 << 30))
    except (OSError, AttributeError):
        return False


def synchronise(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


class Clock:
    """Marks on the host clock (cpu) or CUDA events in the stream (cuda), read once the work has ended.

    Synchronising around each layer on a GPU charges it a round trip to the host and an emptied queue
    that a training step never pays: vgg16's ReLUs took 0.25 ms each on an H100 and its layers summed
    to 1.5 whole steps, 2.4 times what ``heterps run`` then measured (docs/fidelity.md). Events time
    the layer where the stream runs it, the launches of a CPU that lags the GPU included, as in a step.
    """

    def __init__(self, device: str):
        self.cuda = device == "cuda"

    def mark(self) -> torch.cuda.Event | float:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start, end) -> float:
        """Call after :func:`synchronise` on cuda: an event is read once the stream has passed it."""
        return start.elapsed_time(end) / 1e3 if self.cuda else end - start


Loss = Callable[[torch.Tensor], torch.Tensor]  # a model's output -> the loss a training step takes of it


def with_loss(out, loss: Loss | None):
    """``loss(out)`` where ``out`` is a floating tensor of samples that takes a gradient; else ``out`` as
    it is (a model whose output no loss reads: its gradient is then ones, as before the loss was charged)."""
    if loss is None or not isinstance(out, torch.Tensor) or not (out.is_floating_point() and out.requires_grad):
        return out
    if out.dim() == 0:  # a scalar already: no samples to take a loss over
        return out
    return loss(out)


def timed(
    module: nn.Module,
    inputs: Callable[[], tuple[tuple, dict]],
    device: str,
    repetitions: int,
    warmup: int,
    loss: Loss | None = None,
    forwards: list[float] | None = None,
) -> list[float]:
    """Seconds of ``module``'s forward on ``inputs()``, ``loss`` of its output where given, then the
    backward (ones as the gradient of each output); ``repetitions`` runs after ``warmup``; into
    ``forwards``, where given, each run's forward alone (the device waited for after it). The
    parameter gradients are zeroed before each run, not dropped: the backward then adds into them,
    as every micro-batch of a training step does (an add over the weights that a fresh gradient
    skips; docs/fidelity.md)."""
    params = [p for p in module.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.zeros_like(p)
    times = []
    for i in range(warmup + repetitions):
        args, kwargs = inputs()
        for p in params:
            if p.grad is not None:
                p.grad.zero_()
        synchronise(device)
        start = time.perf_counter()
        out = with_loss(module(*args, **kwargs), loss)
        if forwards is not None:
            synchronise(device)
            if i >= warmup:
                forwards.append(time.perf_counter() - start)
        outs = [o for o in tensors_of(out) if o.requires_grad]
        if outs:
            torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
        synchronise(device)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return times


def step_times(
    model: Model, device: str, repetitions: int, warmup: int = WARMUP, loss: Loss | None = None
) -> list[float]:
    """The whole model on one batch, its loss included: what the layer times should add up to."""
    inputs = tuple(x.to(device) for x in model.inputs)
    return timed(model.module, lambda: (inputs, {}), device, repetitions, warmup, loss)


def fit_alpha(splits: list[int], seconds: list[float]) -> tuple[float, float] | None:
    """(alpha, relative rms residual) of T(k) = T1 (1 - a + a/k) by least squares, or None if unusable.
    A good fit outside 0..1 is clamped: below 0 the layer's time does not shrink with its share (fixed
    costs dominate: the guide's 256-wide layers at 64, 32 and 16 samples), and no replica can do it less."""
    if len(splits) < 2 or min(seconds) <= 0:
        return None
    k, t = np.asarray(splits, dtype=float), np.asarray(seconds)
    design = np.stack([np.ones_like(k), 1.0 / k], axis=1)  # T = c0 + c1 / k, c0 = T1 (1 - a), c1 = T1 a
    (c0, c1), *_ = np.linalg.lstsq(design, t, rcond=None)
    if c0 + c1 <= 0:
        return None
    residual = float(np.sqrt(np.mean((design @ [c0, c1] - t) ** 2)) / t.mean())
    alpha = c1 / (c0 + c1)
    if residual > 0.10:
        return None
    return float(min(max(alpha, 0.0), 1.0)), residual


UPDATE_RUNS = 21  # optimiser steps timed per layer; the median is kept
OPTIMIZERS = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}


def update_time(module: nn.Module, device: str, runs: int = UPDATE_RUNS, optimizer: str = "sgd") -> float:
    """Median seconds of one optimiser step on the layer's own weights and the reset of their gradients
    (section 1d's ``update``: what a training step does once after its all-reduce), with ``optimizer``
    (:data:`OPTIMIZERS`: sgd, what ``heterps run`` trains with without a task, by default; its state
    made by a first step, not timed); 0 for a layer with none."""
    params = [p for p in module.parameters() if p.requires_grad]
    if not params:
        return 0.0
    for p in params:
        p.grad = torch.zeros_like(p)
    stepping, clock, times = StepOrderUpdates([module], optimizer), Clock(device), []
    for _ in range(runs + 1):
        synchronise(device)
        (span,) = stepping.step(clock)
        synchronise(device)
        assert span is not None  # the layer has weights
        times.append(clock.seconds(*span))
    stepping.restore()
    for p in params:
        p.grad = None
    return statistics.median(times[1:])


def share(value, batch: int, samples: int):
    """Recorded inputs cut to ``samples`` of the ``batch``: every tensor whose first dimension is the
    batch (a replica's share, as ``heterps run`` splits them), the rest kept whole."""
    if isinstance(value, torch.Tensor):
        return value[:samples] if value.dim() and value.shape[0] == batch else value
    if isinstance(value, tuple | list):
        return type(value)(share(v, batch, samples) for v in value)
    if isinstance(value, dict):
        return {key: share(v, batch, samples) for key, v in value.items()}
    return value


def step_order_times(
    calls: list[Call],
    device: str,
    repetitions: int,
    warmup: int = 1,
    shares: tuple[int, int] | None = None,
    current: list[Call] | None = None,
    forwards: list[list[float]] | None = None,
    starts: list[float] | None = None,
    loss: Loss | None = None,
    updates: list[list[float]] | None = None,
    optimizer: str = "sgd",
) -> list[list[float] | Exception]:
    """Each layer's seconds of forward and backward as a training step runs them: every layer's forward
    in the model's order, each on fresh copies of its recorded inputs (with ``shares = (batch, samples)``,
    cut to ``samples`` of the batch: :func:`share`) and timed on its own, then every layer's backward
    in reverse, in one call (:func:`backward_marks`). A layer then finds the caches as a step leaves
    them, the other layers' weights, gradients and activations passing through between its forward
    and its backward; timed alone in a loop, it finds its own still cached and runs faster than in
    a step (docs/fidelity.md); on cuda nothing waits for the GPU between layers (:class:`Clock`). On a share
    of the batch, a layer that raises gets its exception instead of times, and the others go on
    (elsewhere it raises); ``current`` holds the layer running. ``forwards``, when given, gets each
    layer's forward seconds of every timed run too (docs/spec.md section 1g), and ``starts`` each timed
    run's backward start (:func:`backward_marks`). ``loss``, when given, is taken of the last layer's
    output (:func:`with_loss`) and its forward and backward are the last layer's, as a step's last
    stage runs them (not its ``forwards``: a recomputing stage does not run the loss again).
    ``updates``, when given, gets each layer's optimiser step (``optimizer``) and gradient reset of every
    timed run, taken after the backward pass in the model's order, as a step takes them after its
    all-reduce (:class:`StepOrderUpdates`)."""
    inputs = [
        (call.args, call.kwargs) if shares is None else (share(call.args, *shares), share(call.kwargs, *shares))
        for call in calls
    ]
    params = [p for call in calls for p in call.module.parameters() if p.requires_grad]
    grads_of = [torch.zeros_like(p) for p in params]
    for p, grad in zip(params, grads_of):
        p.grad = grad
    out: list[list[float] | Exception] = [[] for _ in calls]
    clock = Clock(device)
    stepping = StepOrderUpdates([call.module for call in calls], optimizer) if updates is not None else None
    for run in range(warmup + repetitions):
        for grad in grads_of:
            grad.zero_()
        outputs, marks = _forwards_in_order(calls, inputs, out, clock, device, current, loss, raising=shares is None)
        spans, opening = backward_marks(calls, outputs, clock, current)
        for i, span in spans.items():
            marks[i].append(span)
        outputs = []  # what each layer saved for its backward went as that backward ran, as in a step
        stepped = stepping.step(clock) if stepping is not None else []
        synchronise(device)
        if run >= warmup:
            _keep_run(clock, marks, out, forwards)
            if updates is not None:
                for i, taken in enumerate(stepped):
                    updates[i].append(clock.seconds(*taken) if taken is not None else 0.0)
            if starts is not None and opening is not None:
                starts.append(clock.seconds(*opening))
    if stepping is not None:
        stepping.restore()
    return out


def _forwards_in_order(
    calls: list[Call],
    inputs: list,
    out: list[list[float] | Exception],
    clock: Clock,
    device: str,
    current: list[Call] | None,
    loss: Loss | None,
    raising: bool,
) -> tuple[list, list[list]]:
    """One run's forward passes in the model's order, each marked by ``clock``: each layer's output and
    its (start, end) marks (the loss's too, on the last layer). A layer whose entry in ``out`` is an
    exception is skipped; unless ``raising``, one that raises gets its exception there."""
    outputs: list = [None] * len(calls)
    marks: list[list] = [[] for _ in calls]  # (start, end) of its forward, then of its backward
    for i, call in enumerate(calls):
        if isinstance(out[i], Exception):
            continue
        if current is not None:
            current[:] = [call]
        args, kwargs = call.fresh(device, *inputs[i])
        try:
            start = clock.mark()
            outputs[i] = call.module(*args, **kwargs)
            marks[i].append((start, clock.mark()))
            if loss is not None and i == len(calls) - 1:
                start = clock.mark()
                outputs[i] = with_loss(outputs[i], loss)
                marks[i].append((start, clock.mark()))
        except MemoryError:
            raise
        except Exception as exc:  # the user's layer on a share of its batch
            if raising:
                raise
            out[i] = exc
    return outputs, marks


def _keep_run(clock: Clock, marks: list[list], out: list[list[float] | Exception], forwards) -> None:
    """One timed run's seconds: each layer's forward and backward (and loss) into ``out``, its forward
    alone into ``forwards``."""
    for i, times in enumerate(out):
        if not isinstance(times, Exception):
            times.append(sum(clock.seconds(a, b) for a, b in marks[i]))
            if forwards is not None:
                forwards[i].append(clock.seconds(*marks[i][0]))


class StepOrderUpdates:
    """Each layer's optimiser step (lr 0, the weights put back by :meth:`restore`) and gradient reset,
    timed where a training step takes it: after the backward pass, layer after layer. Timed alone in a
    loop, the optimiser finds its state and the weights still cached: there the classifier's Adam
    steps summed to 0.34 ms, where after a step's forwards and backwards they took 0.50 ms
    (docs/fidelity.md). A layer with no weights of its own is not stepped (None). Also
    :func:`update_time`'s, for one layer in a loop."""

    def __init__(self, modules: list[nn.Module], optimizer: str):
        self.params = [[p for p in module.parameters() if p.requires_grad] for module in modules]
        self.saved = [[p.detach().clone() for p in params] for params in self.params]
        self.optimisers = [OPTIMIZERS[optimizer](params, lr=0.0) if params else None for params in self.params]

    def step(self, clock: Clock) -> list[tuple | None]:
        """(start, end) of each layer's step and reset, in the model's order."""
        spans: list[tuple | None] = []
        with torch.no_grad():
            for optimiser in self.optimisers:
                if optimiser is None:
                    spans.append(None)
                    continue
                start = clock.mark()
                optimiser.step()
                optimiser.zero_grad(set_to_none=False)
                spans.append((start, clock.mark()))
        return spans

    def restore(self) -> None:
        with torch.no_grad():
            for params, saved in zip(self.params, self.saved):
                for p, old in zip(params, saved):
                    p.copy_(old)


def backward_marks(
    calls: list[Call], outputs: list, clock: Clock, current: list[Call] | None
) -> tuple[dict[int, tuple], tuple | None]:
    """Every layer's backward in one ``autograd.backward`` call, as a step makes it; (start, end) per
    layer, and (start, end) of the pass's start: from the call to its first layer's first node, which
    no layer is given and a stage pays once per micro-batch (docs/spec.md section 1d's ``pass_start``).

    A call per layer cost the profile the engine's start each time (on cuda a hand-off to the device's
    thread), which a step pays once: vgg16's 38 layers on an H100 summed to 2.6 whole steps. A hook
    marks when each layer's first node starts; a layer ends where the next one to run starts, the last
    where the call returns. The engine runs the newest node first, so the layers run last to first."""
    roots: list[torch.Tensor] = []
    seeds: list[torch.Tensor] = []
    firsts: dict = {}  # a layer's output node -> the layer
    started: dict[int, object] = {}
    for i, out in enumerate(outputs):
        if out is None:
            continue
        for tensor in tensors_of(out):
            if tensor.requires_grad:
                roots.append(tensor)
                seeds.append(torch.ones_like(tensor))
            if tensor.grad_fn is not None:
                firsts.setdefault(tensor.grad_fn, i)
    if not roots:
        return {}, None

    def starting(i: int):
        def hook(_grads):
            if i not in started:
                started[i] = clock.mark()
                if current is not None:
                    current[:] = [calls[i]]

        return hook

    handles = [node.register_prehook(starting(i)) for node, i in firsts.items()]
    try:
        base = clock.mark()
        torch.autograd.backward(roots, seeds)
        finish = clock.mark()
    finally:
        for handle in handles:
            handle.remove()
    synchronise("cuda" if clock.cuda else "cpu")
    order = sorted(started, key=lambda i: clock.seconds(base, started[i]))
    spans = {i: (started[i], started[order[n + 1]] if n + 1 < len(order) else finish) for n, i in enumerate(order)}
    return spans, (base, started[order[0]]) if order else None


def storage_key(tensor: torch.Tensor) -> int:
    """Which storage holds ``tensor``: the same for its views, and for fake tensors too (which have
    no data pointer)."""
    from torch.multiprocessing.reductions import StorageWeakRef

    return StorageWeakRef(tensor.untyped_storage()).cdata


def shared_with_previous(model: Model, calls: list[Call], device: str) -> list[float]:
    """Per layer, bytes per batch of the tensors it keeps for backward that the layer before it also
    keeps, in one forward of the whole model (a ReLU keeps its output, the next layer its input: one
    tensor). Parameters are left out; the first layer's is 0. The layers are the calls in the order
    :func:`~.models.trace` recorded them, each a firing of a layer's forward."""
    params = {storage_key(p) for p in model.module.parameters()}
    kept: list[dict[int, int]] = [{} for _ in calls]
    at = {"call": -1, "inside": False}

    def enter(_module, _args):
        at["call"] += 1
        at["inside"] = True

    def leave(_module, _args, _out):
        at["inside"] = False

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        key = storage_key(tensor)
        if at["inside"] and 0 <= at["call"] < len(calls) and key not in params and not from_parameters(tensor, params):
            kept[at["call"]].setdefault(key, tensor.untyped_storage().nbytes())
        return tensor

    modules = list(dict.fromkeys(call.module for call in calls))
    handles = [m.register_forward_pre_hook(enter) for m in modules] + [m.register_forward_hook(leave) for m in modules]
    inputs = tuple(x.to(device) for x in model.inputs)
    try:
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            out = model.module(*inputs)
        del out
    finally:
        for handle in handles:
            handle.remove()
    if at["call"] + 1 != len(calls):  # a forward that calls its layers differently from the trace
        return [0.0] * len(calls)
    return [0.0] + [float(sum(n for ptr, n in kept[i].items() if ptr in kept[i - 1])) for i in range(1, len(calls))]


def from_parameters(tensor: torch.Tensor, params: set[int], depth: int = 8) -> bool:
    """Whether autograd made ``tensor`` from parameters alone (in ``params``, by storage), as autocast's
    half-precision copy of a weight: no input of the layer reaches it, so its bytes do not grow with
    the batch. Casts, transposes and views are a few nodes deep; deeper graphs count as data."""
    node, todo = tensor.grad_fn, [(tensor.grad_fn, 0)]
    if node is None:
        return False
    while todo:
        node, level = todo.pop()
        if node is None or level > depth:
            return False
        variable = getattr(node, "variable", None)
        if variable is not None:
            if storage_key(variable) not in params:
                return False
            continue
        todo.extend((following, level + 1) for following, _ in node.next_functions)
    return True


def saved_bytes(call: Call, device: str) -> tuple[float, float]:
    """Bytes the layer keeps for its backward pass on one batch: the tensors autograd saves during
    one forward on fresh copies of its inputs, each storage once, its own parameters left out; and,
    apart, those made from its parameters alone (docs/spec.md section 1b's ``cast_size``: autocast's
    half-precision weight copies, the same bytes whatever the batch)."""
    params = {storage_key(p) for p in call.module.parameters()}
    seen: dict[int, int] = {}
    copies: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        key = storage_key(tensor)
        if key not in params:
            (copies if from_parameters(tensor, params) else seen).setdefault(key, tensor.untyped_storage().nbytes())
        return tensor

    args, kwargs = call.fresh(device)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = call.module(*args, **kwargs)
    del out
    return float(sum(seen.values())), float(sum(copies.values()))
