"""Schedulers: each maps a :class:`~heterps_cli.problem.Problem` to a :class:`~heterps_cli.plan.Plan`.

They share one signature, ``solve(problem, *, seed, progress, options) -> Plan``,
so a command can run any of them, or all of them in a loop. A scheduler that
finds no feasible plan raises :class:`~heterps_cli.errors.InfeasibleError`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from heterps_cli.plan import Plan
from heterps_cli.problem import Problem


class Progress(Protocol):
    def __call__(self, description: str, completed: float | None = None, total: float | None = None) -> None: ...


@dataclass(frozen=True)
class SolveOptions:
    """Budget and learning options; schedulers ignore what does not apply to them."""

    steps: int | None = None  # training steps (None: the scheduler's default)
    batch: int | None = None  # schedules sampled per step
    time_limit: float | None = None  # seconds of training at most
    policy_in: Path | None = None  # warm-start from this saved policy
    policy_out: Path | None = None  # save the trained policy here
    evaluations: int | None = None  # genetic, random: cost-model evaluations (None: the default budget)


Solver = Callable[..., Plan]

# Imported here, after SolveOptions, so that schedulers may import it from this package.
from heterps_cli.schedulers import exact, genetic, greedy, random_search, rl, tapp  # noqa: E402

SCHEDULERS: dict[str, tuple[Solver, str]] = {
    "rl": (rl.solve, "the HeterPS method, an LSTM policy trained by REINFORCE that picks each layer's type "
                     "(replicas exact, then a local search polishes)"),
    "tapp": (tapp.solve, "the TAPP method, a partition network that groups contiguous layers and an attention "
                         "network that puts each group on a type, trained jointly by policy gradient "
                         "(objective time by default; replicas exact, then the local search polishes)"),
    "genetic": (genetic.solve, "a genetic algorithm over schedules (tournament selection, two-point crossover, "
                               "flip/shift mutation, elitism) for --evaluations cost-model evaluations"),
    "greedy": (greedy.solve, greedy.RULE),
    "random": (random_search.solve, "the best of --evaluations random valid schedules"),
    "exact": (exact.solve, "the provable optimum (a DP over stage boundaries per bottleneck throughput, "
                           "limit-aware)"),
}


def solve(name: str, problem: Problem, *, seed: int = 0, progress: Progress | None = None,
          options: SolveOptions | None = None) -> Plan:
    return SCHEDULERS[name][0](problem, seed=seed, progress=progress, options=options or SolveOptions())
