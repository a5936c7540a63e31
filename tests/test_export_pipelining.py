"""heterps export --to pipelining (docs/guide/engines.md): the script runs the plan under torchrun with
PyTorch's own PipelineStage and Schedule1F1B and gives one process's losses; what pipelining cannot express
is refused, naming it. Known answers come from one process (runtime.task_losses)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

import pytest

from heterps_cli.cli.app import app
from tests.helpers import ROOT, run_in_session, runner, write_plan
from tests.test_launch import _task_reference, free_port

CLASSIFY = f"{ROOT / 'docs/guide/classify.py'}:task"


def _two_stages(tmp_path):
    return write_plan(tmp_path / "plan.json", [("cpu", 1, ["0", "1", "2"]), ("cpu2", 1, ["3", "4"])], 32)


def test_the_script_names_the_plans_split_and_schedule(tmp_path):
    result = runner.invoke(app, ["export", str(_two_stages(tmp_path)), "--to", "pipelining", "--micro-batches", "4"])
    assert result.exit_code == 0, result.output
    tree = ast.parse(result.stdout)  # a whole Python file
    values = {t.id: node.value for node in tree.body if isinstance(node, ast.Assign) for t in node.targets
              if isinstance(t, ast.Name)}  # fmt: skip
    assert ast.literal_eval(values["STAGES"]) == [["0", "1", "2"], ["3", "4"]]
    assert "Schedule1F1B(stage, MICRO_BATCHES" in result.stdout
    assert "PipelineStage(module, index, count" in result.stdout
    assert "BATCH, MICRO_BATCHES = 32, 4" in result.stdout


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (lambda s: s.update(replicas=2), "stage 1 has 1 replicas, stage 0 2 (one data-parallel degree)"),
        (lambda s: s.update(tp=2), "stage 0 runs at tp 2"),
        (lambda s: s.update(recompute=True), "stage 0 recomputes"),
    ],
)
def test_what_pipelining_cannot_express_is_refused_naming_it(tmp_path, edit, said):
    path = _two_stages(tmp_path)
    plan = json.loads(path.read_text())
    edit(plan["stages"][0])
    path.write_text(json.dumps(plan))
    out = tmp_path / "pipe.py"
    result = runner.invoke(app, ["export", str(path), "--to", "pipelining", "--out", str(out)])
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and said in text and "plan.json" in text and "Traceback" not in text
    assert not out.exists()


def _trains_as_one_process(tmp_path, plan, processes: int) -> tuple[list[float], dict]:
    """The plan's pipelining script under torchrun on ``processes`` processes, 6 steps of 4 micro-batches of
    32: its losses, each within 1e-5 of one process's; and the environment it ran in."""
    script = tmp_path / "pipe.py"
    made = runner.invoke(app, ["export", str(plan), "--to", "pipelining", "--micro-batches", "4", "-o", str(script)])
    assert made.exit_code == 0, made.output
    env = {**os.environ, "CLASSIFY_DATA": str(tmp_path / "data")}
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes),
            "--master-port", str(free_port()), str(script), "--task", CLASSIFY, "--steps", "6"]  # fmt: skip
    code, stdout, stderr = run_in_session(argv, env=env, cwd=tmp_path, timeout=300)
    assert code == 0, stderr[-3000:]
    losses = [json.loads(line)["loss"] for line in stdout.splitlines() if line.startswith("{")]
    reference, _ = _task_reference(tmp_path / "data", 32 * 4, 6)
    assert len(losses) == 6 and max(abs(a - b) / abs(b) for a, b in zip(losses, reference)) < 1e-5
    return losses, env


@pytest.mark.slow  # torchrun and four processes
def test_two_replicas_a_stage_train_as_one_process(tmp_path):
    plan = write_plan(tmp_path / "plan.json", [("cpu", 2, ["0", "1", "2"]), ("cpu2", 2, ["3", "4"])], 32)
    _trains_as_one_process(tmp_path, plan, 4)


@pytest.mark.slow  # torchrun and two processes
def test_the_pipelining_script_trains_as_one_process_and_as_heterps_run(tmp_path):
    plan = _two_stages(tmp_path)
    losses, env = _trains_as_one_process(tmp_path, plan, 2)
    ran = subprocess.run([sys.executable, "-m", "heterps_cli", "run", str(plan), "--task", CLASSIFY, "--map",
                          "cpu2=cpu", "--micro-batches", "4", "--steps", "6", "--json"], env=env,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    theirs = json.loads(ran.stdout)["losses"]
    assert max(abs(a - b) / abs(b) for a, b in zip(losses, theirs)) < 1e-5
