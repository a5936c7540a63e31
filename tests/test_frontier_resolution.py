"""`heterps frontier --resolution R` (docs/spec.md section 1c): for every plan enumeration finds, a listed plan
at most R slower and R dearer; every listed plan a real one, none matched by another; exact where the walk is."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from heterps_cli.cli.app import app
from heterps_cli.errors import InfeasibleError
from heterps_cli.frontier import pareto_frontier
from tests.helpers import ROOT, instance_dicts, problem_from_dicts
from tests.oracle import feasible_plans, spec_figures
from tests.strategies import SETTINGS, hardware_instances, instances

CTR, PAPER = str(ROOT / "profiles/ctr.yaml"), str(ROOT / "clusters/paper.yaml")
RICH = dict(layers=((2, 5), (3, 4)), limits=(4, 6, 8), targets=(0.0, 0.0, 0.2, 0.5, 1.0, 2.0))
RESOLUTIONS = st.sampled_from([0.01, 0.05, 0.2, 0.5])


def _within_resolution(arrays, B0, min_throughput, resolution, budget_scale=None, hardware=None):
    profile, cluster = instance_dicts(*arrays, B0=B0, samples=1e6, min_throughput=min_throughput, hardware=hardware)
    problem = problem_from_dicts(profile, cluster)
    cost, thr = feasible_plans(*arrays, B0, problem.work, min_throughput=min_throughput, hardware=hardware)
    if budget_scale is not None and len(cost):
        problem = problem.replace(max_cost=float(cost.min()) * budget_scale)
    try:
        frontier = pareto_frontier(problem, resolution=resolution)
    except InfeasibleError:
        affordable = cost <= problem.max_cost * (1 + 1e-12) if problem.max_cost is not None else cost >= 0
        assert not affordable.any(), f"enumeration finds {int(affordable.sum())} plans, heterps none"
        return
    assert frontier.resolution == resolution and frontier.to_dict()["resolution"] == resolution
    xs = np.array([plan.throughput for plan in frontier.plans])
    cs = np.array([plan.cost_usd for plan in frontier.plans])
    # Every enumerated plan (within the budget less the resolution) is matched: a point no more than R slower
    # and no more than R dearer.
    covered = cost <= problem.max_cost / (1 + resolution) if problem.max_cost is not None else cost >= 0
    for c, x in zip(cost[covered], thr[covered]):
        fast_enough = xs * (1 + resolution) >= x * (1 - 1e-9)
        cheap_enough = cs <= c * (1 + resolution) * (1 + 1e-9) + 1e-12
        assert (fast_enough & cheap_enough).any(), f"no point within {resolution} of ({x}, {c}): {list(zip(xs, cs))}"
    assert (np.diff(xs) > 0).all() and (np.diff(cs) > 0).all(), "a point is matched by a faster, no dearer one"
    for plan in frontier.plans:  # every point a real plan, recomputed from docs/spec.md
        figures = spec_figures(profile, cluster, plan.to_dict())
        assert math.isclose(figures["cost_usd"], plan.cost_usd, rel_tol=1e-9, abs_tol=1e-12)
        assert figures["memory_fits"] and plan.feasible and not plan.optimal
        assert all(figures["resources"][t] <= cluster["resources"][t]["limit"] for t in figures["resources"])
        if problem.max_cost is not None:
            assert plan.cost_usd <= problem.max_cost * (1 + 1e-9)


@settings(max_examples=25, **SETTINGS)
@given(instances(**RICH), RESOLUTIONS)
def test_every_plan_is_matched_within_the_resolution(inst, resolution):
    _within_resolution(*inst, resolution)


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
@settings(max_examples=150, **SETTINGS)
@given(hardware_instances(**RICH), RESOLUTIONS, st.sampled_from([None, 1.5, 3.0]))
def test_every_plan_is_matched_within_the_resolution_with_memory_transfer_and_a_budget(inst, resolution, budget):
    arrays, B0, min_throughput, hardware = inst
    _within_resolution(arrays, B0, min_throughput, resolution, budget, hardware)


def _frontier(runner, *args, expect=0):
    result = runner.invoke(app, ["frontier", *args, "--json"])
    assert result.exit_code == expect, result.output
    return json.loads(result.stdout) if expect == 0 else result.output


def test_the_command_lists_fewer_steps_and_says_its_resolution(runner):
    exact = _frontier(runner, CTR, PAPER)
    coarse = _frontier(runner, CTR, PAPER, "--resolution", "0.1")
    assert exact["resolution"] == 0 and coarse["resolution"] == 0.1
    assert coarse["steps"] < exact["steps"]
    assert all(not p["optimal"] and "resolution of 10%" in p["notes"][-1] for p in coarse["plans"])
    for p in exact["plans"]:  # the exact frontier, itself brute force's elsewhere, is matched point by point
        assert any(
            q["throughput"] * 1.1 >= p["throughput"] * (1 - 1e-9) and q["cost_usd"] <= p["cost_usd"] * 1.1 * (1 + 1e-9)
            for q in coarse["plans"]
        )
    table = runner.invoke(app, ["frontier", CTR, PAPER, "--resolution", "0.1"])
    assert table.exit_code == 0 and "at a resolution of 10%: every plan is matched" in " ".join(table.output.split())


@pytest.mark.parametrize("value", ["1", "-0.1", "nan", "inf", "x"])
def test_a_resolution_outside_0_to_1_is_exit_2_naming_the_option(runner, value):
    result = runner.invoke(app, ["frontier", CTR, PAPER, "--resolution", value])
    assert result.exit_code == 2 and "--resolution" in result.output


def test_on_whole_nodes_the_walk_over_rentals_stays_exact(runner):
    nodes = str(ROOT / "clusters/aws-p3-nodes.yaml")
    exact = _frontier(runner, CTR, nodes)
    coarse = _frontier(runner, CTR, nodes, "--resolution", "0.2")
    assert coarse["resolution"] == 0 and all(p["optimal"] for p in coarse["plans"])
    assert [p["cost_usd"] for p in coarse["plans"]] == [p["cost_usd"] for p in exact["plans"]]
