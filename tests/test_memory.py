"""docs/spec.md section 1b through the real CLI: the new fields, plans that show and honour them, check and diff."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import yaml

from heterps_cli.cli.app import app
from tests.helpers import ROOT
from tests.oracle import spec_figures

HARDWARE = "clusters/paper-hardware.yaml"


def _run(runner, args, expect=0):
    result = runner.invoke(app, args)
    assert result.exit_code == expect, result.output
    assert "Traceback" not in result.output
    return result


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


@pytest.mark.parametrize(
    "where,old,new,field",
    [
        (HARDWARE, "memory_gb: 16", "memory_gb: 0", "resources.v100.memory_gb: must be > 0"),
        (HARDWARE, "bandwidth_gbps: 12.5", "bandwidth_gbps: -1", "resources.v100.bandwidth_gbps: must be > 0"),
        (HARDWARE, "memory_gb: 16", 'memory_gb: "16"', "resources.v100.memory_gb"),
        ("profiles/ctr.yaml", "    sharded: true", "    sharded: yes", "layers[0].sharded"),
        ("profiles/ctr.yaml", "    activation_size: 2080", "    activation_size: -5", "layers[0].activation_size"),
        ("profiles/ctr.yaml", "batch_size: 4096", "batch_size: 4096\nstate_factor: 0", "state_factor: must be > 0"),
    ],
)
def test_the_new_fields_are_validated_with_file_line_and_field(files, runner, where, old, new, field):
    _edit(files / where, old, new)
    result = _run(runner, ["validate", "profiles/ctr.yaml", HARDWARE], expect=2)
    line = next(i for i, text in enumerate((files / where).read_text().splitlines(), 1) if new.split("\n")[-1] in text)
    assert f"{Path(where).name}:{line}: {field}" in result.stderr, result.stderr


def test_a_plan_on_hardware_shows_memory_and_transfer_and_states_them(files, runner):
    shown = _run(runner, ["plan", "profiles/ctr.yaml", HARDWARE, "-s", "exact"]).stdout
    assert "memory and stage-boundary transfer" in shown and "GB per replica" in shown and "transfer s" in shown
    plan = json.loads(_run(runner, ["plan", "profiles/ctr.yaml", HARDWARE, "-s", "exact", "--json"]).stdout)
    assert plan["memory_gb"] == {"cpu": 8, "v100": 16} and plan["bandwidth_gbps"] == {"cpu": 2.08, "v100": 12.5}
    profile = yaml.safe_load((files / "profiles/ctr.yaml").read_text())
    cluster = yaml.safe_load((files / HARDWARE).read_text())
    ref = spec_figures(profile, cluster, plan)  # written from docs/spec.md section 1b, not from the code
    assert ref["memory_fits"] and math.isclose(plan["throughput"], ref["throughput"], rel_tol=1e-9)
    for stage, transfer, memory in zip(plan["stages"], ref["transfer_s"], ref["memory_gb"]):
        assert math.isclose(stage["transfer_s"], transfer, rel_tol=1e-9) and stage["transfer_s"] > 0
        assert math.isclose(stage["memory_gb"], memory, rel_tol=1e-9)


def test_the_papers_model_shows_no_memory_table(files, runner):
    shown = _run(runner, ["plan", "profiles/ctr.yaml", "clusters/paper.yaml", "-s", "exact"]).stdout
    assert "memory and stage-boundary transfer" not in shown
    plan = json.loads(
        _run(runner, ["plan", "profiles/ctr.yaml", "clusters/paper.yaml", "-s", "exact", "--json"]).stdout
    )
    assert plan["memory_gb"] == {"cpu": None, "v100": None} and all(s["transfer_s"] == 0 for s in plan["stages"])


def test_memory_that_no_type_offers_is_exit_3_naming_the_layer(files, runner):
    _edit(files / "profiles/ctr.yaml", "    sharded: true\n", "")  # the 4.1 GB table, whole in every replica
    _edit(files / HARDWARE, "memory_gb: 8", "memory_gb: 2")
    _edit(files / HARDWARE, "memory_gb: 16", "memory_gb: 4")
    for scheduler in ("exact", "greedy"):
        result = _run(runner, ["plan", "profiles/ctr.yaml", HARDWARE, "-s", scheduler], expect=3)
        assert "layer embedding needs 4.1 GB per replica on v100 (memory 4 GB)" in result.stderr, result.stderr
        assert "the largest memory on offer is 4 GB: mark it `sharded: true`" in result.stderr


def test_check_fails_a_plan_whose_stage_no_longer_fits(files, runner):
    _run(runner, ["plan", "profiles/ctr.yaml", HARDWARE, "-s", "exact", "--out", "plan.yaml"])
    check = ["check", "plan.yaml", "--profile", "profiles/ctr.yaml", "--cluster", HARDWARE]
    _run(runner, check)
    # The table is no longer sharded: stage 0's replicas each hold all 4.1 GB of it, on 2 GB cores.
    _edit(files / "profiles/ctr.yaml", "    sharded: true\n", "")
    _edit(files / HARDWARE, "memory_gb: 8", "memory_gb: 2")
    shown = " ".join(_run(runner, check, expect=1).stdout.split())
    assert "stage 0 needs 4.1 GB per replica on cpu (memory 2 GB)" in shown
    assert "stages[0].memory_gb" in shown  # and the written figure is stale


OLD_PLAN = ROOT / "tests/data/ctr-plan-before-1b.yaml"  # docs/plans/ctr.yaml as an older heterps wrote it


def test_a_plan_made_before_section_1b_still_checks_and_says_what_it_leaves_out(files, runner):
    plan = yaml.safe_load(OLD_PLAN.read_text())
    assert "memory_gb" not in plan and "transfer_s" not in plan["stages"][0] and "format" not in plan
    shutil.copy(OLD_PLAN, files / "old.yaml")
    shown = " ".join(
        _run(
            runner, ["check", "old.yaml", "--profile", "profiles/ctr.yaml", "--cluster", "clusters/paper.yaml"]
        ).output.split()
    )
    assert "it states no format (an older heterps's plan)" in shown and "stages[0].memory_gb" in shown, shown


def test_diff_shows_the_memory_per_replica(files, runner):
    _run(runner, ["plan", "profiles/ctr.yaml", HARDWARE, "-s", "exact", "--out", "a.yaml"])
    _edit(files / "profiles/ctr.yaml", "    sharded: true\n", "")
    _run(runner, ["plan", "profiles/ctr.yaml", HARDWARE, "-s", "exact", "--out", "b.yaml"])
    shown = _run(runner, ["diff", "a.yaml", "b.yaml", "--format", "markdown"]).stdout
    assert " GB" in shown and "4.1 GB" in shown, shown


FAST_CPU = "{cpu: {oct: 0.1, odt: 0, alpha: 1, beta: 1}, gpu: {oct: 0.3, odt: 0, alpha: 1, beta: 1}}"
FAST_GPU = "{cpu: {oct: 0.3, odt: 0, alpha: 1, beta: 1}, gpu: {oct: 0.1, odt: 0, alpha: 1, beta: 1}}"
SHARED = f"""model: m
batch_size: 8
layers:
  - {{name: fc1, type: fc, input_size: 4, weight_size: 0, activation_size: 10, times: {FAST_CPU}}}
  - {{name: relu, type: activation, input_size: 8, weight_size: 0, activation_size: 8, times: {FAST_CPU}}}
  - {{name: fc2, type: fc, input_size: 8, weight_size: 0, activation_size: 8, input_saved: 8, times: {FAST_GPU}}}
"""


@pytest.mark.parametrize(
    ("types", "memory"),
    [
        ({"cpu": 1}, [8 * (10 + 8 + 8 - 8)]),  # one stage holds the ReLU's output once
        ({"cpu": 1, "gpu": 1}, [8 * (10 + 8), 8 * 8]),  # fc2 starts a stage: its own copy of its input
    ],
)
def test_a_tensor_two_layers_keep_is_held_once_by_a_stage_and_again_by_the_next(tmp_path, runner, types, memory):
    (tmp_path / "p.yaml").write_text(SHARED)
    lines = ["cluster: c", "resources:"]
    lines += [f"  {t}: {{price: 1, limit: {n}, memory_gb: 1}}" for t, n in types.items()]
    (tmp_path / "c.yaml").write_text("\n".join(lines) + "\n")
    args = ["plan", str(tmp_path / "p.yaml"), str(tmp_path / "c.yaml"), "--samples", "100", "--objective", "time"]
    result = runner.invoke(app, [*args, "--scheduler", "exact", "--json"])
    assert result.exit_code == 0, result.output
    stages = json.loads(result.stdout)["stages"]
    assert [s["memory_gb"] * 1e9 for s in stages] == pytest.approx(memory)


@pytest.mark.parametrize(
    ("old", "new", "says"),
    [
        ("activation_size: 10,", "activation_size: 10, input_saved: 1,", "layers[0].input_saved: the first layer"),
        ("input_saved: 8", "input_saved: 9", "layers[2].input_saved: 9 is more than the layer's activation_size"),
    ],
)
def test_input_saved_is_validated_with_file_line_and_field(tmp_path, runner, old, new, says):
    (tmp_path / "p.yaml").write_text(SHARED.replace(old, new))
    result = runner.invoke(app, ["validate", str(tmp_path / "p.yaml")])
    assert result.exit_code == 2 and says in result.stderr and "p.yaml:" in result.stderr
