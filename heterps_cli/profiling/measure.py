"""Measure a PyTorch model's layers: the numbers of a profile (docs/spec.md section 2), from the machine it runs on.

* **Layers** are the modules a forward pass calls, in the order it calls them:
  the leaf modules (``nn.MultiheadAttention`` counts as one), or the factory's
  own list of blocks. A forward pre-hook records each layer's inputs.
* **oct**: each layer alone, on copies of its recorded inputs, forward then
  backward (ones as the output gradient, parameter gradients reset between
  runs, as ``zero_grad(set_to_none=True)`` does); the median of at least 20
  timed runs. On cpu one unit is one core, so it runs on one thread; on cuda
  the device is synchronised around each run. Two things keep a second
  profile close to the first (``benchmarks/bench_profile.py`` measures it):
  a few whole-model steps first, so that the allocator, the kernels and the
  caches are warm before any layer is timed (their median is also reported,
  beside the sum of the layers), and the runs are taken in
  :data:`ROUNDS` interleaved rounds over all layers, so that a slow spell of
  the machine is spread over every layer rather than landing on one. A short
  layer gets more runs (up to :data:`MAX_RUNS`), until they add up to
  :data:`MIN_SECONDS`, so that its median rests on more than a few
  milliseconds of the machine's time.
* **odt**: what a layer communicates wherever it runs inside its stage, its
  gradient synchronisation (an all-reduce as big as its weights), over the link
  bandwidth: measured (cpu: an all-reduce between two processes over loopback
  gloo; cuda: a pinned host-to-device copy) or given (``--link-gbps``).
  Activations are not in it: they move only at stage boundaries, which docs/spec.md
  section 1b charges from ``input_size`` and the cluster's ``bandwidth_gbps``.
* **activation_size** (docs/spec.md section 1b): the bytes per sample a layer keeps for
  its backward pass, counted with ``torch.autograd.graph.saved_tensors_hooks``
  around one forward of the layer alone, each storage once, its own parameters
  left out (they are training state, counted from ``weight_size``).
* **sharded**: a module with the attribute ``heterps_sharded = True`` (the zoo's
  CTR embedding tables, which live on parameter servers) is marked ``sharded``.
* **alpha**: a least-squares fit of T(k) = T1 (1 - a + a/k) to the best of 5
  runs of the layer at batch B0/k for k = 1, 2, 4 (those that divide B0): what
  each of k replicas runs, as the model's k splits a batch between replicas
  (docs/spec.md section 1). When fewer than two k divide B0, the inputs cannot
  be split along their first dimension, the times are too short to fit
  (< 50 us), or the fit misses its points by more than 10%, the layer gets
  :data:`ALPHA_DEFAULTS` for its kind, marked estimated.
* **beta** is derived, not measured: odt is the gradient all-reduce, whose
  volume per replica does not shrink with more replicas, so beta is 0; marked
  estimated.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import importlib
import importlib.util
import inspect
import signal
import socket
import statistics
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from heterps_cli.errors import InputError
from heterps_cli.formats import check_name
from heterps_cli.profiling.zoo import MODELS
from heterps_cli.progress import Progress, quiet

WARMUP = 3
WARMUP_STEPS = 3  # whole-model forward+backward steps before any layer is timed
ROUNDS = 4  # the timed runs of every layer are split over this many interleaved rounds
MIN_SECONDS = 0.25  # short layers get more runs, up to MAX_RUNS, until their runs add up to this
MAX_RUNS = 200
FIT_TRIALS = 5  # runs per batch share for the alpha fit; the minimum is kept
FIT_SPLITS = (1, 2, 4)  # the alpha fit times the layer at batch B0/k: one of k replicas' share
SHORTEST_FIT = 50e-6  # s: below this, scaling is noise
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


# -- loading a model -------------------------------------------------------------


@dataclass
class Model:
    name: str
    module: nn.Module
    inputs: tuple  # positional inputs of one batch
    blocks: list[nn.Module] | None = None  # the factory's own layers, if it gave them
    source: str | None = None  # the user's file the factory came from (errors name its lines)


def load_model(
    spec: str, batch_size: int, input_shape: tuple[int, ...] | None = None, granularity: str = "layers"
) -> Model:
    """A zoo name, ``path/to/file.py:factory`` or ``package.module:factory``; errors are exit-2 InputErrors.
    ``granularity="blocks"``: its layers are the finest modules at which it is a chain
    (:mod:`heterps_cli.profiling.granularity`), unless the factory gave its own blocks."""
    model = _load_model(spec, batch_size, input_shape)
    check_name(model.name, "MODEL")  # the profile's model: a file name of 300 characters would not read back
    if granularity == "blocks" and model.blocks is None:
        from heterps_cli.profiling.granularity import at_blocks

        model = at_blocks(model)
    return model


def _load_model(spec: str, batch_size: int, input_shape: tuple[int, ...] | None) -> Model:
    if spec in MODELS:
        try:
            module, example = MODELS[spec](batch_size, input_shape)
        except (RuntimeError, MemoryError) as exc:  # the allocator: a batch past this machine's memory
            raise InputError(
                None,
                None,
                "batch_size",
                f"building {spec}'s example batch of {batch_size:,} samples failed ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else 'out of memory'}): give a batch this machine can hold",
            ) from None
        return Model(spec, module, example if isinstance(example, tuple) else (example,))
    if ":" not in spec:
        raise InputError(
            None,
            None,
            "MODEL",
            f"{spec!r} is neither a built-in model ({', '.join(MODELS)}) nor FILE.py:FACTORY / package.module:FACTORY",
        )
    where, name = spec.rsplit(":", 1)
    factory = _factory(where, name)
    kwargs: dict[str, Any] = {}
    accepted = inspect.signature(factory).parameters
    if "batch_size" in accepted:
        kwargs["batch_size"] = batch_size
    if "input_shape" in accepted:
        kwargs["input_shape"] = input_shape
    try:
        made = factory(**kwargs)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # the user's code: sys.exit and its own BaseExceptions too
        raise _user_error(where, name, exc, "raised") from None
    model = _model_from(made, where, name, batch_size, input_shape)
    try:
        model.source = where if where.endswith(".py") else inspect.getsourcefile(factory)
    except TypeError:  # a factory written in C has no source file
        pass
    return model


def _factory(where: str, name: str) -> Callable:
    try:
        if where.endswith(".py"):
            path = Path(where)
            if not path.is_file():
                raise InputError(where, None, None, "file not found")
            spec = importlib.util.spec_from_file_location(f"heterps_user_{path.stem}", path)
            if spec is None or spec.loader is None:
                raise InputError(where, None, None, "cannot be imported as a Python module")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            try:
                module = importlib.import_module(where)
            except ModuleNotFoundError as exc:
                # A profile of FILE.py:FACTORY names its model STEM:FACTORY; the file is found again
                # where it was, the current directory, which a console script does not put on sys.path.
                beside = Path(*where.split(".")).with_suffix(".py")
                if exc.name != where.split(".")[0] or not beside.is_file():
                    raise
                return _factory(str(beside), name)
    except InputError:
        raise
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # the user's code: sys.exit and its own BaseExceptions too
        raise _user_error(where, None, exc, "could not be loaded:") from None
    factory = getattr(module, name, None)
    if not callable(factory):
        raise InputError(where, None, name, "no such function in this module")
    return factory


def _user_line(source: str | None, exc: BaseException) -> int | None:
    """The line of ``source`` nearest to where ``exc`` was raised (its last frame in that file)."""
    line = None
    if source is None:
        return None
    for frame in traceback.extract_tb(exc.__traceback__):
        if Path(frame.filename).resolve() == Path(source).resolve():
            line = frame.lineno
    return line


def model_error(model: Model, exc: BaseException, what: str) -> InputError:
    """The model failed while we ran it: name the user's file and line when the failure passed through it."""
    line = _user_line(model.source, exc)
    where = model.source if line is not None else None
    return InputError(
        where,
        line,
        "MODEL" if where is None else None,
        f"{what}: {failure(exc)}" + ("" if where else f" (model {model.name})"),
    )


def failure(exc: BaseException) -> str:
    """How the user's code failed, in words: ``ValueError: ...``, or ``called sys.exit(0): ...``."""
    if isinstance(exc, SystemExit):
        return f"called sys.exit({exc.code!r}): it must return or raise, not exit"
    return f"{type(exc).__name__}: {exc}"


def _user_error(where: str, name: str | None, exc: BaseException, what: str) -> InputError:
    """The user's code failed: name their file and the line that raised."""
    line = _user_line(where, exc) if where.endswith(".py") else None
    subject = f"factory {name}()" if name else "the module"
    said = failure(exc) if isinstance(exc, SystemExit) else f"{what} {failure(exc)}"  # "raised" an exit reads wrong
    return InputError(where, line, name, f"{subject} {said}")


def _model_from(made, where: str, name: str, batch_size: int, input_shape) -> Model:
    blocks = None
    if isinstance(made, nn.Module):
        module, example = made, None
    elif isinstance(made, tuple) and len(made) in (2, 3) and isinstance(made[0], nn.Module):
        module, example = made[0], made[1]
        blocks = list(made[2]) if len(made) == 3 else None
        if blocks is not None and not all(isinstance(b, nn.Module) for b in blocks):
            raise InputError(where, None, name, "the third item the factory returns must be a list of modules")
    else:
        raise InputError(
            where,
            None,
            name,
            "the factory must return a torch.nn.Module, or (module, example "
            f"input batch[, list of blocks]); it returned {type(made).__name__}",
        )
    if example is None:
        if not input_shape:
            raise InputError(where, None, name, "the factory returned no example input: give --input-shape")
        example = torch.randn(batch_size, *input_shape, generator=torch.Generator().manual_seed(0))
    inputs = example if isinstance(example, tuple) else (example,)
    if not inputs or not all(isinstance(x, torch.Tensor) for x in inputs):
        raise InputError(where, None, name, "the example input must be a tensor or a tuple of tensors")
    # The example's first dimension is the batch: resize it to --batch-size by repeating rows.
    inputs = tuple(x[torch.arange(batch_size) % x.shape[0]] for x in inputs)
    return Model(f"{Path(where).stem}:{name}" if where.endswith(".py") else f"{where}:{name}", module, inputs, blocks)


# -- finding the layers ------------------------------------------------------------

KIND_OF = [  # (class-name test, kind), first match wins
    (lambda c: c == "Linear" or c.endswith("Linear"), "fc"),
    (lambda c: c.startswith("Conv"), "conv"),
    (lambda c: c.startswith("Embedding"), "embedding"),
    (lambda c: "Pool" in c, "pool"),
    (lambda c: "Norm" in c, "norm"),
    (lambda c: "Attention" in c, "attention"),
    (lambda c: c.startswith("Dropout") or c.endswith("Dropout"), "dropout"),
    (lambda c: c.endswith("Loss"), "loss"),
    (
        lambda c: (
            c
            in {
                "ReLU",
                "ReLU6",
                "GELU",
                "SiLU",
                "Sigmoid",
                "Tanh",
                "LeakyReLU",
                "ELU",
                "Softmax",
                "LogSoftmax",
                "Mish",
                "Hardswish",
                "PReLU",
                "Softplus",
                "GLU",
            }
        ),
        "activation",
    ),
]


def kind(module: nn.Module) -> str:
    """The profile's layer type of a module: Linear -> fc, Conv* -> conv, ..., else its class name, lower-cased."""
    name = type(module).__name__
    return next((k for test, k in KIND_OF if test(name)), name.lower())


@dataclass
class Call:
    name: str
    module: nn.Module
    args: tuple
    kwargs: dict


def layers_of(model: Model) -> dict[nn.Module, str]:
    named = {m: n for n, m in model.module.named_modules()}
    if model.blocks is not None:
        return {b: named.get(b, f"block{i}") for i, b in enumerate(model.blocks)}
    out: dict[nn.Module, str] = {}
    inside: set[nn.Module] = set()
    for n, m in model.module.named_modules():
        if m in inside:
            continue
        if isinstance(m, nn.MultiheadAttention):
            inside.update(m.modules())
            out[m] = n
        elif not list(m.children()):
            out[m] = n
    return out


def trace(model: Model) -> list[Call]:
    """The layers in the order one forward pass calls them, each with a copy of its inputs."""
    layers, calls, handles = layers_of(model), [], []
    seen: dict[str, int] = {}

    def record(module, args, kwargs):
        name = layers[module] or type(module).__name__.lower()
        seen[name] = seen.get(name, 0) + 1
        unique = name if seen[name] == 1 else f"{name}#{seen[name]}"
        calls.append(Call(unique, module, _detached(args), _detached(kwargs)))

    for module in layers:
        handles.append(module.register_forward_pre_hook(record, with_kwargs=True))
    try:
        with torch.no_grad():
            model.module(*model.inputs)
    finally:
        for h in handles:
            h.remove()
    return calls


def _detached(value):
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, tuple):
        return tuple(_detached(v) for v in value)
    if isinstance(value, list):
        return [_detached(v) for v in value]
    if isinstance(value, dict):
        return {k: _detached(v) for k, v in value.items()}
    return value


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def _fresh(value, device):
    """A new copy of recorded inputs on ``device``; float tensors require grad, as activations do."""
    if isinstance(value, torch.Tensor):
        copy = value.to(device, copy=True)
        return copy.requires_grad_(True) if copy.is_floating_point() else copy
    if isinstance(value, tuple):
        return tuple(_fresh(v, device) for v in value)
    if isinstance(value, list):
        return [_fresh(v, device) for v in value]
    if isinstance(value, dict):
        return {k: _fresh(v, device) for k, v in value.items()}
    return value


# -- timing ------------------------------------------------------------------------

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


def _synchronise(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _timed(
    module: nn.Module, inputs: Callable[[], tuple[tuple, dict]], device: str, repetitions: int, warmup: int
) -> list[float]:
    """Seconds of ``module``'s forward on ``inputs()`` then the backward of its outputs (ones as their
    gradient); ``repetitions`` runs after ``warmup``. The parameter gradients are zeroed before each
    run, not dropped: the backward then adds into them, as every micro-batch of a training step
    does (an add over the weights that a fresh gradient skips; docs/fidelity.md)."""
    params = [p for p in module.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.zeros_like(p)
    times = []
    for i in range(warmup + repetitions):
        args, kwargs = inputs()
        for p in params:
            if p.grad is not None:
                p.grad.zero_()
        _synchronise(device)
        start = time.perf_counter()
        out = module(*args, **kwargs)
        outs = [o for o in _tensors(out) if o.requires_grad]
        if outs:
            torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
        _synchronise(device)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return times


def run_times(call: Call, device: str, repetitions: int, warmup: int = WARMUP) -> list[float]:
    """One layer alone, on fresh copies of its recorded inputs (which need their gradients, as activations do)."""
    return _timed(
        call.module, lambda: (_fresh(call.args, device), _fresh(call.kwargs, device)), device, repetitions, warmup
    )


def step_times(model: Model, device: str, repetitions: int, warmup: int = WARMUP) -> list[float]:
    """The whole model on one batch: what the layer times should add up to."""
    inputs = tuple(x.to(device) for x in model.inputs)
    return _timed(model.module, lambda: (inputs, {}), device, repetitions, warmup)


def fit_alpha(splits: list[int], seconds: list[float]) -> tuple[float, float] | None:
    """(alpha, relative rms residual) of T(k) = T1 (1 - a + a/k) by least squares, or None if unusable."""
    if len(splits) < 2 or min(seconds) < SHORTEST_FIT:
        return None
    k, t = np.asarray(splits, dtype=float), np.asarray(seconds)
    design = np.stack([np.ones_like(k), 1.0 / k], axis=1)  # T = c0 + c1 / k, c0 = T1 (1 - a), c1 = T1 a
    (c0, c1), *_ = np.linalg.lstsq(design, t, rcond=None)
    if c0 + c1 <= 0:
        return None
    residual = float(np.sqrt(np.mean((design @ [c0, c1] - t) ** 2)) / t.mean())
    alpha = c1 / (c0 + c1)
    if not -0.05 <= alpha <= 1.05 or residual > 0.10:
        return None
    return float(min(max(alpha, 0.0), 1.0)), residual


# -- bandwidth ---------------------------------------------------------------------


def _allreduce_worker(rank: int, port: int, size: int, rounds: int, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    tensor = torch.ones(size // 4)
    for _ in range(2):
        dist.all_reduce(tensor)
    times = []
    for _ in range(rounds):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(tensor)
        times.append(time.perf_counter() - start)
    dist.destroy_process_group()
    if rank == 0:
        Path(out).write_text(str(statistics.median(times)))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, for a local process group to meet at."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def loopback_allreduce_bandwidth(size: int = 16 << 20, rounds: int = 10, timeout: float = 60.0) -> float | None:
    """Bytes/s of an all-reduce of ``size`` bytes between two processes over loopback gloo, or None."""
    import torch.multiprocessing as mp

    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "median")
        ctx = mp.get_context("spawn")
        procs = [
            ctx.Process(target=_allreduce_worker, args=(r, port, size, rounds, out), daemon=True) for r in range(2)
        ]
        try:
            with _sigint_ignored():
                for p in procs:
                    p.start()
            deadline = time.monotonic() + timeout
            for p in procs:
                p.join(max(0.0, deadline - time.monotonic()))
        finally:  # on Ctrl-C too: heterps exits with os._exit, which runs no atexit clean-up of daemons
            for p in procs:
                if p.is_alive():
                    p.kill()
                    p.join()
        if not Path(out).exists():
            return None
        return size / float(Path(out).read_text())


@contextlib.contextmanager
def _sigint_ignored():
    """Children started inside ignore SIGINT (a spawned interpreter keeps an ignored SIGINT ignored):
    Ctrl-C reaches the whole foreground process group, and only this process should answer it,
    by ending them, rather than each child printing its own KeyboardInterrupt traceback."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def host_to_device_bandwidth(size: int = 64 << 20, rounds: int = 10) -> float:
    """Bytes/s of a pinned host-to-device copy of ``size`` bytes (median of ``rounds``)."""
    host = torch.empty(size, dtype=torch.uint8).pin_memory()
    device = torch.empty(size, dtype=torch.uint8, device="cuda")
    times = []
    for i in range(rounds + 2):
        torch.cuda.synchronize()
        start = time.perf_counter()
        device.copy_(host, non_blocking=True)
        torch.cuda.synchronize()
        if i >= 2:
            times.append(time.perf_counter() - start)
    return size / statistics.median(times)


# -- the whole profile -------------------------------------------------------------


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
    update: float = 0.0  # docs/spec.md section 1d: seconds of the optimiser step on the layer's weights


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

    @property
    def total_oct(self) -> float:
        return sum(layer.oct for layer in self.layers)


def bytes_of(tensors) -> float:
    return float(sum(t.numel() * t.element_size() for t in _tensors(tensors)))


def measure(
    model: Model,
    resource: str,
    *,
    device: str = "cpu",
    repetitions: int = 20,
    link_gbps: float | None = None,
    progress: Progress | None = None,
) -> Profiled:
    """Measure every layer of ``model`` (see the module docstring)."""
    report = progress or quiet
    if device == "cuda" and not torch.cuda.is_available():
        raise InputError(None, None, "device", "cuda was asked for, but torch sees no CUDA device here")
    B0 = len(model.inputs[0])
    report("tracing the model")
    calls, notes = traced(model)
    bandwidth, how = _bandwidth(device, link_gbps, report, notes)
    if not steady_allocator():
        notes.append(
            "the C library is not glibc: the allocator could not be kept from returning memory "
            "to the system, so repeat profiles may differ more on layers with large tensors"
        )
    model.module.to(device)
    threads = torch.get_num_threads()
    total = (ROUNDS + 1) * len(calls)  # the timed rounds, then one alpha fit per layer
    layers = []
    current: list[Call] = []  # the layer being run, for the error message
    try:
        if device == "cpu":
            torch.set_num_threads(1)  # one unit of cpu is one core
        report(f"warming up: {WARMUP_STEPS} whole-model steps", completed=0, total=total)
        try:
            step = statistics.median(step_times(model, device, WARMUP_STEPS, warmup=1))
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # the user's code: sys.exit and its own BaseExceptions too
            raise model_error(model, exc, "the model's forward and backward pass failed") from None
        times = _time_layers(calls, device, repetitions, report, total, current)
        for i, call in enumerate(calls):
            current[:] = [call]
            report(
                f"alpha fit, layer {i + 1}/{len(calls)}: {call.name}", completed=ROUNDS * len(calls) + i, total=total
            )
            layers.append(_layer(call, B0, times[i], bandwidth, device))
        report("done", completed=total, total=total)
    except InputError:
        raise
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # the user's code: sys.exit and its own BaseExceptions too
        raise model_error(model, exc, f"layer {current[0].name if current else '?'} failed when run alone") from None
    finally:
        torch.set_num_threads(threads)
    return Profiled(
        model.name, resource, device, B0, bandwidth, how, ROUNDS * -(-repetitions // ROUNDS), layers, step, notes
    )


def traced(model: Model) -> tuple[list[Call], list[str]]:
    """The model's layers as :func:`trace` gives them (an exit-2 error if the forward fails or calls no
    layer), and the profile's notes on them: whether they form a chain
    (:func:`heterps_cli.profiling.granularity.chain_note`) when they are the leaves."""
    try:
        calls = trace(model)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # the user's code: sys.exit and its own BaseExceptions too
        raise model_error(model, exc, "the model's forward pass failed") from None
    if not calls:
        raise InputError(None, None, "MODEL", "the forward pass called no layer module")
    notes: list[str] = []
    if model.blocks is None:
        from heterps_cli.profiling.granularity import chain_note

        found = chain_note(model)
        if found is not None:
            notes.append(found)
    return calls, notes


def _bandwidth(device: str, link_gbps: float | None, report: Progress, notes: list[str]) -> tuple[float, str]:
    """Bytes/s for odt and how it was found: given, host-to-device (cuda) or a loopback all-reduce (cpu)."""
    if link_gbps is not None:
        return link_gbps * 1e9 / 8, f"given: --link-gbps {link_gbps:g}"
    if device == "cuda":
        report("measuring host-to-device bandwidth")
        bandwidth = host_to_device_bandwidth()
        return bandwidth, f"measured: pinned host-to-device copy, {bandwidth / 1e9:.2f} GB/s"
    report("measuring loopback all-reduce bandwidth (gloo, 2 processes)")
    measured = loopback_allreduce_bandwidth()
    if measured is None:
        how = "estimated: the loopback all-reduce failed, so 10 Gbit/s is assumed"
        notes.append(how)
        return 1.25e9, how
    return measured, f"measured: loopback gloo all-reduce of 16 MiB between 2 processes, {measured / 1e9:.2f} GB/s"


def _time_layers(
    calls: list[Call], device: str, repetitions: int, report: Progress, total: int, current: list[Call]
) -> list[list[float]]:
    """Each layer's run times, in :data:`ROUNDS` interleaved rounds (so that a slow moment of the
    machine spreads over all layers); ``current`` holds the layer running."""
    per_round = -(-repetitions // ROUNDS)
    times: list[list[float]] = [[] for _ in calls]
    for r in range(ROUNDS):
        for i, call in enumerate(calls):
            current[:] = [call]
            report(
                f"round {r + 1}/{ROUNDS}, layer {i + 1}/{len(calls)}: {call.name}",
                completed=r * len(calls) + i,
                total=total,
            )
            runs = per_round
            if r:  # the first round's median says how many runs add up to MIN_SECONDS
                wanted = MIN_SECONDS / max(statistics.median(times[i]), 1e-9)
                runs = max(per_round, min(int(wanted), MAX_RUNS) // ROUNDS)
            times[i] += run_times(call, device, runs, warmup=WARMUP if r == 0 else 1)
    return times


UPDATE_RUNS = 21  # optimiser steps timed per layer; the median is kept


def update_time(module: nn.Module, device: str, runs: int = UPDATE_RUNS) -> float:
    """Median seconds of one optimiser step on the layer's own weights and the reset of their gradients
    (section 1d's ``update``: what a training step does once after its all-reduce), with the optimiser
    ``heterps run`` trains with (SGD); 0 for a layer with none."""
    params = [p for p in module.parameters() if p.requires_grad]
    if not params:
        return 0.0
    saved = [p.detach().clone() for p in params]
    for p in params:
        p.grad = torch.zeros_like(p)
    optimiser = torch.optim.SGD(params, lr=0.0)  # lr 0: the weights stay as they were measured with
    times = []
    with torch.no_grad():
        for _ in range(runs + 1):
            _synchronise(device)
            start = time.perf_counter()
            optimiser.step()
            optimiser.zero_grad(set_to_none=False)
            _synchronise(device)
            times.append(time.perf_counter() - start)
        for p, old in zip(params, saved):
            p.copy_(old)
            p.grad = None
    return statistics.median(times[1:])


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
) -> LayerProfile:
    """A layer's profile from its time and alpha: its sizes and section 1b fields from the recorded call,
    odt its gradient all-reduce (as big as its weights) over ``bandwidth`` bytes/s, beta 0 (derived)."""
    weights = weight_bytes(call.module)
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
        activation_size=saved_bytes(call, device) / B0,
        sharded=bool(getattr(call.module, "heterps_sharded", False)),
        update=update_time(call.module, device),
    )


def _layer(call: Call, B0: int, times: list[float], bandwidth: float, device: str) -> LayerProfile:
    k = kind(call.module)
    oct_ = statistics.median(times)
    cv = statistics.pstdev(times) / statistics.mean(times) if len(times) > 1 else 0.0
    estimated = {}
    alpha, residual = None, None
    splits = [n for n in FIT_SPLITS if B0 % n == 0]
    if len(splits) < 2:
        estimated["alpha"] = f"batch {B0} cannot be split between replicas, nothing to fit: default for {k}"
    else:
        try:
            best = [min(split_times(call, device, B0, B0 // n)) for n in splits]
        except Exception as exc:  # the user's layer may not take a share of its inputs' first dimension
            estimated["alpha"] = f"the layer failed on a share of the batch ({type(exc).__name__}): default for {k}"
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
    return layer_profile(call, B0, oct_, bandwidth, alpha, device, cv=cv, estimated=estimated, residual=residual)


def split_times(call: Call, device: str, batch: int, samples: int) -> list[float]:
    """:func:`run_times` on ``samples`` of the ``batch``: every recorded input whose first dimension
    is the batch is cut to that many (a replica's share, as ``heterps run`` splits them), the rest
    kept whole."""

    def share(value):
        if isinstance(value, torch.Tensor):
            return value[:samples] if value.dim() and value.shape[0] == batch else value
        if isinstance(value, tuple | list):
            return type(value)(share(v) for v in value)
        if isinstance(value, dict):
            return {key: share(v) for key, v in value.items()}
        return value

    args, kwargs = share(call.args), share(call.kwargs)
    return _timed(call.module, lambda: (_fresh(args, device), _fresh(kwargs, device)), device, FIT_TRIALS, 1)


def saved_bytes(call: Call, device: str) -> float:
    """Bytes the layer keeps for its backward pass on one batch: the tensors autograd saves during
    one forward on fresh copies of its inputs, each storage once, its own parameters left out."""
    params = {p.untyped_storage().data_ptr() for p in call.module.parameters()}
    seen: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            seen.setdefault(storage.data_ptr(), storage.nbytes())
        return tensor

    args, kwargs = _fresh(call.args, device), _fresh(call.kwargs, device)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = call.module(*args, **kwargs)
    del out
    return float(sum(seen.values()))


def python_path_note() -> str:
    return f"torch {torch.__version__}, python {sys.version.split()[0]}"
