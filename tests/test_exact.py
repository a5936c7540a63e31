"""The exact scheduler against brute-force enumeration on many small random instances."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from heterps_cli.errors import InfeasibleError, InputError
from heterps_cli.schedulers import exact
from heterps_cli.schedulers.exact import kernel, step
from tests.helpers import instance_dicts, problem_from_dicts, random_hardware, random_instance
from tests.oracle import brute_force, spec_figures
from tests.strategies import SETTINGS, hardware_instances, instances


def _solve_both(arrays, B0, min_throughput, objective, max_cost=None, hardware=None):
    profile, cluster = instance_dicts(*arrays, B0=B0, samples=1e6, min_throughput=min_throughput, hardware=hardware)
    problem = problem_from_dicts(profile, cluster, objective=objective, max_cost=max_cost)
    expected = brute_force(
        *arrays,
        B0,
        problem.work,
        min_throughput=min_throughput,
        max_cost=max_cost,
        objective=objective,
        hardware=hardware,
    )
    try:
        plan = exact.solve(problem)
    except InfeasibleError:
        plan = None
    # Both find no plan, or both find one; then the plan must check out against docs/spec.md.
    assert (plan is None) == (expected is None), f"exact: {plan and plan.cost_usd}, enumeration: {expected}"
    if plan is not None:
        _check_plan(profile, cluster, plan)
    return plan, expected


def _check_plan(profile, cluster, plan, optimal=True):
    """The plan is feasible and its figures are the spec's, recomputed independently."""
    d = plan.to_dict()
    ref = spec_figures(profile, cluster, d)
    assert math.isclose(d["throughput"], ref["throughput"], rel_tol=1e-9)
    assert math.isclose(d["cost_usd"], ref["cost_usd"], rel_tol=1e-9, abs_tol=1e-12)
    for t, k in ref["resources"].items():
        assert k <= cluster["resources"][t]["limit"]
    assert ref["throughput"] >= profile["job"]["min_throughput"] * (1 - 1e-9)
    assert plan.optimal is optimal and plan.feasible
    assert ref["memory_fits"], "a replica exceeds its unit's memory"
    for stage, transfer, memory in zip(plan.stages, ref["transfer_s"], ref["memory_gb"]):
        assert math.isclose(stage.transfer_s, transfer, rel_tol=1e-9, abs_tol=1e-15)
        assert math.isclose(stage.memory_gb, memory, rel_tol=1e-9, abs_tol=1e-15)


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
@settings(max_examples=400, **SETTINGS)
@given(instances())
def test_min_cost_matches_brute_force(inst):
    plan, expected = _solve_both(*inst, "cost")
    if plan is not None:
        assert math.isclose(plan.cost_usd, expected[0], rel_tol=1e-9, abs_tol=1e-12)


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
@settings(max_examples=200, **SETTINGS)
@given(instances())
def test_max_throughput_matches_brute_force(inst):
    plan, expected = _solve_both(*inst, "time")
    if plan is not None:
        assert math.isclose(plan.throughput, expected[1], rel_tol=1e-9)
        assert math.isclose(plan.cost_usd, expected[0], rel_tol=1e-9, abs_tol=1e-12), "ties go to the cheaper plan"


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
@settings(max_examples=100, **SETTINGS)
@given(instances(), st.sampled_from([0.5, 1.0, 2.0]))
def test_max_throughput_within_budget_matches_brute_force(inst, budget_scale):
    arrays, B0, min_throughput = inst
    cheapest = brute_force(*arrays, B0, 1e6, min_throughput=min_throughput, objective="cost")
    if cheapest is None:
        return
    max_cost = cheapest[0] * budget_scale
    plan, expected = _solve_both(arrays, B0, min_throughput, "time", max_cost=max_cost)
    if plan is None:
        return
    assert plan.cost_usd <= max_cost * (1 + 1e-9)
    assert math.isclose(plan.throughput, expected[1], rel_tol=1e-9)


# -- docs/spec.md section 1b: memory per replica and stage-boundary transfer ------------------------------


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
@settings(max_examples=300, **SETTINGS)
@given(hardware_instances(), st.sampled_from(["cost", "time"]))
def test_exact_matches_brute_force_with_memory_and_transfer(inst, objective):
    arrays, B0, min_throughput, hardware = inst
    plan, expected = _solve_both(arrays, B0, min_throughput, objective, hardware=hardware)
    if plan is not None:
        figure, want = (plan.throughput, expected[1]) if objective == "time" else (plan.cost_usd, expected[0])
        assert math.isclose(figure, want, rel_tol=1e-9, abs_tol=1e-12)


def test_memory_binds_in_the_generated_instances():
    """The generator makes memory bind (more replicas, or a type ruled out) as well as not."""
    from heterps_cli.replica_counts import min_memory_replicas

    seen = set()
    for seed in range(60):
        rng = np.random.default_rng(seed)
        arrays = random_instance(rng, 4, 2)
        hardware = random_hardware(rng, arrays[0])
        problem = problem_from_dicts(*instance_dicts(*arrays, hardware=hardware))
        fixed, split = problem.memory_parts
        k = min_memory_replicas(fixed[:, None], split[:, None], problem.memory[None, :])
        seen |= {"none" if np.isinf(problem.memory).all() else "free"} | {
            "more replicas" if 1 < x < np.inf else "ruled out" if x == np.inf else "fits" for x in k.ravel()
        }
    assert {"more replicas", "ruled out", "fits"} <= seen


def test_binding_limits_change_the_answer():
    """A case built so the unconstrained optimum needs more GPUs than the cluster has."""
    oct_ = np.array([[1.0, 0.01], [1.0, 0.01], [1.0, 0.01]])
    odt = np.zeros((3, 2))
    ones = np.ones((3, 2))
    runnable = np.ones((3, 2), dtype=bool)
    prices, B0 = np.array([0.04, 2.42]), 32
    for limits in ([20, 1], [20, 4]):
        arrays = (oct_, odt, ones * 0.95, ones, runnable, prices, np.array(limits))
        plan, expected = _solve_both(arrays, B0, 150.0, "cost")
        assert plan is not None
        assert math.isclose(plan.cost_usd, expected[0], rel_tol=1e-9)
        assert plan.resources["r1"] <= limits[1]


def test_infeasible_reports_the_best_reachable_throughput():
    arrays = random_instance(np.random.default_rng(7), 4, 2)
    profile, cluster = instance_dicts(*arrays, min_throughput=1e12)
    problem = problem_from_dicts(profile, cluster)
    with pytest.raises(InfeasibleError, match=r"fastest possible plan reaches [\d,.]+ samples/s"):
        exact.solve(problem)


# -- relaxed limits: more binding limits than the DP may track ----------------------------------


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
@settings(max_examples=250, **SETTINGS)
@given(instances(), st.sampled_from(["cost", "time"]))
def test_relaxed_limits_give_a_feasible_plan_and_a_true_bound(inst, objective):
    """With room for almost no states, the solver relaxes the limits it cannot track: the plan it
    returns must still be feasible, and its gap a true bound on the distance to the optimum."""
    arrays, B0, min_throughput = inst
    profile, cluster = instance_dicts(*arrays, B0=B0, samples=1e6, min_throughput=min_throughput)
    problem = problem_from_dicts(profile, cluster, objective=objective)
    expected = brute_force(*arrays, B0, problem.work, min_throughput=min_throughput, objective=objective)
    with pytest.MonkeyPatch.context() as patch:
        for module in (kernel, step):  # the DP's own check, and where the solver decides to relax
            patch.setattr(module, "MAX_STATE_CELLS", (problem.n_layers + 1) * problem.n_types * 2)
        try:
            plan = exact.solve(problem)
        except InfeasibleError:
            assert expected is None, "a relaxation without a plan proves there is none"
            return
        except InputError as error:  # no plan within every limit was found: said, never guessed
            assert "no plan within every limit was found" in str(error)
            return
    assert expected is not None, "a plan was returned for a problem without one"
    _check_plan(profile, cluster, plan, optimal=plan.optimal)
    if objective == "cost":
        assert plan.cost_usd >= expected[0] * (1 - 1e-9)
        assert expected[0] >= plan.cost_usd / (1 + (plan.gap or 0.0)) * (1 - 1e-9), "the gap is not a bound"
    else:
        assert plan.throughput <= expected[1] * (1 + 1e-9)
        assert expected[1] <= plan.throughput / (1 - (plan.gap or 0.0)) * (1 + 1e-9), "the gap is not a bound"
    if plan.optimal:
        figure, want = (plan.cost_usd, expected[0]) if objective == "cost" else (plan.throughput, expected[1])
        assert math.isclose(figure, want, rel_tol=1e-9, abs_tol=1e-12)
    else:
        assert plan.gap is not None and plan.gap > 0 and "relaxed the limits of" in plan.notes[0]


def test_one_thousand_layers_on_four_types_relax_nothing_and_are_optimal():
    """The case that used to be refused ("would need 48,148,100 states") fits the state budget."""
    # Tracked here as a size: the run itself is in benchmarks/bench_scale.py (13 s).
    assert 1001 * 4 * (480 + 1) * (24 + 1) <= kernel.MAX_STATE_CELLS


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
@settings(max_examples=60, **SETTINGS)
@given(instances(), st.sampled_from(["cost", "time"]))
def test_what_if_a_limit_were_one_higher_or_lower_is_the_enumerated_optimum(inst, objective):
    arrays, B0, min_throughput = inst
    profile, cluster = instance_dicts(*arrays, B0=B0, samples=1e6, min_throughput=min_throughput)
    problem = problem_from_dicts(profile, cluster, objective=objective)
    try:
        plan = exact.solve(problem)
    except InfeasibleError:
        return
    rows = exact.what_if(problem, plan)
    limits = arrays[6]
    expected = [(t, c) for t in range(len(limits)) for c in (1, -1) if limits[t] + c >= 1]
    assert [(problem.types.index(w["kind"]), w["change"]) for w in rows] == expected
    for w, (t, change) in zip(rows, expected):
        other = limits.copy()
        other[t] += change
        assert w["limit"] == other[t]
        best = brute_force(*arrays[:6], other, B0, 1e6, min_throughput=min_throughput, objective=objective)
        assert (w["throughput"] is None) == (best is None)
        if best is not None:
            assert math.isclose(w["cost_usd"], best[0], rel_tol=1e-9, abs_tol=1e-12)
            if objective == "time":
                assert math.isclose(w["throughput"], best[1], rel_tol=1e-9)


def _cheapest_chain_by_enumeration(K, prices, limits):
    """The least price rate over every chain of stages whose units fit the limits (None: none)."""
    n1, _, T = K.shape
    best = None

    def walk(j, last, used, rate):
        nonlocal best
        if j == n1 - 1:
            best = rate if best is None else min(best, rate)
            return
        for i in range(j + 1, n1):
            for t in range(T):
                k = K[i, j, t]
                if t == last or not np.isfinite(k) or used[t] + k > limits[t]:
                    continue
                used[t] += k
                walk(i, t, used, rate + prices[t] * k)
                used[t] -= k

    walk(0, -1, np.zeros(T), 0.0)
    return best


@settings(max_examples=200, **SETTINGS)
@given(st.integers(0, 2**32 - 1), st.integers(1, 5), st.booleans())
def test_the_limit_aware_dp_is_the_cheapest_chain_within_the_limits(seed, n, capped):
    """The kernel's limit-aware DP (units of the tracked types in its state; the capped type's counted
    and checked at the end) against enumeration of every chain of stages."""
    rng = np.random.default_rng(seed)
    T = 3
    K = rng.integers(1, 4, size=(n + 1, n + 1, T)).astype(float)
    K[rng.random(K.shape) < 0.2] = np.inf
    K[np.triu_indices(n + 1)] = np.inf  # only j < i is a stage
    prices = rng.choice([0.5, 1.0, 3.0], size=T)
    limits = rng.integers(1, 6, size=T)
    tracked, cap = ([0, 1], 2) if capped else ([0, 1, 2], None)
    want = _cheapest_chain_by_enumeration(K, prices, limits)
    stages = kernel.chain_dp_limited(K, prices, limits, tracked, cap)
    if want is None:
        assert stages is None
        return
    assert stages is not None and stages[0][0] == 0 and stages[-1][1] == n
    used = np.zeros(T)
    for j, i, t in stages:
        used[t] += K[i, j, t]
    assert (used <= limits).all()
    assert math.isclose(float(prices @ used), want, rel_tol=1e-12)


def _cheapest_on_chain(K, prices, limits, chain):
    """:func:`_cheapest_chain_by_enumeration` on a :class:`~kernel.Chain`: DP types of resource types
    ``chain.base``, each replica ``chain.widths`` units of it, and which may start, end and follow which."""
    n1, _, P = K.shape
    best = None

    def walk(j, last, used, rate):
        nonlocal best
        if j == n1 - 1:
            if chain.ends[last]:
                best = rate if best is None else min(best, rate)
            return
        for i in range(j + 1, n1):
            for t in range(P):
                k, b = K[i, j, t], chain.base[t]
                allowed = chain.starts[t] if last < 0 else chain.follows[last, t]
                if not allowed or not np.isfinite(k) or used[b] + k * chain.widths[t] > limits[b]:
                    continue
                used[b] += k * chain.widths[t]
                walk(i, t, used, rate + prices[t] * k)
                used[b] -= k * chain.widths[t]

    walk(0, -1, np.zeros(len(limits)), 0.0)
    return best


@settings(max_examples=150, **SETTINGS)
@given(st.integers(0, 2**32 - 1), st.integers(1, 4), st.booleans(), st.booleans())
def test_the_limit_aware_dp_on_a_chain_of_ways_is_the_cheapest_within_the_limits(seed, n, capped, tight):
    """The same on DP types that are ways of running a type (section 1h's degrees: a replica of 1 or 2
    units), with drawn rules for which may start, end and follow which (as a pipeline's places); ``tight``:
    the state's budget holds its tables but not the padded one, so the DP masks the shifts instead."""
    rng = np.random.default_rng(seed)
    base, widths = np.array([0, 0, 1, 1, 2]), rng.choice([1, 2], size=5)
    P = len(base)
    chain = kernel.Chain(base, rng.random((P, P)) < 0.6, rng.random(P) < 0.8, rng.random(P) < 0.8, None, widths)
    K = rng.integers(1, 3, size=(n + 1, n + 1, P)).astype(float)
    K[rng.random(K.shape) < 0.2] = np.inf
    K[np.triu_indices(n + 1)] = np.inf
    prices = rng.choice([0.5, 1.0, 3.0], size=3)[base] * widths  # a replica's: its units at its type's price
    limits = rng.integers(1, 7, size=3)
    tracked, cap = ([0, 1], 2) if capped else ([0, 1, 2], None)
    want = _cheapest_on_chain(K, prices, limits, chain)
    with pytest.MonkeyPatch.context() as patch:
        if tight:
            patch.setattr(kernel, "MAX_STATE_CELLS", (n + 1) * P * math.prod(int(limits[t]) + 1 for t in tracked))
        stages = kernel.chain_dp_limited(K, prices, limits, tracked, cap, chain)
    if want is None:
        assert stages is None
        return
    assert stages is not None and stages[0][0] == 0 and stages[-1][1] == n
    used = np.zeros(3)
    for j, i, t in stages:
        used[base[t]] += K[i, j, t] * widths[t]
    assert (used <= limits).all()
    assert math.isclose(sum(prices[t] * K[i, j, t] for j, i, t in stages), want, rel_tol=1e-12)
