"""The micro-batch (docs/spec.md section 1f): each layer's times at any batch size from the sizes its
profile measured, and the sizes a plan may choose among.

A batch ``b`` is charged as a share of the smallest measured size ``s >= b`` by that size's Amdahl
terms, ``t(b) = t(s) (1 - alpha + alpha b / s)``: the rule section 1 already applies to a replica that
trains ``b`` of ``s`` samples. Nothing is charged above the largest measured size: that would be an
extrapolation no measurement backs.
"""

from __future__ import annotations

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
        where some measured size is at least ``batch`` (elsewhere the figures are 0). At a measured size
        they are its figures as written; below one, its share (the module's rule), with alpha and beta
        the parts of that time that still shrink with replicas, so a replica's share of ``batch`` costs
        what the same share of the measured size does."""
        shape = self.oct.shape[1:]
        oct_, odt, alpha, beta = (np.zeros(shape) for _ in range(4))
        forward = np.full(shape, np.nan)
        found = np.zeros(shape, dtype=bool)
        for s, size in enumerate(self.sizes):
            if size < batch:
                continue
            here = ~found & ~np.isnan(self.oct[s])
            a, b = np.nan_to_num(self.alpha[s]), np.nan_to_num(self.beta[s])
            if size == batch:
                fc = fd = np.ones(shape)
                sa, sb = a, b
            else:
                r = batch / size
                fc, fd = 1.0 - a + a * r, 1.0 - b + b * r
                sa, sb = a * r / fc, b * r / fd
            oct_ = np.where(here, np.nan_to_num(self.oct[s]) * fc, oct_)
            forward = np.where(here, self.forward[s] * fc, forward)
            odt = np.where(here, np.nan_to_num(self.odt[s]) * fd, odt)
            alpha, beta = np.where(here, sa, alpha), np.where(here, sb, beta)
            found |= here
        return oct_, odt, alpha, beta, forward, found

    def most(self, layer: int) -> int | None:
        """The largest size ``layer`` was measured at on any type (None: at none, as at a degree that
        does not split it)."""
        return max((size for s, size in enumerate(self.sizes) if not np.isnan(self.oct[s, layer]).all()), default=None)

    def covered(self, batch: int) -> np.ndarray:
        """``[n]``: whether each layer has a type measured at ``batch`` or above."""
        above = [s for s, size in enumerate(self.sizes) if size >= batch]
        return (~np.isnan(self.oct[above]).all(axis=0)).any(axis=1) if above else np.zeros(self.oct.shape[1], bool)

    def choices(self, global_batch: int) -> tuple[int, ...]:
        return choices([self], global_batch)


def choices(tables: list[Measured], global_batch: int) -> tuple[int, ...]:
    """The micro-batches a plan chooses among: the sizes measured at any tensor-parallel degree (one
    table each, section 1h) that divide ``global_batch`` into at most :data:`MAX_MICRO_BATCHES` and at
    which every layer has a type at some degree (measured there or above)."""
    out = []
    for size in sorted({size for table in tables for size in table.sizes}):
        if global_batch % size or global_batch // size > MAX_MICRO_BATCHES:
            continue
        if np.any([table.covered(size) for table in tables], axis=0).all():
            out.append(size)
    return tuple(out)


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
