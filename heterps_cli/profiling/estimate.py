"""Estimated profiles: each layer's time on a device you do not have, from a roofline model.

``heterps profile MODEL --as a100 --estimate a100-80gb`` runs nothing on an A100.
It counts what each layer does, here on the CPU, and prices that on a device
of the catalogue (``devices.yaml``, or ``--catalogue FILE``):

* **FLOPs** of the layer's forward and backward, from
  ``torch.utils.flop_counter.FlopCounterMode`` (matrix products, convolutions,
  attention; element-wise work counts as none);
* **bytes** moved, from the tensors' sizes: the forward reads its input and
  weights and writes its output; the backward reads the output's gradient, the
  input and the weights, and writes the input's and the weights' gradients
  (``3 x input + 2 x output + 3 x weights``; a lookup, whose inputs are integer
  indices, counts its weights once: it reads only the rows it indexes);
* **kernels**: the operators dispatched in that forward and backward.

``oct = max(flops / (peak x efficiency), bytes / (bandwidth x memory_efficiency))
+ kernels x launch``. The peak is that of the model's precision: an fp32
matrix product runs at the fp32 peak (PyTorch does not use TF32 for them by
default), an fp32 convolution at the TF32 peak where the device has one
(cuDNN does, by default). ``efficiency`` is per layer kind.

``--calibrate MEASURED.yaml`` fits the efficiencies to a measured profile of the
same model on a catalogued device (this machine's CPU, say): per kind, the
median over its layers of measured / estimated time (launch floor aside)
divides both efficiencies, so that the estimate inherits what the measurement
saw. odt is the gradient all-reduce over the device's typical network; alpha
is the kind's default and beta is 0, as in a measured GPU profile.

``--tp 2,4`` adds each layer's times and one unit's sizes at those
tensor-parallel degrees (docs/spec.md section 1h), for what ``heterps run``
executes there: one shard of the layer's pairs of linear layers
(:func:`heterps_cli.runtime.sharding.one_shard`) counted and priced as above,
the rest of the layer whole on every unit, plus a ring all-reduce among the
``d`` units of each pair's output in the forward pass and of its input's
gradient in the backward, ``2 (d - 1) / d x bytes`` over the device's
``link_gbps`` and one launch floor each. A layer with no such pair runs whole on
every unit: its times and sizes at ``d`` are those at 1.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from heterps_cli.errors import SIGNALLED, InputError
from heterps_cli.formats import Catalogue, DeviceSpec, load_catalogue
from heterps_cli.profiling.measure import (
    ALPHA_DEFAULTS,
    ALPHA_OTHER,
    LayerProfile,
    layer_profile,
    traced,
    weight_bytes,
    with_shared,
)
from heterps_cli.profiling.models import Call, Model, bytes_of, kind, model_error, tensors_of
from heterps_cli.profiling.timing import shared_with_previous
from heterps_cli.progress import Progress, quiet
from heterps_cli.runtime.sharding import one_shard

CATALOGUE = Path(__file__).with_name("devices.yaml")
# Operators that only re-describe a tensor's memory: no kernel runs for them.
VIEWS = {
    "view",
    "_unsafe_view",
    "t",
    "transpose",
    "permute",
    "expand",
    "detach",
    "alias",
    "as_strided",
    "unsqueeze",
    "squeeze",
    "reshape",
    "slice",
    "select",
    "split",
    "split_with_sizes",
    "unbind",
    "_reshape_alias",
}


@dataclass(frozen=True)
class Work:
    """What one layer does in a forward and backward pass, on one batch."""

    flops: float
    bytes: float
    kernels: int
    forward: Work | None = None  # the forward pass's own share of the three (docs/spec.md section 1g)


class _Kernels(TorchDispatchMode):
    """Counts the operators that run a kernel."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ not in VIEWS:
            self.count += 1
        return func(*args, **(kwargs or {}))


def work(call: Call) -> Work:
    """FLOPs, bytes and kernels of ``call``'s layer alone, forward then backward (ones as the output's
    gradient), on fresh copies of its recorded inputs: what ``heterps profile`` times."""
    args, kwargs = call.fresh("cpu")
    for p in call.module.parameters():
        p.grad = None
    flops = FlopCounterMode(display=False)
    kernels = _Kernels()
    with flops, kernels:
        out = call.module(*args, **kwargs)
        forward_flops, forward_kernels = float(flops.get_total_flops()), kernels.count
        outs = [o for o in tensors_of(out) if o.requires_grad]
        if outs:
            torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
    weights = weight_bytes(call.module)
    # A lookup (integer inputs: an embedding) reads only the rows it indexes and needs no input gradient,
    # so of its weights only the gradient's write is counted.
    lookup = not any(t.is_floating_point() for t in tensors_of((call.args, call.kwargs)))
    moved = 3 * bytes_of((call.args, call.kwargs)) + 2 * bytes_of(out) + (1 if lookup else 3) * weights
    # the forward reads its inputs and weights (a lookup: none counted, as above) and writes its output
    ahead = bytes_of((call.args, call.kwargs)) + bytes_of(out) + (0 if lookup else weights)
    return Work(float(flops.get_total_flops()), moved, kernels.count, Work(forward_flops, ahead, forward_kernels))


def precision(call: Call, layer_kind: str, device: DeviceSpec) -> str:
    """Which of the device's peaks the layer runs at (see the module docstring)."""
    dtypes = {p.dtype for p in call.module.parameters()} | {
        t.dtype for t in tensors_of(call.args) if t.is_floating_point()
    }
    if torch.bfloat16 in dtypes:
        return "bf16"
    if torch.float16 in dtypes:
        return "fp16"
    if layer_kind == "conv" and device.tflops.tf32 is not None:
        return "tf32"
    return "fp32"


def roofline(w: Work, device: DeviceSpec, peak: str, efficiency: float, memory_efficiency: float) -> float:
    """The layer's time without its launch floor: compute-bound or memory-bound, whichever is longer."""
    tflops = getattr(device.tflops, peak) or device.tflops.fp32
    assert tflops is not None  # the catalogue requires fp32
    return max(w.flops / (tflops * 1e12 * efficiency), w.bytes / (device.memory_gbps * 1e9 * memory_efficiency))


@dataclass
class Estimate:
    """How one layer's time was found (the time itself is its LayerProfile's oct): its work, the peak
    it runs at, and the compute efficiency applied (after calibration)."""

    work: Work
    peak: str
    efficiency: float


@dataclass(frozen=True)
class Sharded:
    """How one layer's times at a tensor-parallel degree were found: the pairs of linear layers split
    (0: the layer runs whole on every unit), the bytes all-reduced per batch among the units (forward
    and backward), and those all-reduces' time."""

    pairs: int
    reduced: float = 0.0
    reduce_s: float = 0.0


@dataclass
class Estimated:
    """An estimated profile, ready to write (:func:`heterps_cli.profiling.write.estimated_text`)."""

    model: str
    resource: str
    device: str  # catalogue name
    spec: DeviceSpec
    batch_size: int
    layers: list[LayerProfile]  # as measure() gives them
    estimates: list[Estimate]  # one per layer
    calibration: dict[str, float] = field(default_factory=dict)  # kind -> factor on the time
    calibrated_on: str | None = None  # "path (device)"
    catalogue: str = "built in"
    notes: list[str] = field(default_factory=list)
    degrees: dict[int, list[LayerProfile]] = field(default_factory=dict)  # --tp: per degree, one unit's layers
    sharded: dict[int, list[Sharded]] = field(default_factory=dict)  # --tp: per degree, how

    @property
    def total_oct(self) -> float:
        return sum(layer.oct for layer in self.layers)

    @property
    def factors(self) -> str:
        """The calibration's factors per kind, as the file and the view show them."""
        return ", ".join(f"{k} x{v:.3g}" for k, v in sorted(self.calibration.items()))


def catalogue_device(catalogue: Catalogue, name: str, path: str, option: str) -> DeviceSpec:
    if name not in catalogue.devices:
        raise InputError(
            None,
            None,
            option,
            f"{name!r} is not in the device catalogue {path} (it has: {', '.join(catalogue.devices)})",
        )
    return catalogue.devices[name]


def _efficiency(catalogue: Catalogue, layer_kind: str) -> float:
    return catalogue.efficiency.get(layer_kind, catalogue.efficiency["other"])


def _core(w: Work, call: Call, layer_kind: str, device: DeviceSpec, catalogue: Catalogue) -> tuple[str, float]:
    """The peak the layer runs at on ``device``, and its roofline time with the catalogue's efficiencies."""
    peak = precision(call, layer_kind, device)
    return peak, roofline(w, device, peak, _efficiency(catalogue, layer_kind), catalogue.memory_efficiency)


def _launch(w: Work, device: DeviceSpec) -> float:
    return w.kernels * device.launch_us * 1e-6


UPDATE_PASSES = 4  # SGD reads the weights and their gradients and writes the weights; the reset writes the gradients
UPDATE_KERNELS = 2  # the step and the reset


def update_estimate(weights: float, device: DeviceSpec, catalogue: Catalogue) -> float:
    """Section 1d's ``update`` on ``device``: the optimiser step and the gradients' reset move the weights'
    bytes ``UPDATE_PASSES`` times at the memory bandwidth reached, plus their launches. Timing it on
    this machine instead gave a V100 this CPU's time, 29 us to 16 ms for one layer from run to run."""
    if weights == 0:
        return 0.0
    reached = device.memory_gbps * 1e9 * catalogue.memory_efficiency
    return UPDATE_PASSES * weights / reached + UPDATE_KERNELS * device.launch_us * 1e-6


def fit(
    calls: list[Call], works: list[Work], measured: dict[str, float], device: DeviceSpec, catalogue: Catalogue
) -> dict[str, float]:
    """Per layer kind, the median of (measured - launch floor) / roofline over that kind's layers; "other"
    is the median over all layers (for kinds the measurement did not see)."""
    ratios: dict[str, list[float]] = {}
    for call, w in zip(calls, works):
        layer_kind = kind(call.module)
        _, core = _core(w, call, layer_kind, device, catalogue)
        if core > 0:
            ratios.setdefault(layer_kind, []).append(max(measured[call.name] - _launch(w, device), 0.0) / core)
    factors = {k: max(statistics.median(v), 1e-3) for k, v in ratios.items()}
    everything = [r for v in ratios.values() for r in v]
    factors["other"] = max(statistics.median(everything), 1e-3) if everything else 1.0
    return factors


def _calibration(
    path: str, on: str | None, calls: list[Call], batch_size: int, catalogue: Catalogue
) -> tuple[str, dict[str, float]]:
    """The catalogue device whose measurement in the profile ``path`` calibrates the estimate, and each
    layer's measured oct on it: the profile must be of the same layers at the same batch size (else an
    exit-2 error naming it)."""
    from heterps_cli.formats import load_profile

    profile, doc = load_profile(path)
    names = [layer.name for layer in profile.layers]
    if names != [c.name for c in calls]:
        raise doc.error(
            ("layers",),
            f"the layers ({len(names)}) differ from the model's ({len(calls)}) in number, names or order: "
            "calibrate with a measured profile of the same model (and --granularity)",
        )
    if profile.batch_size != batch_size:
        raise doc.error(
            ("batch_size",),
            f"measured at batch size {profile.batch_size}, the estimate is for {batch_size}: calibrate with a "
            "profile measured at the same --batch-size",
        )
    types = sorted({t for layer in profile.layers for t in layer.times})
    on = on or (types[0] if len(types) == 1 else None)
    if on is None:
        raise InputError(
            path, None, "--calibrate-on", f"the profile has several types ({', '.join(types)}): name the one to fit to"
        )
    if on not in types:
        raise InputError(path, None, "--calibrate-on", f"the profile has no type {on!r} ({', '.join(types)})")
    if on not in catalogue.devices:
        raise InputError(
            path,
            None,
            "--calibrate-on",
            f"type {on!r} of the profile is not a catalogue device ({', '.join(catalogue.devices)}): "
            "name the device it was measured on with --calibrate-on DEVICE",
        )
    return on, {layer.name: layer.times[on].oct for layer in profile.layers}


def estimate(
    model: Model,
    resource: str,
    device_name: str,
    *,
    catalogue_path: str | None = None,
    calibrate: str | None = None,
    calibrate_on: str | None = None,
    tp: tuple[int, ...] = (),
    progress: Progress | None = None,
) -> Estimated:
    """The estimated profile of ``model`` as type ``resource`` on catalogue device ``device_name``, at
    tensor-parallel degree 1 and each of ``tp``."""
    report = progress or quiet
    path = catalogue_path or str(CATALOGUE)
    catalogue = load_catalogue(path)
    device = catalogue_device(catalogue, device_name, path, "--estimate")
    if tp and device.link_gbps is None:
        raise InputError(
            path,
            None,
            "--tp",
            f"device {device_name!r} of the catalogue gives no link_gbps (its link to the other devices of its "
            "node), which tensor parallelism's all-reduces need: add it (see --catalogue)",
        )
    report("tracing the model")
    calls, notes = traced(model)
    B0 = len(model.inputs[0])
    current: list[Call] = []
    steps = len(calls) * (1 + len(tp))

    def counted(i: int, call: Call, what: str) -> Work:
        current[:] = [call]
        report(f"counting {what}layer {i % len(calls) + 1}/{len(calls)}: {call.name}", completed=i, total=steps)
        return work(call)

    try:
        works = [counted(i, call, "") for i, call in enumerate(calls)]
        factors: dict[str, float] = {}
        calibrated_on = None
        if calibrate is not None:
            on, measured = _calibration(calibrate, calibrate_on, calls, B0, catalogue)
            factors = fit(calls, works, measured, catalogue.devices[on], catalogue)
            calibrated_on = f"{calibrate} ({on})"
        price = _Pricing(device, catalogue, factors, B0)
        layers = [price.layer(call, w) for call, w in zip(calls, works)]
        estimates = [price.how(call, w) for call, w in zip(calls, works)]
        layers = with_shared(layers, shared_with_previous(model, calls, "cpu"), B0)
        degrees: dict[int, list[LayerProfile]] = {}
        sharded: dict[int, list[Sharded]] = {}
        for n, d in enumerate(tp):
            degrees[d], sharded[d] = [], []
            for i, (call, layer) in enumerate(zip(calls, layers)):
                split = one_shard(call.module, d)
                if split is None:  # runs whole on every unit: as at tp 1
                    degrees[d].append(layer)
                    sharded[d].append(Sharded(0))
                    continue
                part = dataclasses.replace(call, module=split[0])
                w = counted((n + 1) * len(calls) + i, part, f"tp {d}: ")
                ahead, back = all_reduced(part, split[1])
                reduce_s = ring(ahead, d, device) + ring(back, d, device)
                shard = price.layer(part, w, communication=(ring(ahead, d, device), reduce_s))
                degrees[d].append(dataclasses.replace(shard, input_saved=min(layer.input_saved, shard.activation_size)))
                sharded[d].append(Sharded(len(split[1]) // 2, ahead + back, reduce_s))
    except SIGNALLED:
        raise
    except InputError:
        raise
    except BaseException as exc:  # the user's code: sys.exit and its own BaseExceptions too
        raise model_error(model, exc, f"layer {current[0].name if current else '?'} failed when run alone") from None
    report("done", completed=steps, total=steps)
    shown = path if catalogue_path is not None else "built in (heterps_cli/profiling/devices.yaml)"
    return Estimated(
        model.name,
        resource,
        device_name,
        device,
        B0,
        layers,
        estimates,
        factors,
        calibrated_on,
        shown,
        notes,
        degrees,
        sharded,
    )


@dataclass(frozen=True)
class _Pricing:
    """A layer's counted work priced on one device, by the calibration's factor per kind."""

    device: DeviceSpec
    catalogue: Catalogue
    factors: dict[str, float]
    B0: int

    def _factor(self, layer_kind: str) -> float:
        return self.factors.get(layer_kind, self.factors["other"]) if self.factors else 1.0

    def layer(self, call: Call, w: Work, communication: tuple[float, float] = (0.0, 0.0)) -> LayerProfile:
        """The layer's profile: its roofline by the factor, launches, and ``communication``'s seconds
        (in its forward pass, in all) added to forward and to oct."""
        layer_kind = kind(call.module)
        factor = self._factor(layer_kind)
        oct_ = _core(w, call, layer_kind, self.device, self.catalogue)[1] * factor + _launch(w, self.device)
        forward = None
        if w.forward is not None:  # its own roofline, by the same factor: never more than oct
            forward = _core(w.forward, call, layer_kind, self.device, self.catalogue)[1] * factor
            forward += _launch(w.forward, self.device) + communication[0]
        network = self.device.network_gbps * 1e9 / 8
        alpha = ALPHA_DEFAULTS.get(layer_kind, ALPHA_OTHER)
        update = update_estimate(weight_bytes(call.module), self.device, self.catalogue)
        return layer_profile(
            call, self.B0, oct_ + communication[1], network, alpha, "cpu", update=update, forward=forward
        )

    def how(self, call: Call, w: Work) -> Estimate:
        layer_kind = kind(call.module)
        peak = precision(call, layer_kind, self.device)
        return Estimate(w, peak, _efficiency(self.catalogue, layer_kind) / self._factor(layer_kind))


def all_reduced(call: Call, pairs: dict[str, str]) -> tuple[float, float]:
    """Bytes per batch one shard all-reduces among its replica's units (section 1h): each row-parallel
    layer's output in the forward pass, each column-parallel layer's input gradient in the backward."""
    forward, backward = [0.0], [0.0]

    def seen(style: str):
        def hook(module, inputs, output):
            if style == "rowwise":
                forward[0] += bytes_of(output)
            else:
                backward[0] += bytes_of(inputs)

        return hook

    handles = [call.module.get_submodule(name).register_forward_hook(seen(style)) for name, style in pairs.items()]
    try:
        args, kwargs = call.fresh("cpu")
        with torch.no_grad():
            call.module(*args, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    return forward[0], backward[0]


def ring(size: float, d: int, device: DeviceSpec) -> float:
    """Seconds of a ring all-reduce of ``size`` bytes among ``d`` devices of one node: each sends and
    receives ``2 (d - 1) / d`` of it over its ``link_gbps``, plus one launch floor."""
    if size == 0:
        return 0.0
    assert device.link_gbps is not None  # estimate() refuses --tp without it
    return 2 * (d - 1) / d * size / (device.link_gbps * 1e9 / 8) + device.launch_us * 1e-6


def measure_cpu_core() -> tuple[float, float]:
    """(TFLOP/s, GB/s) of one core of this machine: the better of a one-thread 2048 x 2048 fp32
    matmul and a one-thread 3x3 convolution (256 channels, 16 x 16, batch 32: oneDNN reached twice
    the matmul's rate here), and a one-thread add of 128 MiB tensors into a preallocated output
    (best of 5 each)."""
    import time

    def best(run: Callable[[], object]) -> float:
        run()
        fastest = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            run()
            fastest = min(fastest, time.perf_counter() - start)
        return fastest

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
        conv, image = torch.nn.Conv2d(256, 256, 3, padding=1), torch.randn(32, 256, 16, 16)
        x, y, z = torch.randn(32 << 20), torch.randn(32 << 20), torch.empty(32 << 20)
        with torch.no_grad():
            matmul = 2 * 2048**3 / best(lambda: a @ b)
            convolution = 2 * 32 * 256 * 256 * 9 * 16 * 16 / best(lambda: conv(image))
        bandwidth = 3 * x.numel() * 4 / best(lambda: torch.add(x, y, out=z))
    finally:
        torch.set_num_threads(threads)
    return max(matmul, convolution) / 1e12, bandwidth / 1e9
