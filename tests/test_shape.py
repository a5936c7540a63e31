"""docs/spec.md section 1k: a shape the user or an engine fixes. Under every shape the exact plan is
the best the enumeration oracle finds among the plans keeping it (every cut, type, replica vector,
degree and choice of recomputing stages, filtered by the shape), and the plan keeps it."""

from __future__ import annotations

import math

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from heterps_cli.errors import InfeasibleError, InputError
from heterps_cli.schedulers import solve
from heterps_cli.shape import ANY, Shape, breaks, constrained
from tests.helpers import problem_from_dicts
from tests.oracle import pipeline_optimum
from tests.strategies import SETTINGS
from tests.test_tensor_parallel import sharded


@st.composite
def shapes(draw, types: list[str], n: int):
    stages = draw(st.sampled_from([None, 1, 2, 3]))
    stage_types = ()
    if stages is not None and draw(st.booleans()):
        stage_types = tuple(draw(st.sampled_from([ANY, *types])) for _ in range(stages))
    layer_types = ()
    if draw(st.booleans()):
        a = draw(st.integers(0, n - 1))
        b = draw(st.integers(a, n - 1))
        layer_types = ((str(a), str(b), draw(st.sampled_from(types))),)
    tp = draw(st.sampled_from([None, 1, 2]))
    return Shape(
        stages=stages,
        tp=tp,
        max_tp=draw(st.sampled_from([None, 1, 2])) if tp is None else None,
        replicas=draw(st.sampled_from([None, 1, 2])),
        recompute=draw(st.sampled_from([None, False, True])),
        layer_types=layer_types,
        stage_types=stage_types,
    )


def keeps(shape: Shape, B0: int):
    """The oracle's filter: does a plan (stages as (type, layers), replicas, degrees, recomputes) keep it?"""

    def keep(stages, ks, ds, again) -> bool:
        if shape.stages is not None and len(stages) != shape.stages:
            return False
        if shape.tp is not None and any(d != shape.tp for d in ds):
            return False
        if shape.max_tp is not None and any(d > shape.max_tp for d in ds):
            return False
        if shape.replicas is not None and any(k != shape.replicas for k in ks) or B0 % (shape.replicas or 1):
            return False
        if shape.recompute is not None and any(bool(a) != shape.recompute for a in again):
            return False
        if any(want not in (ANY, t) for want, (t, _) in zip(shape.stage_types, stages)):
            return False
        where = {i: t for t, layers in stages for i in layers}
        return all(where[i] == t for a, b, t in shape.layer_types for i in range(int(a), int(b) + 1))

    return keep


@settings(**{**SETTINGS, "max_examples": 60})
@given(st.data())
def test_exact_under_a_shape_is_the_best_plan_keeping_it(data):
    profile, cluster = data.draw(sharded())
    objective = data.draw(st.sampled_from(["cost", "time"]))
    shape = data.draw(shapes(list(cluster["resources"]), len(profile["layers"])))
    problem = problem_from_dicts(profile, cluster, objective=objective, micro_batch=profile["batch_size"])
    try:
        shaped = constrained(problem, shape)
    except InputError:
        assume(False)
    B0 = profile["batch_size"]
    expected = pipeline_optimum(profile, cluster, objective, profile["job"]["min_throughput"], keep=keeps(shape, B0))
    try:
        plan = solve("exact", shaped)
    except InfeasibleError:
        plan = None
    assert (plan is None) == (expected is None), f"exact: {plan and plan.cost_usd}, enumeration: {expected}"
    if plan is None:
        return
    assert plan.feasible and plan.optimal
    assert breaks(plan, shape, problem.layer_names) == []
    figure, want = (plan.throughput, expected[1]) if objective == "time" else (plan.cost_usd, expected[0])
    assert math.isclose(figure, want, rel_tol=1e-9, abs_tol=1e-12)
