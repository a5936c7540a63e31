"""What every scheduler shares: the signature it is called with and the options it reads.

No imports of numpy or torch here, so that the registry and the CLI can load it cheaply.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from heterps_cli.progress import Progress, quiet

__all__ = ["Progress", "SolveOptions", "Solver", "quiet", "time_left"]

if TYPE_CHECKING:
    from heterps_cli.plan import Plan
    from heterps_cli.problem import Problem


@dataclass(frozen=True)
class SolveOptions:
    """Budget and learning options; schedulers ignore what does not apply to them."""

    steps: int | None = None  # training steps (None: the scheduler's default)
    batch: int | None = None  # schedules sampled per step
    time_limit: float | None = None  # seconds of searching at most
    # When the time limit's clock started (time.perf_counter()); None: when the scheduler starts.
    # The command line starts it with the process, so that loading the files counts too.
    started: float | None = None
    policy_in: Path | None = None  # warm-start from this saved policy
    policy_out: Path | None = None  # save the trained policy here
    evaluations: int | None = None  # genetic, random: cost-model evaluations (None: the default budget)


def time_left(limit: float | None, start: float, started: float | None = None) -> float | None:
    """Seconds left of ``limit`` (None: no limit) on a clock that started at ``started``
    (``SolveOptions.started``), or else at ``start`` (when the scheduler started)."""
    if limit is None:
        return None
    return limit - (time.perf_counter() - (start if started is None else started))


class Solver(Protocol):
    """A scheduler's ``solve``: the best plan it finds for the problem.

    Raises :class:`~heterps_cli.errors.InfeasibleError` when it finds none
    (a search raises :class:`~heterps_cli.errors.SearchFailed`, which the
    registry's :func:`~heterps_cli.schedulers.solve` explains).
    """

    def __call__(
        self, problem: Problem, *, seed: int = 0, progress: Progress | None = None, options: SolveOptions | None = None
    ) -> Plan: ...
