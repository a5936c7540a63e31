"""The commands beside plan on mixed stages (docs/spec.md section 1i): compare runs every scheduler in the
mixed space, and an infeasible job is answered with what mixing reaches, not what one-type stages do."""

from __future__ import annotations

import json

import pytest

from heterps_cli.cli.app import app
from tests.helpers import runner, write_yaml
from tests.test_mixed import CLUSTER, TINY


def test_compare_runs_every_scheduler_with_mixed_stages_against_the_exact_mixed_optimum(tmp_path):
    """TINY (tests/test_mixed.py): every scheduler's plan mixes as the exact DP's does, none above it."""

    profile, cluster = write_yaml(tmp_path / "p.yaml", TINY), write_yaml(tmp_path / "c.yaml", CLUSTER)
    args = ["compare", profile, cluster, "--objective", "time", "--mixed-stages", "--schedulers", "greedy,exact"]
    done = runner.invoke(app, [*args, "--json"])
    assert done.exit_code == 0, done.output
    rows = {e["scheduler"]: e for e in json.loads(done.stdout)["results"]}
    assert rows["exact"]["plan"]["optimal"] is True and rows["exact"]["plan"]["stages"][0].get("joined")
    assert rows["greedy"]["gap"] >= -1e-12 and rows["greedy"]["throughput"] > 26  # above one-type's 25.6


@pytest.mark.parametrize(
    ("job", "said"),
    [
        (["--objective", "cost", "--min-throughput", "40"], "the fastest reaches 36.3 samples/s"),
        (["--objective", "time", "--max-cost", "0.5"], "the cheapest plan that meets the rest of the job costs $1.00"),
    ],
)
def test_an_infeasible_mixed_job_names_its_binding_constraint_and_what_mixing_reaches(tmp_path, job, said):
    """One-type stages reach 25.6 samples/s on TINY, mixed ones 36.3: the answer gives the mixed figure."""
    profile, cluster = write_yaml(tmp_path / "p.yaml", TINY), write_yaml(tmp_path / "c.yaml", CLUSTER)
    done = runner.invoke(app, ["plan", profile, cluster, "-s", "exact", "--mixed-stages", *job])
    words = " ".join(done.output.split())
    assert done.exit_code == 3 and said in words and "mixed stages included" in words, done.output


@pytest.mark.parametrize("scheduler", ["exact", "greedy"])
def test_past_the_dp_a_floor_only_mixing_reaches_is_met_not_called_infeasible(tmp_path, monkeypatch, scheduler):
    """The DP switched off, as past its reach: under a floor of 30 no one-type plan meets the job (25.6 at
    most), so the fastest one-type plan is climbed, with replicas of the other type joined, and answers."""
    from heterps_cli.schedulers import mixed_optimum

    monkeypatch.setattr(mixed_optimum, "MOST_WORK", 0)
    profile, cluster = write_yaml(tmp_path / "p.yaml", TINY), write_yaml(tmp_path / "c.yaml", CLUSTER)
    args = ["plan", profile, cluster, "-s", scheduler, "--objective", "cost", "--min-throughput", "30"]
    unasked = runner.invoke(app, args)  # one type a stage: none; past the DP, under cost, not offered by default
    said = " ".join(unasked.output.split())
    assert unasked.exit_code == 3 and "Mixed stages were not offered (under objective cost" in said
    assert said.endswith("--mixed-stages may meet it.")
    done = runner.invoke(app, [*args, "--mixed-stages", "--json"])
    assert done.exit_code == 0, done.output
    plan = json.loads(done.output)
    assert plan["throughput"] >= 30 and any(s.get("joined") for s in plan["stages"])
    assert any("no plan of one-type stages meets the job" in n for n in plan["notes"])
    assert plan["optimal"] is not True


def test_the_climb_starts_from_the_optima_with_a_power_of_two_of_a_types_units_held_back(tmp_path, monkeypatch):
    """The DP switched off, as past its reach: on TINY with 2 fast units and 12 slow ones the exact solver
    is asked for the one-type optimum with 1 fast unit held back, and with 1, 2, 4 and 8 slow ones (never
    11, all but one: section 1i), each at most once, where the certificate leaves room for a better plan;
    where it proves the plan within its bisection's precision, none is asked."""
    from heterps_cli import bounds
    from heterps_cli.schedulers import exact, mixed_optimum

    monkeypatch.setattr(mixed_optimum, "MOST_WORK", 0)
    asked: list[tuple[int, int]] = []
    solve = exact.solve

    def recorded(problem, *args, **kwargs):
        asked.append(tuple(int(n) for n in problem.limits))
        return solve(problem, *args, **kwargs)

    monkeypatch.setattr(exact, "solve", recorded)
    more = {**CLUSTER, "resources": {**CLUSTER["resources"], "slow": {"price": 1.0, "limit": 12}}}
    profile, cluster = write_yaml(tmp_path / "p.yaml", TINY), write_yaml(tmp_path / "c.yaml", more)
    args = ["plan", profile, cluster, "-s", "exact", "--objective", "time", "--mixed-stages", "--json"]
    done = runner.invoke(app, args)
    assert done.exit_code == 0, done.output
    notes = json.loads(done.output)["notes"]
    assert any("no other starts climbed" in n for n in notes) and set(asked) == {(2, 12)}
    monkeypatch.setattr(bounds, "proven", lambda problem, plan, late=None: None)  # no certificate: room everywhere
    asked.clear()
    done = runner.invoke(app, args)
    assert done.exit_code == 0, done.output
    held = [limits for limits in asked if limits != (2, 12)]
    assert len(held) == len(set(held)) and (1, 12) in held and (2, 11) in held
    assert set(held) <= {(1, 12), (2, 11), (2, 10), (2, 8), (2, 4)}
