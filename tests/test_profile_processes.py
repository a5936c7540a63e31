"""heterps profile over several processes: --processes (each layer's median over fresh processes),
--concurrent (processes side by side, one per core), and every process ended on failure and Ctrl-C."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from heterps_cli.cli.app import app
from heterps_cli.errors import InputError
from heterps_cli.loading import load_profile
from heterps_cli.profiling import measure
from heterps_cli.profiling.processes import combine
from tests.helpers import children, profile_cli, runner, session_processes


@pytest.mark.slow
def test_processes_take_each_layers_median_over_fresh_processes(factory, tmp_path):
    out = tmp_path / "p.yaml"
    profile_cli(
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
    early = profile_cli(
        [f"{factory}:broken_forward", "--as", "cpu", "--batch-size", "4", "--processes", "2", "-o", "-"], expect=2
    )
    assert "the model's forward pass failed: RuntimeError: shapes do not match" in " ".join(early.output.split())
    monkeypatch.setenv("HETERPS_TEST_PID", str(os.getpid()))
    result = profile_cli(
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
    result = profile_cli([f"{factory}:small", "--as", "cpu", "--batch-size", "8", "--out", str(out), *extra], expect=2)
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
