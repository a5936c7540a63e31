"""Issue 32's adversarial cases: each ends with its documented exit code, one paragraph, nothing lost."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from heterps_cli.cli.app import app

ROOT = Path(__file__).resolve().parents[1]
CTR, PAPER = str(ROOT / "profiles/ctr.yaml"), str(ROOT / "clusters/paper.yaml")
PLAN = str(ROOT / "docs/plans/ctr.yaml")
runner = CliRunner()


@pytest.mark.parametrize("fmt", ["table", "json", "markdown"])
def test_a_gate_whose_replan_was_interrupted_does_not_pass(interrupt_evaluations, fmt):
    # SIGINT after 5 s of `check --replan rl` once gave exit 0 and "all checks passed".
    interrupt_evaluations(4)
    result = runner.invoke(
        app, ["check", PLAN, "--profile", CTR, "--cluster", PAPER, "--replan", "rl", "--format", fmt]
    )
    assert result.exit_code == 130, result.output
    assert "all checks passed" not in result.stdout
    assert "interrupted" in result.stderr and "did not pass" in result.stderr
    if fmt == "json":
        assert json.loads(result.stdout)["passed"] is False
