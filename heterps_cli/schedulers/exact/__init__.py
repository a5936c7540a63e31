"""The exact optimum over all schedules and replica counts (``--scheduler exact``, docs/exact.md), in
layers that each import only those below them:

- :mod:`.kernel`: the stage table and the one DP over layers and stages (docs/exact.md section 3),
  with the units of limited types in its state where the limits bind;
- :mod:`.grid`: every stage's fewest replicas reaching a bottleneck throughput;
- :mod:`.step`: the cheapest plan at one throughput within every limit (:class:`~.step.StepSolver`);
- :mod:`.walks`: the outer loop over throughputs for each objective, with the time limit's gap;
- :mod:`.pipeline`: the same over stage counts under a pipeline schedule (docs/spec.md section 1d);
- :mod:`.rented`: the same over the rentals of whole nodes (section 1e);
- :mod:`.reach`: why no plan meets a job; :mod:`.scheduler`: the scheduler itself.

The package's names (:func:`~.scheduler.solve`, :func:`~.scheduler.what_if`, ...) load the solver
when first used, so that importing a submodule never runs the others."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from heterps_cli.schedulers.exact.scheduler import diagnose, infeasible_error, serial_cap, solve, what_if

__all__ = ["diagnose", "infeasible_error", "serial_cap", "solve", "what_if"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from heterps_cli.schedulers.exact import scheduler

        return getattr(scheduler, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
