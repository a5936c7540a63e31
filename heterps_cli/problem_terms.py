# mypy: disable-error-code="misc"
# (each method's self is a Problem, this module's subclass: mypy allows only a supertype there, yet
# checks each body against Problem's fields)
"""What a :class:`~heterps_cli.problem.Problem` derives from its own fields, by the spec's section:
its views at each tensor-parallel degree (section 1h), the memory a stage holds (sections 1b, 1g),
what crosses a stage's boundary (sections 1b, 1d, 1h), and the questions a rental of whole nodes
asks (section 1e). Problem inherits each class; they hold no state of their own."""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from heterps_cli.formulas import SLACK
from heterps_cli.objective import Objective
from heterps_cli.ties import copy_bytes, split_terms

if TYPE_CHECKING:
    from heterps_cli.problem import Problem


@dataclass(frozen=True, eq=False)
class Fixed:
    """Section 1k: what the user or an engine fixes of a plan's shape (heterps_cli/shape.py); None: free.
    Every stage's replicas (one data-parallel degree), the tensor-parallel degrees a stage may take,
    whether every stage recomputes or none does, the number of stages, each stage's type (-1: any), and
    ``[n, T]`` where each layer may run (kept at every micro-batch)."""

    replicas: int | None = None
    degrees: tuple[int, ...] | None = None
    recompute: bool | None = None
    stages: int | None = None
    stage_types: tuple[int, ...] | None = None
    layer_allowed: np.ndarray | None = None


class DegreeViews:
    """Section 1h: the problem at each tensor-parallel degree a stage may take."""

    @property
    def degrees(self: Problem) -> tuple[int, ...]:
        """Section 1h: the tensor-parallel degrees a stage may take, 1 first."""
        return (1, *sorted(self.tensor)) if self.tensor else (1,)

    @property
    def views(self: Problem) -> tuple[Problem, ...]:
        """Section 1h: the problem at each of :attr:`degrees` (itself first)."""
        return (self, *(self.tensor[d] for d in sorted(self.tensor))) if self.tensor else (self,)

    @property
    def stage_ways(self: Problem) -> tuple[tuple[int, bool], ...]:
        """Each way a stage may run: the index of its tensor-parallel degree (section 1h), and whether it
        recomputes its activations (section 1g) where that degree can."""
        degrees, rule = self.fixed.degrees, self.fixed.recompute
        return tuple(
            (j, again)
            for j, view in enumerate(self.views)
            if degrees is None or self.degrees[j] in degrees  # section 1k: the degrees a shape allows
            for again in (False, True)[: 1 + view.can_recompute]
            if rule is None or again is rule
        )

    def view_at(self: Problem, degree: int) -> Problem:
        """Section 1h: the problem at tensor-parallel degree ``degree`` (one of :attr:`degrees`)."""
        return self.views[self.degrees.index(degree)]

    @property
    def widths(self: Problem) -> np.ndarray:
        """``[D]``: the units a replica holds at each of :attr:`degrees`."""
        return np.array(self.degrees, dtype=np.int64)

    def each_degree(self: Problem, changes: Callable[[Problem], dict]) -> Problem:
        """Section 1h: this problem with ``changes(view)`` made to itself and to each degree's view."""
        out = dataclasses.replace(self, **changes(self))
        if self.tensor:
            out = dataclasses.replace(
                out, tensor={d: dataclasses.replace(p, **changes(p)) for d, p in self.tensor.items()}
            )
        return out


class MemoryTerms:
    """Sections 1b and 1g: per layer, the bytes a stage holds, and what recomputing its activations
    costs."""

    @cached_property
    def recomputable(self: Problem) -> np.ndarray:
        """``[n, T]``: the layer may be recomputed on the type (runnable, with a forward time)."""
        if self.forward is None:
            return np.zeros_like(self.runnable)
        return self.runnable & ~np.isnan(self.forward)

    @cached_property
    def recompute_parts(self: Problem) -> tuple[np.ndarray, np.ndarray]:
        """Section 1g: the serial and parallel compute of each layer and type when its stage recomputes:
        ``oct + forward`` split by alpha as oct is (0 where it cannot)."""
        extra = np.where(self.recomputable, np.nan_to_num(self.forward) if self.forward is not None else 0.0, 0.0)
        total = self.oct + extra
        return total * (1.0 - self.alpha), total * self.alpha

    @property
    def reserved_bytes(self: Problem) -> np.ndarray:
        return self.reserved if self.reserved is not None else np.zeros(self.n_types)

    @cached_property
    def fits_alone(self: Problem) -> np.ndarray:
        """``[n, T]``: runnable, and the layer alone fits a replica's memory with at most the type's
        limit of replicas (section 1b; memory per replica only falls as replicas grow)."""
        if not np.isfinite(self.memory).any():
            return self.runnable
        fixed, split = self.memory_parts
        with np.errstate(invalid="ignore"):
            fits = self.reserved_bytes[None, :] + fixed[:, None] + split[:, None] / self.limits[None, :] <= self.memory[
                None, :
            ] * (1 + SLACK)
        return self.runnable & fits

    @cached_property
    def usable(self: Problem) -> np.ndarray:
        """The types searches choose among: :attr:`fits_alone` at some tensor-parallel degree (section 1h:
        a layer timed at this micro-batch only at tp 2 runs on its type there), except that a layer no
        type can hold keeps its runnable types (exact then says why)."""
        fits = np.asarray(np.any([view.fits_alone for view in self.views], axis=0))
        runnable = np.asarray(np.any([view.runnable for view in self.views], axis=0))
        held = np.asarray(fits.any(axis=1))
        return np.asarray(np.where(held[:, None], fits, runnable))

    @cached_property
    def memory_parts(self: Problem) -> tuple[np.ndarray, np.ndarray]:
        """Per layer, bytes every replica holds whatever ``k`` (unsharded training state and one batch's
        weight copies) and bytes split across ``k`` replicas (sharded state and one batch of
        activations): section 1b's
        ``MEM(k) = fixed + split / k`` summed over a stage. Under section 1d a stage holds the
        activations of up to ``M`` micro-batches at once: :attr:`state_parts` and
        :attr:`activation_bytes` are the two halves of ``split``."""
        fixed, sharded = self.state_parts
        with np.errstate(over="ignore"):
            return fixed + self.cast_bytes, sharded + self.activation_bytes

    @cached_property
    def state_parts(self: Problem) -> tuple[np.ndarray, np.ndarray]:
        """Per layer, training-state bytes every replica holds, and those split across the replicas."""
        with np.errstate(over="ignore"):  # inf when absurd sizes overflow: no memory holds that
            state = self.state_factor * self.weight_size
        return np.where(self.sharded, 0.0, state), np.where(self.sharded, state, 0.0)

    def tie_state(self: Problem, first, last) -> np.ndarray:
        """Section 1j: the training-state bytes stage ``first..last`` holds, every replica, for copies of
        tied parameters its layers' ``weight_size`` leaves out (zeros without ties)."""
        with np.errstate(over="ignore"):
            return self.state_factor * copy_bytes(self.ties, first, last)

    @cached_property
    def cast_bytes(self: Problem) -> np.ndarray:
        """Per layer, the bytes a (micro-)batch keeps for its backward pass whatever its samples
        (autocast's half-precision weight copies): every replica holds them for each micro-batch it
        holds, and they are not split across the replicas."""
        return self.cast_size if self.cast_size is not None else np.zeros(self.n_layers)

    @cached_property
    def activation_bytes(self: Problem) -> np.ndarray:
        """Per layer, the bytes one (micro-)batch keeps for its backward pass, split across the replicas."""
        with np.errstate(over="ignore"):
            return self.batch_size * self.activation_size

    @cached_property
    def stage_inputs(self: Problem) -> np.ndarray:
        """Section 1g: per layer, the bytes of one (micro-)batch that a stage starting there takes in
        (its input, which a recomputing stage keeps for every micro-batch in flight)."""
        with np.errstate(over="ignore"):
            return self.batch_size * self.input_size

    @cached_property
    def shared_bytes(self: Problem) -> np.ndarray:
        """Per layer, the part of :attr:`activation_bytes` the layer before it also holds: a stage holds
        it once, so a stage ``a..b`` holds its layers' activation bytes less ``shared_bytes[a+1..b]``."""
        if self.input_saved is None:
            return np.zeros(self.n_layers)
        with np.errstate(over="ignore"):
            return self.batch_size * self.input_saved

    @cached_property
    def held_once(self: Problem) -> np.ndarray:
        """Per layer, :attr:`activation_bytes` less :attr:`shared_bytes`: what a stage holds for the layer
        when the layer before is in it too; a span of these plus :attr:`shared_entry` at its first layer
        is what the stage holds."""
        with np.errstate(over="ignore", invalid="ignore"):
            return self.activation_bytes - self.shared_bytes

    @cached_property
    def shared_entry(self: Problem) -> np.ndarray:
        """``[n + 1]``: :attr:`shared_bytes`, 0 past the last layer, to add back for a stage's first
        layer (its own copy of what it saves of its input) where a span sums :attr:`held_once`."""
        return np.append(self.shared_bytes, 0.0)


class TransferTerms:
    """Sections 1b, 1d and 1h: what crosses the boundary before each layer, how fast, and each type's
    fixed costs per micro-batch, all-reduce and message."""

    @property
    def fixed_costs(self: Problem) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Section 1d: ``[T]`` each type's pass start (per micro-batch), all-reduce latency and transfer
        latency (per message across a boundary: :attr:`boundary_messages`)."""
        zeros = np.zeros(self.n_types)
        return (
            self.pass_start if self.pass_start is not None else zeros,
            self.all_reduce_latency if self.all_reduce_latency is not None else zeros,
            self.transfer_latency if self.transfer_latency is not None else zeros,
        )

    def tie_seconds(self: Problem, first, last, stype) -> np.ndarray:
        """Section 1j: the seconds per step stage ``first..last`` on type ``stype`` spends keeping the tied
        tensors it shares with other stages one: their bytes (:func:`~heterps_cli.ties.split_terms`) over
        the type's link, and under a pipeline schedule an all-reduce latency each. 0 without ties, and
        for bytes where the type gives no bandwidth (as activations across a boundary)."""
        moved, count = split_terms(self.ties, first, last)
        free = ~np.isfinite(self.bandwidth)
        with np.errstate(divide="ignore"):
            rate = np.where(free, 0.0, 1.0 / self.bandwidth)
        latency = self.fixed_costs[1] if self.pipelined else np.zeros(self.n_types)  # section 1d's only
        with np.errstate(over="ignore", invalid="ignore"):
            return moved * rate[stype] + count * latency[stype]

    @cached_property
    def boundary_messages(self: Problem) -> np.ndarray:
        """``[n + 1]`` messages per micro-batch across the boundary before layer ``i`` (the activations
        one way, their gradient back): 2, and 0 before the first layer and after the last (section 1d)."""
        out = np.zeros(self.n_layers + 1)
        out[1:-1] = 2.0
        return out

    @cached_property
    def boundary_rate(self: Problem) -> np.ndarray:
        """``[T]`` seconds a replica at this view's degree ``d`` takes per byte of :attr:`boundary_bytes`
        (sections 1b, 1h): its ``d`` units each move ``1/d`` of them over their own links (all of them
        over one where the node shares its link), then gather inside the node what each received: of
        the bytes one way, ``(d - 1) / d`` per unit. 0 where the type gives no bandwidth."""
        free = ~np.isfinite(self.bandwidth)
        with np.errstate(divide="ignore"):
            send = np.where(free, 0.0, 1.0 / self.bandwidth)
        d = self.degree
        if d == 1:
            return send
        shared = self.shared_link if self.shared_link is not None else np.zeros(self.n_types, dtype=bool)
        link = self.gather_link if self.gather_link is not None else self.bandwidth
        with np.errstate(divide="ignore"):
            gather = np.where(free, 0.0, (d - 1) / (2 * d) / link)
        return np.where(shared, send, send / d) + gather

    @cached_property
    def boundary_bytes(self: Problem) -> np.ndarray:
        """``[n + 1]`` bytes per batch that cross the boundary before layer ``i`` (activations one
        way, their gradients back): ``2 * B0 * input_size[i]``; 0 before the first layer (the data
        loader feeds it) and after the last (section 1b)."""
        out = np.zeros(self.n_layers + 1)
        out[1:-1] = 2.0 * self.batch_size * self.input_size[1:]
        return out


class RentalQuestions:
    """Section 1e: the problem on a rental of whole nodes, whose units talk over the nodes' links."""

    def over_links(self: Problem, counts: np.ndarray, used: np.ndarray) -> Problem:
        """Section 1e: the problem on a rental of ``counts[K]`` nodes for a plan of ``used[T]`` units,
        whose units talk over a node's links where they are faster than the network. A type whose
        units all fit the first node of the rental holding it (:meth:`Nodes.links`) runs an
        unsharded layer's gradient all-reduce in ``weight_size / link`` (how a profile derives
        ``odt``, over that node's link); on a rental of one node, a stage also moves its boundary
        activations at its type's link."""
        assert self.nodes is not None
        return self._over(self.nodes.links(counts, used), self.nodes.inside(counts) >= 0)

    def _over(self: Problem, link: np.ndarray, one_node: bool) -> Problem:
        if not (link > 0).any():
            return self
        with np.errstate(divide="ignore", invalid="ignore"):
            over_link = np.where(link[None, :] > 0, self.weight_size[:, None] / link[None, :], np.inf)
        over_link = np.where(self.sharded[:, None], np.inf, over_link)
        odt = np.where(self.runnable, np.minimum(self.odt, over_link), self.odt)
        out = self.replace(odt=odt, bandwidth=np.maximum(self.bandwidth, link) if one_node else self.bandwidth)
        if self.tensor:  # section 1h: each degree's all-reduce moves one unit's share of the weights
            out = dataclasses.replace(out, tensor={d: p._over(link, one_node) for d, p in self.tensor.items()})
        return out

    def on_rental(self: Problem, counts: np.ndarray) -> list[Problem]:
        """Section 1e: the questions a rental of ``counts[K]`` nodes asks, whose fastest answer is its
        fastest plan. Every unit of it is paid for, so the fastest plan is the cheapest: objective
        time, priced per unit only to choose between equally fast ones (a plan is priced by its
        rental afterwards). A type whose first node links it but holds fewer of its units than the
        rental asks two: its units within that node, over the link, or up to all of them, over the
        network."""
        nodes = self.nodes
        assert nodes is not None
        counts = np.asarray(counts, dtype=np.int64)
        capacity = counts @ nodes.units
        link, room = nodes.links(counts), nodes.room(counts)
        split = np.flatnonzero((link > 0) & (room < capacity))
        questions = []
        for over in itertools.product((True, False), repeat=len(split)):
            here, limits = link.copy(), capacity.copy()
            for t, inside in zip(split, over):
                here[t], limits[t] = (link[t], room[t]) if inside else (0.0, capacity[t])
            held = (limits > 0)[None, :]
            question = self._over(here, nodes.inside(counts) >= 0).replace(
                nodes=None, limits=limits, objective=Objective.TIME, max_cost=None
            )
            questions.append(question.each_degree(functools.partial(_runnable_within, held)))
        return questions


def _runnable_within(held: np.ndarray, view: Problem) -> dict:
    """A view's runnable types, less those a rental holds none of."""
    return {"runnable": view.runnable & held}
