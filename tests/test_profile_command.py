"""`heterps profile`: real measurements of small models, merge, and the errors a user's factory can cause."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
import torch
import yaml

from heterps_cli.cli.app import app
from heterps_cli.errors import InputError
from heterps_cli.formats import load_profile
from heterps_cli.profiling import measure
from heterps_cli.profiling.processes import combine
from tests.helpers import layers_over_step, runner

FACTORY = """
import torch
from torch import nn

def small(batch_size=32):
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 8))
    return model, torch.randn(batch_size, 64)

def module_only():
    return nn.Sequential(nn.Linear(16, 16), nn.ReLU())

def raises(batch_size):
    x = 1
    raise ValueError("no weights here")

def wrong():
    return "a string"

class Broken(nn.Module):
    def forward(self, x):
        raise RuntimeError("shapes do not match")

def broken_forward(batch_size=4):
    return Broken(), torch.randn(batch_size, 4)

class BrokenElsewhere(nn.Linear):  # fails only in a process other than the test's: a profiling process
    def forward(self, x):
        import os
        if os.getpid() != int(os.environ["HETERPS_TEST_PID"]):
            raise RuntimeError("shapes do not match")
        return super().forward(x)

def broken_elsewhere(batch_size=4):
    return nn.Sequential(BrokenElsewhere(4, 4)), torch.randn(batch_size, 4)

class Clocked(nn.Linear):  # appends when each forward ran to a file named for its process
    def forward(self, x):
        import os, time
        with open(os.path.join(os.environ["HETERPS_TEST_CLOCKS"], str(os.getpid())), "a") as f:
            f.write(f"{time.time()} ")
        return super().forward(x)

class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(1))

    def forward(self, x):
        return x * self.w

def wide_output(batch_size=8):  # a cheap last layer over 400,000 outputs a sample: the loss is most of its time
    return nn.Sequential(Scaled(), nn.Flatten()), torch.randn(batch_size, 4, 100_000)

def clocked(batch_size=8):
    return nn.Sequential(Clocked(32, 32), nn.ReLU()), torch.randn(batch_size, 32)
"""


@pytest.fixture()
def factory(tmp_path) -> Path:
    path = tmp_path / "models.py"
    path.write_text(FACTORY)
    return path


def _profile(args, expect=0):
    result = runner.invoke(app, ["profile", *args])
    assert result.exit_code == expect, result.output
    assert "Traceback" not in result.output
    return result


@pytest.mark.slow  # an end-to-end run of several seconds: .ci/run runs it
def test_measure_two_types_merge_and_plan(runner, factory, tmp_path):
    cpu, gpu, merged = tmp_path / "cpu.yaml", tmp_path / "gpu.yaml", tmp_path / "merged.yaml"
    # the cpu run measures its link (loopback gloo); the second run is given one
    shown = _profile([f"{factory}:small", "--as", "cpu", "--batch-size", "64", "--out", str(cpu)]).stdout
    assert "oct" in shown and "alpha" in shown and f"wrote {cpu}" in shown
    assert f"next: heterps validate {cpu} CLUSTER, then heterps plan {cpu} CLUSTER --samples N" in shown.replace(
        "\n", " "
    )
    _profile([f"{factory}:small", "--as", "fast", "--batch-size", "64", "--out", str(gpu), "--link-gbps", "100"])
    _profile(["merge", str(cpu), str(gpu), "-o", str(merged)])
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
    _profile([*args, "--granularity", "layers"])
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
        _profile(args.split())
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
    result = _profile([spec, "--as", "cpu", "--batch-size", "4", "--out", str(tmp_path / "p.yaml")], expect=2)
    assert re.search(message, " ".join(result.output.split())), result.output
    assert not (tmp_path / "p.yaml").exists()


def test_module_only_factory_with_input_shape(factory, tmp_path):
    out = tmp_path / "p.yaml"
    _profile(
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
    _profile([f"{factory}:small", "--as", "cpu", "--batch-size", "16", "--out", str(a), "--link-gbps", "10"])
    _profile([f"{factory}:small", "--as", "cpu", "--batch-size", "16", "--out", str(b), "--link-gbps", "10"])
    result = _profile(["merge", str(a), str(b), "-o", str(tmp_path / "m.yaml")], expect=2)
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
        result = _profile(["merge", str(a), str(c), "-o", str(tmp_path / "m.yaml")], expect=2)
        assert words in " ".join(result.output.split()), result.output


def test_profiling_needs_its_options(tmp_path):
    result = _profile(["mlp", "--batch-size", "8"], expect=2)
    assert "--as" in result.output


def test_cuda_without_a_gpu_is_a_clear_error(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    result = _profile(
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


@pytest.mark.slow
def test_processes_take_each_layers_median_over_fresh_processes(factory, tmp_path):
    out = tmp_path / "p.yaml"
    _profile(
        [
            f"{factory}:small",
            "--as",
            "cpu",
            "--batch-size",
            "16",
            "--out",
            str(out),
            "--link-gbps",
            "10",
            "--processes",
            "2",
        ]
    )
    assert "the median over 2 profiles, each in a fresh process" in out.read_text()
    assert [layer.name for layer in load_profile(str(out))[0].layers] == ["0", "1", "2", "3", "4"]


@pytest.mark.slow  # an end-to-end run of several seconds: .ci/run runs it
def test_a_failing_profiling_process_exits_2_with_its_cause(factory, tmp_path, monkeypatch):
    """A forward that fails on any batch fails before a process starts; one that fails in a process only
    (its alpha fit's share of one sample) ends the profile with the process's cause."""
    early = _profile(
        [f"{factory}:broken_forward", "--as", "cpu", "--batch-size", "4", "--processes", "2", "-o", "-"], expect=2
    )
    assert "the model's forward pass failed: RuntimeError: shapes do not match" in " ".join(early.output.split())
    monkeypatch.setenv("HETERPS_TEST_PID", str(os.getpid()))
    result = _profile(
        [
            f"{factory}:broken_elsewhere",
            "--as",
            "cpu",
            "--batch-size",
            "4",
            "--processes",
            "2",
            "--out",
            str(tmp_path / "p.yaml"),
        ],
        expect=2,
    )
    shown = " ".join(result.output.split())
    assert "profiling process 1 of 2 failed" in shown and "RuntimeError: shapes do not match" in shown
    assert not (tmp_path / "p.yaml").exists()


@pytest.mark.slow  # two profiling processes of several seconds each: .ci/run runs it
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="--concurrent runs one process per core: needs two")
def test_concurrent_processes_profile_side_by_side(factory, tmp_path):
    """--concurrent 2: both processes time their layers at the same time (their clocks overlap),
    the link is given once, and the profile says how it was taken."""
    clocks = tmp_path / "clocks"
    clocks.mkdir()
    out = tmp_path / "p.yaml"
    args = [f"{factory}:clocked", "--as", "cpu", "--batch-size", "8", "--out", str(out), "--link-gbps", "10"]
    result = runner.invoke(app, ["profile", *args, "--concurrent", "2"], env={"HETERPS_TEST_CLOCKS": str(clocks)})
    assert result.exit_code == 0, result.output
    spans = {}
    for f in clocks.iterdir():
        times = [float(t) for t in f.read_text().split()]
        spans[f.name] = (min(times), max(times))
    children = [span for pid, span in spans.items() if int(pid) != os.getpid()]  # the parent traces once
    assert len(children) == 2
    (a0, a1), (b0, b1) = children
    assert max(a0, b0) < min(a1, b1), spans  # the two processes' forwards overlap in time
    text = out.read_text()
    assert "timed 2 processes at a time, one per core" in text and "given: --link-gbps 10" in text
    assert [layer.name for layer in load_profile(str(out))[0].layers] == ["0", "1"]


@pytest.mark.parametrize(
    ("extra", "field", "says"),
    [
        (["--concurrent", "1"], "--concurrent", "2 or more, and at most the"),
        (["--concurrent", "2", "--processes", "3"], "--processes", "must be a multiple of --concurrent 2"),
        (["--concurrent", "4096"], "--concurrent", "at most the"),
        (["--device", "cuda", "--concurrent", "2"], "--concurrent", "on cuda one device is one unit"),
        (["--estimate", "h100", "--concurrent", "2"], "--concurrent", "applies to measuring"),
    ],
)
def test_concurrent_asks_for_what_it_can_run(factory, tmp_path, extra, field, says):
    out = tmp_path / "p.yaml"
    result = _profile([f"{factory}:small", "--as", "cpu", "--batch-size", "8", "--out", str(out), *extra], expect=2)
    shown = " ".join(result.output.split())
    assert f"error: {field}:" in shown and says in shown, shown
    assert not out.exists()


def test_combine_takes_medians_and_refuses_different_layers():
    def run(octs, names=("a", "b"), step=1.0):
        layers = [measure.LayerProfile(n, "fc", 4.0, 8.0, o, o / 10, 0.9, 0.5, 0.01) for n, o in zip(names, octs)]
        return measure.Profiled("m", "cpu", "cpu", 8, 1e9, "given", 20, layers, step)

    combined = combine([run([1.0, 5.0], step=2.0), run([3.0, 4.0], step=9.0), run([2.0, 100.0], step=3.0)])
    assert [layer.oct for layer in combined.layers] == [2.0, 5.0] and combined.step == 3.0
    assert combined.layers[1].odt == 0.5 and "median over 3 profiles" in combined.notes[-1]
    with pytest.raises(InputError, match="different layers"):
        combine([run([1.0, 2.0]), run([1.0, 2.0], names=("a", "c"))])


def test_activation_size_is_what_autograd_saves_per_sample(factory, tmp_path):
    """Linear(64, 256) keeps its input for the weight gradient (64 floats per sample, its weights not
    counted); ReLU keeps its output (256 floats); both by saved_tensors_hooks, each storage once."""
    out = tmp_path / "small.yaml"
    _profile([f"{factory}:small", "--as", "cpu", "--batch-size", "64", "--out", str(out), "--link-gbps", "10"])
    prof, _ = load_profile(str(out))
    assert prof.layers[0].activation_size == 64 * 4
    assert prof.layers[1].activation_size == 256 * 4
    assert not any(layer.sharded for layer in prof.layers)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="counts processes through Linux /proc")
def test_ctrl_c_during_the_bandwidth_probe_is_one_line_and_ends_its_processes(tmp_path):
    # the probe's two gloo processes are spawned children; Ctrl-C lands inside their start-up (they
    # import torch): where the tracebacks came from
    command = ["profile", "mlp", "--as", "cpu", "--batch-size", "64", "--out", "p.yaml"]
    _ctrl_c_ends_every_process(tmp_path, command, b"spawn", "the bandwidth probe's processes", settle=0.5)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="counts processes through Linux /proc")
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="--concurrent runs one process per core: needs two")
def test_ctrl_c_during_concurrent_profiling_ends_every_process(tmp_path):
    command = ["profile", "mlp", "--as", "cpu", "--batch-size", "64", "--out", "p.yaml", "--link-gbps", "10"]
    _ctrl_c_ends_every_process(tmp_path, [*command, "--concurrent", "2"], b"profiling.processes", "the profiles")


def _ctrl_c_ends_every_process(tmp_path, command: list[str], marker: bytes, what: str, settle: float = 1.0) -> None:
    """Start ``heterps COMMAND`` in its own session, wait for two children whose command line holds
    ``marker``, send Ctrl-C to the group as a terminal does: one line, exit 130, no process left, no file."""
    import signal
    import subprocess
    import sys

    from tests.test_run_command import children, session_processes

    process = subprocess.Popen(
        [sys.executable, "-m", "heterps_cli", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        cwd=tmp_path,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            running = [c for c in children(process.pid) if marker in Path(f"/proc/{c}/cmdline").read_bytes()]
            if len(running) >= 2:
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"{what} did not start")
        time.sleep(settle)
        os.killpg(process.pid, signal.SIGINT)
        _, stderr = process.communicate(timeout=30)
        time.sleep(1.0)
        leftover = session_processes(process.pid)
    finally:
        for pid in session_processes(process.pid):
            os.kill(pid, signal.SIGKILL)
    assert process.returncode == 130 and stderr.strip() == "interrupted", stderr
    assert not leftover and not (tmp_path / "p.yaml").exists()


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


def test_a_concurrent_wave_meets_before_timing_and_keeps_busy_until_every_process_is_done(tmp_path):
    """--concurrent: no process times a layer while its neighbour is still starting, and none stops while
    another still times (a small model's profile lasts no longer than importing torch)."""
    import threading
    import time

    from heterps_cli.profiling import processes

    threading.Timer(0.3, lambda: (tmp_path / "ready-1").touch()).start()
    start = time.monotonic()
    processes._meet(tmp_path, 0, 2)
    assert time.monotonic() - start >= 0.25 and (tmp_path / "ready-0").exists()
    threading.Timer(0.3, lambda: (tmp_path / "done-1").touch()).start()
    start = time.monotonic()
    processes._busy_until_all_done(tmp_path, 0, 2, measure.load_model("mlp", 4), "cpu")
    assert time.monotonic() - start >= 0.25 and (tmp_path / "done-0").exists()
