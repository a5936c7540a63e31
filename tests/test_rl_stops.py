"""rl and tapp's default training stops once its plan meets the optimum the exact solver proves, where
that proof is cheap (docs/schedulers/rl.md, "Stopping at the proven optimum"); given --steps or a time
limit they train as asked. The optimum comes from the exact solver, held to brute force elsewhere."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from heterps_cli.cli.app import app
from tests.helpers import ROOT

runner = CliRunner()
CTR, PAPER = str(ROOT / "profiles/ctr.yaml"), str(ROOT / "clusters/paper.yaml")


def _plan(*flags: str) -> dict:
    result = runner.invoke(app, ["plan", *flags, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.parametrize("name", ["rl", "tapp"])
def test_the_default_training_stops_at_the_proven_optimum(name):
    exact = _plan(CTR, PAPER, "-s", "exact", "--objective", "cost")
    mine = _plan(CTR, PAPER, "-s", name, "--objective", "cost")
    assert math.isclose(mine["cost_usd"], exact["cost_usd"], rel_tol=1e-9)
    assert mine["optimal"] is True and mine["scheduler"] == name
    assert any("meets the optimum the exact solver proves" in n for n in mine["notes"])


def test_given_steps_it_trains_them_and_claims_no_proof():
    mine = _plan(CTR, PAPER, "-s", "rl", "--steps", "3")
    assert not mine["optimal"]
    assert not any("exact solver proves" in n for n in mine["notes"])


@pytest.mark.slow  # rl trains one micro-batch's default budget: about 5 s
def test_the_optimums_micro_batch_is_asked_first_and_no_other_once_it_is_met():
    flags = (str(ROOT / "profiles/vgg16.yaml"), str(ROOT / "clusters/three-type.yaml"), "--global-batch", "256")
    exact = _plan(*flags, "-s", "exact")
    mine = _plan(*flags)
    assert mine["batch_size"] == exact["batch_size"] and math.isclose(mine["cost_usd"], exact["cost_usd"])
    said = " ".join(mine["notes"])
    assert f"not asked (the plan at micro-batch {exact['batch_size']} meets the optimum" in said


def test_training_stops_where_the_exact_cut_of_its_plans_runs_meets_the_optimum():
    """chain16x3: rl's own samples stay 0.2% above the optimum through its 120 steps (9.7 s), and the exact cut
    of its plan's runs, the step its plan takes after training, meets it: it now stops as soon as that cut does."""
    instances = ROOT / "benchmarks/instances"
    files = [str(instances / "chain16x3.profile.yaml"), str(instances / "chain16x3.cluster.yaml")]
    exact = _plan(*files, "-s", "exact")
    mine = _plan(*files, "-s", "rl")
    assert math.isclose(mine["cost_usd"], exact["cost_usd"], rel_tol=1e-9) and mine["optimal"] is True
    stopped = next(n for n in mine["notes"] if n.startswith("training stopped"))
    assert "the exact cut of its plan's runs meets the optimum" in stopped and "of 120 steps" in stopped
