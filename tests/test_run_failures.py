"""heterps run when something goes wrong while it trains: a worker killed, Ctrl-C, a worker that
raises, a worker ending while the launcher looks. Every run is the real command in a subprocess of its
own session, so that the test can send it signals and then prove that none of its processes is left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.helpers import MLP_LAYERS, children, heterps, session_processes, write_plan


def _start(tmp_path: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "heterps_cli", "run", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own session: the test can count its processes, and end them all
        cwd=tmp_path,
    )


def _workers(process: subprocess.Popen, count: int, within: float = 60.0) -> list[int]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        found = [c for c in children(process.pid) if Path(f"/proc/{c}/cmdline").read_bytes().find(b"spawn") >= 0]
        if len(found) >= count:
            time.sleep(3.0)  # past start-up: inside the training loop
            return found
        time.sleep(0.2)
    raise AssertionError(f"{count} workers did not start")


def _ended(process: subprocess.Popen, within: float) -> tuple[int, str]:
    try:
        _, stderr = process.communicate(timeout=within)
    finally:
        # multiprocessing's resource tracker leaves by itself once heterps has gone: a moment's grace.
        deadline = time.monotonic() + 5
        while (leftover := session_processes(process.pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in leftover:  # only this test's own session
            os.kill(pid, signal.SIGKILL)
    assert not leftover, f"processes left behind: {leftover}"
    return process.returncode, stderr


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="counts processes through Linux /proc")
def test_a_killed_worker_ends_the_run_with_its_story(tmp_path):
    plan = write_plan(tmp_path / "plan.json", [("cpu", 1, MLP_LAYERS[:4]), ("cpu", 1, MLP_LAYERS[4:])])
    process = _start(tmp_path, str(plan), "--model", "mlp", "--steps", "100000")
    try:
        victim = _workers(process, 2)[1]
        os.kill(victim, signal.SIGKILL)
        started = time.monotonic()
        code, stderr = _ended(process, within=30)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert code == 6 and time.monotonic() - started < 15  # not 2, which says the input was bad
    assert "killed by SIGKILL" in stderr and "Traceback" not in stderr, stderr
    assert "no --checkpoint-dir was given" in " ".join(stderr.split())


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="counts processes through Linux /proc")
def test_a_worker_killed_after_a_checkpoint_says_the_resume_command_that_continues(tmp_path):
    plan = write_plan(tmp_path / "plan.json", [("cpu", 1, MLP_LAYERS[:4]), ("cpu", 1, MLP_LAYERS[4:])])
    args = [str(plan), "--task", str(tmp_path / "task.py") + ":task", "--steps", "100000", "--checkpoint-dir",
            str(tmp_path / "ck"), "--checkpoint-every", "1"]  # fmt: skip
    (tmp_path / "task.py").write_text(MLP_TASK)
    process = _start(tmp_path, *args)
    try:
        victim = _workers(process, 2)[0]
        deadline = time.monotonic() + 60
        while not any((tmp_path / "ck").glob("step-*/complete.json")) and time.monotonic() < deadline:
            time.sleep(0.2)
        os.kill(victim, signal.SIGKILL)
        code, stderr = _ended(process, within=30)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    said = " ".join(stderr.split())
    assert code == 6 and "killed by SIGKILL" in said, said
    assert "is complete: continue with heterps run" in said and "--checkpoint-every 1 --resume" in said, said


MLP_TASK = """
import torch
from heterps_cli import Task
from heterps_cli.profiling.zoo import mlp

def task():
    data = torch.utils.data.TensorDataset(torch.randn(512, 784), torch.randint(0, 10, (512,)))
    return Task(model=mlp(2)[0], data=data, loss=torch.nn.functional.cross_entropy)
"""


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="counts processes through Linux /proc")
def test_ctrl_c_ends_every_process_with_130(tmp_path):
    plan = write_plan(tmp_path / "plan.json", [("cpu", 1, MLP_LAYERS[:4]), ("cpu", 1, MLP_LAYERS[4:])])
    process = _start(tmp_path, str(plan), "--model", "mlp", "--steps", "100000")
    try:
        _workers(process, 2)
        os.killpg(process.pid, signal.SIGINT)  # as a terminal sends Ctrl-C: to the whole group
        code, stderr = _ended(process, within=30)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert code == 130 and "interrupted" in stderr and "Traceback" not in stderr, stderr


@pytest.mark.slow
def test_a_worker_that_raises_is_named_with_its_error(tmp_path):
    model = tmp_path / "flaky.py"
    model.write_text(
        textwrap.dedent(
            """
            import multiprocessing
            import torch
            from torch import nn

            class Flaky(nn.Module):
                def forward(self, x):
                    if multiprocessing.current_process().name == "heterps-rank1":
                        raise RuntimeError("the second stage broke")
                    return x

            def factory(batch_size):
                return nn.Sequential(nn.Linear(4, 4), Flaky()), torch.randn(batch_size, 4)
            """
        )
    )
    plan = write_plan(tmp_path / "plan.json", [("cpu", 1, ["0"]), ("cpu2", 1, ["1"])], batch_size=8)
    done = heterps("run", str(plan), "--model", f"{model}:factory", "--map", "cpu2=cpu", "--steps", "2", timeout=60)
    assert done.returncode == 2, done.stderr
    assert "worker rank 1 (stage 1, replica 1 of 1, cpu2 on cpu) failed" in done.stderr
    assert "the second stage broke" in done.stderr and "Traceback" not in done.stderr


def test_a_worker_that_ends_while_the_launcher_looks_is_not_taken_for_a_success():
    """A worker's exit code can change between two readings (its sentinel fires a moment before it is
    reaped): the launcher reads each once, so one that failed is kept until seen failing, never dropped."""
    from heterps_cli.runtime.launch import _still_running

    class Ending:
        """A process whose exit code is None at the first reading and ``code`` after it."""

        def __init__(self, code):
            self.code, self.read = code, 0

        @property
        def exitcode(self):
            self.read += 1
            return None if self.read == 1 else self.code

    pending = {0: Ending(1), 1: Ending(1)}
    failed, still = _still_running(pending)
    assert not failed and set(still) == {0, 1}, "both were running when read"
    failed, still = _still_running(still)
    assert failed and still == {}
    done, still = _still_running({0: Ending(0)})
    assert not done and set(still) == {0}
    assert _still_running(still) == (False, {})
