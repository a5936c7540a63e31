"""What every scheduler shares: the signature it is called with and the options it reads.

No imports of numpy or torch here, so that the registry and the CLI can load it cheaply.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from heterps_cli.progress import Progress, quiet

__all__ = [
    "OPTIONS",
    "Budget",
    "Clock",
    "Progress",
    "RLOptions",
    "SearchOptions",
    "SolveOptions",
    "Solver",
    "TrainingOptions",
    "options_for",
    "quiet",
]

if TYPE_CHECKING:
    from heterps_cli.plan import Plan
    from heterps_cli.problem import Problem


@dataclass(frozen=True)
class SolveOptions:
    """What every scheduler reads: its time limit. Each scheduler's own options extend it
    (:data:`OPTIONS`); given another scheduler's, it reads these and ignores the rest."""

    time_limit: float | None = None  # seconds of searching at most
    # When the time limit's clock started (time.perf_counter()); None: when the scheduler starts.
    # The command line starts it with the process, so that loading the files counts too.
    started: float | None = None
    # section 1i: replicas of other types may join a stage; None: where mixing.offered says (the command line's
    # default; --mixed-stages / --no-mixed-stages say True / False)
    mixed_stages: bool | None = False
    # The time limit is the guard of a search without --time-limit (schedulers.guard_time_limit): the
    # whole search's, not shared out over the micro-batches, as a limit the user sets is.
    guard: bool = False
    # The --time-limit the user gave, where ``time_limit`` is a share of it (one micro-batch's): what notes name
    whole_limit: float | None = None
    # exact: where no plan meets the job, say why (the fastest figure reachable, what binds), which may search
    # as long again; False raises Unexplained (the micro-batch choice asks again only where no size has a plan)
    explain: bool = True


@dataclass(frozen=True)
class SearchOptions(SolveOptions):
    """genetic and random: how many cost-model evaluations to spend."""

    evaluations: int | None = None  # None: the default budget


@dataclass(frozen=True)
class ExactOptions(SolveOptions):
    """exact: with objective time (no budget), only a plan at least ``at_least`` samples/s
    fast is wanted, InfeasibleError when there is none (section 1f's choice of micro-batch prunes
    the choices that cannot beat the best plan found at another)."""

    at_least: float = 0.0


@dataclass(frozen=True)
class TrainingOptions(SolveOptions):
    """tapp, and rl: how long the policy trains."""

    steps: int | None = None  # training steps (None: the scheduler's default)
    batch: int | None = None  # schedules sampled per step
    # The objective key (cost, or minus throughput) of the optimum the exact solver proved: a training
    # of the default budget stops once its plan meets it (None: it trains its steps)
    stop_at: float | None = None


@dataclass(frozen=True)
class RLOptions(TrainingOptions):
    """rl: also a saved policy to start from, and where to save the trained one."""

    policy_in: Path | None = None
    policy_out: Path | None = None


# Each scheduler's options: what its flags may set.
OPTIONS: dict[str, type[SolveOptions]] = {
    "rl": RLOptions,
    "tapp": TrainingOptions,
    "genetic": SearchOptions,
    "greedy": SolveOptions,
    "random": SearchOptions,
    "exact": ExactOptions,
}
FLAGS = {"steps": "--steps", "batch": "--batch", "evaluations": "--evaluations"}
FLAGS |= {"policy_in": "--policy-in", "policy_out": "--policy-out"}


def options_for(name: str, strict: bool = False, **given) -> SolveOptions:
    """Scheduler ``name``'s own options from ``given`` values (None: not given). A value its options
    have no field for is dropped, or with ``strict`` refused (exit 2, naming the flag)."""
    kind = OPTIONS[name]
    fields = {f.name for f in dataclasses.fields(kind)}
    foreign = [key for key, value in given.items() if value is not None and key not in fields]
    if strict and foreign:
        from heterps_cli.errors import InputError

        users = [n for n, k in OPTIONS.items() if foreign[0] in {f.name for f in dataclasses.fields(k)}]
        flag = FLAGS.get(foreign[0], foreign[0])
        raise InputError(None, None, flag, f"{flag} applies to {' and '.join(users)}, not to {name}")
    return kind(**{key: value for key, value in given.items() if key in fields})


@dataclass(frozen=True)
class Clock:
    """A search's time limit: ``limit`` seconds (``--time-limit``; None: none) from ``started``
    (``time.perf_counter()``)."""

    started: float
    limit: float | None = None
    whole: float | None = None  # the --time-limit the user gave, where ``limit`` is a share of it

    @classmethod
    def of(cls, options: SolveOptions | None, start: float) -> Clock:
        """The clock of a scheduler's options: from ``options.started`` when the caller started it
        (the command line does, at start-up), else from ``start``, when the scheduler started."""
        if options is None:
            return cls(start)
        return cls(start if options.started is None else options.started, options.time_limit, options.whole_limit)

    @property
    def named(self) -> float:
        """The limit a note names: the user's --time-limit, not a micro-batch's share of it (0: none)."""
        return self.whole if self.whole is not None else self.limit or 0.0

    def options(self) -> SolveOptions:
        """Options for a search run under this clock (its notes name the user's limit, not the share)."""
        return SolveOptions(time_limit=self.limit, started=self.started, whole_limit=self.whole)

    def paced(self, now: Callable[[], float] = time.perf_counter) -> Callable[[], bool]:
        """``out_of_time`` for a loop of steps of a size: also true once the time left is less than the
        longest gap between two of its calls so far (from now on), so that the next step, if as long
        as the longest before it, does not end past the limit. The exact solver's steps range from
        milliseconds to the seconds a stage table takes to build; asking only whether the limit has
        passed let a 20 s limit end at 23 s (docs/exact.md, "Time limit")."""
        last, longest = now(), 0.0

        def out_of_time() -> bool:
            nonlocal last, longest
            at = now()
            last, longest = at, max(longest, at - last)
            left = None if self.limit is None else self.limit - (at - self.started)
            return left is not None and longest > left

        return out_of_time

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


@dataclass(frozen=True)
class Budget:
    """The budget one run gives every scheduler it runs (``heterps compare``): each takes what its own
    options have (:func:`options_for`)."""

    time_limit: float | None = None
    steps: int | None = None
    batch: int | None = None
    evaluations: int | None = None
    mixed_stages: bool | None = None  # section 1i, for every scheduler alike

    def of(self, name: str) -> SolveOptions:
        return options_for(name, **dataclasses.asdict(self))
