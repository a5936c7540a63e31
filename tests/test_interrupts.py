"""Ctrl-C and SIGTERM: exit 130 or 143 with one line, the best plan found so far where there is one,
and no output file left half-written."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from heterps_cli.cli.app import app
from tests.helpers import ROOT

HOSTILE = Path(__file__).parent / "data" / "hostile"
CTR, PAPER = str(ROOT / "profiles/ctr.yaml"), str(ROOT / "clusters/paper.yaml")


def _run_and_signal(args: list[str], sig: int, after: float, cwd: Path) -> subprocess.CompletedProcess:
    """Run ``python -m heterps_cli ARGS`` and send ``sig`` after ``after`` seconds; the process always ends."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "heterps_cli", *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        time.sleep(after)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
@pytest.mark.parametrize("sig,code,message", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_an_interrupted_run_leaves_the_existing_out_file_untouched(tmp_path, sig, code, message):
    existing = tmp_path / "plan.yaml"
    existing.write_text("the committed plan\n")
    # random search with a budget it cannot finish in time: the signal lands mid-search
    done = _run_and_signal(
        [
            "plan",
            str(ROOT / "profiles/vgg16.yaml"),
            str(ROOT / "clusters/three-type.yaml"),
            "-s",
            "random",
            "--evaluations",
            "100000000",
            "--out",
            "plan.yaml",
        ],
        sig,
        1.5,
        tmp_path,
    )
    assert done.returncode == code, (done.returncode, done.stderr)
    assert existing.read_text() == "the committed plan\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.yaml"], "no temporary file left"
    assert "Traceback" not in done.stderr and done.stderr.strip().splitlines() == [message], done.stderr


def test_ctrl_c_while_loading_is_one_line_and_exit_130(tmp_path):
    done = _run_and_signal(["plan", CTR, PAPER, "-s", "rl"], signal.SIGINT, 0.3, tmp_path)  # mid-import
    assert done.returncode == 130, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_ctrl_c_in_rl_training_prints_and_writes_the_best_plan_then_exits_130(runner, tmp_path, interrupt_evaluations):
    interrupt_evaluations(4)  # the pool, then a few training batches
    # --steps: the default training would stop at once, its pool's best at the proven optimum
    result = runner.invoke(app, ["plan", CTR, PAPER, "--steps", "40", "--out", str(tmp_path / "p.yaml")])
    assert result.exit_code == 130, result.output
    assert "training interrupted (Ctrl-C)" in result.stdout and "cost" in result.stdout
    assert "interrupted: the plan above is the best found before Ctrl-C" in result.stderr
    assert yaml.safe_load((tmp_path / "p.yaml").read_text())["feasible"] is True


def test_ctrl_c_in_compare_marks_the_row_and_exits_130_at_the_end(runner, interrupt_evaluations):
    interrupt_evaluations(4)
    result = runner.invoke(app, ["compare", CTR, PAPER, "--schedulers", "rl,greedy,exact", "--steps", "40"])
    assert result.exit_code == 130, result.output
    assert re.search(r"^ ?rl\* +yes", result.stdout, flags=re.M), result.stdout
    assert "* interrupted (Ctrl-C)" in result.stdout and re.search(r"^ ?exact +yes", result.stdout, flags=re.M)
    assert "Ctrl-C cut rl short" in result.stderr


# -- errors that mislead ----------------------------------------------------------------
