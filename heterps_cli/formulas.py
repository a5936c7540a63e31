"""The model's formulas that every other module uses and none writes out again (docs/spec.md
section 1): money, in one home. Each works on numbers and numpy arrays alike, and keeps its order
of operations, so that every figure is the same to the last bit wherever it is computed."""

from __future__ import annotations

SECONDS_PER_HOUR = 3600.0


def run_cost(work, throughput, rate):
    """USD of ``work`` samples at ``throughput`` samples/s on units that cost ``rate`` USD an hour:
    ``W / X / 3600 · rate`` (docs/spec.md section 1's COST)."""
    return work / throughput / SECONDS_PER_HOUR * rate


def sample_hours(work):
    """``W / 3600``: what a price per sample/s (USD an hour over samples/s) is multiplied by to give the
    run's USD, for the bounds that sum such prices over stages before dividing by a throughput."""
    return work / SECONDS_PER_HOUR
