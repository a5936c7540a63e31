"""Schedulers: each maps a :class:`~heterps_cli.problem.Problem` to a :class:`~heterps_cli.plan.Plan`.

They share one signature, ``solve(problem, *, seed, progress, options) -> Plan``,
so a command can run any of them, or all of them in a loop. A scheduler that
finds no feasible plan raises :class:`~heterps_cli.errors.InfeasibleError`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
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


Solver = Callable[..., "Plan"]

# The registry (names, modules, descriptions) lives in names.py, which imports nothing, so that
# the CLI's --help can list the schedulers without numpy; a module is imported when it runs.
from heterps_cli.schedulers.names import SCHEDULERS  # noqa: E402


def solver(name: str) -> Solver:
    return importlib.import_module(f"heterps_cli.schedulers.{SCHEDULERS[name][0]}").solve


def solve(name: str, problem: Problem, *, seed: int = 0, progress: Progress | None = None,
          options: SolveOptions | None = None) -> Plan:
    return solver(name)(problem, seed=seed, progress=progress, options=options or SolveOptions())
