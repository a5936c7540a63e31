"""Edited plans and wrong reasons (docs/commands.md, "What heterps refuses, and why"), a test per class:

3. check compares every field a plan records;
8. the right reason and the right figure.
"""

from __future__ import annotations

import json
import re

import pytest
import yaml

from heterps_cli.cli.app import app
from heterps_cli.plots import tick_labels
from tests.helpers import ROOT, runner

CTR, PAPER = str(ROOT / "profiles/ctr.yaml"), str(ROOT / "clusters/paper.yaml")
PLACED = ROOT / "docs/plans/ctr-aws-p3.yaml"  # two nodes
VGG = ROOT / "docs/plans/vgg16-aws.yaml"  # pipelined, on nodes, with memory, bandwidth, links and a what-if
VGG_JOB = [
    "--profile",
    str(ROOT / "profiles/vgg16-aws.yaml"),
    "--cluster",
    str(ROOT / "clusters/aws-catalogue.yaml"),
    "--samples",
    "1000000",
    "--global-batch",
    "1024",
    "--min-throughput",
    "15000",
]


# 3. check compares every recorded field ----------------------------------------------------------

HOW_FOUND = {"scheduler", "seed", "evaluations", "solve_s", "notes", "optimal", "gap"}


def _leaves(data, path=()):
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _leaves(value, (*path, key))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from _leaves(value, (*path, i))
    else:
        yield path, data


def _edited(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 2 if value else 1.0
    if value is None:
        return 1.0
    return f"{value}x"


def _set(data, path, value):
    for key in path[:-1]:
        data = data[key]
    data[path[-1]] = value


def _check_after(tmp_path, edit) -> tuple[int, str]:
    plan = yaml.safe_load(VGG.read_text())
    edit(plan)
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan, sort_keys=False, allow_unicode=True))
    result = runner.invoke(app, ["check", str(path), *VGG_JOB])
    return result.exit_code, " ".join(result.output.split())


def test_the_subject_plan_passes_as_written(tmp_path):
    code, shown = _check_after(tmp_path, lambda plan: None)
    assert code == 0, shown


EDITS = {
    "micro_batches": lambda p: p.update(micro_batches=p["micro_batches"] * 2, global_batch=p["global_batch"] * 2),
    "memory_gb of a type": lambda p: p["memory_gb"].update(l4=48.0),
    "bandwidth_gbps of a type": lambda p: p["bandwidth_gbps"].update(l4=1.0),
    "limits": lambda p: p["limits"].update(l4=17),
    "memory_reserved_gb added": lambda p: p.update(memory_reserved_gb={"l4": 1.0}),
    "memory_gb of a type added": lambda p: p["memory_gb"].update(tpu=8.0),
    "a stage's in_flight": lambda p: p["stages"][0].update(in_flight=p["stages"][0]["in_flight"] + 1),
    "idle_units": lambda p: p.update(idle_units={**p["idle_units"], "cpu": 1}),
    "link_gbps": lambda p: p.update(link_gbps={"l4": 1.0}),
}


@pytest.mark.parametrize("edit", EDITS)
def test_check_fails_a_plan_whose_recorded_cluster_or_job_was_edited(tmp_path, edit):
    code, shown = _check_after(tmp_path, EDITS[edit])
    assert code in (1, 2) and ("stale" in shown or "error" in shown), shown


def test_a_gap_beside_optimal_is_refused(tmp_path):
    code, shown = _check_after(tmp_path, lambda p: p.update(gap=0.5, optimal=True))
    assert code == 2 and "gap: a gap says exact stopped before proving the plan optimal" in shown


@pytest.mark.parametrize("field", ["link_gbps", "idle_units", "bandwidth_gbps", "rate_usd_per_hour"])
def test_a_field_the_plan_leaves_out_fails_check(tmp_path, field):
    """The gate cannot tell an edit from an older heterps's plan: either way the file no longer says
    what the files give, and `check` says which field and that `heterps plan` writes it."""
    code, shown = _check_after(tmp_path, lambda p: p.pop(field))
    assert code == 1 and f"{field} none ->" in shown and "the plan leaves it out" in shown, shown


def test_a_stage_field_left_out_fails_check(tmp_path):
    code, shown = _check_after(tmp_path, lambda p: p["stages"][0].pop("memory_gb"))
    assert code == 1 and "stages[0].memory_gb none ->" in shown, shown


@pytest.mark.parametrize(
    "nodes, said",
    [
        ({"g6.24xlarge#2": 4}, "on g6.24xlarge#2, but the plan rents 1 g6.24xlarge node (only g6.24xlarge#1)"),
        ({"p3.8xlarge#1": 4}, "the plan rents no 'p3.8xlarge' nodes"),
        ({"g6.24xlarge#1": 3}, "places 3 l4 replicas on nodes but has 4"),
    ],
)
def test_a_plan_placed_on_nodes_it_does_not_rent_is_refused_by_validate_and_launch(tmp_path, nodes, said):
    plan = yaml.safe_load(VGG.read_text())
    plan["stages"][-1]["nodes"] = nodes
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan, sort_keys=False, allow_unicode=True))
    for args in (["validate", str(path)], ["launch", str(path), "-o", str(tmp_path / "out")]):
        result = runner.invoke(app, args)
        shown = " ".join(result.output.split())
        assert result.exit_code == 2 and said in shown and "plan.yaml:" in shown, (args, shown)
        assert "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_every_recorded_field_edited_fails_check_but_how_it_was_found(tmp_path):
    plan = yaml.safe_load(VGG.read_text())
    for path, value in _leaves(plan):
        if path[0] in ("explanation", "what_if") and len(path) > 2:
            continue  # text and what-ifs: compared whole, so one edit of each is enough
        if value is None and path[0] in HOW_FOUND:
            continue  # not given: nothing to edit
        code, shown = _check_after(tmp_path, lambda p, path=path, value=value: _set(p, path, _edited(value)))
        if path[0] in HOW_FOUND:
            assert code == 0, (path, shown)
        else:
            assert code in (1, 2), (path, shown)


# 8. Reasons and figures ----------------------------------------------------------------------------


def test_an_overflowing_price_is_blamed_on_the_price(runner, tmp_path):
    text = (
        (ROOT / "clusters/aws-p3-nodes.yaml")
        .read_text()
        .replace("price: 3.06, units: {v100: 1", "price: 1.5e308, units: {v100: 1")
    )
    (tmp_path / "c.yaml").write_text(text)
    result = runner.invoke(app, ["plan", CTR, str(tmp_path / "c.yaml")])
    assert result.exit_code == 2 and re.search(r"c\.yaml:\d+: nodes\.p3\.2xlarge\.price: ", result.stderr)


def test_idle_units_list_every_unit_the_rental_holds(runner, tmp_path):
    cluster = yaml.safe_load((ROOT / "clusters/aws-p3-nodes.yaml").read_text())
    cluster["resources"]["tpu"] = {"unit": "TPU"}  # no layer of ctr runs on it
    for node in cluster["nodes"].values():
        node["units"]["tpu"] = 2
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cluster))
    out = tmp_path / "plan.yaml"
    assert runner.invoke(app, ["plan", CTR, str(tmp_path / "c.yaml"), "-s", "exact", "--out", str(out)]).exit_code == 0
    plan = yaml.safe_load(out.read_text())
    assert plan["idle_units"]["tpu"] == 2 * sum(plan["rental"].values())
    assert plan["resources"]["tpu"] == 0 and plan["limits"]["tpu"] == 2 * sum(
        cluster["nodes"][k]["available"] for k in cluster["nodes"]
    )
    check = runner.invoke(app, ["check", str(out), "--profile", CTR, "--cluster", str(tmp_path / "c.yaml")])
    assert check.exit_code == 0, check.output


def test_a_frontier_thinned_past_its_knee_still_says_where_the_knee_is(runner):
    whole = json.loads(runner.invoke(app, ["frontier", CTR, PAPER, "--json"]).stdout)
    ends = json.loads(runner.invoke(app, ["frontier", CTR, PAPER, "--points", "2", "--json"]).stdout)
    assert whole["knee"] is not None and whole["knee_position"] == whole["knee"]
    assert ends["knee"] is None and ends["knee_position"] == whole["knee"]


def test_tick_labels_write_every_tick_as_it_is():
    assert tick_labels([10000, 12500, 15000, 17500, 20000]) == ["10.0k", "12.5k", "15.0k", "17.5k", "20.0k"]
    assert tick_labels([0.016, 0.018, 0.02], money=True) == ["$0.016", "$0.018", "$0.020"]
    assert tick_labels([2e6, 4e6, 6e6]) == ["2M", "4M", "6M"]


def test_diff_shows_what_the_rental_changed(runner, tmp_path):
    cheap, fast = tmp_path / "a.yaml", tmp_path / "b.yaml"
    nodes = str(ROOT / "clusters/aws-p3-nodes.yaml")
    assert runner.invoke(app, ["plan", CTR, nodes, "-s", "exact", "--out", str(cheap)]).exit_code == 0
    assert (
        runner.invoke(app, ["plan", CTR, nodes, "-s", "exact", "--objective", "time", "--out", str(fast)]).exit_code
        == 0
    )
    result = runner.invoke(app, ["diff", str(cheap), str(fast), "--format", "json"])
    changed = {c["what"] for c in json.loads(result.stdout)["changes"]}
    assert {"c5.18xlarge nodes", "rate USD/h"} <= changed, changed
