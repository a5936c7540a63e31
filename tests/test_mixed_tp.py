"""Mixed stages whose parts run at their own tensor-parallel degrees (docs/spec.md sections 1h and 1i), held
against a brute-force enumeration written from the spec: every cut, every part of every type at every degree
its layers give, every count and split of the micro-batch."""

from __future__ import annotations

import itertools
import math

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from heterps_cli.cli.app import app
from heterps_cli.schedulers import SolveOptions, solve
from tests.helpers import problem_from_dicts, write_yaml
from tests.strategies import SETTINGS

runner = CliRunner()


def _at(entry: dict, layer: dict, d: int) -> tuple[float, float, float, float] | None:
    """Spec 1h: an entry's (oct, odt, alpha, update) at degree ``d`` (None: not given there)."""
    if d == 1:
        shard = entry
    elif d in (entry.get("tp") or {}):
        shard = entry["tp"][d]
    else:
        return None
    alpha = shard.get("alpha", entry.get("alpha", layer.get("alpha")))
    update = shard.get(
        "update", entry.get("update", 0.0) * (layer["tp"][d]["weight_size"] / layer["weight_size"] if d > 1 else 1)
    )
    return shard["oct"], shard["odt"], alpha, update


def stage_step(profile: dict, layers: list[int], parts, S: int) -> float:
    """Spec 1i over parts ``(type, replicas, samples, degree)``, without bandwidth or memory:
    ``(M + S - 1) · max_p c_p + 2 · max_p Y_p · (K - 1) / K + max_p U_p`` (inf: a part cannot run)."""
    L, B = profile["layers"], profile["batch_size"]
    M = profile["job"]["global_batch"] // B
    K = sum(k for _, k, _, _ in parts)
    cs, ys, us = [], [], []
    for t, k, samples, d in parts:
        b, c, y, u = math.ceil(samples / k), 0.0, 0.0, 0.0
        for i in layers:
            got = _at(L[i]["times"][t], L[i], d)
            if got is None or samples < k:
                return math.inf
            oct_, odt, alpha, update = got
            c += oct_ * (1 - alpha + alpha * b / B)
            y += odt
            u += update
        cs.append(c), ys.append(y), us.append(u)
    return (M + S - 1) * max(cs) + 2 * max(ys) * (K - 1) / K + max(us)


def _parts(cluster: dict, B: int):
    """Every stage's parts: one type at one degree training the whole micro-batch, or two types, each at
    its own degree, splitting it."""
    res = cluster["resources"]
    ways = [(t, d) for t in res for d in (1, 2) if d <= res[t]["limit"]]
    for t, d in ways:
        for k in range(1, min(res[t]["limit"] // d, B) + 1):
            yield ((t, k, B, d),)
            for u, e in ways:
                if u == t:
                    continue
                for j in range(1, res[u]["limit"] // e + 1):
                    for n in range(k, B - j + 1):
                        yield ((t, k, n, d), (u, j, B - n, e))


def brute_force(profile: dict, cluster: dict) -> float:
    """The fastest plan's throughput over every cut and every stage's :func:`_parts` within the limits."""
    n, B = len(profile["layers"]), profile["batch_size"]
    M, res = profile["job"]["global_batch"] // B, cluster["resources"]
    options = list(_parts(cluster, B))
    best = 0.0
    for cut in range(1 << (n - 1)):
        bounds = [0, *[i + 1 for i in range(n - 1) if cut >> i & 1], n]
        spans = [list(range(a, b)) for a, b in zip(bounds, bounds[1:])]
        for choice in itertools.product(options, repeat=len(spans)):
            used = {t: sum(k * d for parts in choice for u, k, _, d in parts if u == t) for t in res}
            if any(used[t] > res[t]["limit"] for t in res):
                continue
            slowest = max(stage_step(profile, ls, parts, len(spans)) for ls, parts in zip(spans, choice))
            best = max(best, M * B / slowest)
    return best


@st.composite
def sharded_mixable(draw):
    """One or two layers on two types within 3x of each other's speed, each entry also at tp 2 on some
    (a little more than half the work, half the all-reduce), limits 1 to 4, micro-batch 4."""
    B, M, n = 4, draw(st.sampled_from([1, 2, 4])), draw(st.integers(1, 2))
    speed = {"a": 1.0, "b": draw(st.floats(1.0, 3.0))}
    layers = []
    for i in range(n):
        work = draw(st.floats(0.05, 1.0))
        times = {}
        for t, f in speed.items():
            entry = {
                "oct": work * f,
                "odt": draw(st.floats(0.05, 1.0)) * 0.3,
                "alpha": draw(st.floats(0.7, 1.0)),
                "beta": 0.0,
            }
            if draw(st.booleans()):
                entry["update"] = work * 0.1
            if draw(st.booleans()):
                entry["tp"] = {
                    2: {"oct": entry["oct"] * draw(st.sampled_from([0.55, 0.7, 1.2])), "odt": entry["odt"] / 2}
                }
            times[t] = entry
        layers.append({"name": f"l{i}", "type": "fc", "input_size": 1e6, "weight_size": 1e8, "times": times,
                       "tp": {2: {"weight_size": 5e7}}})  # fmt: skip
    resources = {t: {"price": draw(st.floats(0.5, 4.0)), "limit": draw(st.integers(1, 4))} for t in speed}
    job = {"samples": 1e4, "epochs": 1, "global_batch": B * M, "min_throughput": 0.0}
    return {"model": "m", "batch_size": B, "job": job, "layers": layers}, {"cluster": "c", "resources": resources}


@pytest.mark.slow  # over a second here: the slow suite, which CI runs too
@settings(max_examples=60, **SETTINGS)
@given(sharded_mixable())
def test_the_dp_over_mixed_degrees_is_the_enumerations_best(inst):
    """The exact DP's plan is the fastest of every plan whose parts take any degree, its stages' figures the
    oracle's; the climb (the DP switched off) is no faster than it."""
    from heterps_cli.schedulers import mixed_optimum

    profile, cluster = inst
    problem = problem_from_dicts(profile, cluster, objective="time", micro_batch=4)
    plan = solve("exact", problem, options=SolveOptions(mixed_stages=True))
    best = brute_force(profile, cluster)
    assert plan.optimal and math.isclose(plan.throughput, best, rel_tol=1e-9)
    for stage in plan.stages:
        parts = [(p.resource, p.replicas, p.samples or 4, p.tp or 1) for p in stage.parts]
        step = stage_step(profile, list(range(stage.first, stage.last + 1)), parts, len(plan.stages))
        assert math.isclose(stage.step_s, step, rel_tol=1e-9)
    for t, res in cluster["resources"].items():
        assert sum(stage.units_by_type.get(t, 0) for stage in plan.stages) <= res["limit"]
    saved, mixed_optimum.MOST_WORK = mixed_optimum.MOST_WORK, 0
    try:
        climbed = solve("exact", problem, options=SolveOptions(mixed_stages=True))
    finally:
        mixed_optimum.MOST_WORK = saved
    assert climbed.throughput <= best * (1 + 1e-9)


TP_PROFILE = {
    "model": "m",
    "batch_size": 4,
    "job": {"samples": 10000, "epochs": 1, "global_batch": 16},
    "layers": [
        {
            "name": "l0",
            "type": "fc",
            "input_size": 1e6,
            "weight_size": 1e8,
            "tp": {2: {"weight_size": 5e7}},
            "times": {
                "a": {
                    "oct": 0.5,
                    "odt": 0.015,
                    "alpha": 0.9,
                    "beta": 0.0,
                    "update": 0.05,
                    "tp": {2: {"oct": 0.26, "odt": 0.0075}},
                },  # fmt: skip
                "b": {"oct": 0.9, "odt": 0.3, "alpha": 0.98, "beta": 0.0, "tp": {2: {"oct": 0.49, "odt": 0.15}}},
            },
        }
    ],
}
TP_CLUSTER = {"cluster": "c", "resources": {"a": {"price": 0.5, "limit": 3}, "b": {"price": 1.0, "limit": 2}}}


@pytest.mark.slow  # over a second here: the slow suite, which CI runs too
def test_three_whole_a_replicas_joined_by_a_b_replica_at_tp_2_beat_every_one_degree_stage(tmp_path):
    """Three a units and two b: the optimum is one stage of three a replicas at tp 1 training 3 samples of
    each micro-batch of 4 beside one b replica of two units at tp 2 training 1 (17.3 samples/s, the best
    one-type plan 15.0); check recomputes it, frontier shows the part's degree, and a plan whose joined
    part takes a degree the profile does not give fails check, naming the stage."""
    profile, cluster = write_yaml(tmp_path / "p.yaml", TP_PROFILE), write_yaml(tmp_path / "c.yaml", TP_CLUSTER)
    args = [profile, cluster, "--objective", "time", "--micro-batch", "4", "--mixed-stages"]
    made = runner.invoke(app, ["plan", *args, "-s", "exact", "-o", str(tmp_path / "plan.yaml")])
    assert made.exit_code == 0, made.output
    plan = yaml.safe_load((tmp_path / "plan.yaml").read_text())
    (stage,) = plan["stages"]
    assert (stage["resource"], stage["replicas"], stage.get("tp"), stage["samples"]) == ("a", 3, None, 3)
    assert [(j["resource"], j["replicas"], j["tp"], j["samples"]) for j in stage["joined"]] == [("b", 1, 2, 1)]
    assert plan["resources"] == {"a": 3, "b": 2} and plan["optimal"] is True
    parts = [("a", 3, 3, 1), ("b", 1, 1, 2)]
    assert math.isclose(plan["stages"][0]["step_s"], stage_step(TP_PROFILE, [0], parts, 1), rel_tol=1e-12)
    checked = runner.invoke(app, ["check", str(tmp_path / "plan.yaml"), "--profile", profile, "--cluster", cluster,
                                  "--objective", "time"])  # fmt: skip
    assert checked.exit_code == 0, checked.output
    frontier = runner.invoke(app, ["frontier", profile, cluster, "--micro-batch", "4", "--mixed-stages"])
    assert frontier.exit_code == 0 and "a×3+b tp2×1" in frontier.output, frontier.output
    stage["joined"][0]["tp"] = 4
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(plan))
    bad = runner.invoke(app, ["check", str(tmp_path / "bad.yaml"), "--profile", profile, "--cluster", cluster,
                              "--objective", "time"])  # fmt: skip
    said = " ".join(bad.output.split())
    assert bad.exit_code == 1 and "b, which joins stage 0, runs at tp 4, which the profile no longer gives" in said
    compared = runner.invoke(app, ["compare", *args])  # genetic on a space of a few schedules: no children to breed
    assert compared.exit_code == 0, compared.output
