"""Issue 84: where a stage count's grid does not fit the exact solver's tables, it answers the best plan of
the fewer stages it searched, with its gap proven by the relaxation that bounds every plan of more stages,
instead of refusing. Known answer: the optimum of the solver with room for every grid (itself held to
brute force in tests/test_pipeline.py)."""

from __future__ import annotations

import math

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from heterps_cli.errors import InfeasibleError, TooLarge
from heterps_cli.schedulers import exact
from heterps_cli.schedulers.exact import pipeline
from tests.helpers import problem_from_dicts
from tests.strategies import SETTINGS
from tests.test_pipeline import pipelined


@settings(**{**SETTINGS, "max_examples": 60})
@given(st.data())
def test_a_grid_too_large_gives_the_best_of_fewer_stages_and_a_true_gap(data):
    profile, cluster = data.draw(pipelined())
    objective = data.draw(st.sampled_from(["cost", "time"]))
    problem = problem_from_dicts(profile, cluster, objective=objective)
    assume(problem.n_layers >= 2)
    try:
        optimum = exact.solve(problem)
    except InfeasibleError:
        assume(False)
    room = pipeline.MAX_GRID_CELLS
    try:
        pipeline.MAX_GRID_CELLS = pipeline._cells(problem, 1)  # the grid of one stage alone fits
        try:
            plan = exact.solve(problem)
        except (TooLarge, InfeasibleError):
            assert len(optimum.stages) > 1  # no one-stage plan to answer: refused, as before
            return
    finally:
        pipeline.MAX_GRID_CELLS = room
    assert plan.feasible
    if objective == "cost":
        assert plan.cost_usd >= optimum.cost_usd * (1 - 1e-9)  # never better than the optimum
    else:
        assert plan.throughput <= optimum.throughput * (1 + 1e-9)
    if plan.optimal:  # proven all the same: the relaxation showed no plan of more stages is better
        figure = (plan.cost_usd, optimum.cost_usd) if objective == "cost" else (plan.throughput, optimum.throughput)
        assert math.isclose(*figure, rel_tol=1e-9)
        return
    assert plan.gap is not None and any("exact searched every plan of fewer stages" in n for n in plan.notes)
    if objective == "cost":  # the gap is to a bound no higher than the optimum
        assert plan.cost_usd <= optimum.cost_usd * (1 + plan.gap) * (1 + 1e-9)
    else:
        assert plan.throughput >= optimum.throughput * (1 - plan.gap) * (1 - 1e-9)
