"""docs/spec.md section 1d, the pipeline schedule: exact against brute force, figures against the spec."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from heterps_cli.errors import InfeasibleError
from heterps_cli.schedulers import exact, solve
from tests.helpers import instance_dicts, problem_from_dicts, random_hardware, random_instance
from tests.oracle import pipeline_figures, pipeline_optimum
from tests.strategies import SETTINGS


@st.composite
def pipelined(draw, batches=(32,), max_limit=3):
    """A small instance with section 1b's fields and 1d's: micro-batches, optimiser-step times and
    reserved memory, drawn so that the bubble, the all-reduce and memory in flight each matter."""
    T = draw(st.integers(2, 3))
    n = draw(st.integers(1, 4 if T == 2 else 3))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    arrays = random_instance(rng, n, T, max_limit=max_limit)
    B0 = draw(st.sampled_from(batches))
    hardware = random_hardware(rng, arrays[0], B0, casts=True)
    profile, cluster = instance_dicts(*arrays, B0=B0, hardware=hardware)
    M = draw(st.sampled_from([1, 2, 3, 8]))
    profile["job"]["global_batch"] = M * B0
    for layer in profile["layers"]:
        for entry in layer["times"].values():
            if rng.random() < 0.7:
                entry["update"] = float(np.round(entry["oct"] * rng.choice([0.01, 0.3, 2.0]), 6))
    if rng.random() < 0.5:  # a stage's pass start, all-reduce and transfer latencies, on some types
        scale = float(arrays[0].mean())
        profile["fixed"] = {
            t: {"pass_start": round(scale * float(rng.choice([0.0, 0.05, 1.0])), 9),
                "all_reduce_latency": round(scale * float(rng.choice([0.0, 0.5, 5.0])), 9),
                "transfer_latency": round(scale * float(rng.choice([0.0, 0.2, 2.0])), 9)}
            for t in profile["layers"][0]["times"] if rng.random() < 0.7
        } or None  # fmt: skip
        if profile["fixed"] is None:
            del profile["fixed"]
    for res in cluster["resources"].values():
        if "memory_gb" in res and rng.random() < 0.5:
            res["memory_reserved_gb"] = round(res["memory_gb"] * float(rng.choice([0.1, 0.5])), 9)
    reference = M * B0 / (M * arrays[0].min(axis=1).sum())
    profile["job"]["min_throughput"] = draw(st.sampled_from([0.0, 0.3, 1.0])) * reference
    return profile, cluster


def _stages(plan) -> list:
    """The plan's stages as the oracle takes them: (type, [layers]) each, two on one type kept two."""
    return [(s.resource, list(range(s.first, s.last + 1))) for s in plan.stages]


def _check(profile, cluster, objective, budget=None):
    problem = problem_from_dicts(profile, cluster, objective=objective, max_cost=budget)
    expected = pipeline_optimum(profile, cluster, objective, profile["job"]["min_throughput"], budget)
    try:
        plan = exact.solve(problem)
    except InfeasibleError:
        plan = None
    assert (plan is None) == (expected is None), f"exact: {plan and plan.cost_usd}, enumeration: {expected}"
    if plan is None:
        return None
    ref = pipeline_figures(profile, cluster, plan.schedule, [s.replicas for s in plan.stages], _stages(plan))
    assert ref["feasible"] and plan.feasible and plan.optimal
    assert math.isclose(plan.throughput, ref["throughput"], rel_tol=1e-9)
    assert math.isclose(plan.cost_usd, ref["cost_usd"], rel_tol=1e-9, abs_tol=1e-12)
    for stage, step, memory in zip(plan.stages, ref["step_s"], ref["memory_gb"]):
        assert math.isclose(stage.step_s, step, rel_tol=1e-9)
        assert math.isclose(stage.memory_gb, memory, rel_tol=1e-9, abs_tol=1e-15)
    figure, want = (plan.throughput, expected[1]) if objective == "time" else (plan.cost_usd, expected[0])
    assert math.isclose(figure, want, rel_tol=1e-9, abs_tol=1e-12)
    return plan


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
@settings(max_examples=150, **SETTINGS)
@given(pipelined(), st.sampled_from(["cost", "time"]))
def test_exact_matches_brute_force_under_a_pipeline_schedule(inst, objective):
    _check(*inst, objective)


@settings(max_examples=100, **SETTINGS)
@given(pipelined(), st.sampled_from(["cost", "time"]), st.sampled_from([0.5, 1.0, 2.0]))
def test_exact_matches_brute_force_under_a_pipeline_schedule_and_a_budget(inst, objective, share):
    """A budget between the cheapest and the dearest plans: the time objective then walks every step."""
    profile, cluster = inst
    cheapest = pipeline_optimum(profile, cluster, "cost", profile["job"]["min_throughput"])
    if cheapest is None:
        return
    _check(profile, cluster, objective, budget=cheapest[0] * share)


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
@settings(max_examples=60, **SETTINGS)
@given(pipelined(), st.sampled_from(["greedy", "genetic"]))
def test_heuristics_score_plans_by_the_pipeline_model(inst, scheduler):
    """Whatever a heuristic finds is feasible and its figures are the spec's; never better than exact."""
    profile, cluster = inst
    problem = problem_from_dicts(profile, cluster, micro_batch=profile["batch_size"])  # the oracle's B0
    try:
        plan = solve(scheduler, problem, seed=0)
    except InfeasibleError:
        return
    ref = pipeline_figures(profile, cluster, plan.schedule, [s.replicas for s in plan.stages], _stages(plan))
    assert ref["feasible"] and plan.feasible
    assert math.isclose(plan.throughput, ref["throughput"], rel_tol=1e-9)
    best = pipeline_optimum(profile, cluster, "cost", profile["job"]["min_throughput"])
    assert best is not None and plan.cost_usd >= best[0] * (1 - 1e-9)


def test_more_replicas_can_be_slower_when_the_all_reduce_outgrows_the_compute():
    """A stage whose gradient all-reduce is large beside its compute is fastest on one replica: the
    time objective must not add replicas that slow it (and brute force agrees)."""
    oct_ = np.array([[0.01, 0.01]])
    odt = np.array([[1.0, 1.0]])
    ones = np.ones((1, 2))
    arrays = (oct_, odt, ones, ones, np.ones((1, 2), dtype=bool), np.array([1.0, 1.0]), np.array([3, 3]))
    profile, cluster = instance_dicts(*arrays)
    profile["job"]["global_batch"] = 64
    plan = _check(profile, cluster, "time")
    assert plan is not None and [s.replicas for s in plan.stages] == [1]


def test_a_stage_pays_its_types_pass_start_per_micro_batch_and_latency_per_all_reduce():
    """Section 1d by hand: one layer (oct 10 ms at 32 samples, alpha 1; odt 4 ms) on 2 replicas, 4
    micro-batches; the type's pass start 1 ms joins each micro-batch, its latency 2 ms the all-reduce:
    c = 10/2 + 1 = 6 ms, 2 (4 + 2)(2 - 1)/2 = 6 ms, a step 4 x 6 + 6 = 30 ms, 4 x 32 / 0.030 samples/s.
    Without them, 4 x 5 + 4 = 24 ms."""
    ones = np.ones((1, 1))
    arrays = (0.01 * ones, 0.004 * ones, ones, ones, np.ones((1, 1), dtype=bool), np.array([1.0]), np.array([2]))
    profile, cluster = instance_dicts(*arrays)
    profile["job"]["global_batch"] = 4 * 32
    plain = exact.solve(problem_from_dicts(profile, cluster, objective="time"))
    profile["fixed"] = {"r0": {"pass_start": 0.001, "all_reduce_latency": 0.002}}
    plan = exact.solve(problem_from_dicts(profile, cluster, objective="time"))
    assert [s.replicas for s in plan.stages] == [2] == [s.replicas for s in plain.stages]
    assert math.isclose(plain.stages[0].step_s, 0.024) and math.isclose(plan.stages[0].step_s, 0.030)
    assert math.isclose(plan.stages[0].compute_s, 0.006) and math.isclose(plan.stages[0].comm_s, 0.006)
    assert math.isclose(plan.throughput, 4 * 32 / 0.030)


def test_a_message_across_a_stage_boundary_pays_the_types_transfer_latency():
    """Section 1d by hand: two layers of 10 ms (alpha 1, odt 40 ms each), one type of 2 units, 4
    micro-batches. One stage: 4 x 20 = 80 ms. Two stages of one layer: (4 + 2 - 1) x 10 = 50 ms, and
    with a transfer latency of 1 ms each stage sends and receives one message per micro-batch: c = 12,
    60 ms. At 4 ms, c = 18 and 90 ms: one stage again (two replicas: 40 + 80 ms of all-reduce)."""
    ones = np.ones((2, 1))
    arrays = (0.01 * ones, 0.04 * ones, ones, ones, np.ones((2, 1), dtype=bool), np.array([1.0]), np.array([2]))
    profile, cluster = instance_dicts(*arrays)
    profile["job"]["global_batch"] = 4 * 32
    steps = {}
    for latency in (0.0, 0.001, 0.004):
        profile["fixed"] = {"r0": {"transfer_latency": latency}}
        plan = exact.solve(problem_from_dicts(profile, cluster, objective="time"))
        steps[latency] = [(s.layers, s.replicas, round(s.step_s, 9)) for s in plan.stages]
    assert steps[0.0] == [(["l0"], 1, 0.05), (["l1"], 1, 0.05)]
    assert steps[0.001] == [(["l0"], 1, 0.06), (["l1"], 1, 0.06)]
    assert steps[0.004] == [(["l0", "l1"], 1, 0.08)]


def test_without_the_new_fields_the_model_is_unchanged():
    arrays = random_instance(np.random.default_rng(3), 3, 2)
    profile, cluster = instance_dicts(*arrays)
    plan = exact.solve(problem_from_dicts(profile, cluster))
    d = plan.to_dict()
    assert "global_batch" not in d and "micro_batches" not in d and "memory_reserved_gb" not in d
    assert all("step_s" not in s for s in d["stages"])


@pytest.mark.parametrize(
    ("where", "value", "message"),
    [
        ("job.global_batch", 100, "not a whole number of micro-batches of batch_size 32"),
        ("job.global_batch", 0, "must be >= 1"),
        ("job.global_batch", 32 * 10**7, "more than 1,000,000"),
        ("job.global_batch", 10**40, "must be <="),
        ("memory_reserved_gb", 17.0, "not below the unit's memory_gb of 16"),
        ("memory_reserved_gb", -1.0, "must be >= 0"),
    ],
)
def test_bad_pipeline_fields_name_the_file_line_and_field(runner, tmp_path, where, value, message):

    from heterps_cli.cli.app import app
    from tests.helpers import write_yaml

    arrays = random_instance(np.random.default_rng(5), 3, 2)
    profile, cluster = instance_dicts(*arrays)
    cluster["resources"]["r0"]["memory_gb"] = 16.0
    if where == "job.global_batch":
        profile["job"]["global_batch"] = value
    else:
        cluster["resources"]["r0"][where] = value
    p, c = write_yaml(tmp_path / "p.yaml", profile), write_yaml(tmp_path / "c.yaml", cluster)
    result = runner.invoke(app, ["plan", p, c, "--scheduler", "greedy"])
    assert result.exit_code == 2, result.output
    field = "global_batch" if where == "job.global_batch" else "memory_reserved_gb"
    assert field in result.output and message in result.output and ".yaml:" in result.output
    assert "Traceback" not in result.output
