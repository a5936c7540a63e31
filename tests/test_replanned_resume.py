"""Checkpoints that leave heterps and come back under another plan (docs/spec.md section 4b): a checkpoint's
model.pt loads into the user's own model with strict names, its optimizer.pt into an optimiser over it, and
a run resumed under another cut, replica count or tensor-parallel degree gives the losses of one process.
Known answers come from one process (runtime.task_losses)."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
import torch

from heterps_cli.runtime import task_losses
from tests.helpers import ROOT, heterps, write_plan

TIED = f"{ROOT / 'docs/guide/tiedgpt.py'}:task"
B, M = 8, 2  # the plans' micro-batch, and micro-batches per step


def _plan(path, stages, tp=None):
    plan = write_plan(path, [(r, k, layers) for r, k, layers in stages], B, model="m")
    if tp:
        doc = json.loads(plan.read_text())
        for s, degree in tp.items():
            doc["stages"][s]["tp"] = degree
        plan.write_text(json.dumps(doc))
    return plan


def _run(plan, task, *more: str) -> tuple[dict, str]:
    result = heterps("run", str(plan), "--task", task, "--map", "cpu2=cpu", "--micro-batches", str(M),
                     "--max-processes", "4", "--json", *more, timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout), result.stderr


def _close(measured: list[float], reference: list[float], within: float = 1e-5) -> None:
    assert len(measured) == len(reference)
    worst = max(abs(a - b) / abs(b) for a, b in zip(measured, reference))
    assert worst < within, (worst, measured, reference)


def _sgd_task(tmp_path) -> str:
    """docs/guide/classify.py's task with SGD in place of Adam."""
    path = tmp_path / "sgd.py"
    path.write_text(
        textwrap.dedent(f"""
        import dataclasses, sys
        import torch
        sys.path.insert(0, {str(ROOT / "docs/guide")!r})
        import classify

        def task():
            return dataclasses.replace(classify.task(), optimizer=lambda p: torch.optim.SGD(p, lr=0.05))
        """)
    )
    return f"{path}:task"


@pytest.mark.slow  # a run of four processes
def test_a_checkpoint_of_tp_stages_and_a_tie_loads_into_the_users_own_model(tmp_path):
    """Three stages, the middle one at tp 2, the embedding's weight tied to the head's across the first and
    last: model.pt loads with strict=True into the factory's model, whose outputs are one process's after
    the same steps; optimizer.pt loads into Adam over it, and the next step's loss is one process's."""
    plan = _plan(tmp_path / "a.json", [("cpu", 1, ["0"]), ("cpu2", 1, ["1", "2"]), ("cpu", 1, ["3"])], tp={1: 2})
    folder = tmp_path / "ck"
    report, _ = _run(plan, TIED, "--steps", "4", "--checkpoint-dir", str(folder))
    reference, _ = task_losses(TIED, B * M, 5)
    _close(report["losses"], reference[:4])
    sys.path.insert(0, str(ROOT / "docs/guide"))
    try:
        import tiedgpt
    finally:
        sys.path.remove(str(ROOT / "docs/guide"))
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    step = folder / "step-000004"
    mine = tiedgpt.gpt()
    state = torch.load(step / "model.pt", weights_only=True)
    mine.load_state_dict(state, strict=True)
    assert torch.equal(state["0.tok.weight"], state["3.out.weight"])  # the tie, under both its names
    assert set(state) == set(tiedgpt.gpt().state_dict())
    # one process after 4 steps, and the same inputs: the same outputs
    theirs = tiedgpt.gpt()
    _, after_four = task_losses(TIED, B * M, 4)
    theirs.load_state_dict(after_four)
    tokens = torch.randint(0, tiedgpt.VOCAB, (4, tiedgpt.CONTEXT), generator=torch.Generator().manual_seed(7))
    assert torch.allclose(mine(tokens), theirs(tokens), rtol=1e-5, atol=1e-5)
    # the optimiser's state too: a fifth step from both files gives one process's fifth loss
    task = tiedgpt.task()
    optimiser = task.optimizer(mine.parameters())
    set_optimizer_state_dict(mine, optimiser, torch.load(step / "optimizer.pt", weights_only=True))
    from heterps_cli.runtime.task import Samples

    x, y = Samples(task.data, B * M, 0, task.shuffle).take(4, 0, B * M)
    loss = task.loss(mine(x), y)
    _close([float(loss.detach())], [reference[4]])


@pytest.mark.slow  # two runs of up to four processes each, twice
@pytest.mark.parametrize("optimiser", ["adam", "sgd"])
def test_four_steps_under_one_plan_then_four_under_another_are_eight_of_one_process(tmp_path, optimiser):
    """Adam: the tied GPT on two stages of one replica, resumed on a stage of two replicas over another cut.
    SGD: an MLP whose first stage runs at tp 1, resumed with it at tp 2 on other replicas."""
    if optimiser == "adam":
        task = TIED
        first = _plan(tmp_path / "a.json", [("cpu", 1, ["0", "1"]), ("cpu2", 1, ["2", "3"])])
        then = _plan(tmp_path / "b.json", [("cpu", 2, ["0"]), ("cpu2", 1, ["1", "2", "3"])])
    else:
        task = _sgd_task(tmp_path)
        first = _plan(tmp_path / "a.json", [("cpu", 1, ["0", "1", "2"]), ("cpu2", 2, ["3", "4"])])
        then = _plan(tmp_path / "b.json", [("cpu", 1, ["0", "1", "2"]), ("cpu2", 1, ["3", "4"])], tp={0: 2})
    folder = tmp_path / "ck"
    a, _ = _run(first, task, "--steps", "4", "--checkpoint-dir", str(folder))
    b, said = _run(then, task, "--steps", "8", "--checkpoint-dir", str(folder), "--resume")
    reference, _ = task_losses(task, B * M, 8)
    _close(a["losses"] + b["losses"], reference)
    assert "under this plan" in said and "model.pt" in said
    assert sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) == ["step-000004", "step-000008"]


@pytest.mark.slow  # a run of two processes
def test_a_resume_of_another_job_is_refused_and_the_folder_kept(tmp_path):
    plan = _plan(tmp_path / "a.json", [("cpu", 1, ["0", "1"]), ("cpu2", 1, ["2", "3"])])
    folder = tmp_path / "ck"
    _run(plan, TIED, "--steps", "2", "--checkpoint-dir", str(folder))
    before = sorted((p.name, p.stat().st_size) for p in (folder / "step-000002").iterdir())
    for more, said in ((["--seed", "1"], "seed 0 there, 1 now"), (["--micro-batches", "4"], "samples a step")):
        result = heterps("run", str(plan), "--task", TIED, "--map", "cpu2=cpu", "--steps", "4", "--max-processes",
                         "4", "--checkpoint-dir", str(folder), "--resume", *more, timeout=300)  # fmt: skip
        assert result.returncode == 2 and said in " ".join(result.stderr.split()), result.stderr
    assert sorted((p.name, p.stat().st_size) for p in (folder / "step-000002").iterdir()) == before
