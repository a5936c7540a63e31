"""Whole nodes (docs/spec.md section 1e): the exact solver, the frontier and the heuristics against
enumeration of every schedule, replica vector and rental; the cluster file's new section; the plan
file's rental and placement, recomputed by check."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from heterps_cli.cli.app import app
from heterps_cli.errors import InfeasibleError
from heterps_cli.frontier import pareto_frontier
from heterps_cli.schedulers import exact, solve
from tests.helpers import ROOT, instance_dicts, problem_from_dicts, random_instance, runner, write_yaml
from tests.oracle import (
    assert_is_the_frontier,
    assert_is_the_optimum,
    brute_force,
    cheapest_rental,
    feasible_plans,
    pareto,
    rentals,
)
from tests.strategies import SETTINGS


@st.composite
def node_instances(draw):
    """(arrays, B0, min_throughput, nodes): up to 4 layers on 2 types or 3 on 3, and 1 to 3 node kinds
    of 1 to 2 available nodes holding 0 to 2 units of each type (every type held by some kind)."""
    T = draw(st.integers(2, 3))
    n = draw(st.integers(1, 4 if T == 2 else 3))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    arrays = random_instance(rng, n, T)
    K = draw(st.integers(1, 3))
    units = rng.integers(0, 3, (K, T))
    units[rng.integers(0, K, T), np.arange(T)] = rng.integers(1, 3, T)  # every type in some kind
    units[units.sum(axis=1) == 0, 0] = 1  # every kind holds something
    price = rng.uniform(0.5, 10.0, K).round(3)
    available = rng.integers(1, 3, K)
    B0 = 32
    reference = B0 / arrays[0].min(axis=1).sum()
    min_throughput = draw(st.sampled_from((0.0, 0.5, 1.0, 2.0))) * reference
    return arrays, B0, min_throughput, (units, price, available)


def _dicts(arrays, B0, min_throughput, nodes):
    units, price, available = nodes
    profile, cluster = instance_dicts(*arrays, B0=B0, samples=1e6, min_throughput=min_throughput)
    types = list(cluster["resources"])
    cluster["resources"] = {t: {} for t in types}
    cluster["nodes"] = {
        f"n{k}": {
            "price": float(price[k]),
            "units": {t: int(u) for t, u in zip(types, units[k]) if u},
            "available": int(available[k]),
        }
        for k in range(len(price))
    }
    return profile, cluster


def _expected(arrays, B0, min_throughput, nodes, objective, max_cost=None):
    units, price, available = nodes
    capacity, rate = rentals(units, price, available)
    limits = capacity.max(axis=0).astype(int)  # every node rented
    arrays = (*arrays[:6], limits)
    return feasible_plans, dict(
        args=(*arrays, B0, 1e6),
        kwargs=dict(
            min_throughput=min_throughput,
            max_cost=max_cost,
            rate_of=lambda used: cheapest_rental(used, capacity, rate),
        ),
        objective=objective,
    )


def _brute(inst, objective, max_cost=None):
    arrays, B0, min_throughput, nodes = inst
    _, e = _expected(arrays, B0, min_throughput, nodes, objective, max_cost)
    return brute_force(*e["args"], objective=objective, **e["kwargs"])


def _exact(inst, objective, max_cost=None):
    profile, cluster = _dicts(*inst)
    problem = problem_from_dicts(profile, cluster, objective=objective, max_cost=max_cost)
    try:
        return exact.solve(problem), problem
    except InfeasibleError:
        return None, problem


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
@settings(max_examples=150, **SETTINGS)
@given(node_instances(), st.sampled_from(["cost", "time"]))
def test_exact_with_nodes_matches_enumeration_of_schedules_replicas_and_rentals(inst, objective):
    plan, _ = _exact(inst, objective)
    if assert_is_the_optimum(plan, _brute(inst, objective), objective):
        _check_rental(inst, plan)


@settings(max_examples=60, **SETTINGS)
@given(node_instances(), st.sampled_from([0.7, 1.0, 1.5]))
def test_exact_with_nodes_within_a_budget_matches_enumeration(inst, scale):
    cheapest = _brute(inst, "cost")
    if cheapest is None:
        return
    budget = cheapest[0] * scale
    plan, _ = _exact(inst, "time", max_cost=budget)
    expected = _brute(inst, "time", max_cost=budget)
    assert (plan is None) == (expected is None)
    if plan is not None:
        assert plan.cost_usd <= budget * (1 + 1e-9)
        assert math.isclose(plan.throughput, expected[1], rel_tol=1e-9)


@settings(max_examples=40, **SETTINGS)
@given(node_instances())
def test_frontier_with_nodes_is_the_enumerated_pareto_set(inst):
    arrays, B0, min_throughput, nodes = inst
    _, e = _expected(arrays, B0, min_throughput, nodes, "cost")
    cost, thr = feasible_plans(*e["args"], **e["kwargs"])
    profile, cluster = _dicts(*inst)
    assert_is_the_frontier(problem_from_dicts(profile, cluster), cost, thr)


@settings(max_examples=40, **SETTINGS)
@given(node_instances())
def test_a_frontier_with_nodes_stopped_by_the_clock_is_exact_up_to_where_it_says(inst):
    """With no time at all, the walk stops at the first rental after a plan: the frontier it gives is
    the Pareto set of the enumerated plans no faster than its cut, and says where the cut is (a
    faster plan, unexplored, may still beat some of them, as the output says)."""
    arrays, B0, min_throughput, nodes = inst
    _, e = _expected(arrays, B0, min_throughput, nodes, "cost")
    cost, thr = feasible_plans(*e["args"], **e["kwargs"])
    if len(cost) == 0:
        return
    profile, cluster = _dicts(*inst)
    frontier = pareto_frontier(problem_from_dicts(profile, cluster), time_limit=0.0)
    if frontier.cut_at is None:  # the walk had nothing left to ask
        assert len(frontier.plans) == len(pareto(cost, thr))
        return
    upto = thr <= frontier.cut_at * (1 + 1e-9)
    want = pareto(cost[upto], thr[upto])
    got = [(p.throughput, p.cost_usd) for p in frontier.plans]
    assert len(got) == len(want), (got, want)
    for (x, c), (wx, wc) in zip(got, want):
        assert math.isclose(x, wx, rel_tol=1e-9) and math.isclose(c, wc, rel_tol=1e-9)


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
@settings(max_examples=40, **SETTINGS)
@given(node_instances(), st.sampled_from(["greedy", "random"]))
def test_heuristics_price_their_plans_by_the_cheapest_rental(inst, scheduler):
    profile, cluster = _dicts(*inst)
    problem = problem_from_dicts(profile, cluster)
    try:
        plan = solve(scheduler, problem, seed=1)
    except InfeasibleError:
        return
    _check_rental(inst, plan)
    optimum = _brute(inst, "cost")
    assert optimum is not None and plan.cost_usd >= optimum[0] * (1 - 1e-9)


def _check_rental(inst, plan):
    """The plan rents the cheapest rental holding its units, pays for all of it, and places every
    replica on a rented node with room for it."""
    units, price, available = inst[3]
    capacity, rate = rentals(units, price, available)
    types = list(plan.resources)
    used = np.array([[plan.resources[t] for t in types]], dtype=float)
    assert math.isclose(plan.rate_usd_per_hour, cheapest_rental(used, capacity, rate)[0], rel_tol=1e-12)
    rented = np.array([plan.rental.get(f"n{k}", 0) for k in range(len(price))])
    assert (rented <= available).all() and math.isclose(rented @ price, plan.rate_usd_per_hour, rel_tol=1e-12)
    assert math.isclose(plan.cost_usd, plan.time_s / 3600 * plan.rate_usd_per_hour, rel_tol=1e-9)
    on_node: dict[str, np.ndarray] = {}
    for stage in plan.stages:
        assert sum(stage.nodes.values()) == stage.replicas
        for node, n in stage.nodes.items():
            kind, index = node.split("#")
            assert 1 <= int(index) <= plan.rental[kind]
            held = on_node.setdefault(node, np.zeros(len(types), dtype=int))
            held[types.index(stage.resource)] += n
    for node, held in on_node.items():
        assert (held <= units[int(node.split("#")[0][1:])]).all(), f"{node} holds more replicas than units"
    held = rented @ units
    assert plan.idle_units == {t: int(h - u) for t, h, u in zip(types, held, used[0])}


# -- the cluster file and the command line ----------------------------------------------------------------

NODES = {
    "cluster": "nodes",
    "resources": {"cpu": {"unit": "CPU core"}, "v100": {"unit": "V100"}},
    "nodes": {
        "p3.2xlarge": {"price": 3.06, "units": {"v100": 1, "cpu": 4}, "available": 8},
        "c5.18xlarge": {"price": 3.06, "units": {"cpu": 36}, "available": 8},
    },
}


@pytest.mark.parametrize(
    ("change", "where", "says"),
    [
        (lambda c: c["nodes"]["p3.2xlarge"]["units"].update(a100=2), "nodes.p3.2xlarge.units.a100", "no resource type"),
        (lambda c: c["nodes"]["p3.2xlarge"]["units"].update(cpu=0), "nodes.p3.2xlarge.units.cpu", "must be >= 1"),
        (lambda c: c["nodes"]["c5.18xlarge"].pop("price"), "nodes.c5.18xlarge.price", "required field is missing"),
        (lambda c: c["nodes"]["c5.18xlarge"].update(available=0), "nodes.c5.18xlarge.available", "must be >= 1"),
        (lambda c: c["nodes"]["c5.18xlarge"].update(units={}), "nodes.c5.18xlarge.units", "must not be empty"),
        (lambda c: c["resources"]["cpu"].update(price=0.04), "resources.cpu.price", "lists nodes"),
        (lambda c: c["resources"]["v100"].update(limit=8), "resources.v100.limit", "lists nodes"),
        (lambda c: c["resources"].update(a100={}), "resources.a100", "no node kind holds a100"),
        (lambda c: c.update(nodes={}), "nodes", "must not be empty"),
        (lambda c: c.pop("nodes"), "resources.cpu", "needs a price"),
    ],
)
def test_a_bad_nodes_section_is_one_line_naming_its_field(tmp_path, change, where, says):
    cluster = json.loads(json.dumps(NODES))
    change(cluster)
    path = write_yaml(tmp_path / "c.yaml", cluster)
    result = runner.invoke(app, ["plan", str(ROOT / "profiles/ctr.yaml"), path, "--scheduler", "greedy"])
    shown = " ".join(result.output.split())
    assert result.exit_code == 2, shown
    assert f"{path}:" in shown and f"{where}:" in shown and says in shown, shown
    assert "Traceback" not in result.output


def test_a_node_priced_plan_says_what_it_rents_and_check_recomputes_it(tmp_path):
    cluster = write_yaml(tmp_path / "nodes.yaml", NODES)
    out = tmp_path / "plan.yaml"
    profile = str(ROOT / "profiles/ctr.yaml")
    result = runner.invoke(app, ["plan", profile, cluster, "--scheduler", "exact", "--out", str(out)])
    assert result.exit_code == 0, result.output
    shown = " ".join(result.output.split())
    assert "rents 1 × p3.2xlarge, 1 × c5.18xlarge ($6.12/h, billed whole)" in shown
    written = yaml.safe_load(out.read_text())
    assert written["rental"] == {"p3.2xlarge": 1, "c5.18xlarge": 1} and written["rate_usd_per_hour"] == 6.12
    assert math.isclose(written["cost_usd"], written["time_s"] / 3600 * 6.12, rel_tol=1e-12)
    assert all(sum(s["nodes"].values()) == s["replicas"] for s in written["stages"])
    check = ["check", str(out), "--profile", profile, "--cluster", cluster]
    assert runner.invoke(app, check).exit_code == 0
    rented = dict(written["rental"])
    written["rental"] = {"p3.2xlarge": 2, "c5.18xlarge": 1}  # a node more than its stages use
    out.write_text(yaml.safe_dump(written, sort_keys=False))
    stale = runner.invoke(app, check)
    shown = " ".join(stale.output.split())
    assert stale.exit_code == 1 and "rate_usd_per_hour 6.12 -> 9.18" in shown, shown
    written["rental"] = {"p3.2xlarge": 1}  # its stages still on a c5.18xlarge: no file to check
    out.write_text(yaml.safe_dump(written, sort_keys=False))
    refused = runner.invoke(app, check)
    shown = " ".join(refused.output.split())
    assert refused.exit_code == 2 and "the plan rents no 'c5.18xlarge' nodes" in shown and rented, shown


def test_validate_shows_the_node_kinds(tmp_path):
    cluster = write_yaml(tmp_path / "nodes.yaml", NODES)
    result = runner.invoke(app, ["validate", cluster], env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    assert "per node" in result.output and "p3.2xlarge" in result.output and "v100×1, cpu×4" in result.output


def test_the_bundled_node_priced_plan_is_what_its_files_give():
    profile, cluster = str(ROOT / "profiles/ctr.yaml"), str(ROOT / "clusters/aws-p3-nodes.yaml")
    result = runner.invoke(app, ["check", str(ROOT / "docs/plans/ctr-aws-p3.yaml"), "--profile", profile,
                                 "--cluster", cluster])  # fmt: skip
    assert result.exit_code == 0, result.output
    written = yaml.safe_load((ROOT / "docs/plans/ctr-aws-p3.yaml").read_text())
    assert written["optimal"] is True and written["rental"] == {"p3.2xlarge": 1, "c5.18xlarge": 1}


@settings(max_examples=40, **SETTINGS)
@given(node_instances())
def test_what_if_is_the_fastest_plan_on_one_node_more_or_fewer_by_enumeration(inst):
    from heterps_cli.schedulers import with_what_if

    plan, problem = _exact(inst, "cost")
    if plan is None:
        return
    arrays, B0, _, (units, price, available) = inst
    names = [f"n{k}" for k in range(len(price))]
    rented = np.array([plan.rental.get(n, 0) for n in names])
    rows = with_what_if(problem, plan).what_if
    expected = []
    for k in range(len(price)):
        for change in (1, -1):
            other = rented.copy()
            other[k] += change
            if 0 <= other[k] <= available[k] and other.any():
                expected.append((names[k], change, other))
    assert [(w.kind, w.change) for w in rows] == [(n, c) for n, c, _ in expected]
    for w, (_, _, other) in zip(rows, expected):
        fastest = brute_force(*arrays[:6], other @ units, B0, 1e6, objective="time")
        if fastest is None:
            assert w.throughput is None
            continue
        assert math.isclose(w.throughput, fastest[1], rel_tol=1e-9)
        assert math.isclose(w.cost_usd, 1e6 / fastest[1] / 3600 * float(other @ price), rel_tol=1e-9)


def test_explain_names_the_binding_term_and_what_holds_it(tmp_path):
    profile = str(ROOT / "profiles/ctr.yaml")
    cost = runner.invoke(app, ["plan", profile, str(ROOT / "clusters/paper.yaml"), "-s", "exact", "--json"])
    why = json.loads(cost.stdout)["explanation"]
    # stage 1 is fc1..relu3 on one V100: 3.09 ms of compute against 0.866 ms of all-reduce (the plan's own figures)
    assert why[0].startswith("stage 1 (v100 × 1, layers 2-7) sets the throughput: compute takes 3.09 ms a batch")
    assert "communication (0.866 ms) overlaps it" in why[0]
    assert why[1].startswith("the objective is cost: the plan meets the required 150,000 samples/s")
    tight = json.loads(json.dumps(NODES))
    tight["nodes"] = {"p3.2xlarge": {"price": 3.06, "units": {"v100": 1, "cpu": 4}, "available": 1}}
    path = write_yaml(tmp_path / "one.yaml", tight)
    fastest = runner.invoke(app, ["plan", profile, path, "-s", "exact", "--objective", "time", "--json"])
    assert fastest.exit_code == 0, fastest.output
    assert "it has no more" in json.loads(fastest.stdout)["explanation"][1]
    assert "the plan uses all" in json.loads(fastest.stdout)["explanation"][1]


def test_explain_what_if_is_in_the_output_and_check_recomputes_it(tmp_path):
    cluster = write_yaml(tmp_path / "nodes.yaml", NODES)
    profile = str(ROOT / "profiles/ctr.yaml")
    out = tmp_path / "plan.yaml"
    result = runner.invoke(app, ["plan", profile, cluster, "-s", "exact", "--explain", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "what if the rental had one node more or fewer" in result.output
    written = yaml.safe_load(out.read_text())
    assert {(w["kind"], w["change"]) for w in written["what_if"]} == {
        ("p3.2xlarge", 1), ("p3.2xlarge", -1), ("c5.18xlarge", 1), ("c5.18xlarge", -1)
    }  # fmt: skip
    check = ["check", str(out), "--profile", profile, "--cluster", cluster]
    assert runner.invoke(app, check).exit_code == 0
    written["what_if"][0]["throughput"] *= 2
    out.write_text(yaml.safe_dump(written, sort_keys=False))
    assert runner.invoke(app, check).exit_code == 1
    units = runner.invoke(app, ["plan", profile, str(ROOT / "clusters/paper.yaml"), "-s", "exact", "--explain"])
    assert units.exit_code == 0 and "what if a type's limit were one higher or lower" in units.output


def test_a_profiles_job_has_no_rental(tmp_path):
    profile = yaml.safe_load((ROOT / "profiles/ctr.yaml").read_text())
    profile["job"]["rental"] = {"p3.2xlarge": 1}  # a plan's field, not a job's
    path = write_yaml(tmp_path / "p.yaml", profile)
    result = runner.invoke(app, ["validate", path])
    assert result.exit_code == 2 and "job.rental" in result.output


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
@settings(max_examples=200, **SETTINGS)
@given(st.integers(0, 2**32 - 1))
def test_the_menu_keeps_exactly_the_rentals_no_other_beats(seed):
    from heterps_cli.nodes import _unbeaten

    rng = np.random.default_rng(seed)
    n, T = int(rng.integers(1, 2000)), int(rng.integers(1, 4))  # more rows than one block of the check
    capacity, rate = rng.integers(0, 6, (n, T)), rng.integers(0, 8, n).astype(float)
    order = np.lexsort((-capacity.sum(axis=1), rate))
    first = np.empty(n, dtype=int)
    first[order] = np.arange(n)  # where each row comes, cheapest first
    holds = (capacity[None, :, :] >= capacity[:, None, :]).all(axis=2)  # [i, j]: j holds at least i's units
    beaten = (holds & (rate[None, :] <= rate[:, None]) & (first[None, :] < first[:, None])).any(axis=1)
    assert set(_unbeaten(capacity, rate).tolist()) == set(np.flatnonzero(~beaten).tolist())


def test_a_cluster_rentable_in_too_many_ways_is_refused_at_once(tmp_path):
    cluster = {"cluster": "x", "resources": {"cpu": {}, "v100": {}},
               "nodes": {"n": {"price": 1, "units": {"cpu": 10**9, "v100": 1}, "available": 10**6}}}  # fmt: skip
    path = write_yaml(tmp_path / "c.yaml", cluster)
    result = runner.invoke(app, ["plan", str(ROOT / "profiles/ctr.yaml"), path, "-s", "exact"])
    shown = " ".join(result.output.split())
    assert result.exit_code == 2 and "lower the nodes' available counts" in shown, shown


def test_no_rental_reaching_the_throughput_says_what_would(tmp_path):
    few = json.loads(json.dumps(NODES))
    few["nodes"]["c5.18xlarge"]["available"] = 1
    path = write_yaml(tmp_path / "few.yaml", few)
    ctr = str(ROOT / "profiles/ctr.yaml")
    result = runner.invoke(app, ["plan", ctr, path, "-s", "exact", "--min-throughput", "5e6"])
    said = " ".join(result.stderr.split())
    assert result.exit_code == 3 and "The cheapest plan that reaches it needs" in said, said
    assert "(every node holds" in said and "offer more nodes" in said
    capped = runner.invoke(app, ["plan", ctr, path, "-s", "exact", "--min-throughput", "2e7"])
    said = " ".join(capped.stderr.split())
    assert capped.exit_code == 3 and "With 100 times the units of every node the fastest plan reaches only" in said
    assert "gradient synchronisation takes" in said and "does not shrink with replicas" in said
