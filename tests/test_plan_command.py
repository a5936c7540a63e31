"""`heterps plan` end to end: real files, the real CLI, figures recomputed independently."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from heterps_cli.cli.app import app
from heterps_cli.yamlio import load_yaml
from tests.helpers import ROOT, runner
from tests.oracle import optimum_by_bottleneck, spec_figures

CTR, PAPER = str(ROOT / "profiles/ctr.yaml"), str(ROOT / "clusters/paper.yaml")


def _plan_json(*args) -> dict:
    """Plan with the exact scheduler unless told otherwise: these tests are about the command."""
    scheduler = [] if "--scheduler" in args else ["--scheduler", "exact"]
    result = runner.invoke(app, ["plan", *args, *scheduler, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)  # nothing but JSON on stdout


def _check_against_spec(plan: dict, profile_path: str, cluster_path: str) -> dict:
    profile, cluster = load_yaml(profile_path).data, load_yaml(cluster_path).data
    ref = spec_figures(profile, cluster, plan)

    def close(a, b):
        return math.isclose(a, b, rel_tol=1e-9)

    assert close(plan["throughput"], ref["throughput"])
    assert close(plan["time_s"], ref["time_s"])
    assert close(plan["cost_usd"], ref["cost_usd"])
    for s, c, d, x in zip(plan["stages"], ref["compute_s"], ref["comm_s"], ref["stage_throughput"]):
        assert close(s["compute_s"], c) and close(s["comm_s"], d) and close(s["throughput"], x)
        assert s["layers"] == [layer["name"] for layer in profile["layers"][s["first"] : s["last"] + 1]]
    assert plan["stages"][0]["first"] == 0 and plan["stages"][-1]["last"] == len(profile["layers"]) - 1
    for a, b in zip(plan["stages"], plan["stages"][1:]):
        assert b["first"] == a["last"] + 1, "stages follow each other (two may share a type: docs/spec.md section 1)"
    assert plan["bottleneck"] == min(range(len(ref["stage_throughput"])), key=ref["stage_throughput"].__getitem__)
    assert {t: k for t, k in plan["resources"].items()} == {t: ref["resources"].get(t, 0) for t in plan["resources"]}
    for t, k in plan["resources"].items():
        assert k <= cluster["resources"][t]["limit"]
    assert plan["throughput"] >= plan["min_throughput"] * (1 - 1e-9)
    assert plan["feasible"] is True
    return ref


def test_ctr_exact_plan_is_checkable_and_optimal():
    plan = _plan_json(CTR, PAPER, "--scheduler", "exact")
    _check_against_spec(plan, CTR, PAPER)
    assert plan["optimal"] is True and plan["scheduler"] == "exact"
    profile, cluster = load_yaml(CTR).data, load_yaml(PAPER).data
    best = optimum_by_bottleneck(profile, cluster, plan["min_throughput"], plan["samples"] * plan["epochs"])
    assert math.isclose(plan["cost_usd"], best[0], rel_tol=1e-9), (plan["cost_usd"], best)


@pytest.mark.parametrize("model", ["ctr", "vgg16", "transformer"])
@pytest.mark.parametrize("cluster", ["paper", "three-type"])
@pytest.mark.parametrize("objective", ["cost", "time"])
def test_bundled_examples_plan_feasibly(model, cluster, objective):
    p, c = str(ROOT / f"profiles/{model}.yaml"), str(ROOT / f"clusters/{cluster}.yaml")
    plan = _plan_json(p, c, "--objective", objective)
    _check_against_spec(plan, p, c)


def test_out_writes_the_same_plan_as_json(runner, tmp_path):
    target = tmp_path / "plans" / "plan.yaml"
    result = runner.invoke(app, ["plan", CTR, PAPER, "--out", str(target), "--json", "-s", "exact"])
    assert result.exit_code == 0
    printed, written = json.loads(result.stdout), yaml.safe_load(target.read_text())
    printed.pop("solve_s"), written.pop("solve_s")
    assert printed == written
    assert [p.name for p in target.parent.iterdir()] == ["plan.yaml"], "no temporary files left behind"


def test_same_seed_same_plan():
    a, b = _plan_json(CTR, PAPER, "--seed", "3"), _plan_json(CTR, PAPER, "--seed", "3")
    a.pop("solve_s"), b.pop("solve_s")
    assert a == b


def test_options_override_the_profile_job():
    plan = _plan_json(CTR, PAPER, "--min-throughput", "500000", "--samples", "2e8", "--epochs", "3")
    assert plan["min_throughput"] == 500000 and plan["samples"] == 200000000 and plan["epochs"] == 3
    assert plan["throughput"] >= 500000
    _check_against_spec(plan, CTR, PAPER)


def test_time_objective_respects_the_budget():
    fastest = _plan_json(CTR, PAPER, "--objective", "time")
    budget = fastest["cost_usd"] * 0.9
    plan = _plan_json(CTR, PAPER, "--objective", "time", "--max-cost", str(budget))
    assert plan["cost_usd"] <= budget and plan["throughput"] <= fastest["throughput"]
    _check_against_spec(plan, CTR, PAPER)


def test_infeasible_exits_3_with_the_best_reachable_figure(runner):
    result = runner.invoke(app, ["plan", CTR, PAPER, "--min-throughput", "1e9", "--json", "-s", "exact"])
    assert result.exit_code == 3
    assert result.stdout == ""
    assert "fastest possible plan reaches" in result.stderr and "samples/s" in result.stderr


def test_infeasible_budget_reports_the_cheapest_cost(runner):
    result = runner.invoke(app, ["plan", CTR, PAPER, "--max-cost", "0.01", "-s", "exact"])
    assert result.exit_code == 3
    assert "the cheapest plan that reaches 150,000 samples/s costs $" in result.stderr


def test_human_output_shows_stages_bottleneck_and_cost(runner, tmp_path):
    result = runner.invoke(
        app, ["plan", CTR, PAPER, "--out", str(tmp_path / "p.yaml"), "-s", "exact"], env={"COLUMNS": "160"}
    )
    assert result.exit_code == 0
    text = result.stdout
    for needle in (
        "stage",
        "replicas",
        "1,326,103 ◀",
        "◀ the bottleneck stage",
        "throughput",
        "training time",
        "cpu 35 of 480",
        "$0.80",
        "optimal",
        "wrote",
    ):
        assert needle in text, needle


def test_python_m_works():
    proc = subprocess.run(
        [sys.executable, "-m", "heterps_cli", "plan", CTR, PAPER, "--json", "-s", "exact"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["feasible"] is True


def test_the_plan_says_when_transfer_is_free_or_memory_unchecked(runner):
    # paper.yaml gives neither bandwidth nor memory: its three-stage plan moves activations for free.
    shown = " ".join(runner.invoke(app, ["plan", CTR, PAPER, "-s", "exact"], env={"COLUMNS": "200"}).stdout.split())
    assert "assumes activations' bytes cross stage boundaries for free on v100, cpu (no bandwidth_gbps)" in shown
    assert "memory unchecked on cpu, v100 (no memory_gb)" in shown
    hardware = str(ROOT / "clusters/paper-hardware.yaml")
    shown = runner.invoke(app, ["plan", CTR, hardware, "-s", "exact"], env={"COLUMNS": "200"}).stdout
    assert "assumes" not in shown


def test_a_target_past_every_layers_serial_part_names_the_layer_not_the_limits(runner, tmp_path):
    import yaml

    profile = yaml.safe_load(Path(CTR).read_text())
    offered = yaml.safe_load(Path(PAPER).read_text())["resources"]
    # Independently: a layer alone in a stage on its best type, on any number of units, is at best
    # B0 / max(oct (1 - alpha), odt (1 - beta)); the least of those over layers caps every plan.
    caps = {
        layer["name"]: max(
            profile["batch_size"] / max(e["oct"] * (1 - e["alpha"]), e["odt"] * (1 - e["beta"]), 1e-300)
            for t, e in layer["times"].items()
            if t in offered
        )
        for layer in profile["layers"]
    }
    name = min(caps, key=caps.get)
    result = runner.invoke(app, ["plan", CTR, PAPER, "-s", "exact", "--min-throughput", "1e9"])
    assert result.exit_code == 3
    said = " ".join(result.stderr.split())
    assert f"Layer {name} caps every plan at {caps[name]:,.0f} samples/s" in said
    assert "No number of units changes that" in said and "raise the limits" not in said
    # Within reach of more units, the limits are what to raise.
    small = tmp_path / "small.yaml"
    small.write_text(Path(PAPER).read_text().replace("limit: 480", "limit: 40").replace("limit: 32", "limit: 1"))
    result = runner.invoke(app, ["plan", CTR, str(small), "-s", "exact", "--min-throughput", "5e6"])
    assert result.exit_code == 3 and "raise the limits" in result.stderr and "caps" not in result.stderr
    said = " ".join(result.stderr.split())
    found = re.search(r"needs ([\d,]+) cpu \(the limit is 40\), ([\d,]+) v100 \(the limit is 1\)", said)
    assert found, said
    cpu, v100 = (int(n.replace(",", "")) for n in found.groups())
    enough = tmp_path / "enough.yaml"  # with those limits the cheapest plan reaching it uses them all
    enough.write_text(
        Path(PAPER).read_text().replace("limit: 480", f"limit: {cpu}").replace("limit: 32", f"limit: {v100}")
    )
    again = runner.invoke(app, ["plan", CTR, str(enough), "-s", "exact", "--min-throughput", "5e6", "--json"])
    assert again.exit_code == 0 and json.loads(again.stdout)["resources"] == {"cpu": cpu, "v100": v100}


def test_no_plan_even_on_a_hundred_times_the_units_names_what_caps_it(tmp_path):
    # Section 1d: a stage's all-reduce grows with its replicas, so on ctr with 4 micro-batches of 4,096 no
    # plan gets faster past one V100 however many units the cluster has.
    hardware = str(ROOT / "clusters/paper-hardware.yaml")
    job = ["-s", "exact", "--global-batch", "16384"]
    result = runner.invoke(app, ["plan", CTR, hardware, *job, "--min-throughput", "1e8"])
    said = " ".join(result.stderr.split())
    assert result.exit_code == 3 and "With 100 times every limit the fastest plan reaches only" in said
    assert "its gradient all-reduce would grow by" in said and "raise the limits" not in said
    # one reason per micro-batch the plan may choose (spec 1f): the fastest of them is the fastest plan
    reached = max(float(x.replace(",", "")) for x in re.findall(r"reaches only ([\d,.]+) samples/s", said))
    more = tmp_path / "more.yaml"
    more.write_text(
        Path(hardware).read_text().replace("limit: 480", "limit: 48000").replace("limit: 32", "limit: 3200")
    )
    fastest = runner.invoke(app, ["plan", CTR, str(more), *job, "--objective", "time", "--json"])
    assert fastest.exit_code == 0 and abs(json.loads(fastest.stdout)["throughput"] - reached) <= 0.5


@pytest.mark.parametrize(
    ("scheduler", "flags", "says"),
    [
        ("rl", ["--evaluations", "5"], "--evaluations applies to genetic and random, not to rl"),
        ("exact", ["--steps", "5"], "--steps applies to rl and tapp, not to exact"),
        ("tapp", ["--policy-in", "p.pt"], "--policy-in applies to rl, not to tapp"),
    ],
)
def test_a_flag_of_another_scheduler_is_refused(runner, scheduler, flags, says):
    """Each scheduler has its own options: a flag none of them has is bad input (exit 2), not ignored."""
    result = runner.invoke(app, ["plan", CTR, PAPER, "-s", scheduler, *flags])
    assert result.exit_code == 2 and says in result.stderr, result.output


@pytest.mark.parametrize(
    ("profile", "cluster", "job"),
    [
        ("ctr", "paper", {}),
        ("vgg16", "three-type-hardware", {}),
        ("ctr", "three-type-hardware", {"global_batch": 8192}),
    ],
)
def test_a_plan_file_is_one_schema_written_and_read(profile, cluster, job):
    """What a plan writes is what Plan reads, and Plan writes it back byte for byte: one schema."""
    import yaml

    from heterps_cli import load_problem, solve
    from heterps_cli.formats import Plan
    from heterps_cli.yamlio import dump_yaml

    problem = load_problem(str(ROOT / f"profiles/{profile}.yaml"), str(ROOT / f"clusters/{cluster}.yaml"), **job)
    written = solve("exact", problem).to_dict()
    read = Plan.model_validate(yaml.safe_load(dump_yaml(written)))
    assert dump_yaml(read.written()) == dump_yaml(written)


@pytest.mark.parametrize(("limit", "said"), [(16, True), (2, False)])
def test_a_plan_that_splits_a_batch_into_a_few_samples_says_it_rests_on_alpha(tmp_path, limit, said):
    """One layer, batch 16, the fastest plan: 16 replicas train one sample each, a figure that rests on the
    profile's alpha (0.9 here), and the plan says so; 2 replicas of 8 samples need no word."""
    profile, cluster = tmp_path / "p.yaml", tmp_path / "c.yaml"
    profile.write_text(
        "model: m\nbatch_size: 16\nlayers:\n  - {name: l, type: fc, input_size: 4, weight_size: 4,\n"
        "     times: {gpu: {oct: 1.0, odt: 0.0, alpha: 0.9, beta: 0.0}}}\n"
    )
    cluster.write_text(f"cluster: c\nresources:\n  gpu: {{price: 1, limit: {limit}}}\n")
    plan = _plan_json(str(profile), str(cluster), "--objective", "time", "--samples", "100")
    notes = [n for n in plan["notes"] if "fewer than 8 a replica" in n]
    assert [s["replicas"] for s in plan["stages"]] == [limit]
    assert bool(notes) is said
    if said:
        assert "stage 0 (16 replicas, alpha 0.90) splits each batch of 16 samples" in notes[0]


def test_a_problem_too_large_for_the_exact_tables_is_answered_not_refused(monkeypatch):
    """Issue 63: plan --scheduler exact past the solver's memory gives the greedy search's plan, said to be
    uncertified, with exit 0; the same problem within the limit is certified."""
    import heterps_cli.schedulers.exact.terms as terms

    monkeypatch.setattr(terms, "MAX_GRID_CELLS", 1)
    plan = _plan_json(CTR, PAPER)
    assert plan["scheduler"] == "greedy" and plan["optimal"] is False
    assert "the exact solver cannot hold this problem" in plan["notes"][0]
    assert f"within {100 * plan['gap']:.2f}% of the optimum" in plan["notes"][0]
    monkeypatch.undo()
    exact = _plan_json(CTR, PAPER)
    assert exact["optimal"] is True
    assert plan["cost_usd"] / (1 + plan["gap"]) <= exact["cost_usd"] * (1 + 1e-9)  # the gap is proven
