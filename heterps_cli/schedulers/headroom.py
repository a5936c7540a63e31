"""Which types a layer may still take, given the layers before it, so that the plan can fit the limits.

A policy that picks one type per layer does not see the units it is using up:
on a tight instance (``chain64x4-tight``) every one of its samples broke a limit
for all 120 training steps, and it learned only from how far they missed. This
module follows a batch of schedules as they are decoded, layer by layer, and
masks a type when even the fewest replicas the schedule could end up with
would exceed a limit (as pointer networks for routing mask a customer whose
demand the vehicle can no longer carry).

The test is sound: it never masks a type that some completion of the prefix
could use in a feasible plan. Each count is a lower bound. A closed stage needs
at least the replicas that reach the throughput floor and fit memory. An open
stage, which may still grow, needs at least those of the layers it has so far
without its closing boundary's transfer, since every term only grows as layers
join. So the set of feasible schedules is unchanged; the policy just stops
spending samples on prefixes that cannot finish within the limits. Where every
type is masked (no completion can fit), the layer gets all its usable types
back and the schedule is scored, infeasible, as before.
"""

from __future__ import annotations

import numpy as np

from heterps_cli.costmodel import throughput_floor
from heterps_cli.problem import Problem

# Lower bounds are rounded down by this relative margin so that float rounding never masks a type
# that the cost model's exact count (replica_counts.min_replicas) would accept.
MARGIN = 1e-9


def _fraction(serial, parallel, budget) -> np.ndarray:
    """The real k with ``serial + parallel / k = budget``, a little low: ``parallel / (budget - serial)``;
    inf when no k reaches the budget (call under ``np.errstate``: the division meets gaps <= 0)."""
    gap = budget * (1 + MARGIN) - serial
    return np.where(gap > 0, parallel / gap, np.where((parallel > 0) | (gap < 0), np.inf, 0.0))


def _replicas(fraction: np.ndarray) -> np.ndarray:
    """The integer lower bound from :meth:`Headroom._need`'s real one."""
    return np.maximum(np.ceil(fraction * (1 - MARGIN)), 1.0)


class Headroom:
    """The units a batch of partly decoded schedules must use, and the types each may take next."""

    def __init__(self, problem: Problem, batch: int):
        self.problem = problem
        self.seen = np.zeros((batch, problem.n_layers, problem.n_types), dtype=bool)  # every mask given
        self.limits = problem.limits.astype(float)
        floor = throughput_floor(problem)
        self.tau = problem.batch_size / floor if floor > 0 else np.inf  # seconds per batch a stage may take
        self.parts = np.stack(problem.parts, axis=2)  # [n, T, 4]: sc, pc, sd, pd
        self.fixed, self.split = problem.memory_parts
        types = np.arange(problem.n_types)
        self.memory_bound = bool(np.isfinite(problem.memory).any())
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            self.transfer = problem.boundary_bytes[:, None] * problem.boundary_rate[None, :]  # [n + 1, T]
            # A stage of layer i alone on type t, with the boundary it starts at.
            alone = self.parts.copy()
            alone[:, :, 3] += self.transfer[:-1]
            self.alone = _replicas(self._need(alone, self.fixed[:, None], self.split[:, None], types))
        self.rows = np.arange(batch)
        self.used = np.zeros((batch, problem.n_types))  # units of the closed stages
        self.current = np.full(batch, -1)  # the open stage's type (-1 before the first layer)
        self.open = np.zeros((batch, 4))  # the open stage's parts, with its first boundary's transfer
        self.memory = np.zeros((batch, 2))  # the open stage's fixed and split bytes
        self.closing: tuple | None = None  # (layer, *_ends(layer)) from the last allowed()

    def _need(self, parts, fixed, split, types) -> np.ndarray:
        """The real replicas a stage with these summed parts needs on ``types``: the most of what its
        compute, its communication (serial and parallel halves interleaved in ``parts``) and its memory
        each need."""
        need = _fraction(parts[..., ::2], parts[..., 1::2], self.tau).max(axis=-1)
        if self.memory_bound:
            need = np.maximum(need, _fraction(fixed, split, self.problem.memory[types]))
        return need

    def _ends(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """The open stage's lower bounds ``[B]`` on its replicas if it ends before ``layer`` (its last
        boundary's transfer added), and if it takes ``layer`` instead."""
        if self.closing is not None and self.closing[0] == layer:
            return self.closing[1], self.closing[2]
        cur = self.current
        ends = np.stack([self.open, self.open + self.parts[layer, cur]])  # [2, B, 4]
        ends[0, :, 3] += self.transfer[layer, cur]
        here = np.array([[0.0, 0.0], [self.fixed[layer], self.split[layer]]])[:, None, :]
        memory = self.memory[None] + here
        closed, grown = _replicas(self._need(ends, memory[..., 0], memory[..., 1], cur))  # [2, B]
        self.closing = (layer, closed, grown)
        return self.closing[1], self.closing[2]

    def allowed(self, layer: int) -> np.ndarray:
        """``[B, T]``: the types layer ``layer`` may take (its usable types, less those no completion fits)."""
        usable = self.problem.usable[layer]
        if layer == 0:
            ok = usable & (self.alone[0] <= self.limits)
            self.seen[:, 0] = ok if ok.any() else usable
            return self.seen[:, 0]
        cur, rows = self.current, self.rows
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            closed, grown = self._ends(layer)
            room = self.limits[cur] - self.used[rows, cur]
            ok = (self.used + self.alone[layer][None, :] <= self.limits) & (closed <= room)[:, None]
            ok[rows, cur] = grown <= room
            ok &= usable[None, :]
        self.seen[:, layer] = np.where(ok.any(axis=1)[:, None], ok, usable[None, :])
        return self.seen[:, layer]

    def take(self, layer: int, actions: np.ndarray) -> None:
        """Record layer ``layer``'s types ``[B]``."""
        cur, rows = self.current, self.rows
        stay = actions == cur
        if layer > 0:
            moved = ~stay
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                self.used[rows[moved], cur[moved]] += self._ends(layer)[0][moved]
        start = self.parts[layer, actions].copy()
        start[:, 3] += self.transfer[layer, actions]
        self.open = np.where(stay[:, None], self.open + self.parts[layer, actions], start)
        here = np.array([self.fixed[layer], self.split[layer]])
        self.memory = np.where(stay[:, None], self.memory + here[None, :], here[None, :])
        self.current = actions.copy()


def masks(problem: Problem, schedules: np.ndarray) -> np.ndarray:
    """``[B, n, T]``: the types :class:`Headroom` allows at each layer of given schedules, with each
    schedule's own type always allowed (an imitation target may be a schedule the mask would not
    have let the policy sample; its log-probability must stay finite)."""
    schedules = np.atleast_2d(schedules)
    B, n = schedules.shape
    room = Headroom(problem, B)
    for layer in range(n):
        room.allowed(layer)
        room.take(layer, schedules[:, layer])
    out = room.seen
    out[np.arange(B)[:, None], np.arange(n)[None, :], schedules] = True
    return out
