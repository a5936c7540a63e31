"""The input file formats of docs/spec.md sections 2 and 3, as strict pydantic models.

Strict on purpose: unknown keys, quoted numbers, booleans for numbers, NaN and
infinities are all errors, because a typo that silently changes a plan is worse
than a refusal. Every error names the file, the line and the field path.
"""

from __future__ import annotations

import difflib
import json
import re
import sys
import unicodedata
from collections.abc import Callable, Collection
from dataclasses import dataclass
from types import UnionType
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union, get_args, get_origin, get_type_hints

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StringConstraints,
    TypeAdapter,
    ValidationError,
    create_model,
)

from heterps_cli.errors import InputError
from heterps_cli.figures import number
from heterps_cli.objective import Objective
from heterps_cli.untrusted import first_unprintable, invisible
from heterps_cli.yamlio import Document, compatible, load_yaml, nfc


def _printable(text: str) -> str:
    if (bad := first_unprintable(text)) is not None:
        raise ValueError(
            f"must hold no control characters and nothing invisible (has {bad}, which can rewrite a terminal or a "
            "log, or make one name read as another)"
        )
    return text


def _name(text: str) -> str:
    """The one rule for every name (a layer, a type, a node kind, a model): printable, no invisible
    characters, no space it starts or ends with, and NFC (as every file is read: yamlio.nfc)."""
    text = nfc(_printable(text))
    for c in text:
        if invisible(c):
            raise ValueError(
                f"must hold no invisible character (has U+{ord(c):04X} {unicodedata.name(c, 'unnamed')}, which "
                "prints as nothing or as a space: the name would read as another)"
            )
    if not text.strip():
        raise ValueError("must hold a visible character (it is empty or only spaces)")
    if text != text.strip():
        raise ValueError("must not start or end with a space: it would print like a name without it")
    return text


MAX_NAME = 256
Name = Annotated[str, StringConstraints(min_length=1, max_length=MAX_NAME), AfterValidator(_name)]


def fitted_name(text: str, room: int = 0) -> str:
    """A name heterps makes (a layer's module path) within :data:`MAX_NAME` less ``room`` characters
    for a suffix it adds: a longer one keeps its end, the most particular part, after an ellipsis."""
    most = MAX_NAME - room
    return text if len(text) <= most else "…" + text[-(most - 1) :]


def _placement(text: str) -> str:
    """A rented node's name in a plan, ``KIND#i``: a node kind's name and its place among its kind."""
    kind, sep, index = text.rpartition("#")
    if not sep or not re.fullmatch("[1-9][0-9]{0,6}", index):
        raise ValueError("must be a node's name, KIND#i (i from 1)")
    _name(kind)
    if len(kind) > MAX_NAME:
        raise ValueError(f"names a node kind of over {MAX_NAME} characters")
    return text


Placement = Annotated[str, AfterValidator(_placement)]
Label = Annotated[str, StringConstraints(max_length=256), AfterValidator(_printable)]
Prose = Annotated[str, AfterValidator(_printable)]
# Bounds on whole numbers: what the model can use, and far inside int64 so that sums never wrap.
MAX_UNITS = 10**9
MAX_BATCH = 10**9
MAX_INDEX = 10**7  # layers, stages
MAX_NODES = 10**6  # section 1e: nodes of one kind, far past any cluster
MAX_MICRO_BATCHES = 10**6  # section 1d: micro-batches per step (a step longer than that is no pipeline)
Index = Annotated[int, Field(ge=0, le=MAX_INDEX)]
Units = Annotated[int, Field(ge=0, le=MAX_UNITS)]


def _normal(x: float) -> float:
    # A subnormal figure (1e-320) is no measurement, and dividing by it gives inf: a throughput of
    # infinity, a cost of $0.00 and a plan file that check then refuses.
    if x != 0 and abs(x) < sys.float_info.min:
        raise ValueError(f"is below the smallest normal float ({sys.float_info.min:.3g}): no real figure is that small")
    return x


Positive = Annotated[float, Field(gt=0), AfterValidator(_normal)]
NonNegative = Annotated[float, Field(ge=0), AfterValidator(_normal)]
Fraction = Annotated[float, Field(ge=0, le=1), AfterValidator(_normal)]
# docs/spec.md section 1b: per unit, so far beyond any real part that only a typo reaches the bound.
GigaPerUnit = Annotated[float, Field(gt=0, le=1e9), AfterValidator(_normal)]
# A catalogue device's rates and sizes are at least a millionth of a giga (a kB/s, a kbit/s, a kB), so that no
# time an estimate computes from one overflows: a link_gbps of 3e-308 made a tp entry's oct infinite.
DeviceRate = Annotated[float, Field(ge=1e-6, le=1e9), AfterValidator(_normal)]
Peak = Annotated[float, Field(ge=1e-6, le=1e6), AfterValidator(_normal)]  # TFLOP/s of a catalogue device
Efficiency = Annotated[float, Field(gt=0, le=1), AfterValidator(_normal)]  # a fraction of a peak reached


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)


BatchSize = Annotated[int, Field(ge=1, le=MAX_BATCH)]


class BatchTime(_Strict):
    """Section 2: a layer's times on a type at a batch size other than the profile's ``batch_size``."""

    oct: Positive
    odt: NonNegative
    alpha: Fraction | None = None  # default: the entry's, else the layer's
    beta: Fraction | None = None
    forward: NonNegative | None = None  # section 1g: the forward pass's part of oct


Precision = Literal["fp32", "tf32", "bf16", "fp16"]


class ShardTime(_Strict):
    """A layer's times on a type for one replica of ``tp`` units (section 1h), or of one unit (:class:`TimeEntry`)."""

    oct: Positive
    odt: NonNegative
    update: NonNegative | None = None  # section 1d: the optimiser step on the layer's weights, s per step
    alpha: Fraction | None = None
    beta: Fraction | None = None
    batches: Annotated[dict[BatchSize, BatchTime], Field(min_length=1)] | None = None  # section 2: other sizes
    forward: NonNegative | None = None  # section 1g: the forward pass's part of oct (recomputation repeats it)

    def at(self, size: int, batch_size: int) -> BatchTime | None:
        """The times measured at ``size`` (the profile's ``batch_size`` is the entry's own), or None."""
        if size == batch_size:
            return BatchTime.model_construct(
                oct=self.oct, odt=self.odt, alpha=self.alpha, beta=self.beta, forward=self.forward
            )
        return (self.batches or {}).get(size)


Degree = Annotated[int, Field(ge=2, le=MAX_UNITS)]  # section 1h: a tensor-parallel degree above 1


class TimeEntry(ShardTime):
    # section 1h: the times of one replica that shards the layer over tp units of one node, per degree
    tp: Annotated[dict[Degree, ShardTime], Field(min_length=1)] | None = None


class ShardSizes(_Strict):
    """Section 1h: the bytes one unit of a replica at a tensor-parallel degree holds of a layer."""

    weight_size: NonNegative
    activation_size: NonNegative = 0.0
    input_saved: NonNegative = 0.0


class Layer(_Strict):
    name: Name
    type: Name
    input_size: NonNegative
    weight_size: NonNegative
    alpha: Fraction | None = None
    beta: Fraction | None = None
    activation_size: NonNegative = 0.0  # section 1b: bytes per sample kept for the backward pass
    input_saved: NonNegative = 0.0  # section 1b: of those, the bytes the layer before also keeps
    sharded: bool = False  # section 1b: weights split across the stage's replicas
    times: Annotated[dict[Name, TimeEntry], Field(min_length=1)]
    tp: Annotated[dict[Degree, ShardSizes], Field(min_length=1)] | None = None  # section 1h: one unit's share

    def fractions(self, resource: str, size: BatchTime | None = None) -> tuple[float, float]:
        """(alpha, beta) of this layer on ``resource``: the per-type override, else the layer's; at
        another batch ``size`` (an entry of ``batches``), its own first."""
        entry = self.times[resource]
        alpha = entry.alpha if entry.alpha is not None else self.alpha
        beta = entry.beta if entry.beta is not None else self.beta
        if size is not None:
            alpha = size.alpha if size.alpha is not None else alpha
            beta = size.beta if size.beta is not None else beta
        assert alpha is not None and beta is not None  # guaranteed by load_profile
        return alpha, beta


GlobalBatch = Annotated[int, Field(ge=1, le=MAX_BATCH * MAX_MICRO_BATCHES)]  # section 1d


@dataclass(frozen=True)
class Job:
    """The one job: what a plan must reach and how long it trains (docs/spec.md section 2); None takes
    the profile's ``job`` section. A caller (the command line, :mod:`heterps_cli.api`) gives every field;
    a profile's ``job`` section may give those of :data:`PROFILE_JOB` (:class:`ProfileJob`, derived
    from this class with its constraints)."""

    # cost: the cheapest plan meeting min_throughput; time: the fastest within the limits and max_cost
    objective: Objective = Objective.COST
    samples: Positive | None = None  # per epoch
    epochs: Positive | None = None
    min_throughput: NonNegative | None = None  # samples/s
    max_cost: Positive | None = None  # USD
    global_batch: GlobalBatch | None = None  # samples per optimiser step (section 1d)
    # section 1: True keeps the papers' space, where a stage is a maximal run of layers on one type
    maximal_stages: bool = False
    micro_batch: BatchSize | None = None  # section 1f: the micro-batch; None lets the plan choose it


PROFILE_JOB = ("samples", "epochs", "min_throughput", "global_batch")

if TYPE_CHECKING:  # the type checker sees Job's fields; the file reads only PROFILE_JOB's
    ProfileJob = Job
else:
    _JOB_TYPES = get_type_hints(Job, include_extras=True)
    ProfileJob = create_model("Job", __base__=_Strict, **{name: (_JOB_TYPES[name], None) for name in PROFILE_JOB})


class FixedCosts(_Strict):
    """Section 1d: what a stage on a type pays that no layer's size sets."""

    pass_start: NonNegative = 0.0  # s per micro-batch: a backward pass's start, before its first layer
    all_reduce_latency: NonNegative = 0.0  # s of an all-reduce between two replicas beyond its bytes
    transfer_latency: NonNegative = 0.0  # s of a message across a stage boundary beyond its bytes


class Profile(_Strict):
    model: Name
    batch_size: BatchSize
    job: ProfileJob = ProfileJob()
    # section 1b: training-state bytes per weight byte
    state_factor: Annotated[float, Field(gt=0, le=1e6), AfterValidator(_normal)] = 4.0
    precision: Precision | None = None  # section 2: what the times assume the model trains at
    chain: bool | None = None  # section 2: whether heterps run can cut between any two layers (None: unknown)
    fixed: Annotated[dict[Name, FixedCosts], Field(min_length=1)] | None = None  # section 1d, per type
    layers: Annotated[list[Layer], Field(min_length=1)]

    @property
    def types(self) -> tuple[str, ...]:
        """Every resource type some layer has times on, in the order the layers first give them."""
        return tuple(dict.fromkeys(t for layer in self.layers for t in layer.times))

    @property
    def sizes(self) -> tuple[int, ...]:
        """Section 2: every batch size some layer's times were measured at, at any tensor-parallel
        degree (section 1h: a size measured only at tp 2 is a size), ascending."""
        entries = [e for layer in self.layers for e in layer.times.values()]
        more = {b for e in entries for x in (e, *(e.tp or {}).values()) for b in (x.batches or {})}
        return tuple(sorted({self.batch_size, *more}))

    @property
    def degrees(self) -> tuple[int, ...]:
        """Section 1h: every tensor-parallel degree some layer's times give, 1 first."""
        more = {d for layer in self.layers for e in layer.times.values() for d in (e.tp or {})}
        return (1, *sorted(more))

    def at_degree(self, degree: int, types: Collection[str]) -> Profile:
        """Section 1h: this profile as if measured on replicas of ``degree`` units of ``types``: each
        layer's times at that degree on those types (alpha and beta falling back on the entry's at tp 1,
        then the layer's; update on the tp-1 entry's in the share of the weights one unit holds) and one
        unit's share of its sizes. A layer with no time at the degree keeps no
        times (this is no valid profile on its own: :mod:`heterps_cli.problem` reads it beside the
        profile itself)."""
        layers = []
        for layer in self.layers:
            times = {}
            sizes = (layer.tp or {}).get(degree)
            for t, entry in layer.times.items():
                if t in types and (shard := (entry.tp or {}).get(degree)) is not None:
                    alpha = shard.alpha if shard.alpha is not None else entry.alpha
                    beta = shard.beta if shard.beta is not None else entry.beta
                    update = shard.update
                    if update is None and entry.update is not None and sizes is not None:
                        # a unit steps the weights it holds: the tp-1 step, in that share
                        update = entry.update * (sizes.weight_size / layer.weight_size if layer.weight_size else 0.0)
                    fields = {**dict(shard), "alpha": alpha, "beta": beta, "update": update, "tp": None}
                    times[t] = TimeEntry.model_construct(**fields)
            shares = dict(sizes) if sizes is not None else {}
            layers.append(layer.model_construct(**{**dict(layer), **shares, "times": times, "tp": None}))
        return self.model_construct(**{**dict(self), "layers": layers})


class Resource(_Strict):
    price: NonNegative | None = None  # required without nodes; per node with them (section 1e)
    limit: Annotated[int, Field(ge=1, le=MAX_UNITS)] | None = None
    unit: Label | None = None
    memory_gb: GigaPerUnit | None = None  # section 1b: memory of one unit, 1e9 bytes
    bandwidth_gbps: GigaPerUnit | None = None  # section 1b: network bandwidth of one unit, Gbit/s
    memory_reserved_gb: Annotated[float, Field(ge=0, le=1e9), AfterValidator(_normal)] | None = None  # section 1d
    shared_link: bool | None = None  # section 1h: the units of one node share one network link


class NodeKind(_Strict):
    """Section 1e: a machine rented whole, with the units it holds."""

    price: NonNegative  # USD per node-hour, every unit of it paid whether used or not
    units: Annotated[dict[Name, Annotated[int, Field(ge=1, le=MAX_UNITS)]], Field(min_length=1)]
    available: Annotated[int, Field(ge=1, le=MAX_NODES)]
    label: Label | None = None  # e.g. the instance's description, for output
    # section 1e: per type it holds, one unit's bandwidth to the other units of the node, Gbit/s
    link_gbps: dict[Name, GigaPerUnit] | None = None


class Cluster(_Strict):
    cluster: Name
    resources: Annotated[dict[Name, Resource], Field(min_length=1)]
    nodes: Annotated[dict[Name, NodeKind], Field(min_length=1)] | None = None  # section 1e


class Joined(_Strict):
    """Section 1i: replicas of another type in a stage, training ``samples`` of each micro-batch between
    them; its figures are its busiest replica's."""

    resource: Name
    replicas: Annotated[int, Field(ge=1, le=MAX_UNITS)]
    samples: Annotated[int, Field(ge=1, le=MAX_BATCH)]
    tp: Degree | None = None  # section 1h: units per replica (written only above 1)
    compute_s: NonNegative
    transfer_s: NonNegative | None = None
    memory_gb: NonNegative | None = None
    nodes: dict[Placement, Annotated[int, Field(ge=1, le=MAX_UNITS)]] | None = None  # section 1e: replicas per node

    @property
    def way(self) -> str:
        """Its degree as output shows it after the type: " tpN" (section 1h)."""
        return f" tp{self.tp}" if self.tp else ""


class Stage(_Strict):
    """One pipeline stage of a :class:`Plan`: its layers, type, replicas and figures (docs/spec.md
    section 4). Section 1d's ``update_s``, ``step_s`` and ``in_flight`` only in a pipelined plan: its
    ``compute_s`` and ``transfer_s`` are then per micro-batch, and ``comm_s`` the all-reduce per step."""

    first: Index
    last: Index
    layers: Annotated[list[Name], Field(min_length=1)]
    resource: Name
    replicas: Annotated[int, Field(ge=1, le=MAX_UNITS)]
    compute_s: NonNegative
    comm_s: NonNegative
    throughput: NonNegative
    transfer_s: NonNegative | None = None  # section 1b; absent in plans made before it
    memory_gb: NonNegative | None = None
    update_s: NonNegative | None = None  # section 1d; only in plans with a pipeline schedule
    step_s: NonNegative | None = None
    in_flight: Annotated[int, Field(ge=1, le=MAX_MICRO_BATCHES)] | None = None
    nodes: dict[Placement, Annotated[int, Field(ge=1, le=MAX_UNITS)]] | None = None  # section 1e: replicas per node
    recompute: bool | None = None  # section 1g: the stage recomputes its activations (written only when true)
    tp: Degree | None = None  # section 1h: units per replica, tensor-parallel (written only above 1)
    # section 1i: replicas of other types in the stage, and the samples of each micro-batch its own train
    joined: Annotated[list[Joined], Field(min_length=1)] | None = None
    samples: Annotated[int, Field(ge=1, le=MAX_BATCH)] | None = None

    @property
    def way(self) -> str:
        """How its replicas run, as output shows it after the type: " tpN" (section 1h), " ↻" (1g)."""
        return (f" tp{self.tp}" if self.tp else "") + (" ↻" if self.recompute else "")

    @property
    def units(self) -> int:
        """The units of its own type its replicas hold, each a process in ``heterps run`` (section 1h:
        replicas x tp); section 1i's joined replicas are counted by :attr:`units_by_type`."""
        return self.replicas * (self.tp or 1)

    @property
    def parts(self) -> list:
        """Section 1i: the stage's parts in the order its ranks take them (``heterps run``'s layout): itself
        (its own replicas), then each joined part; each with ``resource``, ``replicas``, ``samples`` and
        ``nodes``."""
        return [self, *(self.joined or ())]

    @property
    def units_by_type(self) -> dict[str, int]:
        """Units per type: its own, and each joined part's (section 1i)."""
        out = {self.resource: self.units}
        for part in self.joined or ():
            out[part.resource] = out.get(part.resource, 0) + part.replicas * (part.tp or 1)
        return out


class WhatIf(_Strict):
    """``plan --explain``: with nodes (section 1e), the fastest plan on the plan's rental with one node of
    ``kind`` more or fewer (``rental``); without, the optimum with type ``kind``'s limit one higher or
    lower (``limit``)."""

    kind: Name
    change: Literal[1, -1]
    rental: dict[Name, Annotated[int, Field(ge=1, le=MAX_NODES)]] | None = None
    limit: Annotated[int, Field(ge=1, le=MAX_UNITS)] | None = None
    throughput: NonNegative | None
    cost_usd: NonNegative | None
    meets: bool


class Plan(_Strict):
    """The one plan: what every scheduler returns (:func:`heterps_cli.plan.make_plan` builds it, its
    figures recomputed by the cost model) and what a plan file holds (docs/spec.md section 4, plus
    heterps' own extra fields), read by :meth:`model_validate` and written by :meth:`written`, in this
    order. A plan file made before a field existed may lack it (None)."""

    model: Name
    cluster: Name
    objective: Annotated[Objective, Field(strict=False)]  # read from the file's text
    scheduler: Name
    seed: Annotated[int, Field(ge=0, le=2**63 - 1)]
    batch_size: Annotated[int, Field(ge=1, le=MAX_BATCH)]
    samples: Positive
    epochs: Positive
    min_throughput: NonNegative
    max_cost: Positive | None = None
    stages: Annotated[list[Stage], Field(min_length=1)]
    resources: dict[Name, Units]
    limits: dict[Name, Units] | None = None
    memory_gb: dict[Name, GigaPerUnit | None] | None = None  # section 1b: the cluster's, per type
    bandwidth_gbps: dict[Name, GigaPerUnit | None] | None = None
    memory_reserved_gb: dict[Name, Annotated[float, Field(ge=0, le=1e9)] | None] | None = None
    rental: dict[Name, Annotated[int, Field(ge=1, le=MAX_NODES)]] | None = None  # section 1e
    rate_usd_per_hour: NonNegative | None = None
    idle_units: dict[Name, Units] | None = None
    link_gbps: dict[Name, GigaPerUnit] | None = None  # section 1e: the node links the plan's types talk over
    global_batch: GlobalBatch | None = None  # section 1d
    micro_batches: Annotated[int, Field(ge=1, le=MAX_MICRO_BATCHES)] | None = None
    maximal_stages: bool | None = None  # section 1: planned in the papers' space (true), written only then
    precision: Precision | None = None  # section 2: the profile's, where it says one
    throughput: NonNegative
    bottleneck: Index
    time_s: NonNegative
    cost_usd: NonNegative
    feasible: bool
    optimal: bool | None = None
    evaluations: Annotated[int, Field(ge=0)] | None = None
    notes: list[Prose] = []
    explanation: list[Prose] | None = None  # why the bottleneck is what it is (heterps_cli.explain)
    what_if: list[WhatIf] | None = None  # section 1e, plan --explain
    gap: Annotated[float, Field(ge=0), AfterValidator(_normal)] | None = None  # exact cut short by --time-limit
    solve_s: NonNegative
    # Not written to plan files: they are for the run that made the plan.
    _units: dict[str, str] = PrivateAttr(default_factory=dict)  # the cluster's unit label per type
    _interrupted: bool = PrivateAttr(default=False)  # Ctrl-C cut the search short (the notes say so too)

    @property
    def units(self) -> dict[str, str]:
        return self._units

    @property
    def interrupted(self) -> bool:
        return self._interrupted

    def of_run(self, units: dict[str, str], interrupted: bool) -> Plan:
        """This plan as the run that made it knows it: with the cluster's unit labels and whether
        Ctrl-C cut the search short."""
        plan = self.model_copy()
        plan._units, plan._interrupted = dict(units), interrupted
        return plan

    def but(self, **changes: Any) -> Plan:
        """A copy with ``changes`` (unvalidated: a plan's figures come from the cost model)."""
        return self.model_copy(update=changes)

    @property
    def mixes(self) -> bool:
        """Whether a stage mixes types (section 1i): the plan was made with ``--mixed-stages``."""
        return any(s.joined for s in self.stages)

    @property
    def processes(self) -> int:
        """Every unit of every stage's every part: a process each in ``heterps run``."""
        return sum(sum(s.units_by_type.values()) for s in self.stages)

    def units_of(self, resource: str) -> int:
        """The units of type ``resource`` the plan's replicas hold, joined parts included (tp: d each)."""
        return sum(s.units_by_type.get(resource, 0) for s in self.stages)

    @property
    def types_used(self) -> list[str]:
        """Every type the plan's replicas run on, in stage order, each once (section 1i's joined too)."""
        return list(dict.fromkeys(t for s in self.stages for t in s.units_by_type))

    @property
    def schedule(self) -> list[str]:
        """The type of each layer, in order."""
        return [s.resource for s in self.stages for _ in range(s.first, s.last + 1)]

    def written(self) -> dict:
        """The file's mapping, in the order above; a field that only some plans have (section 1b and 1d
        figures, a gap) is left out where it is None, the rest are written as they are (null too)."""
        out = self.model_dump()
        out["objective"] = str(self.objective)
        for key in ("samples", "epochs", "min_throughput"):  # a whole number reads as one
            out[key] = int(out[key]) if float(out[key]).is_integer() else float(out[key])
        for key in PLAN_ONLY_WHERE_GIVEN:
            if out[key] is None:
                del out[key]
        for stage in out["stages"]:
            for key in STAGE_ONLY_WHERE_GIVEN:
                if stage[key] is None:
                    del stage[key]
        return out

    def to_dict(self) -> dict:
        """The plan file's mapping (:meth:`written`), its solve time to the microsecond."""
        return self.but(solve_s=round(self.solve_s, 6)).written()

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, allow_nan=False)  # NaN/Infinity are not JSON


PLAN_ONLY_WHERE_GIVEN = (
    "limits",
    "memory_gb",
    "bandwidth_gbps",
    "memory_reserved_gb",
    "rental",
    "rate_usd_per_hour",
    "idle_units",
    "link_gbps",
    "global_batch",
    "micro_batches",
    "maximal_stages",
    "explanation",
    "what_if",
    "gap",
)
STAGE_ONLY_WHERE_GIVEN = (
    "transfer_s", "memory_gb", "update_s", "step_s", "in_flight", "nodes", "recompute", "tp", "joined", "samples",
)  # fmt: skip


KINDS = {  # what each file is, and the keys that say so
    "profile": ("a model profile", "layers"),
    "cluster": ("a cluster", "resources"),
    "plan": ("a plan", "stages"),
    "catalogue": ("a device catalogue", "devices"),
    "instances": ("an instance catalogue", "instances"),
}


class Peaks(_Strict):
    """Peak dense TFLOP/s per precision; null where the device has no such path."""

    fp32: Peak
    tf32: Peak | None = None
    fp16: Peak | None = None
    bf16: Peak | None = None


class Efficiencies(_Strict):
    """Per precision, the fraction of its peak a device reaches on a large product."""

    fp32: Efficiency | None = None
    tf32: Efficiency | None = None
    fp16: Efficiency | None = None
    bf16: Efficiency | None = None


HalfDim = Annotated[float, Field(gt=0, le=1e6), AfterValidator(_normal)]


class HalfDims(_Strict):
    """Per precision, the dimension at which a product loses half of its efficiency along it."""

    fp32: HalfDim | None = None
    tf32: HalfDim | None = None
    fp16: HalfDim | None = None
    bf16: HalfDim | None = None


class DeviceSpec(_Strict):
    title: Name
    tflops: Peaks
    memory_gbps: DeviceRate  # GB/s
    memory_gb: DeviceRate
    network_gbps: DeviceRate  # Gbit/s per device
    launch_us: Annotated[float, Field(ge=0, le=1e6), AfterValidator(_normal)]
    link_gbps: DeviceRate | None = None  # Gbit/s one way to the other devices of its node (section 1h's all-reduce)
    matmul_efficiency: Efficiencies | None = None  # default: the catalogue's efficiency per layer kind
    memory_efficiency: Efficiency | None = None  # default: the catalogue's
    processor: Literal["gpu", "cpu"] = "gpu"  # which kernels it runs where the two differ (dropout)
    layer_us: Annotated[float, Field(ge=0, le=1e6), AfterValidator(_normal)] | None = None  # default: catalogue's


class Catalogue(_Strict):
    """The device catalogue of ``heterps profile --estimate`` (heterps_cli/profiling/devices.yaml)."""

    catalogue: Literal["heterps-devices/1"]
    efficiency: Annotated[dict[Name, Efficiency], Field(min_length=1)]
    memory_efficiency: Efficiency
    matmul_half_dim: HalfDims | None = None  # none: a product's shape does not change its efficiency
    matmul_misaligned: Efficiencies | None = None  # per precision: a misaligned product's share of the aligned's
    layer_us: Annotated[float, Field(ge=0, le=1e6), AfterValidator(_normal)] = 0.0  # a GPU layer's host time
    devices: Annotated[dict[Name, DeviceSpec], Field(min_length=1)]


Day = Annotated[str, StringConstraints(pattern=r"^\d{4}-\d{2}-\d{2}$")]


class Instance(_Strict):
    """One machine of the instance catalogue (heterps_cli/instances.yaml), rented whole by the hour."""

    cloud: Name
    region: Name
    title: Name
    units: Annotated[dict[Name, Annotated[int, Field(ge=1, le=MAX_UNITS)]], Field(min_length=1)]
    host_memory_gib: GigaPerUnit
    network_gbps: GigaPerUnit  # between nodes, the whole instance
    on_demand: NonNegative  # USD per instance-hour
    spot: NonNegative | None = None  # the lowest spot price seen, USD per instance-hour
    read: Day  # when the figures were read from their source
    source: Prose  # where the shape and the prices come from
    network_source: Prose
    link_gbps: dict[Name, GigaPerUnit] | None = None  # one unit's link to the others inside the instance
    link_source: Prose | None = None


class InstanceCatalogue(_Strict):
    """The catalogue ``heterps cluster`` builds cluster files from."""

    catalogue: Literal["heterps-instances/1"]
    instances: Annotated[dict[Name, Instance], Field(min_length=1)]


def _strip(annotation: Any) -> Any:
    """X from Annotated[X, ...] and from X | None."""
    while True:
        if get_origin(annotation) is Annotated:
            annotation = get_args(annotation)[0]
        elif get_origin(annotation) in (Union, UnionType):
            annotation = next(a for a in get_args(annotation) if a is not type(None))
        else:
            return annotation


def _fields_at(root: type[BaseModel], loc: tuple) -> tuple[str, ...]:
    """The field names allowed in the mapping at ``loc`` of a ``root`` document (empty if not a model)."""
    annotation: Any = root
    for part in loc:
        annotation = _strip(annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            field = annotation.model_fields.get(str(part))
            if field is None:
                return ()
            annotation = field.annotation
        elif get_origin(annotation) in (list, dict):
            annotation = get_args(annotation)[-1]
        else:
            return ()
    annotation = _strip(annotation)
    return tuple(annotation.model_fields) if isinstance(annotation, type) and issubclass(annotation, BaseModel) else ()


def _describe(error: Any, root: type[BaseModel], missing_beside: list[str]) -> str:
    kind, ctx, got = error["type"], error.get("ctx") or {}, error.get("input")
    if kind == "missing":
        return "required field is missing"
    if kind == "extra_forbidden":
        name = str(error["loc"][-1])
        allowed = _fields_at(root, tuple(error["loc"][:-1]))
        close = difflib.get_close_matches(name, [f for f in allowed if f != name], n=1)
        if not close and len(missing_beside) == 1:
            close = missing_beside  # the one required field not given is the likeliest meaning
        hint = (
            f"; did you mean '{close[0]}'?" if close else (f" (allowed here: {', '.join(allowed)})" if allowed else "")
        )
        return f"unknown field '{name}'{hint} (unknown fields are refused so a typo cannot change a plan)"
    bounds = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}
    if kind in bounds:
        (limit,) = ctx.values()
        return f"must be {bounds[kind]} {number(limit)} (got {_shown(got)})"
    if kind == "finite_number":
        return f"must be a finite number (got {_shown(got)})"
    if kind in ("float_type", "int_type", "string_type", "dict_type", "list_type", "model_type", "bool_type"):
        wanted = {
            "float": "a number",
            "int": "a whole number",
            "string": "a string",
            "bool": "true or false",
            "dict": "a mapping",
            "list": "a list",
            "model": "a mapping",
        }[kind.split("_")[0]]
        return f"must be {wanted} (got {type(got).__name__} {_shown(got)})"
    if kind in ("too_short", "string_too_short"):
        return "must not be empty"
    if kind == "string_too_long":
        return f"must be at most {ctx.get('max_length')} characters (got {len(got):,})"
    if kind == "value_error":
        return f"{str(ctx.get('error', error['msg']))} (got {_shown(got)})"
    return f"{error['msg']} (got {_shown(got)})"


def _shown(value: Any) -> str:
    """A value as the user wrote it, cut short: a hostile file may hold a megabyte in one field."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "…"


def _kind_of(data: dict) -> str | None:
    if "stages" in data:  # a plan also has 'resources'
        return "plan"
    found = [kind for kind, (_, key) in KINDS.items() if key in data]
    return found[0] if len(found) == 1 else None


def _validate(model: type[_Strict], doc: Document, kind: str) -> Any:
    actual = _kind_of(doc.data)
    if actual is not None and actual != kind:
        (wanted, key), (is_, is_key) = KINDS[kind], KINDS[actual]
        raise InputError(
            doc.path,
            doc.line((is_key,)),
            None,
            f"this is {is_}, not {wanted} (it has '{is_key}' where {wanted} has '{key}'): "
            "check the order of the files on the command line",
        )
    try:
        return model.model_validate(doc.data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        # A typo shows up as an unknown key *and* a missing one; the unknown key is the useful half.
        unknown_parents = {tuple(e["loc"][:-1]) for e in errors if e["type"] == "extra_forbidden"}
        missing: dict[tuple, list[str]] = {}
        for e in errors:
            if e["type"] == "missing":
                missing.setdefault(tuple(e["loc"][:-1]), []).append(str(e["loc"][-1]))
        problems = []
        for error in errors:
            loc = tuple(error["loc"])
            if error["type"] == "missing" and loc[:-1] in unknown_parents:
                continue
            if loc and loc[-1] == "[key]" and len(loc) > 2 and loc[-3] == "batches":
                problems.append(
                    doc.error(
                        loc[:-1], f"the batch size {_shown(loc[-2])} must be a whole number from 1 to {MAX_BATCH:,}"
                    )
                )
                continue
            if loc and loc[-1] == "[key]" and len(loc) > 2 and loc[-3] == "tp":  # section 1h
                problems.append(
                    doc.error(
                        loc[:-1],
                        f"the tensor-parallel degree {_shown(loc[-2])} must be a whole number from 2 to "
                        f"{MAX_UNITS:,} (tp 1 is what the entry and the layer give themselves)",
                    )
                )
                continue
            if loc and loc[-1] == "[key]":
                why = str(error.get("ctx", {}).get("error", "")) if error["type"] == "value_error" else ""
                problems.append(
                    doc.error(loc[:-1], f"the name {_shown(loc[-2])} {why or 'must be a non-empty string'}")
                )
                continue
            problems.append(doc.error(loc, _describe(error, model, missing.get(loc[:-1], []))))
        problems.sort(key=lambda e: e.line or 0)
        raise InputError.joined(problems) from None


def check_name(text: str, field: str) -> str:
    """A name given on the command line (``--as``) or made from one (a model's), held to the rules a
    file's names meet, so that heterps never writes a profile it would then refuse to read."""
    try:
        return TypeAdapter(Name).validate_python(text)  # NFC: callers use what it returns
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        raise InputError(None, None, field, _describe(error, Profile, [])) from None


def _raise_all(problems: list[InputError]) -> None:
    if problems:
        raise InputError.joined(problems)


def load_any(path: str) -> tuple[str, Profile | Cluster | Plan, Document]:
    """A profile, a cluster or a plan, whichever the file is (read once): its kind, model and document.
    A file that says none of them is read as a profile, whose errors then say what is missing."""
    doc = load_yaml(path)
    kind = _kind_of(doc.data) if isinstance(doc.data, dict) else None
    if kind == "cluster":
        return kind, _checked_cluster(doc), doc
    if kind == "plan":
        return kind, _plan_of(doc), doc
    return "profile", _profile_of(doc), doc


def load_profile(path: str) -> tuple[Profile, Document]:
    doc = load_yaml(path)
    return _profile_of(doc), doc


def _profile_of(doc: Document) -> Profile:
    profile: Profile = _validate(Profile, doc, "profile")
    problems = []
    seen: dict[str, int] = {}
    for i, layer in enumerate(profile.layers):
        if layer.name in seen:
            problems.append(
                doc.error(
                    ("layers", i, "name"), f"duplicate layer name '{layer.name}' (also layers[{seen[layer.name]}])"
                )
            )
        seen.setdefault(layer.name, i)
        problems += _saved_problems(doc, ("layers", i), layer, "the layer's activation_size")
        for d, sizes in (layer.tp or {}).items():
            problems += _saved_problems(doc, ("layers", i, "tp", d), sizes, "its activation_size")
        for resource, entry in layer.times.items():
            problems += _entry_problems(profile, doc, i, resource, entry)
    problems += _degree_chains(profile, doc)
    timed = profile.types
    for t in profile.fixed or {}:
        if t not in timed:
            problems.append(
                doc.error(
                    ("fixed", t),
                    f"no layer has times on {t}: fixed costs belong to a type the layers give "
                    f"({', '.join(sorted(timed))})",
                )
            )
    if profile.job.global_batch is not None:
        try:
            micro_batches(profile.job.global_batch, profile.sizes, "job.global_batch")
        except ValueError as exc:
            problems.append(doc.error(("job", "global_batch"), str(exc)))
    _raise_all(problems)
    return profile


def _saved_problems(doc: Document, where: tuple, sizes, whose: str) -> list[InputError]:
    """A layer's (or one tensor-parallel unit's) input_saved: part of its activation, none on the first layer."""
    problems = []
    if sizes.input_saved > sizes.activation_size:
        problems.append(
            doc.error(
                (*where, "input_saved"),
                f"{number(sizes.input_saved)} is more than {whose} "
                f"({number(sizes.activation_size)}): it is the part of it the layer before also keeps",
            )
        )
    if where[1] == 0 and sizes.input_saved:
        problems.append(doc.error((*where, "input_saved"), "the first layer has no layer before it: give 0"))
    return problems


def _entry_problems(profile: Profile, doc: Document, i: int, resource: str, entry) -> list[InputError]:
    """One layer's times on one type: its fractions given, its degrees sized, forward within oct, sizes once."""
    layer = profile.layers[i]
    problems = []
    for frac in ("alpha", "beta"):
        if getattr(entry, frac) is None and getattr(layer, frac) is None:
            problems.append(
                doc.error(
                    ("layers", i, "times", resource),
                    f"no {frac}: give the layer a default '{frac}' or this entry its own",
                )
            )
    shards: list[tuple[tuple, ShardTime]] = [((), entry)]
    shards += [(("tp", d), shard) for d, shard in (entry.tp or {}).items()]
    for d, _ in (entry.tp or {}).items():
        if d not in (layer.tp or {}):
            problems.append(
                doc.error(
                    ("layers", i, "times", resource, "tp", d),
                    f"times at tp {d} need the layer's sizes there: give layers[{i}].tp[{d}] with one "
                    "unit's weight_size (and activation_size, input_saved) at that degree",
                )
            )
    for inside, shard in shards:
        where = ("layers", i, "times", resource, *inside)
        sized: list[tuple[int, ShardTime | BatchTime]] = [(profile.batch_size, shard)]
        for size, at in [*sized, *(shard.batches or {}).items()]:
            if at.forward is not None and at.forward > at.oct:
                problems.append(
                    doc.error(
                        (*where, *(("batches", size) if at is not shard else ()), "forward"),
                        f"{number(at.forward)} s is more than the entry's oct ({number(at.oct)} s), of "
                        "which it is the forward pass's part",
                    )
                )
        if profile.batch_size in (shard.batches or {}):
            problems.append(
                doc.error(
                    (*where, "batches", profile.batch_size),
                    f"batch {profile.batch_size} is the profile's batch_size, whose times are the entry's "
                    "own oct and odt: give each size once",
                )
            )
    return problems


def _degree_chains(profile: Profile, doc: Document) -> list[InputError]:
    """Section 1h: each type's tensor-parallel degrees must each divide the next (1, 2, 4, 8), so that
    replicas of any of them fill whole nodes; an error at the first entry giving a degree that breaks it."""
    problems = []
    for t in profile.types:
        given = sorted({d for layer in profile.layers if t in layer.times for d in (layer.times[t].tp or {})})
        for low, high in zip([1, *given], given):
            if high % low:
                i = next(
                    i
                    for i, layer in enumerate(profile.layers)
                    if high in (layer.times.get(t) and layer.times[t].tp or {})
                )
                problems.append(
                    doc.error(
                        ("layers", i, "times", t, "tp", high),
                        f"tensor-parallel degree {high} on {t} is not a multiple of its degree {low}: a type's "
                        "degrees must each divide the next (1, 2, 4, 8 …) so that replicas fill whole nodes",
                    )
                )
                break
    return problems


def micro_batches(global_batch: int, sizes: int | tuple[int, ...], what: str = "--global-batch") -> int:
    """Section 1d's M: the micro-batches of ``sizes`` samples in a step of ``global_batch`` (of the
    largest of several sizes that gives a whole number of them; ValueError, in words, when none does
    or they are too many)."""
    sizes = (sizes,) if isinstance(sizes, int) else sizes
    whole = [b for b in sizes if global_batch % b == 0]
    if not whole:
        b = sizes[-1]
        said = f"batch_size {b:,}" if len(sizes) == 1 else f"any of the sizes {', '.join(map(str, sizes))}"
        raise ValueError(
            f"{what} {global_batch:,} is not a whole number of micro-batches of {said} "
            f"(the batch the times were measured at): give a multiple of {b:,}, e.g. "
            f"{max(1, round(global_batch / b)) * b:,}"
        )
    count_ = global_batch // whole[-1]
    if count_ > MAX_MICRO_BATCHES:
        raise ValueError(
            f"{what} {global_batch:,} is {count_:,} micro-batches of {whole[-1]:,}, more than "
            f"{MAX_MICRO_BATCHES:,}: a step that long is no pipeline; profile at a larger batch_size"
        )
    return count_


def check_plan_on_cluster(plan: Plan, pdoc: Document, cluster: Cluster, cdoc: Document) -> None:
    """``heterps validate PLAN CLUSTER``: the types, units and node kinds the plan names are the cluster's.
    Its figures are ``check``'s to recompute, from the profile too."""
    problems = []
    used: dict[str, int] = {}
    for i, stage in enumerate(plan.stages):
        if stage.resource not in cluster.resources:
            offered = ", ".join(cluster.resources)
            problems.append(
                pdoc.error(("stages", i, "resource"), f"{stage.resource!r} is no type of {cdoc.path} ({offered})")
            )
        for n, part in enumerate(stage.joined or ()):  # section 1i
            if part.resource not in cluster.resources:
                offered = ", ".join(cluster.resources)
                problems.append(
                    pdoc.error(
                        ("stages", i, "joined", n, "resource"),
                        f"{part.resource!r} is no type of {cdoc.path} ({offered})",
                    )
                )
        for t, units in stage.units_by_type.items():
            used[t] = used.get(t, 0) + units
    for t, n in used.items():
        limit = cluster.resources[t].limit if t in cluster.resources else None
        if limit is not None and n > limit:
            problems.append(
                pdoc.error(("stages",), f"uses {n} units of {t}, more than its limit of {limit} in {cdoc.path}")
            )
    for kind, count in (plan.rental or {}).items():
        if cluster.nodes is None or kind not in cluster.nodes:
            problems.append(pdoc.error(("rental", kind), f"rents node kind {kind!r}, which {cdoc.path} does not offer"))
        elif count > cluster.nodes[kind].available:
            available = cluster.nodes[kind].available
            problems.append(
                pdoc.error(("rental", kind), f"rents {count} of {kind}, more than the {available} available")
            )
    if cluster.nodes is not None and not plan.rental:
        problems.append(
            pdoc.error(("stages",), f"{cdoc.path} rents whole nodes, and the plan says none: plan it on this cluster")
        )
    if problems:
        raise InputError.joined(problems)


def load_cluster(path: str) -> tuple[Cluster, Document]:
    doc = load_yaml(path)
    return _checked_cluster(doc), doc


def _checked_cluster(doc: Document) -> Cluster:
    """The cluster a document holds, with every rule the schema alone cannot say (``validate`` and
    ``plan`` refuse the same files)."""
    cluster: Cluster = _validate(Cluster, doc, "cluster")
    _check_pricing(cluster, doc)
    for name, r in cluster.resources.items():
        if r.memory_reserved_gb is not None and r.memory_gb is not None and r.memory_reserved_gb >= r.memory_gb:
            raise doc.error(
                ("resources", name, "memory_reserved_gb"),
                f"{number(r.memory_reserved_gb)} GB reserved is not below the unit's memory_gb of "
                f"{number(r.memory_gb)}: nothing would be left for training",
            )
    return cluster


def _check_pricing(cluster: Cluster, doc: Document) -> None:
    """Units are priced and counted per type (sections 1-1d) or per node (section 1e), never both."""
    if cluster.nodes is None:
        for name, r in cluster.resources.items():
            for field in ("price", "limit"):
                if getattr(r, field) is None:
                    raise doc.error(
                        ("resources", name),
                        f"needs a {field}: {'USD per unit-hour' if field == 'price' else 'the units available'} "
                        "(or list the cluster's nodes, which give both; docs/spec.md section 3)",
                    )
        return
    for name, r in cluster.resources.items():
        for field in ("price", "limit"):
            if getattr(r, field) is not None:
                raise doc.error(
                    ("resources", name, field),
                    f"this cluster lists nodes, which set the {field} of its units (nodes.KIND.price, "
                    "nodes.KIND.units, nodes.KIND.available): remove it here",
                )
    held = set()
    for kind, node in cluster.nodes.items():
        for t in node.units:
            if t not in cluster.resources:
                close = difflib.get_close_matches(t, list(cluster.resources), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise doc.error(
                    ("nodes", kind, "units", t),
                    f"no resource type {t!r} in this cluster{hint}: the types are {', '.join(cluster.resources)}",
                )
            held.add(t)
        _links_held(doc, ("nodes", kind), "node", node.link_gbps, node.units)
    for name in cluster.resources:
        if name not in held:
            raise doc.error(("resources", name), f"no node kind holds {name}: add it to a node's units, or remove it")


def _links_held(doc: Document, where: tuple, what: str, links: dict | None, units: dict) -> None:
    """Section 1e: a link is given only for a type the node (or instance) holds."""
    for t in links or {}:
        if t not in units:
            raise doc.error(
                (*where, "link_gbps", t),
                f"this {what} holds no {t}: a link is given for the types in its units ({', '.join(units)})",
            )


def load_catalogue(path: str) -> Catalogue:
    doc = load_yaml(path)
    catalogue: Catalogue = _validate(Catalogue, doc, "catalogue")
    if "other" not in catalogue.efficiency:
        raise doc.error(("efficiency",), "needs an 'other' entry: the efficiency of kinds not listed")
    # The roofline divides by peak x efficiency: a product under one operation (or byte) a second
    # underflows or makes a layer's time infinite, which no profile can hold.
    least = min(catalogue.efficiency.values())
    for name, device in catalogue.devices.items():
        for peak, tflops in device.tflops.model_dump(exclude_none=True).items():
            if tflops * 1e12 * least < 1:
                raise doc.error(
                    ("devices", name, "tflops", peak),
                    f"{tflops:.3g} TFLOP/s at an efficiency of {least:.3g} is under one operation a second: "
                    "give the device's real peak (and efficiencies)",
                )
        if device.memory_gbps * 1e9 * catalogue.memory_efficiency < 1:
            raise doc.error(
                ("devices", name, "memory_gbps"),
                f"{device.memory_gbps:.3g} GB/s at a memory efficiency of {catalogue.memory_efficiency:.3g} is "
                "under one byte a second: give the device's real bandwidth",
            )
    return catalogue


def load_instances(path: str) -> InstanceCatalogue:
    doc = load_yaml(path)
    catalogue: InstanceCatalogue = _validate(InstanceCatalogue, doc, "instances")
    for name, instance in catalogue.instances.items():
        _links_held(doc, ("instances", name), "instance", instance.link_gbps, instance.units)
        if instance.link_gbps and instance.link_source is None:
            raise doc.error(("instances", name), "gives link_gbps without a link_source: say where the figure is from")
    return catalogue


def load_plan(path: str) -> tuple[Plan, Document]:
    doc = load_yaml(path)
    return _plan_of(doc), doc


def _joined_rules(doc: Document, plan: Plan, i: int, stage: Stage) -> list:
    """Section 1i: a mixed stage's parts train the whole micro-batch, each replica a sample at least, each
    part of its own type, without recomputation, under a pipeline schedule."""
    if stage.joined is None:
        return [doc.error(("stages", i, "samples"), "samples is given only with joined")] if stage.samples else []
    where = ("stages", i)
    if stage.samples is None:
        return [doc.error((*where, "joined"), f"stage {i} is joined by other types but gives no samples of its own")]
    out = []
    if plan.global_batch is None:
        out.append(doc.error((*where, "joined"), f"stage {i} mixes types, which needs a pipeline (global_batch)"))
    if stage.recompute:
        out.append(doc.error((*where, "recompute"), f"stage {i} mixes types, which it does without recomputation only"))
    parts: list[tuple[str, int, int, tuple]] = [(stage.resource, stage.replicas, stage.samples, (*where, "samples"))]
    parts += [(j.resource, j.replicas, j.samples, (*where, "joined", n, "samples")) for n, j in enumerate(stage.joined)]
    if len({p[0] for p in parts}) < len(parts):
        out.append(doc.error((*where, "joined"), f"stage {i} names a type twice: each type is one part"))
    for resource, replicas, samples, field in parts:
        if samples < replicas:
            said = f"stage {i}'s {replicas} {resource} replicas train {samples} samples: a replica trains one at least"
            out.append(doc.error(field, said))
    total = sum(p[2] for p in parts)
    if total != plan.batch_size:
        out.append(
            doc.error(
                (*where, "samples"),
                f"stage {i}'s parts train {total} samples of each micro-batch, not the batch_size {plan.batch_size}",
            )
        )
    return out


def _plan_of(doc: Document) -> Plan:
    """A plan file, with the rules between its fields that the schema cannot state."""
    plan: Plan = _validate(Plan, doc, "plan")
    problems = []
    if plan.gap is not None and plan.optimal:
        problems.append(
            doc.error(("gap",), "a gap says exact stopped before proving the plan optimal, yet it says optimal: true")
        )
    if (plan.global_batch is None) != (plan.micro_batches is None):
        given, missing = (
            ("global_batch", "micro_batches") if plan.micro_batches is None else ("micro_batches", "global_batch")
        )
        problems.append(doc.error((given,), f"a pipelined plan (docs/spec.md section 1d) gives {missing} too"))
    elif plan.global_batch is not None and plan.micro_batches is not None:
        if plan.global_batch != plan.batch_size * plan.micro_batches:
            problems.append(
                doc.error(
                    ("micro_batches",),
                    f"global_batch {plan.global_batch} is not batch_size {plan.batch_size} × micro_batches "
                    f"{plan.micro_batches}",
                )
            )
    for i, stage in enumerate(plan.stages):
        problems += _joined_rules(doc, plan, i, stage)
    for i, stage in enumerate(plan.stages):  # docs/spec.md section 1: a replica trains whole samples
        if stage.replicas > plan.batch_size:
            problems.append(
                doc.error(
                    ("stages", i, "replicas"),
                    f"stage {i} has {stage.replicas} replicas but a batch of {plan.batch_size} samples, and a "
                    f"replica trains whole samples: give it at most {plan.batch_size} (heterps plan does), or "
                    "profile the model at a larger batch",
                )
            )
    _raise_all(problems)
    return plan


def _load_together(*loads: tuple[Callable[[str], Any], str]) -> list[Any]:
    """Each ``load(path)``, with the problems of every file reported together."""
    loaded: list[Any] = []
    problems: list[InputError] = []
    for load, path in loads:
        try:
            loaded.append(load(path))
        except InputError as exc:
            problems.append(exc)
    _raise_all(problems)
    return loaded


def load_pair(profile_path: str, cluster_path: str) -> tuple[tuple[Profile, Document], tuple[Cluster, Document]]:
    """Both files, with the problems of both reported together."""
    profile, cluster = _load_together((load_profile, profile_path), (load_cluster, cluster_path))
    return profile, cluster


def load_with_cluster(path: str, cluster_path: str) -> tuple[str, Profile | Plan, Document, Cluster, Document]:
    """A profile or a plan (its kind, what it holds, its document) and a cluster, with the problems of both
    reported together (``heterps validate FILE CLUSTER``)."""
    (kind, found, doc), (cluster, cdoc) = _load_together((load_any, path), (load_cluster, cluster_path))
    if kind == "cluster":
        raise doc.error((), f"this is a cluster: give a profile or a plan, then the cluster ({cluster_path})")
    return kind, found, doc, cluster, cdoc


def usable_types(profile: Profile, cluster: Cluster) -> tuple[str, ...]:
    """The cluster's types that the profile times, in cluster order (a type that runs no layer
    can never be part of a plan)."""
    timed = profile.types
    return tuple(t for t in cluster.resources if t in timed)


def check_plannable(profile: Profile, doc: Document) -> None:
    """Section 2: a profile whose layers heterps found not to chain makes no plan (none could run)."""
    if profile.chain is False:
        raise doc.error(
            ("chain",),
            "the layers are not a chain (heterps profile found some layer not taking the output of the one "
            "before, its header says where), so heterps run could split no plan of them: profile the model "
            "with --granularity auto (the default) or blocks",
        )


def check_pair(profile: Profile, pdoc: Document, cluster: Cluster, cdoc: Document) -> None:
    """An error naming the profile's line if its layers make no plan (:func:`check_plannable`) or the
    cluster offers no type some layer can run on."""
    check_plannable(profile, pdoc)
    theirs = {compatible(t): t for t in cluster.resources}
    for t in profile.types:
        other = theirs.get(compatible(t), t)
        if other != t:
            raise pdoc.error(
                ("layers",),
                f"the profile's type {t!r} is the cluster's {other!r} ({cdoc.path}) written with other characters "
                "of the same meaning (Unicode NFKC): heterps would take them as two types; write them alike",
            )
    types = usable_types(profile, cluster)
    if not types:
        profiled = sorted(profile.types)
        raise pdoc.error(
            ("layers",),
            f"no resource type in common with cluster file {cdoc.path} "
            f"(profile times: {', '.join(profiled)}; cluster offers: {', '.join(cluster.resources)})",
        )
    for i, layer in enumerate(profile.layers):
        if not any(t in layer.times for t in types):
            raise pdoc.error(
                ("layers", i, "times"),
                f"layer '{layer.name}' can run on none of the resource types in {cdoc.path} "
                f"(it is timed on: {', '.join(layer.times)}; the cluster offers: {', '.join(cluster.resources)})",
            )
