"""Tied tensors in plans (docs/spec.md section 1j): the exact solver's optimum and every figure of its plan
against enumeration by the spec's oracle (tests/oracle), on random chains whose layers share tensors."""

from __future__ import annotations

import itertools
import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from heterps_cli.errors import InfeasibleError
from heterps_cli.schedulers import exact
from tests.helpers import problem_from_dicts
from tests.oracle import pipeline_optimum
from tests.oracle.paper import _better, spec_figures
from tests.oracle.pipeline import figures_of_plan
from tests.strategies import SETTINGS
from tests.test_pipeline import pipelined
from tests.test_tensor_parallel import sharded


@st.composite
def tied(draw):
    """A :func:`~tests.test_pipeline.pipelined` instance (or one with tensor-parallel degrees) of two layers
    or more, one or two of whose tensors several layers hold: a parameter counted in its first holder's
    weight_size, or a buffer."""
    profile, cluster = draw(st.one_of(pipelined(), sharded()))
    layers = profile["layers"]
    if len(layers) < 2:
        layers.append({**layers[0], "name": "extra"})  # a copy's own tp sizes, if any, come with it
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    ties = []
    for k in range(draw(st.integers(1, 2))):
        holders = sorted(rng.choice(len(layers), size=draw(st.integers(2, min(3, len(layers)))), replace=False))
        kind = draw(st.sampled_from(["parameter", "parameter", "buffer"]))
        first = layers[holders[0]]
        size = first["weight_size"] * draw(st.sampled_from([0.2, 0.9, 1.0])) if kind == "parameter" else 4096.0
        ties.append(
            {"tensor": f"t{k}", "kind": kind, "bytes": float(size), "layers": [layers[h]["name"] for h in holders]}
        )
    profile["ties"] = ties
    return profile, cluster


def _solved(profile, cluster, objective):
    try:
        return exact.solve(problem_from_dicts(profile, cluster, objective=objective))
    except InfeasibleError:
        return None


@settings(max_examples=80, **SETTINGS)
@given(tied(), st.sampled_from(["cost", "time"]))
def test_exact_is_the_optimum_of_enumeration_when_layers_share_tensors(inst, objective):
    profile, cluster = inst
    expected = pipeline_optimum(profile, cluster, objective, profile["job"]["min_throughput"])
    plan = _solved(profile, cluster, objective)
    assert (plan is None) == (expected is None), f"exact: {plan and plan.cost_usd}, enumeration: {expected}"
    if plan is None:
        return
    ref = figures_of_plan(profile, cluster, plan)
    assert ref["feasible"] and plan.optimal
    for stage, step, memory in zip(plan.stages, ref["step_s"], ref["memory_gb"]):
        assert math.isclose(stage.step_s, step, rel_tol=1e-9)
        assert math.isclose(stage.memory_gb, memory, rel_tol=1e-9, abs_tol=1e-15)
    figure, want = (plan.throughput, expected[1]) if objective == "time" else (plan.cost_usd, expected[0])
    assert math.isclose(figure, want, rel_tol=1e-9, abs_tol=1e-12)


def _enumerated(profile: dict, cluster: dict, objective: str):
    """The best (cost, throughput) over every plan of section 1 (no pipeline schedule), by
    :func:`~tests.oracle.paper.spec_figures`: every type per layer, every cut, every replica count."""
    types, n = list(cluster["resources"]), len(profile["layers"])
    floor, best = profile["job"]["min_throughput"], None
    for sched in itertools.product(types, repeat=n):
        if not all(t in layer["times"] for t, layer in zip(sched, profile["layers"])):
            continue
        for cuts in itertools.product([False, True], repeat=n - 1):
            starts = [0] + [i + 1 for i, cut in enumerate(cuts) if cut or sched[i] != sched[i + 1]]
            bounds = list(zip(starts, [*(s - 1 for s in starts[1:]), n - 1]))
            limits = [range(1, cluster["resources"][sched[a]]["limit"] + 1) for a, _ in bounds]
            for ks in itertools.product(*limits):
                stages = [{"resource": sched[a], "replicas": k, "first": a, "last": b} for (a, b), k in zip(bounds, ks)]
                plan = {"stages": stages, "samples": profile["job"]["samples"], "epochs": 1}
                f = spec_figures(profile, cluster, plan)
                within = all(k <= cluster["resources"][t]["limit"] for t, k in f["resources"].items())
                if not (within and f["memory_fits"]) or f["throughput"] < floor * (1 - 1e-12):
                    continue
                if best is None or _better(objective, f["cost_usd"], f["throughput"], *best):
                    best = (f["cost_usd"], f["throughput"])
    return best


@settings(max_examples=60, **SETTINGS)
@given(tied(), st.sampled_from(["cost", "time"]))
def test_without_a_pipeline_schedule_a_tie_is_charged_as_the_spec_says(inst, objective):
    profile, cluster = inst
    del profile["job"]["global_batch"]  # section 1: no pipeline, no degrees, nothing reserved
    for res in cluster["resources"].values():
        res.pop("memory_reserved_gb", None)
    for layer in profile["layers"]:
        layer.pop("tp", None)
        for entry in layer["times"].values():
            entry.pop("tp", None)
    expected = _enumerated(profile, cluster, objective)
    plan = _solved(profile, cluster, objective)
    assert (plan is None) == (expected is None), f"exact: {plan and plan.cost_usd}, enumeration: {expected}"
    if plan is None:
        return
    ref = spec_figures(profile, cluster, plan.to_dict())
    for stage, comm, memory in zip(plan.stages, ref["comm_s"], ref["memory_gb"]):
        assert math.isclose(stage.comm_s, comm, rel_tol=1e-9, abs_tol=1e-15)
        assert math.isclose(stage.memory_gb, memory, rel_tol=1e-9, abs_tol=1e-15)
    figure, want = (plan.throughput, expected[1]) if objective == "time" else (plan.cost_usd, expected[0])
    assert math.isclose(figure, want, rel_tol=1e-9, abs_tol=1e-12)
