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
    "Task": "heterps_cli.runtime.task",
    "one_layer_each": "heterps_cli.runtime.stacked",
    "api": "heterps_cli",
    "main": "heterps_cli.cli.entry",
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
    "Task",
    "one_layer_each",
    "api",
]

if TYPE_CHECKING:
    from heterps_cli import api
    from heterps_cli.api import Job
    from heterps_cli.cli.entry import main
    from heterps_cli.errors import InfeasibleError, InputError
    from heterps_cli.plan import Plan
    from heterps_cli.problem import Problem, build_problem, load_problem
    from heterps_cli.runtime.stacked import one_layer_each
    from heterps_cli.runtime.task import Task
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
