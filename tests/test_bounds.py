"""The bounds that need no search (heterps_cli.bounds): the one a plan answered without the exact solver is
proven within, and the micro-batch's pace ceiling that lets a plan skip a micro-batch; never past the
optimum that brute-force enumeration finds, on small instances of every section."""

from __future__ import annotations

import json

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from heterps_cli.bounds import bound, least_work, pace_ceiling
from heterps_cli.cli.app import app
from tests.helpers import problem_from_dicts, write_yaml
from tests.oracle import pipeline_optimum, pipeline_optimum_on_nodes
from tests.strategies import SETTINGS
from tests.test_mixed import brute_force as mixed_optimum
from tests.test_mixed import mixable
from tests.test_pipeline import pipelined
from tests.test_tensor_parallel import sharded, sharded_on_nodes


def _holds(profile, cluster, objective, optimum) -> None:
    problem = problem_from_dicts(profile, cluster, objective=objective)
    found = bound(problem)
    if optimum is None:
        return  # no plan: any bound holds
    assert found is not None
    cost, throughput = optimum
    if objective == "time":
        assert found >= throughput * (1 - 1e-9)
    else:
        assert found <= cost * (1 + 1e-9)


@settings(max_examples=40, **SETTINGS)
@given(st.one_of(pipelined(), sharded()), st.sampled_from(["cost", "time"]))
def test_no_plan_beats_the_bound(inst, objective):
    profile, cluster = inst
    floor = profile["job"]["min_throughput"]
    _holds(profile, cluster, objective, pipeline_optimum(profile, cluster, objective, floor))


@pytest.mark.slow
@settings(max_examples=40, **SETTINGS)
@given(sharded_on_nodes(), st.sampled_from(["cost", "time"]))
def test_no_plan_on_whole_nodes_beats_the_bound(inst, objective):
    profile, cluster = inst
    floor = profile["job"]["min_throughput"]
    _holds(profile, cluster, objective, pipeline_optimum_on_nodes(profile, cluster, objective, floor))


def test_least_work_is_the_least_time_per_sample_over_sizes_and_degrees():
    layer = {"name": "a", "type": "fc", "input_size": 1.0, "weight_size": 8.0, "tp": {2: {"weight_size": 4.0}}}
    times = {"oct": 4.0, "odt": 0.0, "alpha": 1.0, "beta": 0.0, "batches": {8: {"oct": 6.0, "odt": 0.0}}}
    times["tp"] = {2: {"oct": 1.0, "odt": 0.0}}  # 2 units x 1 s for 4 samples: 0.5 s a sample
    profile = {"model": "m", "batch_size": 4, "job": {"samples": 8.0, "global_batch": 8}}
    profile["layers"] = [layer | {"times": {"gpu": times}}]
    cluster = {"cluster": "c", "resources": {"gpu": {"price": 1.0, "limit": 4}}}
    work = least_work(problem_from_dicts(profile, cluster))
    assert work[0, 0] == pytest.approx(min(4.0 / 4, 6.0 / 8, 2 * 1.0 / 4))


def _within_the_ceiling(profile, cluster, optimum) -> None:
    problem = problem_from_dicts(profile, cluster, objective="time", micro_batch=profile["batch_size"])
    if optimum is not None:
        assert optimum[1] <= pace_ceiling(problem) * (1 + 1e-9)


@settings(max_examples=60, **SETTINGS)
@given(st.one_of(pipelined(batches=(1, 2, 3)), pipelined(), sharded()))
def test_no_plan_passes_the_pace_ceiling(inst):
    """Every replica trains a sample of each micro-batch: no plan is faster (micro-batches of 1-3 samples
    among them, where the replicas a stage may take bind)."""
    profile, cluster = inst
    _within_the_ceiling(profile, cluster, pipeline_optimum(profile, cluster, "time", 0.0))


@settings(max_examples=30, **SETTINGS)
@given(mixable())
def test_no_mixed_plan_passes_the_pace_ceiling(inst):
    profile, cluster = inst
    _within_the_ceiling(profile, cluster, mixed_optimum(profile, cluster))


def paced(tmp_path, alpha: float = 1.0):
    """One layer on one type measured at 1 and 8 samples (global batch 8): with ``alpha`` 1 and nothing to
    synchronise, 8 replicas each training a sample of micro-batch 8 reach the ceiling exactly."""
    times = {"oct": 8.0, "odt": 0.0, "alpha": alpha, "beta": 0.0, "batches": {1: {"oct": 8.0 - 7 * alpha, "odt": 0.0}}}
    layer = {"name": "l", "type": "fc", "input_size": 1.0, "weight_size": 1.0, "times": {"gpu": times}}
    profile = {"model": "m", "batch_size": 8, "job": {"samples": 64.0, "global_batch": 8}, "layers": [layer]}
    cluster = {"cluster": "c", "resources": {"gpu": {"price": 1.0, "limit": 8}}}
    return write_yaml(tmp_path / "p.yaml", profile), write_yaml(tmp_path / "c.yaml", cluster)


def test_the_pace_ceiling_is_reached_where_nothing_else_slows_a_plan(tmp_path):
    profile, cluster = paced(tmp_path)
    args = ["plan", profile, cluster, "-s", "exact", "--objective", "time", "--json"]
    done = CliRunner().invoke(app, [*args, "--micro-batch", "8"])
    assert done.exit_code == 0, done.output
    problem = problem_from_dicts(yaml.safe_load(open(profile)), yaml.safe_load(open(cluster)), objective="time")
    assert json.loads(done.output)["throughput"] == pytest.approx(pace_ceiling(problem.at_micro_batch(8)))
    assert pace_ceiling(problem.at_micro_batch(8)) == pytest.approx(8 * 8 / 8.0)


@pytest.mark.parametrize(
    "extra", [[], ["--mixed-stages"], ["-s", "rl"], ["--objective", "cost", "--min-throughput", "1"]]
)
def test_a_micro_batch_no_plan_can_win_is_not_searched_and_the_note_says_so(tmp_path, extra):
    """Half the layer's time is serial: a replica of micro-batch 1 takes 4.5 s a sample, so no plan there
    passes 0.22 samples/s, while micro-batch 8 reaches 1.78 (8 replicas of one sample, 4.5 s a micro-batch)."""
    profile, cluster = paced(tmp_path, alpha=0.5)
    args = ["plan", profile, cluster, "-s", "exact", "--objective", "time", "--json", *extra]
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 0, done.output
    plan = json.loads(done.output)
    chosen = next(note for note in plan["notes"] if "micro-batch 8 chosen" in note)
    assert plan["batch_size"] == 8
    if "cost" in extra:  # none at micro-batch 1 reaches the floor of 1 sample/s
        assert "1: no plan" in chosen
        return
    assert plan["throughput"] == pytest.approx(8 / 4.5) and "1: none as fast" in chosen
    alone = CliRunner().invoke(app, [*args, "--micro-batch", "1"])  # asked alone, it has a plan, slower
    assert alone.exit_code == 0 and json.loads(alone.output)["throughput"] == pytest.approx(1 / 4.5)


def test_the_pace_ceiling_counts_the_boundary_a_pipeline_stage_waits_for(tmp_path):
    """Two layers of 1 s a micro-batch of 8 each (a sample a replica), their boundary 16 s a replica away
    over a 1 Gb/s link: no plan cuts there, so the ceiling is one stage's 8 samples in 2 s, which 8 replicas
    reach, where each layer's pace alone would allow 8."""
    times = {"oct": 8.0, "odt": 0.0, "alpha": 1.0, "beta": 0.0, "batches": {1: {"oct": 1.0, "odt": 0.0}}}
    layers = [
        {"name": f"l{i}", "type": "fc", "input_size": 1e9, "weight_size": 1.0, "times": {"gpu": times}} for i in (0, 1)
    ]
    profile = {"model": "m", "batch_size": 8, "job": {"samples": 64.0, "global_batch": 8}, "layers": layers}
    cluster = {"cluster": "c", "resources": {"gpu": {"price": 1.0, "limit": 16, "bandwidth_gbps": 1.0}}}
    problem = problem_from_dicts(profile, cluster, objective="time").at_micro_batch(8)
    assert pace_ceiling(problem) == pytest.approx(8 / 2.0)
    args = ["plan", write_yaml(tmp_path / "p.yaml", profile), write_yaml(tmp_path / "c.yaml", cluster)]
    done = CliRunner().invoke(app, [*args, "-s", "exact", "--objective", "time", "--micro-batch", "8", "--json"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.output)["throughput"] == pytest.approx(pace_ceiling(problem))


def test_the_pace_ceiling_is_reached_where_the_best_plan_cuts_at_a_boundary(tmp_path):
    """Two layers of 1 s a sample on one replica (micro-batch 1, 1,000 a step), their boundary 0.5 s away:
    two stages of 1.5 s each beat one of 2 s, and reach the ceiling but for the pipeline's fill and drain."""
    times = {"oct": 1.0, "odt": 0.0, "alpha": 1.0, "beta": 0.0}
    layers = [
        {"name": f"l{i}", "type": "fc", "input_size": 3.125e7, "weight_size": 1.0, "times": {"gpu": times}}
        for i in (0, 1)
    ]
    profile = {"model": "m", "batch_size": 1, "job": {"samples": 1e4, "global_batch": 1000}, "layers": layers}
    cluster = {"cluster": "c", "resources": {"gpu": {"price": 1.0, "limit": 2, "bandwidth_gbps": 1.0}}}
    problem = problem_from_dicts(profile, cluster, objective="time").at_micro_batch(1)
    assert pace_ceiling(problem) == pytest.approx(1 / 1.5)
    args = ["plan", write_yaml(tmp_path / "p.yaml", profile), write_yaml(tmp_path / "c.yaml", cluster)]
    done = CliRunner().invoke(app, [*args, "-s", "exact", "--objective", "time", "--micro-batch", "1", "--json"])
    assert done.exit_code == 0, done.output
    plan = json.loads(done.output)
    assert len(plan["stages"]) == 2
    assert plan["throughput"] == pytest.approx(pace_ceiling(problem) * 1000 / 1001)
