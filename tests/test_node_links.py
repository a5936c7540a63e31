"""Links inside a node (docs/spec.md section 1e): on one node whose kind gives ``link_gbps``, a
layer's all-reduce and a stage's boundary transfer go over the node's links where they are faster
than the network. The exact solver against enumeration of every schedule, replica vector and
rental, each rental with its own links, and the heuristics on them (the commands: test_node_links_commands)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from heterps_cli.errors import InfeasibleError
from heterps_cli.schedulers import exact, solve
from tests.helpers import instance_dicts, problem_from_dicts, random_hardware, random_instance
from tests.oracle import (
    _better,
    _cuts_and_replicas,
    _section_1b,
    assert_is_the_frontier,
    assert_is_the_optimum,
    partitions_of,
    pipeline_figures,
    share,
)
from tests.strategies import SETTINGS


@st.composite
def linked_instances(draw, layers=(4, 3)):
    """(arrays, B0, min_throughput, hardware, nodes, links): as test_nodes.py's node instances, with
    section 1b's sizes, memory and bandwidth, and per kind a link for some of the types it holds,
    drawn around what makes a layer's all-reduce over it cost about its odt. ``layers``: at most
    that many on 2 types, and on 3."""
    T = draw(st.integers(2, 3))
    n = draw(st.integers(1, layers[0] if T == 2 else layers[1]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    arrays = random_instance(rng, n, T)
    B0 = 32
    hardware = random_hardware(rng, arrays[0], B0, tightness=draw(st.sampled_from((1.5, 4.0, 1e3))))
    K = draw(st.integers(1, 3))
    units = rng.integers(0, 3, (K, T))
    units[rng.integers(0, K, T), np.arange(T)] = rng.integers(1, 3, T)
    units[units.sum(axis=1) == 0, 0] = 1
    if draw(st.booleans()):  # kinds of one type each, so that a plan of two types rents two nodes or more
        K = T
        units = np.diag(rng.integers(1, 3, T))
    price = rng.uniform(0.5, 10.0, K).round(3)
    available = rng.integers(1, 3, K)
    odt = arrays[1]
    typical = np.median(hardware["weight_size"]) / max(np.median(odt[odt > 0]) if (odt > 0).any() else 1.0, 1e-9)
    links = [
        [
            round(float(typical * 8 / 1e9 * rng.choice([0.1, 1.0, 10.0])), 6) or 1e-6
            if units[k, t] and rng.random() < 0.7
            else None
            for t in range(T)
        ]
        for k in range(K)
    ]
    reference = B0 / arrays[0].min(axis=1).sum()
    min_throughput = draw(st.sampled_from((0.0, 0.5, 1.0))) * reference
    return arrays, B0, min_throughput, hardware, (units, price, available), links


def _dicts(inst):
    arrays, B0, min_throughput, hardware, (units, price, available), links = inst
    profile, cluster = instance_dicts(*arrays, B0=B0, samples=1e6, min_throughput=min_throughput, hardware=hardware)
    types = list(cluster["resources"])
    for t in types:
        for key in ("price", "limit"):
            cluster["resources"][t].pop(key)
    cluster["nodes"] = {}
    for k in range(len(price)):
        node = {
            "price": float(price[k]),
            "units": {t: int(u) for t, u in zip(types, units[k]) if u},
            "available": int(available[k]),
        }
        if any(g is not None for g in links[k]):
            node["link_gbps"] = {t: g for t, g in zip(types, links[k]) if g is not None}
        cluster["nodes"][f"n{k}"] = node
    return profile, cluster


def _first_nodes(counts, units, links):
    """Per type, the room (units on it) and link (Gbit/s, or None) of the first node of the rental
    that holds it, its nodes listed kind by kind in the file's order: written from section 1e, node
    by node."""
    nodes = [k for k, c in enumerate(counts) for _ in range(int(c))]
    room, link = [], []
    for t in range(units.shape[1]):
        first = next((k for k in nodes if units[k, t] > 0), None)
        room.append(0 if first is None else int(units[first, t]))
        link.append(None if first is None else links[first][t])
    return np.array(room), link


def _rentals(inst):
    """Every rental but the empty one: (counts, capacity, rate, room, link), the last two per type as
    :func:`_first_nodes` gives them."""
    units, price, available = inst[4]
    for counts in itertools.product(*(range(int(a) + 1) for a in available)):
        counts = np.array(counts)
        if counts.any():
            yield (counts, counts @ units, float(counts @ price), *_first_nodes(counts, units, inst[5]))


def _enumerated(inst, objective):
    """The optimum among :func:`_every_plan`'s: (cost, throughput) or None."""
    best = None
    for c, x in zip(*_every_plan(inst)):
        if best is None or _better(objective, c, x, *best):
            best = (float(c), float(x))
    return best


def _every_plan(inst):
    """(cost, throughput) arrays of every feasible plan over every rental (a count of each kind),
    every schedule and every replica vector within the rental's units, written from section 1e: a
    type whose units in the plan all fit the first node holding it, whose kind gives it a link, has
    an odt of min(odt, weight_size / link) on unsharded layers, and on a rental of one node a
    bandwidth of max(bandwidth, link) too; the rest keep the network's."""
    arrays, B0, min_throughput, hw, (units, price, available), links = inst
    oct_, odt, alpha, beta, runnable = arrays[:5]
    n, T = oct_.shape
    costs, thrs = [np.zeros(0)], [np.zeros(0)]
    for counts, capacity, rate, room, link in _rentals(inst):
        bandwidth = list(hw["bandwidth_gbps"])
        if counts.sum() == 1:
            bandwidth = [b if b is None or g is None else max(b, g) for b, g in zip(bandwidth, link)]
        here = {**hw, "bandwidth_gbps": bandwidth}
        for sched in itertools.product(range(T), repeat=n):
            if not all(runnable[layer, t] for layer, t in enumerate(sched)):
                continue
            for stages in partitions_of(sched):
                ks = np.array(
                    list(itertools.product(*(range(1, min(capacity[t], B0) + 1) for t, _ in stages))), dtype=float
                )
                if len(ks) == 0:
                    continue
                used = np.stack(
                    [ks[:, [s for s, (u, _) in enumerate(stages) if u == t]].sum(axis=1) for t in range(T)], 1
                )
                ks, used = ks[(used <= capacity).all(axis=1)], used[(used <= capacity).all(axis=1)]
                if len(ks) == 0:
                    continue
                inside = np.array([g is not None for g in link])[None, :] & (used <= room[None, :])
                worst, fits = np.zeros(len(ks)), np.ones(len(ks), dtype=bool)
                for s, (t, ls) in enumerate(stages):
                    k = ks[:, s]
                    c = sum(
                        oct_[layer, t] * (1 - alpha[layer, t] + alpha[layer, t] * share(B0, k) / B0) for layer in ls
                    )
                    d = np.zeros(len(ks))
                    for layer in ls:
                        o = np.full(len(ks), odt[layer, t])
                        if link[t] is not None and not hw["sharded"][layer]:
                            o = np.where(inside[:, t], np.minimum(o, hw["weight_size"][layer] / (link[t] * 1e9 / 8)), o)
                        d = d + o * (1 - beta[layer, t] + beta[layer, t] * share(B0, k) / B0)
                    c, d, fit = _section_1b(here, B0, n, t, ls, k, c, d)
                    worst, fits = np.maximum(worst, np.maximum(c, d)), fits & fit
                thr = B0 / worst
                cost = 1e6 / thr / 3600 * rate
                ok = fits & (thr >= min_throughput * (1 - 1e-12))
                costs.append(cost[ok])
                thrs.append(thr[ok])
    return np.concatenate(costs), np.concatenate(thrs)


def _solve(inst, scheduler, objective):
    profile, cluster = _dicts(inst)
    problem = problem_from_dicts(profile, cluster, objective=objective)
    try:
        return solve(scheduler, problem, seed=1) if scheduler != "exact" else exact.solve(problem)
    except InfeasibleError:
        return None


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
@settings(max_examples=300, **SETTINGS)
@given(linked_instances(), st.sampled_from(["cost", "time"]))
def test_exact_with_links_matches_enumeration_of_schedules_replicas_and_rentals(inst, objective):
    plan = _solve(inst, "exact", objective)
    if assert_is_the_optimum(plan, _enumerated(inst, objective), objective):
        _holds(inst, plan)


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
@settings(max_examples=60, **SETTINGS)
@given(linked_instances(), st.sampled_from([0.7, 1.0, 1.5]))
def test_exact_with_links_within_a_budget_matches_enumeration(inst, scale):
    """Objective time under --max-cost: the fastest enumerated plan within the budget."""
    cheapest = _enumerated(inst, "cost")
    if cheapest is None:
        return
    budget = cheapest[0] * scale
    profile, cluster = _dicts(inst)
    try:
        plan = exact.solve(problem_from_dicts(profile, cluster, objective="time", max_cost=budget))
    except InfeasibleError:
        plan = None
    cost, thr = _every_plan(inst)
    within = cost <= budget * (1 + 1e-12)
    assert (plan is None) == (not within.any())
    if plan is not None:
        assert plan.cost_usd <= budget * (1 + 1e-9)
        assert math.isclose(plan.throughput, thr[within].max(), rel_tol=1e-9)


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
@settings(max_examples=150, **SETTINGS)
@given(linked_instances())
def test_frontier_with_links_is_the_enumerated_pareto_set(inst):
    profile, cluster = _dicts(inst)
    assert_is_the_frontier(problem_from_dicts(profile, cluster), *_every_plan(inst))


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
@settings(max_examples=40, **SETTINGS)
@given(linked_instances(), st.sampled_from(["greedy", "genetic"]))
def test_heuristics_plans_run_on_a_rental_that_holds_them_and_are_no_better_than_the_optimum(inst, scheduler):
    plan = _solve(inst, scheduler, "cost")
    if plan is None:
        return
    _holds(inst, plan)
    optimum = _enumerated(inst, "cost")
    if plan.feasible:
        assert optimum is not None and plan.cost_usd >= optimum[0] * (1 - 1e-9)


def _holds(inst, plan):
    """The plan pays for all of its rental, which holds its units; it says when it runs on one node's links."""
    units, price, available = inst[4]
    rented = np.array([plan.rental.get(f"n{k}", 0) for k in range(len(price))])
    assert (rented <= available).all() and math.isclose(rented @ price, plan.rate_usd_per_hour, rel_tol=1e-12)
    used = np.array([plan.resources[t] for t in plan.resources])
    assert (rented @ units >= used).all()
    assert math.isclose(plan.cost_usd, plan.time_s / 3600 * plan.rate_usd_per_hour, rel_tol=1e-9)
    room, link = _first_nodes(rented, units, inst[5])
    used = np.array([plan.resources[f"r{t}"] for t in range(len(link))])
    over = {f"r{t}": g for t, g in enumerate(link) if g is not None and used[t] <= room[t]}
    assert (plan.link_gbps or {}) == pytest.approx(over)


# -- known answers ---------------------------------------------------------------------------------------


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
@settings(max_examples=40, **SETTINGS)
@given(linked_instances(layers=(3, 2)), st.sampled_from([1, 3]), st.sampled_from(["cost", "time"]))
def test_exact_with_links_and_a_pipeline_schedule_matches_enumeration(inst, micro_batches, objective):
    """Section 1d's terms with links: every plan on every rental, its figures by the oracle's
    pipeline_figures on a profile whose odt (and, on one node, cluster bandwidth) section 1e gives
    that plan, priced at the rental's rate."""
    arrays, B0, min_throughput, hw, (units, price, available), links = inst
    profile, cluster = _dicts(inst)
    profile["job"]["global_batch"] = B0 * micro_batches
    types = list(cluster["resources"])
    best = None
    for counts, capacity, rate, room, link in _rentals(inst):
        here = {"cluster": "x", "resources": {}}
        for t, name in enumerate(types):
            res = {**cluster["resources"][name], "price": 0.0, "limit": max(int(capacity[t]), 1)}
            if counts.sum() == 1 and link[t] is not None and res.get("bandwidth_gbps") is not None:
                res["bandwidth_gbps"] = max(res["bandwidth_gbps"], link[t])
            here["resources"][name] = res
        for sched in itertools.product(range(len(types)), repeat=len(profile["layers"])):
            if not all(types[t] in layer["times"] for t, layer in zip(sched, profile["layers"])):
                continue
            for named, ks in _cuts_and_replicas([types[t] for t in sched], here, profile["batch_size"]):
                run = [types.index(name) for name, _ in named]
                used = np.zeros(len(types))
                for t, k in zip(run, ks):
                    used[t] += k
                if (used > capacity).any():
                    continue
                mine = {**profile, "layers": [dict(layer) for layer in profile["layers"]]}
                for t, name in enumerate(types):
                    if link[t] is None or used[t] > room[t]:
                        continue
                    for i, layer in enumerate(mine["layers"]):
                        if name in layer["times"] and not layer.get("sharded"):
                            over = layer["weight_size"] / (link[t] * 1e9 / 8)
                            times = {**layer["times"], name: {**layer["times"][name]}}
                            times[name]["odt"] = min(times[name]["odt"], over)
                            mine["layers"][i] = {**layer, "times": times}
                f = pipeline_figures(mine, here, [types[t] for t in sched], list(ks), named)
                cost = profile["job"]["samples"] / f["throughput"] / 3600 * rate
                if not f["feasible"] or f["throughput"] < min_throughput * (1 - 1e-12):
                    continue
                if best is None or _better(objective, cost, f["throughput"], *best):
                    best = (cost, f["throughput"])
    try:
        plan = exact.solve(problem_from_dicts(profile, cluster, objective=objective))
    except InfeasibleError:
        plan = None
    assert_is_the_optimum(plan, best, objective)
