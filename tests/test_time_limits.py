"""--time-limit: exact returns its best plan with a proven gap instead of running on."""

from __future__ import annotations

import json

import pytest
import yaml

from heterps_cli.cli.app import app
from heterps_cli.problem import load_problem
from tests.helpers import ROOT, problem_from_dicts, write_yaml

INSTANCES = ROOT / "benchmarks" / "instances"
PROFILE, CLUSTER = str(INSTANCES / "chain64x3.profile.yaml"), str(INSTANCES / "chain64x3.cluster.yaml")


def _plan(runner, *args):
    result = runner.invoke(app, ["plan", PROFILE, CLUSTER, "--scheduler", "exact", "--json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.parametrize("objective", ["cost", "time"])
def test_exact_cut_short_returns_a_feasible_plan_with_a_gap_that_holds(runner, objective):
    optimum = _plan(runner, "--objective", objective)
    assert optimum["optimal"] is True and "gap" not in optimum
    cut = _plan(runner, "--objective", objective, "--time-limit", "1e-9")
    assert cut["feasible"] is True and cut["optimal"] is False and cut["gap"] > 0
    assert "--time-limit" in cut["notes"][-1] and "within" in cut["notes"][-1]
    if objective == "cost":  # the proven lower bound is at most the optimum, the plan at least
        assert cut["cost_usd"] >= optimum["cost_usd"] * (1 - 1e-12)
        assert cut["cost_usd"] / (1 + cut["gap"]) <= optimum["cost_usd"] * (1 + 1e-9)
    else:  # the proven upper bound is at least the optimum's throughput
        assert cut["throughput"] <= optimum["throughput"] * (1 + 1e-12)
        assert cut["throughput"] / (1 - cut["gap"]) >= optimum["throughput"] * (1 - 1e-9)


def test_a_plan_with_a_gap_is_written_checked_and_shown(runner, tmp_path):
    out = tmp_path / "plan.yaml"
    shown = runner.invoke(
        app, ["plan", PROFILE, CLUSTER, "--scheduler", "exact", "--time-limit", "1e-9", "-o", str(out)]
    )
    assert shown.exit_code == 0, shown.output
    written = yaml.safe_load(out.read_text())
    assert written["gap"] > 0 and written["optimal"] is False
    check = runner.invoke(app, ["check", str(out), "--profile", PROFILE, "--cluster", CLUSTER])
    assert check.exit_code == 0, check.output


def test_greedy_stops_its_local_search_at_the_time_limit(runner):
    result = runner.invoke(app, ["plan", PROFILE, CLUSTER, "--scheduler", "greedy", "--time-limit", "1e-9", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["feasible"] and "the local search stopped at the time limit" in plan["notes"]


def test_a_search_out_of_time_and_plans_says_so_without_running_exact(monkeypatch):
    from heterps_cli.errors import InfeasibleError, SearchGaveUp
    from heterps_cli.schedulers import exact

    monkeypatch.setattr(exact, "solve", lambda *a, **k: pytest.fail("exact ran after the time limit"))
    error = exact.diagnose(load_problem(PROFILE, CLUSTER), "the rl scheduler found no plan", "try more", time_limit=0.0)
    assert isinstance(error, InfeasibleError) and isinstance(error, SearchGaveUp)
    assert "within the time limit" in str(error) and "--scheduler exact says whether" in str(error)


def test_a_search_on_a_model_too_long_for_exact_does_not_point_to_it(monkeypatch, tmp_path, runner):
    from heterps_cli.schedulers import exact
    from heterps_cli.schedulers.exact import terms

    monkeypatch.setattr(terms, "MAX_GRID_CELLS", 100)  # chain16x2: 17 x 17 x 2 = 578 cells
    monkeypatch.setattr(exact, "solve", lambda *a, **k: pytest.fail("exact ran on a model too long for it"))
    tight = INSTANCES / "chain16x2-tight.profile.yaml", INSTANCES / "chain16x2-tight.cluster.yaml"
    for limit in ([], ["--time-limit", "1e-9"]):
        result = runner.invoke(
            app,
            [
                "plan",
                *map(str, tight),
                "--scheduler",
                "random",
                "--evaluations",
                "1",
                "--min-throughput",
                "1e12",
                *limit,
            ],
        )
        assert result.exit_code == 5, result.output  # no proof: the exact solver did not run
        assert "found no feasible plan" in result.output and "--scheduler exact" not in result.output


def _sizes_profile(tmp_path, sizes=(256, 512, 1024, 2048)) -> str:
    """ctr with times at several batch sizes (each a share of its own, as section 1f reads them), a global
    batch that each divides: a plan chooses among them."""
    profile = yaml.safe_load((ROOT / "profiles/ctr.yaml").read_text())
    for layer in profile["layers"]:
        for entry in layer["times"].values():
            entry["batches"] = {b: {"oct": entry["oct"] * b / 4096 + 1e-6, "odt": entry["odt"]} for b in sizes}
    profile["job"]["global_batch"] = 8192
    path = tmp_path / "sizes.yaml"
    path.write_text(yaml.safe_dump(profile))
    return str(path)


def _given(monkeypatch) -> list:
    """The options each micro-batch's search is given, as :func:`schedulers.solve` records them."""
    from heterps_cli import schedulers

    given: list = []
    real = schedulers._solve_at

    def recorded(name, problem, seed, progress, options):
        given.append(options)
        return real(name, problem, seed, progress, options)

    monkeypatch.setattr(schedulers, "_solve_at", recorded)
    return given


@pytest.mark.slow  # over a second here: the slow suite, which CI runs too
@pytest.mark.parametrize("name", ["rl", "random"])
def test_the_default_budget_is_a_count_shared_over_the_micro_batches(tmp_path, monkeypatch, name):
    """A wall-clock default made rl stop at 76-100 of its 120 steps on a slow day: plans that depended
    on the machine. The count: the most steps (evaluations) up to the default whose cells, over all
    the micro-batches, fit the budget, found here by trying every count."""
    from heterps_cli import schedulers
    from heterps_cli.schedulers import names

    monkeypatch.setattr(schedulers, "PROVEN_CELLS", 0)  # no proven optimum to stop at: the whole budget
    monkeypatch.setattr(names, "TRAINING_CELLS", 6 * 8 * 10 * 37 + 5)  # 37 steps of 8 schedules fit
    monkeypatch.setattr(names, "EVALUATION_CELLS", 6 * 10 * 333 + 5)
    given = _given(monkeypatch)
    problem = load_problem(_sizes_profile(tmp_path), str(ROOT / "clusters/paper.yaml"))
    assert len(problem.micro_batch_choices) == 6 and problem.n_layers == 10  # five measured sizes, and 8,192
    options = schedulers.options_for(name, batch=8) if name == "rl" else None
    schedulers.solve(name, problem, options=options)
    assert len(given) == 6
    if name == "rl":
        fits = [s for s in range(1, 121) if 6 * s * 8 * 10 <= names.TRAINING_CELLS]
        assert {o.steps for o in given} == {max(fits)} == {37}
    else:
        fits = [e for e in range(1, 6001) if 6 * e * 10 <= names.EVALUATION_CELLS]
        assert {o.evaluations for o in given} == {max(fits)} == {333}
    guard = schedulers.guard_time_limit(problem.n_layers)
    assert all(o.guard and o.time_limit <= guard for o in given)
    assert given[0].time_limit > guard / 2  # the guard is the whole plan's, not shared out


@pytest.mark.slow  # over a second here: the slow suite, which CI runs too
def test_the_default_budget_gives_the_plan_its_count_gives_on_any_machine(runner, monkeypatch):
    """Without --time-limit the plan is the one its default count of steps gives: the same on a machine
    of any speed (the guard, ten minutes, is far off). Where no proven optimum stops it early (that stop
    is a count too, tests/test_rl_stops.py)."""
    from heterps_cli import schedulers

    monkeypatch.setattr(schedulers, "PROVEN_CELLS", 0)
    args = ["plan", str(ROOT / "profiles/ctr.yaml"), str(ROOT / "clusters/paper.yaml"), "-s", "tapp", "--json"]
    default = runner.invoke(app, args)
    counted = runner.invoke(app, [*args, "--steps", "120", "--time-limit", "1e6"])
    assert default.exit_code == counted.exit_code == 0, default.output + counted.output
    fields = ("stages", "cost_usd", "throughput", "evaluations")
    assert [json.loads(default.stdout)[k] for k in fields] == [json.loads(counted.stdout)[k] for k in fields]
    assert json.loads(default.stdout)["objective"] == "time"  # tapp's own default (the seeds' objective)


def test_micro_batches_left_when_the_time_limit_has_run_out_are_not_asked_and_the_plan_says_so(runner, tmp_path):
    args = ["plan", _sizes_profile(tmp_path), str(ROOT / "clusters/paper.yaml"), "--scheduler", "greedy"]
    result = runner.invoke(app, [*args, "--time-limit", "1e-9", "--json"])
    assert result.exit_code == 0, result.output
    notes = " ".join(json.loads(result.stdout)["notes"])
    assert "not asked (the time limit ran out)" in notes and "micro-batch 8,192 chosen" in notes  # asked first


def test_a_search_is_not_run_where_the_exact_solver_proves_no_plan_fits(runner, tmp_path, monkeypatch):
    """rl trained 20-30 s at each micro-batch whose plans all break memory, then failed, and the exact
    solver said why: now it says so first, in milliseconds, with the same words."""
    from heterps_cli import schedulers

    cluster = tmp_path / "c.yaml"
    cluster.write_text(
        "cluster: small\nresources:\n  cpu: {price: 0.04, limit: 480, memory_gb: 0.000001}\n"
        "  v100: {price: 2.42, limit: 32, memory_gb: 0.000001}\n"
    )
    real = schedulers.solver  # exact may run (it says why); the searches must not

    def searches(name):
        return real(name) if name == "exact" else pytest.fail(f"{name} ran where no plan fits")

    monkeypatch.setattr(schedulers, "solver", searches)
    for name in ("rl", "tapp", "genetic", "greedy", "random"):
        result = runner.invoke(app, ["plan", str(ROOT / "profiles/ctr.yaml"), str(cluster), "-s", name])
        assert result.exit_code == 3 and "memory" in result.stderr, result.output


def test_held_back_starts_share_the_commands_clock_and_none_begins_past_it(tmp_path, monkeypatch):
    """Issue 81 case 5: each held-back start of ``from_reserved`` is a whole exact solve, which builds its
    tables before it can read a clock; they run under the command's --time-limit, and one whose last
    solve's time exceeds what is left is not begun (a 2,000-layer plan took 33 s for a limit of 20)."""
    import time

    import heterps_cli.schedulers.exact as exact_module
    from heterps_cli.schedulers import solve
    from heterps_cli.schedulers.base import Clock
    from heterps_cli.schedulers.mixing import from_reserved
    from tests.helpers import problem_from_dicts
    from tests.test_mixed import CLUSTER, TINY

    problem = problem_from_dicts(TINY, CLUSTER)
    plan = solve("exact", problem)
    seen: list = []
    real = exact_module.solve

    def recording(sub, *, seed=0, progress=None, options=None):
        seen.append(options)
        return real(sub, seed=seed, progress=progress, options=options)

    monkeypatch.setattr(exact_module, "solve", recording)
    now = time.perf_counter()
    from_reserved(problem, plan, Clock(now, 3600.0, 7200.0))
    assert seen and all(o is not None and o.time_limit == 3600.0 and o.started == now for o in seen)
    assert all(o.whole_limit == 7200.0 for o in seen)  # their notes name the user's limit, not the share
    seen.clear()
    # one second left, and the plan's own solve took ten: no start is begun
    from_reserved(problem, plan.but(solve_s=10.0), Clock(now - 3599.0, 3600.0))
    assert seen == []


def test_the_paced_clock_stops_where_a_step_as_long_as_the_longest_would_end_past_the_limit():
    from heterps_cli.schedulers.base import Clock

    now = [0.0]
    out_of_time = Clock(0.0, 10.0).paced(lambda: now[0])
    seen = []
    for step in (1.0, 4.0, 1.0, 1.0, 1.0):  # after 7 s, 3 s are left: less than the 4 s step
        now[0] += step
        seen.append(out_of_time())
    assert seen == [False, False, False, True, True]
    assert Clock(0.0, None).paced(lambda: 1e9)() is False  # no limit


def test_exact_out_of_time_before_it_has_a_plan_says_so_and_searches_no_further(monkeypatch):
    """Out of time with no plan, exact said why none exists by a search without the limit (a 2,000-layer
    chain: 29 s for a limit of 20); it now says that the limit ran out, naming the user's limit."""
    import heterps_cli.schedulers.exact.scheduler as scheduler
    import heterps_cli.schedulers.exact.walks as walks
    from heterps_cli.errors import SearchGaveUp
    from heterps_cli.schedulers.base import SolveOptions

    problem = load_problem(str(ROOT / "profiles/vgg16.yaml"), str(ROOT / "clusters/three-type.yaml"), global_batch=256)
    problem = problem.at_micro_batch(256)
    monkeypatch.setattr(walks, "scored", lambda p, sub, cand: (cand, False))  # no relaxation's plan is one
    monkeypatch.setattr(scheduler, "infeasible_error", lambda *a: pytest.fail("searched on to say why"))
    with pytest.raises(SearchGaveUp, match="exact found no plan before the --time-limit of 20 s ran out"):
        scheduler.solve(problem, options=SolveOptions(time_limit=1e-9, whole_limit=20.0))


def test_mixed_stages_where_none_can_mix_say_why_once(runner):
    """The note that the DP over mixed stages does not run said so beside the note that no stage can mix."""
    args = ["plan", str(ROOT / "profiles/vgg16.yaml"), str(ROOT / "clusters/three-type.yaml"), "-s", "exact"]
    result = runner.invoke(app, [*args, "--mixed-stages", "--json"])
    assert result.exit_code == 0, result.output
    notes = json.loads(result.stdout)["notes"]
    assert any("mixed stages need a pipeline schedule" in n for n in notes), notes
    assert not any("no exact search over mixed stages" in n for n in notes), notes


def test_a_search_its_paced_clock_stopped_proves_nothing(monkeypatch):
    """The paced clock may say "out of time" before the limit itself has passed (the next step, as long as
    the longest, would end past it): a search it stopped before any plan says it found none in time (exit
    5), not that none exists, nor does it search on to say why (it had raised an internal error)."""
    from heterps_cli.errors import SearchGaveUp
    from heterps_cli.schedulers import exact
    from heterps_cli.schedulers.base import Clock, SolveOptions

    # two layers whose training state fits a unit one at a time, not both: no plan of one stage, one of two
    times = {"oct": 1.0, "odt": 0.0, "alpha": 1.0, "beta": 0.0}
    layer = {"type": "fc", "input_size": 1.0, "weight_size": 1e9, "times": {"gpu": times}}
    profile = {"model": "m", "batch_size": 1, "job": {"samples": 64.0, "global_batch": 4}}
    profile["layers"] = [{"name": f"l{i}", **layer} for i in (0, 1)]
    cluster = {"cluster": "c", "resources": {"gpu": {"price": 1.0, "limit": 2, "memory_gb": 7.2}}}  # 4 GB a layer
    problem = problem_from_dicts(profile, cluster, objective="time", micro_batch=1)
    assert len(exact.solve(problem).stages) == 2
    monkeypatch.setattr(Clock, "paced", lambda self: lambda: True)
    with pytest.raises(SearchGaveUp, match="found no plan before the --time-limit"):
        exact.solve(problem, options=SolveOptions(time_limit=1e6))


def test_a_micro_batch_out_of_time_is_shown_so_and_proves_nothing_over_every_choice(runner, tmp_path, monkeypatch):
    """Where the search at one micro-batch ran out of time, the note says "none found in time" there (not
    "no plan"), and the plan is not proven within a gap over every micro-batch."""
    from heterps_cli.errors import SearchGaveUp
    from heterps_cli.schedulers import exact
    from tests.test_pace import scarce

    profile, cluster = scarce()  # micro-batches 1, 8, 16, 32 and 64; 8 or 16 the fastest (2/3 samples/s)
    search = exact.solve

    def stopped_at_8(problem, **kw):
        if problem.batch_size == 8:
            raise SearchGaveUp("exact found no plan before the --time-limit of 1 s ran out")
        return search(problem, **kw)

    monkeypatch.setattr(exact, "solve", stopped_at_8)
    paths = [str(write_yaml(tmp_path / "p.yaml", profile)), str(write_yaml(tmp_path / "c.yaml", cluster))]
    result = runner.invoke(app, ["plan", *paths, "-s", "exact", "--objective", "time", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert "8: none found in time" in next(note for note in plan["notes"] if "chosen" in note)
    assert plan["optimal"] is False and plan.get("gap") is None


def test_micro_batches_left_unasked_by_the_time_limit_prove_nothing():
    """The limit ran out after the first choice had no plan: the others, never searched, may hold one, so
    the answer is "no plan found" (exit 5) naming them, not "no plan at any micro-batch" (exit 3, which the
    OPT-30-sized row under --time-limit 1 had said, though its micro-batches 2 and 4 hold plans)."""
    from heterps_cli.errors import InfeasibleError, SearchGaveUp
    from heterps_cli.schedulers.base import SolveOptions
    from heterps_cli.schedulers.micro_batch import best_micro_batch
    from tests.test_pace import scarce

    problem = problem_from_dicts(*scarce(), objective="time")
    asked = []

    def none_here(sub, options, report):
        asked.append(sub.batch_size)
        raise InfeasibleError(f"no plan at micro-batch {sub.batch_size}")

    choices = problem.micro_batch_choices
    with pytest.raises(SearchGaveUp) as raised:
        best_micro_batch(problem, choices, none_here, None, SolveOptions(time_limit=1e-9))
    left = sorted(set(choices) - set(asked))
    assert len(asked) == 1 and str(raised.value).startswith(
        f"the time limit ran out before micro-batches {', '.join(map(str, left))} were searched"
    )
    assert f"of those searched: at micro-batch {asked[0]}: no plan at micro-batch {asked[0]}" in str(raised.value)
