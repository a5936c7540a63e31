"""`heterps profile estimate --tp`: a layer's times and one unit's sizes at tensor-parallel degrees
(docs/spec.md section 1h), against counts by hand, in the file it writes, through merge and plan,
and the errors of the option."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from heterps_cli.cli.app import app
from heterps_cli.errors import InputError
from heterps_cli.loading import load_catalogue, load_profile
from heterps_cli.profiling import estimate as est
from heterps_cli.profiling.models import Call
from heterps_cli.runtime.sharding import one_shard
from tests.helpers import runner

B, WIDTH, INNER = 8, 32, 64


def _mlp_block() -> nn.Module:
    return nn.Sequential(nn.Linear(WIDTH, INNER), nn.GELU(), nn.Linear(INNER, WIDTH))


def _cli(args, expect=0):
    result = runner.invoke(app, ["profile", *args])
    assert result.exit_code == expect, result.output
    assert "Traceback" not in result.output
    return result


def test_one_shard_holds_its_share_of_each_pair_and_the_second_bias_whole():
    block = _mlp_block()
    first, second = block[0], block[2]
    with one_shard(block, 2) as pairs:
        assert pairs == {"0": "colwise", "2": "rowwise"}
        assert (block[0].in_features, block[0].out_features) == (WIDTH, INNER // 2)
        assert (block[2].in_features, block[2].out_features) == (INNER // 2, WIDTH)
        assert block[2].bias.shape == (WIDTH,)
    assert block[0] is first and block[2] is second  # whole again after
    with one_shard(_mlp_block(), 3) as pairs:
        assert pairs is None  # 3 does not divide the inner width
    with one_shard(nn.Sequential(nn.Linear(WIDTH, WIDTH)), 2) as pairs:
        assert pairs is None  # no pair


def test_a_shards_work_and_all_reduce_by_hand():
    call = Call("mlp", _mlp_block(), (torch.randn(B, WIDTH),), {})  # its input an activation, as inside a model
    whole = est.work(call)
    with one_shard(call.module, 2) as pairs:
        w = est.work(call)
        reduced = est.all_reduced(call, pairs)
    # each product's forward, input and weight gradients: 3 x 2 B in out, with half of INNER
    assert whole.flops == 3 * 2 * B * WIDTH * INNER * 2
    assert w.flops == 3 * 2 * B * WIDTH * (INNER // 2) * 2
    # forward: the second product's output; backward: the first's input gradient
    assert reduced == (B * WIDTH * 4, B * WIDTH * 4)
    device = load_catalogue(str(est.CATALOGUE)).devices["a100-80gb"]
    seconds = 2 * (4 - 1) / 4 * 1e6 / (2400e9 / 8) + 5e-6
    assert est.ring(1e6, 4, device) == pytest.approx(seconds)
    assert est.ring(0, 4, device) == 0


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
def test_estimate_at_tp_writes_each_layers_degrees_and_a_plan_reads_them(tmp_path):
    out = tmp_path / "t.yaml"
    _cli(
        ["estimate", "transformer", "a100-80gb", "--as", "a100", "--batch-sizes", "4,8", "--tp", "2,4"]
        + ["--granularity", "blocks", "--out", str(out)]
    )
    profile, _ = load_profile(str(out))
    catalogue = load_catalogue(str(est.CATALOGUE))
    device = catalogue.devices["a100-80gb"]
    by_name = {layer.name: layer for layer in profile.layers}
    for name in ("embedding", "norm", "head"):  # no pair: whole on every unit, as at tp 1
        layer = by_name[name]
        entry = layer.times["a100"]
        for d in (2, 4):
            assert entry.tp[d].oct == entry.oct and entry.tp[d].forward == entry.forward
            assert layer.tp[d].weight_size == layer.weight_size
        assert "no pair to split" in out.read_text().split(f'name: "{name}"')[1].split("- name")[0]
    block = by_name["blocks.0"]
    # its MLP's two products (hidden 256 -> 1,024 -> 256): each unit holds 1/d of them but the second bias
    hidden = 256
    pair = (hidden * 4 * hidden + 4 * hidden) * 4 + (4 * hidden * hidden) * 4
    for d in (2, 4):
        assert block.tp[d].weight_size == block.weight_size - pair + pair / d
        assert block.tp[d].activation_size < block.activation_size
        entry = block.times["a100"].tp[d]
        # odt: one unit all-reduces its own shard of the gradients over the device's network
        assert entry.odt == pytest.approx(block.tp[d].weight_size / (device.network_gbps * 1e9 / 8), rel=1e-5)
        assert entry.forward < entry.oct
        assert set(entry.batches) == {4}  # the other size kept at every degree
    # the file says how
    assert "1 pair split" in out.read_text() and "2 (d-1)/d x bytes over the 2400 Gbit/s" in out.read_text()
    cluster = tmp_path / "c.yaml"
    cluster.write_text(
        "cluster: a\nresources:\n  a100: {unit: A100, memory_gb: 80, bandwidth_gbps: 400}\n"
        "nodes:\n  p4de: {price: 40.96, units: {a100: 8}, available: 2, link_gbps: {a100: 2400}}\n"
    )
    result = runner.invoke(app, ["validate", str(out), str(cluster)])
    assert result.exit_code == 0 and "a100 at tp 2, 4" in result.output, result.output
    result = runner.invoke(
        app, ["plan", str(out), str(cluster), "--scheduler", "exact", "--samples", "1000", "--global-batch", "64"]
    )
    assert result.exit_code == 0 and "certified" in result.output, result.output


def test_merge_keeps_each_types_degrees(tmp_path):
    a, h = tmp_path / "a.yaml", tmp_path / "h.yaml"
    common = ["--batch-size", "4", "--granularity", "blocks", "--input-shape", "16"]
    _cli(["estimate", "transformer", "a100-80gb", "--as", "a100", "--tp", "2", *common, "--out", str(a)])
    _cli(["estimate", "transformer", "t4", "--as", "t4", *common, "--out", str(h)])
    result = runner.invoke(app, ["profile", "merge", str(a), str(h), "--out", str(tmp_path / "m.yaml")])
    assert result.exit_code == 0, result.output
    merged, _ = load_profile(str(tmp_path / "m.yaml"))
    alone, _ = load_profile(str(a))
    for layer, single in zip(merged.layers, alone.layers):
        assert layer.tp == single.tp
        assert layer.times["a100"].tp == single.times["a100"].tp
        assert layer.times["t4"].tp is None


@pytest.mark.parametrize(
    ("extra", "field", "message"),
    [
        (["--tp", "3,4"], "--tp", "each dividing the next"),
        (["--tp", "1"], "--tp", "from 2 to"),
        (["--tp", "2,x"], "--tp", "like 2,4"),
    ],
)
def test_bad_degrees_exit_2(tmp_path, extra, field, message):
    result = _cli(
        ["estimate", "mlp", "a100-80gb", "--as", "a", "--batch-size", "4", "--out", str(tmp_path / "p.yaml"), *extra],
        expect=2,
    )
    said = " ".join(re.sub("[│╭╮╰╯─]", " ", result.output).split())  # the error box wraps lines
    assert field in said and message in said
    assert not (tmp_path / "p.yaml").exists()


def test_tp_estimated_needs_a_device_with_an_in_node_link(tmp_path):
    out = str(tmp_path / "p.yaml")
    result = _cli(["estimate", "mlp", "cpu", "--as", "cpu", "--batch-size", "4", "--tp", "2", "--out", out], expect=2)
    assert "--tp" in result.output and "no link_gbps" in result.output
    assert not (tmp_path / "p.yaml").exists()


def test_a_catalogue_rate_too_small_for_a_finite_time_or_a_half_precision_without_a_peak_is_refused(tmp_path):
    """No estimate is written that validate would refuse (a link of 3e-308 Gbit/s gave oct: inf), nor one
    that says bf16 while pricing fp32 products (a T4 has no bf16 peak)."""
    import yaml

    from heterps_cli.profiling.estimate import CATALOGUE

    catalogue = yaml.safe_load(CATALOGUE.read_text())
    catalogue["devices"]["t4"]["link_gbps"] = 3e-308
    mine = tmp_path / "devices.yaml"
    mine.write_text(yaml.safe_dump(catalogue))
    out = str(tmp_path / "p.yaml")
    args = ["estimate", "mlp", "t4", "--as", "t4", "--batch-size", "4", "--out", out]
    result = _cli([*args, "--tp", "2", "--catalogue", str(mine)], expect=2)
    assert "devices.t4.link_gbps: must be >= 1e-06 (got 3e-308)" in " ".join(result.output.split())
    result = _cli([*args, "--precision", "bf16"], expect=2)
    said = " ".join(result.output.split())
    assert "--precision: device 't4' of the catalogue has no bf16 peak" in said and "estimate at fp16 or fp32" in said
    assert not (tmp_path / "p.yaml").exists()
    from heterps_cli.profiling.write import Entry, LayerRow, render

    row = LayerRow("fc", "fc", 4.0, 4.0, {"t4": Entry(1.0, 0.0, 0.9, 0.0, tp={2: Entry(float("inf"), 0.0, 0.9, 0.0)})})
    with pytest.raises(InputError, match=r"layers\[0\]\.times\.t4\.tp\.2\.oct: came out as inf for layer 'fc'"):
        render("m", 4, [row], [])


def test_degrees_merge_across_batch_sizes_whose_activations_per_sample_differ(tmp_path):
    """A position lookup saves its indices once whatever the batch: per sample, its activations differ
    from batch 1 to batch 2, at every degree as at tp 1, and the sizes still merge."""
    model = tmp_path / "tiny.py"
    model.write_text(
        "import torch\nfrom torch import nn\n\n\n"
        "class Embed(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.words, self.positions = nn.Embedding(100, 16), nn.Embedding(8, 16)\n\n"
        "    def forward(self, tokens):\n"
        "        return self.words(tokens) + self.positions(torch.arange(tokens.shape[1]))\n\n\n"
        "def tiny(batch_size):\n"
        "    embed, mlp = Embed(), nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))\n"
        "    return nn.Sequential(embed, mlp), torch.randint(0, 100, (batch_size, 8)), [embed, mlp]\n"
    )
    out = tmp_path / "t.yaml"
    _cli(
        ["estimate", f"{model}:tiny", "h100", "--as", "h100", "--batch-sizes", "1,2", "--tp", "2"]
        + ["--granularity", "blocks", "--out", str(out)]
    )
    profile, _ = load_profile(str(out))
    assert [layer.tp[2].weight_size < layer.weight_size for layer in profile.layers] == [False, True]
