"""The micro-batch (docs/spec.md section 1f): each layer's times at any batch size from the sizes its
profile measured, and the sizes a plan may choose among.

A batch ``b`` is charged as a share of the smallest measured size ``s >= b`` by that size's Amdahl
terms, ``t(b) = t(s) (1 - alpha + alpha b / s)``: the rule section 1 already applies to a replica that
trains ``b`` of ``s`` samples. A micro-batch above the largest measured size ``L`` is charged by the same
rule from ``L``, and every stage then takes at least ``ceil(b / L)`` replicas, so that what each one
trains is a share of a measured size: no replica's time is an extrapolation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from heterps_cli.formats import MAX_MICRO_BATCHES, Profile


@dataclass(frozen=True, eq=False)
class Measured:
    """Each layer's measured times on each type at every size of its profile (NaN where not measured)."""

    sizes: tuple[int, ...]  # ascending
    oct: np.ndarray  # [S, n, T] seconds per batch of sizes[s] on one unit
    odt: np.ndarray
    alpha: np.ndarray
    beta: np.ndarray
    forward: np.ndarray  # section 1g: the forward pass's part of oct (NaN where not given)

    @property
    def largest(self) -> int:
        return self.sizes[-1]

    def at(self, batch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``[n, T]`` oct, odt, alpha, beta and forward (NaN where not given) at ``batch`` samples, and
        where the layer has a time on the type (elsewhere the figures are 0). At a measured size they are
        its figures as written; below one, its share (the module's rule), with alpha and beta the parts of
        that time that still shrink with replicas, so a replica's share of ``batch`` costs what the same
        share of the measured size does. Above the largest size measured on a type, the same rule from
        that size: exact for every replica whose share is at most it (:meth:`largest_each` caps them)."""
        shape = self.oct.shape[1:]
        oct_, odt, alpha, beta = (np.zeros(shape) for _ in range(4))
        forward = np.full(shape, np.nan)
        found = np.zeros(shape, dtype=bool)
        top = self.largest_each()
        for s, size in enumerate(self.sizes):
            here = ~found & ~np.isnan(self.oct[s]) & ((size >= batch) | (top == size))
            if not here.any():
                continue
            a, b = np.nan_to_num(self.alpha[s]), np.nan_to_num(self.beta[s])
            r = batch / size
            fc, fd = 1.0 - a + a * r, 1.0 - b + b * r  # both 1 at a measured size
            sa, sb = a * r / fc, b * r / fd
            oct_ = np.where(here, np.nan_to_num(self.oct[s]) * fc, oct_)
            forward = np.where(here, self.forward[s] * fc, forward)
            odt = np.where(here, np.nan_to_num(self.odt[s]) * fd, odt)
            alpha, beta = np.where(here, sa, alpha), np.where(here, sb, beta)
            found |= here
        return oct_, odt, alpha, beta, forward, found

    def largest_each(self) -> np.ndarray:
        """``[n, T]``: the largest size each layer was measured at on each type (0: none): the most
        samples a replica of it may train there (section 1f)."""
        measured = ~np.isnan(self.oct)
        sizes = np.asarray(self.sizes, dtype=float)[:, None, None]
        return np.where(measured, sizes, 0.0).max(axis=0)

    def covered(self) -> np.ndarray:
        """``[n]``: whether each layer has a time on some type, at some size."""
        return (~np.isnan(self.oct).all(axis=0)).any(axis=1)


def choices(tables: list[Measured], global_batch: int, units: float = np.inf) -> tuple[int, ...]:
    """The micro-batches a plan chooses among (section 1f): the sizes measured at any tensor-parallel
    degree (one table each, section 1h), and multiples of the largest of them (:func:`multipliers`; a
    multiple ``m`` only where ``m`` replicas fit in ``units``, the cluster's, since each stage needs
    that many), that divide ``global_batch`` into at most :data:`MAX_MICRO_BATCHES`."""
    if not np.any([table.covered() for table in tables], axis=0).all():
        return ()
    largest = max(table.largest for table in tables)
    sizes = {size for table in tables for size in table.sizes}
    if global_batch % largest == 0:
        sizes |= {largest * m for m in multipliers(global_batch // largest, units)}
    return tuple(s for s in sorted(sizes) if global_batch % s == 0 and global_batch // s <= MAX_MICRO_BATCHES)


def multipliers(n: int, units: float) -> set[int]:
    """The ``m`` of the multiples ``m L`` a plan may choose (section 1f): of the divisors of ``n`` from 2
    to ``units``, the largest in each power-of-two band ``[2^j, 2^(j+1))``, so that the choices, and the
    problems solved, grow with the logarithm of the cluster, not with the divisors of the batch."""
    bands: dict[int, int] = {}
    for m in _divisors(n):
        if 2 <= m <= units:
            band = m.bit_length()
            bands[band] = max(bands.get(band, 0), m)
    return set(bands.values())


def _divisors(n: int) -> set[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return {*small, *(n // d for d in small)}


def measured(profile: Profile, types: tuple[str, ...]) -> Measured:
    """The profile's times at each of its sizes on ``types``."""
    sizes = profile.sizes
    shape = (len(sizes), len(profile.layers), len(types))
    oct_, odt, alpha, beta, forward = (np.full(shape, np.nan) for _ in range(5))
    for i, layer in enumerate(profile.layers):
        for j, t in enumerate(types):
            if t not in layer.times:
                continue
            for s, size in enumerate(sizes):
                if (at := layer.times[t].at(size, profile.batch_size)) is not None:
                    oct_[s, i, j], odt[s, i, j] = at.oct, at.odt
                    forward[s, i, j] = np.nan if at.forward is None else at.forward
                    alpha[s, i, j], beta[s, i, j] = layer.fractions(t, at)
    return Measured(sizes, oct_, odt, alpha, beta, forward)
