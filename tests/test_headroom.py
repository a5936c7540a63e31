"""The rl policy's limit mask (schedulers/headroom.py): sound against brute force, and what sampling uses."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from heterps_cli.schedulers import rl
from heterps_cli.schedulers.features import layer_features
from heterps_cli.schedulers.headroom import Headroom, masks
from tests.helpers import instance_dicts, problem_from_dicts, random_hardware, random_instance
from tests.oracle import brute_force, feasible_plans


def _given(problem, schedules: np.ndarray) -> np.ndarray:
    """``[B]``: was every layer's own type among those Headroom allowed it, replaying the schedules?"""
    room = Headroom(problem, len(schedules))
    for layer in range(problem.n_layers):
        room.allowed(layer)
        room.take(layer, schedules[:, layer])
    return room.seen[np.arange(len(schedules))[:, None], np.arange(problem.n_layers)[None, :], schedules].all(axis=1)


def _tight(seed: int, n: int = 6, T: int = 3, hardware: bool = False):
    """A random instance whose target is 90% of its fastest plan within the limits, so that they bind."""
    rng = np.random.default_rng(seed)
    arrays = random_instance(rng, n, T, max_limit=3)
    hw = random_hardware(rng, arrays[0]) if hardware else None
    fastest = brute_force(*arrays, 32, 1.0, objective="time", hardware=hw, maximal=True)
    if fastest is None:
        return None
    profile, cluster = instance_dicts(*arrays, min_throughput=0.9 * fastest[1], hardware=hw)
    return arrays, hw, problem_from_dicts(profile, cluster)


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
@pytest.mark.parametrize("hardware", [False, True])
def test_no_schedule_with_a_feasible_plan_is_ever_masked(hardware):
    """Every schedule of small random instances, feasibility decided by enumerating every replica
    vector (tests/oracle/, docs/spec.md's formulas): a schedule with a feasible plan is allowed at every
    layer. And the mask is not empty talk: it rules out some schedules that have none."""
    masked_infeasible = checked = 0
    for seed in range(10):
        made = _tight(seed, hardware=hardware)
        if made is None:
            continue
        arrays, hw, problem = made
        schedules = np.array(list(itertools.product(range(problem.n_types), repeat=problem.n_layers)))
        schedules = schedules[problem.runnable[np.arange(problem.n_layers)[None, :], schedules].all(axis=1)]
        allowed = _given(problem, schedules)
        for schedule, ok in zip(schedules, allowed):
            costs, _ = feasible_plans(
                *arrays,
                32,
                1.0,
                min_throughput=problem.min_throughput,
                schedules=[tuple(schedule)],
                hardware=hw,
                maximal=True,
            )
            if len(costs):
                assert ok, (seed, schedule)
                checked += 1
            else:
                masked_infeasible += not ok
    assert checked > 20 and masked_infeasible > 20


def test_nothing_is_masked_when_no_limit_can_bind():
    arrays = random_instance(np.random.default_rng(3), 8, 3)
    arrays = (*arrays[:6], np.full(3, 10_000))
    profile, cluster = instance_dicts(*arrays, min_throughput=1.0)
    problem = problem_from_dicts(profile, cluster)
    schedules = np.random.default_rng(0).integers(0, 3, (200, 8))
    expected = np.broadcast_to(problem.usable, (200, 8, 3))
    assert (masks(problem, schedules) == (expected | (np.arange(3) == schedules[..., None]))).all()


def test_the_policy_samples_within_the_mask_and_scores_it_teacher_forced_alike():
    """What sampling masked is what the teacher-forced log-probability masks (replayed from the
    actions), so REINFORCE's gradient is that of the distribution sampled; a schedule the mask would
    forbid (an imitation target) still gets a finite log-probability."""
    made = _tight(1, n=7)
    assert made is not None
    problem = made[2]
    feats, usable = torch.from_numpy(layer_features(problem)), torch.from_numpy(problem.usable)
    torch.manual_seed(0)
    policy = rl.Policy(feats.shape[1], problem.n_types)
    room = Headroom(problem, 256)
    actions = policy.sample(feats, usable, 256, torch.Generator().manual_seed(0), room=room)
    replayed = masks(problem, actions.numpy())
    assert (replayed == room.seen).all()
    assert room.seen[np.arange(256)[:, None], np.arange(7)[None, :], actions.numpy()].all()
    agent = rl.Agent(policy, problem, feats, usable)
    with torch.no_grad():
        sampled = agent.log_prob(actions)
        direct = policy.log_prob(feats, torch.from_numpy(room.seen), actions)[0]
        assert torch.allclose(sampled, direct)
        every = np.array(list(itertools.product(range(problem.n_types), repeat=7)))
        every = every[problem.runnable[np.arange(7)[None, :], every].all(axis=1)]
        forbidden = every[~_given(problem, every)][:5]
        assert len(forbidden) == 5
        assert torch.isfinite(agent.log_prob(torch.from_numpy(forbidden))).all()
