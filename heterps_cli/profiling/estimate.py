"""Estimated profiles: each layer's time on a device you do not have, operator by operator.

``heterps profile estimate MODEL a100-80gb --as a100`` runs nothing on an A100,
and nothing of the model here either: it builds and runs the model on fake
tensors (:mod:`.counting`), recording every operator of each layer's forward and
backward with its FLOPs, the bytes it reads and writes, its precision and a
product's dimensions. Each operator is priced on a device of the catalogue
(``devices.yaml``, or ``--catalogue FILE``), and the layer's time is their sum:

    kernel = max(flops / (peak x efficiency x shape), bytes / (bandwidth x memory_efficiency))
    layer  = max(sum of its kernels, layer_us + operators x launch_us)     (a GPU)
    layer  = sum of its kernels + operators x launch_us                   (the CPU)

* ``peak`` is the device's for the operator's precision: a half-precision
  operator (``--precision bf16``/``fp16``: autocast) at the half peak, an fp32
  product at the TF32 peak under ``--precision tf32``, an fp32 convolution at
  it by default too (cuDNN allows TF32 for convolutions; PyTorch's default keeps
  products at fp32); fused attention at fp32 on a device with a TF32 peak at a
  third of it: PyTorch's memory-efficient kernel, the one fp32 attention runs
  on compute capability 8.0 and later, does each fp32 product as three TF32
  tensor-core products (CUTLASS's ``OpMultiplyAddFastF32``, "3xTF32"),
  whatever ``--precision`` says of TF32;
* ``efficiency`` is what the device reaches on a large product at that
  precision (the device's ``matmul_efficiency``, measured or fitted, see the
  catalogue), else the catalogue's default per layer kind;
* ``shape`` is ``m/(m+D) x n/(n+D) x k/(k+D)`` for a product of (m, n, k), D the
  catalogue's ``matmul_half_dim`` at the precision: the size at which a
  dimension loses half of its efficiency (tiles partly filled); a product with
  a dimension that is no whole number of 16-byte vectors runs on tensor cores
  at the catalogue's ``matmul_misaligned`` share of that;
* element-wise work, reductions, copies and lookups have no FLOPs: they take
  their bytes at the memory bandwidth reached;
* a GPU runs the kernels while the host issues the next: the layer takes the
  longer of its kernels back to back and the host's time, ``layer_us`` of
  framework per layer (its module call, its backward's start) and ``launch_us``
  per operator. The CPU runs both in turn: each operator takes its
  ``launch_us`` besides its work.

``--calibrate MEASURED.yaml`` fits the estimate to a measured profile of the
same model on a catalogued device (this machine's CPU, say): per layer kind, the
median over its layers of measured / estimated time scales the kind's times, so
that the estimate inherits what the measurement saw. odt is the gradient
all-reduce over the device's typical network; alpha is the kind's default and
beta is 0, as in a measured GPU profile. The last layer also computes the loss
(``--loss``), as training does.

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

import contextlib
import dataclasses
import functools
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from heterps_cli.errors import SIGNALLED, InputError
from heterps_cli.formats import Catalogue, DeviceSpec
from heterps_cli.loading import load_catalogue
from heterps_cli.profiling.counting import AsOnGPU, Op, Recorder, Work, abstract, autocast
from heterps_cli.profiling.measure import (
    ALPHA_DEFAULTS,
    ALPHA_OTHER,
    LayerProfile,
    layer_profile,
    load_model,
    tied_layers,
    traced,
    weight_bytes,
    with_shared,
)
from heterps_cli.profiling.models import Call, Model, bytes_of, failure, kind, layers_run_alone, tensors_of
from heterps_cli.profiling.recurrent import priced_recurrent
from heterps_cli.profiling.ties import Tie
from heterps_cli.profiling.timing import shared_with_previous, with_loss
from heterps_cli.progress import Progress, quiet
from heterps_cli.runtime.sharding import one_shard
from heterps_cli.runtime.synthetic import output_loss

CATALOGUE = Path(__file__).with_name("devices.yaml")


def work(call: Call, precision: str = "fp32", loss: str = "none", gpu: bool = True) -> Work:
    """Every operator of ``call``'s layer alone, forward then backward, on fresh copies of its recorded
    inputs, at ``precision``, as a GPU runs them (or the CPU); with ``loss``, the loss of its output
    (the last layer's: training computes it there) in the forward and from it the backward. As
    ``heterps profile`` times it and a step of micro-batches runs it, the backward adds its weights'
    gradients into those already kept (an ``add_`` of each, reading both and writing one)."""
    args, kwargs = call.fresh("cpu")
    for p in call.module.parameters():  # the backward adds into gradients kept from the last micro-batch
        p.grad = torch.zeros_like(p) if p.requires_grad else None
    recorder = Recorder()
    with recorder, priced_recurrent(call.module), AsOnGPU() if gpu else contextlib.nullcontext():
        with autocast(precision):
            out = call.module(*args, **kwargs)
            outs = [o for o in tensors_of(out) if o.requires_grad]
            if outs:  # the rule of which outputs a loss is taken of is the measured profile's
                outs = [with_loss(outs[0], output_loss(loss, len(outs[0]) if outs[0].dim() else 1))]
        ahead = len(recorder.ops)
        if outs:
            torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
    return Work(tuple(recorder.ops), ahead)


def peak_of(op: Op, precision: str, device: DeviceSpec) -> str:
    """Which of the device's peaks the operator runs at (see the module docstring): its own half
    precision, else TF32 for an fp32 product under ``tf32`` and for an fp32 convolution by default,
    else fp32; a peak the device lacks falls back on fp32."""
    wanted = op.dtype if op.dtype in ("bf16", "fp16") else "fp32"
    if wanted == "fp32" and (precision == "tf32" or (op.conv and precision == "fp32") or op.attention):
        wanted = "tf32"
    return wanted if getattr(device.tflops, wanted) is not None else "fp32"


# PyTorch's fp32 fused attention on a GPU with TF32 splits each fp32 product into three TF32 ones
# (big x big + big x small + small x big: fp32's accuracy on tensor cores), so it runs at a third of the
# TF32 peak (the module docstring).
TF32X3 = 3.0


def products_per_flop(op: Op, peak: str) -> float:
    """How many products at ``peak`` one of the operator's FLOPs takes: 3 for fp32 fused attention run
    as 3xTF32, else 1."""
    return TF32X3 if op.attention and peak == "tf32" and op.dtype not in ("bf16", "fp16") else 1.0


def shape_factor(dims: tuple[int, int, int, int] | None, half: float | None) -> float:
    """``m/(m+D) x n/(n+D) x k/(k+D)``: how much of its large-size efficiency a product of these
    dimensions reaches (1 without dimensions or without D)."""
    if dims is None or not half:
        return 1.0
    return math.prod(d / (d + half) for d in dims[1:])


def aligned(dims: tuple[int, int, int, int] | None, element: int) -> bool:
    """Whether a product's m, n and k are each a whole number of 16-byte vectors of ``element`` bytes,
    as tensor cores load them (a vocabulary of 50,257 is not)."""
    return dims is None or all(d % (16 // element) == 0 for d in dims[1:])


def memory_efficiency(device: DeviceSpec, catalogue: Catalogue) -> float:
    return device.memory_efficiency if device.memory_efficiency is not None else catalogue.memory_efficiency


def compute_efficiency(device: DeviceSpec, catalogue: Catalogue, peak: str, layer_kind: str) -> float:
    """The device's large-product efficiency at ``peak``, else the catalogue's default for the layer kind."""
    given = getattr(device.matmul_efficiency, peak) if device.matmul_efficiency is not None else None
    return given if given is not None else catalogue.efficiency.get(layer_kind, catalogue.efficiency["other"])


@dataclass(frozen=True)
class Pricer:
    """Operators priced on one device at one precision (the module docstring's formula)."""

    device: DeviceSpec
    catalogue: Catalogue
    precision: str = "fp32"

    def core(self, op: Op, layer_kind: str) -> float:
        """One operator's kernel: compute- or memory-bound, whichever is longer."""
        memory = op.bytes / (self.device.memory_gbps * 1e9 * memory_efficiency(self.device, self.catalogue))
        if not op.flops:
            return memory
        peak = peak_of(op, self.precision, self.device)
        tflops = getattr(self.device.tflops, peak) / products_per_flop(op, peak)
        return max(op.flops / (tflops * 1e12 * self.reached(op, layer_kind)), memory)

    def seconds(self, w: Work, layer_kind: str) -> float:
        """The layer's time. A GPU runs the kernels while the host issues the next ones: the longer of
        the kernels back to back and the host's time (``layer_us`` of framework per layer, ``launch_us``
        per operator). The CPU does both in turn: each operator its work and its launch."""
        launch = self.device.launch_us * 1e-6
        if self.device.processor == "cpu":
            return sum(self.core(op, layer_kind) + launch for op in w.ops)
        layer = self.device.layer_us if self.device.layer_us is not None else self.catalogue.layer_us
        kernels = sum(self.core(op, layer_kind) for op in w.ops)
        return max(kernels, layer * 1e-6 + w.kernels * launch) if w.ops else 0.0

    def host_bound(self, w: Work, layer_kind: str) -> bool:
        """Whether a GPU's host issuing the layer's operators takes longer than its kernels run."""
        if self.device.processor == "cpu" or not w.ops:
            return False
        layer = self.device.layer_us if self.device.layer_us is not None else self.catalogue.layer_us
        return layer * 1e-6 + w.kernels * self.device.launch_us * 1e-6 >= sum(self.core(op, layer_kind) for op in w.ops)

    def peaks(self, w: Work) -> str:
        """The peaks its products run at ("-" for none), as the table and the file say them."""
        used = sorted({peak_of(op, self.precision, self.device) for op in w.ops if op.flops})
        return "+".join(used) or "-"

    def reached(self, op: Op, layer_kind: str) -> float:
        """The fraction of its peak a product reaches: the device's efficiency by its shape, and by
        ``matmul_misaligned`` where a dimension is not a whole number of 16-byte vectors."""
        peak = peak_of(op, self.precision, self.device)
        catalogue = self.catalogue
        half = getattr(catalogue.matmul_half_dim, peak) if catalogue.matmul_half_dim else None
        efficiency = compute_efficiency(self.device, catalogue, peak, op.kind or layer_kind)
        reached = efficiency * shape_factor(op.dims, half)
        misaligned = getattr(catalogue.matmul_misaligned, peak) if catalogue.matmul_misaligned else None
        if misaligned is not None and not aligned(op.dims, 2 if peak in ("bf16", "fp16") else 4):
            reached *= misaligned
        return reached

    def efficiency(self, w: Work, layer_kind: str) -> float:
        """The compute efficiency its products reach, FLOP-weighted (shape included); 0 without any."""
        total = w.flops
        return sum(op.flops * self.reached(op, layer_kind) for op in w.ops if op.flops) / total if total else 0.0


@dataclass
class Estimate:
    """How one layer's time was found (the time itself is its LayerProfile's oct): its work, the peaks
    its products run at, and the compute efficiency they reach (FLOP-weighted, after calibration)."""

    work: Work
    peak: str
    efficiency: float
    host_bound: bool = False  # a GPU layer whose host time (framework and launches) exceeds its kernels'
    unpriced_s: float = 0.0  # the seconds its operators with no FLOP formula are priced at, by bytes alone


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
    precision: str = "fp32"
    loss: str = "mse"
    degrees: dict[int, list[LayerProfile]] = field(default_factory=dict)  # --tp: per degree, one unit's layers
    sharded: dict[int, list[Sharded]] = field(default_factory=dict)  # --tp: per degree, how
    optimizer: str = "sgd"  # whose step each layer's update prices
    chain: bool | None = None  # docs/spec.md section 2: whether heterps run can cut between any two layers
    ties: list[Tie] = field(default_factory=list)  # docs/spec.md section 1j: tensors several layers hold

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


# Per optimiser (torch 2's foreach step, as heterps run steps it, and the gradients' reset): the passes over
# the weights' bytes and the kernels launched, counted from its operators (docs/guide/profiling.md).
#   sgd:   add_(w, g)                                          3 passes, 1 kernel
#   adam:  lerp_(m, g) 3, mul_(v) 2, addcmul_(v, g, g) 3, sqrt(v) 2, div_ 2, add_(eps) 2,
#          addcdiv_(w, m, .) 4, add_(steps) ~0                18 passes, 8 kernels
#   adamw: adam's and mul_(w) for the decoupled decay 2      20 passes, 9 kernels
#   the reset: the gradients written once                      1 pass,   1 kernel
UPDATE_PASSES = {"sgd": 3 + 1, "adam": 18 + 1, "adamw": 20 + 1}
UPDATE_KERNELS = {"sgd": 1 + 1, "adam": 8 + 1, "adamw": 9 + 1}


def update_estimate(weights: float, device: DeviceSpec, catalogue: Catalogue, optimizer: str = "sgd") -> float:
    """Section 1d's ``update`` on ``device``: the optimiser's step and the gradients' reset move the weights'
    bytes ``UPDATE_PASSES`` times at the memory bandwidth reached, plus their launches. Timing it on
    this machine instead gave a V100 this CPU's time, 29 us to 16 ms for one layer from run to run."""
    if weights == 0:
        return 0.0
    reached = device.memory_gbps * 1e9 * memory_efficiency(device, catalogue)
    return UPDATE_PASSES[optimizer] * weights / reached + UPDATE_KERNELS[optimizer] * device.launch_us * 1e-6


def fit(calls: list[Call], works: list[Work], measured: dict[str, float], pricer: Pricer) -> dict[str, float]:
    """Per layer kind, the median of measured / estimated time over that kind's layers; "other" is the
    median over all layers (for kinds the measurement did not see) but those with operators no formula
    prices (:attr:`~.counting.Work.unpriced`), whose miss is their own."""
    ratios: dict[str, list[float]] = {}
    everything = []
    for call, w in zip(calls, works):
        layer_kind = kind(call.module)
        estimated = pricer.seconds(w, layer_kind)
        if estimated > 0:
            ratios.setdefault(layer_kind, []).append(measured[call.name] / estimated)
            everything += [] if w.unpriced else [measured[call.name] / estimated]
    factors = {k: max(statistics.median(v), 1e-3) for k, v in ratios.items()}
    factors["other"] = max(statistics.median(everything), 1e-3) if everything else 1.0
    return factors


def _calibration(
    path: str, on: str | None, calls: list[Call], batch_size: int, catalogue: Catalogue
) -> tuple[str, dict[str, float]]:
    """The catalogue device whose measurement in the profile ``path`` calibrates the estimate, and each
    layer's measured oct on it: the profile must be of the same layers at the same batch size (else an
    exit-2 error naming it)."""
    from heterps_cli.loading import load_profile

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
    types = sorted(profile.types)
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
    precision: str = "fp32",
    loss: str = "mse",
    optimizer: str = "sgd",
    progress: Progress | None = None,
) -> Estimated:
    """The estimated profile of ``model`` as type ``resource`` on catalogue device ``device_name``, at
    tensor-parallel degree 1 and each of ``tp``, at ``precision``, its last layer computing ``loss``, each
    layer's update that of ``optimizer``."""
    report = progress or quiet
    path = catalogue_path or str(CATALOGUE)
    catalogue, device = device_of(path, device_name, tp, precision)
    report("tracing the model")
    calls, notes = traced(model)
    B0 = len(model.inputs[0])
    current: list[Call] = []
    steps = len(calls) * (1 + len(tp))

    def counted(i: int, call: Call, what: str) -> Work:
        current[:] = [call]
        report(f"counting {what}layer {i % len(calls) + 1}/{len(calls)}: {call.name}", completed=i, total=steps)
        last = i % len(calls) == len(calls) - 1
        return work(call, precision, loss if last else "none", device.processor == "gpu")

    with layers_run_alone(model, current):
        priced = _priced(calls, counted, model, catalogue, device, tp, precision, optimizer, calibrate, calibrate_on)
    report("done", completed=steps, total=steps)
    priced["layers"], ties = tied_layers(calls, priced["layers"])
    shown = path if catalogue_path is not None else "built in (heterps_cli/profiling/devices.yaml)"
    return Estimated(
        model=model.name,
        resource=resource,
        device=device_name,
        spec=device,
        batch_size=B0,
        catalogue=shown,
        notes=notes + _half_slower(precision, priced["estimates"]) + unpriced_notes(calls, priced),
        precision=precision,
        loss=loss,
        optimizer=optimizer,
        chain=model.chain,
        ties=ties,
        **priced,
    )


def _priced(
    calls: list[Call],
    counted: Callable[..., Work],
    model: Model,
    catalogue: Catalogue,
    device: DeviceSpec,
    tp: tuple[int, ...],
    precision: str,
    optimizer: str,
    calibrate: str | None,
    calibrate_on: str | None,
) -> dict[str, Any]:
    """Every layer counted (``counted(i, call, what)``) and priced on ``device``, at degree 1 and at each
    of ``tp``; calibrated first on ``calibrate``'s measured profile when given: :class:`Estimated`'s
    fields of the layers."""
    B0 = len(model.inputs[0])
    works = [counted(i, call, "") for i, call in enumerate(calls)]
    factors: dict[str, float] = {}
    calibrated_on = None
    if calibrate is not None:
        on, measured = _calibration(calibrate, calibrate_on, calls, B0, catalogue)
        factors = fit(calls, works, measured, Pricer(catalogue.devices[on], catalogue))
        calibrated_on = f"{calibrate} ({on})"
    price = _Pricing(Pricer(device, catalogue, precision), factors, B0, optimizer)
    with autocast(precision):  # the sizes kept for the backward are those of the precision
        layers = [price.layer(call, w) for call, w in zip(calls, works)]
        layers = with_shared(layers, shared_with_previous(model, calls, "cpu"), B0)
    estimates = [price.how(call, w) for call, w in zip(calls, works)]
    degrees: dict[int, list[LayerProfile]] = {}
    sharded: dict[int, list[Sharded]] = {}
    for n, d in enumerate(tp):
        first = (n + 1) * len(calls)  # the progress bar's count of the layers before this degree's
        found = [
            _one_unit(call, layer, d, functools.partial(counted, first + i, call, f"tp {d}: "), price)
            for i, (call, layer) in enumerate(zip(calls, layers))
        ]
        degrees[d], sharded[d] = [unit for unit, _ in found], [how for _, how in found]
    return dict(
        layers=layers,
        estimates=estimates,
        calibration=factors,
        calibrated_on=calibrated_on,
        degrees=degrees,
        sharded=sharded,
    )


def _one_unit(
    call: Call, layer: LayerProfile, d: int, count: Callable[[], Work], price: _Pricing
) -> tuple[LayerProfile, Sharded]:
    """One unit's profile of ``layer`` at degree ``d`` and how it was found: as at 1 where nothing of it
    shards, else one shard counted (``count()``) and priced with its all-reduces over the in-node link."""
    device, precision = price.pricer.device, price.pricer.precision
    with one_shard(call.module, d) as pairs:
        if pairs is None:  # runs whole on every unit: as at tp 1
            return layer, Sharded(0)
        w = count()
        with autocast(precision):
            ahead, back = all_reduced(call, pairs)
            forward_s = ring(ahead, d, device)
            reduce_s = forward_s + ring(back, d, device)
            shard = price.layer(call, w, communication=(forward_s, reduce_s))
    unit = dataclasses.replace(shard, input_saved=min(layer.input_saved, shard.activation_size))
    return unit, Sharded(len(pairs) // 2, ahead + back, reduce_s)


def unpriced_notes(calls: list[Call], priced: dict[str, Any]) -> list[str]:
    """Each layer whose operators compute without a FLOP formula: which, and the time they are priced at
    (their bytes alone), of the layer's: its arithmetic is missing from the figure."""
    out = []
    for call, layer, x in zip(calls, priced["layers"], priced["estimates"]):
        if unpriced := x.work.unpriced:
            ops = ", ".join(f"{name} x{count}" for name, count in unpriced.items())
            out.append(
                f"layer {call.name}: {ops} compute{'s' if len(unpriced) == 1 else ''} with no FLOP formula, priced "
                f"by bytes alone at {x.unpriced_s * 1e3:.3g} ms of the layer's {layer.oct * 1e3:.3g} ms: its "
                "arithmetic is missing from the estimate, which may be far too fast; measure the layer "
                "(heterps profile --as TYPE) or merge a measured profile"
            )
    return out


def _half_slower(precision: str, estimates: list[Estimate]) -> list[str]:
    """Why a half-precision estimate may be slower than fp32, a figure users read as wrong: its layers
    are bound by the host issuing operators, and autocast adds casts."""
    bound = sum(x.host_bound for x in estimates)
    if precision not in ("bf16", "fp16") or not bound:
        return []
    return [
        f"{precision} may be slower than fp32 here: {bound} of {len(estimates)} layers take longer to issue "
        "(framework and a launch per operator) than their kernels run, and autocast adds a cast operator per "
        "input; half precision pays off where the products are large enough to bind"
    ]


def estimate_spec(
    spec: str,
    batch_size: int,
    input_shape: tuple[int, ...] | None,
    granularity: str,
    resource: str,
    device_name: str,
    **options,
) -> Estimated:
    """:func:`estimate` of the model ``spec`` names (:func:`~.measure.load_model`), built and run on fake
    tensors (:func:`~.counting.abstract`); where the user's code cannot run on them (it reads a
    tensor's values, loads weights), on real tensors here, and the profile says so."""
    catalogue = options.get("catalogue_path") or str(CATALOGUE)
    device_of(catalogue, device_name, options.get("tp", ()), options.get("precision", "fp32"))  # before the model

    def attempt() -> Estimated:
        return estimate(load_model(spec, batch_size, input_shape, granularity), resource, device_name, **options)

    try:
        with abstract():
            return attempt()
    except SIGNALLED:
        raise
    except Exception as exc:
        cause = exc.__context__ if isinstance(exc, InputError) else exc
        if cause is None or isinstance(cause, InputError):  # ours (the calibration's profile): no model failed
            raise
        why = failure(cause)
    (options.get("progress") or quiet)(f"counting on real tensors ({why})")
    estimated = attempt()
    estimated.notes.append(
        f"counted on real tensors here: the model does not run on fake tensors ({why}); the same counts, more "
        "time and memory"
    )
    return estimated


def device_of(path: str, name: str, tp: tuple[int, ...] = (), precision: str = "fp32") -> tuple[Catalogue, DeviceSpec]:
    """The catalogue at ``path`` and its device ``name``; exit 2 where it lacks it, lacks the in-node
    link ``--tp`` needs, or has no peak at the half ``precision`` asked for (the estimate would price fp32
    products in a file that says bf16: a T4 has fp16 tensor cores, not bf16)."""
    catalogue = load_catalogue(path)
    device = catalogue_device(catalogue, name, path, "--estimate")
    if precision in ("bf16", "fp16") and getattr(device.tflops, precision) is None:
        has = [p for p in ("fp16", "bf16") if getattr(device.tflops, p) is not None]
        raise InputError(
            path,
            None,
            "--precision",
            f"device {name!r} of the catalogue has no {precision} peak (tflops.{precision}: null), so nothing "
            f"prices its products at {precision}: estimate at {' or '.join([*has, 'fp32'])}",
        )
    if tp and device.link_gbps is None:
        raise InputError(
            path,
            None,
            "--tp",
            f"device {name!r} of the catalogue gives no link_gbps (its link to the other devices of its "
            "node), which tensor parallelism's all-reduces need: add it (see --catalogue)",
        )
    return catalogue, device


@dataclass(frozen=True)
class _Pricing:
    """A layer's counted work priced on one device, by the calibration's factor per kind."""

    pricer: Pricer
    factors: dict[str, float]
    B0: int
    optimizer: str = "sgd"

    def _factor(self, layer_kind: str) -> float:
        return self.factors.get(layer_kind, self.factors["other"]) if self.factors else 1.0

    def layer(self, call: Call, w: Work, communication: tuple[float, float] = (0.0, 0.0)) -> LayerProfile:
        """The layer's profile: its operators priced, by the factor, and ``communication``'s seconds
        (in its forward pass, in all) added to forward and to oct."""
        layer_kind = kind(call.module)
        factor = self._factor(layer_kind)
        oct_ = self.pricer.seconds(w, layer_kind) * factor
        forward = self.pricer.seconds(w.forward, layer_kind) * factor + communication[0]
        device = self.pricer.device
        network = device.network_gbps * 1e9 / 8
        alpha = ALPHA_DEFAULTS.get(layer_kind, ALPHA_OTHER)
        update = update_estimate(weight_bytes(call.module), device, self.pricer.catalogue, self.optimizer)
        return layer_profile(
            call, self.B0, oct_ + communication[1], network, alpha, "cpu", update=update, forward=forward
        )

    def how(self, call: Call, w: Work) -> Estimate:
        layer_kind = kind(call.module)
        efficiency = self.pricer.efficiency(w, layer_kind) / self._factor(layer_kind)
        unpriced = sum(self.pricer.core(op, layer_kind) for op in w.ops if op.unpriced) * self._factor(layer_kind)
        return Estimate(w, self.pricer.peaks(w), efficiency, self.pricer.host_bound(w, layer_kind), unpriced)


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
