"""Hypothesis strategies for small random instances that brute force can enumerate."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck
from hypothesis import strategies as st

from tests.helpers import random_hardware, random_instance

SETTINGS = dict(deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def instances(draw, layers=((2, 6), (3, 4)), limits=(2, 3, 5), targets=(0.0, 0.2, 0.5, 1.0, 2.0, 4.0)):
    """(arrays, B0, min_throughput): up to ``layers[0][1]`` layers on 2 types or ``layers[1][1]``
    on 3, type limits up to one of ``limits``, and a required throughput of one of ``targets``
    times a reference (between "anything goes" and "beyond reach", so that limits bind sometimes)."""
    T = draw(st.integers(2, 3))
    n = draw(st.integers(1, dict(layers)[T]))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    arrays = random_instance(rng, n, T, max_limit=draw(st.sampled_from(limits)))
    oct_, B0 = arrays[0], 32
    reference = B0 / oct_.min(axis=1).sum()
    min_throughput = draw(st.sampled_from(targets)) * reference
    return arrays, B0, min_throughput


@st.composite
def hardware_instances(draw, **options):
    """As :func:`instances` (with the same options), plus docs/spec.md section 1b's memory and bandwidth fields."""
    arrays, B0, min_throughput = draw(instances(**options))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return arrays, B0, min_throughput, random_hardware(rng, arrays[0], B0, casts=draw(st.booleans()))


@st.composite
def repeated_blocks(draw, limits=(3, 4, 6)):
    """(arrays, B0, min_throughput) for a model of one block of layers repeated, after a distinct
    first layer, as in a transformer: stages over the same layers at different places have the same
    throughput in exact arithmetic, so the cheapest plan at one throughput competes with dearer plans
    that put the other stages elsewhere (their float sums differ in the last bits)."""
    T = draw(st.integers(2, 3))
    block = draw(st.integers(1, 2))
    repeats = draw(st.integers(2, 3 if T == 2 else 2))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    head = random_instance(rng, 1, T, max_limit=draw(st.sampled_from(limits)))
    body = random_instance(rng, block, T)
    # Decimal figures that binary floats hold inexactly, so sums depend on where they start.
    oct_, odt, alpha, beta = (np.concatenate([h, *[b] * repeats]).round(3) for h, b in zip(head[:4], body[:4]))
    oct_ = np.maximum(oct_, 0.001)
    runnable = np.concatenate([head[4], *[body[4]] * repeats])
    prices, limits = head[5], head[6]
    B0 = 32
    reference = B0 / oct_.min(axis=1).sum()
    min_throughput = draw(st.sampled_from((0.0, 0.0, 0.5, 1.0))) * reference
    return (oct_, odt, alpha, beta, runnable, prices, limits), B0, min_throughput
