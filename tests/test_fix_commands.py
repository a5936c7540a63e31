"""Every fix `heterps check` suggests, run as printed, makes a plan that passes the check that suggested it.

Once the job gate suggested a tapp command without ``--objective cost`` (tapp's own default is
time, so its plan failed the same gate), and a frontier plan's fix rounded ``--min-throughput``
from 3292.4467 up to 3292.45, which made a dearer plan than the committed one.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from heterps_cli.cli.app import app
from tests.helpers import runner

PROFILE, CLUSTER, PLAN = "profiles/ctr.yaml", "clusters/paper.yaml", "plans/ctr.yaml"
COMMAND = re.compile(r"heterps plan .*? --out [^\s;,]+")


def _check(args: list[str]) -> tuple[int, list[dict]]:
    result = runner.invoke(app, ["check", *args, "--format", "json"])
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.stdout)["findings"]


def _plan(*args: str) -> None:
    result = runner.invoke(app, ["plan", PROFILE, CLUSTER, *args, "--out", PLAN])
    assert result.exit_code == 0, result.output


def _edit(path: str, old: str, new: str) -> None:
    text = Path(path).read_text()
    assert old in text, old
    Path(path).write_text(text.replace(old, new, 1))


def _fix_and_recheck(args: list[str], gate: str) -> str:
    """Check, take the failing ``gate``'s command, run it, check again: everything passes."""
    code, findings = _check(args)
    failed = {f["gate"]: f for f in findings if f["status"] == "fail"}
    assert code == 1 and gate in failed, findings
    match = COMMAND.search(failed[gate]["fix"])
    assert match, failed[gate]["fix"]
    command = shlex.split(match.group(0))[1:]
    result = runner.invoke(app, command)
    assert result.exit_code == 0, (command, result.output)
    code, findings = _check(args)
    assert code == 0, (command, [f for f in findings if f["status"] == "fail"])
    return match.group(0)


def _args(*extra: str, plan: str = PLAN) -> list[str]:
    return [plan, "--profile", PROFILE, "--cluster", CLUSTER, *extra]


def test_fits(files):
    _edit(PROFILE, "name: fc2", "name: fc2_wide")
    _fix_and_recheck(_args(), "fits")


def test_job(files):
    _fix_and_recheck(_args("--samples", "1234567.891"), "job")


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
def test_job_of_a_tapp_plan_for_cost_keeps_the_objective(files):
    _plan("--scheduler", "tapp", "--objective", "cost", "--samples", "1000", "--steps", "10")
    command = _fix_and_recheck(_args(), "job")
    assert "--scheduler tapp --objective cost" in command


@pytest.mark.parametrize(
    "path, old, new, gate",
    [
        (PLAN, "feasible: true", "feasible: false", "feasible"),
        (CLUSTER, "price: 2.42", "price: 2.9", "fresh"),
        (CLUSTER, "limit: 480", "limit: 20", "limits"),
        (PROFILE, "min_throughput: 150000", "min_throughput: 2345678.9", "plan-throughput"),
    ],
)
def test_a_changed_file(files, path, old, new, gate):
    _edit(path, old, new)
    _fix_and_recheck(_args(), gate)


def test_min_throughput(files):
    _fix_and_recheck(_args("--min-throughput", "2345678.9"), "min-throughput")


# A dear plan: three random schedules in the papers' space (in the whole space the exact step after
# any search finds ctr's optimum on this cluster); the checks and their fixes keep to that space.
DEAR = ("--scheduler", "random", "--evaluations", "3", "--maximal-stages")


def test_max_cost_with_a_plan_a_quick_search_made_dear(runner, files):
    _plan(*DEAR)
    exact = runner.invoke(app, ["plan", PROFILE, CLUSTER, "--scheduler", "exact", "--maximal-stages", "--json"])
    budget = json.loads(exact.stdout)["cost_usd"] * 1.0001
    _fix_and_recheck(_args("--max-cost", repr(budget), "--maximal-stages"), "max-cost")


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
def test_replan_with_a_seed(files):
    _plan(*DEAR)
    command = _fix_and_recheck(
        _args("--replan", "random", "--seed", "7", "--tolerance", "0", "--maximal-stages"), "replan"
    )
    assert "--seed 7" in command and "--maximal-stages" in command


def test_optimal(files):
    _plan(*DEAR)
    _edit(PLAN, "optimal: null", "optimal: true")
    _fix_and_recheck(_args("--replan", "exact", "--maximal-stages"), "optimal")


def test_a_frontier_point_is_fixed_at_its_own_throughput(runner, files, tmp_path):
    # A plan for a throughput of many digits: the command carries all of them, so the plan it makes
    # is the frontier's own (rounding up once asked for a dearer plan).
    profile, cluster = "profiles/transformer.yaml", "clusters/three-type.yaml"
    result = runner.invoke(app, ["frontier", profile, cluster, "--out", "fr"])
    assert result.exit_code == 0, result.output
    point = "fr/plan-010.yaml"
    written = yaml.safe_load(Path(point).read_text())
    throughput = repr(written["min_throughput"])
    assert len(throughput) > 8
    _edit(cluster, "price: 0.04", "price: 0.05")  # every figure stale, the job the same
    args = [point, "--profile", profile, "--cluster", cluster, "--min-throughput", throughput, "--replan", "exact"]
    command = _fix_and_recheck(args, "fresh")
    assert f"--min-throughput {throughput}" in command
