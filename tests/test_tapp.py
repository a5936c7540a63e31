"""The tapp scheduler: contiguous groups, masks, its scoring of known schedules, brute force and the CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from heterps_cli.cli.app import app
from heterps_cli.schedulers import TrainingOptions, solve, tapp
from tests.helpers import ROOT, instance_dicts, problem_from_dicts, random_instance
from tests.oracle import brute_force

QUICK = ["--steps", "15", "--batch", "16"]


def _sampled(seed: int, n: int, T: int, batch: int = 256, groups: int = 12):
    rng = np.random.default_rng(seed)
    arrays = random_instance(rng, n, T)
    problem = problem_from_dicts(*instance_dicts(*arrays))
    cfg = tapp.Config(groups=groups)
    torch.manual_seed(seed)
    kinds, numbers = tapp.encoding(problem)
    nets = tapp.Networks(numbers.shape[1], problem.n_types, cfg)
    with torch.no_grad():
        nn_bias = nets.partition[-1].bias
        nn_bias.fill_(0.0)  # an even chance of a new group at each layer: many groups, the hard case
        runnable = torch.from_numpy(problem.runnable)
        schedules, logp, _ = tapp._log_prob(
            nets, kinds, numbers, runnable, cfg, generator=torch.Generator().manual_seed(seed), batch=batch
        )
    return problem, nets, cfg, kinds, numbers, runnable, schedules, logp


@pytest.mark.parametrize("seed", range(4))
def test_groups_are_contiguous_and_masks_respected(seed):
    problem, _, cfg, _, _, runnable, schedules, _ = _sampled(seed, n=14, T=3, groups=4)
    s = schedules.numpy()
    assert problem.runnable[np.arange(problem.n_layers)[None, :], s].all()  # every layer on a type it runs on
    # the partition walk: group ids never decrease, and at most G groups open except where a mask forces one
    starts, free = tapp._partition(
        torch.full((problem.n_layers,), 0.5), runnable, cfg.groups, 64, torch.Generator().manual_seed(seed)
    )
    group = tapp._groups_of(starts).numpy()
    assert (np.diff(group, axis=1) >= 0).all() and (group[:, 0] == 0).all()
    forced = starts.numpy() & ~free.numpy()
    assert (group[:, -1] + 1 <= cfg.groups + forced[:, 1:].sum(axis=1)).all()
    for row in group:
        for k in range(row[-1] + 1):  # every group has a type all its layers can run on
            assert problem.runnable[row == k].all(axis=0).any()


def test_scoring_a_sampled_schedule_gives_its_sampling_probability():
    seed = 5
    problem, nets, cfg, kinds, numbers, runnable, schedules, logp = _sampled(seed, n=10, T=3, batch=64)
    with torch.no_grad():
        again, scored, _ = tapp._log_prob(nets, kinds, numbers, runnable, cfg, schedules=schedules)
        p_start = torch.sigmoid(nets.start_logits(nets.layers(kinds, numbers)))
    # the same generator state gives the partition the sampler walked
    starts, _ = tapp._partition(p_start, runnable, cfg.groups, 64, torch.Generator().manual_seed(seed))
    assert (again == schedules).all()
    # scoring takes a schedule's stages as its groups: where the sampler's groups were exactly
    # the stages (no two neighbouring groups on one type), both choices and probabilities agree
    s = schedules.numpy()
    stage_starts = np.concatenate([np.ones((len(s), 1), bool), s[:, 1:] != s[:, :-1]], axis=1)
    same = (starts.numpy() == stage_starts).all(axis=1)
    assert same.sum() >= 5
    assert torch.allclose(scored[same], logp[same], atol=1e-4)
    assert (scored[~same] < 0).all() and torch.isfinite(scored).all()


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tapp_finds_the_brute_force_fastest_plan_on_small_instances(seed):
    arrays = random_instance(np.random.default_rng(seed), 5, 2)
    profile, cluster = instance_dicts(*arrays)
    problem = problem_from_dicts(profile, cluster, objective="time")
    own = problem_from_dicts(profile, cluster, objective="time", maximal_stages=True)
    expected = brute_force(*arrays, 32, problem.work, objective="time", maximal=True)  # TAPP's own space
    plan = tapp.solve(own, seed=seed, options=TrainingOptions(steps=20, batch=16))
    assert expected is not None and plan.feasible
    assert math.isclose(plan.throughput, expected[1], rel_tol=1e-9)
    # in the whole space its polish also cuts and joins stages on one type, and schedulers.solve then
    # cuts its runs exactly: either can only help, up to the whole space's best
    cut = solve("tapp", problem, seed=seed, options=TrainingOptions(steps=20, batch=16))
    best = brute_force(*arrays, 32, problem.work, objective="time")
    assert expected[1] * (1 - 1e-9) <= cut.throughput <= best[1] * (1 + 1e-9)


@pytest.mark.parametrize("example", [pytest.param(e, marks=pytest.mark.slow) for e in ("vgg16", "transformer")])
def test_tapp_defaults_to_objective_time_on_the_bundled_examples(runner, example):
    profile = str(ROOT / f"profiles/{example}.yaml")
    cluster = str(ROOT / "clusters/three-type.yaml")
    result = runner.invoke(app, ["plan", profile, cluster, "--scheduler", "tapp", "--json", *QUICK])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["scheduler"] == "tapp" and plan["objective"] == "time" and plan["feasible"]
    exact = json.loads(
        runner.invoke(app, ["plan", profile, cluster, "-s", "exact", "--objective", "time", "--json"]).stdout
    )
    assert plan["throughput"] <= exact["throughput"] * (1 + 1e-9)


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
def test_same_seed_same_plan(runner):
    def run():
        result = runner.invoke(
            app,
            [
                "plan",
                str(ROOT / "profiles/ctr.yaml"),
                str(ROOT / "clusters/paper.yaml"),
                "-s",
                "tapp",
                "--seed",
                "3",
                "--json",
                *QUICK,
            ],
        )
        assert result.exit_code == 0, result.output
        plan = json.loads(result.stdout)
        plan.pop("solve_s")
        return plan

    assert run() == run()


def test_ctrl_c_stops_training_and_still_returns_the_best_plan(interrupt_evaluations):
    problem = problem_from_dicts(*instance_dicts(*random_instance(np.random.default_rng(5), 8, 2)), objective="time")
    interrupt_evaluations(4)  # the pool, then a few training batches
    plan = tapp.solve(problem, options=TrainingOptions(steps=50, batch=8))
    assert plan.feasible and any("interrupted" in note for note in plan.notes)


def test_time_limit_stops_training():
    problem = problem_from_dicts(*instance_dicts(*random_instance(np.random.default_rng(5), 8, 2)))
    plan = tapp.solve(problem, options=TrainingOptions(steps=10_000, batch=8, time_limit=0.5))
    assert plan.feasible and any("time limit" in note for note in plan.notes)
