"""The vectorised cost model and exact provisioning, against docs/spec.md recomputed by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from heterps_cli.costmodel import provision, score
from heterps_cli.formulas import stage_throughput
from heterps_cli.objective import Objective
from heterps_cli.plan import make_plan
from heterps_cli.replica_counts import min_replicas
from heterps_cli.stages import split_stages
from tests.helpers import instance_dicts, problem_from_dicts, random_instance
from tests.oracle import brute_force, spec_figures


def _random_schedules(rng, runnable, count):
    n, T = runnable.shape
    out = np.zeros((count, n), dtype=np.int64)
    for layer in range(n):
        allowed = np.flatnonzero(runnable[layer])
        out[:, layer] = rng.choice(allowed, count)
    return out


@pytest.mark.parametrize("seed", range(10))
def test_score_matches_spec_for_a_batch(seed):
    rng = np.random.default_rng(seed)
    n, T = int(rng.integers(1, 12)), int(rng.integers(1, 5))
    arrays = random_instance(rng, n, T, max_limit=50)
    profile, cluster = instance_dicts(*arrays, samples=3e7, min_throughput=0.0)
    problem = problem_from_dicts(profile, cluster)
    scheds = _random_schedules(rng, arrays[4], 64)
    stages = split_stages(problem, scheds)
    reps = np.where(stages.valid, rng.integers(1, 9, stages.valid.shape), 0)
    sc = score(problem, stages, reps)
    for b in range(len(scheds)):
        plan = make_plan(problem, scheds[b], reps[b][stages.valid[b]], scheduler="test")
        ref = spec_figures(profile, cluster, plan.to_dict())
        assert math.isclose(sc.throughput[b], ref["throughput"], rel_tol=1e-12)
        assert math.isclose(sc.cost[b], ref["cost_usd"], rel_tol=1e-12, abs_tol=1e-15)
        assert math.isclose(plan.time_s, ref["time_s"], rel_tol=1e-12)
        assert [s.replicas for s in plan.stages] == list(reps[b][stages.valid[b]])
        assert plan.schedule == [problem.types[t] for t in scheds[b]]
        within = all(ref["resources"][t] <= cluster["resources"][t]["limit"] for t in ref["resources"])
        assert bool(sc.within_limits[b]) == within


def test_stages_are_maximal_runs():
    arrays = random_instance(np.random.default_rng(0), 6, 3)
    problem = problem_from_dicts(*instance_dicts(*arrays))
    stages = split_stages(problem, np.array([[0, 0, 1, 1, 1, 0], [2, 2, 2, 2, 2, 2]]))
    assert stages.valid.sum(axis=1).tolist() == [3, 1]
    assert stages.first[0, :3].tolist() == [0, 2, 5] and stages.last[0, :3].tolist() == [1, 4, 5]
    assert stages.type[0, :3].tolist() == [0, 1, 0]


def test_min_replicas_is_the_smallest_sufficient_count():
    rng = np.random.default_rng(1)
    sc, pc, sd, pd = (rng.uniform(0, 0.5, 2000) * (rng.random(2000) > 0.1) for _ in range(4))
    pc = pc + 1e-3
    target = rng.uniform(1, 500, 2000)
    k = min_replicas(sc, pc, sd, pd, 32, target)
    for i in range(2000):

        def thr(kk, i=i):
            return stage_throughput(sc[i], pc[i], sd[i], pd[i], 32, kk)

        if np.isfinite(k[i]):
            assert thr(k[i]) >= target[i] and (k[i] == 1 or thr(k[i] - 1) < target[i])
        else:
            assert thr(1e12) < target[i]


@pytest.mark.parametrize("objective", ["cost", "time"])
@pytest.mark.parametrize("seed", range(12))
def test_provision_matches_brute_force_for_fixed_schedules(objective, seed):
    rng = np.random.default_rng(100 + seed)
    n, T = int(rng.integers(1, 7)), int(rng.integers(2, 4))
    arrays = random_instance(rng, n, T, max_limit=6)
    reference = 32 / arrays[0].min(axis=1).sum()
    min_thr = float(rng.choice([0.0, 0.3, 1.0])) * reference
    profile, cluster = instance_dicts(*arrays, min_throughput=min_thr)
    problem = problem_from_dicts(profile, cluster, objective=objective)
    scheds = _random_schedules(rng, arrays[4], 12)
    scores = provision(problem, split_stages(problem, scheds))
    for b, sched in enumerate(scheds):
        expected = brute_force(
            *arrays,
            32,
            problem.work,
            min_throughput=min_thr,
            objective=objective,
            schedules=[tuple(sched)],
            maximal=True,
        )
        assert bool(scores.feasible[b]) == (expected is not None)
        if expected is None:
            continue
        assert math.isclose(scores.cost[b], expected[0], rel_tol=1e-9, abs_tol=1e-12)
        if objective == "time":
            assert math.isclose(scores.throughput[b], expected[1], rel_tol=1e-9)


def test_infeasible_schedules_get_the_fastest_counts_the_limits_allow():
    arrays = random_instance(np.random.default_rng(5), 4, 2, max_limit=4)
    profile, cluster = instance_dicts(*arrays, min_throughput=1e12)
    problem = problem_from_dicts(profile, cluster)
    scheds = _random_schedules(np.random.default_rng(0), arrays[4], 8)
    scores = provision(problem, split_stages(problem, scheds))
    fastest = provision(problem.replace(objective=Objective.TIME, min_throughput=0.0), split_stages(problem, scheds))
    assert not scores.feasible.any()
    np.testing.assert_allclose(scores.throughput, fastest.throughput)


@pytest.mark.parametrize("seed", range(4))
def test_the_walks_shortcuts_change_no_answer(seed, monkeypatch):
    """provision seeds long walks with a good plan and steps between closed forms by adding a replica
    to each bottleneck stage: the replicas are those of the plain walk (closed form at every step, no
    seed), on limits generous enough for walks of many plans, under both objectives."""
    from heterps_cli import costmodel

    rng = np.random.default_rng(300 + seed)
    n, T = 12, 3
    arrays = random_instance(rng, n, T, max_limit=40)
    reference = 32 / arrays[0].min(axis=1).sum()
    profile, cluster = instance_dicts(*arrays, min_throughput=float(rng.choice([0.0, 0.5, 2.0])) * reference)
    problem = problem_from_dicts(profile, cluster)
    stages = split_stages(problem, _random_schedules(rng, arrays[4], 400))
    capped = problem.replace(objective=Objective.TIME, max_cost=float(np.median(provision(problem, stages).cost)))
    answers = [provision(p, stages).replicas for p in (problem, capped)]
    monkeypatch.setattr(costmodel, "SEED_AFTER", 10**9)
    monkeypatch.setattr(costmodel, "CLOSED_EVERY", 1)
    for p, shortcut in zip((problem, capped), answers):
        np.testing.assert_array_equal(shortcut, provision(p, stages).replicas)
    assert (answers[0].sum(axis=1) > 2 * stages.valid.sum(axis=1)).any(), "some walks were long"
