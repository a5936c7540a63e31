"""Mixed stages by default (docs/spec.md section 1i, "Where they are offered"): plan and compare offer them
wherever the problem's types can share a stage, say nothing of them where they cannot, and
--no-mixed-stages plans one-type stages; the default rl stops at the exact solver's plan over them."""

from __future__ import annotations

import json

from heterps_cli.cli.app import app
from tests.helpers import runner, write_yaml
from tests.test_mixed import CLUSTER, TINY

TIME = ["--objective", "time", "--json"]


def _plan(profile, cluster, *flags) -> dict:
    done = runner.invoke(app, ["plan", profile, cluster, *flags])
    assert done.exit_code == 0, done.output
    plan = json.loads(done.stdout)
    plan.pop("solve_s")
    return plan


def test_the_default_offers_mixed_stages_and_no_mixed_stages_keeps_one_type(tmp_path):
    """TINY: the exact DP's mixed plan (36.3 samples/s, proven) without a flag, as with --mixed-stages; the
    one-type optimum (25.6) with --no-mixed-stages."""
    profile, cluster = write_yaml(tmp_path / "p.yaml", TINY), write_yaml(tmp_path / "c.yaml", CLUSTER)
    default = _plan(profile, cluster, "-s", "exact", *TIME)
    assert default == _plan(profile, cluster, "-s", "exact", "--mixed-stages", *TIME)
    assert default["optimal"] is True and default["stages"][0].get("joined")
    one = _plan(profile, cluster, "-s", "exact", "--no-mixed-stages", *TIME)
    assert one["optimal"] is True and not any(s.get("joined") for s in one["stages"])
    assert round(one["throughput"], 1) == 25.6 < default["throughput"]
    assert not any("mixed stages" in note for note in one["notes"])


def test_where_no_stage_can_mix_the_default_is_the_one_type_plan_without_a_word(tmp_path):
    """No global batch (no pipeline schedule), or one type: the default plan is --no-mixed-stages' plan, note
    for note; --mixed-stages says why it cannot mix."""
    unpipelined = {**TINY, "job": {"samples": 12000}}
    one_type = {"cluster": "one", "resources": {"fast": CLUSTER["resources"]["fast"]}}
    cases = [(unpipelined, CLUSTER, "a pipeline schedule"), (TINY, one_type, "the cluster has one type")]
    for i, (profile, cluster, why) in enumerate(cases):
        p, c = write_yaml(tmp_path / f"p{i}.yaml", profile), write_yaml(tmp_path / f"c{i}.yaml", cluster)
        default = _plan(p, c, "-s", "exact", *TIME)
        assert default == _plan(p, c, "-s", "exact", "--no-mixed-stages", *TIME)
        assert not any("mixed" in note for note in default["notes"])
        asked = _plan(p, c, "-s", "exact", "--mixed-stages", *TIME)
        assert any(note.startswith("--mixed-stages: ") and why in note for note in asked["notes"]), asked["notes"]


def test_a_shape_plans_one_type_stages_by_default_and_refuses_mixed_stages_asked(tmp_path):
    profile, cluster = write_yaml(tmp_path / "p.yaml", TINY), write_yaml(tmp_path / "c.yaml", CLUSTER)
    shaped = _plan(profile, cluster, "--stages", "1", *TIME)
    assert len(shaped["stages"]) == 1 and not shaped["stages"][0].get("joined")
    refused = runner.invoke(app, ["plan", profile, cluster, "--stages", "1", "--mixed-stages"])
    assert refused.exit_code == 2 and "drop --mixed-stages" in " ".join(refused.output.split())


def test_the_default_rl_stops_at_the_exact_plan_over_mixed_stages_and_carries_its_proof(tmp_path):
    """The default rl's stopping rule is the exact plan of the space it plans in: over mixed stages by
    default (TINY: its plan, joined, meets the DP's proven optimum)."""
    profile, cluster = write_yaml(tmp_path / "p.yaml", TINY), write_yaml(tmp_path / "c.yaml", CLUSTER)
    exact = _plan(profile, cluster, "-s", "exact", *TIME)
    rl = _plan(profile, cluster, *TIME)
    assert rl["scheduler"] == "rl" and rl["stages"][0].get("joined")
    assert abs(rl["throughput"] - exact["throughput"]) <= 1e-9 * exact["throughput"]
    assert rl["optimal"] is True and any("it meets the optimum the exact solver proves" in n for n in rl["notes"])


def test_checks_re_plan_command_keeps_a_one_type_plan_in_its_own_space(tmp_path):
    """A plan made with --no-mixed-stages where mixing could help: check's command to re-plan a stale job says
    --no-mixed-stages, and run, gives the one-type plan again."""
    profile, cluster = write_yaml(tmp_path / "p.yaml", TINY), write_yaml(tmp_path / "c.yaml", CLUSTER)
    out = tmp_path / "plan.yaml"
    made = runner.invoke(app, ["plan", profile, cluster, "-s", "exact", "--objective", "time", "--no-mixed-stages",
                               "-o", str(out)])  # fmt: skip
    assert made.exit_code == 0, made.output
    stale = runner.invoke(app, ["check", str(out), "--profile", profile, "--cluster", cluster, "--objective", "time",
                                "--samples", "24000"])  # fmt: skip
    said = " ".join(stale.output.split())
    assert stale.exit_code == 1 and "--no-mixed-stages --out" in said, stale.output


def test_compares_frontier_is_over_mixed_stages_where_the_schedulers_plans_are(tmp_path):
    """compare --plot's frontier: over mixed stages where the plans may mix and the DP over them runs, so that
    the exact plan (36.3 samples/s on TINY) is its fastest point, not beyond a one-type frontier (25.6)."""
    from heterps_cli import api
    from heterps_cli.formats import Job
    from heterps_cli.schedulers import Budget

    profile, cluster = write_yaml(tmp_path / "p.yaml", TINY), write_yaml(tmp_path / "c.yaml", CLUSTER)
    done = api.compare(str(profile), str(cluster), ["exact"], Job(objective="time"), with_frontier=True)
    exact = done.entries[0].plan
    assert exact is not None and exact.mixes
    assert abs(done.frontier.plans[-1].throughput - exact.throughput) <= 1e-9 * exact.throughput
    one = api.compare(str(profile), str(cluster), ["exact"], Job(objective="time"), budget=Budget(mixed_stages=False),
                      with_frontier=True)  # fmt: skip
    assert round(one.frontier.plans[-1].throughput, 1) == 25.6
