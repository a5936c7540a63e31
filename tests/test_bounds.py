"""The bound that needs no search (heterps_cli.bounds), which a plan answered without the exact solver is
proven within: never past the optimum that brute-force enumeration finds, on small instances of every
section. The micro-batch's bounds are tests/test_pace.py's."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from heterps_cli.bounds import bound, least_work
from tests.helpers import problem_from_dicts
from tests.oracle import pipeline_optimum, pipeline_optimum_on_nodes
from tests.strategies import SETTINGS
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
