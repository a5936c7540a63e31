"""Schedulers: each maps a :class:`~heterps_cli.problem.Problem` to a :class:`~heterps_cli.plan.Plan`.

They share one signature, ``solve(problem, *, seed, progress) -> Plan``, so a
command can run any of them, or all of them in a loop.
"""

from __future__ import annotations

from collections.abc import Callable

from heterps_cli.plan import Plan
from heterps_cli.problem import Problem
from heterps_cli.schedulers import exact

Solver = Callable[..., Plan]

SCHEDULERS: dict[str, Solver] = {
    "exact": exact.solve,
}

DESCRIPTIONS: dict[str, str] = {
    "exact": "provably optimal: a DP over stage boundaries per bottleneck throughput, limit-aware",
}


def solve(name: str, problem: Problem, *, seed: int = 0, progress=None) -> Plan:
    return SCHEDULERS[name](problem, seed=seed, progress=progress)
