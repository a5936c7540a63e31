"""Whole nodes (docs/spec.md section 1e): what a plan's units cost when they come in machines rented whole.

A node kind holds a fixed number of units of one or more types and is paid for by the hour
whether its units are used or not. A plan needs ``u[t]`` units of each type and runs on a
*rental* (a count per kind, within what is available) that holds them all; where a kind gives
links, the rental also decides which types talk over a node's links (:meth:`Nodes.links`).
Finding the cheapest rental that holds ``u`` is a small integer programme; :attr:`Nodes.menu`
solves all of them at once by listing every rental that no other beats on price, units of
every type and first nodes. The cheapest rental that covers ``u`` is always on that menu, and
so is one as good as the exact solver's optimum rents (:mod:`heterps_cli.schedulers.exact.rented`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from heterps_cli.errors import TooLarge

# Bounds on the menu: rentals considered at once while it is built, and rentals on it (the exact
# solver asks each of these one DP question at most). Past them a cluster is refused (exit 2):
# real clusters list a few node kinds of a few dozen nodes (4 kinds of 2 to 13: 714 rentals).
MAX_CANDIDATES = 100_000
MAX_MENU = 10_000


@dataclass(frozen=True)
class Menu:
    """Rentals no other beats, cheapest first: ``counts[P, K]``, ``capacity[P, T]``, ``rate[P]``,
    ``links[P, T]`` (:meth:`Nodes.links` without a plan), ``room[P, T]`` (:meth:`Nodes.room`) and
    ``inside[P]`` (:meth:`Nodes.inside`)."""

    counts: np.ndarray
    capacity: np.ndarray
    rate: np.ndarray
    links: np.ndarray
    room: np.ndarray
    inside: np.ndarray


@dataclass(frozen=True, eq=False)
class Nodes:
    names: tuple[str, ...]
    labels: tuple[str, ...]
    price: np.ndarray  # [K] USD per node-hour
    units: np.ndarray  # [K, T] units of each of the problem's types one node holds (int)
    available: np.ndarray  # [K] nodes of each kind that may be rented (int)
    link: np.ndarray | None = None  # [K, T] bytes/s of one unit's link inside a node; 0: none given
    # Units of the types no layer runs on, per kind ([K] each): a rental holds them idle all the same.
    others: dict[str, np.ndarray] | None = None

    def first(self, counts: np.ndarray) -> np.ndarray:
        """``[T]``: per type, the kind of the first node of a rental of ``counts[K]`` nodes that holds
        it, in the file's order of kinds (-1: none does). Replicas are placed on the rental's nodes in
        that order (:func:`place`), so a type's units fill that node first."""
        holding = (np.asarray(counts)[:, None] > 0) & (self.units > 0)  # [K, T]
        return np.where(holding.any(axis=0), np.argmax(holding, axis=0), -1)

    def room(self, counts: np.ndarray) -> np.ndarray:
        """``[T]``: the units of each type on the first node of the rental that holds it (0: none)."""
        f = self.first(counts)
        return np.where(f >= 0, self.units[np.maximum(f, 0), np.arange(len(f))], 0)

    def links(self, counts: np.ndarray, used: np.ndarray | None = None) -> np.ndarray:
        """``[T]`` bytes/s: per type, the link of the first node of a rental of ``counts[K]`` nodes that
        holds it, where a plan's ``used[T]`` units of the type all fit on that node (placed there
        first); else 0 (the network). Without ``used``: the link any plan on the rental could have."""
        T = self.units.shape[1]
        if self.link is None:
            return np.zeros(T)
        f = self.first(counts)
        link = np.where(f >= 0, self.link[np.maximum(f, 0), np.arange(T)], 0.0)
        if used is not None:
            link = np.where(np.asarray(used) <= self.room(counts), link, 0.0)
        return link

    def inside(self, counts: np.ndarray) -> int:
        """The kind of a rental of ``counts[K]`` nodes when it is one node with links, whose stages
        then also move activations over them; else -1."""
        counts = np.asarray(counts)
        if self.link is None or counts.sum() != 1:
            return -1
        k = int(np.argmax(counts))
        return k if (self.link[k] > 0).any() else -1

    @cached_property
    def linked(self) -> tuple[int, ...]:
        """The kinds whose one node, rented alone, moves activations and gradients over its links."""
        one = np.eye(len(self.names), dtype=np.int64)
        return tuple(k for k in range(len(self.names)) if self.inside(one[k]) >= 0)

    @property
    def capacity(self) -> np.ndarray:
        """``[T]``: units of each type when every available node is rented (the types' limits)."""
        return self.available @ self.units

    @cached_property
    def unit_prices(self) -> np.ndarray:
        """``[T]``: per type, the cheapest price per unit of a node rented for that type alone
        (node price / its units of the type). What a search that prices units one by one uses
        (:mod:`heterps_cli.schedulers.exact.rented`); a plan's cost is always its rental's."""
        with np.errstate(divide="ignore"):
            per = np.where(self.units > 0, self.price[:, None] / np.maximum(self.units, 1), np.inf)
        return per.min(axis=0)

    @cached_property
    def menu(self) -> Menu:
        """Every rental that no other one beats: built kind by kind, dropping a partial rental as soon
        as another is no dearer, holds at least as many units of every type and places them on the
        same first nodes whatever nodes are added to both (:meth:`_sides`; any completion of it is
        then beaten by the same completion of the other)."""
        K, T = self.units.shape
        counts = np.zeros((1, 0), dtype=np.int64)
        capacity = np.zeros((1, T), dtype=np.int64)
        rate = np.zeros(1)
        for k in range(K):
            c = np.arange(int(self.available[k]) + 1, dtype=np.int64)
            if len(rate) * len(c) > MAX_CANDIDATES:
                raise _too_many(f"more than {MAX_CANDIDATES:,} ways to compare")
            counts = np.concatenate([np.repeat(counts, len(c), axis=0), np.tile(c, len(rate))[:, None]], axis=1)
            capacity = np.repeat(capacity, len(c), axis=0) + np.tile(c, len(rate))[:, None] * self.units[k][None, :]
            rate = np.repeat(rate, len(c)) + np.tile(c, len(rate)) * self.price[k]
            alike = _groups(self._sides(counts))
            keep = np.sort(np.concatenate([rows[_unbeaten(capacity[rows], rate[rows])] for rows in alike]))
            if len(keep) > MAX_MENU:
                raise _too_many(f"more than {MAX_MENU:,} ways that no other rental beats on price and units")
            counts, capacity, rate = counts[keep], capacity[keep], rate[keep]
        order = np.lexsort((counts.sum(axis=1), rate))  # cheapest first; then fewest nodes
        counts = counts[order]
        links = np.array([self.links(c) for c in counts]).reshape(len(counts), T)
        room = np.array([self.room(c) for c in counts], dtype=np.int64).reshape(len(counts), T)
        inside = np.array([self.inside(c) for c in counts], dtype=np.int64)
        return Menu(counts, capacity[order], rate[order], links, room, inside)

    def _sides(self, counts: np.ndarray) -> np.ndarray:
        """``[P, ...]``: what decides the links of partial rentals ``counts[P, k]`` (the first ``k``
        kinds, in the file's order) and of any completion of them (nodes of later kinds): per type
        some kind links, the kind of its first node (nodes added later come after it), and whether
        the rental is no node, one node (of which kind) or several. Two rentals alike in these
        place a plan's units on the same first nodes, over the same links, with any nodes added."""
        P, k = counts.shape
        if self.link is None or not (self.link > 0).any():
            return np.zeros((P, 1), dtype=np.int64)
        linked = (self.link > 0).any(axis=0)
        holding = (counts[:, :, None] > 0) & (self.units[:k, linked] > 0)[None, :, :]  # [P, k, T']
        first = np.where(holding.any(axis=1), 1 + np.argmax(holding, axis=1), 0)
        n = counts.sum(axis=1)
        nodes = np.where(n == 0, 0, np.where(n == 1, 1 + np.argmax(counts, axis=1), k + 1))
        return np.concatenate([first, nodes[:, None]], axis=1)

    def cover(self, used: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For each row of ``used[B, T]``, the cheapest rental holding it: its rate (inf: none does)
        and its row of :attr:`menu` (-1: none)."""
        menu = self.menu
        used = np.atleast_2d(used)
        rate = np.full(len(used), np.inf)
        choice = np.full(len(used), -1)
        block = max(1, 4_000_000 // max(1, len(menu.rate) * used.shape[1]))
        for lo in range(0, len(used), block):
            holds = (menu.capacity[None, :, :] >= used[lo : lo + block, None, :] - 1e-9).all(axis=2)
            first = np.argmax(holds, axis=1)  # the menu is cheapest first
            found = np.take_along_axis(holds, first[:, None], axis=1)[:, 0]
            rate[lo : lo + block] = np.where(found, menu.rate[first], np.inf)
            choice[lo : lo + block] = np.where(found, first, -1)
        return rate, choice

    def counts(self, rental: dict[str, int]) -> np.ndarray:
        """``[K]``: the nodes of each kind a rental (as :meth:`rental` gives it) holds."""
        return np.array([rental.get(name, 0) for name in self.names], dtype=np.int64)

    def held(self, rental: dict[str, int]) -> np.ndarray:
        """``[T]``: the units of each type a rental holds."""
        return self.counts(rental) @ self.units

    def others_held(self, counts: np.ndarray) -> dict[str, int]:
        """The units of each type no layer runs on that ``counts[K]`` nodes hold (a rental's, all idle;
        or :attr:`available`, all the cluster has)."""
        return {t: int(counts @ per_kind) for t, per_kind in (self.others or {}).items()}

    def rental(self, used: np.ndarray) -> dict[str, int]:
        """The cheapest rental holding ``used[T]``: nodes of each kind (kinds rented 0 times left out)."""
        _, choice = self.cover(np.asarray(used, dtype=float)[None, :])
        if choice[0] < 0:
            return {}
        return {n: int(c) for n, c in zip(self.names, self.menu.counts[choice[0]]) if c}


def _groups(keys: np.ndarray) -> list[np.ndarray]:
    """The indices of each distinct row of ``keys``."""
    _, group = np.unique(keys, axis=0, return_inverse=True)
    order = np.argsort(group.ravel(), kind="stable")
    return np.split(order, np.flatnonzero(np.diff(group.ravel()[order])) + 1)


def _too_many(what: str) -> TooLarge:
    return TooLarge("cluster's nodes", f"its node kinds can be rented in {what}; lower the nodes' available counts")


BLOCK = 512  # candidates checked against the kept rentals at once


def _unbeaten(capacity: np.ndarray, rate: np.ndarray) -> np.ndarray:
    """Indices of the rows that no other row beats: none cheaper or as cheap with at least the same
    units of every type (of equal rows, the first). Cheapest first, a block at a time: a row is
    beaten only by an earlier one, kept or in its own block."""
    order = np.lexsort((-capacity.sum(axis=1), rate))
    kept: list[np.ndarray] = []
    kept_cap = np.empty((0, capacity.shape[1]), dtype=capacity.dtype)
    for lo in range(0, len(order), BLOCK):
        rows = order[lo : lo + BLOCK]
        cap = capacity[rows]
        beaten = np.any(np.all(kept_cap[None, :, :] >= cap[:, None, :], axis=2), axis=1)
        inside = (cap[None, :, :] >= cap[:, None, :]).all(axis=2)  # [i, j]: row j holds at least row i's
        inside &= np.tri(len(rows), k=-1, dtype=bool)  # ... and comes before it
        for i in np.flatnonzero(~beaten):
            if inside[i, :i][~beaten[:i]].any():
                beaten[i] = True
        kept.append(rows[~beaten])
        kept_cap = np.concatenate([kept_cap, cap[~beaten]])
    return np.concatenate(kept) if kept else np.zeros(0, dtype=np.int64)


def node_names(rental: dict[str, int]) -> list[tuple[str, str]]:
    """``(node, kind)`` for every node of a rental, named ``KIND#i`` from 1, in the rental's order."""
    return [(f"{kind}#{i}", kind) for kind, n in rental.items() for i in range(1, n + 1)]


def place(nodes: Nodes, types: tuple[str, ...], rental: dict[str, int], stages) -> list[dict[str, int]]:
    """Which nodes each stage's replicas run on (replicas per node): ``stages`` is ``(type index, replicas,
    units per replica)`` in order. Replicas of more units are placed first (section 1h), then stage by
    stage, each replica on the first node with room for all its units, so a stage fills a node before it
    starts the next (its all-reduce then crosses as few nodes as the rental lets it). Every node kind
    holds a multiple of each width of its types, so any replicas whose units the rental holds fit."""
    kind_of = {name: k for k, name in enumerate(nodes.names)}
    ordered = {kind: rental[kind] for kind in nodes.names if rental.get(kind)}  # the file's order of kinds
    free = {node: nodes.units[kind_of[kind]].copy() for node, kind in node_names(ordered)}
    placed: list[dict[str, int]] = [{} for _ in stages]
    for s in sorted(range(len(stages)), key=lambda s: -(stages[s][2] if len(stages[s]) > 2 else 1)):
        t, replicas, width = (*stages[s], 1)[:3]
        here = placed[s]
        left = int(replicas)
        for node, units in free.items():
            take = min(left, int(units[t]) // width)
            if take:
                here[node], units[t], left = take, units[t] - take * width, left - take
            if not left:
                break
        assert not left, f"the rental holds too few {types[t]} units for the plan"
    return placed
