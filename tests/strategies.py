"""Hypothesis strategies for small random instances that brute force can enumerate."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck
from hypothesis import strategies as st

from tests.helpers import random_hardware, random_instance

SETTINGS = dict(deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def instances(draw, layers=((2, 8), (3, 6)), limits=(2, 3, 5), targets=(0.0, 0.2, 0.5, 1.0, 2.0, 4.0)):
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
    """As :func:`instances` (with the same options), plus SPEC section 1b's memory and bandwidth fields."""
    arrays, B0, min_throughput = draw(instances(**options))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return arrays, B0, min_throughput, random_hardware(rng, arrays[0], B0)
