"""What ``heterps run`` and ``heterps launch`` refuse before any work (docs/commands.md): every output path
and option that would fail later, on every node or after the training, is refused first, with exit 2."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from heterps_cli.cli.app import app
from heterps_cli.runtime.report import RunReport
from tests.helpers import ROOT, runner, write_plan

CLASSIFY = f"{ROOT / 'docs/guide/classify.py'}:task"
ONE_STAGE = [("cpu", 1, ["0", "1", "2", "3", "4"])]


def _said(result) -> str:
    return " ".join(result.output.split())


def test_a_report_that_cannot_be_written_is_refused_before_the_training(tmp_path):
    plan = write_plan(tmp_path / "plan.json", ONE_STAGE, 32)
    (tmp_path / "t.py").write_text("")
    for out, said in (
        (str(tmp_path), "exists and is a directory"),
        (str(plan), "an input of this command"),
        (str(tmp_path / "t.py"), "an input of this command"),
    ):
        result = runner.invoke(app, ["run", str(plan), "--task", f"{tmp_path}/t.py:task", "--out", out])
        assert result.exit_code == 2 and said in _said(result) and "loss" not in _said(result), _said(result)


@pytest.mark.parametrize(
    "extra, said",
    [
        (["--resume"], "--resume need --checkpoint-dir"),
        (["--checkpoint-every", "5"], "--resume need --checkpoint-dir"),
        (["--task", "missing.py:task"], "missing.py: --task: file not found"),
        (["--model", "missing.py:model"], "missing.py: --model: file not found"),
        (["--report", "{tmp}"], "--report: exists and is a directory"),
        (["--report", "{tmp}/launch/plan.json"], "--report: is {tmp}/launch/plan.json, the plan every node runs"),
        (["--report", "{tmp}/plan.json"], "--report: is {tmp}/plan.json, an input of this command"),
        (["--checkpoint-dir", "{tmp}/plan.json"], "exists and is not a directory"),
        (["--threads", "100000"], "less than or equal to 1024"),
        (["--map", "cpu=cuda\n"], "is not TYPE=cpu, TYPE=cuda or TYPE=cuda:N"),
        (["--map", "cpu=cuda:\u0663"], "is not TYPE=cpu, TYPE=cuda or TYPE=cuda:N"),
    ],
)
def test_launch_refuses_what_every_node_would_fail_on_and_writes_nothing(tmp_path, extra, said):
    plan = write_plan(tmp_path / "plan.json", ONE_STAGE, 32)
    extra, said = [e.replace("{tmp}", str(tmp_path)) for e in extra], said.replace("{tmp}", str(tmp_path))
    result = runner.invoke(app, ["launch", str(plan), "--out-dir", str(tmp_path / "launch"), *extra])
    assert result.exit_code == 2 and said in _said(result), _said(result)
    assert not (tmp_path / "launch").exists()


@pytest.mark.parametrize("device", ["cuda\n", "cuda:\u0663", "cuda:1 ", "CPU"])
def test_a_device_is_cpu_cuda_or_cuda_and_ascii_digits(tmp_path, device):
    plan = write_plan(tmp_path / "plan.json", ONE_STAGE, 32)
    result = runner.invoke(app, ["run", str(plan), "--map", f"cpu={device}"])
    assert result.exit_code == 2 and "is not TYPE=cpu, TYPE=cuda or TYPE=cuda:N" in _said(result)


@pytest.mark.parametrize("option", ["--task", "--out-dir", "--report", "--checkpoint-dir"])
def test_an_argument_that_is_not_utf8_is_refused_naming_its_option(tmp_path, option):
    plan = write_plan(tmp_path / "plan.json", ONE_STAGE, 32)
    args = [b"launch", str(plan).encode(), b"--out-dir", str(tmp_path / "l").encode()]
    args += [option.encode(), str(tmp_path).encode() + b"/\xff\xfe.py"]
    done = subprocess.run([sys.executable, "-m", "heterps_cli", *args], capture_output=True, timeout=120)
    said = done.stderr.decode()
    assert done.returncode == 2 and f"error: {option}: " in said and "is not UTF-8 text" in said, said
    assert "\\xff\\xfe.py" in said and "Traceback" not in said and len(said.splitlines()) == 1
    assert not (tmp_path / "l").exists() and sorted(os.listdir(tmp_path)) == ["plan.json"]


def test_a_loss_that_is_not_a_number_is_null_in_json_and_said_in_the_report():
    report = RunReport("p", "m", 4, 1, 1, 3, 0, 0.0, 10.0, 0, 0, [1.0, math.nan, math.inf], [], first_step=4)
    data = json.loads(report.to_json())  # allow_nan=False: a bare NaN would not parse as JSON elsewhere
    assert data["losses"] == [1.0, None, None] and data["ratio"] is None and report.diverged == 6
    from rich.console import Console

    from heterps_cli.cli.render_measured import run_view

    console = Console(width=400, record=True, file=open(os.devnull, "w"))
    console.print(run_view(report))
    assert "the loss is not a finite number from step 6" in console.export_text()


@pytest.mark.slow  # two processes training three steps: about 10 s
def test_a_task_whose_data_loader_starts_worker_processes_trains(tmp_path):
    """A DataLoader with workers starts processes of its own, which a daemonic process may not."""
    task = tmp_path / "loader_task.py"
    task.write_text(
        "import torch\nfrom torch import nn\nfrom torch.utils.data import DataLoader, TensorDataset\n"
        "def task():\n"
        "    g = torch.Generator().manual_seed(0)\n"
        "    data = TensorDataset(torch.randn(256, 32, generator=g), torch.randint(0, 4, (256,), generator=g))\n"
        "    net = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 4))\n"
        "    loader = DataLoader(data, batch_size=64, num_workers=2)\n"
        "    return {'model': net, 'data': loader, 'loss': nn.functional.cross_entropy}\n"
    )
    plan = write_plan(tmp_path / "plan.json", [("cpu", 1, ["0", "1", "2"]), ("cpu2", 1, ["3", "4"])], 32)
    args = ["run", str(plan), "--task", f"{task}:task", "--map", "cpu2=cpu", "--steps", "3", "--warmup", "0"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "loss" in result.output


@pytest.mark.slow  # two runs of one process: about 8 s
def test_a_run_whose_output_goes_to_a_file_says_each_step_and_that_it_resumes(tmp_path, monkeypatch):
    """On a terminal a progress bar; to a log, a line per step and one saying where it resumes."""
    monkeypatch.setenv("CLASSIFY_DATA", str(tmp_path / "data"))
    plan = write_plan(tmp_path / "plan.json", ONE_STAGE, 32)
    common = ["run", str(plan), "--task", CLASSIFY, "--checkpoint-dir", str(tmp_path / "ck"), "--warmup", "0"]
    first = runner.invoke(app, [*common, "--steps", "3"])
    assert first.exit_code == 0, first.output
    said = first.stderr.splitlines()
    assert [line.split(":")[1].strip() for line in said if ": step " in line] == ["step 1/3", "step 2/3", "step 3/3"]
    assert all(line.startswith("heterps run: ") for line in said) and "on 1 process: steps 1 to 3" in first.stderr
    resumed = runner.invoke(app, [*common, "--steps", "5", "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert "steps 4 to 5, resuming after step 3" in resumed.stderr and "step 5/5: loss" in resumed.stderr
