"""`heterps frontier`: the exact cost-throughput frontier against brute force, and the command around it."""

from __future__ import annotations

import json
import math
from pathlib import Path
from unittest.mock import patch

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from heterps_cli import frontier as frontier_module
from heterps_cli.cli.app import app
from heterps_cli.errors import InfeasibleError
from heterps_cli.frontier import knee, pareto_frontier
from tests.helpers import ROOT, instance_dicts, problem_from_dicts, write_yaml
from tests.oracle import feasible_plans, pareto, spec_figures
from tests.strategies import SETTINGS, hardware_instances, instances, repeated_blocks

CTR, PAPER = str(ROOT / "profiles/ctr.yaml"), str(ROOT / "clusters/paper.yaml")
INSTANCES = ROOT / "benchmarks" / "instances"


def _instance(name: str) -> tuple[str, str]:
    return str(INSTANCES / f"{name}.profile.yaml"), str(INSTANCES / f"{name}.cluster.yaml")


# -- exactness: the frontier is brute force's, on small random instances ---------------------------


def _frontier_against_brute_force(arrays, B0, min_throughput, budget_scale, hardware=None):
    profile, cluster = instance_dicts(*arrays, B0=B0, samples=1e6, min_throughput=min_throughput, hardware=hardware)
    problem = problem_from_dicts(profile, cluster)
    cost, thr = feasible_plans(*arrays, B0, problem.work, min_throughput=min_throughput, hardware=hardware)
    max_cost = None
    if budget_scale is not None and len(cost):
        max_cost = float(cost.min()) * budget_scale
        problem = problem.replace(max_cost=max_cost)
        keep = cost <= max_cost * (1 + 1e-12)
        cost, thr = cost[keep], thr[keep]
    expected = pareto(cost, thr)
    try:
        frontier = pareto_frontier(problem)
    except InfeasibleError:
        assert not expected, f"brute force finds {len(expected)} frontier plans, heterps none"
        return
    got = [(plan.throughput, plan.cost_usd) for plan in frontier.plans]
    assert len(got) == len(expected), f"heterps: {got}\nbrute force: {expected}"
    for (x, c), (bx, bc) in zip(got, expected):
        assert math.isclose(x, bx, rel_tol=1e-9) and math.isclose(c, bc, rel_tol=1e-9, abs_tol=1e-12)
    # The definition, checked on every feasible plan: no plan costs less than the first frontier
    # plan at least as fast as it (so every throughput between two points costs at least the higher).
    xs = np.array([x for x, _ in got])
    cs = np.array([c for _, c in got])
    first_as_fast = np.searchsorted(xs, thr * (1 - 1e-9), side="left")
    assert (first_as_fast < len(xs)).all(), "a feasible plan is faster than the frontier's fastest"
    assert (cost >= cs[first_as_fast] * (1 - 1e-9) - 1e-12).all()
    for plan in frontier.plans:  # every plan checks out against docs/spec.md, independently recomputed
        figures = spec_figures(profile, cluster, plan.to_dict())
        assert math.isclose(figures["cost_usd"], plan.cost_usd, rel_tol=1e-9, abs_tol=1e-12)
        assert figures["memory_fits"] and plan.feasible and plan.optimal
        assert all(figures["resources"][t] <= cluster["resources"][t]["limit"] for t in figures["resources"])
        assert plan.min_throughput == plan.throughput  # the question each plan answers
        if max_cost is not None:
            assert plan.cost_usd <= max_cost * (1 + 1e-9)


# Richer than the exact solver's own instances: more units, lower targets, so frontiers have many plans.
RICH = dict(layers=((2, 5), (3, 4)), limits=(4, 6, 8), targets=(0.0, 0.0, 0.2, 0.5, 1.0, 2.0))


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
@settings(max_examples=200, **SETTINGS)
@given(instances(**RICH), st.sampled_from([None, None, 1.0, 1.5, 3.0]), st.booleans())
def test_the_frontier_is_the_brute_force_frontier(inst, budget_scale, dense_probes):
    # Dense probes make the walk skip often: skipping must never lose a frontier plan.
    step, ahead = (0.02, 1.0) if dense_probes else (frontier_module.PROBE_STEP, frontier_module.PROBE_AHEAD)
    with patch.object(frontier_module, "PROBE_STEP", step), patch.object(frontier_module, "PROBE_AHEAD", ahead):
        _frontier_against_brute_force(*inst, budget_scale)


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
@settings(max_examples=100, **SETTINGS)
@given(hardware_instances(**RICH), st.sampled_from([None, 2.0]))
def test_the_frontier_is_the_brute_force_frontier_with_memory_and_transfer(inst, budget_scale):
    arrays, B0, min_throughput, hardware = inst
    _frontier_against_brute_force(arrays, B0, min_throughput, budget_scale, hardware)


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
@settings(max_examples=150, **SETTINGS)
@given(repeated_blocks(), st.sampled_from([None, None, 2.0]))
def test_the_frontier_is_the_brute_force_frontier_when_plans_tie_on_throughput(inst, budget_scale):
    # A repeated block gives plans with the same bottleneck at equal throughput and different other
    # stages: only the cheapest of them is on the frontier, whatever its float sums' last bits.
    _frontier_against_brute_force(*inst, budget_scale)


def test_the_knee_is_the_plan_farthest_below_the_chord():
    # scaled: (0, 0), (0.5, 0.1), (0.75, 0.5), (1, 1): distances below the chord 0, 0.4, 0.25, 0
    assert knee([100, 150, 175, 200], [10, 11, 15, 20]) == 1
    assert knee([100, 200, 300], [10, 20, 30]) is None  # a straight line has no knee
    assert knee([100, 200, 300], [10, 25, 30]) is None  # cost rises faster than throughput at first
    assert knee([100, 200], [10, 20]) is None


# -- the command --------------------------------------------------------------------------------


def _figures(plans: list[dict]) -> list[tuple]:
    """What makes a plan: throughput, cost, and each stage's resource and replicas (not solve_s)."""
    return [
        (p["throughput"], p["cost_usd"], [(s["first"], s["last"], s["resource"], s["replicas"]) for s in p["stages"]])
        for p in plans
    ]


def _json(runner, args, expect=0):
    result = runner.invoke(app, ["frontier", *args, "--json"])
    assert result.exit_code == expect, result.output
    return json.loads(result.stdout) if expect == 0 else result.output


BUNDLED = [
    (str(ROOT / f"profiles/{model}.yaml"), str(ROOT / f"clusters/{cluster}.yaml"))
    for model in ("ctr", "transformer", "vgg16")
    for cluster in ("paper", "paper-hardware", "three-type", "three-type-hardware")
]


@pytest.mark.parametrize("files", BUNDLED, ids=[f"{Path(p).stem}-{Path(c).stem}" for p, c in BUNDLED])
def test_no_bundled_frontier_plan_is_matched_by_another(runner, files):
    # transformer on three-type once listed 19 plans, 8 of them dearer than one as fast.
    plans = _json(runner, list(files))["plans"]
    for p in plans:
        for q in plans:
            if q is not p:
                assert not (q["throughput"] >= p["throughput"] * (1 - 1e-12) and q["cost_usd"] <= p["cost_usd"]), (
                    f"{q['throughput']} at ${q['cost_usd']} beats {p['throughput']} at ${p['cost_usd']}"
                )


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
@pytest.mark.parametrize("name", ["ctr", "chain8x3", "transformer"])
def test_each_point_is_what_plan_exact_answers_at_its_throughput(runner, name):
    profile, cluster = {
        "ctr": (CTR, PAPER),
        "transformer": (str(ROOT / "profiles/transformer.yaml"), str(ROOT / "clusters/three-type.yaml")),
    }.get(name) or _instance(name)
    frontier = _json(runner, [profile, cluster])
    plans = frontier["plans"]
    picks = range(len(plans)) if len(plans) <= 16 else np.linspace(0, len(plans) - 1, 12).astype(int)
    for i in picks:
        point = plans[i]
        result = runner.invoke(
            app,
            ["plan", profile, cluster, "--scheduler", "exact", "--min-throughput", repr(point["throughput"]), "--json"],
        )
        assert result.exit_code == 0, result.output
        answer = json.loads(result.stdout)
        assert math.isclose(answer["cost_usd"], point["cost_usd"], rel_tol=1e-12)
        assert math.isclose(answer["throughput"], point["throughput"], rel_tol=1e-12)
        assert answer["resources"] == point["resources"]
    costs = [p["cost_usd"] for p in plans]
    assert costs == sorted(costs) and len(set(costs)) == len(costs)


def test_the_table_shows_the_ends_and_the_knee_and_says_what_the_knee_is(runner):
    result = runner.invoke(app, ["frontier", CTR, PAPER])
    assert result.exit_code == 0, result.output
    whole = _json(runner, [CTR, PAPER])
    assert whole["size"] == len(whole["plans"]) <= 20  # ctr's frontier fits the table whole
    knee_at = whole["knee"]
    assert knee_at is not None
    assert f"{knee_at + 1} ◆" in result.stdout and "knee" in result.stdout
    assert "farthest below the straight line" in result.stdout
    first_row = next(line for line in result.stdout.splitlines() if line.split()[:1] == ["1"])
    assert "3: cpu×34" in first_row  # the cheapest plan's stage count and layout begin on its row


@pytest.fixture(scope="module")
def chain8x2(runner) -> tuple[str, str, dict]:
    """A generated 8-layer instance whose frontier has over 100 plans, and that frontier."""
    profile, cluster = _instance("chain8x2")
    return profile, cluster, _json(runner, [profile, cluster])


def test_a_long_frontier_is_thinned_to_20_rows_by_default_and_says_so(runner, chain8x2):
    profile, cluster, whole = chain8x2
    assert whole["size"] > 50 and len(whole["plans"]) == whole["size"]  # --json keeps every plan
    result = runner.invoke(app, ["frontier", profile, cluster])
    assert result.exit_code == 0, result.output
    assert f"showing 20 of {whole['size']}" in " ".join(result.stdout.split())
    rows = [line for line in result.stdout.splitlines() if line.strip()[:1].isdigit()]
    assert len(rows) == 20
    assert rows[0].split()[0] == "1" and rows[-1].split()[0] == str(whole["size"])


@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_points_keeps_n_plans_with_both_ends_and_the_knee(runner, chain8x2, n):
    profile, cluster, whole = chain8x2
    thinned = _json(runner, [profile, cluster, "--points", str(n)])
    positions = thinned["positions"]
    assert len(positions) == n == len(thinned["plans"]) and positions == sorted(set(positions))
    if n == 1:
        assert positions == [whole["knee"]]
        return
    assert positions[0] == 0 and positions[-1] == whole["size"] - 1
    if n >= 3:
        assert whole["knee"] in positions
    for position, plan in zip(positions, thinned["plans"]):
        assert _figures([plan]) == _figures([whole["plans"][position]])


def test_one_feasible_plan_is_a_frontier_of_one(runner, tmp_path):
    profile = {
        "model": "one",
        "batch_size": 8,
        "job": {"samples": 1000},
        "layers": [
            {
                "name": "fc",
                "type": "fc",
                "input_size": 4,
                "weight_size": 4,
                "alpha": 0.9,
                "beta": 0.5,
                "times": {"cpu": {"oct": 0.1, "odt": 0.0}},
            }
        ],
    }
    cluster = {"cluster": "tiny", "resources": {"cpu": {"price": 1.0, "limit": 1}}}
    p, c = write_yaml(tmp_path / "p.yaml", profile), write_yaml(tmp_path / "c.yaml", cluster)
    frontier = _json(runner, [p, c])
    assert frontier["size"] == 1 and frontier["knee"] is None
    assert frontier["plans"][0]["throughput"] == pytest.approx(80.0)
    result = runner.invoke(app, ["frontier", p, c, "--points", "1"])
    assert result.exit_code == 0 and "no knee" in result.stdout


def test_no_feasible_plan_is_exit_3_with_the_reachable_figure_as_plan_gives(runner):
    frontier = runner.invoke(app, ["frontier", CTR, PAPER, "--min-throughput", "1e12"])
    plan = runner.invoke(app, ["plan", CTR, PAPER, "--scheduler", "exact", "--min-throughput", "1e12"])
    assert frontier.exit_code == plan.exit_code == 3
    assert frontier.output == plan.output and "the fastest possible plan reaches" in frontier.output


def test_max_cost_cuts_the_curve_and_below_the_cheapest_is_exit_3(runner):
    whole = _json(runner, [CTR, PAPER])
    budget = whole["plans"][5]["cost_usd"]
    cut = _json(runner, [CTR, PAPER, "--max-cost", repr(budget)])
    assert _figures(cut["plans"]) == _figures(whole["plans"][:6])
    assert all(p["max_cost"] == budget for p in cut["plans"])
    output = _json(runner, [CTR, PAPER, "--max-cost", "0.5"], expect=3)
    assert "no plan costs at most $0.50" in output


def test_out_writes_each_plan_as_a_file_that_check_accepts_and_removes_stale_ones(runner, tmp_path):
    folder = tmp_path / "curve"
    folder.mkdir()
    (folder / "plan-999.yaml").write_text("mine: heterps did not write it")
    (folder / "notes.txt").write_text("mine")
    assert runner.invoke(app, ["frontier", CTR, PAPER, "--points", "5", "--out", str(folder)]).exit_code == 0
    five = {p.name for p in folder.glob("plan-0*.yaml")}
    result = runner.invoke(app, ["frontier", CTR, PAPER, "--points", "3", "--out", str(folder)])
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))
    last = f"plan-{_json(runner, [CTR, PAPER])['size']:03d}.yaml"  # the fastest end is always kept
    assert names[-2] == last and names[0] == "notes.txt" and names[-1] == "plan-999.yaml"
    assert len(names) == 5 and len(five) == 5 and set(names) < five | {"notes.txt", "plan-999.yaml"}
    knee_file = folder / names[2]
    plan = yaml.safe_load(knee_file.read_text())
    check = runner.invoke(
        app,
        [
            "check",
            str(knee_file),
            "--profile",
            CTR,
            "--cluster",
            PAPER,
            "--min-throughput",
            repr(plan["min_throughput"]),
            "--replan",
            "exact",
        ],
    )
    assert check.exit_code == 0, check.output


def test_plot_writes_a_png_and_json_cannot_share_stdout_with_it(runner, tmp_path):
    picture = tmp_path / "curve.png"
    result = runner.invoke(app, ["frontier", CTR, PAPER, "--plot", str(picture)])
    assert result.exit_code == 0, result.output
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"wrote {picture}" in " ".join(result.stdout.split())
    both = runner.invoke(app, ["frontier", CTR, PAPER, "--json", "--plot", "-"])
    assert both.exit_code == 2 and "standard output" in both.output


def test_bad_input_is_exit_2_naming_the_file(runner, tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("model: [unclosed\n")
    result = runner.invoke(app, ["frontier", str(broken), PAPER])
    assert result.exit_code == 2 and "broken.yaml" in result.output and "Traceback" not in result.output
    assert runner.invoke(app, ["frontier", CTR, PAPER, "--points", "0"]).exit_code == 2


def test_a_frontier_read_from_a_pipe_or_a_file_cuts_no_column(runner):
    """A pipe has no width (rich took 80): its reader, or a program, gets every row whole; COLUMNS, where
    set, still sets one (tests/test_figures.py)."""
    result = runner.invoke(app, ["frontier", CTR, PAPER], env={"COLUMNS": None})
    assert result.exit_code == 0, result.output
    rows = [line for line in result.stdout.splitlines() if "|" in line]
    assert rows and not any("…" in row for row in rows)
    assert "cpu 35, v100 1" in result.stdout and "3: cpu×34 | v100×1 | cpu×1" in result.stdout
