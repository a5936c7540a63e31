"""Residual and branching models: where a model is a chain, `--granularity blocks`, and `heterps run`
splitting at the modules a plan names."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from heterps_cli.cli.app import app
from heterps_cli.errors import InputError
from heterps_cli.loading import load_profile
from heterps_cli.profiling import models
from heterps_cli.profiling.granularity import blocks, breaks, record_calls, settle, use_layers
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
    module = nn.Sequential(nn.Linear(4, 4), Residual(), nn.ReLU(), nn.Linear(4, 2))
    recorded = record_calls(_model(module))
    leaves = layers_of(_model(module))
    # '1.b' takes relu(a(x)) (functional, no module), '2' takes x + b(...): neither is the layer before's output
    assert [name for name, _ in breaks(recorded, leaves)] == ["1.b", "2"]
    assert list(blocks(_model(module), recorded).values()) == ["0", "1", "2", "3"]
    by_leaves = settle(_model(module), "layers")
    assert by_leaves.chain is False and by_leaves.blocks is None
    assert "inside 1 (Residual)" in by_leaves.notes[0] and "--granularity blocks (4 blocks" in by_leaves.notes[0]
    auto = settle(_model(module), "auto")  # the default: the blocks, since the leaves are no chain
    assert auto.chain is True and list(layers_of(auto).values()) == ["0", "1", "2", "3"]
    assert "profiled at the 4 blocks that are" in auto.notes[0]


def test_a_plain_sequential_is_a_chain_of_its_leaves():
    module = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 8), nn.Tanh()))
    model = settle(_model(module), "auto")
    assert model.chain is True and model.blocks is None and model.notes == []
    assert list(blocks(model).values()) == ["0", "1", "2.0", "2.1"]


def test_a_model_no_split_of_which_chains_is_profiled_whole():
    """Code between its only modules: auto profiles it as one layer, which a plan can replicate."""

    class Tangled(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x):
            return self.b(self.a(x) * 2)

    model = settle(_model(Tangled()), "auto")
    assert model.chain is True and list(layers_of(model).values()) == ["toy"]
    assert "the whole model as one layer" in model.notes[0]
    # and which of its own code keeps its modules from a chain, with the fix
    assert "layer 'b' takes a tensor computed between layers" in model.notes[0]
    assert "put that code in modules" in model.notes[0]
    with pytest.raises(InputError, match="no blocks that form a chain"):
        settle(_model(Tangled()), "blocks")


def test_a_shared_module_or_a_model_of_two_inputs_is_no_chain():
    relu = nn.ReLU()
    shared = _model(nn.Sequential(nn.Linear(4, 4), relu, nn.Linear(4, 4), relu))
    assert any("called more than once" in why for _, why in breaks(record_calls(shared), layers_of(shared)))
    with pytest.raises(InputError, match="several inputs"):
        load_model("ctr", 4, granularity="blocks")
    with pytest.raises(InputError, match="is a chain at no granularity.*--granularity layers"):
        load_model("ctr", 4, granularity="auto")
    assert load_model("ctr", 4, granularity="layers").chain is False


def test_the_zoo_resnet_is_a_chain_of_its_blocks():
    model = load_model("resnet", 4, granularity="blocks")
    chain = trace_chain(model)
    assert chain.names == ["0", "1", "2", "3.0", "3.1", "4.0", "4.1", "5.0", "5.1", "6.0", "6.1", "7", "8", "9"]
    with pytest.raises(InputError, match="not a chain of the plan's layers"):
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
def test_profiling_resnet_takes_its_blocks_and_a_profile_of_its_leaves_makes_no_plan(runner, tmp_path):
    """By default the profile is of the blocks that chain; a profile of the leaves says chain: false, says
    which blocks break the chain, and plan and validate refuse it, so no plan cuts where run cannot."""
    leaves, by_blocks = tmp_path / "leaves.yaml", tmp_path / "blocks.yaml"
    args = ["resnet", "--as", "cpu", "--batch-size", "8", "--link-gbps", "10"]
    result = runner.invoke(app, ["profile", *args, "--out", str(by_blocks)])
    assert result.exit_code == 0, result.output
    profile, _ = load_profile(str(by_blocks))
    assert profile.chain is True and [layer.name for layer in profile.layers][3:5] == ["3.0", "3.1"]
    assert "profiled at the 14 blocks that are" in " ".join(result.output.split())
    result = runner.invoke(app, ["profile", *args, "--granularity", "layers", "--out", str(leaves)])
    assert result.exit_code == 0, result.output
    text = leaves.read_text()
    assert "the layers are not a chain" in text and "inside 3.0 (BasicBlock)" in text
    assert "--granularity blocks (14 blocks" in text and "\nchain: false\n" in text
    line = text.splitlines().index("chain: false") + 1
    cluster = tmp_path / "c.yaml"
    cluster.write_text("cluster: c\nresources:\n  cpu: {price: 1, limit: 4}\n")
    for command in (["plan", str(leaves), str(cluster), "--samples", "100"], ["validate", str(leaves)]):
        result = runner.invoke(app, command)
        assert result.exit_code == 2 and f"leaves.yaml:{line}: chain: the layers are not a chain" in result.output


@pytest.mark.slow  # an end-to-end run of several seconds: .ci/run runs it
def test_the_blocks_oct_add_up_to_a_whole_step():
    """Within the profiler's usual tolerance (its view warns beyond 25%), as for a plain chain."""
    model = load_model("resnet", 16, granularity="blocks")
    assert len(models.trace(model)) == 14
    ratios = layers_over_step(model)
    assert 0.75 <= ratios[-1] <= 1.25, ratios


def test_launch_refuses_a_plan_that_cuts_where_run_cannot_before_writing_a_file(runner, tmp_path):
    """A plan of a profile from before profiles said chain (or a hand-made one): launch traces the model as
    every node's run would, and refuses the cut inside a residual block, naming the fix."""
    from tests.helpers import write_plan

    leaves = list(layers_of(load_model("resnet", 4)).values())
    plan = write_plan(tmp_path / "plan.json", [("cpu", 1, leaves[:10]), ("cpu", 1, leaves[10:])], model="resnet")
    result = runner.invoke(app, ["launch", str(plan), "-o", str(tmp_path / "out")])
    shown = " ".join(result.output.split())
    assert result.exit_code == 2 and "is not a chain of the plan's layers" in shown and "--granularity auto" in shown
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("first", "second", "merged"), [(True, True, True), (True, None, None), (None, False, False)])
def test_merge_keeps_what_the_profiles_say_of_the_chain(runner, tmp_path, first, second, merged):
    paths = []
    for name, chain in (("a", first), ("b", second)):
        said = "" if chain is None else f"chain: {str(chain).lower()}\n"
        path = tmp_path / f"{name}.yaml"
        path.write_text(
            f"model: m\nbatch_size: 4\n{said}layers:\n  - {{name: l, type: fc, input_size: 4, weight_size: 4,\n"
            f"     times: {{{name}: {{oct: 1.0, odt: 0.0, alpha: 0.9, beta: 0.0}}}}}}\n"
        )
        paths.append(str(path))
    result = runner.invoke(app, ["profile", "merge", *paths, "-o", str(tmp_path / "m.yaml")])
    assert result.exit_code == 0, result.output
    assert load_profile(str(tmp_path / "m.yaml"))[0].chain is merged
