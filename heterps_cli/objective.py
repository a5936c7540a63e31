"""The two objectives a plan is optimised for (docs/spec.md section 1): which plan is better, how far
one is from the best, and how each is said. The command line's --objective takes them too."""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING

from heterps_cli.figures import count, usd

if TYPE_CHECKING:
    import numpy as np


class Objective(StrEnum):
    COST = "cost"  # the cheapest plan that meets min_throughput
    TIME = "time"  # the fastest plan within the limits (and max_cost)

    def figure(self, cost, throughput):
        """The figure this objective is about: the cost, or the throughput (numbers or arrays)."""
        return throughput if self is Objective.TIME else cost

    def key(self, cost, throughput):
        """What this objective minimises: the cost, or minus the throughput (numbers or arrays)."""
        return -throughput if self is Objective.TIME else cost

    def key_of(self, plan) -> float:
        """:meth:`key` of a plan (anything with ``cost_usd`` and ``throughput``)."""
        return self.key(plan.cost_usd, plan.throughput)

    def gap(self, figure: float, best: float) -> float:
        """How much worse ``figure`` is than ``best`` (both :meth:`figure`s): the relative extra cost,
        or the relative lost throughput; 0 against a best of 0."""
        if best <= 0:
            return 0.0
        return 1 - figure / best if self is Objective.TIME else figure / best - 1

    def ranked(self, cost: np.ndarray, throughput: np.ndarray) -> np.ndarray:
        """Indices from the best plan to the worst: by this objective, ties to the faster (cost) or the
        cheaper (time)."""
        import numpy as np  # the command line reads this module without numpy

        return np.lexsort((cost, -throughput)) if self is Objective.TIME else np.lexsort((-throughput, cost))

    def shown(self, cost: float, throughput: float) -> str:
        """The plan's figure as people read it: ``$1.99`` or ``1,234.5 samples/s``."""
        return f"{count(throughput, 1)} samples/s" if self is Objective.TIME else usd(cost)


def meets(key: float, target: float | None) -> bool:
    """Whether a plan of objective key ``key`` (:meth:`Objective.key`) meets a proven optimum's ``target``
    key, within the model's SLACK (None: there is none to meet)."""
    from heterps_cli.formulas import SLACK  # numpy, which the command line loads only where it plans

    return target is not None and key <= target + SLACK * abs(target)
