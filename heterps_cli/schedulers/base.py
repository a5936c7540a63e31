"""What every scheduler shares: the signature it is called with and the options it reads.

No imports of numpy or torch here, so that the registry and the CLI can load it cheaply.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from heterps_cli.progress import Progress, quiet

__all__ = ["Clock", "Progress", "SolveOptions", "Solver", "quiet"]

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


@dataclass(frozen=True)
class Clock:
    """A search's time limit: ``limit`` seconds (``--time-limit``; None: none) from ``started``
    (``time.perf_counter()``)."""

    started: float
    limit: float | None = None

    @classmethod
    def of(cls, options: SolveOptions | None, start: float) -> Clock:
        """The clock of a scheduler's options: from ``options.started`` when the caller started it
        (the command line does, at start-up), else from ``start``, when the scheduler started."""
        if options is None:
            return cls(start)
        return cls(start if options.started is None else options.started, options.time_limit)

    def left(self) -> float | None:
        """Seconds left (None: no limit)."""
        return None if self.limit is None else self.limit - (time.perf_counter() - self.started)

    def out_of_time(self, ahead: float = 0.0) -> bool:
        """Whether the limit has passed, or will have in ``ahead`` seconds (a step that long would end
        past it)."""
        left = self.left()
        return left is not None and ahead > left


class Solver(Protocol):
    """A scheduler's ``solve``: the best plan it finds for the problem.

    Raises :class:`~heterps_cli.errors.InfeasibleError` when it finds none
    (a search raises :class:`~heterps_cli.errors.SearchFailed`, which the
    registry's :func:`~heterps_cli.schedulers.solve` explains).
    """

    def __call__(
        self, problem: Problem, *, seed: int = 0, progress: Progress | None = None, options: SolveOptions | None = None
    ) -> Plan: ...
