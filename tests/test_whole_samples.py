"""docs/spec.md section 1's whole samples: a stage of ``k`` replicas splits a batch of ``B0`` into shares
of ``ceil(B0/k)`` and ``floor(B0/k)``, is charged at the largest, and has at most ``B0`` replicas. The
solvers against enumeration at small batches (where the cap binds and shares are uneven), the
heuristics' plans against the spec's figures, and the files that break the rule refused."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from heterps_cli.cli.app import app
from heterps_cli.errors import InfeasibleError
from heterps_cli.replica_counts import next_whole
from heterps_cli.runtime.layout import layout
from heterps_cli.schedulers import exact, solve
from heterps_cli.yamlio import load_yaml
from tests.helpers import ROOT, instance_dicts, problem_from_dicts, random_hardware
from tests.oracle import brute_force, spec_figures
from tests.strategies import SETTINGS, instances
from tests.test_pipeline import _check as check_pipelined
from tests.test_pipeline import pipelined

BATCHES = (1, 2, 3, 4, 5, 7, 12)


@st.composite
def small_batches(draw, memory=False):
    """As tests.strategies.instances, at a batch of a few samples and limits up to 8: the batch caps
    the replicas, and most counts split it unevenly."""
    arrays, _, _ = draw(instances(layers=((2, 4), (3, 3)), limits=(3, 5, 8)))
    B0 = draw(st.sampled_from(BATCHES))
    target = draw(st.sampled_from((0.0, 0.5, 1.0, 2.0, 4.0))) * B0 / arrays[0].min(axis=1).sum()
    hardware = (
        random_hardware(np.random.default_rng(draw(st.integers(0, 2**32 - 1))), arrays[0], B0) if memory else None
    )
    return arrays, B0, target, hardware


def _both(arrays, B0, target, hardware, objective):
    profile, cluster = instance_dicts(*arrays, B0=B0, min_throughput=target, hardware=hardware)
    problem = problem_from_dicts(profile, cluster, objective=objective)
    expected = brute_force(*arrays, B0, problem.work, min_throughput=target, objective=objective, hardware=hardware)
    try:
        plan = exact.solve(problem)
    except InfeasibleError:
        plan = None
    assert (plan is None) == (expected is None), f"exact: {plan and plan.cost_usd}, enumeration: {expected}"
    return profile, cluster, plan, expected


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
@settings(max_examples=300, **SETTINGS)
@given(small_batches(), st.sampled_from(["cost", "time"]))
def test_exact_matches_enumeration_at_small_batches(inst, objective):
    profile, cluster, plan, expected = _both(*inst, objective)
    if plan is None:
        return
    assert all(s.replicas <= profile["batch_size"] for s in plan.stages)
    ref = spec_figures(profile, cluster, plan.to_dict())
    assert math.isclose(plan.throughput, ref["throughput"], rel_tol=1e-9)
    assert math.isclose(plan.cost_usd, ref["cost_usd"], rel_tol=1e-9, abs_tol=1e-12)
    figure, want = (plan.throughput, expected[1]) if objective == "time" else (plan.cost_usd, expected[0])
    assert math.isclose(figure, want, rel_tol=1e-9, abs_tol=1e-12)


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
@settings(max_examples=200, **SETTINGS)
@given(small_batches(memory=True), st.sampled_from(["cost", "time"]))
def test_exact_matches_enumeration_with_memory_at_small_batches(inst, objective):
    """Memory per replica holds ceil(B0/k) samples of activations: the fewest replicas that fit may
    fall between the counts where the largest share falls (sharded weights still divide by k)."""
    profile, cluster, plan, expected = _both(*inst, objective)
    if plan is not None:
        ref = spec_figures(profile, cluster, plan.to_dict())
        assert ref["memory_fits"]
        for stage, memory in zip(plan.stages, ref["memory_gb"]):
            assert math.isclose(stage.memory_gb, memory, rel_tol=1e-9, abs_tol=1e-15)


@settings(max_examples=80, **SETTINGS)
@given(pipelined(batches=BATCHES, max_limit=5), st.sampled_from(["cost", "time"]))
def test_exact_matches_enumeration_under_a_pipeline_at_small_batches(inst, objective):
    """Section 1d: the all-reduce grows with k while the largest share stays, so between two counts
    with the same share the fewer is faster."""
    check_pipelined(*inst, objective)


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
@settings(max_examples=60, **SETTINGS)
@given(small_batches(memory=True), st.sampled_from(["greedy", "genetic", "random"]))
def test_heuristics_plan_whole_samples(inst, scheduler):
    arrays, B0, target, hardware = inst
    profile, cluster = instance_dicts(*arrays, B0=B0, min_throughput=target, hardware=hardware)
    problem = problem_from_dicts(profile, cluster)
    try:
        plan = solve(scheduler, problem, seed=0)
    except InfeasibleError:
        return
    assert all(1 <= s.replicas <= B0 for s in plan.stages)
    ref = spec_figures(profile, cluster, plan.to_dict())
    assert math.isclose(plan.cost_usd, ref["cost_usd"], rel_tol=1e-9, abs_tol=1e-12)
    assert ref["memory_fits"]


def test_next_whole_is_the_next_count_with_a_smaller_share():
    for B in range(1, 41):
        for k in range(1, B + 1):
            smaller = [j for j in range(k + 1, B + 1) if math.ceil(B / j) < math.ceil(B / k)]
            assert next_whole(B, float(k)) == (smaller[0] if smaller else math.inf), (B, k)


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
@pytest.mark.parametrize("scheduler", ["exact", "greedy", "genetic"])
def test_the_bundled_transformer_gets_whole_samples_and_run_executes_the_charged_share(tmp_path, scheduler):
    """profiles/transformer.yaml (batch 32) on the paper's hardware: greedy and genetic gave a stage of 50
    replicas (0.64 of a sample each) before whole samples. Every stage now has at most 32, and the
    runner's largest shard of each stage is the share the plan charged (its compute_s from the spec)."""
    out = tmp_path / "plan.yaml"
    args = ["plan", str(ROOT / "profiles/transformer.yaml"), str(ROOT / "clusters/paper-hardware.yaml")]
    result = CliRunner().invoke(app, [*args, "-s", scheduler, "--out", str(out)])
    assert result.exit_code == 0, result.output
    import yaml

    plan = yaml.safe_load(out.read_text())
    B0 = plan["batch_size"]
    stages = [(s["resource"], s["replicas"], s["layers"]) for s in plan["stages"]]
    assert all(k <= B0 for _, k, _ in stages)
    ran = layout(stages, B0, 1)
    for s, (_, k, _) in zip(ran.stages, stages):
        shards = [ran.shard(s, r, 0) for r in range(k)]
        assert max(b - a for a, b in shards) == math.ceil(B0 / k) and sum(b - a for a, b in shards) == B0
    profile = load_yaml(str(ROOT / "profiles/transformer.yaml")).data
    cluster = load_yaml(str(ROOT / "clusters/paper-hardware.yaml")).data
    ref = spec_figures(profile, cluster, plan)
    for stage, compute in zip(plan["stages"], ref["compute_s"]):
        assert math.isclose(stage["compute_s"], compute, rel_tol=1e-9)


@pytest.mark.parametrize("command", ["validate", "check", "launch"])
def test_a_plan_with_more_replicas_than_samples_is_refused(tmp_path, command):
    out = tmp_path / "plan.yaml"
    args = [str(ROOT / "profiles/transformer.yaml"), str(ROOT / "clusters/paper-hardware.yaml")]
    assert CliRunner().invoke(app, ["plan", *args, "-s", "exact", "--out", str(out)]).exit_code == 0
    text = out.read_text()
    first = text.index("replicas: ")
    end = text.index("\n", first)
    out.write_text(text[:first] + "replicas: 40" + text[end:])
    how = {
        "validate": ["validate", str(out)],
        "check": ["check", str(out), "--profile", args[0], "--cluster", args[1]],
        "launch": ["launch", str(out), "--out-dir", str(tmp_path / "l"), "--map", "cpu=cpu", "--map", "v100=cuda"],
    }[command]
    result = CliRunner().invoke(app, how)
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    assert "stages[0].replicas" in said and "stage 0 has 40 replicas but a batch of 32 samples" in said
    assert "at most 32" in said


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
@settings(max_examples=150, **SETTINGS)
@given(st.integers(0, 2**32 - 1), st.integers(1, 5), st.sampled_from([2, 3, 5]), st.sampled_from([3, 8, 32]))
def test_one_type_pipelines_match_enumeration(seed, n, limit, B0):
    """One resource type: every plan of several stages shares its limit (the limit-aware DP then tracks
    no type but the capped one), and only the cuts into stages and the replicas differ."""
    from tests.helpers import random_instance

    arrays = list(random_instance(np.random.default_rng(seed), n, 1, max_limit=limit))
    arrays[4] = np.ones((n, 1), dtype=bool)
    arrays[6] = np.array([limit])
    target = 0.6 * limit * B0 / arrays[0].sum()
    for objective in ("cost", "time"):
        profile, cluster, plan, expected = _both(tuple(arrays), B0, target, None, objective)
        if plan is not None:
            figure, want = (plan.throughput, expected[1]) if objective == "time" else (plan.cost_usd, expected[0])
            assert math.isclose(figure, want, rel_tol=1e-9, abs_tol=1e-12)
