"""--time-limit: exact returns its best plan with a proven gap instead of running on."""

from __future__ import annotations

import json

import pytest
import yaml

from heterps_cli.cli.app import app
from heterps_cli.problem import load_problem
from tests.helpers import ROOT

INSTANCES = ROOT / "benchmarks" / "instances"
PROFILE, CLUSTER = str(INSTANCES / "chain64x3.profile.yaml"), str(INSTANCES / "chain64x3.cluster.yaml")


def _plan(runner, *args):
    result = runner.invoke(app, ["plan", PROFILE, CLUSTER, "--scheduler", "exact", "--json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.parametrize("objective", ["cost", "time"])
def test_exact_cut_short_returns_a_feasible_plan_with_a_gap_that_holds(runner, objective):
    optimum = _plan(runner, "--objective", objective)
    assert optimum["optimal"] is True and "gap" not in optimum
    cut = _plan(runner, "--objective", objective, "--time-limit", "1e-9")
    assert cut["feasible"] is True and cut["optimal"] is False and cut["gap"] > 0
    assert "--time-limit" in cut["notes"][-1] and "within" in cut["notes"][-1]
    if objective == "cost":  # the proven lower bound is at most the optimum, the plan at least
        assert cut["cost_usd"] >= optimum["cost_usd"] * (1 - 1e-12)
        assert cut["cost_usd"] / (1 + cut["gap"]) <= optimum["cost_usd"] * (1 + 1e-9)
    else:  # the proven upper bound is at least the optimum's throughput
        assert cut["throughput"] <= optimum["throughput"] * (1 + 1e-12)
        assert cut["throughput"] / (1 - cut["gap"]) >= optimum["throughput"] * (1 - 1e-9)


def test_a_plan_with_a_gap_is_written_checked_and_shown(runner, tmp_path):
    out = tmp_path / "plan.yaml"
    shown = runner.invoke(
        app, ["plan", PROFILE, CLUSTER, "--scheduler", "exact", "--time-limit", "1e-9", "-o", str(out)]
    )
    assert shown.exit_code == 0, shown.output
    written = yaml.safe_load(out.read_text())
    assert written["gap"] > 0 and written["optimal"] is False
    check = runner.invoke(app, ["check", str(out), "--profile", PROFILE, "--cluster", CLUSTER])
    assert check.exit_code == 0, check.output


def test_greedy_stops_its_local_search_at_the_time_limit(runner):
    result = runner.invoke(app, ["plan", PROFILE, CLUSTER, "--scheduler", "greedy", "--time-limit", "1e-9", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["feasible"] and "the local search stopped at the time limit" in plan["notes"]


def test_a_search_out_of_time_and_plans_says_so_without_running_exact(monkeypatch):
    from heterps_cli.errors import InfeasibleError, SearchGaveUp
    from heterps_cli.schedulers import exact

    monkeypatch.setattr(exact, "solve", lambda *a, **k: pytest.fail("exact ran after the time limit"))
    error = exact.diagnose(load_problem(PROFILE, CLUSTER), "the rl scheduler found no plan", "try more", time_limit=0.0)
    assert isinstance(error, InfeasibleError) and isinstance(error, SearchGaveUp)
    assert "within the time limit" in str(error) and "--scheduler exact says whether" in str(error)


def test_a_search_on_a_model_too_long_for_exact_does_not_point_to_it(monkeypatch, tmp_path, runner):
    from heterps_cli.schedulers import exact
    from heterps_cli.schedulers.exact import kernel

    monkeypatch.setattr(kernel, "MAX_GRID_CELLS", 100)  # chain16x2: 17 x 17 x 2 = 578 cells
    monkeypatch.setattr(exact, "solve", lambda *a, **k: pytest.fail("exact ran on a model too long for it"))
    tight = INSTANCES / "chain16x2-tight.profile.yaml", INSTANCES / "chain16x2-tight.cluster.yaml"
    for limit in ([], ["--time-limit", "1e-9"]):
        result = runner.invoke(
            app,
            [
                "plan",
                *map(str, tight),
                "--scheduler",
                "random",
                "--evaluations",
                "1",
                "--min-throughput",
                "1e12",
                *limit,
            ],
        )
        assert result.exit_code == 5, result.output  # no proof: the exact solver did not run
        assert "found no feasible plan" in result.output and "--scheduler exact" not in result.output
