"""`heterps profile --precision`: a measured profile timed as training at that precision runs."""

from __future__ import annotations

import torch
from torch import nn

from heterps_cli.cli.app import app
from heterps_cli.loading import load_profile
from heterps_cli.profiling.precision import training_at
from tests.helpers import plan_and_check, runner

FACTORY = """
import torch
from torch import nn

def small(batch_size=32):
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 8))
    return model, torch.randn(batch_size, 64)
"""


def test_a_bf16_profile_keeps_half_the_bytes_says_its_precision_and_plans_with_it(tmp_path):
    """Under bf16 autocast Linear(64, 256) keeps its input cast to bf16 (64 x 2 bytes a sample) and ReLU
    its bf16 output (256 x 2): half what they keep at fp32. The file and the plan say bf16."""
    models = tmp_path / "models.py"
    models.write_text(FACTORY)
    out = tmp_path / "bf16.yaml"
    args = [f"{models}:small", "--as", "cpu", "--batch-size", "64", "--out", str(out), "--link-gbps", "10"]
    result = runner.invoke(app, ["profile", *args, "--precision", "bf16"])
    assert result.exit_code == 0, result.output
    prof, _ = load_profile(str(out))
    assert prof.precision == "bf16"
    assert prof.layers[0].activation_size == 64 * 2 and prof.layers[1].activation_size == 256 * 2
    assert "every forward timed under bf16 autocast" in out.read_text()
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("cluster: one\nresources:\n  cpu: {price: 0.04, limit: 4}\n")
    planned = plan_and_check(str(out), str(cluster), tmp_path / "plan.yaml", "--samples", "1e5")
    assert planned["precision"] == "bf16"


def test_tf32_on_the_cpu_is_refused_before_anything_is_measured(tmp_path):
    result = runner.invoke(
        app,
        ["profile", "mlp", "--as", "cpu", "--batch-size", "8", "--out", str(tmp_path / "p.yaml")]
        + ["--precision", "tf32"],
    )
    assert result.exit_code == 2
    assert "--precision" in result.output and "tf32" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "p.yaml").exists()


def test_training_at_runs_every_forward_in_half_and_leaves_the_modules_as_they_were():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    x = torch.randn(3, 8)
    with training_at("bf16", "cpu", [model, *model]):
        assert model(x).dtype == torch.bfloat16 and model[0](x).dtype == torch.bfloat16  # nested and alone
        model(x).float().sum().backward()
    assert model[0].weight.grad is not None and model[0].weight.grad.dtype == torch.float32
    assert model(x).dtype == torch.float32 and not torch.is_autocast_enabled("cpu")
    assert all("forward" not in m.__dict__ for m in [model, *model])
