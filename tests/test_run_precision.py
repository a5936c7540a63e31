"""The plan's precision in the run (docs/spec.md section 4b): a bf16 or fp16 plan trains under autocast as
PyTorch's own mixed precision trains one process (fp16 with torch.amp.GradScaler, its skipped steps
included), the report says which, and a precision a device does not have is refused before any process
starts. Known answers come from one process (runtime.task_losses with torch's autocast and scaler)."""

from __future__ import annotations

import json
import textwrap

import pytest

from heterps_cli.cli.app import app
from heterps_cli.runtime import task_losses
from tests.helpers import ROOT, heterps, runner, write_plan

TIED = f"{ROOT / 'docs/guide/tiedgpt.py'}:task"
B, M = 8, 2


def _plan(tmp_path, precision: str):
    plan = write_plan(tmp_path / "plan.json", [("cpu", 2, ["0", "1"]), ("cpu2", 1, ["2", "3"])], B, model="m")
    doc = json.loads(plan.read_text())
    doc["precision"] = precision
    plan.write_text(json.dumps(doc))
    return plan


def _run(plan, task: str, steps: int) -> dict:
    result = heterps("run", str(plan), "--task", task, "--map", "cpu2=cpu", "--micro-batches", str(M),
                     "--max-processes", "4", "--steps", str(steps), "--json", timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def _worst(measured: list[float], reference: list[float]) -> float:
    assert len(measured) == len(reference)
    return max(abs(a - b) / abs(b) for a, b in zip(measured, reference))


@pytest.mark.slow  # a run of three processes
def test_a_bf16_plan_trains_under_autocast_as_one_process_does(tmp_path):
    """Within bf16's own rounding (its unit roundoff is 2^-9; two replicas sum their shares' gradients
    in another order than one process), and not at fp32 (the losses move off fp32's)."""
    report = _run(_plan(tmp_path, "bf16"), TIED, 6)
    reference, _ = task_losses(TIED, B * M, 6, precision="bf16")
    fp32, _ = task_losses(TIED, B * M, 6)
    assert report["precision"] == "bf16"
    assert _worst(report["losses"], reference) < 2**-9
    assert _worst(report["losses"], fp32) > 1e-5


@pytest.mark.slow  # a run of three processes
def test_an_fp16_plan_scales_its_loss_and_skips_the_steps_torchs_scaler_skips(tmp_path):
    """A loss large enough that the first scales overflow fp16's gradients: the run skips the steps
    GradScaler skips in one process, halving its scale each time, and then trains as it does."""
    path = tmp_path / "loud.py"
    path.write_text(
        textwrap.dedent(f"""
        import dataclasses, sys
        sys.path.insert(0, {str(ROOT / "docs/guide")!r})
        import tiedgpt

        def task():
            base = tiedgpt.task()
            return dataclasses.replace(base, loss=lambda out, target: 4000.0 * base.loss(out, target))
        """)
    )
    task = f"{path}:task"
    report = _run(_plan(tmp_path, "fp16"), task, 6)
    reference, _ = task_losses(task, B * M, 6, precision="fp16")
    assert report["precision"] == "fp16" and report["skipped_steps"] > 0
    assert _worst(report["losses"], reference) < 5e-5


def test_a_tf32_plan_on_cpus_is_refused_before_any_process_starts(tmp_path):
    result = runner.invoke(app, ["run", str(_plan(tmp_path, "tf32")), "--task", TIED, "--map", "cpu2=cpu",
                                 "--steps", "1"])  # fmt: skip
    said = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert "plan.json" in said and "precision" in said and "no TF32" in said and "type cpu" in said
    launched = runner.invoke(app, ["launch", str(tmp_path / "plan.json"), "-o", str(tmp_path / "launch"), "--task",
                                   TIED, "--map", "cpu2=cpu"])  # fmt: skip
    assert launched.exit_code == 2 and "no TF32" in " ".join(launched.output.split()), launched.output
    assert not (tmp_path / "launch").exists()
