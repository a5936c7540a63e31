"""heterps run --task: the user's model, data, loss and optimiser trained with a plan, checkpoints and
resuming (docs/guide/training.md). Known answers come from one process training the whole model on the
same samples in the same order (runtime.task_losses), and from slicing the data by hand."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import Dataset

from heterps_cli.cli.app import app
from heterps_cli.runtime import checkpoint, task_losses
from heterps_cli.runtime.task import Samples
from tests.helpers import ROOT, guide_commands, run_in_session, runner, session_processes, write_plan

CLASSIFY = f"{ROOT / 'docs/guide/classify.py'}:task"
TWO_STAGES = [("cpu", 1, ["0", "1", "2"]), ("cpu2", 1, ["3", "4"])]


@pytest.fixture
def data(tmp_path, monkeypatch):
    """The guide's dataset, generated into this test's folder (the run's processes inherit the variable)."""
    monkeypatch.setenv("CLASSIFY_DATA", str(tmp_path / "data"))
    return tmp_path / "data"


class Numbered(Dataset):
    def __init__(self, n: int):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.tensor([float(i)]), i


def test_a_dataset_is_read_epoch_after_epoch_each_in_its_own_seeded_order():
    samples = Samples(Numbered(10), 4, seed=3)
    stream = [int(samples.take(step, 0, 4)[1][k]) for step in range(5) for k in range(4)]  # 20 samples: 2 epochs
    assert sorted(stream[:10]) == list(range(10)) and sorted(stream[10:]) == list(range(10))
    assert stream[:10] != stream[10:]  # each epoch its own order
    again = Samples(Numbered(10), 4, seed=3)
    x, y = again.take(3, 1, 3)  # any step's slice, without reading the ones before
    assert y.tolist() == stream[13:15] and x.flatten().tolist() == [float(v) for v in stream[13:15]]
    plain = Samples(Numbered(10), 4, seed=3, shuffle=False)
    assert plain.take(2, 0, 4)[1].tolist() == [8, 9, 0, 1]


def test_an_iterable_of_batches_of_any_size_is_cut_into_steps_and_read_again_when_it_ends():
    sizes = [3, 5, 2]  # 10 samples per pass, batches not aligned with the steps' 4

    class Batches:
        def __iter__(self):
            start = 0
            for size in sizes:
                yield torch.arange(start, start + size).float().unsqueeze(1), torch.arange(start, start + size)
                start += size

    samples = Samples(Batches(), 4, seed=0)
    brute = [i % 10 for i in range(28)]
    for step in range(7):
        for lo, hi in ((0, 2), (2, 4)):
            assert samples.take(step, lo, hi)[1].tolist() == brute[step * 4 + lo : step * 4 + hi]
    assert samples.take(1, 0, 4)[1].tolist() == brute[4:8]  # a step back: read again from the start
    once = Samples(iter([(torch.zeros(2, 1), torch.zeros(2))]), 4, seed=0)
    with pytest.raises(Exception, match="the data ran out"):
        once.take(0, 0, 4)


def _task_file(tmp_path: Path, body: str) -> str:
    path = tmp_path / "bad_task.py"
    path.write_text(textwrap.dedent(body))
    return f"{path}:task"


HEAD = """
import torch
from torch import nn
from torch.utils.data import TensorDataset
net = lambda: nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 4))
data = TensorDataset(torch.randn(64, 32), torch.randint(0, 4, (64,)))
class Odd(torch.utils.data.Dataset):
    def __init__(self, length, item):
        self.length, self.item = length, item
    def __len__(self):
        return self.length()
    def __getitem__(self, i):
        return self.item(i)
def ok(i):
    return torch.zeros(32), 1
def fails(*args):
    raise KeyError('gone')
def task_of(data, **more):
    return {'model': net(), 'data': data, 'loss': nn.functional.cross_entropy, **more}
"""


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("def task():\n    return 3\n", "returns a heterps_cli.Task or a dict of its fields, not int"),
        ("def task():\n    return {'model': net(), 'data': data}\n", "missing loss"),
        ("def task():\n    return {'model': net(), 'data': data, 'loss': 1}\n", "task: loss: must be callable"),
        (
            "def task():\n    return {'model': 'x', 'data': data, 'loss': max}\n",
            "task: model: must be a torch.nn.Module",
        ),
        (
            "def task():\n    return {'model': net(), 'data': 5, 'loss': max}\n",
            "task: data: must be a torch.utils.data",
        ),
        ("def task():\n    return {'model': net(), 'data': data, 'loss': lambda o, t: o}\n", "a tensor of one value"),
        ("def task():\n    return {'model': net(), 'data': [1, 2], 'loss': max}\n", "must be (inputs, targets)"),
        ("def task():\n    raise ValueError('no data here')\n", "no data here"),
        (
            "def task():\n    return {'model': net(), 'data': data, 'loss': nn.functional.cross_entropy, "
            "'optimizer': lambda p: 3}\n",
            "must build a torch.optim.Optimizer",
        ),
        ("def task():\n    return {'model': nn.Linear(32, 4), 'data': data, 'loss': max}\n", "layers"),
        ("def task():\n    return task_of(Odd(lambda: -1, ok))\n", "__len__ raised ValueError: __len__() should"),
        ("def task():\n    return task_of(Odd(fails, ok))\n", "the dataset's __len__ raised KeyError: 'gone'"),
        ("def task():\n    return task_of(Odd(lambda: 9, fails))\n", "(__getitem__) raised KeyError: 'gone'"),
        ("def task():\n    return task_of(Odd(lambda: 9, lambda i: ('x', 'y')))\n", "not tensors or numbers"),
        ("def task():\n    return task_of([(torch.zeros(0, 32), torch.zeros(0))])\n", "gave no sample"),
        ("def task():\n    return task_of(data, blocks=5)\n", "blocks: must be a list of the model's modules"),
        (
            "import itertools\ndef task():\n    return task_of(itertools.repeat((torch.zeros(0, 32), torch.zeros(0))))"
            "\n",
            "10,000 empty batches in a row",
        ),
        (
            "class Short(Odd):\n    def __getitems__(self, i):\n        return torch.zeros(len(i) - 1, 32), "
            "torch.zeros(len(i) - 1)\ndef task():\n    return task_of(Short(lambda: 9, ok))\n",
            "__getitems__ gave 31 samples for 32 indices",
        ),
    ],
)
def test_a_bad_task_is_refused_before_any_process_starts(tmp_path, body, expected):
    plan = write_plan(tmp_path / "plan.json", TWO_STAGES, 32)
    spec = _task_file(tmp_path, HEAD + body)
    result = runner.invoke(app, ["run", str(plan), "--task", spec, "--map", "cpu2=cpu"])
    shown = " ".join(result.output.split())
    assert result.exit_code == 2 and expected in shown, shown
    assert "Traceback" not in result.output


def test_checkpoint_options_need_a_folder_and_a_task_no_model(tmp_path, data):
    plan = write_plan(tmp_path / "plan.json", TWO_STAGES, 32)
    for extra, expected in (
        (["--resume"], "need --checkpoint-dir"),
        (["--checkpoint-every", "2"], "need --checkpoint-dir"),
        (["--task", CLASSIFY, "--model", "mlp"], "leave --model out"),
    ):
        result = runner.invoke(app, ["run", str(plan), "--map", "cpu2=cpu", *extra])
        assert result.exit_code == 2 and expected in " ".join(result.output.split()), result.output


@pytest.mark.slow  # four processes training 20 steps: about 20 s
def test_a_two_stage_two_replica_plan_trains_a_task_with_adam_as_one_process_does(tmp_path, data):
    plan = write_plan(tmp_path / "plan.json", [("cpu", 2, ["0", "1", "2"]), ("cpu2", 2, ["3", "4"])], 32)
    report = tmp_path / "report.json"
    result = runner.invoke(app, ["run", str(plan), "--task", CLASSIFY, "--map", "cpu2=cpu", "--steps", "20",
                                 "--micro-batches", "4", "--max-processes", "4", "--out", str(report)])  # fmt: skip
    assert result.exit_code == 0, result.output
    measured = json.loads(report.read_text())
    reference, _ = task_losses(CLASSIFY, 32 * 4, 20)
    assert len(measured["losses"]) == 20 and measured["losses"][-1] < 0.5 * measured["losses"][0]
    assert max(abs(a - b) for a, b in zip(measured["losses"], reference)) < 1e-5
    assert all(s["data_s"] > 0 for s in measured["stages"])  # inputs at stage 0, labels at stage 1
    assert "data" in result.output and "loss 1.4" in result.output


def _run(args: list[str], env: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "heterps_cli", "run", *args], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip


@pytest.mark.slow  # three runs of two processes: about 40 s
def test_a_job_killed_at_a_random_step_resumes_to_the_losses_and_weights_of_an_uninterrupted_run(tmp_path, data):
    plan = write_plan(tmp_path / "plan.json", TWO_STAGES, 32)
    common = [str(plan), "--task", CLASSIFY, "--map", "cpu2=cpu", "--steps", "120", "--micro-batches", "4",
              "--checkpoint-every", "10", "--json"]  # fmt: skip
    env = {**os.environ}
    whole = _run([*common, "--checkpoint-dir", str(tmp_path / "whole")], env)
    stdout, stderr = whole.communicate(timeout=240)
    assert whole.returncode == 0, stderr[-3000:]
    uninterrupted = json.loads(stdout)

    cut = tmp_path / "cut"
    killed = _run([*common, "--checkpoint-dir", str(cut)], env)
    victim = None
    try:
        deadline = time.monotonic() + 120
        while not (cut / "step-000010" / "complete.json").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(random.Random(0).uniform(0.0, 0.5))  # a step somewhere after the first checkpoint
        workers = [p for p in session_processes(killed.pid) if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()]
        victim = random.Random(1).choice(workers)
        os.kill(victim, signal.SIGKILL)
        _, stderr = killed.communicate(timeout=120)
    finally:
        for pid in session_processes(killed.pid):
            os.kill(pid, signal.SIGKILL)
    assert killed.returncode == 6 and "killed by SIGKILL" in stderr, stderr[-3000:]
    assert f"continue with heterps run {plan}" in " ".join(stderr.split()) and "--resume" in stderr
    done = checkpoint.latest(str(cut), {})
    assert done is not None and 10 <= done[0] < 120

    resumed = _run([*common, "--checkpoint-dir", str(cut), "--resume"], env)
    stdout, stderr = resumed.communicate(timeout=240)
    assert resumed.returncode == 0, stderr[-3000:]
    report = json.loads(stdout)
    assert report["first_step"] == done[0] and len(report["losses"]) == 120 - done[0]
    assert report["losses"] == uninterrupted["losses"][done[0] :]  # step for step
    _same_stage_files(tmp_path / "whole/step-000120", cut / "step-000120", ["stage-0.pt", "stage-1.pt"])


ON_THE_GPU = [
    pytest.param([("gpu", 1, ["0", "1", "2", "3", "4"])], id="one stage"),
    pytest.param([("gpu", 1, ["0", "1", "2"]), ("gpu2", 1, ["3", "4"])], id="two stages"),
]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("stages", ON_THE_GPU)
def test_a_plan_on_a_gpu_trains_as_one_process_and_resumes_to_the_uninterrupted_runs_weights(tmp_path, data, stages):
    """The losses of one process on the CPU, and a resumed run restores the GPU's generator too (its
    saved state once went to the device, which torch refuses). A process per stage, no gradient sum:
    one GPU is enough."""
    plan = write_plan(tmp_path / "plan.json", stages, 32)
    common = [str(plan), "--task", CLASSIFY, "--map", "gpu=cuda", "--map", "gpu2=cuda", "--micro-batches", "4",
              "--checkpoint-every", "4", "--json"]  # fmt: skip

    def run(steps: int, folder: str, *more: str) -> dict:
        done = _run([*common, "--steps", str(steps), "--checkpoint-dir", str(tmp_path / folder), *more], {**os.environ})
        stdout, stderr = done.communicate(timeout=240)
        assert done.returncode == 0, stderr[-3000:]
        return json.loads(stdout)

    whole = run(12, "whole")
    reference, _ = task_losses(CLASSIFY, 32 * 4, 12)
    assert max(abs(a - b) for a, b in zip(whole["losses"], reference)) < 1e-5
    run(8, "cut")
    resumed = run(12, "cut", "--resume")
    assert resumed["first_step"] == 8 and resumed["losses"] == whole["losses"][8:]
    files = [f"stage-{i}.pt" for i in range(len(stages))]
    _same_stage_files(tmp_path / "whole/step-000012", tmp_path / "cut/step-000012", files)


def _same_stage_files(one: Path, other: Path, names: list[str]) -> None:
    """The two checkpoints' stage files hold the same weights and the same optimiser state, to the bit, each
    tensor on the device the uninterrupted run kept it on (a resumed run once kept Adam's step on the GPU)."""
    for name in names:
        a, b = torch.load(one / name), torch.load(other / name)
        assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
        pairs = [
            (key, x, y)
            for k in a["optimizer"]["state"]
            for (key, x), y in zip(a["optimizer"]["state"][k].items(), b["optimizer"]["state"][k].values())
        ]
        assert pairs and all(x.device == y.device for _, x, y in pairs), [(k, x.device, y.device) for k, x, y in pairs]
        assert all(torch.equal(x, y) for _, x, y in pairs)


@pytest.mark.slow  # four runs of three processes: about 40 s
def test_a_tensor_parallel_stage_resumes_from_its_shards_to_the_uninterrupted_runs_weights(tmp_path, data):
    """Stage 0 at tp 2 (its pair of linear layers sharded), Adam: each shard's checkpoint holds its part of
    the weights and moments; resumed, the run goes on as the uninterrupted one, to the bit."""
    from tests.test_tensor_parallel import _tp_plan

    plan = _tp_plan(tmp_path, "plan", [("cpu", 1, ["0", "1", "2"]), ("cpu", 1, ["3", "4"])], [2, 1], batch=32)
    common = [str(plan), "--task", CLASSIFY, "--micro-batches", "4", "--max-processes", "3", "--checkpoint-every",
              "3", "--json"]  # fmt: skip
    env = {**os.environ}

    def trained(*extra: str) -> dict:
        done = _run([*common, *extra], env)
        stdout, stderr = done.communicate(timeout=240)
        assert done.returncode == 0, stderr[-3000:]
        return json.loads(stdout)

    whole = trained("--steps", "8", "--checkpoint-dir", str(tmp_path / "whole"))
    reference, _ = task_losses(CLASSIFY, 32 * 4, 8)
    assert max(abs(a - b) for a, b in zip(whole["losses"], reference)) < 1e-5
    cut = tmp_path / "cut"
    trained("--steps", "4", "--checkpoint-dir", str(cut))
    shards = ["stage-0-shard-0.pt", "stage-0-shard-1.pt", "stage-1.pt"]
    assert sorted(p.name for p in (cut / "step-000003").glob("stage-*")) == shards
    resumed = trained("--steps", "8", "--checkpoint-dir", str(cut), "--resume")
    assert resumed["first_step"] == 4 and resumed["losses"] == whole["losses"][4:]
    _same_stage_files(tmp_path / "whole/step-000008", cut / "step-000008", shards)
    shard = torch.load(cut / "step-000008" / "stage-0-shard-0.pt")["model"]
    assert shard["0.weight"].shape == (128, 32) and shard["2.weight"].shape == (256, 128)  # halves of 256
    damaged = cut / "step-000008" / "stage-0-shard-1.pt"
    damaged.write_bytes(bytes(damaged.stat().st_size))  # its size, not its bytes: read, and refused there
    broken = _run([*common, "--steps", "9", "--checkpoint-dir", str(cut), "--resume"], env)
    _, stderr = broken.communicate(timeout=240)
    said = " ".join(stderr.split())
    assert broken.returncode == 2 and "shard 2 of 2" in said and "stage-0-shard-1.pt: not a checkpoint file" in said


@pytest.mark.slow  # the guide end to end: a profile, a plan, three trainings: about 90 s
def test_the_training_guide_runs_in_order(tmp_path, monkeypatch):
    """docs/guide/training.md's commands as written, in order, from a folder holding the guide's files."""
    import shlex

    commands = guide_commands("docs/guide/training.md", ["docs/guide/classify.py"], tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CLASSIFY_DATA", str(tmp_path / "data"))
    outputs = []
    for command in commands[:-1]:
        result = runner.invoke(app, shlex.split(command)[1:])
        assert result.exit_code == 0, f"{command}\n{result.output}"
        outputs.append(result.output)
    assert (tmp_path / "ck/step-000400/complete.json").is_file()
    assert "resumed after step 200" in outputs[4] and "at step 400" in outputs[4]
    script = (tmp_path / "launch/node-0.sh").read_text()
    assert f"--task {tmp_path}/docs/guide/classify.py:task" in script and f"--checkpoint-dir {tmp_path}/ck" in script
    assert commands[-1] == "sh launch/node-0.sh"  # the launch scripts resume what run --task wrote
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ.get('PATH', '')}"}
    code, stdout, stderr = run_in_session(["sh", "launch/node-0.sh"], env=env, cwd=tmp_path)
    assert code == 0, stderr[-3000:]
    assert "resumed after step 400" in stdout and "at step 600" in stdout
    assert sorted(p.name for p in (tmp_path / "ck").glob("step-*")) == ["step-000500", "step-000600"]
