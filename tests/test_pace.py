"""What no plan at one micro-batch can pass (heterps_cli.pace): the pace ceiling, the units a throughput
needs and the certificate's bound made of them, never past the optimum that brute-force enumeration finds on
small instances (pipelined, sharded, mixed), attained where nothing else slows a plan, and the micro-batch
they prove unable to win not searched."""

from __future__ import annotations

import json
import math

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from heterps_cli.cli.app import app
from heterps_cli.errors import Unexplained
from heterps_cli.pace import pace_ceiling, speed_bound
from heterps_cli.schedulers.base import SolveOptions
from heterps_cli.units_bound import counts_left, may_have, units_short
from tests.helpers import problem_from_dicts, write_yaml
from tests.oracle import pipeline_optimum
from tests.strategies import SETTINGS
from tests.test_mixed import brute_force as mixed_optimum
from tests.test_mixed import mixable
from tests.test_mixed_tp import brute_force as mixed_tp_optimum
from tests.test_mixed_tp import sharded_mixable
from tests.test_pipeline import pipelined
from tests.test_recompute import recomputable
from tests.test_tensor_parallel import sharded


def _within_the_ceiling(profile, cluster, optimum) -> None:
    """The optimum passes no bound: not the ceiling, its own throughput is within the units, and the
    certificate's bound is no lower."""
    problem = problem_from_dicts(profile, cluster, objective="time", micro_batch=profile["batch_size"])
    if optimum is not None:
        assert optimum[1] <= pace_ceiling(problem) * (1 + 1e-9)
        assert units_short(problem, optimum[1] * (1 - 1e-9)) is None
        # the certificate's bound, its bisection started well below the optimum
        assert speed_bound(problem, optimum[1] / 4, math.inf) >= optimum[1] * (1 - 1e-9)


@pytest.mark.slow  # over 3 s of the fast run
@settings(max_examples=60, **SETTINGS)
@given(st.one_of(pipelined(batches=(1, 2, 3)), pipelined(), sharded(), recomputable()))
def test_no_plan_passes_the_pace_ceiling_or_needs_more_units_than_the_cluster_has(inst):
    """Every replica trains a sample of each micro-batch: no plan is faster (micro-batches of 1-3 samples
    among them, where the replicas a stage may take bind; memory in flight, recomputation)."""
    profile, cluster = inst
    _within_the_ceiling(profile, cluster, pipeline_optimum(profile, cluster, "time", 0.0))


@settings(max_examples=30, **SETTINGS)
@given(mixable())
def test_no_mixed_plan_passes_the_pace_ceiling_or_needs_more_units_than_the_cluster_has(inst):
    profile, cluster = inst
    _within_the_ceiling(profile, cluster, mixed_optimum(profile, cluster))


@pytest.mark.slow  # over 3 s of the fast run
@settings(max_examples=40, **SETTINGS)
@given(sharded_mixable())
def test_no_plan_whose_mixed_parts_take_their_own_degrees_needs_more_units_than_the_cluster_has(inst):
    """The bound takes a stage's kinds one degree of each type (section 1i): no plan of brute force's
    enumeration over every part at every degree passes it."""
    profile, cluster = inst
    best = mixed_tp_optimum(profile, cluster)
    _within_the_ceiling(profile, cluster, (0.0, best) if best > 0 else None)


@settings(max_examples=40, **SETTINGS)
@given(st.one_of(pipelined(batches=(1, 2, 3)), sharded(), recomputable()))
def test_no_stage_count_the_units_bound_rules_out_has_a_plan_that_fast(inst):
    """The exact search skips the stage counts the bound rules out at the best throughput so far
    (pipeline.CountsLeft), and at throughput 0 those where no plan fits: brute force's best plan of each stage
    count is within what the bound leaves."""
    _each_count_within_the_bound(*inst)


def _each_count_within_the_bound(profile: dict, cluster: dict) -> None:
    """Brute force's best plan of each stage count: the bound leaves its count at throughput 0 and at its
    throughput, and does not rule its throughput out."""
    problem = problem_from_dicts(profile, cluster, objective="time", micro_batch=profile["batch_size"])
    for S in range(1, len(profile["layers"]) + 1):
        best = pipeline_optimum(profile, cluster, "time", 0.0, keep=lambda stages, *_, S=S: len(stages) == S)
        if best is not None:
            assert may_have(counts_left(problem, 0.0), S)
            assert may_have(counts_left(problem, best[1] * (1 - 1e-9)), S)
            assert units_short(problem, best[1] * (1 - 1e-9)) is None


@settings(max_examples=40, **SETTINGS)
@given(st.one_of(pipelined(batches=(1, 2, 3)), recomputable()))
def test_classes_of_several_stage_counts_hold_their_plans(inst):
    """Past 8 layers the bound's stage counts come in classes [lo, hi), each charged its least count's slots
    and each stage exactly the micro-batches in flight its place holds, counted from the pipeline's end: with
    classes of 1-2 and 3 or more stages on these small instances, brute force's best plan of each count is
    still within what the bound leaves (and the optimum within the units)."""
    from unittest import mock

    import heterps_cli.units_bound as bound

    with mock.patch.object(bound, "EXACT_STAGES", (1, 3)):
        _each_count_within_the_bound(*inst)


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
@pytest.mark.slow  # over a second here: the slow suite, which CI runs too
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
    assert plan["throughput"] == pytest.approx(8 / 4.5)
    # rl asks the proven optimum's micro-batch first, and then no other (tests/test_rl_stops.py)
    assert "1: none as fast" in chosen or "rl" in extra and "1: not asked (the plan at micro-batch 8 meets" in chosen
    alone = CliRunner().invoke(app, [*args, "--micro-batch", "1"])  # asked alone, it has a plan, slower
    assert alone.exit_code == 0 and json.loads(alone.output)["throughput"] == pytest.approx(1 / 4.5)


def _linked(tmp_path, times: dict, input_size: float, batches: tuple[int, int, int], limit: int):
    """Two layers of ``times`` on one type whose units have a 1 Gb/s link, ``input_size`` bytes a sample
    crossing their boundary; ``batches`` = (the profile's size, the global batch, the micro-batch): the
    problem at that micro-batch and the exact plan there."""
    size, global_batch, micro = batches
    layer = {"type": "fc", "input_size": input_size, "weight_size": 1.0, "times": {"gpu": times}}
    job = {"samples": 1e4, "global_batch": global_batch}
    profile = {"model": "m", "batch_size": size, "job": job, "layers": [{"name": f"l{i}", **layer} for i in (0, 1)]}
    cluster = {"cluster": "c", "resources": {"gpu": {"price": 1.0, "limit": limit, "bandwidth_gbps": 1.0}}}
    args = ["plan", write_yaml(tmp_path / "p.yaml", profile), write_yaml(tmp_path / "c.yaml", cluster)]
    done = CliRunner().invoke(app, [*args, "-s", "exact", "--objective", "time", "--micro-batch", str(micro), "--json"])
    assert done.exit_code == 0, done.output
    return problem_from_dicts(profile, cluster, objective="time").at_micro_batch(micro), json.loads(done.output)


def test_the_pace_ceiling_counts_the_boundary_a_pipeline_stage_waits_for(tmp_path):
    """Two layers of 1 s a micro-batch of 8 each (a sample a replica), their boundary 16 s a replica away
    over a 1 Gb/s link: no plan cuts there, so the ceiling is one stage's 8 samples in 2 s, which 8 replicas
    reach, where each layer's pace alone would allow 8."""
    times = {"oct": 8.0, "odt": 0.0, "alpha": 1.0, "beta": 0.0, "batches": {1: {"oct": 1.0, "odt": 0.0}}}
    problem, plan = _linked(tmp_path, times, 1e9, (8, 8, 8), limit=16)
    assert pace_ceiling(problem) == pytest.approx(8 / 2.0)
    assert plan["throughput"] == pytest.approx(pace_ceiling(problem))


def test_the_pace_ceiling_is_reached_where_the_best_plan_cuts_at_a_boundary(tmp_path):
    """Two layers of 1 s a sample on one replica (micro-batch 1, 1,000 a step), their boundary 0.5 s away:
    two stages of 1.5 s each beat one of 2 s, and reach the ceiling but for the pipeline's fill and drain."""
    times = {"oct": 1.0, "odt": 0.0, "alpha": 1.0, "beta": 0.0}
    problem, plan = _linked(tmp_path, times, 3.125e7, (1, 1000, 1), limit=2)
    assert pace_ceiling(problem) == pytest.approx(1 / 1.5)
    assert len(plan["stages"]) == 2
    assert plan["throughput"] == pytest.approx(pace_ceiling(problem) * 1000 / 1001)


def scarce():
    """Three layers of 1 s a sample (measured at 1 and 8), 2 units, global batch 64: micro-batch 8 puts all three
    on 2 replicas of 4 samples (0.667 samples/s). At micro-batch 1 a stage takes one replica, each layer alone
    keeps pace (the ceiling, 1 sample/s, does not rule it out), but two units hold no three stages of 1.5 s."""
    times = {"oct": 8.0, "odt": 0.0, "alpha": 1.0, "beta": 0.0, "batches": {1: {"oct": 1.0, "odt": 0.0}}}
    layer = {"type": "fc", "input_size": 1.0, "weight_size": 1.0, "times": {"gpu": times}}
    layers = [{"name": f"l{i}", **layer} for i in range(3)]
    profile = {"model": "m", "batch_size": 8, "job": {"samples": 640.0, "global_batch": 64}, "layers": layers}
    cluster = {"cluster": "c", "resources": {"gpu": {"price": 1.0, "limit": 2}}}
    return profile, cluster


def test_a_throughput_needing_more_units_than_the_cluster_has_is_out_of_reach(tmp_path):
    profile, cluster = scarce()
    one = problem_from_dicts(profile, cluster, objective="time").at_micro_batch(1)
    assert pace_ceiling(one) == pytest.approx(1.0)
    short = units_short(one, 2 / 3)  # 1.5 s a sample: one layer a stage, three units
    assert short is not None and short.need == pytest.approx(3.0) and short.have == pytest.approx(2.0)
    # two stages of two layers and one, two units: 2 s a micro-batch over 64 + 1 slots, 64 samples a step
    assert units_short(one, 64 / 130) is None
    assert units_short(one, 0.5) is not None  # not within the pipeline's fill and drain (it was before)
    args = ["plan", write_yaml(tmp_path / "p.yaml", profile), write_yaml(tmp_path / "c.yaml", cluster)]
    args += ["-s", "exact", "--objective", "time", "--json"]
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 0, done.output
    plan = json.loads(done.output)
    assert plan["throughput"] == pytest.approx(2 / 3) and plan["batch_size"] in (8, 16)
    assert "1: none as fast" in next(note for note in plan["notes"] if "chosen" in note)
    alone = CliRunner().invoke(app, [*args, "--micro-batch", "1"])  # asked alone: two stages, 2 s a sample
    assert alone.exit_code == 0 and json.loads(alone.output)["throughput"] == pytest.approx(0.5 * 64 / 65)


def test_the_units_bound_charges_the_all_reduce_of_as_many_replicas_as_the_stage_needs(tmp_path):
    """One layer of 1 s a sample, 1 s of all-reduce between two replicas, micro-batch 8 (one a step): 8 replicas
    of a sample take 1 + 2 (7/8) = 2.75 s (8/2.75 samples/s, brute force's optimum). No stage of fewer
    replicas trains the 8 samples that fast, so the bound charges 8 replicas' ring, not two's (it allowed
    8 / (1 + 1) = 4 before)."""
    times = {"oct": 8.0, "odt": 1.0, "alpha": 1.0, "beta": 0.0, "batches": {1: {"oct": 1.0, "odt": 1.0}}}
    layer = {"name": "l", "type": "fc", "input_size": 1.0, "weight_size": 1.0, "times": {"gpu": times}}
    profile = {
        "model": "m",
        "batch_size": 8,
        "job": {"samples": 64.0, "epochs": 1, "global_batch": 8},
        "layers": [layer],
    }
    cluster = {"cluster": "c", "resources": {"gpu": {"price": 1.0, "limit": 8}}}
    optimum = pipeline_optimum(profile, cluster, "time", 0.0)
    assert optimum is not None and optimum[1] == pytest.approx(8 / 2.75)
    problem = problem_from_dicts(profile, cluster, objective="time", micro_batch=8)
    assert units_short(problem, optimum[1] * (1 + 1e-3)) is not None
    assert speed_bound(problem, optimum[1] / 4, math.inf) == pytest.approx(optimum[1], rel=2e-3)


def _held(tmp_path, memory_gb: float):
    """One layer of 1 s a sample (measured at 1 and 8, global batch 64) on 2 units of ``memory_gb``, each
    sample's activations 1 GB: a replica holds at most one sample in flight, so micro-batch 8 needs 8 replicas
    and has no plan on 2 units; micro-batch 1 has one where a unit holds a sample (``memory_gb`` over 1)."""
    times = {"oct": 8.0, "odt": 0.0, "alpha": 1.0, "beta": 0.0, "batches": {1: {"oct": 1.0, "odt": 0.0}}}
    layer = {"name": "l", "type": "fc", "input_size": 1.0, "weight_size": 1.0, "activation_size": 1e9}
    profile = {"model": "m", "batch_size": 8, "job": {"samples": 640.0, "global_batch": 64}}
    profile["layers"] = [{**layer, "times": {"gpu": times}}]
    cluster = {"cluster": "c", "resources": {"gpu": {"price": 1.0, "limit": 2, "memory_gb": memory_gb}}}
    return write_yaml(tmp_path / "p.yaml", profile), write_yaml(tmp_path / "c.yaml", cluster)


@pytest.mark.parametrize("objective", ["time", "cost"])
def test_a_micro_batch_no_plan_fits_is_not_searched_and_the_error_is_the_searchs_own(tmp_path, monkeypatch, objective):
    """The units bound at throughput 0 proves micro-batch 8 holds no plan without a search; where no size has
    one, the error is the exact search's own (memory, section 1b), asked once it is shown."""
    import heterps_cli.schedulers.exact as exact

    searched: list[int] = []
    search = exact.solve

    def recorded(problem, **kw):
        searched.append(problem.batch_size)
        return search(problem, **kw)

    monkeypatch.setattr(exact, "solve", recorded)
    profile, cluster = _held(tmp_path, memory_gb=1.5)
    args = ["plan", profile, cluster, "-s", "exact", "--objective", objective, "--json"]
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 0, done.output
    plan = json.loads(done.output)
    assert plan["batch_size"] == 1 and plan["optimal"]
    assert "8: no plan" in next(note for note in plan["notes"] if "chosen" in note)
    assert 8 not in searched and 1 in searched
    profile, cluster = _held(tmp_path, memory_gb=0.5)  # not one sample fits: no plan at any size
    done = CliRunner().invoke(app, ["plan", profile, cluster, "-s", "exact", "--objective", objective])
    assert done.exit_code == 3
    said = " ".join(done.output.split())  # one sample of micro-batch 1 on one replica: no sharing it
    assert "at micro-batch 1: layer l needs 1 GB per replica on gpu (memory 0.5 GB) even on all 2 units" in said
    # asked at one size not to say why, the search says only that it found none
    problem = problem_from_dicts(yaml.safe_load(open(profile)), yaml.safe_load(open(cluster)), objective=objective)
    with pytest.raises(Unexplained, match="no plan at micro-batch 1 meets the job"):
        search(problem.at_micro_batch(1), options=SolveOptions(explain=False))
