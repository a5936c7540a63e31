"""Recurrent layers in estimates (heterps_cli.profiling.recurrent): priced by their own formulas, with the
shapes the real modules give; operators with no FLOP formula named, never silently free."""

from __future__ import annotations

import pytest
import torch
import yaml
from torch import nn

from heterps_cli.profiling.counting import Recorder
from heterps_cli.profiling.recurrent import ELEMENTWISE, GATES, priced_recurrent
from tests.helpers import heterps

CASES = [
    (nn.LSTM, {"num_layers": 2, "batch_first": True}),
    (nn.LSTM, {"bidirectional": True, "proj_size": 8}),
    (nn.GRU, {"num_layers": 3, "batch_first": True, "bidirectional": True}),
    (nn.RNN, {"nonlinearity": "relu"}),
]


def _shapes(out) -> list:
    flat = [out[0], *(out[1] if isinstance(out[1], tuple) else (out[1],))]
    return [tuple(t.shape) for t in flat]


@pytest.mark.parametrize(("kind", "options"), CASES)
@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("with_state", [False, True])
def test_the_stand_in_gives_the_shapes_the_module_gives(kind, options, batched, with_state):
    module = kind(12, 16, **options)
    steps, samples = 5, 3
    x = torch.randn(samples, steps, 12) if options.get("batch_first") else torch.randn(steps, samples, 12)
    if not batched:
        x = x[0] if options.get("batch_first") else x[:, 0]
    hx = None
    if with_state:
        real = module(x)
        hx = tuple(torch.zeros_like(t) for t in real[1]) if isinstance(real[1], tuple) else torch.zeros_like(real[1])
    expected = _shapes(module(x, hx))
    with priced_recurrent(module):
        got = module(x.requires_grad_(), hx)
    assert _shapes(got) == expected


def _formula(module: nn.RNNBase, steps: int, samples: int) -> float:
    """FLOPs of a forward and its backward, by hand: every layer and direction's two products a step (the
    input's, the state's) and their element-wise work, the backward's products twice."""
    G, H = GATES[module.mode], module.hidden_size
    state = module.proj_size or H
    total = 0.0
    for layer in range(module.num_layers):
        inputs = module.input_size if layer == 0 else H * (2 if module.bidirectional else 1)
        if module.proj_size and layer > 0:
            inputs = module.proj_size * (2 if module.bidirectional else 1)
        for _ in range(2 if module.bidirectional else 1):
            products = 2 * steps * samples * G * H * (inputs + state)
            products += 2 * steps * samples * H * state if module.proj_size else 0
            total += 3 * products + 3 * ELEMENTWISE[module.mode] * steps * samples * H
    return float(total)


@pytest.mark.parametrize(("kind", "options"), CASES)
def test_a_recurrent_layer_is_priced_by_its_formula(kind, options):
    module = kind(12, 16, **options)
    steps, samples = 7, 4
    x = torch.randn(samples, steps, 12) if options.get("batch_first") else torch.randn(steps, samples, 12)
    recorder = Recorder()
    with recorder, priced_recurrent(module):
        module(x.requires_grad_())[0].sum().backward()
    assert sum(op.flops for op in recorder.ops) == pytest.approx(_formula(module, steps, samples), rel=1e-9)
    assert not any(op.unpriced for op in recorder.ops)
    layers = module.num_layers * (2 if module.bidirectional else 1)
    assert sum(op.name.endswith("_step") for op in recorder.ops) == steps * layers  # a kernel per step


LSTM_LM = """
import torch
from torch import nn

class Recurrent(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(512, 512, num_layers=2, batch_first=True)

    def forward(self, x):
        return self.lstm(x)[0]

def model(batch_size=64):
    net = nn.Sequential(nn.Embedding(1000, 512), Recurrent(), nn.Linear(512, 1000))
    return net, torch.randint(0, 1000, (batch_size, 32)), list(net)
"""


@pytest.mark.slow  # over a second here: the slow suite, which CI runs too
def test_an_lstm_language_model_is_priced_from_its_flops_differently_on_two_gpus(tmp_path):
    path = tmp_path / "lstm_lm.py"
    path.write_text(LSTM_LM)
    times = {}
    for device in ("a100-40gb", "v100-16gb"):
        out = tmp_path / f"{device}.yaml"
        result = heterps("profile", "estimate", f"{path}:model", device, "--as", device, "--batch-size", "64",
                         "--out", str(out))  # fmt: skip
        assert result.returncode == 0, result.stderr
        layer = yaml.safe_load(out.read_text())["layers"][1]
        times[device] = layer["times"][device]["oct"]
        assert "0 flops" not in out.read_text().splitlines()[-8:][2]
    assert times["v100-16gb"] > 1.3 * times["a100-40gb"]  # its products and its weights' reads, not a floor


@pytest.mark.slow  # over a second here: the slow suite, which CI runs too
def test_an_operator_with_no_flop_formula_is_named(tmp_path):
    path = tmp_path / "spectral.py"
    path.write_text(
        "import torch\nfrom torch import nn\n"
        "class Spectral(nn.Module):\n    def forward(self, x):\n        return torch.fft.rfft(x, dim=-1).abs()\n"
        "def model(batch_size=8):\n    return nn.Sequential(nn.Linear(64, 64), Spectral(), nn.Linear(33, 8)), "
        "torch.randn(batch_size, 64)\n"
    )
    out = tmp_path / "p.yaml"
    result = heterps("profile", "estimate", f"{path}:model", "a100-40gb", "--as", "a100-40gb", "--batch-size", "8",
                     "--out", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr
    said = " ".join(result.stdout.split())
    assert "layer 1: _fft_r2c x1" in said and "no FLOP formula" in said and "measure the layer" in said
    assert "no FLOP formula for _fft_r2c" in out.read_text()


@pytest.mark.parametrize(("kind", "options"), CASES)
def test_a_stacked_recurrent_module_as_one_module_per_layer_computes_the_same(kind, options):
    from heterps_cli import one_layer_each

    stacked = kind(12, 16, **options).eval()
    x = torch.randn(3, 5, 12)
    y = x
    layers = one_layer_each(stacked)
    assert len(layers) == stacked.num_layers
    for layer in layers:
        y = layer.eval()(y)
    assert torch.allclose(y, stacked(x)[0], atol=1e-6)


SPLIT_LSTM = """
import torch
from torch import nn
from heterps_cli import one_layer_each

def model(batch_size=8):
    net = nn.Sequential(nn.Linear(6, 16), *one_layer_each(nn.LSTM(16, 16, num_layers=3, batch_first=True)),
                        nn.Linear(16, 2))
    return net, torch.randn(batch_size, 10, 6)
"""


@pytest.mark.slow  # over a second here: the slow suite, which CI runs too
def test_a_plan_can_cut_between_the_layers_of_a_stacked_lstm(tmp_path):
    path = tmp_path / "split.py"
    path.write_text(SPLIT_LSTM)
    out = tmp_path / "p.yaml"
    result = heterps("profile", "estimate", f"{path}:model", "cpu", "--as", "cpu", "--batch-size", "8",
                     "--out", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr
    profile = yaml.safe_load(out.read_text())
    kinds = [layer["type"] for layer in profile["layers"]]
    assert profile["chain"] is True and kinds == ["fc", "onelayer", "onelayer", "onelayer", "fc"]
