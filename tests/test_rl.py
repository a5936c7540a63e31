"""The rl scheduler: its parts, and plans checked against brute force and the CLI."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from heterps_cli.cli.app import app
from heterps_cli.errors import InfeasibleError
from heterps_cli.plan import make_plan
from heterps_cli.problem import load_problem
from heterps_cli.schedulers import RLOptions, optimiser, rl, scoring
from tests.helpers import ROOT, instance_dicts, problem_from_dicts, random_instance, write_yaml
from tests.oracle import brute_force

CTR, PAPER = str(ROOT / "profiles/ctr.yaml"), str(ROOT / "clusters/paper.yaml")
QUICK = ["--steps", "15", "--batch", "16"]


def _problem(seed=0, n=6, T=3, **options):
    arrays = random_instance(np.random.default_rng(seed), n, T)
    return arrays, problem_from_dicts(*instance_dicts(*arrays), **options)


def test_features_have_a_fixed_width_for_any_depth():
    for n in (1, 5, 40):
        _, problem = _problem(n=n)
        feats = rl.layer_features(problem)
        assert feats.shape == (n, rl.n_features(problem.n_types)) and feats.dtype == np.float32
        assert np.isfinite(feats).all()


def test_sampling_respects_the_mask():
    arrays, problem = _problem(seed=3, n=12, T=3)
    policy = rl.Policy(rl.n_features(3), 3)
    feats, mask = torch.from_numpy(rl.layer_features(problem)), torch.from_numpy(problem.runnable)
    actions = policy.sample(feats, mask, 256, torch.Generator().manual_seed(0)).numpy()
    assert problem.runnable[np.arange(12)[None, :], actions].all()
    greedy = policy.sample(feats, mask, 1, torch.Generator(), greedy=True).numpy()
    assert problem.runnable[np.arange(12), greedy[0]].all()
    # a forbidden action has (numerically) no probability under the teacher-forced policy too
    bad_layer, bad_type = np.argwhere(~problem.runnable)[0]
    forced = torch.from_numpy(actions[:1].copy())
    forced[0, bad_layer] = int(bad_type)
    logp, _ = policy.log_prob(feats, mask, forced)
    assert logp.item() < -1e6


def test_the_segmented_training_pass_gives_the_same_values_and_gradients(monkeypatch):
    """Long models run the decoder a segment at a time with activation checkpointing; the
    log-probabilities, entropies and gradients must be those of one pass over all layers."""
    _, problem = _problem(seed=5, n=23, T=3)
    torch.manual_seed(0)
    policy = rl.Policy(rl.n_features(3), 3)
    feats, mask = torch.from_numpy(rl.layer_features(problem)), torch.from_numpy(problem.usable)
    actions = policy.sample(feats, mask, 6, torch.Generator().manual_seed(1))

    def pass_(segment: int):
        monkeypatch.setattr(rl, "SEGMENT_SAMPLES", segment)
        policy.zero_grad()
        logp, entropy = policy.log_prob(feats, mask, actions)
        (logp.mean() + 0.1 * entropy.mean()).backward()
        return logp.detach(), entropy.detach(), [p.grad.clone() for p in policy.parameters()]

    whole = pass_(10**9)
    for segment in (6, 6 * 5, 6 * 22):  # one layer at a time, 5 layers (a short last segment), 22 + 1
        logp, entropy, grads = pass_(segment)
        torch.testing.assert_close(logp, whole[0])
        torch.testing.assert_close(entropy, whole[1])
        for g, w in zip(grads, whole[2]):
            torch.testing.assert_close(g, w)


def test_the_own_adam_steps_exactly_as_torch_optim_adam():
    """The schedulers' Adam avoids torch.optim's 1.2 s import; it must move the weights as torch's does,
    bit for bit, including a parameter that has no gradient on some steps."""
    torch.manual_seed(3)
    ours, theirs = rl.Policy(rl.n_features(2), 2), rl.Policy(rl.n_features(2), 2)
    theirs.load_state_dict(ours.state_dict())
    mine, reference = optimiser.Adam(ours.parameters(), lr=3e-3), torch.optim.Adam(theirs.parameters(), lr=3e-3)
    for step in range(7):
        for net, opt in ((ours, mine), (theirs, reference)):
            opt.zero_grad()
            torch.manual_seed(step)
            used = [p for name, p in net.named_parameters() if step % 3 != 1 or name != "stay"]
            sum((p * torch.randn_like(p)).sum() for p in used).backward()
            opt.step()
    for a, b in zip(ours.parameters(), theirs.parameters()):
        assert torch.equal(a, b)


def _scored(problem, feasible, cost, throughput) -> scoring.Provisioned:
    B = len(feasible)
    return scoring.Provisioned(
        np.array(feasible),
        np.array(cost),
        np.array(throughput),
        np.zeros((B, problem.n_types)),
        np.ones((B, problem.n_layers)),
    )


def test_reward_to_go_is_the_cost_of_the_stages_a_layer_can_change():
    """Layer i's credit is the cost of layer i-1's stage and every later one, from the plan's own figures
    (price x replicas per stage, the plan's throughput); layer 0's is the whole reward; an infeasible
    plan gets its whole reward at every layer."""
    checked = 0
    for seed in range(6):
        _, problem = _problem(seed=seed, n=7, T=3)
        rng = np.random.default_rng(seed)
        schedules = scoring.random_schedules(problem, 40, rng)
        evaluate = scoring.Evaluator(problem)
        scores = evaluate(schedules)
        reference = scoring.Reference.of(scores)
        whole = scoring.rewards(problem, scores, reference)
        togo = scoring.rewards_to_go(problem, schedules, scores, reference, whole)
        np.testing.assert_allclose(togo[:, 0], whole, rtol=1e-12)
        for b, row in enumerate(schedules):
            if not scores.feasible[b]:
                assert (togo[b] == whole[b]).all()
                continue
            plan = make_plan(problem, row, scores.replicas[b][scores.replicas[b] > 0], scheduler="test")
            price = dict(zip(problem.types, problem.prices))
            for i in range(1, problem.n_layers):
                rate = sum(price[s.resource] * s.replicas for s in plan.stages if s.last >= i - 1)
                cost = problem.work / plan.throughput / 3600 * rate
                assert togo[b, i] == pytest.approx(-min(cost / reference.cost, scoring.CAP), rel=1e-9)
                checked += 1
    assert checked > 100


def test_ranks_per_layer_are_each_columns_ranks_with_ties_shared():
    rng = np.random.default_rng(0)
    r = rng.integers(0, 4, size=(9, 5)).astype(float)
    by_column = scoring.rank_advantage(r)
    for j in range(5):
        np.testing.assert_array_equal(by_column[:, j], scoring.rank_advantage(r[:, j]))
        ranks = [(r[:, j] < x).sum() + ((r[:, j] == x).sum() + 1) / 2 for x in r[:, j]]  # 1-based, ties averaged
        expected = (np.array(ranks) - np.mean(ranks)) / (np.std(ranks) + 1e-8)
        np.testing.assert_allclose(by_column[:, j], expected, rtol=1e-12)


def test_per_layer_log_probabilities_sum_to_the_schedules():
    _, problem = _problem(seed=2, n=9, T=3)
    policy = rl.Policy(rl.n_features(3), 3)
    feats, mask = torch.from_numpy(rl.layer_features(problem)), torch.from_numpy(problem.usable)
    actions = policy.sample(feats, mask, 5, torch.Generator().manual_seed(0))
    per_layer, _ = policy.log_prob(feats, mask, actions, per_layer=True)
    assert per_layer.shape == (5, 9)
    torch.testing.assert_close(per_layer.sum(dim=1), policy.log_prob(feats, mask, actions)[0])


def test_rewards_order_cheaper_feasible_dearer_feasible_infeasible():
    _, problem = _problem(min_throughput=100.0)
    scored = _scored(problem, [True, True, False, False], [10.0, 12.0, 5.0, 5.0], [150.0, 120.0, 90.0, 50.0])
    r = scoring.rewards(problem, scored, scoring.Reference(cost=10.0, throughput=150.0))
    assert r[0] > r[1] > r[2] > r[3], r  # and the infeasible one that misses more is worse


def test_time_rewards_prefer_faster_then_cheaper():
    _, problem = _problem(objective="time")
    scored = _scored(problem, [True, True, True, False], [10.0, 9.0, 1.0, 1.0], [200.0, 200.0, 199.0, 500.0])
    scored.used[3] = problem.limits + 1  # the fastest one breaks a limit
    r = scoring.rewards(problem, scored, scoring.Reference(cost=5.0, throughput=200.0))
    assert r[1] > r[0] > r[2] > r[3], r


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rl_finds_the_brute_force_optimum_on_small_instances(seed):
    arrays, _ = _problem(seed=seed, n=5, T=2)
    profile, cluster = instance_dicts(*arrays, min_throughput=32 / arrays[0].min(axis=1).sum() * 0.5)
    problem = problem_from_dicts(profile, cluster)
    expected = brute_force(*arrays, 32, problem.work, min_throughput=problem.min_throughput)
    plan = rl.solve(problem, seed=seed, options=RLOptions(steps=30, batch=16))
    assert expected is not None and plan.feasible
    assert math.isclose(plan.cost_usd, expected[0], rel_tol=1e-9)


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
def test_same_seed_same_plan(runner):
    def run():
        result = runner.invoke(app, ["plan", CTR, PAPER, "--seed", "7", "--json", *QUICK])
        assert result.exit_code == 0, result.output
        plan = json.loads(result.stdout)
        plan.pop("solve_s")
        return plan

    assert run() == run()


def test_rl_is_the_default_and_its_plan_checks_out(runner):
    result = runner.invoke(app, ["plan", CTR, PAPER, "--json", *QUICK])
    plan = json.loads(result.stdout)
    assert plan["scheduler"] == "rl" and plan["feasible"] and plan["optimal"] is None
    assert plan["evaluations"] > 0


@pytest.mark.slow
def test_policy_out_then_in_warm_starts_a_deeper_model(runner, tmp_path, ctr_policy):
    policy = ctr_policy
    # the same model with one more dense layer: the policy still applies (same cluster types)
    text = (
        Path(CTR)
        .read_text()
        .replace(
            "  - name: fc4\n",
            "  - name: fc3b\n    type: fc\n    input_size: 1024\n"
            "    weight_size: 263168\n    times:\n"
            "      cpu: {oct: 0.0132, odt: 0.0004, alpha: 0.99, beta: 0.0}\n"
            "      v100: {oct: 8e-05, odt: 5e-05, alpha: 0.6, beta: 0.0}\n"
            "  - name: fc4\n",
            1,
        )
    )
    deeper = tmp_path / "ctr-deeper.yaml"
    deeper.write_text(text)
    result = runner.invoke(app, ["plan", str(deeper), PAPER, "--policy-in", str(policy), "--json", *QUICK])
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.stdout)["stages"][-1]["layers"]) >= 1


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
def test_saving_the_policy_does_not_change_the_plan(tmp_path):
    _, problem = _problem(seed=3, n=8)
    quick = dict(steps=15, batch=16)
    plain = rl.solve(problem, seed=1, options=RLOptions(**quick))
    saved = rl.solve(problem, seed=1, options=RLOptions(**quick, policy_out=tmp_path / "p.pt"))
    assert (tmp_path / "p.pt").exists()
    assert [(s.first, s.last, s.resource, s.replicas) for s in saved.stages] == [
        (s.first, s.last, s.resource, s.replicas) for s in plain.stages
    ]


def test_nearby_models_differ_by_one_layer_and_bounded_times():
    _, problem = _problem(seed=4, n=10)
    rng = np.random.default_rng(0)
    depths = set()
    for _ in range(20):
        variant, index = rl.nearby(problem, rng, 0.1)
        depths.add(variant.n_layers)
        assert abs(variant.n_layers - problem.n_layers) == 1 and len(index) == variant.n_layers
        assert np.all(np.diff(index) >= 0)  # the chain keeps its order
        assert (variant.runnable == problem.runnable[index]).all()
        ratio = variant.oct[variant.runnable] / problem.oct[index][variant.runnable]
        assert ratio.min() >= 1 / 1.1 - 1e-12 and ratio.max() <= 1.1 + 1e-12
        assert variant.layer_kinds == tuple(problem.layer_kinds[i] for i in index)
    assert depths == {9, 11}


@pytest.mark.slow
def test_policy_for_other_types_is_refused(runner, tmp_path, ctr_policy):
    policy = ctr_policy
    result = runner.invoke(
        app, ["plan", CTR, str(ROOT / "clusters/three-type.yaml"), "--policy-in", str(policy), *QUICK]
    )
    assert result.exit_code == 2
    assert "trained for resource types ['cpu', 'v100']" in result.stderr
    (tmp_path / "junk.pt").write_bytes(b"not a policy")
    result = runner.invoke(app, ["plan", CTR, PAPER, "--policy-in", str(tmp_path / "junk.pt"), *QUICK])
    assert result.exit_code == 2 and "not a heterps policy file" in result.stderr


def test_ctrl_c_returns_the_best_plan_so_far(interrupt_evaluations):
    _, problem = _problem(seed=4, n=8, T=2)
    interrupt_evaluations(4)  # the pool, then a few training batches
    plan = rl.solve(problem, options=RLOptions(steps=50, batch=8))
    assert plan.feasible and any("interrupted" in note for note in plan.notes)


def test_time_limit_stops_training():
    _, problem = _problem(seed=5, n=8, T=2)
    plan = rl.solve(problem, options=RLOptions(steps=10_000, batch=8, time_limit=0.5))
    assert plan.feasible and any("time limit" in note for note in plan.notes)


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
def test_no_feasible_plan_exits_3_with_the_reachable_figure(runner, tmp_path):
    arrays = random_instance(np.random.default_rng(6), 4, 2)
    profile, cluster = instance_dicts(*arrays, min_throughput=1e12)
    p, c = write_yaml(tmp_path / "p.yaml", profile), write_yaml(tmp_path / "c.yaml", cluster)
    result = runner.invoke(app, ["plan", p, c, *QUICK])
    assert result.exit_code == 3 and "fastest possible plan reaches" in result.stderr
    with pytest.raises(InfeasibleError):
        rl.solve(problem_from_dicts(profile, cluster), options=RLOptions(steps=5, batch=4))


def test_local_moves_and_kicks_keep_layers_on_types_they_can_run():
    from heterps_cli.schedulers.local import kick, neighbours, wide_neighbours

    _, problem = _problem(seed=8, n=10, T=3)
    rng = np.random.default_rng(0)
    schedule = scoring.heuristic_schedules(problem)[0]
    for rows in (
        neighbours(problem, schedule),
        wide_neighbours(problem, schedule),
        np.stack([kick(problem, schedule, rng) for _ in range(50)]),
    ):
        assert len(rows) > 0
        assert problem.runnable[np.arange(10)[None, :], rows % problem.n_types].all()  # stage labels: types
    moved = neighbours(problem, schedule)
    assert not (moved == schedule).all(axis=1).any(), "every neighbour differs from the schedule"


@pytest.mark.parametrize(
    "tamper,message",
    [
        (lambda d: d.pop("types"), "expected the keys"),
        (lambda d: d.update(hidden=10**6), "hidden must be a whole number from 1 to 1024"),
        (lambda d: d.update(features=3), "features must be"),
        (lambda d: d["state"].update(stay=torch.zeros(3)), "weight stay should be a float tensor of shape ()"),
        (lambda d: d["state"]["head.weight"].fill_(float("nan")), "weight head.weight holds NaN or infinite values"),
        # Finite in float32, yet the probabilities became nan: an internal error once.
        (lambda d: d["state"]["head.weight"].fill_(3e38), "weight head.weight reaches 3e+38, past 10000"),
        (lambda d: d.update(state=[1, 2]), "the network's weights are not those of a heterps policy"),
    ],
)
def test_a_tampered_policy_file_is_refused_before_a_network_is_built(runner, tmp_path, tamper, message):
    problem = load_problem(CTR, PAPER)
    policy = tmp_path / "policy.pt"
    rl.save_policy(rl.Policy(rl.n_features(problem.n_types), problem.n_types, 8), problem, policy)
    saved = torch.load(policy, weights_only=True)
    tamper(saved)
    torch.save(saved, policy)
    result = runner.invoke(app, ["plan", CTR, PAPER, "--policy-in", str(policy), "--steps", "1"])
    assert result.exit_code == 2, result.output
    assert f"policy.pt: not a heterps policy file: {message}" in result.stderr, result.stderr


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
def test_a_stalled_agent_restarts_and_the_run_stays_deterministic(monkeypatch):
    """On a small model the agent's best comes within a few steps; 20 steps later a new agent starts
    (from a new pool), at most once per 20 steps, and a rerun with the seed gives the same plan."""
    arrays, problem = _problem(seed=2, n=5, T=2)

    def run() -> tuple[list[str], list[float], float]:
        messages: list[str] = []
        curve: list[float] = []
        plan = rl.solve(
            problem,
            seed=4,
            options=RLOptions(steps=70, batch=8),
            progress=lambda message, **_: messages.append(message),
            on_step=lambda step, key: curve.append(key),
        )
        return messages, curve, plan.cost_usd

    messages, curve, cost = run()
    restarts = sum("starting a new agent" in m for m in messages)
    assert 1 <= restarts <= 70 // rl.Config().restart_after
    assert curve == sorted(curve, reverse=True), "the policy's best never gets worse across a restart"
    assert run() == (messages, curve, cost)
    expected = brute_force(*arrays, 32, problem.work, min_throughput=problem.min_throughput)
    assert expected is not None and math.isclose(cost, expected[0], rel_tol=1e-9)

    original = rl.Config
    monkeypatch.setattr(rl, "Config", lambda: dataclasses.replace(original(), restart_after=0))
    assert not any("starting a new agent" in m for m in run()[0])
