"""Sections 1f and 1h together: a micro-batch measured only at a tensor-parallel degree is a size the
plan may choose, charged as measured there; tp 1, with no time at it, cannot run the layer there."""

from __future__ import annotations

import copy
import json
import math

import pytest
import yaml

from heterps_cli.cli.app import app
from heterps_cli.schedulers import solve
from tests.helpers import problem_from_dicts, runner, write_yaml
from tests.oracle import _cuts_replicas_degrees, assert_figures_are_the_oracles, assert_is_the_optimum, pipeline_figures

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


TP1_AT = {1: (0.010, 0.001)}
LARGEST = {1: max(TP1_AT), 2: max(TP2_AT)}  # by degree: the most samples a replica may train (spec 1f)


def _charged(measured: dict, size: int) -> dict:
    """An entry at ``size`` by spec 1f's rule, written by hand: a measured size as measured; above the
    largest measured size L, ``oct(L) (1 - a + a r)`` with ``r = size / L``, alpha then
    ``a r / (1 - a + a r)`` (odt and beta alike)."""
    a, b = 0.9, 0.5
    if size in measured:
        return {"oct": measured[size][0], "odt": measured[size][1], "alpha": a, "beta": b}
    largest = max(measured)
    r = size / largest
    fc, fd = 1 - a + a * r, 1 - b + b * r
    oct_, odt = measured[largest]
    return {"oct": oct_ * fc, "odt": odt * fd, "alpha": a * r / fc, "beta": b * r / fd}


def _measured_at(size: int) -> dict:
    """PROFILE as if measured at micro-batch ``size`` on both degrees, each by :func:`_charged`."""
    profile = copy.deepcopy(PROFILE)
    profile["batch_size"] = size
    for layer in profile["layers"]:
        entry = layer["times"]["gpu"]
        entry.update(_charged(TP1_AT, size))
        entry["tp"] = {2: _charged(TP2_AT, size)}
    return profile


def _optimum(reference: dict, size: int) -> tuple[float, float]:
    """(cost, throughput) of the fastest plan by enumeration, each stage at least ``ceil(size / L)``
    replicas of its degree's largest measured size ``L``."""
    best = None
    layers = reference["layers"]
    for stages, ks, ds in _cuts_replicas_degrees(["gpu", "gpu"], CLUSTER, size, layers):
        if any(k < math.ceil(size / LARGEST[d]) for k, d in zip(ks, ds)):
            continue
        f = pipeline_figures(reference, CLUSTER, ["gpu", "gpu"], list(ks), stages, [False] * len(stages), list(ds))
        if f["feasible"] and (best is None or (f["throughput"], -f["cost_usd"]) > (best[1], -best[0])):
            best = (f["cost_usd"], f["throughput"])
    assert best is not None
    return best


def test_a_size_measured_only_at_tp_2_is_offered_and_charged_as_measured():
    problem = problem_from_dicts(PROFILE, CLUSTER, objective="time")
    # 2 and 4 from the tp-2 entries alone; 8 and 16, multiples of the largest, with 2 and 4 replicas a stage
    assert problem.micro_batch_choices == (1, 2, 4, 8, 16)
    for size in (2, 4, 8, 16):
        at = problem.at_micro_batch(size)
        assert at.share_cap is not None and (at.share_cap == 1).all()  # tp 1 only with a replica per sample
        plan = solve("exact", at)
        reference = _measured_at(size)
        assert_figures_are_the_oracles(reference, CLUSTER, plan)
        assert_is_the_optimum(plan, _optimum(reference, size), "time")
        assert all(s.replicas >= math.ceil(size / LARGEST[s.tp or 1]) for s in plan.stages)


@pytest.mark.slow  # over a second here: the slow suite, which CI runs too
@pytest.mark.parametrize("scheduler", ["rl", "greedy", "tapp"])
def test_the_searches_plan_at_a_size_only_tp_2_measured(tmp_path, scheduler):
    profile, cluster = write_yaml(tmp_path / "p.yaml", PROFILE), write_yaml(tmp_path / "c.yaml", CLUSTER)
    result = runner.invoke(app, ["plan", profile, cluster, "--objective", "time", "-s", scheduler, "--json"])
    assert result.exit_code == 0, result.output
    exact = solve("exact", problem_from_dicts(PROFILE, CLUSTER, objective="time"))
    assert json.loads(result.stdout)["throughput"] >= exact.throughput * (1 - 1e-9)


def test_a_micro_batch_above_every_measured_size_takes_replicas_enough(tmp_path):
    profile, cluster = write_yaml(tmp_path / "p.yaml", PROFILE), write_yaml(tmp_path / "c.yaml", CLUSTER)
    for size, fewest in ((2, 1), (8, 2)):
        ok = runner.invoke(app, ["plan", profile, cluster, "-s", "exact", "--micro-batch", str(size), "--json"])
        assert ok.exit_code == 0, ok.output
        assert all(s["replicas"] >= fewest for s in json.loads(ok.stdout)["stages"])
    refused = runner.invoke(app, ["plan", profile, cluster, "-s", "exact", "--micro-batch", "3"])
    assert refused.exit_code == 2 and "micro-batch 3 does not divide the global batch 16" in refused.output


def test_check_fails_a_plan_whose_replicas_train_more_than_was_measured(tmp_path):
    profile, cluster = write_yaml(tmp_path / "p.yaml", PROFILE), write_yaml(tmp_path / "c.yaml", CLUSTER)
    plan = tmp_path / "plan.yaml"
    job = ["--objective", "time", "--micro-batch", "16"]
    made = runner.invoke(app, ["plan", profile, cluster, "-s", "exact", *job, "--out", str(plan)])
    assert made.exit_code == 0, made.output
    data = yaml.safe_load(plan.read_text())
    data["stages"][0]["replicas"] = 2  # 8 samples each, measured at tp 2 up to 4
    data["resources"] = {"gpu": 4}
    write_yaml(plan, data)
    result = runner.invoke(app, ["check", str(plan), "--profile", profile, "--cluster", cluster, *job])
    shown = " ".join(result.output.split())
    assert result.exit_code == 1 and "above the 4 its layers were measured at on gpu" in shown
    assert "it needs at least 4 replicas" in shown
