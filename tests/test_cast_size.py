"""docs/spec.md section 1b's sizes per sample stay per sample at every precision and degree: autocast's
half-precision copies of the weights are ``cast_size`` (bytes a micro-batch keeps whatever its
samples), not activations divided by the batch they were measured at."""

from __future__ import annotations

import math

import numpy as np
import pytest
import yaml

from heterps_cli.cli.app import app
from heterps_cli.schedulers import exact, solve
from tests.helpers import instance_dicts, problem_from_dicts, runner
from tests.oracle import pipeline_figures, pipeline_optimum

SIZES = ("activation_size", "input_saved", "cast_size", "input_size", "weight_size")


def _estimate(tmp_path, model, batch, precision, *extra):
    out = tmp_path / f"{model}-{precision}-{batch}.yaml"
    args = ["profile", "estimate", model, "a100-80gb", "--as", "gpu", "--precision", precision]
    result = runner.invoke(app, [*args, "--batch-size", str(batch), "--out", str(out), *extra])
    assert result.exit_code == 0, result.output
    return yaml.safe_load(out.read_text())["layers"]


@pytest.mark.parametrize(
    "model, extra, precision",
    [
        ("mlp", (), "bf16"),
        ("mlp", (), "fp32"),
        pytest.param("mlp", (), "fp16", marks=pytest.mark.slow),
        *(
            pytest.param("transformer", ("--tp", "2", "--input-shape", "16"), p, marks=pytest.mark.slow)
            for p in ("bf16", "fp16", "fp32")
        ),
    ],
)
def test_sizes_per_sample_do_not_depend_on_the_batch_measured(tmp_path, model, extra, precision):
    small, large = (_estimate(tmp_path, model, b, precision, *extra) for b in (8, 32))
    for a, b in zip(small, large):
        for field in SIZES:
            assert a.get(field, 0) == b.get(field, 0), (a["name"], field)
        for d, shard in (a.get("tp") or {}).items():
            assert shard == b["tp"][d], (a["name"], d)
    casts = [layer.get("cast_size", 0) for layer in small]
    if precision == "fp32":
        assert not any(casts)
    else:
        assert any(casts)


def test_a_linear_layer_keeps_a_half_precision_copy_of_its_weight_once_per_batch(tmp_path):
    """mlp's layer 2 is Linear(1024, 1024) after a ReLU: under bf16 autocast its backward needs the
    bf16 weight (1024 x 1024 x 2 bytes), its input's bf16 copy (1024 x 2 a sample) is its activation.
    The first layer's input needs no gradient, so its weight's copy is not kept."""
    layers = _estimate(tmp_path, "mlp", 8, "bf16")
    assert layers[2]["cast_size"] == 1024 * 1024 * 2
    assert layers[2]["activation_size"] == 1024 * 2
    assert "cast_size" not in layers[0]


def _instance(memory_gb):
    """Two layers of 1 GB of weights (state_factor 1) whose batches each keep a 1 GB weight copy, four
    micro-batches a step; type a holds ``memory_gb``, type b 100 GB at ten times a's price."""
    oct_ = np.array([[0.01, 0.01], [0.01, 0.01]])
    ones = np.ones((2, 2))
    arrays = (oct_, 0.001 * ones, ones, ones, np.ones((2, 2), dtype=bool), np.array([1.0, 10.0]), np.array([2, 2]))
    profile, cluster = instance_dicts(*arrays)
    profile["state_factor"] = 1.0
    profile["job"]["global_batch"] = 4 * profile["batch_size"]
    for layer in profile["layers"]:
        layer.update(weight_size=1e9, cast_size=1e9)
    names = list(cluster["resources"])
    cluster["resources"][names[0]]["memory_gb"] = memory_gb
    cluster["resources"][names[1]]["memory_gb"] = 100.0
    return profile, cluster, names


@pytest.mark.parametrize(
    "memory_gb, cheap_stages",
    [
        (4.0, [0, 1]),  # one stage: 2 GB of weights + one batch's 2 GB of copies
        (3.0, [0, 1]),  # two stages: the first holds 2 batches in flight (1 + 2 GB), the second 1 (1 + 1)
        (2.5, [1]),  # the first stage's two copies do not fit on a: it goes to b
    ],
)
def test_weight_copies_are_held_per_micro_batch_in_flight_and_exact_agrees_with_brute_force(memory_gb, cheap_stages):
    profile, cluster, names = _instance(memory_gb)
    problem = problem_from_dicts(profile, cluster, objective="cost")
    plan = exact.solve(problem)
    expected = pipeline_optimum(profile, cluster, "cost", profile["job"]["min_throughput"])
    assert expected is not None and math.isclose(plan.cost_usd, expected[0], rel_tol=1e-9)
    stages = [(s.resource, list(range(s.first, s.last + 1))) for s in plan.stages]
    ref = pipeline_figures(profile, cluster, plan.schedule, [s.replicas for s in plan.stages], stages)
    assert ref["feasible"]
    for stage, memory in zip(plan.stages, ref["memory_gb"]):
        assert math.isclose(stage.memory_gb, memory, rel_tol=1e-9)
    on_a = [i for i in range(2) if plan.schedule[i] == names[0]]
    assert on_a == cheap_stages
    for scheduler in ("greedy", "genetic"):  # the heuristics' stage sums price the same bytes
        other = solve(scheduler, problem, seed=0)
        for stage in other.stages:
            assert stage.memory_gb <= cluster["resources"][stage.resource]["memory_gb"] * (1 + 1e-9)
