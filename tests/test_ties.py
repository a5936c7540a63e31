"""Tied tensors in plans (docs/spec.md section 1j): the exact solver's optimum and every figure of its plan
against enumeration by the spec's oracle (tests/oracle), on random chains whose layers share tensors."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import yaml
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


@pytest.mark.slow  # over a second here: the slow suite, which CI runs too
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


def _split_pair(tmp_path, ties: bool):
    """Two layers, each fast on its own type, sharing a tensor: the best plan puts them on two stages."""
    layer = {"type": "fc", "input_size": 64.0, "weight_size": 4e6, "alpha": 0.9, "beta": 0.0}
    profile = {
        "model": "pair",
        "batch_size": 32,
        "job": {"samples": 1e6, "global_batch": 128},
        "layers": [
            {**layer, "name": "embed", "times": {"a": {"oct": 0.01, "odt": 0.001}, "b": {"oct": 0.5, "odt": 0.001}}},
            {**layer, "name": "head", "times": {"a": {"oct": 0.5, "odt": 0.001}, "b": {"oct": 0.01, "odt": 0.001}}},
        ],
    }
    if ties:
        profile["ties"] = [{"tensor": "embed.weight", "bytes": 2e6, "layers": ["embed", "head"]}]
    cluster = {"cluster": "c", "resources": {t: {"price": 1.0, "limit": 2, "memory_gb": 1, "bandwidth_gbps": 10}
                                             for t in ("a", "b")}}  # fmt: skip
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(profile))
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cluster))
    return str(tmp_path / "p.yaml"), str(tmp_path / "c.yaml")


def test_check_recomputes_a_split_tie_and_fails_a_plan_made_without_it(tmp_path, runner):
    from heterps_cli.cli.app import app

    profile, cluster = _split_pair(tmp_path, ties=True)
    out = tmp_path / "plan.yaml"
    made = runner.invoke(app, ["plan", profile, cluster, "-s", "exact", "--objective", "time", "--out", str(out)])
    assert made.exit_code == 0, made.output
    plan = yaml.safe_load(out.read_text())
    assert [s["layers"] for s in plan["stages"]] == [["embed"], ["head"]]
    # each stage moves twice the tie's bytes over its 10 Gbit/s link once a step
    assert all(s["tied_s"] == pytest.approx(2 * 2e6 / (10e9 / 8)) for s in plan["stages"])
    assert plan["stages"][1]["memory_gb"] > plan["stages"][0]["memory_gb"]  # the head's own copy
    args = ["check", str(out), "--profile", profile, "--cluster", cluster, "--objective", "time"]
    assert runner.invoke(app, args).exit_code == 0
    _split_pair(tmp_path, ties=False)
    stale = runner.invoke(app, args)
    assert stale.exit_code == 1 and "stale" in stale.output, stale.output
