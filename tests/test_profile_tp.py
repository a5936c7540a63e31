"""`heterps profile --tp`: each layer measured as one shard of a replica of `d` processes runs it."""

from __future__ import annotations

import os

import pytest

from heterps_cli.cli.app import app
from heterps_cli.loading import load_profile
from tests.helpers import plan_and_check, runner

FACTORY = """
import torch
from torch import nn

class Block(nn.Module):
    def __init__(self, h=64):
        super().__init__()
        self.norm = nn.LayerNorm(h)
        self.mlp = nn.Sequential(nn.Linear(h, 4 * h), nn.GELU(), nn.Linear(4 * h, h))

    def forward(self, x):
        return x + self.mlp(self.norm(x))

def model(batch_size=16):
    return nn.Sequential(nn.Linear(32, 64), Block(), Block(), nn.Linear(64, 8)), torch.randn(batch_size, 32)
"""
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@pytest.mark.slow  # three processes of several seconds: .ci/run runs it
@pytest.mark.skipif(CORES < 2, reason="tp 2 runs one process per core: needs two")
def test_blocks_are_timed_as_two_shards_and_the_rest_as_at_one_and_the_profile_plans(tmp_path):
    """A block's MLP is a pair (Linear(64, 256), GELU, Linear(256, 64)): at tp 2 one unit holds half of the
    first's weight and bias and half of the second's weight, the second's bias and the norm whole. The
    first and last layers have no pair: their entries at 2 are those at 1."""
    models, out = tmp_path / "models.py", tmp_path / "tp.yaml"
    models.write_text(FACTORY)
    args = [f"{models}:model", "--as", "cpu", "--batch-size", "16", "--out", str(out), "--link-gbps", "10"]
    result = runner.invoke(app, ["profile", *args, "--tp", "2"])
    assert result.exit_code == 0, result.output
    prof, _ = load_profile(str(out))
    first, block, _, last = prof.layers
    unit = (64 * 256 + 256) // 2 * 4 + (256 * 64) // 2 * 4 + 64 * 4 + 2 * 64 * 4
    assert block.tp is not None and block.tp[2].weight_size == unit and block.weight_size == 2 * unit - 64 * 4 - 512
    shard = block.times["cpu"].tp[2]
    assert shard.oct > 0 and shard.forward is not None and 0 < shard.forward < shard.oct
    for whole in (first, last):
        at_one, at_two = whole.times["cpu"], whole.times["cpu"].tp[2]
        assert [at_two.oct, at_two.odt, at_two.forward, at_two.update] == [
            at_one.oct,
            at_one.odt,
            at_one.forward,
            at_one.update,
        ]
    assert "tp 2: one unit of a replica" in out.read_text()
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("cluster: one\nresources:\n  cpu: {price: 0.04, limit: 4}\n")
    assert plan_and_check(str(out), str(cluster), tmp_path / "plan.yaml", "--samples", "1e5")["stages"]


def test_a_degree_above_the_units_here_is_refused_before_anything_runs(tmp_path):
    out = tmp_path / "p.yaml"
    result = runner.invoke(
        app, ["profile", "mlp", "--as", "cpu", "--batch-size", "8", "--out", str(out), "--tp", str(2 * CORES)]
    )
    assert result.exit_code == 2
    assert "--tp" in result.output and "one process per unit" in result.output and "Traceback" not in result.output
    assert not out.exists()
