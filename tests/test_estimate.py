"""`heterps profile --estimate`: roofline counts against hand-computed ones, the file it writes, merge,
calibration, and the errors of its options and catalogue."""

from __future__ import annotations

import re

import pytest
import torch
import yaml
from torch import nn

from heterps_cli.cli.app import app
from heterps_cli.loading import load_catalogue, load_profile
from heterps_cli.profiling import estimate as est
from heterps_cli.profiling.models import Call, Model, trace
from tests.helpers import runner


def _cli(args, expect=0):
    result = runner.invoke(app, ["profile", *args])
    assert result.exit_code == expect, result.output
    assert "Traceback" not in result.output
    return result


def _call(module: nn.Module, *inputs: torch.Tensor) -> Call:
    return trace(Model("m", nn.Sequential(module), inputs))[0]


def _calls(model: nn.Module, *inputs: torch.Tensor) -> list[Call]:
    return trace(Model("m", model, inputs))


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
def test_each_operator_of_a_linear_layer_by_hand():
    B, n_in, n_out = 8, 32, 16
    # its input an activation, as inside a model: the backward computes its gradient too
    w = est.work(Call("fc", nn.Linear(n_in, n_out), (torch.randn(B, n_in),), {}))
    x, y, weights, bias = B * n_in * 4, B * n_out * 4, n_in * n_out * 4, n_out * 4
    assert [(op.name, op.flops, op.bytes) for op in w.ops] == [
        ("addmm", 2 * B * n_in * n_out, bias + x + weights + y),  # reads the bias, input, weights; writes y
        ("ones_like", 0, y),  # the output's gradient: written, nothing read
        ("mm", 2 * B * n_in * n_out, y + weights + x),  # the input's gradient
        ("mm", 2 * B * n_in * n_out, y + x + weights),  # the weights' gradient
        ("sum", 0, y + bias),  # the bias's gradient
        ("add_", 0, 3 * bias),  # each gradient added into the one kept (heterps profile times it so):
        ("add_", 0, 3 * weights),  # both read, one written
    ]
    assert w.ahead == 1 and w.forward.flops == 2 * B * n_in * n_out  # section 1g: what recomputation repeats
    assert w.ops[0].dims == (1, B, n_out, n_in)


def test_the_first_layer_computes_no_gradient_for_the_models_data():
    """Training computes no gradient for the input batch, so neither does the profile: the first
    layer's backward is the weight gradient alone; the next layer's input is an activation."""
    B, n_in, n_mid, n_out = 8, 32, 16, 4
    first, second = _calls(nn.Sequential(nn.Linear(n_in, n_mid), nn.Linear(n_mid, n_out)), torch.randn(B, n_in))
    assert est.work(first).flops == 2 * 2 * B * n_in * n_mid  # forward, weight gradient
    assert est.work(second).flops == 3 * 2 * B * n_mid * n_out  # forward, weight and input gradients
    # heterps profile times them on the same inputs
    assert not first.fresh("cpu")[0][0].requires_grad and second.fresh("cpu")[0][0].requires_grad


def test_a_lookup_reads_only_the_rows_it_indexes_and_writes_and_adds_its_whole_gradient():
    table = nn.Embedding(1000, 8)
    w = est.work(_call(table, torch.randint(0, 1000, (4, 3))))
    indices, rows = 4 * 3 * 8, 4 * 3 * 8 * 4  # int64 indices; the rows gathered
    assert w.flops == 0
    assert [(op.name, op.bytes) for op in w.ops] == [
        ("embedding", 1000 * 8 * 4 + indices + rows),  # the table counted whole: an upper bound on what it reads
        ("ones_like", rows),
        ("embedding_dense_backward", rows + indices + 1000 * 8 * 4),  # the whole table's gradient written
        ("add_", 3 * 1000 * 8 * 4),  # and added into the one kept
    ]


def test_an_operator_is_compute_or_memory_bound_and_a_gpu_layer_at_least_its_hosts_time():
    catalogue = load_catalogue(str(est.CATALOGUE))
    a100 = catalogue.devices["a100-80gb"]
    big = est.Op("mm", flops=1e12, bytes=1.0, dtype="fp32", dims=(1, 8192, 8192, 8192))
    copy = est.Op("copy_", flops=0, bytes=1e10, dtype="fp32")
    shape = (8192 / (8192 + 24)) ** 3  # fp32's D
    fp32, tf32 = est.Pricer(a100, catalogue, "fp32"), est.Pricer(a100, catalogue, "tf32")
    assert fp32.core(big, "fc") == pytest.approx(1e12 / (19.5e12 * 0.7 * shape))  # no matmul_efficiency at fp32
    assert tf32.core(big, "fc") == pytest.approx(1e12 / (156e12 * 0.77 * (8192 / (8192 + 72)) ** 3))
    assert fp32.core(copy, "other") == pytest.approx(1e10 / (2039e9 * 0.87))
    # a device without the precision falls back on its fp32 peak
    assert est.Pricer(catalogue.devices["t4"], catalogue, "tf32").core(big, "fc") == pytest.approx(
        1e12 / (8.1e12 * 0.7 * shape)
    )
    # misaligned on tensor cores (a vocabulary of 50,257): the catalogue's share of the aligned speed
    odd = est.Op("mm", flops=1e12, bytes=1.0, dtype="fp32", dims=(1, 8192, 50257, 8192))
    aligned = est.Op("mm", flops=1e12, bytes=1.0, dtype="fp32", dims=(1, 8192, 50256, 8192))
    assert tf32.core(odd, "fc") == pytest.approx(tf32.core(aligned, "fc") / 0.40)
    assert fp32.core(odd, "fc") == pytest.approx(fp32.core(aligned, "fc"))
    # a GPU layer: its kernels back to back, or its host's time (layer_us + launches), the longer
    tiny = est.Work((est.Op("add", 0, 1e3, "fp32"),) * 3, 1)
    assert tf32.seconds(tiny, "other") == pytest.approx(196e-6 + 3 * 5e-6)
    heavy = est.Work((big, copy), 1)
    assert tf32.seconds(heavy, "fc") == pytest.approx(tf32.core(big, "fc") + tf32.core(copy, "fc"))
    # the CPU runs them in turn: each operator its work and its launch
    cpu = est.Pricer(catalogue.devices["cpu"], catalogue)
    assert cpu.seconds(tiny, "other") == pytest.approx(3 * (1e3 / 38e9 + 4e-6))


def test_estimate_writes_a_profile_that_says_so_and_prints_the_cluster_snippet(tmp_path):
    out = tmp_path / "a100.yaml"
    shown = _cli(["mlp", "--as", "a100", "--estimate", "a100-80gb", "--batch-size", "16", "--out", str(out)]).stdout
    assert "estimated, not measured" in shown and f"wrote {out}" in shown
    assert "memory_gb: 80" in shown and "bandwidth_gbps: 50" in shown and "  a100:" in shown
    profile, _ = load_profile(str(out))
    assert [layer.type for layer in profile.layers] == ["fc", "activation"] * 3 + ["fc"]
    text = out.read_text()
    assert "NOT measured" in text.splitlines()[0]
    entries = [line for line in text.splitlines() if line.strip().startswith('"a100"')]
    assert len(entries) == 7 and all("# estimated: on a100-80gb" in line for line in entries)
    assert "precision: fp32" in text.splitlines()
    # odt: the gradient all-reduce over the catalogue's 50 Gbit/s
    first = profile.layers[0]
    assert first.times["a100"].odt == pytest.approx(first.weight_size / (50e9 / 8), rel=1e-5)
    # update: the step and the reset move the weights 4 times at 2,039 GB/s x 0.87, plus 2 launches of 5 us;
    # nothing is timed here (a V100's update was this CPU's, 29 us to 16 ms from run to run)
    for layer in profile.layers:
        expected = 4 * layer.weight_size / (2039e9 * 0.87) + 2 * 5e-6 if layer.weight_size else 0.0
        assert layer.times["a100"].update == pytest.approx(expected, rel=1e-4)


def test_profile_estimate_is_the_same_as_profile_with_estimate(tmp_path):
    """``heterps profile estimate MODEL DEVICE`` writes what ``heterps profile MODEL --estimate DEVICE``
    does, and refuses --calibrate-on without --calibrate as it does."""
    old, new = tmp_path / "old.yaml", tmp_path / "new.yaml"
    _cli(["mlp", "--as", "t4", "--estimate", "t4", "--batch-size", "16", "--out", str(old)])
    shown = _cli(["estimate", "mlp", "t4", "--as", "t4", "--batch-size", "16", "--out", str(new)]).stdout
    timed = re.compile(r"update: [0-9.e+-]+")  # the optimiser step is timed here, so it differs run to run
    assert timed.sub("", new.read_text()) == timed.sub("", old.read_text()) and f"wrote {new}" in shown
    refused = _cli(
        ["estimate", "mlp", "t4", "--as", "t4", "--batch-size", "16", "-o", "x.yaml", "--calibrate-on", "t4"], 2
    )
    assert "--calibrate-on" in refused.stderr and not (tmp_path / "x.yaml").exists()
    unknown = _cli(["estimate", "mlp", "nosuch", "--as", "t4", "--batch-size", "16", "-o", "y.yaml"], 2)
    assert "DEVICE: 'nosuch' is not in the device catalogue" in unknown.stderr


def test_two_estimates_merge_with_their_comments_and_plan(runner, tmp_path):
    a, b, merged = tmp_path / "a.yaml", tmp_path / "b.yaml", tmp_path / "m.yaml"
    # at 4,096 samples the products outlast the host's time per layer (layer_us), which both GPUs share
    _cli(["mlp", "--as", "t4", "--estimate", "t4", "--batch-size", "4096", "--out", str(a)])
    _cli(["mlp", "--as", "h100", "--estimate", "h100", "--batch-size", "4096", "--out", str(b)])
    _cli(["merge", str(a), str(b), "-o", str(merged)])
    lines = merged.read_text().splitlines()
    assert sum("# estimated: on t4" in line for line in lines) == 7
    assert sum("# estimated: on h100" in line for line in lines) == 7
    profile, _ = load_profile(str(merged))
    # the faster device is never slower, and faster on every large matrix product (a small one takes
    # the host's time per layer on both)
    for layer in profile.layers:
        assert layer.times["h100"].oct <= layer.times["t4"].oct
        if layer.type == "fc" and layer.weight_size > 1e6:
            assert layer.times["h100"].oct < layer.times["t4"].oct
    cluster = tmp_path / "c.yaml"
    cluster.write_text(
        "cluster: c\nresources:\n  t4: {price: 0.5, limit: 4, memory_gb: 16, bandwidth_gbps: 12.5}\n"
        "  h100: {price: 4.0, limit: 2, memory_gb: 80, bandwidth_gbps: 400}\n"
    )
    result = runner.invoke(app, ["plan", str(merged), str(cluster), "--samples", "1e6", "-s", "exact"])
    assert result.exit_code == 0, result.output


def test_calibration_divides_each_kind_by_its_measured_over_estimated_ratio(tmp_path):
    """A 'measured' cpu profile whose fc layers take exactly twice the estimate and whose activations
    take the estimate: calibrated, the cpu estimate gives those times back."""
    plain = tmp_path / "plain.yaml"
    _cli(["mlp", "--as", "cpu", "--estimate", "cpu", "--batch-size", "16", "--out", str(plain)])
    catalogue = load_catalogue(str(est.CATALOGUE))
    cpu = catalogue.devices["cpu"]
    from heterps_cli.profiling.measure import load_model

    loaded = load_model("mlp", 16)
    expected = {}
    pricer = est.Pricer(cpu, catalogue)
    calls = trace(loaded)
    for i, call in enumerate(calls):
        w = est.work(call, loss="mse" if i == len(calls) - 1 else "none", gpu=False)
        kind = "fc" if isinstance(call.module, nn.Linear) else "activation"
        expected[call.name] = pricer.seconds(w, kind) * (2.0 if kind == "fc" else 1.0)
    data = yaml.safe_load(plain.read_text())
    for layer in data["layers"]:
        layer["times"]["cpu"]["oct"] = expected[layer["name"]]
    measured = tmp_path / "measured.yaml"
    measured.write_text(yaml.safe_dump(data))
    out = tmp_path / "calibrated.yaml"
    shown = _cli(
        [
            "mlp",
            "--as",
            "cpu",
            "--estimate",
            "cpu",
            "--batch-size",
            "16",
            "--calibrate",
            str(measured),
            "--out",
            str(out),
        ]
    ).stdout
    assert re.search(r"fc x2\b", shown) and re.search(r"activation x1\b", shown)
    profile, _ = load_profile(str(out))
    for layer in profile.layers:
        assert layer.times["cpu"].oct == pytest.approx(expected[layer.name], rel=1e-4)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--estimate", "a100"], r"'a100' is not in the device catalogue .*a100-80gb"),
        (["--estimate", "h100", "--device", "cuda"], r"--device applies to measuring"),
        (["--estimate", "h100", "--processes", "2"], r"--processes applies to measuring"),
        (["--calibrate", "x.yaml"], r"--calibrate goes with --estimate"),
    ],
)
def test_estimate_option_errors_exit_2(tmp_path, extra, message):
    result = _cli(["mlp", "--as", "x", "--batch-size", "4", "--out", str(tmp_path / "o.yaml"), *extra], expect=2)
    assert re.search(message, result.output.replace("\n", " ")), result.output
    assert not (tmp_path / "o.yaml").exists()


def test_a_bad_catalogue_names_its_file_line_and_field(tmp_path):
    text = est.CATALOGUE.read_text().replace("memory_gbps: 2039", "memory_gbps: -5", 1)
    bad = tmp_path / "devices.yaml"
    bad.write_text(text)
    line = next(i for i, row in enumerate(text.splitlines(), 1) if "memory_gbps: -5" in row)
    result = _cli(
        ["mlp", "--as", "a", "--estimate", "a100-80gb", "--catalogue", str(bad), "--batch-size", "4", "--out", "-"],
        expect=2,
    )
    assert f"devices.yaml:{line}: devices.a100-80gb.memory_gbps" in result.output.replace("\n", " ")


@pytest.mark.parametrize(
    "model,batch,expected",
    [
        ("vgg16", "2", ["calibrate with a measured profile of the same model"]),
        ("mlp", "8", ["other.yaml:", "measured at batch size 8, the estimate is for 4"]),
    ],
    ids=["another-model", "another-batch-size"],
)
def test_calibrating_with_a_profile_of_another_model_or_batch_size_is_refused(tmp_path, model, batch, expected):
    other = tmp_path / "other.yaml"
    _cli([model, "--as", "cpu", "--estimate", "cpu", "--batch-size", batch, "--out", str(other)])
    result = _cli(
        ["mlp", "--as", "a", "--estimate", "t4", "--batch-size", "4", "--calibrate", str(other), "--out", "-"],
        expect=2,
    )
    output = result.output.replace("\n", " ")
    assert all(text in output for text in expected), output


def test_the_update_is_the_optimisers_step_counted_by_hand(tmp_path):
    """An Adam step passes over the weights 18 times (lerp 3, mul 2, addcmul 3, sqrt 2, div 2, add 2, addcdiv 4)
    in 8 kernels, SGD's 3 in 1; the gradients' reset adds one pass and one kernel to each; AdamW's decay one
    mul (2 passes, a kernel) more. Both spellings take --optimizer."""
    catalogue = load_catalogue(str(est.CATALOGUE))
    device = catalogue.devices["a100-80gb"]
    launch = device.launch_us * 1e-6
    reached = device.memory_gbps * 1e9 * est.memory_efficiency(device, catalogue)
    updates = {}
    for optimizer, spelled in (("sgd", "estimate"), ("adam", "estimate"), ("adamw", "--estimate")):
        out = tmp_path / f"{optimizer}.yaml"
        args = ["mlp", "a100-80gb"] if spelled == "estimate" else ["mlp", "--estimate", "a100-80gb"]
        command = [spelled if spelled == "estimate" else "", *args, "--as", "a100", "--batch-size", "8"]
        _cli([c for c in command if c] + ["--optimizer", optimizer, "--out", str(out)])
        layer = load_profile(str(out))[0].layers[0]
        updates[optimizer], weights = layer.times["a100"].update, layer.weight_size
        assert f"update: the {optimizer} step" in out.read_text()
    by_hand = {"sgd": (4, 2), "adam": (19, 9), "adamw": (21, 10)}
    for optimizer, (passes, kernels) in by_hand.items():
        assert updates[optimizer] == pytest.approx(passes * weights / reached + kernels * launch, rel=1e-5)
    assert weights > 0
