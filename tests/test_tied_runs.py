"""Tied tensors and stateful layers in real runs (docs/spec.md section 1j): a GPT whose output head shares
the token embedding's weight trains on a pipeline of stages, with replicas, as one process does, its copies
bit-equal; a checkpoint holds the tensor once and resumes; batch normalisation on replicas keeps the first
replica's statistics, as DDP does. Known answers come from one process (runtime.task_losses) or from a
DDP-style loop written here."""

from __future__ import annotations

import copy
import json
import textwrap

import pytest
import torch
import yaml

from heterps_cli.cli.app import app
from heterps_cli.runtime import task_losses
from tests.helpers import ROOT, heterps, runner, write_plan

TIED = f"{ROOT / 'docs/guide/tiedgpt.py'}:task"
TIED_MODEL = f"{ROOT / 'docs/guide/tiedgpt.py'}:model"
B, M = 8, 2  # the plans' micro-batch, and micro-batches per step


def _plan(tmp_path, replicas: int = 1):
    """The embedding and a block on one stage, a block and the head (the tie's other holder) on another."""
    stages = [("cpu", replicas, ["0", "1"]), ("cpu2", replicas, ["2", "3"])]
    return write_plan(tmp_path / "plan.json", stages, B, model="tiedgpt:model")


def _run(plan, *more: str) -> tuple[dict, str]:
    result = heterps("run", str(plan), "--task", TIED, "--map", "cpu2=cpu", "--micro-batches", str(M),
                     "--max-processes", "4", "--json", *more, timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout), result.stderr


def _close(measured: list[float], reference: list[float]) -> None:
    assert len(measured) == len(reference)
    worst = max(abs(a - b) / abs(b) for a, b in zip(measured, reference))
    assert worst < 1e-6, (worst, measured, reference)


@pytest.mark.slow  # over a second here: the slow suite, which CI runs too
def test_a_tied_embedding_split_across_two_stages_trains_as_one_process(tmp_path):
    report, _ = _run(_plan(tmp_path), "--steps", "10")
    reference, _ = task_losses(TIED, B * M, 10)
    _close(report["losses"], reference)
    assert reference[-1] < 0.95 * reference[0]  # it learns: a drifting copy would show
    assert report["tied"] == {"0.tok.weight": {"copies": 2, "values": 1}}


@pytest.mark.slow  # two runs of four processes, 30 steps in all: about 30 s
def test_on_replicas_and_resumed_the_tied_copies_stay_one_tensor(tmp_path):
    plan, folder = _plan(tmp_path, replicas=2), tmp_path / "checkpoints"
    first, _ = _run(plan, "--steps", "15", "--checkpoint-dir", str(folder), "--checkpoint-every", "5")
    later, _ = _run(plan, "--steps", "30", "--checkpoint-dir", str(folder), "--resume")
    reference, weights = task_losses(TIED, B * M, 30)
    _close(first["losses"] + later["losses"], reference)
    assert later["tied"] == {"0.tok.weight": {"copies": 4, "values": 1}}
    step = folder / "step-000030"
    head = torch.load(step / "stage-1.pt", weights_only=True)
    embed = torch.load(step / "stage-0.pt", weights_only=True)
    assert "1.out.weight" not in head["model"] and head["tied"] == {"1.out.weight": [0, "0.tok.weight"]}
    saved = embed["model"]["0.tok.weight"]
    assert torch.allclose(saved, weights["0.tok.weight"], rtol=1e-5, atol=1e-6)


def test_a_plan_that_shards_a_tied_weight_is_refused_before_any_process_starts(tmp_path):
    plan = _plan(tmp_path)
    doc = json.loads(plan.read_text())
    doc["stages"][1]["tp"] = 2
    plan.write_text(json.dumps(doc))
    result = runner.invoke(
        app, ["run", str(plan), "--task", TIED, "--map", "cpu2=cpu", "--steps", "1", "--max-processes", "4"]
    )
    said = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert "tied parameter 0.tok.weight" in said and "layers '0', '3'" in said and "stage 1 runs it at tp 2" in said


@pytest.mark.slow  # over a second here: the slow suite, which CI runs too
def test_a_profile_records_the_tie_and_counts_the_weight_once(tmp_path):
    out = tmp_path / "tied.yaml"
    result = heterps("profile", "estimate", TIED_MODEL, "a100-40gb", "--as", "a100-40gb", "--batch-size", "8",
                     "--out", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr
    profile = yaml.safe_load(out.read_text())
    assert profile["ties"] == [{"tensor": "0.tok.weight", "kind": "parameter", "bytes": 8192, "layers": ["0", "3"]}]
    import importlib.util

    spec = importlib.util.spec_from_file_location("tiedgpt", ROOT / "docs/guide/tiedgpt.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    unique = sum(p.numel() * p.element_size() for p in module.gpt().parameters())  # each tensor once
    assert sum(layer["weight_size"] for layer in profile["layers"]) == unique


BATCH_NORM = """
import torch
from torch import nn
from heterps_cli import Task

def net():
    return nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))

def task():
    g = torch.Generator().manual_seed(7)
    data = torch.utils.data.TensorDataset(torch.randn(256, 6, generator=g), torch.randint(0, 3, (256,), generator=g))
    return Task(net(), data, nn.functional.cross_entropy, shuffle=False)
"""


def _ddp_reference(steps: int, replicas: int) -> tuple[list[float], dict]:
    """DDP's semantics written out: each replica a copy of the model on its share of every micro-batch
    (batch normalisation over that share), gradients summed, one SGD step on every copy, and every copy's
    buffers the first replica's after the step (``broadcast_buffers``)."""
    scope: dict = {}
    exec(textwrap.dedent(BATCH_NORM), scope)
    torch.manual_seed(0)
    made = scope["task"]()
    copies = [made.model] + [copy.deepcopy(made.model) for _ in range(replicas - 1)]
    optimisers = [torch.optim.SGD(m.parameters(), lr=0.01) for m in copies]
    x_all, y_all = made.data.tensors
    losses, N = [], B * M
    for step in range(steps):
        x, y = x_all[step * N : (step + 1) * N], y_all[step * N : (step + 1) * N]
        total = 0.0
        for j in range(M):
            for r, m in enumerate(copies):
                a, b = j * B + r * B // replicas, j * B + (r + 1) * B // replicas
                loss = made.loss(m(x[a:b]), y[a:b]) * ((b - a) / N)
                loss.backward()
                total += float(loss.detach())
        grads = [sum(p.grad for p in ps) for ps in zip(*(m.parameters() for m in copies))]
        for m, opt in zip(copies, optimisers):
            for p, g in zip(m.parameters(), grads):
                p.grad = g.clone()
            opt.step()
            opt.zero_grad()
        for m in copies[1:]:
            for mine, first in zip(m.buffers(), copies[0].buffers()):
                mine.copy_(first)
        losses.append(total)
    return losses, copies[0].state_dict()


@pytest.mark.slow  # two processes, 12 steps, and a checkpoint: about 10 s
def test_batch_normalisation_on_replicas_keeps_the_first_replicas_statistics_as_ddp_does(tmp_path):
    task = tmp_path / "bn.py"
    task.write_text(textwrap.dedent(BATCH_NORM))
    plan = write_plan(tmp_path / "plan.json", [("cpu", 2, ["0", "1", "2", "3"])], B)
    folder = tmp_path / "checkpoints"
    result = heterps("run", str(plan), "--task", f"{task}:task", "--steps", "12", "--micro-batches", str(M),
                     "--checkpoint-dir", str(folder), "--json", timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    reference, state = _ddp_reference(12, 2)
    _close(json.loads(result.stdout)["losses"], reference)
    saved = torch.load(folder / "step-000012" / "stage-0.pt", weights_only=True)["model"]
    for name in ("1.running_mean", "1.running_var"):
        assert torch.allclose(saved[name], state[name], rtol=1e-5, atol=1e-7)
    assert int(saved["1.num_batches_tracked"]) == int(state["1.num_batches_tracked"]) == 12 * M


@pytest.mark.slow  # a measured profile: about 10 s
def test_the_training_guides_tied_model_commands_run_as_written(tmp_path, monkeypatch):
    import re
    import shlex
    import shutil

    text = (ROOT / "docs/guide/training.md").read_text()
    section = text[text.index("## Tied weights") :]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block is not None
    (tmp_path / "docs/guide").mkdir(parents=True)
    shutil.copy(ROOT / "docs/guide/tiedgpt.py", tmp_path / "docs/guide/tiedgpt.py")
    monkeypatch.chdir(tmp_path)
    for line in block.group(1).strip().splitlines():
        result = runner.invoke(app, shlex.split(line)[1:])
        assert result.exit_code == 0, (line, result.output)
    assert "tied parameter 0.tok.weight" in " ".join(result.output.split())
    assert yaml.safe_load((tmp_path / "tied.yaml").read_text())["ties"][0]["layers"] == ["0", "3"]
