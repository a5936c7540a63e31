"""`heterps profile`: real measurements of small models, merge, and the errors a user's factory can cause."""

from __future__ import annotations

import re

import pytest
import torch
import yaml

from heterps_cli.cli.app import app
from heterps_cli.loading import load_profile
from heterps_cli.profiling import measure
from tests.helpers import layers_over_step, profile_cli, runner


@pytest.mark.slow  # an end-to-end run of several seconds: .ci/run runs it
def test_measure_two_types_merge_and_plan(runner, factory, tmp_path):
    cpu, gpu, merged = tmp_path / "cpu.yaml", tmp_path / "gpu.yaml", tmp_path / "merged.yaml"
    # the cpu run measures its link (loopback gloo); the second run is given one
    shown = profile_cli([f"{factory}:small", "--as", "cpu", "--batch-size", "64", "--out", str(cpu)]).stdout
    assert "oct" in shown and "alpha" in shown and f"wrote {cpu}" in shown
    assert f"next: heterps validate {cpu} CLUSTER, then heterps plan {cpu} CLUSTER --samples N" in shown.replace(
        "\n", " "
    )
    profile_cli([f"{factory}:small", "--as", "fast", "--batch-size", "64", "--out", str(gpu), "--link-gbps", "100"])
    profile_cli(["merge", str(cpu), str(gpu), "-o", str(merged)])
    prof, _ = load_profile(str(merged))
    assert [layer.name for layer in prof.layers] == ["0", "1", "2", "3", "4"]
    assert [layer.type for layer in prof.layers] == ["fc", "activation", "fc", "activation", "fc"]
    assert all(set(layer.times) == {"cpu", "fast"} for layer in prof.layers)
    assert prof.layers[0].input_size == 64 * 4 and prof.layers[0].weight_size == (64 * 256 + 256) * 4
    # every times entry says what is estimated, also after the merge
    lines = merged.read_text().splitlines()
    entries = [line for line in lines if line.strip().startswith(('"cpu"', '"fast"')) and "oct:" in line]
    assert len(entries) == 10 and all("estimated:" in line and "beta" in line for line in entries)
    # section 1d: each type's pass start; the latencies only where the link was measured, not given
    assert prof.fixed is not None and set(prof.fixed) == {"cpu", "fast"}
    assert all(0 < costs.pass_start < 0.1 for costs in prof.fixed.values())
    assert 0 < prof.fixed["cpu"].all_reduce_latency < 0.1 and prof.fixed["fast"].all_reduce_latency == 0
    assert 0 < prof.fixed["cpu"].transfer_latency < 0.1 and prof.fixed["fast"].transfer_latency == 0
    assert "all_reduce_latency" not in next(line for line in lines if line.startswith('  "fast"'))
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("cluster: two\nresources:\n  cpu: {price: 0.04, limit: 16}\n  fast: {price: 1.0, limit: 4}\n")
    result = runner.invoke(app, ["plan", str(merged), str(cluster), "--samples", "1e6", "-s", "exact", "--json"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["plan", str(merged), str(cluster), "--samples", "1e6", "--steps", "5", "--json"])
    assert result.exit_code == 0, result.output


def test_zoo_ctr_profiles(tmp_path):
    """ctr takes two inputs, so no plan of it can run: profiled only when asked for its layers, chain: false."""
    out = tmp_path / "ctr-cpu.yaml"
    args = ["ctr", "--as", "cpu", "--batch-size", "64", "--out", str(out), "--link-gbps", "10"]
    refused = runner.invoke(app, ["profile", *args])
    assert refused.exit_code == 2 and "chain at no granularity" in refused.output and not out.exists()
    profile_cli([*args, "--granularity", "layers"])
    prof, _ = load_profile(str(out))
    assert prof.chain is False
    kinds = [layer.type for layer in prof.layers]
    assert kinds.count("embedding") == 8 and "fc" in kinds
    assert prof.layers[0].weight_size == 100_000 * 16 * 4
    # odt = the gradient all-reduce (as big as the weights) / 10 Gbit/s; activations move at stage
    # boundaries (docs/spec.md section 1b), so they are in input_size and activation_size, not in odt
    first = prof.layers[0]
    assert first.times["cpu"].odt == pytest.approx(first.weight_size / 1.25e9, rel=1e-4)
    assert first.times["cpu"].beta == 0.0
    # the embedding tables live on parameter servers: sharded; an EmbeddingBag keeps its ids (and offsets)
    assert [layer.sharded for layer in prof.layers].count(True) == 8 and first.sharded
    assert first.activation_size >= 4 * 8  # at least the bag of 4 int64 ids per sample
    assert "model ctr" in out.read_text().splitlines()[0]  # the header says which model the numbers are for


@pytest.mark.slow  # an end-to-end run of several seconds: .ci/run runs it
def test_sum_of_layer_times_matches_a_full_step():
    ratios = layers_over_step(measure.load_model("mlp", 256))
    assert 0.75 <= ratios[-1] <= 1.25, ratios


@pytest.mark.slow  # two profiles: about 10 s
def test_the_last_layer_is_timed_with_the_loss_training_takes_of_the_output(factory, tmp_path):
    """A flatten is nearly free; the mean squared error of its 400,000 outputs a sample, forward and
    backward, is not: the profile charges that to the last layer, and --loss none does not."""
    times = {}
    for loss in ("mse", "none"):
        out = tmp_path / f"{loss}.yaml"
        args = f"{factory}:wide_output --as cpu --batch-size 8 --link-gbps 10 --loss {loss} --out {out}"
        profile_cli(args.split())
        header = out.read_text().splitlines()[1]
        assert ("the last layer's with the mse loss" in header) == (loss == "mse")
        times[loss] = [layer.times["cpu"].oct for layer in load_profile(str(out))[0].layers]
    assert times["mse"][1] > 3 * times["none"][1], times


@pytest.mark.parametrize(
    "target, message",
    [
        ("{factory}:raises", r"models\.py:14: raises: factory raises\(\) raised ValueError: no weights here"),
        ("{factory}:wrong", r"must return a torch\.nn\.Module.*returned str"),
        ("{factory}:absent", r"absent: no such function"),
        ("{factory}:module_only", r"give --input-shape"),
        ("{tmp}/missing.py:small", r"missing\.py: file not found"),
        ("no_such_package_xyz:make", r"could not be loaded: ModuleNotFoundError"),
        ("resnet9000", r"neither a built-in model"),
    ],
)
def test_bad_factories_exit_2_with_the_cause(factory, tmp_path, target, message):
    spec = target.format(factory=factory, tmp=tmp_path)
    result = profile_cli([spec, "--as", "cpu", "--batch-size", "4", "--out", str(tmp_path / "p.yaml")], expect=2)
    assert re.search(message, " ".join(result.output.split())), result.output
    assert not (tmp_path / "p.yaml").exists()


def test_module_only_factory_with_input_shape(factory, tmp_path):
    out = tmp_path / "p.yaml"
    profile_cli(
        [
            f"{factory}:module_only",
            "--input-shape",
            "16",
            "--as",
            "cpu",
            "--batch-size",
            "8",
            "--out",
            str(out),
            "--link-gbps",
            "10",
        ]
    )
    assert len(load_profile(str(out))[0].layers) == 2


def test_merge_refuses_other_models_sizes_in_no_common_and_repeated_types(factory, tmp_path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    profile_cli([f"{factory}:small", "--as", "cpu", "--batch-size", "16", "--out", str(a), "--link-gbps", "10"])
    profile_cli([f"{factory}:small", "--as", "cpu", "--batch-size", "16", "--out", str(b), "--link-gbps", "10"])
    result = profile_cli(["merge", str(a), str(b), "-o", str(tmp_path / "m.yaml")], expect=2)
    assert "type 'cpu' at batch 16 is measured in" in " ".join(result.output.split())
    data = yaml.safe_load(b.read_text())
    for change, words in [
        ({"batch_size": 32}, "no batch size is measured for every layer on every type (cpu at 16, gpu at 32)"),
        ({"model": "other"}, "same model"),
        ({"layers": data["layers"][:3]}, "not the same model"),
    ]:
        c = tmp_path / "c.yaml"
        c.write_text(
            yaml.safe_dump(
                {
                    **data,
                    **change,
                    "fixed": {"gpu": data["fixed"]["cpu"]},
                    "layers": [
                        {**layer, "times": {"gpu": layer["times"]["cpu"]}}
                        for layer in change.get("layers", data["layers"])
                    ],
                }
            )
        )
        result = profile_cli(["merge", str(a), str(c), "-o", str(tmp_path / "m.yaml")], expect=2)
        assert words in " ".join(result.output.split()), result.output


def test_profiling_needs_its_options(tmp_path):
    result = profile_cli(["mlp", "--batch-size", "8"], expect=2)
    assert "--as" in result.output


def test_cuda_without_a_gpu_is_a_clear_error(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    result = profile_cli(
        [
            "mlp",
            "--as",
            "gpu",
            "--batch-size",
            "8",
            "--device",
            "cuda",
            "--out",
            str(tmp_path / "p.yaml"),
            "--link-gbps",
            "10",
        ],
        expect=2,
    )
    assert "no CUDA device" in result.output


def test_activation_size_is_what_autograd_saves_per_sample(factory, tmp_path):
    """Linear(64, 256) keeps its input for the weight gradient (64 floats per sample, its weights not
    counted); ReLU keeps its output (256 floats); both by saved_tensors_hooks, each storage once."""
    out = tmp_path / "small.yaml"
    profile_cli([f"{factory}:small", "--as", "cpu", "--batch-size", "64", "--out", str(out), "--link-gbps", "10"])
    prof, _ = load_profile(str(out))
    assert prof.layers[0].activation_size == 64 * 4
    assert prof.layers[1].activation_size == 256 * 4
    assert not any(layer.sharded for layer in prof.layers)


def test_profile_is_a_group_whose_subcommands_have_their_own_help(runner):
    # `heterps profile merge --help` once showed profile's own help.
    merge = runner.invoke(app, ["profile", "merge", "--help"], env={"COLUMNS": "120"})
    assert merge.exit_code == 0 and "Usage: heterps profile merge" in merge.stdout and "--as" not in merge.stdout
    measure = runner.invoke(app, ["profile", "measure", "--help"], env={"COLUMNS": "120"})
    assert measure.exit_code == 0 and "--batch-size" in measure.stdout and "--estimate" in measure.stdout
    group = runner.invoke(app, ["profile", "--help"], env={"COLUMNS": "120"})
    assert group.exit_code == 0 and "merge" in group.stdout and "measure" in group.stdout
    # The short spelling still measures: its own options reach measure.
    short = runner.invoke(app, ["profile", "mlp", "--as", "cpu"])
    assert short.exit_code == 2 and "profiling needs --batch-size, --out" in short.output
    assert runner.invoke(app, ["profile", "merge", "a.yaml"]).exit_code == 2  # --out is required
