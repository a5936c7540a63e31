"""Tied tensors as a plan charges them (docs/spec.md section 1j): the copies a stage holds beyond its layers'
weights, and what keeping copies in several stages one moves per step. A profile's ``ties`` name them
(:mod:`heterps_cli.profiling.ties` finds them in a model)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Held:
    """A tie as a plan reads it (a profile's ``ties`` entry): the tensor, its kind and bytes, and the
    indices of the layers that hold it, ascending."""

    tensor: str
    kind: str
    bytes: float
    layers: tuple[int, ...]


def _held(tie: Held, first: np.ndarray, last: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Whether stage ``first..last`` holds a holder of ``tie``, and whether it holds all of them."""
    inside = [(first <= h) & (h <= last) for h in tie.layers]
    return np.logical_or.reduce(inside), np.logical_and.reduce(inside)


def copy_bytes(ties: Sequence[Held], first, last) -> np.ndarray:
    """Section 1j: the bytes of tied parameters stage ``first..last`` holds beyond its layers'
    ``weight_size``: a copy of each tie it holds a holder of but not the first (which counts it)."""
    first, last = np.broadcast_arrays(np.asarray(first), np.asarray(last))
    out = np.zeros(first.shape)
    for tie in ties:
        if tie.kind == "parameter":
            some, _ = _held(tie, first, last)
            out = out + np.where(some & (first > tie.layers[0]), tie.bytes, 0.0)
    return out


def split_terms(ties: Sequence[Held], first, last) -> tuple[np.ndarray, np.ndarray]:
    """Section 1j: of the ties whose holders sit in several stages, what stage ``first..last`` moves per
    step to keep its copies one (each tied parameter's gradient all-reduced among every holder's
    processes, ``2 x bytes``; each tied buffer broadcast from its first holder's stage, ``bytes``), and
    how many such collectives it joins."""
    first, last = np.broadcast_arrays(np.asarray(first), np.asarray(last))
    moved, count = np.zeros(first.shape), np.zeros(first.shape)
    for tie in ties:
        some, every = _held(tie, first, last)
        crossing = some & ~every
        moved = moved + np.where(crossing, (2.0 if tie.kind == "parameter" else 1.0) * tie.bytes, 0.0)
        count = count + crossing
    return moved, count
