"""`heterps compare`: every scheduler on one problem, the same budget, gaps to the optimum."""

from __future__ import annotations

import json

import pytest

from heterps_cli.cli.app import app
from tests.helpers import ROOT

CTR, PAPER = str(ROOT / "profiles/ctr.yaml"), str(ROOT / "clusters/paper.yaml")


@pytest.mark.slow
def test_ctr_prints_all_six_rows_and_nothing_beats_exact(runner, tmp_path):
    plot = tmp_path / "trade-off.png"
    result = runner.invoke(app, ["compare", CTR, PAPER, "--json", "--plot", str(plot), "--steps", "20"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    rows = {r["scheduler"]: r for r in report["results"]}
    assert list(rows) == ["rl", "tapp", "genetic", "greedy", "random", "exact"]
    assert all(r["feasible"] for r in rows.values())
    exact = rows["exact"]
    assert exact["gap"] == 0 and exact["plan"]["optimal"] is True
    for r in rows.values():
        assert r["cost_usd"] >= exact["cost_usd"] * (1 - 1e-9)
        assert r["gap"] >= -1e-9
    # genetic and random get rl's budget. rl's count includes its samples' exactly cut schedules, which
    # may pass the 1,024 type schedules of CTR's 10 layers on 2 types: random then says it ran out.
    random = rows["random"]
    ran_out = any("distinct schedules found" in note for note in random["plan"]["notes"])
    assert random["evaluations"] == rows["rl"]["evaluations"] or (ran_out and random["evaluations"] <= 1024)
    assert rows["genetic"]["evaluations"] <= rows["rl"]["evaluations"]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_table_names_every_scheduler_and_the_gap(runner):
    result = runner.invoke(app, ["compare", CTR, PAPER, "--schedulers", "greedy,random,exact", "--evaluations", "100"])
    assert result.exit_code == 0, result.output
    for word in ("greedy", "random", "exact", "gap", "0.00%", "evals"):
        assert word in result.stdout
    assert "rl" not in result.stdout.split()


def test_without_exact_there_is_no_gap(runner):
    result = runner.invoke(app, ["compare", CTR, PAPER, "--schedulers", "greedy", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["results"][0]["gap"] is None


def test_no_feasible_plan_exits_3(runner):
    result = runner.invoke(app, ["compare", CTR, PAPER, "--schedulers", "greedy,exact", "--min-throughput", "1e12"])
    assert result.exit_code == 3
    assert "no plan reaches" in result.output and "Traceback" not in result.output


def test_unknown_scheduler_exits_2(runner):
    result = runner.invoke(app, ["compare", CTR, PAPER, "--schedulers", "greedy,simulated-annealing"])
    assert result.exit_code == 2
    assert "simulated-annealing" in result.output


def test_bad_profile_exits_2(runner, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: m\nbatch_size: 0\nlayers: []\n")
    result = runner.invoke(app, ["compare", str(bad), PAPER])
    assert result.exit_code == 2
    assert "bad.yaml" in result.output
