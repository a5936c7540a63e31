"""frontier --mixed-stages where the exact DP over mixed stages does not run (docs/spec.md section 1c): the
points of the one-type frontier, each climbed as plan --mixed-stages climbs a plan. Held against that DP,
which tests/test_mixed.py holds against brute force, on a cluster small enough for it to run."""

from __future__ import annotations

import json

import yaml
from typer.testing import CliRunner

from heterps_cli.cli.app import app
from heterps_cli.schedulers import mixed_optimum
from tests.helpers import write_yaml
from tests.test_mixed import TINY

runner = CliRunner()
CLUSTER = {"cluster": "c", "resources": {"fast": {"price": 3.0, "limit": 4}, "slow": {"price": 1.0, "limit": 300}}}


def _frontier(*args: str) -> list[dict]:
    done = runner.invoke(app, ["frontier", *args, "--json"])
    assert done.exit_code == 0, done.output
    return json.loads(done.stdout)


def _matched(plan: dict, by: list[dict]) -> bool:
    """Some plan of ``by`` is at least as fast as ``plan`` and no dearer."""
    thr, cost = plan["throughput"], plan["cost_usd"]
    return any(p["throughput"] >= thr * (1 - 1e-9) and p["cost_usd"] <= cost * (1 + 1e-9) for p in by)


def test_where_the_mixed_dp_does_not_run_the_one_type_frontier_is_climbed(tmp_path, monkeypatch):
    profile, cluster = write_yaml(tmp_path / "p.yaml", TINY), write_yaml(tmp_path / "c.yaml", CLUSTER)
    exact = _frontier(profile, cluster)["plans"]  # the DP runs on these limits: mixed stages by default
    one_type = _frontier(profile, cluster, "--no-mixed-stages")["plans"]
    monkeypatch.setattr(mixed_optimum, "MOST_WORK", 1)  # now it does not
    found = _frontier(profile, cluster, "--mixed-stages", "--out", str(tmp_path / "plans"))
    plans = found["plans"]
    assert "does not run here" in found["climbed"] and all(p["optimal"] is False for p in plans)
    assert all(_matched(p, exact) for p in plans)  # never past the true frontier over mixed stages
    assert all(_matched(p, plans) for p in one_type)  # and never behind the one-type one
    mixing = [p for p in plans if any(s.get("joined") for s in p["stages"])]
    assert mixing and not all(_matched(p, one_type) for p in mixing)  # the climb gains where stages mix
    for written in sorted((tmp_path / "plans").glob("plan-*.yaml")):  # each point is a plan check accepts
        floor = str(yaml.safe_load(written.read_text())["min_throughput"])
        checked = runner.invoke(app, ["check", str(written), "--profile", profile, "--cluster", cluster,
                                      "--min-throughput", floor])  # fmt: skip
        assert checked.exit_code == 0, checked.output
