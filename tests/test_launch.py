"""heterps launch: the torchrun commands and the Slurm script of a placed plan, checked against its
placement; and the single-node command run for real here (torchrun itself, not heterps run's own launcher)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys

import pytest
import yaml

from heterps_cli.cli.app import app
from heterps_cli.formats import load_plan
from heterps_cli.runtime import single_process_losses
from heterps_cli.runtime.placement import per_node, processes
from tests.helpers import ROOT, runner
from tests.test_run_command import MLP_LAYERS, session_processes, write_plan

BUNDLED = ROOT / "docs/plans/ctr-aws-p3.yaml"


def test_placed_processes_are_every_plan_rank_once_node_by_node():
    plan, _ = load_plan(str(BUNDLED))
    order = processes(plan.stages)
    world = sum(s.replicas for s in plan.stages)
    assert sorted(p.rank for p in order) == list(range(world))  # a permutation of the plan's ranks
    # Independently, from the plan file: which plan ranks each node holds (ranks go stage by stage,
    # a stage's replicas fill its nodes in the order the plan lists them).
    expected: dict[str, set[int]] = {}
    first = 0
    for s in plan.stages:
        rank = first
        for node, n in s.nodes.items():
            expected.setdefault(node, set()).update(range(rank, rank + n))
            rank += n
        first += s.replicas
    got: dict[str, set[int]] = {}
    for p in order:
        got.setdefault(p.node, set()).add(p.rank)
    assert got == expected
    nodes = [p.node for p in order]
    assert nodes == sorted(nodes, key=nodes.index), "each node's processes are contiguous (torchrun's ranks)"
    for node in got:  # a replica's GPU is its place among the node's replicas of its type
        for resource in {p.resource for p in order if p.node == node}:
            assert [p.device_index for p in order if p.node == node and p.resource == resource] == list(
                range(sum(1 for p in order if p.node == node and p.resource == resource))
            )


def test_launch_files_start_what_the_plan_places_on_each_node(tmp_path):
    out = tmp_path / "launch"
    result = runner.invoke(
        app, ["launch", str(BUNDLED), "-o", str(out), "--map", "v100=cuda", "--master-addr", "10.0.0.1"]
    )
    assert result.exit_code == 0, result.output
    plan = yaml.safe_load(BUNDLED.read_text())
    placed: dict[str, int] = {}
    for s in plan["stages"]:
        for node, n in s["nodes"].items():
            placed[node] = placed.get(node, 0) + n
    scripts = sorted(out.glob("node-*.sh"))
    assert len(scripts) == len(placed) == 2
    for i, (node, n) in enumerate(placed.items()):
        text = (out / f"node-{i}.sh").read_text()
        assert f"node {i} of 2: {node}" in text and os.access(out / f"node-{i}.sh", os.X_OK)
        command = text.strip().splitlines()[-1]
        assert command.startswith("torchrun --nnodes 2 ")
        assert f"--node-rank {i} " in command and f"--nproc-per-node {n} " in command
        assert "--master-addr 10.0.0.1 --master-port 29500" in command
        assert f"-m heterps_cli run {BUNDLED} --placed --map v100=cuda" in command
    sbatch = (out / "launch.sbatch").read_text()
    assert "#SBATCH --nodes=2" in sbatch and sbatch.startswith("#!/bin/bash")
    assert re.findall(r"(\d)\) NPROC=(\d+) ;;", sbatch) == [(str(i), str(n)) for i, n in enumerate(placed.values())]
    assert sum(placed.values()) == sum(s["replicas"] for s in plan["stages"])
    assert per_node(load_plan(str(BUNDLED))[0].stages) == placed


def test_placed_is_for_torchrun_and_a_plan_placed_on_nodes(tmp_path):
    plan = write_plan(tmp_path / "plan.json", [("cpu", 1, MLP_LAYERS)])
    result = runner.invoke(app, ["run", str(plan), "--placed"])
    assert result.exit_code == 2 and "--placed is for a run under torchrun" in " ".join(result.output.split())
    broken = yaml.safe_load(BUNDLED.read_text())
    broken["stages"][0]["nodes"] = {"p3.2xlarge#1": 1}  # fewer than the stage's replicas
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(broken))
    result = runner.invoke(app, ["launch", str(path), "-o", str(tmp_path / "out")])
    shown = " ".join(result.output.split())
    assert result.exit_code == 2 and "does not place every replica on a node" in shown
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # starts torchrun and two training processes: about 15 s
def test_the_single_node_launch_file_runs_under_torchrun_and_matches_one_process(tmp_path):
    plan_path = write_plan(tmp_path / "plan.json", [("cpu", 1, MLP_LAYERS[:4]), ("cpu2", 1, MLP_LAYERS[4:])])
    plan = json.loads(plan_path.read_text())
    plan["rental"] = {"here": 1}
    for stage in plan["stages"]:
        stage["nodes"] = {"here#1": 1}
    plan_path.write_text(json.dumps(plan))
    out = tmp_path / "launch"
    report = tmp_path / "report.json"
    made = runner.invoke(app, ["launch", str(plan_path), "-o", str(out), "--model", "mlp", "--map", "cpu2=cpu",
                               "--steps", "3"])  # fmt: skip
    assert made.exit_code == 0, made.output
    script = (out / "node-0.sh").read_text()
    assert "torchrun --standalone --nnodes 1 --nproc-per-node 2 -m heterps_cli run" in script
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ.get('PATH', '')}"}
    command = script.strip().splitlines()[-1] + f" --warmup 0 --out {report}"
    process = subprocess.Popen(
        ["sh", "-c", command], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = process.communicate(timeout=240)
    finally:
        for pid in session_processes(process.pid) if os.path.exists("/proc") else []:
            os.kill(pid, signal.SIGKILL)
    assert process.returncode == 0, stderr[-3000:]
    measured = json.loads(report.read_text())
    assert measured["processes"] == 2 and len(measured["stages"]) == 2
    reference = single_process_losses("mlp", 64 * 16, 3)  # the plan's default of 16 micro-batches for 2 stages
    assert max(abs(a - b) for a, b in zip(measured["losses"], reference)) < 1e-5


@pytest.mark.slow  # two torchrun "nodes" on this machine, meeting over loopback: about 20 s
def test_the_two_node_launch_files_run_as_two_nodes_over_loopback_and_match_one_process(tmp_path):
    """Each node's command, as `heterps launch` writes it, started as its own torchrun on this machine
    (node 0 hosting the rendezvous at 127.0.0.1): the multi-node path end to end, short of two machines."""
    plan_path = write_plan(tmp_path / "plan.json", [("cpu", 1, MLP_LAYERS[:4]), ("cpu2", 1, MLP_LAYERS[4:])])
    plan = json.loads(plan_path.read_text())
    plan["rental"] = {"box": 2}
    plan["stages"][0]["nodes"], plan["stages"][1]["nodes"] = {"box#1": 1}, {"box#2": 1}
    plan_path.write_text(json.dumps(plan))
    with socket.socket() as probe:  # a free port for the rendezvous
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out, report = tmp_path / "launch", tmp_path / "report.json"
    made = runner.invoke(app, ["launch", str(plan_path), "-o", str(out), "--model", "mlp", "--map", "cpu2=cpu",
                               "--steps", "3", "--master-addr", "127.0.0.1", "--master-port", str(port)])  # fmt: skip
    assert made.exit_code == 0, made.output
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ.get('PATH', '')}"}
    started = []
    try:
        for i in range(2):
            command = (out / f"node-{i}.sh").read_text().strip().splitlines()[-1]
            assert f"--nnodes 2 --node-rank {i} " in command and "--nproc-per-node 1 " in command
            started.append(
                subprocess.Popen(
                    ["sh", "-c", command + f" --warmup 0 --out {report}"],
                    cwd=tmp_path,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    start_new_session=True,
                )  # fmt: skip
            )
        outputs = [p.communicate(timeout=240) for p in started]
    finally:
        for p in started:
            for pid in session_processes(p.pid) if os.path.exists("/proc") else []:
                os.kill(pid, signal.SIGKILL)
    for p, (_, stderr) in zip(started, outputs):
        assert p.returncode == 0, stderr[-3000:]
    measured = json.loads(report.read_text())  # written by plan rank 0, on node 0
    assert measured["processes"] == 2 and len(measured["stages"]) == 2
    reference = single_process_losses("mlp", 64 * 16, 3)
    assert max(abs(a - b) for a, b in zip(measured["losses"], reference)) < 1e-5
