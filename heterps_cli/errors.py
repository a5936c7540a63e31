"""Errors the CLI turns into exit codes (docs/spec.md section 5), never into tracebacks."""

from __future__ import annotations

from collections.abc import Sequence

EXIT_CHECK_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INFEASIBLE = 3
EXIT_INTERNAL = 4  # a bug in heterps: not a failed check (1), so CI cannot mistake one for the other
EXIT_NOT_FOUND = 5  # a search found no plan and nothing proved that none exists: not 3, which is that proof
EXIT_WORKER_LOST = 6  # heterps run: a worker was killed (a signal, the kernel's OOM killer) or vanished mid-run
EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports SIGINT
EXIT_TERMINATED = 143  # SIGTERM

MAX_SHOWN = 20  # problems listed at once; a file with more gets a count of the rest


class InputError(Exception):
    """Bad input: a file, the line in it, the field path and what is wrong (exit 2).

    ``more`` holds further problems found in the same pass, so that a user fixes a
    file in one round instead of one error per run.
    """

    def __init__(
        self, path: str | None, line: int | None, field: str | None, message: str, more: Sequence[InputError] = ()
    ):
        self.path, self.line, self.field, self.message = path, line, field, message
        self.more = tuple(more)
        super().__init__(path, line, field, message)

    @classmethod
    def joined(cls, errors: Sequence[InputError]) -> InputError:
        """One error that lists every problem in ``errors`` (at least one), in the order given."""
        first, *rest = [p for e in errors for p in e.problems]
        return cls(first.path, first.line, first.field, first.message, rest)

    @property
    def problems(self) -> list[InputError]:
        """This problem and the others found with it, each as a single-problem error."""
        return [InputError(self.path, self.line, self.field, self.message), *self.more]

    def lines(self) -> list[str]:
        """One ``file:line: field: message`` line per problem, at most MAX_SHOWN and a count of the rest."""
        shown = [p.where() + p.message for p in self.problems[:MAX_SHOWN]]
        hidden = len(self.problems) - MAX_SHOWN
        if hidden > 0:
            shown.append(f"… and {hidden} more problem{'s' if hidden > 1 else ''}")
        return shown

    def where(self) -> str:
        where = ""
        if self.path:
            where = f"{self.path}:{self.line}: " if self.line else f"{self.path}: "
        return where + (f"{self.field}: " if self.field else "")

    def __str__(self) -> str:
        return "\n".join(self.lines())


class WorkerLost(Exception):
    """A process of a run ended without a word mid-run (exit 6, not the exit 2 of bad input): killed by a
    signal, or an exit code and no error; the message says how to continue."""


class TooLarge(InputError):
    """A problem larger than a solver may hold in memory (exit 2): no file or line is at fault, so
    it names the solver and says what to use instead."""

    def __init__(self, solver: str, message: str):
        super().__init__(None, None, solver, message)


class InfeasibleError(Exception):
    """No plan meets the constraints (exit 3); the message states the best reachable figure."""


class Unexplained(InfeasibleError):
    """The exact solver proved that no plan meets the job and, asked not to (``SolveOptions.explain``), did
    not search on for why: the caller asks again where it shows the reason."""


class SearchFailed(InfeasibleError):
    """A search (rl, tapp, genetic, greedy, random) found no feasible plan, which does not say
    that none exists: :func:`heterps_cli.schedulers.solve` asks the exact solver why."""

    def __init__(self, failure: str, hint: str):
        super().__init__(f"{failure}: {hint}")
        self.failure, self.hint = failure, hint


class SearchGaveUp(InfeasibleError):
    """A search found no feasible plan, and nothing proved that none exists: a feasible plan exists
    (the message names it), or the exact solver could not tell (too large, out of time). Exit 5."""


class Terminated(SystemExit):
    """SIGTERM, raised where the process was (cli.entry.main): the user's code is never blamed for it."""

    def __init__(self) -> None:
        super().__init__(EXIT_TERMINATED)


# Raised by a signal wherever the process was: code that catches what a user's model or factory
# raises lets these through.
SIGNALLED = (KeyboardInterrupt, Terminated)
