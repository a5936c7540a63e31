"""The input file formats of docs/spec.md sections 2 and 3, as strict pydantic models.

Strict on purpose: unknown keys, quoted numbers, booleans for numbers, NaN and
infinities are all errors, because a typo that silently changes a plan is worse
than a refusal. :mod:`.loading` reads the files into them, every error naming the
file, the line and the field path.
"""

from __future__ import annotations

import json
import re
import sys
import unicodedata
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_type_hints

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StringConstraints,
    create_model,
)

from heterps_cli.objective import Objective
from heterps_cli.untrusted import first_unprintable, invisible
from heterps_cli.yamlio import nfc


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
    cast_size: NonNegative = 0.0


class Layer(_Strict):
    name: Name
    type: Name
    input_size: NonNegative
    weight_size: NonNegative
    alpha: Fraction | None = None
    beta: Fraction | None = None
    activation_size: NonNegative = 0.0  # section 1b: bytes per sample kept for the backward pass
    input_saved: NonNegative = 0.0  # section 1b: of those, the bytes the layer before also keeps
    cast_size: NonNegative = 0.0  # section 1b: bytes a batch keeps whatever its samples (weight copies)
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
        assert alpha is not None and beta is not None  # guaranteed by loading.load_profile
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


class TiedTensor(_Strict):
    """Section 1j: one tensor several layers hold (a tied embedding and output head, a shared buffer)."""

    tensor: Name  # its name in its first holder: LAYER.PATH
    kind: Literal["parameter", "buffer"] = "parameter"
    bytes: NonNegative
    layers: list[Name]  # its holders, by name, in the profile's order: two or more (loading checks)


class Profile(_Strict):
    model: Name
    batch_size: BatchSize
    job: ProfileJob = ProfileJob()
    # section 1b: training-state bytes per weight byte
    state_factor: Annotated[float, Field(gt=0, le=1e6), AfterValidator(_normal)] = 4.0
    precision: Precision | None = None  # section 2: what the times assume the model trains at
    chain: bool | None = None  # section 2: whether heterps run can cut between any two layers (None: unknown)
    fixed: Annotated[dict[Name, FixedCosts], Field(min_length=1)] | None = None  # section 1d, per type
    ties: list[TiedTensor] | None = None  # section 1j: tensors several layers hold
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
    # section 1j: s per step keeping the tied tensors it shares with other stages one (in update_s or comm_s)
    tied_s: NonNegative | None = None

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
    format: Annotated[int, Field(ge=1)] | None = None  # PLAN_FORMAT of the heterps that wrote it; none: older
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


# The plan file's format: a plan that states it gives every field that applies to it (heterps check holds
# it to that); older plans, written before it, leave out the fields their heterps did not know.
PLAN_FORMAT = 2
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
    "format",
)
STAGE_ONLY_WHERE_GIVEN = (
    "transfer_s", "memory_gb", "update_s", "step_s", "in_flight", "nodes", "recompute", "tp", "joined", "samples",
    "tied_s",
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
