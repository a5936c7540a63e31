"""What keeps long models (thousands of layers) in bounds: the evaluator's cache, the local
search's budget and the default batch. Each bound is shrunk here so that a small model meets it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from heterps_cli.cli.app import app
from heterps_cli.costmodel import provision
from heterps_cli.problem import load_problem
from heterps_cli.schedulers import local, scoring
from heterps_cli.schedulers.names import BATCH_LAYERS, DEFAULT_BATCH, MIN_BATCH, default_batch
from heterps_cli.stages import split_stages

INSTANCES = Path(__file__).resolve().parents[1] / "benchmarks" / "instances"
PROFILE, CLUSTER = str(INSTANCES / "chain16x3.profile.yaml"), str(INSTANCES / "chain16x3.cluster.yaml")


def test_a_full_cache_forgets_its_oldest_schedules_and_scores_them_again(monkeypatch):
    problem = load_problem(PROFILE, CLUSTER)
    rows = scoring.random_schedules(problem, 40, np.random.default_rng(0))
    rows = np.unique(rows, axis=0)
    evaluate = scoring.Evaluator(problem)
    evaluate(rows[:1])
    monkeypatch.setattr(scoring, "CACHE_BYTES", 5 * evaluate.bytes)  # room for about five schedules
    first = evaluate(rows)
    assert len(evaluate.cache) <= 5 and evaluate.bytes <= scoring.CACHE_BYTES
    assert evaluate.evaluations == len(rows)
    again = evaluate(rows[:3])  # long since evicted: scored again, and counted
    assert evaluate.evaluations == len(rows) + 3
    truth = provision(problem, split_stages(problem, rows))
    for scored in (first, again):
        k = len(scored.cost)
        assert np.array_equal(scored.cost, truth.cost[:k]) and np.array_equal(scored.feasible, truth.feasible[:k])
        assert np.array_equal(scored.used, truth.used[:k])
    keys, history = evaluate.history()  # only what the cache still holds, oldest first
    assert keys == list(evaluate.cache) and len(history.cost) == len(keys)


def test_the_local_search_stops_at_its_budget_and_the_plan_says_so(monkeypatch, runner):
    problem = load_problem(PROFILE, CLUSTER)
    monkeypatch.setattr(local, "SEARCH_CELLS", 40 * problem.n_layers)  # 40 schedules
    result = runner.invoke(app, ["plan", PROFILE, CLUSTER, "--scheduler", "greedy", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["feasible"]
    assert plan["evaluations"] <= 40 + 200  # the budget is checked between batches of moves
    assert f"the local search stopped at its budget, 40 schedules scored on {problem.n_layers} layers" in " ".join(
        plan["notes"]
    )
    monkeypatch.undo()
    unbounded = json.loads(runner.invoke(app, ["plan", PROFILE, CLUSTER, "--scheduler", "greedy", "--json"]).stdout)
    assert unbounded["evaluations"] > plan["evaluations"]
    assert not any("budget" in note for note in unbounded["notes"])


def test_the_default_batch_shrinks_with_depth_but_not_below_its_floor():
    assert default_batch(1) == default_batch(BATCH_LAYERS // DEFAULT_BATCH) == DEFAULT_BATCH
    assert default_batch(2 * BATCH_LAYERS // DEFAULT_BATCH) == DEFAULT_BATCH // 2
    assert default_batch(10**6) == MIN_BATCH
    depths = range(1, 20_000, 37)
    assert all(default_batch(a) >= default_batch(b) for a, b in zip(depths, depths[1:]))
