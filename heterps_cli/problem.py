"""The validated planning problem: a profile and a cluster joined into numpy arrays.

Every scheduler takes a :class:`Problem` and nothing else, so they are
interchangeable. Only the cluster's resource types that the profile times are
kept (a type that runs no layer can never be part of a plan).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from heterps_cli.batches import Measured, choices, measured
from heterps_cli.errors import InputError, TooLarge
from heterps_cli.figures import number
from heterps_cli.formats import Cluster, Profile
from heterps_cli.formulas import SECONDS_PER_HOUR, run_cost
from heterps_cli.loading import check_pair, load_pair, micro_batches, usable_types
from heterps_cli.nodes import Nodes
from heterps_cli.objective import Objective
from heterps_cli.problem_terms import DegreeViews, Fixed, MemoryTerms, RentalQuestions, TransferTerms
from heterps_cli.ties import Held
from heterps_cli.yamlio import Document


@dataclass(frozen=True, eq=False)
class Problem(DegreeViews, MemoryTerms, TransferTerms, RentalQuestions):
    """A profile and a cluster joined: per layer and type the spec's figures as ``[n, T]`` arrays, the
    cluster's prices and limits, the job; what it derives from them is in :mod:`.problem_terms`."""

    model: str
    cluster: str
    layer_names: tuple[str, ...]
    layer_kinds: tuple[str, ...]
    input_size: np.ndarray  # [n] bytes per sample
    weight_size: np.ndarray  # [n] bytes
    types: tuple[str, ...]
    units: tuple[str, ...]
    prices: np.ndarray  # [T] USD per unit-hour
    limits: np.ndarray  # [T] units available
    oct: np.ndarray  # [n, T] seconds per batch on one unit; 0 where the layer cannot run
    odt: np.ndarray  # [n, T]
    alpha: np.ndarray  # [n, T]
    beta: np.ndarray  # [n, T]
    runnable: np.ndarray  # [n, T] bool
    # docs/spec.md section 1b; the defaults (inf, inf, 0, False) are the paper's model.
    bandwidth: np.ndarray  # [T] bytes/s of one unit's link; inf: no stage-boundary transfer
    memory: np.ndarray  # [T] bytes of one unit; inf: no memory limit
    activation_size: np.ndarray  # [n] bytes per sample kept for backward
    sharded: np.ndarray  # [n] bool: weights split across the stage's replicas
    state_factor: float  # training-state bytes per weight byte
    batch_size: int
    samples: float
    epochs: float
    min_throughput: float = 0.0
    max_cost: float | None = None
    objective: Objective = Objective.COST
    # docs/spec.md section 1d; the defaults (0: no pipeline schedule, no update times, nothing
    # reserved) keep sections 1 and 1b exactly.
    micro_batches: int = 0  # M, micro-batches of batch_size per optimiser step
    update: np.ndarray | None = None  # [n, T] seconds of the optimiser step per step on one unit
    # [T] seconds a stage pays per micro-batch, per all-reduce beyond its bytes, and per message across
    # a stage boundary beyond its bytes, whatever its layers
    pass_start: np.ndarray | None = None
    all_reduce_latency: np.ndarray | None = None
    transfer_latency: np.ndarray | None = None
    reserved: np.ndarray | None = None  # [T] bytes of a unit's memory the runtime takes
    # docs/spec.md section 1e: units come in whole nodes; prices are then Nodes.unit_prices and
    # limits every available node's units, and a plan costs the rental it runs on.
    nodes: Nodes | None = None
    # section 1b: of each layer's activation_size, the bytes the layer before it also saves (a ReLU's
    # output, the next layer's input): held once in a stage that has both, again by a stage it starts.
    input_saved: np.ndarray | None = None  # [n] bytes per sample
    cast_size: np.ndarray | None = None  # [n] section 1b: bytes a batch keeps whatever its samples (weight copies)
    # section 1: neighbouring stages may share a type, unless the papers' maximal runs are asked for
    maximal_stages: bool = False
    precision: str | None = None  # section 2: what the profile's times assume the model trains at
    # section 1f: the profile's times at every size it measured, and whether a plan chooses batch_size
    # among them (a global batch, several sizes, no --micro-batch)
    measured: Measured | None = None
    choose_micro_batch: bool = False
    # section 1f: [n, T] the most samples a replica may train of each layer on each type, the largest
    # size measured there, where batch_size exceeds it (inf elsewhere; None: nowhere)
    share_cap: np.ndarray | None = None
    # section 1g: [n, T] the forward pass's part of oct, NaN where the profile gives none (None: nowhere)
    forward: np.ndarray | None = None
    # section 1h: the problem at each further tensor-parallel degree d, by d: the same cluster and job,
    # its times and sizes those of one replica of d units (``degree``); None: tp 1 alone
    tensor: dict[int, Problem] | None = None
    degree: int = 1
    # section 1h: [T] bytes/s of the link inside a node over which a tp replica's units gather what
    # they receive (None: the type's bandwidth), and whether a node's units share one network link
    gather_link: np.ndarray | None = None
    shared_link: np.ndarray | None = None
    # section 1j: tensors several layers hold, each counted in its first holder's weight_size
    ties: tuple[Held, ...] = ()
    fixed: Fixed = Fixed()  # section 1k: what the user or an engine fixes of a plan's shape

    @property
    def pipelined(self) -> bool:
        """Section 1d: a step is ``micro_batches`` micro-batches through a 1F1B pipeline."""
        return self.micro_batches > 0

    @property
    def step_samples(self) -> int:
        """Samples per step: what a stage's time is for (B0, or M x B0 under section 1d)."""
        return self.batch_size * self.micro_batches if self.pipelined else self.batch_size

    @property
    def micro_batch_choices(self) -> tuple[int, ...]:
        """Section 1f: the micro-batches a plan chooses among (``batch_size`` alone unless it chooses)."""
        if not self.choose_micro_batch or self.measured is None:
            return (self.batch_size,)
        tables = [v.measured for v in self.views if v.measured is not None]
        return choices(tables, self.step_samples, float(self.limits.sum()))

    def at_micro_batch(self, batch: int) -> Problem:
        """Section 1f: this problem with micro-batches of ``batch`` samples (the same samples per step),
        its times from the profile's measured sizes; ValueError, in words, if no measured size is at
        least ``batch`` for some layer, or ``batch`` does not divide the step."""
        if batch == self.batch_size:
            return self.replace(choose_micro_batch=False) if self.choose_micro_batch else self
        assert self.measured is not None
        steps = self.step_samples if self.pipelined else None
        at = _at_batch(self.measured, batch, self.layer_names, steps, self.degree > 1 or bool(self.tensor))
        out = self.replace(**at, choose_micro_batch=False)
        if self.tensor:  # each degree at the same micro-batch, from its own measured sizes
            out = dataclasses.replace(out, tensor={d: p.at_micro_batch(batch) for d, p in self.tensor.items()})
            _check_covered(out)
        return where_allowed(out)

    @property
    def can_recompute(self) -> bool:
        """Section 1g: some stage may recompute its activations (a pipeline, and some forward time)."""
        return self.pipelined and self.forward is not None

    @property
    def update_times(self) -> np.ndarray:
        return self.update if self.update is not None else np.zeros((self.n_layers, self.n_types))

    @property
    def n_layers(self) -> int:
        return len(self.layer_names)

    @property
    def n_types(self) -> int:
        return len(self.types)

    @property
    def work(self) -> float:
        """Samples to process over the whole run: epochs * samples per epoch."""
        return self.epochs * self.samples

    @property
    def parts(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per layer and type: serial and parallel compute, serial and parallel communication.

        ``CT(k) = serial + parallel / k`` is docs/spec.md section 1's Amdahl term summed
        over a stage's layers; keeping the two halves apart lets a whole stage be
        summed once and evaluated for any replica count.
        """
        return (
            self.oct * (1.0 - self.alpha),
            self.oct * self.alpha,
            self.odt * (1.0 - self.beta),
            self.odt * self.beta,
        )

    def replace(self, **changes) -> Problem:
        """This problem with ``changes``; the cluster's and the job's reach every degree (section 1h),
        a degree's own times and sizes only this problem's (:meth:`each_degree` changes them all)."""
        out = dataclasses.replace(self, **changes)
        shared = {k: v for k, v in changes.items() if k not in PER_DEGREE}
        if self.tensor and shared and "tensor" not in changes:
            out = dataclasses.replace(out, tensor={d: p.replace(**shared) for d, p in self.tensor.items()})
        return out


def where_allowed(problem: Problem) -> Problem:
    """Section 1k: ``problem`` with its layers runnable only where a shape's layer ranges allow."""
    if (allowed := problem.fixed.layer_allowed) is None:
        return problem
    return problem.each_degree(lambda view: {"runnable": view.runnable & allowed})


# Section 1h: the fields each tensor-parallel degree has its own of (Problem.replace keeps them apart).
PER_DEGREE = frozenset(
    {
        "oct", "odt", "alpha", "beta", "runnable", "update", "forward", "weight_size", "activation_size",
        "input_saved", "cast_size", "measured", "tensor", "degree", "share_cap",
    }
)  # fmt: skip


def load_problem(
    profile_path: str,
    cluster_path: str,
    *,
    objective: Objective = Objective.COST,
    samples: float | None = None,
    epochs: float | None = None,
    min_throughput: float | None = None,
    max_cost: float | None = None,
    global_batch: int | None = None,
    maximal_stages: bool = False,
    micro_batch: int | None = None,
) -> Problem:
    """Read, validate and join a profile and a cluster file into the problem every scheduler takes.

    ``samples``, ``epochs`` and ``min_throughput`` override the profile's ``job``
    section (None: the profile's). Every problem in the files is an
    :class:`~heterps_cli.errors.InputError` naming the file, line and field.
    """
    (profile, pdoc), (cluster, cdoc) = load_pair(profile_path, cluster_path)
    check_pair(profile, pdoc, cluster, cdoc)
    if global_batch is not None and micro_batch is None:
        try:
            micro_batches(global_batch, profile.sizes)
        except ValueError as exc:
            raise InputError(None, None, "--global-batch", str(exc)) from None
    if samples is None and profile.job.samples is None:
        raise pdoc.error(
            ("job", "samples"),
            "samples per epoch are not given: set job.samples in the profile, "
            "or give them to the command (--samples N)",
        )
    try:
        problem = build_problem(
            profile,
            cluster,
            objective=objective,
            samples=samples,
            epochs=epochs,
            min_throughput=min_throughput,
            max_cost=max_cost,
            global_batch=global_batch,
            maximal_stages=maximal_stages,
            micro_batch=micro_batch,
        )
    except NoSuchMicroBatch as exc:
        if micro_batch is None and global_batch is None:  # the profile's own job.global_batch
            raise pdoc.error(("job", "global_batch"), str(exc)) from None
        raise InputError(
            None, None, "--micro-batch" if micro_batch is not None else "--global-batch", str(exc)
        ) from None
    _check_finite_figures(problem, pdoc, cdoc, samples_given=samples is not None, epochs_given=epochs is not None)
    if (too_many := _unrentable(problem.nodes)) is not None:
        raise cdoc.error(("nodes",), too_many)
    return problem


def unrentable(cluster: Cluster) -> str | None:
    """Section 1e: why the cluster's rentals are too many to search, so that every plan command
    would refuse it (``validate`` and ``heterps cluster`` say so first), or None."""
    return _unrentable(_nodes(cluster, tuple(cluster.resources)))


def _unrentable(nodes: Nodes | None) -> str | None:
    if nodes is None:
        return None
    try:
        nodes.menu  # noqa: B018  (built once here, and kept for the search)
    except TooLarge as exc:
        return exc.message
    return None


def build_problem(
    profile: Profile,
    cluster: Cluster,
    *,
    objective: Objective = Objective.COST,
    samples: float | None = None,
    epochs: float | None = None,
    min_throughput: float | None = None,
    max_cost: float | None = None,
    global_batch: int | None = None,
    maximal_stages: bool = False,
    micro_batch: int | None = None,
) -> Problem:
    """Join a validated profile and cluster (:func:`load_problem` checks them against each other
    first); the keyword values override the profile's ``job``."""
    if objective not in tuple(Objective):
        raise ValueError(f"objective must be cost or time, not {objective!r}")
    types = usable_types(profile, cluster)
    samples = samples if samples is not None else profile.job.samples
    if samples is None:
        raise ValueError("samples per epoch are not given: the profile has no job.samples")
    own = _runnable(profile, types)
    res = [cluster.resources[t] for t in types]
    nodes = _nodes(cluster, types)
    prices, limits = _prices_and_limits(res, nodes)
    steps = global_batch if global_batch is not None else profile.job.global_batch
    table = own["measured"]
    tables = [table, *(measured(profile.at_degree(d, types), types) for d in profile.degrees[1:] if steps)]
    batch, M, choose = _micro_batch(profile, tables, steps, micro_batch, float(limits.sum()))
    problem = Problem(
        model=profile.model,
        cluster=cluster.cluster,
        **{**_layers(profile), **own},
        types=types,
        units=tuple(r.unit or t for r, t in zip(res, types)),
        **_hardware(res, nodes),
        prices=prices,
        limits=limits,
        state_factor=float(profile.state_factor),
        batch_size=batch,
        samples=float(samples),
        epochs=float(epochs if epochs is not None else (profile.job.epochs or 1.0)),
        min_throughput=float(min_throughput if min_throughput is not None else (profile.job.min_throughput or 0.0)),
        max_cost=max_cost,
        objective=Objective(objective),
        micro_batches=M,
        nodes=nodes,
        maximal_stages=maximal_stages,
        choose_micro_batch=choose,
        precision=profile.precision,
        **_fixed_costs(profile, types),
    )
    if batch != profile.batch_size:  # else the profile's own figures, as written
        problem = problem.replace(**_at_batch(table, batch, problem.layer_names, steps, partial=len(tables) > 1))
    problem = dataclasses.replace(problem, tensor=_tensor(profile, problem, steps))
    if len(tables) > 1:
        _check_covered(problem)
    return problem


def _runnable(profile: Profile, types: tuple[str, ...]) -> dict:
    """The profile's per-degree tables on ``types`` (:func:`_per_degree`), once every layer can run on one."""
    if not types:
        raise ValueError("the cluster offers none of the resource types the profile times")
    own = _per_degree(profile, types)
    if not own["runnable"].any(axis=1).all():
        layer = profile.layers[int(np.argmin(own["runnable"].any(axis=1)))]
        raise ValueError(f"layer {layer.name!r} can run on none of the cluster's resource types")
    return own


def _check_covered(problem: Problem) -> None:
    """Sections 1f and 1h: at the problem's micro-batch, every layer has a time at some degree (a degree
    without one at that size is no error: another runs the layer); NoSuchMicroBatch naming the first
    layer that has none."""
    covered = np.any([view.runnable.any(axis=1) for view in problem.views], axis=0)
    if covered.all():
        return
    layer = problem.layer_names[int(np.argmin(covered))]
    raise NoSuchMicroBatch(
        f"layer {layer!r} has no time on the cluster's types at any tensor-parallel degree at micro-batch "
        f"{problem.batch_size:,}: measure it there (heterps profile --batch-sizes) on a type the cluster offers"
    )


def _fixed_costs(profile: Profile, types: tuple[str, ...]) -> dict:
    """Section 1d: the profile's ``fixed`` costs of ``types`` as Problem fields (None where it gives none)."""
    if not profile.fixed:
        return {}
    given = [profile.fixed.get(t) for t in types]
    return {
        field: np.array([float(getattr(g, field)) if g is not None else 0.0 for g in given])
        for field in ("pass_start", "all_reduce_latency", "transfer_latency")
    }


def _per_degree(profile: Profile, types: tuple[str, ...]) -> dict:
    """The problem's fields that a profile gives per tensor-parallel degree (:data:`PER_DEGREE`, section
    1h), read from ``profile`` (the profile itself, or :meth:`Profile.at_degree`) on ``types``."""
    oct_, odt, alpha, beta, update, runnable = _times(profile, types)
    table = measured(profile, types)
    sizes = _layers(profile)
    return {
        "oct": oct_,
        "odt": odt,
        "alpha": alpha,
        "beta": beta,
        "runnable": runnable,
        "update": update if update.any() else None,
        "measured": table,
        "forward": _given(table.forward[table.sizes.index(profile.batch_size)]),
        **{field: sizes[field] for field in ("weight_size", "activation_size", "input_saved", "cast_size")},
    }


def _tensor(profile: Profile, main: Problem, steps: int | None) -> dict[int, Problem] | None:
    """Section 1h: ``main`` at each further tensor-parallel degree the profile gives (under a pipeline
    schedule only): its times and sizes at that degree, on the types where replicas of that many
    units can be placed."""
    if len(profile.degrees) == 1 or not main.pipelined:
        return None
    out = {}
    for d in profile.degrees[1:]:
        offered = [t for t, ok in zip(main.types, _placeable(main, d)) if ok]
        fields = _per_degree(profile.at_degree(d, offered), main.types)
        if main.batch_size != profile.batch_size:  # at the main problem's micro-batch, as it is
            fields |= _at_batch(fields["measured"], main.batch_size, main.layer_names, steps, partial=True)
        holders = [i for tie in main.ties for i in tie.layers]
        if holders:  # section 1j: a tied tensor's holders run at tp 1, where heterps run keeps it one
            fields["runnable"] = fields["runnable"].copy()
            fields["runnable"][holders] = False
        out[d] = dataclasses.replace(main, **fields, tensor=None, degree=d)
    return out


def _placeable(problem: Problem, degree: int) -> np.ndarray:
    """Section 1h: ``[T]``, whether a replica of ``degree`` units of each type can be placed: within one
    node, every node kind holding the type holding a multiple of ``degree`` of it (so that any replicas
    whose units a rental holds fill its nodes); without nodes, a type with at least that many units."""
    if problem.nodes is None:
        return problem.limits >= degree
    units = problem.nodes.units
    return ((units % degree == 0) | (units == 0)).all(axis=0) & (units > 0).any(axis=0)


def _micro_batch(
    profile: Profile, tables: list[Measured], steps: int | None, fixed: int | None, units: float = np.inf
) -> tuple[int, int, bool]:
    """Section 1f: the micro-batch a problem starts at, its micro-batches per step (0 without a global
    batch), and whether a plan chooses among several. ValueError, in words, for a ``--micro-batch``
    that does not divide the step."""
    if fixed is not None:
        return fixed, _whole_micro_batches(steps, fixed) if steps is not None else 0, False
    if steps is None:
        return profile.batch_size, 0, False
    offered = choices(tables, steps, units)
    if not offered:
        sizes = sorted({size for table in tables for size in table.sizes})
        raise NoSuchMicroBatch(
            f"no micro-batch divides the global batch {steps:,}: neither a size the profile measured "
            f"({', '.join(f'{s:,}' for s in sizes)}) nor a multiple of the largest that the cluster's units could "
            f"split among replicas; give a global batch that is a multiple of one of them, or measure a size "
            f"that divides it (heterps profile --batch-sizes)"
        )
    batch = profile.batch_size if profile.batch_size in offered else offered[-1]
    return batch, micro_batches(steps, batch), len(offered) > 1


def _at_batch(table: Measured, batch: int, names: tuple[str, ...], steps: int | None, partial: bool = False) -> dict:
    """The fields of a problem at micro-batch ``batch`` (section 1f), with each layer's share cap where
    ``batch`` is above its largest measured size; ValueError naming the first layer with no time at all
    (``partial``: a tensor-parallel degree's, section 1h, where a layer may have none)."""
    oct_, odt, alpha, beta, forward, found = table.at(batch)
    if not partial and not found.any(axis=1).all():
        layer = names[int(np.argmin(found.any(axis=1)))]
        raise NoSuchMicroBatch(
            f"layer {layer!r} has no time on the cluster's types at micro-batch {batch:,}: measure it there "
            "(heterps profile --batch-sizes) on a type the cluster offers"
        )
    top = table.largest_each()
    cap = np.where(found & (top < batch), top, np.inf)
    return {
        "oct": oct_,
        "odt": odt,
        "alpha": alpha,
        "beta": beta,
        "runnable": found,
        "forward": _given(forward),
        "share_cap": cap if np.isfinite(cap).any() else None,
        "batch_size": batch,
        "micro_batches": _whole_micro_batches(steps, batch) if steps is not None else 0,
    }


class NoSuchMicroBatch(ValueError):
    """Section 1f: a micro-batch the profile cannot give, or that does not divide the global batch."""


def _given(forward: np.ndarray) -> np.ndarray | None:
    """Section 1g: ``[n, T]`` forward times, NaN where not given; None where none is."""
    return None if np.isnan(forward).all() else forward


def _whole_micro_batches(steps: int, batch: int) -> int:
    """Section 1f: the micro-batches of ``batch`` in a step of ``steps`` samples; ValueError, in words,
    unless ``batch`` divides it into at most MAX_MICRO_BATCHES."""
    if steps % batch:
        near = min((d for d in range(1, min(steps, 10**6) + 1) if steps % d == 0), key=lambda d: abs(d - batch))
        raise NoSuchMicroBatch(
            f"micro-batch {batch:,} does not divide the global batch {steps:,} into whole micro-batches: "
            f"take a divisor of it, such as {near:,}"
        )
    return micro_batches(steps, batch)


def _prices_and_limits(res: list, nodes: Nodes | None) -> tuple[np.ndarray, np.ndarray]:
    """USD an hour and units of each type: the cluster's, or per unit of its nodes (section 1e)."""
    if nodes is not None:
        return nodes.unit_prices, nodes.capacity.astype(np.int64)
    return np.array([r.price for r in res], dtype=float), np.array([r.limit for r in res], dtype=np.int64)


def _hardware(res: list, nodes: Nodes | None) -> dict:
    """Each type's bandwidth (bytes/s) and memory (bytes) per unit, inf where the cluster gives none
    (section 1b), its reserved memory where any type gives one (section 1d), and where a tp replica's
    units gather their boundary activations (section 1h)."""
    bandwidth = np.array([r.bandwidth_gbps * 1e9 / 8 if r.bandwidth_gbps else np.inf for r in res], dtype=float)
    gather = None
    if nodes is not None and nodes.link is not None and (nodes.link > 0).any():  # the least of a kind holding it
        own = np.where(nodes.link > 0, nodes.link, bandwidth[None, :])
        gather = np.where(nodes.units > 0, own, np.inf).min(axis=0)
    return {
        "bandwidth": bandwidth,
        "gather_link": gather,
        "shared_link": np.array([bool(r.shared_link) for r in res]) if any(r.shared_link for r in res) else None,
        "memory": np.array([r.memory_gb * 1e9 if r.memory_gb else np.inf for r in res], dtype=float),
        "reserved": (
            np.array([(r.memory_reserved_gb or 0.0) * 1e9 for r in res])
            if any(r.memory_reserved_gb for r in res)
            else None
        ),
    }


def _times(profile: Profile, types: tuple[str, ...]) -> tuple[np.ndarray, ...]:
    """``[n, T]`` oct, odt, alpha, beta and update of each layer on each type (0 where it cannot run),
    and where it can."""
    n, T = len(profile.layers), len(types)
    oct_, odt, alpha, beta, update = (np.zeros((n, T)) for _ in range(5))
    runnable = np.zeros((n, T), dtype=bool)
    for i, layer in enumerate(profile.layers):
        for j, t in enumerate(types):
            if t in layer.times:
                entry = layer.times[t]
                oct_[i, j], odt[i, j] = entry.oct, entry.odt
                update[i, j] = entry.update or 0.0
                alpha[i, j], beta[i, j] = layer.fractions(t)
                runnable[i, j] = True
    return oct_, odt, alpha, beta, update, runnable


def _layers(profile: Profile) -> dict:
    """The problem's per-layer fields that do not depend on the type: names, kinds and sizes."""
    layers = profile.layers
    return {
        "layer_names": tuple(layer.name for layer in layers),
        "layer_kinds": tuple(layer.type for layer in layers),
        "input_size": np.array([layer.input_size for layer in layers], dtype=float),
        "weight_size": np.array([layer.weight_size for layer in layers], dtype=float),
        "activation_size": np.array([layer.activation_size for layer in layers], dtype=float),
        "input_saved": (
            np.array([layer.input_saved for layer in layers], dtype=float)
            if any(layer.input_saved for layer in layers)
            else None
        ),
        "cast_size": (
            np.array([layer.cast_size for layer in layers], dtype=float)
            if any(layer.cast_size for layer in layers)
            else None
        ),
        "sharded": np.array([layer.sharded for layer in layers], dtype=bool),
        "ties": _ties(profile),
    }


def _ties(profile: Profile) -> tuple[Held, ...]:
    """Section 1j: the profile's ties, their holders by index."""
    index = {layer.name: i for i, layer in enumerate(profile.layers)}
    return tuple(
        Held(tie.tensor, tie.kind, float(tie.bytes), tuple(index[name] for name in tie.layers))
        for tie in profile.ties or []
    )


def _nodes(cluster: Cluster, types: tuple[str, ...]) -> Nodes | None:
    """Section 1e: the cluster's node kinds, holding the problem's types (others they hold sit idle);
    kinds that hold none of them are left out."""
    if cluster.nodes is None:
        return None
    kinds = [(name, node) for name, node in cluster.nodes.items() if any(t in node.units for t in types)]
    return Nodes(
        names=tuple(name for name, _ in kinds),
        labels=tuple(node.label or name for name, node in kinds),
        price=np.array([node.price for _, node in kinds], dtype=float),
        units=np.array([[node.units.get(t, 0) for t in types] for _, node in kinds], dtype=np.int64),
        available=np.array([node.available for _, node in kinds], dtype=np.int64),
        link=np.array([[(node.link_gbps or {}).get(t, 0.0) * 1e9 / 8 for t in types] for _, node in kinds]),
        others={
            t: np.array([node.units.get(t, 0) for _, node in kinds], dtype=np.int64)
            for t in cluster.resources
            if t not in types and any(t in node.units for _, node in kinds)
        },
    )


def _check_sizes(problem: Problem, pdoc: Document) -> None:
    """Refuse a size whose bytes per batch overflow a float (the transfer or memory it feeds would be
    infinite and silently drop out of the model), naming the first such layer and field."""
    # the largest size any time was measured at: section 1f may choose it
    B0 = float(max(problem.batch_size, problem.measured.largest if problem.measured is not None else 0))
    for view in problem.views:  # section 1h: each degree's one-unit sizes feed its memory too
        with np.errstate(over="ignore"):
            scaled = {
                "input_size": (2.0 * B0 * view.input_size, "2 x batch_size x input_size"),
                "activation_size": (B0 * view.activation_size, "batch_size x activation_size"),
                "weight_size": (view.state_factor * view.weight_size, "state_factor x weight_size"),
                "cast_size": (float(B0) * view.cast_bytes, "batch_size x cast_size (a copy per micro-batch held)"),
            }
        for field, (values, product) in scaled.items():
            bad = np.flatnonzero(~np.isfinite(values))
            if bad.size:
                at = ("tp", view.degree) if view.degree > 1 else ()
                raise pdoc.error(
                    ("layers", int(bad[0]), *at, field),
                    f"{product} overflows a float (over 1.8e308 bytes): give the real size in bytes",
                )


def _check_fastest(problem: Problem, pdoc: Document) -> None:
    """Refuse times so small that a plan's throughput would be infinite. A layer alone on all the
    units of a type is as fast as any stage holding it can be, so when every layer's best is beyond
    a float, so is some plan's; the error names the layer and type whose time is smallest."""
    serial_c, parallel_c, serial_d, parallel_d = problem.parts
    units = problem.limits.astype(float)[None, :]
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        seconds = np.maximum(serial_c + parallel_c / units, serial_d + parallel_d / units)
        best = np.where(problem.runnable, problem.batch_size / seconds, 0.0).max(axis=1)
    if np.isfinite(best).any():
        return
    layer = 0
    t = int(np.argmin(np.where(problem.runnable[layer], problem.oct[layer], np.inf)))
    raise pdoc.error(
        ("layers", layer, "times", problem.types[t], "oct"),
        f"{problem.oct[layer, t]:.3g} s per batch of {problem.batch_size:,} is so small that the throughput "
        "would be infinite (every layer is): give the measured time",
    )


def _check_finite_figures(
    problem: Problem, pdoc: Document, cdoc: Document, *, samples_given: bool, epochs_given: bool
) -> None:
    """Refuse a job whose training time or cost would overflow a float, before any search.

    No plan is slower than every layer on its slowest type with one replica (each
    stage takes at most the sum of its layers' times), nor dearer per hour than
    every unit of every type, so these bounds hold for every plan.
    """
    _check_sizes(problem, pdoc)
    _check_fastest(problem, pdoc)
    work = problem.work
    per_batch = problem.oct + problem.odt
    slowest = problem.batch_size / max(float(per_batch.max(axis=1).sum()), 1e-300)
    worst_time = work / slowest
    with np.errstate(over="ignore"):
        rate = _most_per_hour(problem)
        worst_cost = run_cost(work, slowest, rate)
    if math.isfinite(work) and math.isfinite(worst_time) and math.isfinite(worst_cost):
        return
    # The cost overflows as a product: blame the factor further from any real figure, the prices
    # (an hour of everything the cluster offers) or the job's hours, and name the other in words.
    hours = worst_time / SECONDS_PER_HOUR  # the job's hours at the slowest plan
    if math.isfinite(worst_time) and (not math.isfinite(rate) or math.log10(max(rate, 1)) > math.log10(max(hours, 1))):
        path = _dearest(problem)
        raise cdoc.error(
            path,
            f"at these prices an hour of the cluster's {'nodes' if problem.nodes is not None else 'units'} costs "
            f"{'more than a float holds' if not math.isfinite(rate) else f'${number(rate)}'}, so the job's cost "
            f"(up to {number(hours)} hours) would overflow a float (over 1.8e308): give a real price",
        )
    figure = "samples" if not math.isfinite(work) else "training time" if not math.isfinite(worst_time) else "cost"
    in_file = not samples_given
    raise InputError(
        pdoc.path if in_file else None,
        pdoc.line(("job", "samples")) if in_file else None,
        f"{'samples' if samples_given else 'job.samples'} x {'epochs' if epochs_given else 'job.epochs'}",
        f"{number(problem.samples)} samples x {number(problem.epochs)} epochs is too large: the job's {figure} would "
        "overflow a float (over 1.8e308); give a real job size",
    )


def _dearest(problem: Problem) -> tuple[str, ...]:
    """The cluster field of the dearest hour: a node kind's price times its count, or a type's."""
    with np.errstate(over="ignore"):
        if problem.nodes is not None:
            k = int(np.argmax(problem.nodes.price * problem.nodes.available))
            return ("nodes", problem.nodes.names[k], "price")
        t = int(np.argmax(problem.prices * problem.limits))
    return ("resources", problem.types[t], "price")


def _most_per_hour(problem: Problem) -> float:
    """USD an hour of every unit the cluster has: each unit's price, or section 1e's every node."""
    if problem.nodes is not None:
        return float(problem.nodes.price @ problem.nodes.available)
    return float(problem.prices @ problem.limits)
