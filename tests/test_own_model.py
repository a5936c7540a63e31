"""docs/guide/own-model.md: a model with residual blocks, never seen by heterps, goes from its file to a
plan to training in one pass of the page's commands, and no plan of it fails only at `run`."""

from __future__ import annotations

import shlex

import pytest
import yaml

from heterps_cli.cli.app import app
from tests.helpers import guide_commands, runner


@pytest.mark.slow  # a profile in two processes, a plan, a run: about 60 s
def test_the_own_model_guide_runs_in_order(tmp_path, monkeypatch):
    commands = guide_commands("docs/guide/own-model.md", ["docs/guide/vit.py"], tmp_path)
    monkeypatch.chdir(tmp_path)
    outputs = []
    for command in commands:
        result = runner.invoke(app, shlex.split(command)[1:])
        assert result.exit_code == 0, f"{command}\n{result.output}"
        outputs.append(" ".join(result.output.split()))
    profile = yaml.safe_load((tmp_path / "vit.yaml").read_text())
    names = [layer["name"] for layer in profile["layers"]]
    assert profile["chain"] is True and names == ["patches", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "head"]
    assert "profiled at the 6 blocks that are" in outputs[0] and "machine: " in outputs[0]
    assert "loss" in outputs[4] and (tmp_path / "launch/launch.sbatch").is_file()
    # the leaves, asked for, make no plan: every plan command refuses them before run could
    leaves = ["profile", "estimate", "docs/guide/vit.py:model", "h100", "--as", "cpu", "--batch-size", "32"]
    assert runner.invoke(app, [*leaves, "--granularity", "layers", "--out", "leaves.yaml"]).exit_code == 0
    refused = runner.invoke(app, ["plan", "leaves.yaml", "clusters/workstation.yaml", "--samples", "2048"])
    assert refused.exit_code == 2 and "chain: the layers are not a chain" in " ".join(refused.output.split())
