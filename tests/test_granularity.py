"""Residual and branching models: where a model is a chain, `--granularity blocks`, and `heterps run`
splitting at the modules a plan names."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from heterps_cli.cli.app import app
from heterps_cli.errors import InputError
from heterps_cli.formats import load_profile
from heterps_cli.profiling import models
from heterps_cli.profiling.granularity import blocks, breaks, chain_note, record_calls, use_layers
from heterps_cli.profiling.measure import load_model
from heterps_cli.profiling.models import Model, layers_of
from heterps_cli.runtime.chain import trace_chain
from tests.helpers import layers_over_step


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        return x + self.b(torch.relu(self.a(x)))


def _model(module: nn.Module) -> Model:
    return Model("toy", module, (torch.randn(3, 4),))


def test_a_residual_block_breaks_the_chain_of_leaves_and_is_one_block():
    model = _model(nn.Sequential(nn.Linear(4, 4), Residual(), nn.ReLU(), nn.Linear(4, 2)))
    recorded = record_calls(model)
    leaves = layers_of(model)
    # '1.b' takes relu(a(x)) (functional, no module), '2' takes x + b(...): neither is the layer before's output
    assert [name for name, _ in breaks(recorded, leaves)] == ["1.b", "2"]
    assert list(blocks(model, recorded).values()) == ["0", "1", "2", "3"]
    note = chain_note(model)
    assert note is not None and "inside 1 (Residual)" in note and "--granularity blocks (4 blocks" in note


def test_a_plain_sequential_is_a_chain_of_its_leaves():
    model = _model(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 8), nn.Tanh())))
    assert chain_note(model) is None
    assert list(blocks(model).values()) == ["0", "1", "2.0", "2.1"]


def test_a_shared_module_or_a_model_of_two_inputs_is_no_chain():
    relu = nn.ReLU()
    shared = _model(nn.Sequential(nn.Linear(4, 4), relu, nn.Linear(4, 4), relu))
    assert any("called more than once" in why for _, why in breaks(record_calls(shared), layers_of(shared)))
    with pytest.raises(InputError, match="several inputs"):
        load_model("ctr", 4, granularity="blocks")


def test_the_zoo_resnet_is_a_chain_of_its_blocks():
    model = load_model("resnet", 4, granularity="blocks")
    chain = trace_chain(model)
    assert chain.names == ["0", "1", "2", "3.0", "3.1", "4.0", "4.1", "5.0", "5.1", "6.0", "6.1", "7", "8", "9"]
    with pytest.raises(InputError, match="not a chain of its layers"):
        trace_chain(load_model("resnet", 4))


def test_run_splits_at_the_modules_the_plan_names():
    """The plan's layer names pick the modules; the stages they make compute what the whole model does."""
    names = ["0", "1", "2", "3.0", "3.1", "4.0", "4.1", "5.0", "5.1", "6.0", "6.1", "7", "8", "9"]
    loaded = load_model("resnet", 4)
    chain = trace_chain(use_layers(loaded, names))
    assert chain.names == names
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        whole = loaded.module.eval()(x)
        staged = chain.stage(names[7:]).eval()(chain.stage(names[:7]).eval()(x))
    assert torch.allclose(staged, whole)


@pytest.mark.slow  # an end-to-end run of several seconds: .ci/run runs it
def test_profiling_resnet_warns_by_layers_and_chains_by_blocks(runner, tmp_path):
    """The leaf profile says which blocks break the chain; the block profile is a chain of the blocks."""
    leaves, by_blocks = tmp_path / "leaves.yaml", tmp_path / "blocks.yaml"
    args = ["resnet", "--as", "cpu", "--batch-size", "8", "--link-gbps", "10"]
    result = runner.invoke(app, ["profile", *args, "--out", str(leaves)])
    assert result.exit_code == 0, result.output
    text = leaves.read_text()
    assert "the layers are not a chain" in text and "inside 3.0 (BasicBlock)" in text
    assert "--granularity blocks (14 blocks" in text
    result = runner.invoke(app, ["profile", *args, "--granularity", "blocks", "--out", str(by_blocks)])
    assert result.exit_code == 0, result.output
    profile, _ = load_profile(str(by_blocks))
    assert [layer.name for layer in profile.layers][3:5] == ["3.0", "3.1"]
    assert "not a chain" not in by_blocks.read_text()


@pytest.mark.slow  # an end-to-end run of several seconds: .ci/run runs it
def test_the_blocks_oct_add_up_to_a_whole_step():
    """Within the profiler's usual tolerance (its view warns beyond 25%), as for a plain chain."""
    model = load_model("resnet", 16, granularity="blocks")
    assert len(models.trace(model)) == 14
    ratios = layers_over_step(model)
    assert 0.75 <= ratios[-1] <= 1.25, ratios
