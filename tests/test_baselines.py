"""greedy, genetic and random: operators, budgets, constraints, determinism, against brute force."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from heterps_cli.errors import InfeasibleError
from heterps_cli.plan import make_plan
from heterps_cli.schedulers import (
    SCHEDULERS,
    Budget,
    SearchOptions,
    genetic,
    greedy,
    local,
    random_search,
    scoring,
    solve,
)
from tests.helpers import instance_dicts, problem_from_dicts, random_hardware, random_instance
from tests.oracle import brute_force, spec_figures


def _instance(seed=0, n=6, T=3, share=0.5):
    arrays = random_instance(np.random.default_rng(seed), n, T)
    profile, cluster = instance_dicts(*arrays, min_throughput=32 / arrays[0].min(axis=1).sum() * share)
    return arrays, profile, cluster, problem_from_dicts(profile, cluster)


def test_crossover_takes_one_window_from_the_second_parent():
    rng = np.random.default_rng(0)
    a, b = np.zeros((500, 12), dtype=np.int64), np.ones((500, 12), dtype=np.int64)
    children = genetic.crossover(a, b, rng)
    for child in children:
        inside = np.flatnonzero(child == 1)
        assert inside.size == 0 or (np.diff(inside) == 1).all()  # one contiguous window
    assert 0 < children.mean() < 1


def test_mutation_keeps_every_layer_runnable_and_changes_little():
    _, _, _, problem = _instance(seed=4, n=10, T=3)
    rng = np.random.default_rng(1)
    schedule = greedy.rule_schedule(problem)
    for _ in range(300):
        child = genetic.mutate(problem, schedule, rng)
        assert problem.runnable[np.arange(10), child].all()
        assert (child != schedule).sum() <= 3


def test_greedy_rule_is_the_cheapest_compute_per_layer():
    arrays, _, _, problem = _instance(seed=2, n=8, T=3)
    oct_, runnable, prices = arrays[0], arrays[4], arrays[5]
    for layer, t in enumerate(greedy.rule_schedule(problem)):
        options = [oct_[layer, u] * max(prices[u], 1e-12) for u in range(3) if runnable[layer, u]]
        assert runnable[layer, t] and math.isclose(oct_[layer, t] * max(prices[t], 1e-12), min(options))


@pytest.mark.parametrize("name", ["greedy", "genetic", "random"])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_plans_are_feasible_and_never_beat_brute_force(name, seed):
    arrays, profile, cluster, problem = _instance(seed=seed, n=5, T=2)
    expected = brute_force(*arrays, 32, problem.work, min_throughput=problem.min_throughput)
    assert expected is not None
    try:
        plan = solve(name, problem, seed=seed, options=SearchOptions(evaluations=64))
    except InfeasibleError:
        assert name == "greedy"  # a rule may miss; the searches over 32 schedules may not
        return
    figures = spec_figures(profile, cluster, plan.to_dict())
    assert plan.feasible and figures["throughput"] >= problem.min_throughput * (1 - 1e-9)
    assert all(figures["resources"][t] <= cluster["resources"][t]["limit"] for t in figures["resources"])
    assert math.isclose(figures["cost_usd"], plan.cost_usd, rel_tol=1e-9)
    assert plan.cost_usd >= expected[0] * (1 - 1e-9)
    if name != "greedy":  # 64 evaluations cover all 32 schedules of 5 layers on 2 types
        assert math.isclose(plan.cost_usd, expected[0], rel_tol=1e-9)


@pytest.mark.parametrize("name", ["genetic", "random"])
def test_the_budget_is_a_number_of_evaluations(name):
    _, _, _, problem = _instance(seed=5, n=24, T=3, share=0.05)
    plan = solve(name, problem, seed=0, options=SearchOptions(evaluations=300))
    assert plan.evaluations <= 300
    if name == "random":
        assert plan.evaluations == 300


@pytest.mark.parametrize("name", ["genetic", "random"])
def test_same_seed_same_plan(name):
    _, _, _, problem = _instance(seed=6, n=20, T=3, share=0.05)
    runs = [solve(name, problem, seed=s, options=SearchOptions(evaluations=400)) for s in (3, 3)]
    assert runs[0].schedule == runs[1].schedule and runs[0].stages == runs[1].stages


@pytest.mark.parametrize("module", [genetic, random_search])
def test_time_objective_returns_a_fast_plan(module):
    arrays, profile, cluster, _ = _instance(seed=7, n=5, T=2, share=0.0)
    problem = problem_from_dicts(profile, cluster, objective="time")
    expected = brute_force(*arrays, 32, problem.work, objective="time")
    plan = module.solve(problem, seed=0, options=SearchOptions(evaluations=64))
    assert math.isclose(plan.throughput, expected[1], rel_tol=1e-9)


# Every scheduler in the registry: a new one is held to these without editing a list.
@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_infeasible_reports_the_reason(name):
    _, _, _, problem = _instance(seed=8, n=6, T=2, share=1e6)
    with pytest.raises(InfeasibleError, match="no plan reaches"):
        solve(name, problem, options=Budget(steps=4, batch=8, evaluations=50).of(name))


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_no_scheduler_returns_a_plan_that_breaks_memory(name):
    """docs/spec.md section 1b: with memory and bandwidth, every plan a search returns fits every replica's
    memory and states the spec's figures; when it finds none, no plan exists or the error says so."""
    found = 0
    for seed in range({"rl": 3, "tapp": 3, "genetic": 8}.get(name, 16)):
        rng = np.random.default_rng(100 + seed)
        arrays = random_instance(rng, 6, 3)
        hardware = random_hardware(rng, arrays[0])
        profile, cluster = instance_dicts(*arrays, hardware=hardware)
        problem = problem_from_dicts(profile, cluster)
        try:
            plan = solve(name, problem, options=Budget(steps=8, batch=8, evaluations=300).of(name))
        except InfeasibleError:
            continue
        ref = spec_figures(profile, cluster, plan.to_dict())
        assert plan.feasible and ref["memory_fits"], (name, seed)
        assert math.isclose(plan.throughput, ref["throughput"], rel_tol=1e-9)
        assert math.isclose(plan.cost_usd, ref["cost_usd"], rel_tol=1e-9, abs_tol=1e-12)
        found += 1
    assert found > 0


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
@pytest.mark.parametrize("seed", range(12))
def test_price_repair_reports_only_plans_within_every_limit(seed):
    """The repair searches a loosened problem; what it hands back as feasible must hold on the real one
    (the spec's figures, recomputed independently), and it stops after PRICE_REPAIR_SEARCHES searches at most."""
    arrays = random_instance(np.random.default_rng(seed), 7, 3, max_limit=3)
    # The target: 90% of the fastest plan within the limits (by enumeration), so the limits bind.
    fastest = brute_force(*arrays, 32, 1.0, objective="time")
    assert fastest is not None
    profile, cluster = instance_dicts(*arrays, min_throughput=0.9 * fastest[1])
    problem = problem_from_dicts(profile, cluster)
    evaluate = scoring.Evaluator(problem)
    start = np.asarray(greedy.rule_schedule(problem))
    found, rounds = [], []

    def check(row: np.ndarray) -> bool:
        rounds.append(row)
        scores = evaluate(row[None])
        if scores.feasible[0]:
            found.append((row, scores.replicas[0][scores.replicas[0] > 0]))
        return bool(scores.feasible[0])

    before = evaluate.evaluations
    local.price_repair(problem, start, check, evaluate)
    assert 1 <= len(rounds) <= local.PRICE_REPAIR_SEARCHES and evaluate.evaluations > before
    for row, replicas in found:
        plan = make_plan(problem, row, replicas, scheduler="test")
        figures = spec_figures(profile, cluster, plan.to_dict())
        assert figures["throughput"] >= problem.min_throughput * (1 - 1e-9)
        assert all(figures["resources"][t] <= cluster["resources"][t]["limit"] for t in figures["resources"])


@pytest.mark.slow
def test_rl_finds_a_feasible_plan_where_only_the_price_repair_leads_to_one():
    """chain64x4-tight, seed 3: the policy samples nothing feasible and every shortfall descent stalls
    4% short of the target (before the repair rl exited 3 here on all four seeds)."""
    from benchmarks.make_instances import paths
    from heterps_cli.problem import load_problem

    profile, cluster = paths("chain64x4-tight")
    plan = solve("rl", load_problem(str(profile), str(cluster)), seed=3)
    assert plan.feasible


@pytest.mark.slow
def test_rl_is_within_5_percent_where_the_kicks_end_on_binding_limits():
    """chain64x4-tight, seed 0: the kicks ended 6.07% above the optimum with v100 and t4 all in use and
    three places to change at once; the repair run again from there brings it within 5%. In the papers'
    space (--maximal-stages), where rl searches: in the whole space the optimum pipelines stages on one
    type, which rl's schedules of maximal runs miss (docs/compare.md)."""
    from benchmarks.make_instances import paths
    from heterps_cli.problem import load_problem

    profile, cluster = paths("chain64x4-tight")
    problem = load_problem(str(profile), str(cluster), maximal_stages=True)
    plan, optimum = solve("rl", problem, seed=0), solve("exact", problem)
    assert plan.feasible and plan.cost_usd <= 1.05 * optimum.cost_usd


def _binding_instance(seed: int):
    """A random 6-layer, 3-type instance whose target is 90% of the fastest plan within the limits (by
    enumeration), so the limits bind; with its brute-force optimum."""
    arrays = random_instance(np.random.default_rng(seed), 6, 3, max_limit=3)
    fastest = brute_force(*arrays, 32, 1.0, objective="time")
    assert fastest is not None
    profile, cluster = instance_dicts(*arrays, min_throughput=0.9 * fastest[1])
    problem = problem_from_dicts(profile, cluster)
    optimum = brute_force(*arrays, 32, problem.work, min_throughput=problem.min_throughput)
    assert optimum is not None
    return profile, cluster, problem, optimum


def _assert_holds_and_never_beats(profile, cluster, problem, plan, optimum_cost: float) -> None:
    """The plan meets the target and every limit by the spec's figures, and is no cheaper than the optimum."""
    figures = spec_figures(profile, cluster, plan.to_dict())
    assert figures["throughput"] >= problem.min_throughput * (1 - 1e-9)
    assert all(figures["resources"][t] <= cluster["resources"][t]["limit"] for t in figures["resources"])
    assert plan.cost_usd >= optimum_cost * (1 - 1e-9)


@pytest.mark.parametrize("seed", range(6))
def test_plans_on_binding_limits_hold_and_never_beat_brute_force(seed):
    """Targets at 90% of the fastest plan within the limits, so the best plans use all of some type
    and the polish runs the price repair on them too: what it reports holds by the spec's figures and is
    never cheaper than the brute-force optimum."""
    profile, cluster, problem, optimum = _binding_instance(50 + seed)
    plan = solve("greedy", problem, seed=seed)
    _assert_holds_and_never_beats(profile, cluster, problem, plan, optimum[0])


def _stage_list(schedule):
    bounds = [0, *(np.flatnonzero(np.diff(schedule)) + 1).tolist(), len(schedule)]
    return list(zip(bounds[:-1], bounds[1:]))


def test_a_kick_recolours_one_run_or_makes_two_stages_trade_types():
    _, _, _, problem = _instance(seed=9, n=12, T=3)
    rng = np.random.default_rng(0)
    schedule = np.array([0, 0, 1, 1, 1, 2, 2, 0, 0, 0, 1, 2])
    schedule = np.where(problem.runnable[np.arange(12), schedule], schedule, problem.runnable.argmax(axis=1))
    stages = _stage_list(schedule)
    trades = runs = 0
    for _ in range(300):
        row = local.kick(problem, schedule, rng)
        assert problem.runnable[np.arange(12), row].all()
        changed = np.flatnonzero(row != schedule)
        whole = [(a, z) for a, z in stages if (row[a:z] != schedule[a:z]).any()]
        if (
            len(whole) == 2
            and all((row[a:z] == row[a]).all() for a, z in whole)
            and row[whole[0][0]] == schedule[whole[1][0]]
            and row[whole[1][0]] == schedule[whole[0][0]]
        ):
            trades += 1
        else:
            assert changed.size and changed[-1] - changed[0] < 8 and len(set(row[changed])) == 1  # within 2..8 layers
            runs += 1
    assert trades > 50 and runs > 50


@pytest.mark.parametrize("seed", range(6))
def test_window_search_finds_at_least_the_best_plan_of_three_stages(seed):
    """With the whole model inside one window, window_search tries every schedule of up to three stages:
    its plan is at least as cheap as the best of them by enumeration, and holds by the spec's figures."""
    n = 7
    arrays = random_instance(np.random.default_rng(80 + seed), n, 3, max_limit=3)
    few = [s for s in itertools.product(range(3), repeat=n) if len(_stage_list(np.array(s))) <= 3]
    fastest = brute_force(*arrays, 32, 1.0, objective="time", schedules=few, maximal=True)
    assert fastest is not None
    # 90% of the fastest such plan: the limits bind, and the cheapest plans are not the fastest
    profile, cluster = instance_dicts(*arrays, min_throughput=0.9 * fastest[1])
    problem = problem_from_dicts(profile, cluster)
    best = brute_force(*arrays, 32, problem.work, min_throughput=problem.min_throughput, schedules=few, maximal=True)
    assert best is not None
    evaluate = scoring.Evaluator(problem)
    start = greedy.rule_schedule(problem)
    # The reward's scale, as the schedulers set it: from a pool of random schedules (with only the greedy
    # rule's and the heuristics', every plan here can be over CAP times the scale, and all rank equal)
    pool = scoring.random_schedules(problem, 256, np.random.default_rng(seed))
    reference = scoring.Reference.of(evaluate(np.concatenate([start[None], pool])))
    row, _ = local.window_search(problem, start, lambda rows: scoring.rewards(problem, evaluate(rows), reference))
    scores = evaluate(row[None])
    assert scores.feasible[0] and scores.cost[0] <= best[0] * (1 + 1e-9)
    plan = make_plan(problem, row, scores.replicas[0][scores.replicas[0] > 0], scheduler="test")
    figures = spec_figures(profile, cluster, plan.to_dict())
    assert math.isclose(figures["cost_usd"], plan.cost_usd, rel_tol=1e-9)
    assert figures["throughput"] >= problem.min_throughput * (1 - 1e-9)


def test_window_ways_are_counted_before_any_is_built():
    for width, types, cuts in [(14, 3, 2), (14, 4, 2), (7, 2, 1), (5, 3, 0), (1, 3, 2)]:
        patterns = local._patterns(width, types, cuts)
        assert local._ways(width, types, cuts) == len(patterns) == len(np.unique(patterns, axis=0))
        assert all(len(_stage_list(row)) <= cuts + 1 for row in patterns)
    assert local._ways(local.WINDOW, 100, 2) > local.WINDOW_ROWS  # so window_search never builds those


def _one_move_away(schedule: np.ndarray, row: np.ndarray) -> bool:
    """Is ``row`` one of the local search's four moves from ``schedule``, by the moves' definitions?"""
    changed = np.flatnonzero(row != schedule)
    if changed.size == 0:
        return False
    if changed.size == 1:
        return True  # one layer on another type
    stages = _stage_list(schedule)
    if any(
        changed[0] == a and changed[-1] == z - 1 and changed.size == z - a and len(set(row[a:z])) == 1
        for a, z in stages
    ):
        return True  # a whole stage on another type
    for (a, m), (_, z) in zip(stages, stages[1:]):  # a boundary moved to any layer between the outer ends
        if (
            changed[0] >= a
            and changed[-1] < z
            and any((row[a:b] == schedule[a]).all() and (row[b:z] == schedule[m]).all() for b in range(a + 1, z))
        ):
            return True
    for (p, a), (_, z), (_, q) in zip(stages, stages[1:], stages[2:]):  # a middle stage slid along
        left, mine, right = schedule[p], schedule[a], schedule[z]
        for shift in range(p + 1 - a, q - z):
            slid = schedule.copy()
            slid[p : a + shift], slid[a + shift : z + shift], slid[z + shift : q] = left, mine, right
            if (slid == row).all():
                return True
    return False


@pytest.mark.parametrize("seed", range(4))
def test_neighbours_are_every_schedule_one_move_away(seed):
    """Every schedule of a 7-layer, 3-type model, enumerated: the neighbourhood is exactly those one move
    away whose every layer can run on its type; the wide moves, every run of 2..SEGMENT layers on another
    type; and batched small (as on thousands of layers) the moves are the same."""
    n, T = 7, 3
    _, _, _, problem = _instance(seed=40 + seed, n=n, T=T)
    runnable = problem.runnable.copy()
    runnable[np.random.default_rng(seed).random((n, T)) < 0.2] = False
    runnable[np.arange(n), np.arange(n) % T] = True
    problem = problem.replace(runnable=runnable, maximal_stages=True)  # the papers' moves alone
    every = np.array(list(itertools.product(range(T), repeat=n)))
    every = every[problem.usable[np.arange(n), every].all(axis=1)]
    rng = np.random.default_rng(seed)
    for schedule in every[rng.choice(len(every), 12, replace=False)]:
        expected = {tuple(row) for row in every if _one_move_away(schedule, row)}
        assert {tuple(row) for row in local.neighbours(problem, schedule)} == expected
        wide = set()
        for a in range(n):
            for z in range(a + 2, min(n, a + local.SEGMENT) + 1):
                for t in range(T):
                    row = schedule.copy()
                    row[a:z] = t
                    if problem.usable[a:z, t].all() and (row != schedule).any():
                        wide.add(tuple(row))
        assert {tuple(row) for row in local.wide_neighbours(problem, schedule)} == wide
        for moves, whole in ((local._neighbour_moves, expected), (local._wide_moves, wide)):
            saved, local.MOVE_BYTES = local.MOVE_BYTES, 1
            try:
                batched = [tuple(row) for batch in local._batches(moves, problem, schedule) for row in batch]
            finally:
                local.MOVE_BYTES = saved
            assert set(batched) == whole


def _cuts(row: np.ndarray) -> tuple[tuple[int, int, int], ...]:
    """A labelled schedule's stages: (first, end, type)."""
    bounds = [0, *(np.flatnonzero(np.diff(row)) + 1).tolist(), len(row)]
    return tuple((a, z, int(row[a]) % 3) for a, z in zip(bounds[:-1], bounds[1:]))


@pytest.mark.parametrize("seed", range(3))
def test_in_the_whole_space_the_neighbours_also_cut_join_and_keep_stages_apart(seed):
    """Section 1's whole space: besides the papers' moves, every stage cut in two at every layer on its
    type, every pair of neighbouring stages on one type joined, and every stage put on another type
    without joining a neighbour; every neighbour runs each layer on a type that can run it."""
    n, T = 7, 3
    _, _, _, problem = _instance(seed=40 + seed, n=n, T=T)
    rng = np.random.default_rng(seed)
    papers = problem.replace(maximal_stages=True)
    for _ in range(10):
        schedule = rng.integers(0, T, n) + T * rng.integers(0, local.LABELS, n)
        schedule = schedule[np.argsort(rng.random(n))] if rng.random() < 0.5 else schedule
        schedule = np.where(problem.usable[np.arange(n), schedule % T], schedule, np.argmax(problem.usable, axis=1))
        found = {_cuts(row) for row in local.neighbours(problem, schedule)}
        assert {_cuts(row) for row in local.neighbours(papers, schedule)} <= found
        for row in local.neighbours(problem, schedule):
            assert problem.usable[np.arange(n), row % T].all()
        stages = _cuts(schedule)
        for i, (a, z, t) in enumerate(stages):
            for m in range(a + 1, z):
                assert (*stages[:i], (a, m, t), (m, z, t), *stages[i + 1 :]) in found
            for other in range(T):
                if other != t and problem.usable[a:z, other].all():
                    assert (*stages[:i], (a, z, other), *stages[i + 1 :]) in found
        for i in range(len(stages) - 1):
            (a, _, t), (_, z, u) = stages[i], stages[i + 1]
            if t == u:
                assert (*stages[:i], (a, z, t), *stages[i + 2 :]) in found


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
@pytest.mark.parametrize("seed", range(4))
def test_the_repair_runs_again_from_the_kicks_best_plan_when_a_limit_binds(seed, monkeypatch):
    """With ``repair_again`` (rl and tapp), once the kicks are done and the best plan uses all of some
    type, the price repair runs once more, from that best plan; otherwise, and without it (greedy), no
    repair follows the kicks. The plan either way holds by the spec's figures and is never cheaper than the
    brute-force optimum."""
    profile, cluster, problem, optimum = _binding_instance(60 + seed)
    real_repair, real_kick = local.price_repair, local.kick
    for again in (False, True):
        evaluate, best = scoring.Evaluator(problem), scoring.Best()
        start = np.asarray(greedy.rule_schedule(problem))
        reference = scoring.Reference.of(evaluate(np.concatenate([start[None], scoring.heuristic_schedules(problem)])))
        events: list[tuple[str, bool, bool]] = []  # (what, started from the best plan, the best plan binds)

        def binds(best=best, evaluate=evaluate) -> bool:
            return best.schedule is not None and bool((evaluate(best.schedule[None]).used[0] >= problem.limits).any())

        def repair(problem_, row, *args, best=best, events=events, binds=binds):
            from_best = best.schedule is not None and bool((np.asarray(row) == best.schedule).all())
            events.append(("repair", from_best, binds()))
            return real_repair(problem_, row, *args)

        def kick(*args, events=events):
            events.append(("kick", False, False))
            return real_kick(*args)

        monkeypatch.setattr(local, "price_repair", repair)
        monkeypatch.setattr(local, "kick", kick)
        rng = np.random.default_rng(seed)
        local.polish(problem, evaluate, best, reference, rng, starts=[start], kicks=3, repair_again=again)
        kicks = [i for i, event in enumerate(events) if event[0] == "kick"]
        assert kicks, "the kicks ran"
        after = events[kicks[-1] + 1 :]
        if again and after:
            assert after == [("repair", True, True)]
        else:
            assert after == [] and (not again or not binds())
        assert best.schedule is not None and best.replicas is not None
        plan = make_plan(problem, best.schedule, best.replicas[best.replicas > 0], scheduler="test")
        _assert_holds_and_never_beats(profile, cluster, problem, plan, optimum[0])
