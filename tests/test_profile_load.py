"""A profile measures its own conditions: the cores other processes kept busy, the load average, the
noisy layers, an all-reduce the replicas waited in; and says when to profile again."""

from __future__ import annotations

import subprocess
import sys

import pytest

from heterps_cli.cli.app import app
from heterps_cli.profiling.load import Load, Snapshot, advice, between


def test_other_work_is_the_machine_s_busy_time_less_ours_over_the_wall_time():
    start = Snapshot(wall=100.0, busy=1000.0, ours=10.0, load=0.2)
    end = Snapshot(wall=110.0, busy=1025.0, ours=20.0, load=1.7)  # 25 busy seconds in 10 s, 10 of them ours
    load = between(start, end)
    assert load.others == pytest.approx(1.5) and (load.before, load.after) == (0.2, 1.7)
    assert between(start, Snapshot(110.0, None, 20.0, None)).others is None  # no /proc/stat: not measurable


def test_advice_names_each_sign_of_a_busy_machine_and_none_of_an_idle_one():
    idle = Load(others=0.1, before=0.0, after=0.1, cores=8)
    assert advice(idle, noisy=1, layers=10, paired_latency=1.2e-3, idle_latency=1.1e-3) == []
    busy = Load(others=1.9, before=2.0, after=2.1, cores=8)
    said = advice(busy, noisy=6, layers=10, paired_latency=53.3e-3, idle_latency=1.12e-3)
    assert len(said) == 3
    assert "1.90 cores busy" in said[0] and "6 of 10 layers are noisy" in said[1]
    assert "53.3 ms beyond its bytes against 1.12 ms on the idle link" in said[2]


@pytest.mark.slow  # a profile of several seconds beside a busy process: .ci/run runs it
def test_a_profile_beside_a_busy_process_says_to_profile_again(runner, tmp_path):
    out = tmp_path / "p.yaml"
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        result = runner.invoke(app, ["profile", "mlp", "--as", "cpu", "--batch-size", "16", "--link-gbps", "10",
                                     "--out", str(out)])  # fmt: skip
    finally:
        spinner.kill()
        spinner.wait()
    assert result.exit_code == 0, result.output
    shown = " ".join(result.output.split())
    assert "profile again: other processes kept" in shown
    text = out.read_text()
    assert "# machine: other processes kept" in text and "# profile again: other processes kept" in text
