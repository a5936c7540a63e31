"""Mixed stages (docs/spec.md section 1i), held against an oracle written from the spec and a brute-force
enumeration of every mixed plan on small instances: ``plan --mixed-stages`` never claims more than the
enumeration's best, never less than the best plan of one-type stages, and its figures are the oracle's."""

from __future__ import annotations

import itertools
import math

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from heterps_cli.bounds import bound
from heterps_cli.cli.app import app
from heterps_cli.loading import load_plan
from heterps_cli.runtime.placement import processes
from heterps_cli.schedulers import SolveOptions, solve
from tests.helpers import problem_from_dicts, write_yaml
from tests.oracle import pipeline_optimum
from tests.strategies import SETTINGS
from tests.test_pipeline import pipelined
from tests.test_tensor_parallel import sharded

runner = CliRunner()


def stage_step(profile: dict, cluster: dict, layers: list[int], parts, s: int, S: int) -> tuple[float, list, bool]:
    """Spec 1i: the step of stage ``s`` of ``S`` over ``layers`` whose parts are ``(type, replicas, samples)``:
    ``(M + S - 1) · max_p c_p + 2 · max_p Y_p · (K - 1) / K + max_p U_p``, ``c_p`` a replica's micro-batch at
    its part's busiest share; each part's memory; whether every part fits."""
    L, B = profile["layers"], profile["batch_size"]
    M, n = profile["job"]["global_batch"] // B, len(L)
    K = sum(k for _, k, _ in parts)
    cs, ys, us, memory, fits = [], [], [], [], True
    for t, k, samples in parts:
        res, fixed = cluster["resources"][t], profile.get("fixed", {}).get(t, {})
        b = math.ceil(samples / k)
        c = fixed.get("pass_start", 0.0) + fixed.get("transfer_latency", 0.0) * 2 * (
            (layers[0] > 0) + (layers[-1] < n - 1)
        )
        y, u = fixed.get("all_reduce_latency", 0.0), 0.0
        for i in layers:
            e = L[i]["times"].get(t)
            if e is None:
                return math.inf, [], False
            a = e.get("alpha", L[i].get("alpha"))
            c += e["oct"] * (1 - a + a * b / B)
            y += e["odt"]
            u += e.get("update", 0.0)
        if res.get("bandwidth_gbps"):
            moved = (L[layers[0]]["input_size"] if layers[0] > 0 else 0.0) + (
                L[layers[-1] + 1]["input_size"] if layers[-1] < n - 1 else 0.0
            )
            c += 2 * b * moved / (res["bandwidth_gbps"] * 1e9 / 8)
        held = min(S - s, M)
        mem = (res.get("memory_reserved_gb") or 0.0) * 1e9
        for i in layers:
            kept = L[i].get("activation_size", 0.0) - (L[i].get("input_saved", 0.0) if i != layers[0] else 0.0)
            w = profile.get("state_factor", 4.0) * L[i]["weight_size"]
            mem += (w / K if L[i].get("sharded") else w) + held * b * kept
        memory.append(mem)
        fits &= samples >= k and (res.get("memory_gb") is None or mem <= res["memory_gb"] * 1e9 * (1 + 1e-12))
        cs.append(c), ys.append(y), us.append(u)
    return (M + S - 1) * max(cs) + 2 * max(ys) * (K - 1) / K + max(us), memory, fits


def brute_force(profile: dict, cluster: dict, objective: str = "time") -> tuple[float, float] | None:
    """(cost, throughput) of the best plan, by ``objective``, of :func:`every_plan` (None: none)."""
    plans = every_plan(profile, cluster)
    key = (lambda c: (c[1], -c[0])) if objective == "time" else (lambda c: (-c[0], c[1]))
    return max(plans, key=key, default=None)


def every_plan(profile: dict, cluster: dict) -> list[tuple[float, float]]:
    """(cost, throughput) of every plan of every cut, every type and replica count per stage, and every
    other type joining it with every count and split of the micro-batch, within the limits and the
    profile's throughput floor."""
    types, n, B = list(cluster["resources"]), len(profile["layers"]), profile["batch_size"]
    M = profile["job"]["global_batch"] // B
    work = profile["job"]["samples"] * profile["job"]["epochs"]
    floor = profile["job"]["min_throughput"]
    found = []
    for cut in range(1 << (n - 1)):
        bounds = [0, *[i + 1 for i in range(n - 1) if cut >> i & 1], n]
        spans = [list(range(a, b)) for a, b in zip(bounds, bounds[1:])]
        per_stage = [list(_stage_options(types, cluster, B)) for _ in spans]
        for choice in itertools.product(*per_stage):
            used = {t: sum(k for parts in choice for u, k, _ in parts if u == t) for t in types}
            if any(used[t] > cluster["resources"][t]["limit"] for t in types):
                continue
            steps = [
                stage_step(profile, cluster, ls, parts, s, len(spans))
                for s, (ls, parts) in enumerate(zip(spans, choice))
            ]
            if all(ok for _, _, ok in steps):
                thr = M * B / max(step for step, _, _ in steps)
                cost = work / thr / 3600 * sum(cluster["resources"][t]["price"] * used[t] for t in types)
                if thr >= floor * (1 - 1e-12):
                    found.append((cost, thr))
    return found


def _stage_options(types, cluster, B):
    """Every stage's parts: one type's replicas training the whole micro-batch, or two types' splitting it."""
    for t in types:
        for k in range(1, min(cluster["resources"][t]["limit"], B) + 1):
            yield ((t, k, B),)
            for u in types:
                if u == t:
                    continue
                for j in range(1, cluster["resources"][u]["limit"] + 1):
                    for n in range(k, B - j + 1):
                        yield ((t, k, n), (u, j, B - n))


@st.composite
def mixable(draw):
    """One or two layers on two types of speeds within 3x of each other (where mixing can pay), limits up to
    3, micro-batch 4 or 6, a few micro-batches a step; sometimes a bandwidth, memory and update times."""
    rng = st.floats(0.05, 1.0)
    B, M, n = draw(st.sampled_from([4, 6])), draw(st.sampled_from([1, 2, 4])), draw(st.integers(1, 2))
    speed = {"a": 1.0, "b": draw(st.floats(1.0, 3.0))}
    layers = []
    for i in range(n):
        work = draw(rng)
        times = {
            t: {"oct": work * f, "odt": draw(rng) * 0.1, "alpha": draw(st.floats(0.7, 1.0)), "beta": 0.0}
            | ({"update": work * 0.1} if draw(st.booleans()) else {})
            for t, f in speed.items()
        }
        layers.append({"name": f"l{i}", "type": "fc", "input_size": 1e6, "weight_size": 1e8, "times": times}
                      | ({"activation_size": 2e8} if draw(st.booleans()) else {}))  # fmt: skip
    resources = {t: {"price": draw(st.floats(0.5, 4.0)), "limit": draw(st.integers(1, 3))} for t in speed}
    if draw(st.booleans()):
        for r in resources.values():
            r |= {
                "bandwidth_gbps": draw(st.sampled_from([1.0, 100.0])),
                "memory_gb": draw(st.sampled_from([2.0, 40.0])),
            }
    job = {"samples": 1e4, "epochs": 1, "global_batch": B * M, "min_throughput": 0.0}
    profile = {"model": "m", "batch_size": B, "job": job, "layers": layers}
    return profile, {"cluster": "c", "resources": resources}


def _mixed_plan(profile, cluster, objective="time"):
    problem = problem_from_dicts(profile, cluster, objective=objective, micro_batch=profile["batch_size"])
    return problem, solve("exact", problem, options=SolveOptions(mixed_stages=True))


@pytest.mark.slow  # over a second here: the slow suite, which CI runs too
@settings(max_examples=100, **SETTINGS)
@given(mixable(), st.sampled_from(["time", "cost"]), st.sampled_from([0.0, 0.5, 0.9]))
def test_mixed_plans_are_within_brute_force_and_their_figures_are_the_specs(inst, objective, floor):
    """The exact DP's plan is the enumeration's best (time; cost with a throughput floor a part of the
    fastest one-type plan's), the climb's (the DP switched off) between it and the best one-type plan's,
    and every figure of both is the spec oracle's."""
    from heterps_cli.schedulers import mixed_optimum

    profile, cluster = inst
    fastest = pipeline_optimum(profile, cluster, "time")
    if fastest is None:
        return
    profile["job"]["min_throughput"] = floor * fastest[1]
    one_type = pipeline_optimum(profile, cluster, objective, profile["job"]["min_throughput"])
    problem, plan = _mixed_plan(profile, cluster, objective)
    best = brute_force(profile, cluster, objective)
    assert one_type is not None and best is not None
    assert plan.optimal  # the DP over every type's units: the enumeration's best
    if objective == "time":
        assert one_type[1] * (1 - 1e-9) <= plan.throughput
        assert math.isclose(plan.throughput, best[1], rel_tol=1e-9)
        assert bound(problem) >= best[1] * (1 - 1e-9)  # the gap past the DP is proven over mixed plans too
    else:
        assert plan.cost_usd <= one_type[0] * (1 + 1e-9)
        assert math.isclose(plan.cost_usd, best[0], rel_tol=1e-9)
        assert bound(problem) <= best[0] * (1 + 1e-9)
    saved, mixed_optimum.MOST_WORK = mixed_optimum.MOST_WORK, 0
    try:
        _, climbed = _mixed_plan(profile, cluster, objective)
    finally:
        mixed_optimum.MOST_WORK = saved
    if objective == "time":
        assert one_type[1] * (1 - 1e-9) <= climbed.throughput <= best[1] * (1 + 1e-9)
    else:
        assert best[0] * (1 - 1e-9) <= climbed.cost_usd <= one_type[0] * (1 + 1e-9)
    for found in (plan, climbed):
        _figures_are_the_specs(profile, cluster, found)


def _figures_are_the_specs(profile: dict, cluster: dict, plan) -> None:
    S = len(plan.stages)
    for s, stage in enumerate(plan.stages):
        parts = [(stage.resource, stage.replicas, stage.samples or profile["batch_size"])]
        parts += [(j.resource, j.replicas, j.samples) for j in stage.joined or ()]
        step, memory, ok = stage_step(profile, cluster, list(range(stage.first, stage.last + 1)), parts, s, S)
        assert ok and math.isclose(stage.step_s, step, rel_tol=1e-9)
        mine = [stage.memory_gb, *(j.memory_gb for j in stage.joined or ())]
        assert all(math.isclose(a, b / 1e9, rel_tol=1e-9, abs_tol=1e-15) for a, b in zip(mine, memory))


TINY = {
    "model": "tiny",
    "batch_size": 12,
    "job": {"samples": 12000, "global_batch": 48},
    "layers": [
        {
            "name": name,
            "type": "fc",
            "input_size": 1000,
            "weight_size": 1e6,
            "times": {
                "fast": {"oct": 0.6, "odt": 0.001, "alpha": 0.95, "beta": 0.0},
                "slow": {"oct": 1.8, "odt": 0.001, "alpha": 0.95, "beta": 0.0},
            },
        }
        for name in ("a", "b")
    ],
}
CLUSTER = {"cluster": "tiny", "resources": {"fast": {"price": 3.0, "limit": 2}, "slow": {"price": 1.0, "limit": 6}}}


def test_leftover_fast_replicas_join_the_slow_stage_and_check_passes(tmp_path):
    """Two fast GPUs and six slow ones: at micro-batch 48 the best one-type plan leaves one type idle;
    joined, the stage of six slow replicas and two fast ones trains each type's share, faster than
    any one-type plan, and check recomputes every figure from the files."""
    profile, cluster = write_yaml(tmp_path / "p.yaml", TINY), write_yaml(tmp_path / "c.yaml", CLUSTER)
    args = ["plan", profile, cluster, "-s", "exact", "--objective", "time"]
    one = runner.invoke(app, [*args, "--no-mixed-stages", "--json"])
    mixed = runner.invoke(app, [*args, "-o", str(tmp_path / "plan.yaml")])  # mixed stages by default
    assert one.exit_code == 0 and mixed.exit_code == 0, mixed.output
    plan = yaml.safe_load((tmp_path / "plan.yaml").read_text())
    stage = next(s for s in plan["stages"] if s.get("joined"))
    assert stage["samples"] + sum(j["samples"] for j in stage["joined"]) == plan["batch_size"]
    import json

    assert plan["throughput"] > json.loads(one.output)["throughput"]
    assert plan["optimal"] is True and "gap" not in plan  # the DP over both types' units proves it
    said = " ".join(mixed.output.split())
    assert "slow + fast" in said and "(section 1i)" in said
    assert "it mixes slow and fast" in said and "every unit of each that the limits allow" in said
    assert "mixing reaches 36.3 samples/s, the best plan of one-type stages 25.6" in said
    explained = json.loads(runner.invoke(app, [*args, "--mixed-stages", "--explain", "--json"]).output)
    more = [row for row in explained["what_if"] if row["change"] == 1]
    assert len(more) == 2 and all(row["throughput"] >= plan["throughput"] * (1 - 1e-12) for row in more)
    checked = runner.invoke(app, ["check", str(tmp_path / "plan.yaml"), "--profile", profile, "--cluster", cluster,
                                  "--objective", "time", "--replan", "exact"])  # fmt: skip
    assert checked.exit_code == 0, checked.output  # re-planned in the plan's own space: with mixed stages
    stale = runner.invoke(app, ["check", str(tmp_path / "plan.yaml"), "--profile", profile, "--cluster", cluster,
                                "--objective", "time", "--samples", "24000"])  # fmt: skip
    assert stale.exit_code == 1 and "--mixed-stages --out" in " ".join(stale.output.split())


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda s: s["joined"][0].update(samples=s["joined"][0]["samples"] - 1), "stages[0].samples"),
        (lambda s: s["joined"][0].update(resource=s["resource"]), "stages[0].joined"),
        (lambda s: s.pop("samples"), "stages[0].joined"),
        (lambda s: s["joined"][0].update(replicas=s["joined"][0]["samples"] + 1), "stages[0].joined[0].samples"),
    ],
)
def test_a_mixed_stage_that_does_not_add_up_is_refused_naming_it(tmp_path, edit, field):
    profile, cluster = write_yaml(tmp_path / "p.yaml", TINY), write_yaml(tmp_path / "c.yaml", CLUSTER)
    done = runner.invoke(app, ["plan", profile, cluster, "-s", "exact", "--objective", "time", "--mixed-stages",
                               "-o", str(tmp_path / "plan.yaml")])  # fmt: skip
    assert done.exit_code == 0
    plan = yaml.safe_load((tmp_path / "plan.yaml").read_text())
    edit(plan["stages"][0])
    write_yaml(tmp_path / "bad.yaml", plan)
    result = runner.invoke(app, ["validate", str(tmp_path / "bad.yaml"), cluster])
    assert result.exit_code == 2
    said = " ".join(result.output.split())
    assert field in said and "Traceback" not in said


def test_mixed_stages_say_why_they_are_not_planned_without_a_pipeline(tmp_path):
    alone = {**TINY, "job": {"samples": 12000}}  # no global batch: no pipeline schedule
    profile, cluster = write_yaml(tmp_path / "p.yaml", alone), write_yaml(tmp_path / "c.yaml", CLUSTER)
    result = runner.invoke(app, ["plan", profile, cluster, "-s", "exact", "--mixed-stages", "--json"])
    assert result.exit_code == 0
    assert "--mixed-stages: mixed stages need a pipeline schedule (a global batch)" in result.output


def test_a_mixed_stage_on_whole_nodes_is_rented_placed_and_checked(tmp_path):
    """The same job on nodes of two fast or two slow GPUs: the plan rents 1 + 3 nodes, places the joined
    fast replicas on the fast node, check recomputes it, and each node runs the replicas the plan places
    there, the joined ones too (what launch starts there)."""
    nodes = {
        "cluster": "tinynodes",
        "resources": {"fast": {}, "slow": {}},
        "nodes": {
            "f": {"price": 6.0, "units": {"fast": 2}, "available": 1},
            "s": {"price": 2.0, "units": {"slow": 2}, "available": 3},
        },
    }
    profile, cluster = write_yaml(tmp_path / "p.yaml", TINY), write_yaml(tmp_path / "c.yaml", nodes)
    args = ["plan", profile, cluster, "-s", "exact", "--objective", "time", "--mixed-stages"]
    assert runner.invoke(app, [*args, "-o", str(tmp_path / "plan.yaml")]).exit_code == 0
    plan = yaml.safe_load((tmp_path / "plan.yaml").read_text())
    assert plan["rental"] == {"f": 1, "s": 3}
    stage = next(s for s in plan["stages"] if s.get("joined"))
    assert stage["joined"][0]["nodes"] == {"f#1": 2} and sum(stage["nodes"].values()) == stage["replicas"]
    checked = runner.invoke(app, ["check", str(tmp_path / "plan.yaml"), "--profile", profile, "--cluster", cluster,
                                  "--objective", "time"])  # fmt: skip
    assert checked.exit_code == 0, checked.output
    import json

    explained = json.loads(runner.invoke(app, [*args, "--explain", "--json"]).output)
    rows = {(w["kind"], w["change"]): w for w in explained["what_if"]}  # f: 1 of 1 rented; s: 3 of 3
    assert set(rows) == {("f", -1), ("s", -1)} and all(w["throughput"] for w in rows.values())
    assert rows["f", -1]["rental"] == {"s": 3} and rows["s", -1]["rental"] == {"f": 1, "s": 2}
    placed = processes(load_plan(str(tmp_path / "plan.yaml"))[0].stages)  # what launch starts on each node
    counts: dict[str, int] = {}
    for part in [p for s in plan["stages"] for p in [s, *s.get("joined", [])]]:
        for node, n in part["nodes"].items():
            counts[node] = counts.get(node, 0) + n
    assert sorted(p.rank for p in placed) == list(range(sum(counts.values())))
    assert {node: sum(p.node == node for p in placed) for node in counts} == counts
    assert {p.resource for p in placed if p.node == "f#1"} == {"fast"}


@pytest.mark.parametrize("scheduler", ["rl", "greedy", "tapp"])
def test_every_scheduler_mixes_the_same_way_twice(tmp_path, scheduler):
    """The climb runs after any scheduler, deterministically: the same seed gives the same mixed plan."""
    profile, cluster = write_yaml(tmp_path / "p.yaml", TINY), write_yaml(tmp_path / "c.yaml", CLUSTER)
    args = ["plan", profile, cluster, "-s", scheduler, "--objective", "time", "--mixed-stages", "--json"]
    args += ["--steps", "20"] if scheduler in ("rl", "tapp") else []
    first, second = (runner.invoke(app, args) for _ in range(2))
    assert first.exit_code == 0, first.output
    import json

    a, b = json.loads(first.output), json.loads(second.output)
    assert a["stages"] == b["stages"] and any(s.get("joined") for s in a["stages"])
    assert a["throughput"] > 30  # the one-type optimum is 25.6 samples/s


@settings(max_examples=40, **SETTINGS)
@given(mixable(), st.sampled_from([0.0, 0.5]))
def test_the_mixed_frontier_is_the_pareto_set_of_every_mixed_plan(inst, floor):
    import numpy as np

    from tests.oracle import assert_is_the_frontier

    profile, cluster = inst
    fastest = brute_force(profile, cluster)
    profile["job"]["min_throughput"] = floor * (fastest[1] if fastest else 0.0)
    plans = np.array(every_plan(profile, cluster)).reshape(-1, 2)
    problem = problem_from_dicts(profile, cluster, micro_batch=profile["batch_size"])
    assert_is_the_frontier(problem, plans[:, 0], plans[:, 1], mixed_stages=True)


@settings(max_examples=40, **SETTINGS)
@given(st.one_of(pipelined(), sharded()), st.sampled_from(["cost", "time"]))
def test_the_mixed_optimum_is_never_worse_than_the_one_type_optimum(inst, objective):
    """Instances with every other section (memory, fixed costs, budgets, tp 2 and 4, recomputation): the
    DP's one-type stages are the cost model's, so its optimum is at least the enumeration's over one-type
    stages, and equal to it where no stage mixes."""
    from heterps_cli.errors import InfeasibleError

    profile, cluster = inst
    floor = profile["job"]["min_throughput"]
    expected = pipeline_optimum(profile, cluster, objective, floor)
    problem = problem_from_dicts(profile, cluster, objective=objective, micro_batch=profile["batch_size"])
    try:
        plan = solve("exact", problem, options=SolveOptions(mixed_stages=True))
    except InfeasibleError:
        assert expected is None
        return
    assert expected is not None and plan.feasible and plan.optimal
    cost, thr = expected
    same = not any(s.joined for s in plan.stages)
    if objective == "time":
        assert plan.throughput >= thr * (1 - 1e-9) and (not same or math.isclose(plan.throughput, thr, rel_tol=1e-9))
    else:
        assert plan.cost_usd <= cost * (1 + 1e-9) and (not same or math.isclose(plan.cost_usd, cost, rel_tol=1e-9))


def test_the_frontier_over_mixed_stages_and_where_it_does_not_run(tmp_path):
    """TINY's frontier with --mixed-stages reaches the mixed plan's throughput, its fastest plan mixes and
    check passes on it; on limits of hundreds of units the DP does not run, and the frontier says so
    (tests/test_frontier_climbed.py: what it is there)."""
    import json

    profile, cluster = write_yaml(tmp_path / "p.yaml", TINY), write_yaml(tmp_path / "c.yaml", CLUSTER)
    done = runner.invoke(app, ["frontier", profile, cluster, "--mixed-stages", "--json", "--out",
                               str(tmp_path / "plans")])  # fmt: skip
    assert done.exit_code == 0, done.output
    plans = json.loads(done.output)["plans"]
    assert plans[-1]["stages"][0].get("joined") and plans[-1]["throughput"] > 36
    fastest = sorted((tmp_path / "plans").iterdir())[-1]
    floor = str(yaml.safe_load(fastest.read_text())["min_throughput"])
    checked = runner.invoke(app, ["check", str(fastest), "--profile", profile, "--cluster", cluster,
                                  "--min-throughput", floor])  # fmt: skip
    assert checked.exit_code == 0, checked.output
    big = {"cluster": "big", "resources": {"fast": {"price": 3.0, "limit": 400}, "slow": {"price": 1.0, "limit": 600}}}
    climbed = runner.invoke(app, ["frontier", profile, write_yaml(tmp_path / "big.yaml", big), "--mixed-stages"])
    said = " ".join(climbed.output.split())
    assert climbed.exit_code == 0 and "does not run here" in said and "exact over one-type stages" in said
    cut = runner.invoke(app, ["frontier", profile, cluster, "--mixed-stages", "--time-limit", "0.000001"])
    assert cut.exit_code == 2 and "--time-limit" in " ".join(cut.output.split())
    flat = runner.invoke(app, ["frontier", profile, cluster, "--mixed-stages", "--micro-batch", "12",
                               "--global-batch", "12"])  # fmt: skip
    assert flat.exit_code == 0, flat.output  # one micro-batch a step: still a pipeline schedule
    no_step = write_yaml(tmp_path / "q.yaml", TINY | {"job": {"samples": 12000}})
    unpipelined = runner.invoke(app, ["frontier", no_step, cluster, "--mixed-stages"])
    assert unpipelined.exit_code == 2 and "--global-batch" in " ".join(unpipelined.output.split())


def test_past_the_dps_reach_a_plan_is_proven_only_within_the_bounds_gap(tmp_path):
    """Hundreds of units of each type: the DP does not run, and the one-type optimum the climb starts from
    is certified over one-type stages only: the plan says so and carries the bound's gap, never optimal."""
    import json

    big = {"cluster": "big", "resources": {"fast": {"price": 3.0, "limit": 400}, "slow": {"price": 1.0, "limit": 600}}}
    profile, cluster = write_yaml(tmp_path / "p.yaml", TINY), write_yaml(tmp_path / "c.yaml", big)
    for objective in ("time", "cost"):
        done = runner.invoke(app, ["plan", profile, cluster, "-s", "exact", "--objective", objective,
                                   "--mixed-stages", "--json"])  # fmt: skip
        assert done.exit_code == 0, done.output
        plan = json.loads(done.output)
        said = " ".join(" ".join(plan["notes"]).split())
        assert "no exact search over mixed stages" in said
        assert plan["optimal"] is not True or plan.get("gap") is None and "within 0.00%" in said


def test_diff_of_two_micro_batches_of_one_global_batch_is_one_job(tmp_path):
    """The one-type plan chooses micro-batch 12, the mixed one 48, both of the global batch 48: one job,
    no warning (the micro-batch is the plan's choice, section 1f); another global batch warns."""
    profile, cluster = write_yaml(tmp_path / "p.yaml", TINY), write_yaml(tmp_path / "c.yaml", CLUSTER)
    args = ["plan", profile, cluster, "-s", "exact", "--objective", "time"]
    runner.invoke(app, [*args, "--no-mixed-stages", "-o", str(tmp_path / "one.yaml")])
    runner.invoke(app, [*args, "-o", str(tmp_path / "mixed.yaml")])
    same = runner.invoke(app, ["diff", str(tmp_path / "one.yaml"), str(tmp_path / "mixed.yaml")])
    assert same.exit_code == 0 and "different jobs" not in same.output and "+41.8%" in same.output
    runner.invoke(app, [*args, "--no-mixed-stages", "--global-batch", "96", "-o", str(tmp_path / "other.yaml")])
    other = runner.invoke(app, ["diff", str(tmp_path / "one.yaml"), str(tmp_path / "other.yaml")])
    assert other.exit_code == 0 and "global_batch 48 vs 96" in " ".join(other.output.split())
