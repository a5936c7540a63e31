"""heterps launch: the torchrun commands and the Slurm script of a placed plan, checked against its
placement; and the single-node command run for real here (torchrun itself, not heterps run's own launcher)."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys

import pytest
import torch
import yaml

from heterps_cli.cli.app import app
from heterps_cli.loading import load_plan
from heterps_cli.runtime import single_process_losses
from heterps_cli.runtime.placement import per_node, processes
from tests.helpers import (
    MLP_LAYERS,
    PLACED,
    PLACED_MAP,
    ROOT,
    VGG16_TASK,
    run_in_session,
    runner,
    session_processes,
    write_plan,
)

BUNDLED = PLACED
CLASSIFY = ROOT / "docs/guide/classify.py"


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
    result = runner.invoke(app, ["launch", str(BUNDLED), "-o", str(out), *PLACED_MAP, "--master-addr", "10.0.0.1"])
    assert result.exit_code == 0, result.output
    plan = yaml.safe_load(BUNDLED.read_text())
    placed: dict[str, int] = {}
    for s in plan["stages"]:
        for node, n in s["nodes"].items():
            placed[node] = placed.get(node, 0) + n
    scripts = sorted(out.glob("node-*.sh"))
    assert len(scripts) == len(placed) == 5
    for i, (node, n) in enumerate(placed.items()):
        text = (out / f"node-{i}.sh").read_text()
        assert f"node {i} of 5: {node}" in text and os.access(out / f"node-{i}.sh", os.X_OK)
        command = text.strip().splitlines()[-1]
        assert command.startswith("torchrun --nnodes 5 ")
        assert f"--node-rank {i} " in command and f"--nproc-per-node {n} " in command
        assert "--master-addr 10.0.0.1 --master-port 29500" in command
        assert f"-m heterps_cli run {out / 'plan.yaml'} --placed --map l4=cuda --map v100-16gb=cuda" in command
        assert "export OMP_NUM_THREADS=1\nexport TORCH_NCCL_ASYNC_ERROR_HANDLING=1\n" in text
    assert (out / "plan.yaml").read_bytes() == BUNDLED.read_bytes()  # the copy every node runs
    sbatch = (out / "launch.sbatch").read_text()
    assert sbatch.startswith("#!/bin/bash")
    gpus = {}  # independently: the GPU replicas the plan puts on each node
    for s in plan["stages"]:
        for node, n in s["nodes"].items():
            gpus[node] = gpus.get(node, 0) + (n if s["resource"] in ("l4", "v100-16gb") else 0)
    # a heterogeneous job: one component per run of one node kind, each asking for its kind
    names = list(placed)
    runs = [(kind, len(list(group))) for kind, group in itertools.groupby(n.rpartition("#")[0] for n in names)]
    blocks = sbatch.split("#SBATCH hetjob\n")
    assert len(blocks) == len(runs) == 2
    first = 0
    for k, ((kind, count), block) in enumerate(zip(runs, blocks)):
        nodes = names[first : first + count]
        assert f"#SBATCH --nodes={count}\n" in block and f"#SBATCH --constraint={kind}\n" in block
        assert f"#SBATCH --gres=gpu:{max(gpus[n] for n in nodes)}\n" in block
        assert f"#SBATCH --cpus-per-task={max(placed[n] for n in nodes)}\n" in block
        step = sbatch.split(f"srun --het-group={k} ")[1].split("steps+=")[0]
        cases = re.findall(r"(\d)\) NODE=(\d+) NPROC=(\d+) ;;", step)
        assert cases == [(str(j), str(first + j), str(placed[n])) for j, n in enumerate(nodes)]
        first += count
    assert "#SBATCH --time=" in blocks[0] and f"#SBATCH --output={out}/slurm-%j.out" in blocks[0]
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST_HET_GROUP_0"' in sbatch
    assert sum(placed.values()) == sum(s["replicas"] for s in plan["stages"])
    assert per_node(load_plan(str(BUNDLED))[0].stages) == placed


def test_placed_is_for_torchrun_and_a_plan_placed_on_nodes(tmp_path):
    plan = write_plan(tmp_path / "plan.json", [("cpu", 1, MLP_LAYERS)])
    result = runner.invoke(app, ["run", str(plan), "--placed"])
    assert result.exit_code == 2 and "--placed is for a run under torchrun" in " ".join(result.output.split())
    broken = yaml.safe_load(BUNDLED.read_text())
    broken["stages"][0]["nodes"] = {"g6.24xlarge#1": 1}  # fewer than the stage's replicas
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(broken))
    result = runner.invoke(app, ["launch", str(path), "-o", str(tmp_path / "out"), *PLACED_MAP])
    shown = " ".join(result.output.split())
    assert result.exit_code == 2 and "stage 0 places 1 l4 replicas on nodes but has" in shown, shown
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
                               "--steps", "3", "--warmup", "0", "--report", str(report)])  # fmt: skip
    assert made.exit_code == 0, made.output
    script = (out / "node-0.sh").read_text()
    assert "torchrun --standalone --nnodes 1 --nproc-per-node 2 -m heterps_cli run" in script
    assert "MASTER_ADDR:?" not in script  # one node: no address to give
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ.get('PATH', '')}"}
    code, _, stderr = run_in_session(["sh", str(out / "node-0.sh")], env=env, cwd="/")
    assert code == 0, stderr[-3000:]
    measured = json.loads(report.read_text())
    assert measured["processes"] == 2 and len(measured["stages"]) == 2
    reference = single_process_losses("mlp", 64 * 16, 3)  # the plan's default of 16 micro-batches for 2 stages
    assert max(abs(a - b) for a, b in zip(measured["losses"], reference)) < 1e-5


@pytest.mark.slow  # two torchrun "nodes" on this machine, meeting over loopback: about 30 s
def test_the_two_node_launch_scripts_train_a_task_as_two_nodes_and_match_one_process(tmp_path):
    """Each node's script, as `heterps launch` writes it, started whole as its own "node" on this machine
    (MASTER_ADDR=127.0.0.1, node 0 hosting the rendezvous): the user's task trains to completion, with
    the losses of one process training the same model on the same data in the same order."""
    out, report = _two_node_launch(tmp_path, first_tp=None)
    outputs = run_node_scripts(out, 2, {"CLASSIFY_DATA": str(tmp_path / "data")})
    measured = json.loads(report.read_text())  # written by plan rank 0, on node 0
    assert measured["processes"] == 2 and measured["task"] == f"{CLASSIFY}:task"
    reference, weights = _task_reference(tmp_path / "data", 32 * 16, 6)
    assert len(measured["losses"]) == 6
    assert max(abs(a - b) for a, b in zip(measured["losses"], reference)) < 1e-5
    assert "step 6/6: loss" in outputs[1][1]  # the last stage, on node 1, says each step's loss
    saved = {**torch.load(tmp_path / "ck/step-000006/stage-0.pt")["model"]}
    saved.update({str(int(k.split(".")[0]) + 3) + k[k.index("."):]: v
                  for k, v in torch.load(tmp_path / "ck/step-000006/stage-1.pt")["model"].items()})  # fmt: skip
    assert saved.keys() == weights.keys()
    assert all(torch.allclose(saved[k], weights[k], atol=1e-5) for k in weights)


@pytest.mark.slow  # two torchrun "nodes" on this machine, three processes
def test_a_tensor_parallel_stage_launched_on_a_node_trains_as_one_process(tmp_path):
    """Section 1h on nodes: stage 0 at tp 2, its two shards on box#1 (gloo here, NCCL on GPUs), stage 1 on
    box#2, each node's script as launch writes it: the losses of one process within 1e-5, and the checkpoint's
    model.pt is the one process's weights, its shards joined."""
    out, report = _two_node_launch(tmp_path, first_tp=2)
    assert "--nproc-per-node 2" in (out / "node-0.sh").read_text()
    run_node_scripts(out, 2, {"CLASSIFY_DATA": str(tmp_path / "data")})
    measured = json.loads(report.read_text())
    assert measured["processes"] == 3
    reference, weights = _task_reference(tmp_path / "data", 32 * 16, 6)
    worst = max(abs(a - b) / abs(b) for a, b in zip(measured["losses"], reference))
    assert len(measured["losses"]) == 6 and worst < 1e-5, (measured["losses"], reference)
    saved = torch.load(tmp_path / "ck/step-000006/model.pt", weights_only=True)
    assert saved.keys() == weights.keys()
    assert all(torch.allclose(saved[k], weights[k], rtol=1e-4, atol=1e-5) for k in weights)


def _two_node_launch(tmp_path, first_tp: int | None):
    """The classify task's two-stage plan placed on box#1 and box#2 (its first stage at ``first_tp``), and
    `heterps launch`'s scripts of it for 6 steps with checkpoints and a report: (the scripts' folder, the
    report's path)."""
    plan_path = write_plan(tmp_path / "plan.json", [("cpu", 1, ["0", "1", "2"]), ("cpu2", 1, ["3", "4"])], 32)
    plan = json.loads(plan_path.read_text())
    plan["rental"] = {"box": 2}
    plan["stages"][0]["nodes"], plan["stages"][1]["nodes"] = {"box#1": 1}, {"box#2": 1}
    if first_tp is not None:
        plan["stages"][0]["tp"] = first_tp
    plan_path.write_text(json.dumps(plan))
    out, report = tmp_path / "launch", tmp_path / "report.json"
    made = runner.invoke(app, ["launch", str(plan_path), "-o", str(out), "--task", f"{CLASSIFY}:task", "--map",
                               "cpu2=cpu", "--steps", "6", "--warmup", "0", "--master-port", str(free_port()),
                               "--checkpoint-dir", str(tmp_path / "ck"), "--report", str(report)])  # fmt: skip
    assert made.exit_code == 0, made.output
    return out, report


def run_node_scripts(out, count: int, env: dict) -> list[tuple[str, str]]:
    """Start node scripts 0..count-1 that `heterps launch` wrote in ``out``, each as its own "node" on this
    machine (MASTER_ADDR=127.0.0.1, ``env`` added), wait for all, end every process they left, and
    return each one's (stdout, stderr) once all exited 0."""
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ.get('PATH', '')}", **env}
    env["MASTER_ADDR"] = "127.0.0.1"
    started = []
    try:
        for i in range(count):
            started.append(
                subprocess.Popen(
                    ["sh", str(out / f"node-{i}.sh")],
                    cwd="/",  # the scripts name everything by absolute path
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
    return outputs


def free_port() -> int:
    """A port free for a rendezvous on this machine."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _task_reference(data, samples: int, steps: int):
    from heterps_cli.runtime import task_losses

    before = os.environ.get("CLASSIFY_DATA")
    os.environ["CLASSIFY_DATA"] = str(data)
    try:
        return task_losses(f"{CLASSIFY}:task", samples, steps)
    finally:
        if before is None:
            del os.environ["CLASSIFY_DATA"]
        else:
            os.environ["CLASSIFY_DATA"] = before


@pytest.mark.parametrize(
    ("maps", "expected"),
    [
        (["--map", "l4=cuda"], "no device for resource type v100-16gb"),
        ([*PLACED_MAP, "--map", "v1OO=cuda"], "the plan uses no resource type v1OO: its types are"),
        (["--map", "l4=gpu"], "is not TYPE=cpu, TYPE=cuda or TYPE=cuda:N"),
    ],
)
def test_launch_needs_a_device_for_every_gpu_type_and_no_other(tmp_path, maps, expected):
    out = tmp_path / "launch"
    result = runner.invoke(app, ["launch", str(BUNDLED), "-o", str(out), *maps])
    assert result.exit_code == 2 and expected in " ".join(result.output.split()), result.output
    assert not out.exists()


def test_launch_forwards_the_run_and_writes_absolute_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mytask.py").write_text(VGG16_TASK)
    made = runner.invoke(app, ["launch", str(BUNDLED), "-o", "out", *PLACED_MAP, "--task", "mytask.py:task",
                               "--checkpoint-dir", "ck", "--checkpoint-every", "5", "--resume", "--steps", "40",
                               "--warmup", "1", "--threads", "4", "--report", "r.json", "--ifname", "ib0"])  # fmt: skip
    assert made.exit_code == 0, made.output
    text = (tmp_path / "out/node-1.sh").read_text()
    command = text.strip().splitlines()[-1]
    for part in (f"run {tmp_path}/out/plan.yaml --placed", f"--task {tmp_path}/mytask.py:task", "--steps 40",
                 "--warmup 1", "--threads 4", f"--checkpoint-dir {tmp_path}/ck", "--checkpoint-every 5",
                 "--resume", f"--out {tmp_path}/r.json"):  # fmt: skip
        assert part in command, part
    for line in ("export OMP_NUM_THREADS=4", "export GLOO_SOCKET_IFNAME=ib0", "export NCCL_SOCKET_IFNAME=ib0"):
        assert line in text.splitlines() and line in (tmp_path / "out/launch.sbatch").read_text().splitlines()
    bad = runner.invoke(app, ["launch", str(BUNDLED), "-o", "out2", *PLACED_MAP, "--ifname", "a b"])
    assert bad.exit_code == 2 and "not a network interface name" in bad.output
