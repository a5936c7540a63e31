"""`heterps profile estimate` for GPUs (issue 49): counted on fake tensors, what a GPU runs (fused
dropout, CUDA autocast's fp32 operators), the precision in the profile and the plan, the loss on the
last layer, and the fallback to real tensors."""

from __future__ import annotations

import dataclasses
import re
import textwrap
from collections import Counter

import pytest
import torch
from torch import nn

from heterps_cli.cli.app import app
from heterps_cli.loading import load_catalogue, load_profile
from heterps_cli.profiling import estimate as est
from heterps_cli.profiling.counting import abstract
from heterps_cli.profiling.models import Call
from tests.helpers import runner


def _cli(args, expect=0):
    result = runner.invoke(app, ["profile", *args])
    assert result.exit_code == expect, result.output
    assert "Traceback" not in result.output
    return result


def _factory(tmp_path, body: str, name: str = "model.py") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def test_a_model_larger_than_this_machine_is_counted_on_fake_tensors(tmp_path):
    """Three 40,000-wide products: 19 GB of fp32 weights, never allocated."""
    spec = _factory(
        tmp_path,
        """
        import torch
        from torch import nn

        def big(batch_size):
            model = nn.Sequential(*(nn.Linear(40_000, 40_000, bias=False) for _ in range(3)))
            return model, torch.randn(batch_size, 40_000)
        """,
    )
    out = tmp_path / "big.yaml"
    _cli(["estimate", f"{spec}:big", "h100", "--as", "h100", "--batch-size", "8", "--out", str(out)])
    profile, _ = load_profile(str(out))
    assert [layer.weight_size for layer in profile.layers] == [40_000**2 * 4] * 3
    assert "real tensors" not in out.read_text()
    # the forward's product, the backward's weight gradient (and the input's, after the first layer)
    counted = [float(m) for m in re.findall(r"estimated: on h100, ([0-9.e+]+) flops", out.read_text())]
    assert counted == pytest.approx([2 * 2 * 8 * 40_000**2, 3 * 2 * 8 * 40_000**2, 3 * 2 * 8 * 40_000**2], rel=1e-3)


def test_a_model_that_reads_its_values_is_counted_on_real_tensors_and_says_so(tmp_path):
    spec = _factory(
        tmp_path,
        """
        import torch
        from torch import nn

        class Reads(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(8, 8)

            def forward(self, x):
                return self.fc(x) * float(x.abs().max().item() > 0)

        def reads(batch_size):
            return nn.Sequential(Reads(), nn.Linear(8, 2)), torch.randn(batch_size, 8)
        """,
    )
    out = tmp_path / "reads.yaml"
    _cli(["estimate", f"{spec}:reads", "a100-80gb", "--as", "a", "--batch-size", "4", "--out", str(out)])
    assert "counted on real tensors here: the model does not run on fake tensors" in out.read_text()
    load_profile(str(out))


def test_a_factory_file_with_a_dataclass_loads(tmp_path):
    """A dataclass looks its module up in sys.modules: the file is registered there as an import would."""
    spec = _factory(
        tmp_path,
        """
        from __future__ import annotations
        from dataclasses import dataclass
        import torch
        from torch import nn

        @dataclass(frozen=True)
        class Shape:
            width: int = 16

        def shaped(batch_size):
            s = Shape()
            return nn.Sequential(nn.Linear(s.width, s.width), nn.ReLU()), torch.randn(batch_size, s.width)
        """,
    )
    _cli(["estimate", f"{spec}:shaped", "t4", "--as", "t4", "--batch-size", "4", "--out", str(tmp_path / "s.yaml")])


def _ops(module: nn.Module, shape: tuple[int, ...], precision: str = "fp32", gpu: bool = True) -> Counter:
    with abstract():
        w = est.work(Call("layer", module, (torch.randn(shape),), {}), precision, gpu=gpu)
    return Counter((op.name, op.dtype) for op in w.ops)


def test_dropout_is_the_gpus_one_kernel_on_a_gpu_and_the_cpus_three_on_the_cpu():
    on_gpu = _ops(nn.Dropout(0.1), (4, 256))
    assert on_gpu[("native_dropout", "fp32")] == 1 and on_gpu[("native_dropout_backward", "fp32")] == 1
    assert not any(name == "bernoulli_" for name, _ in on_gpu)
    on_cpu = _ops(nn.Dropout(0.1), (4, 256), gpu=False)
    assert any(name == "bernoulli_" for name, _ in on_cpu) and ("native_dropout", "fp32") not in on_cpu
    with abstract():  # the fused kernel: the input read, the output and a one-byte mask written
        w = est.work(Call("d", nn.Dropout(0.1), (torch.randn(4, 256),), {}))
    assert w.ops[0].name == "native_dropout"
    assert w.ops[0].bytes == 4 * 256 * (4 + 4 + 1)


class _Attention(nn.Module):
    def forward(self, x):
        return (x @ x.transpose(-1, -2)).softmax(-1) @ x


def test_half_precision_runs_products_in_half_and_softmax_in_fp32_as_cudas_autocast_does():
    ops = _ops(_Attention(), (2, 64, 32), "bf16")
    assert ops[("bmm", "bf16")] >= 2  # the products, forward and backward
    assert ("_softmax", "fp32") in ops and ("_softmax", "bf16") not in ops
    assert not any(dtype == "bf16" for (name, dtype) in ops if name == "_softmax")
    fp32 = _ops(_Attention(), (2, 64, 32), "fp32")
    assert ("bmm", "fp32") in fp32 and not any(dtype == "bf16" for _, dtype in fp32)


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
def test_precision_prices_products_at_its_peak_and_the_profile_and_plan_say_it(tmp_path):
    out = {}
    for precision in ("fp32", "tf32", "bf16"):
        out[precision] = tmp_path / f"{precision}.yaml"
        _cli(
            ["estimate", "mlp", "a100-80gb", "--as", "a100", "--batch-size", "65536", "--precision", precision]
            + ["--out", str(out[precision])]
        )
    profiles = {p: load_profile(str(path))[0] for p, path in out.items()}
    assert {p: x.precision for p, x in profiles.items()} == {"fp32": "fp32", "tf32": "tf32", "bf16": "bf16"}
    first = {p: x.layers[0] for p, x in profiles.items()}
    # a 784 x 1024 product of 65,536 samples is compute-bound: TF32's peak is 8x fp32's on an A100
    assert first["tf32"].times["a100"].oct < first["fp32"].times["a100"].oct / 3
    assert first["bf16"].times["a100"].oct < first["tf32"].times["a100"].oct
    # bf16 keeps half-size activations for the backward (autocast's products save their bf16 inputs)
    assert first["bf16"].activation_size < first["fp32"].activation_size
    assert "precision bf16: autocast to bfloat16" in out["bf16"].read_text()
    cluster = tmp_path / "c.yaml"
    cluster.write_text("cluster: c\nresources:\n  a100: {price: 4.0, limit: 4, memory_gb: 80}\n")
    validated = runner.invoke(app, ["validate", str(out["bf16"]), str(cluster)])
    assert validated.exit_code == 0 and "precision: bf16 (what its times assume" in validated.output
    plan = tmp_path / "plan.yaml"
    shown = runner.invoke(app, ["plan", str(out["bf16"]), str(cluster), "--samples", "1e6", "--out", str(plan)])
    assert shown.exit_code == 0 and "bf16: the profile's times assume it" in shown.output, shown.output
    assert "precision: bf16" in plan.read_text()
    args = ["check", str(plan), "--profile", str(out["tf32"]), "--cluster", str(cluster), "--samples", "1e6"]
    checked = runner.invoke(app, args)
    assert checked.exit_code == 1 and "precision 'bf16' in the plan, 'tf32' now" in " ".join(checked.output.split())
    merged = runner.invoke(app, ["profile", "merge", str(out["bf16"]), str(out["tf32"]), "-o", "-"])
    assert merged.exit_code == 2 and "precision" in merged.output


@pytest.mark.parametrize(("loss", "expected"), [("mse", "pow"), ("cross-entropy", "nll_loss_forward"), ("none", None)])
def test_the_last_layer_computes_the_loss(loss, expected):
    """mse is the run's own (runtime.synthetic): a per-sample mean of squared differences, summed."""
    with abstract():
        w = est.work(Call("head", nn.Linear(16, 10), (torch.randn(4, 16),), {}), loss=loss)
    names = {op.name for op in w.ops[: w.ahead]}
    if expected is None:
        assert names == {"addmm"}
    else:
        assert expected in names


class _Summed(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        return self.head(x).sum()


def test_an_output_that_is_already_a_scalar_takes_no_loss():
    """As the measured profile (timing.with_loss): no samples to take a loss over, so none is counted."""
    with abstract():
        w = est.work(Call("head", _Summed(), (torch.randn(4, 16),), {}), loss="mse")
    assert {op.name for op in w.ops[: w.ahead]} == {"addmm", "sum"}


def test_a_bad_efficiency_in_a_catalogue_names_its_field(tmp_path):
    text = est.CATALOGUE.read_text().replace("matmul_efficiency: {tf32: 0.77}", "matmul_efficiency: {tf32: 1.5}", 1)
    bad = tmp_path / "devices.yaml"
    bad.write_text(text)
    result = _cli(
        ["estimate", "mlp", "a100-40gb", "--as", "a", "--catalogue", str(bad), "--batch-size", "4", "--out", "-"],
        expect=2,
    )
    assert "devices.a100-40gb.matmul_efficiency.tf32" in " ".join(result.output.split())


def test_merge_keeps_the_precision_a_profile_states_beside_one_that_states_none(tmp_path):
    """A measured profile says no precision: it merges with an estimated one, which gives its own;
    three profiles of which two state different precisions are refused, naming the second."""
    paths = {}
    for device, precision in (("t4", "fp32"), ("a100-80gb", "tf32"), ("h100", "bf16")):
        paths[device] = tmp_path / f"{device}.yaml"
        _cli(
            ["estimate", "mlp", device, "--as", device, "--batch-size", "8", "--precision", precision]
            + ["--out", str(paths[device])]
        )
    silent = tmp_path / "silent.yaml"
    silent.write_text(paths["t4"].read_text().replace("precision: fp32\n", ""))
    merged = tmp_path / "m.yaml"
    result = runner.invoke(app, ["profile", "merge", str(silent), str(paths["a100-80gb"]), "-o", str(merged)])
    assert result.exit_code == 0, result.output
    assert load_profile(str(merged))[0].precision == "tf32"
    result = runner.invoke(
        app, ["profile", "merge", str(silent), str(paths["a100-80gb"]), str(paths["h100"]), "-o", "-"]
    )
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and "h100.yaml" in said and "precision 'bf16' differs from 'tf32'" in said


def test_the_benchmarks_megatron_last_layer_is_a_norm_and_a_cross_entropy_over_the_hidden_size():
    """bench_gpu_estimates prices Sailor's layer 33 as benchmarks/gpt.py:SailorLast; it must compute what
    torch's cross-entropy computes on the normed hidden states, loss and gradient, in its own kernels."""
    from benchmarks.gpt import SailorLast, Shape

    layer = SailorLast(Shape(hidden=16, heads=2, sequence=5))
    x = torch.randn(2, 5, 16, requires_grad=True)
    target = torch.randint(0, 16, (2, 5), generator=torch.Generator().manual_seed(0))
    loss = layer(x, target)
    (ours,) = torch.autograd.grad(loss, x)
    expected = nn.functional.cross_entropy(layer.norm(x).flatten(0, 1), target.flatten())
    (theirs,) = torch.autograd.grad(expected, x)
    assert torch.allclose(loss, expected, atol=1e-6) and torch.allclose(ours, theirs, atol=1e-6)
    with abstract():
        args = (torch.randn(2, 5, 16), torch.randint(0, 16, (2, 5)))
        w = est.work(Call("last", SailorLast(Shape(hidden=16, heads=2, sequence=5)), args, {}, ((True, False), {})))
    assert {"exp", "div_", "mul_"} <= {op.name.split(".")[0] for op in w.ops}


class _Fused(nn.Module):
    def __init__(self, causal: bool):
        super().__init__()
        self.causal = causal

    def forward(self, q, k, v):
        return nn.functional.scaled_dot_product_attention(q, k, v, is_causal=self.causal)


@pytest.mark.parametrize("causal", [False, True])
def test_fused_attention_is_counted_as_its_products_and_a_causal_mask_keeps_half_and_the_diagonal(causal):
    """Two heads of 8 queries and 8 keys of 4 dimensions: the scores (8 x 8 x 4 multiply-adds a head) and
    their weighted sum (as many) forward; five such products backward (the scores recomputed, the gradients
    of the weights, of the values, of the queries and of the keys); a causal mask keeps query i's keys
    0..i, 36 of the 64 scores."""
    with abstract():
        q, k, v = (torch.randn(1, 2, 8, 4, requires_grad=True) for _ in range(3))
        w = est.work(Call("attention", _Fused(causal), (q, k, v), {}, ((True, True, True), {})), loss="none")
    flops = {op.name: op.flops for op in w.ops if op.flops}
    kept = sum(j <= i for i in range(8) for j in range(8)) / 64 if causal else 1.0
    products = 2 * 2 * (2 * 8 * 8 * 4)  # heads x (scores + weighted sum) x 2 x multiply-adds
    assert flops == pytest.approx(
        {
            "_scaled_dot_product_flash_attention_for_cpu": products * kept,
            "_scaled_dot_product_flash_attention_for_cpu_backward": 2.5 * products * kept,
        }
    )


def test_fp32_fused_attention_runs_as_three_tf32_products_where_the_gpu_has_tf32():
    """Issue 81 case 4: PyTorch's fp32 attention on compute capability 8.0+ is the memory-efficient
    kernel, whose fp32 products are CUTLASS's 3xTF32 (three TF32 tensor-core products each): an A100's
    fp32 attention at a third of its TF32 peak (156 / 3 = 52 TFLOPs, not the 19.5 of fp32), under
    --precision fp32 and tf32 alike; a V100 (no TF32) at its fp32 peak; a bf16 one at the bf16 peak."""
    catalogue = load_catalogue(str(est.CATALOGUE))
    a100, v100 = catalogue.devices["a100-80gb"], catalogue.devices["v100-16gb"]
    fused = est.Op("_scaled_dot_product_flash_attention_for_cpu", 1e12, 1.0, "fp32", attention=True)
    product = est.Op("mm", 1e12, 1.0, "fp32")
    for precision in ("fp32", "tf32"):
        pricer = est.Pricer(a100, catalogue, precision)
        efficiency = pricer.reached(fused, "attention")
        assert pricer.core(fused, "attention") == pytest.approx(1e12 / (156e12 / 3 * efficiency))
    fp32 = est.Pricer(a100, catalogue, "fp32")
    assert fp32.core(product, "fc") == pytest.approx(1e12 / (19.5e12 * fp32.reached(product, "fc")))
    on_v100 = est.Pricer(v100, catalogue, "fp32")
    assert on_v100.core(fused, "attention") == pytest.approx(
        1e12 / (v100.tflops.fp32 * 1e12 * on_v100.reached(fused, "attention"))
    )
    half = dataclasses.replace(fused, dtype="bf16")
    at_bf16 = a100.tflops.bf16 * 1e12 * fp32.reached(half, "attention")
    assert fp32.core(half, "attention") == pytest.approx(1e12 / at_bf16)
    with abstract():  # the recorder marks the fused kernel, and nothing else
        q, k, v = (torch.randn(1, 2, 8, 4, requires_grad=True) for _ in range(3))
        w = est.work(Call("attention", _Fused(False), (q, k, v), {}, ((True, True, True), {})), loss="none")
    assert {op.name for op in w.ops if op.attention} == {
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_flash_attention_for_cpu_backward",
    }
