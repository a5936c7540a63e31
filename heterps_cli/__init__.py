"""heterps: plan DNN training on heterogeneous, priced resources.

Use from Python (each name is imported when first used, so ``import heterps_cli`` is instant)::

    from heterps_cli import load_problem, solve

    problem = load_problem("profiles/ctr.yaml", "clusters/paper.yaml")
    plan = solve("exact", problem)

:mod:`heterps_cli.api` has one function per command (plan, compare, check, diff, validate, measure).
"""

from __future__ import annotations

import importlib
import time
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# name -> the module that defines it
_EXPORTS = {
    "load_problem": "heterps_cli.problem",
    "build_problem": "heterps_cli.problem",
    "Problem": "heterps_cli.problem",
    "Plan": "heterps_cli.plan",
    "solve": "heterps_cli.schedulers",
    "SolveOptions": "heterps_cli.schedulers",
    "SCHEDULERS": "heterps_cli.schedulers",
    "InputError": "heterps_cli.errors",
    "InfeasibleError": "heterps_cli.errors",
    "Job": "heterps_cli.api",
    "api": "heterps_cli",
}
__all__ = [
    "__version__",
    "main",
    "load_problem",
    "build_problem",
    "Problem",
    "Plan",
    "solve",
    "SolveOptions",
    "SCHEDULERS",
    "InputError",
    "InfeasibleError",
    "Job",
    "api",
]

if TYPE_CHECKING:
    from heterps_cli import api
    from heterps_cli.api import Job
    from heterps_cli.errors import InfeasibleError, InputError
    from heterps_cli.plan import Plan
    from heterps_cli.problem import Problem, build_problem, load_problem
    from heterps_cli.schedulers import SCHEDULERS, SolveOptions, solve


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'heterps_cli' has no attribute {name!r}")
    if name == "api":
        return importlib.import_module("heterps_cli.api")
    return getattr(importlib.import_module(_EXPORTS[name]), name)


def __dir__() -> list[str]:
    return sorted(__all__)


STARTED = time.perf_counter()  # when this process imported heterps: --time-limit's clock on the command line


def main() -> None:
    """The ``heterps`` console script.

    It imports the CLI itself, so that Ctrl-C at any moment (even while the
    libraries load) ends with one line and exit 130, and SIGTERM with exit 143;
    both unwind normally, so no half-written file is left behind.
    """
    import signal
    import sys

    def terminate(signum, frame):
        sys.stderr.write("terminated\n")
        raise SystemExit(143)

    signal.signal(signal.SIGTERM, terminate)
    try:
        from heterps_cli.cli.app import app

        app(prog_name="heterps")
    except KeyboardInterrupt:
        _exit_interrupted(said=False)
    except SystemExit as exc:
        if exc.code != 130:
            raise
        # typer exits 130 without a word when Ctrl-C lands in its own start-up (it imports pydantic
        # then); a command that was interrupted has already said so.
        cli = sys.modules.get("heterps_cli.cli.app")
        _exit_interrupted(said=cli is not None and cli.INTERRUPT_REPORTED["done"])
    except Exception as exc:
        # Ctrl-C inside a class body being created (while a library loads) reaches us wrapped in a
        # RuntimeError; it is still Ctrl-C.
        cause: BaseException | None = exc
        while cause is not None and not isinstance(cause, KeyboardInterrupt):
            cause = cause.__cause__ or cause.__context__
        if cause is None:
            raise
        _exit_interrupted(said=False)


def _exit_interrupted(said: bool) -> None:
    """Say "interrupted" unless a command already did, and exit 130 now. Files and child processes
    were already cleaned up as the interrupt unwound (finally blocks); left to itself, CPython may
    instead kill itself with SIGINT at exit when a KeyboardInterrupt passed through some of its own
    frames, which callers see as -2, not 130."""
    import os
    import sys

    if not said:
        sys.stderr.write("interrupted\n")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(130)
