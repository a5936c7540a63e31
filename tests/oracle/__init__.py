"""Independent reference implementations for the tests, written from docs/spec.md section 1 only.

Nothing here imports the package's cost model or solvers: figures are recomputed
layer by layer exactly as docs/spec.md words them, and optima come from enumeration.
:mod:`.paper` holds sections 1 and 1b, :mod:`.pipeline` sections 1d to 1i; the tests import
what they use from here.
"""

from tests.oracle.paper import (
    _better,
    _section_1b,
    brute_force,
    feasible_plans,
    optimum_by_bottleneck,
    pareto,
    partitions_of,
    share,
    spec_figures,
    stages_of,
)
from tests.oracle.pipeline import (
    _cuts_and_replicas,
    _cuts_replicas_degrees,
    assert_figures_are_the_oracles,
    assert_is_the_frontier,
    assert_is_the_optimum,
    cheapest_rental,
    pipeline_figures,
    pipeline_optimum,
    pipeline_optimum_on_nodes,
    rentals,
)

__all__ = [
    "_better",
    "_section_1b",
    "brute_force",
    "feasible_plans",
    "optimum_by_bottleneck",
    "pareto",
    "partitions_of",
    "share",
    "spec_figures",
    "stages_of",
    "_cuts_and_replicas",
    "_cuts_replicas_degrees",
    "assert_figures_are_the_oracles",
    "assert_is_the_frontier",
    "assert_is_the_optimum",
    "cheapest_rental",
    "pipeline_figures",
    "pipeline_optimum",
    "pipeline_optimum_on_nodes",
    "rentals",
]
