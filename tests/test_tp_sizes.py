"""Sections 1f and 1h together: a micro-batch measured only at a tensor-parallel degree is a size the
plan may choose, charged as measured there; tp 1, with no time at it, cannot run the layer there."""

from __future__ import annotations

import copy

import pytest

from heterps_cli.cli.app import app
from heterps_cli.schedulers import solve
from tests.helpers import problem_from_dicts, runner, write_yaml
from tests.oracle import assert_figures_are_the_oracles, assert_is_the_optimum, pipeline_optimum

TP2_AT = {1: (0.006, 0.0005), 2: (0.011, 0.0005), 4: (0.021, 0.0005)}  # size -> oct, odt of one tp-2 replica


def _layer(name: str) -> dict:
    return {
        "name": name,
        "type": "fc",
        "input_size": 1000.0,
        "weight_size": 1e6,
        "tp": {2: {"weight_size": 5e5}},
        "times": {
            "gpu": {
                "oct": 0.010,
                "odt": 0.001,
                "alpha": 0.9,
                "beta": 0.5,
                "tp": {2: {"oct": 0.006, "odt": 0.0005, "batches": {b: {"oct": o, "odt": d} for b, (o, d) in
                                                                     TP2_AT.items() if b != 1}}},
            }
        },
    }  # fmt: skip


PROFILE = {
    "model": "m",
    "batch_size": 1,
    "job": {"samples": 1000, "epochs": 1, "global_batch": 16},
    "layers": [_layer("a"), _layer("b")],
}
CLUSTER = {"cluster": "c", "resources": {"gpu": {"price": 1.0, "limit": 8}}}


def _measured_at(size: int) -> dict:
    """The same model as if measured at ``size`` at tp 1 too, so slowly that no plan takes tp 1: the
    oracle's view of PROFILE at micro-batch ``size``, where only tp 2 has a time."""
    profile = copy.deepcopy(PROFILE)
    profile["batch_size"] = size
    for layer in profile["layers"]:
        entry = layer["times"]["gpu"]
        entry["oct"] = 100.0
        entry["tp"] = {2: {"oct": TP2_AT[size][0], "odt": TP2_AT[size][1]}}
    return profile


def test_a_size_measured_only_at_tp_2_is_offered_and_charged_as_measured():
    problem = problem_from_dicts(PROFILE, CLUSTER, objective="time")
    assert problem.micro_batch_choices == (1, 2, 4)  # 2 and 4 come from the tp-2 entries alone
    at_4 = problem.at_micro_batch(4)
    assert not at_4.runnable.any() and at_4.view_at(2).runnable.all()  # tp 1 has no time at 4: it cannot run
    plan = solve("exact", problem)
    assert plan.batch_size in (2, 4) and all(s.tp == 2 for s in plan.stages)  # a size tp 1 never measured
    reference = _measured_at(plan.batch_size)
    assert_figures_are_the_oracles(reference, CLUSTER, plan)
    assert_is_the_optimum(plan, pipeline_optimum(reference, CLUSTER, "time"), "time")


@pytest.mark.parametrize("scheduler", ["rl", "greedy", "tapp"])
def test_the_searches_plan_at_a_size_only_tp_2_measured(tmp_path, scheduler):
    profile, cluster = write_yaml(tmp_path / "p.yaml", PROFILE), write_yaml(tmp_path / "c.yaml", CLUSTER)
    args = ["plan", profile, cluster, "--objective", "time", "-s", scheduler, "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    exact = solve("exact", problem_from_dicts(PROFILE, CLUSTER, objective="time"))
    import json

    assert json.loads(result.stdout)["throughput"] >= exact.throughput * (1 - 1e-9)


def test_micro_batch_2_is_taken_and_8_is_refused_naming_the_layer(tmp_path):
    profile, cluster = write_yaml(tmp_path / "p.yaml", PROFILE), write_yaml(tmp_path / "c.yaml", CLUSTER)
    ok = runner.invoke(app, ["plan", profile, cluster, "-s", "exact", "--micro-batch", "2", "--json"])
    assert ok.exit_code == 0, ok.output
    refused = runner.invoke(app, ["plan", profile, cluster, "-s", "exact", "--micro-batch", "8"])
    shown = " ".join(refused.output.split())
    assert (
        refused.exit_code == 2 and "layer 'a' was measured at on the cluster's types at any degree (up to 4)" in shown
    )
