"""heterps run on a mixed stage (docs/spec.md section 1i): replicas of two types, each type's replicas
training their planned share of every micro-batch, train with the losses of one process."""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers import MLP_LAYERS, heterps, write_plan


def _mixed_plan(tmp_path, shares: tuple[int, int], replicas=(2, 1), degrees=(1, 1)):
    """mlp in two stages at micro-batch 16, 4 per step: stage 0 on ``replicas[0]`` ``cpu`` replicas at tp
    ``degrees[0]`` training ``shares[0]`` samples, joined by ``replicas[1]`` ``cpu2`` replicas at tp
    ``degrees[1]`` training ``shares[1]``; stage 1 on one ``cpu``."""
    stages = [("cpu", replicas[0], MLP_LAYERS[:4]), ("cpu", 1, MLP_LAYERS[4:])]
    path = write_plan(tmp_path / "plan.json", stages, batch_size=16)
    data = json.loads(path.read_text())
    data["stages"][1]["first"], data["stages"][1]["last"] = 4, len(MLP_LAYERS) - 1
    joined = {"resource": "cpu2", "replicas": replicas[1], "samples": shares[1], "compute_s": 0.01}
    data["stages"][0] |= {"samples": shares[0], "joined": [joined | ({"tp": degrees[1]} if degrees[1] > 1 else {})]}
    if degrees[0] > 1:
        data["stages"][0]["tp"] = degrees[0]
    units = {"cpu": replicas[0] * degrees[0] + 1, "cpu2": replicas[1] * degrees[1]}
    data |= {"global_batch": 64, "micro_batches": 4, "resources": units}
    path.write_text(json.dumps(data))
    return path


@pytest.mark.slow  # over a second here: the slow suite, which CI runs too
@pytest.mark.parametrize("shares", [(10, 6), (4, 12)])
def test_a_mixed_stage_trains_with_the_losses_of_one_process(tmp_path, shares):
    from heterps_cli.runtime import single_process_losses

    plan = _mixed_plan(tmp_path, shares)
    out = tmp_path / "report.json"
    args = ["run", str(plan), "--map", "cpu=cpu", "--map", "cpu2=cpu", "--steps", "3", "--warmup", "0"]
    done = heterps(*args, "--max-processes", "4", "--out", str(out))
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert report["processes"] == 4
    reference = single_process_losses("mlp", 64, 3)
    assert max(abs(a - b) for a, b in zip(report["losses"], reference)) < 1e-5


@pytest.mark.parametrize(
    ("shares", "replicas", "degrees"),
    [((10, 6), (1, 2), (2, 1)), pytest.param((6, 10), (2, 1), (1, 4), marks=pytest.mark.slow)],
)
@pytest.mark.slow  # over a second here: the slow suite, which CI runs too
def test_a_stage_whose_types_run_at_different_degrees_trains_with_the_losses_of_one_process(
    tmp_path, shares, replicas, degrees
):
    """Stage 0's own part sharded 2 ways beside two whole cpu2 replicas, and whole beside a cpu2 replica
    sharded 4 ways: each block of a sharded weight's gradient summed among its holders (section 1i), the
    losses of one process."""
    from heterps_cli.runtime import single_process_losses

    plan = _mixed_plan(tmp_path, shares, replicas, degrees)
    out = tmp_path / "report.json"
    args = ["run", str(plan), "--map", "cpu=cpu", "--map", "cpu2=cpu", "--steps", "4", "--warmup", "0", "--lr", "0.5"]
    done = heterps(*args, "--max-processes", "8", "--out", str(out), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["processes"] == replicas[0] * degrees[0] + replicas[1] * degrees[1] + 1
    reference = single_process_losses("mlp", 64, 4, lr=0.5)  # a step large enough to tell a wrong sum
    assert max(abs(a - b) for a, b in zip(report["losses"], reference)) < 1e-5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_a_stage_mixing_a_gpu_and_the_cpu_trains_with_the_losses_of_one_process(tmp_path):
    """The GPU's two replicas take 5 samples each, the CPU's one 6; their gradients sum over gloo on the
    hosts (section 1i), and stage 1 runs on the GPU: the losses of one process on the CPU."""
    from heterps_cli.runtime import single_process_losses

    plan = _mixed_plan(tmp_path, (10, 6))
    out = tmp_path / "report.json"
    args = ["run", str(plan), "--map", "cpu=cuda", "--map", "cpu2=cpu", "--steps", "3", "--warmup", "0"]
    done = heterps(*args, "--max-processes", "4", "--out", str(out), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    reference = single_process_losses("mlp", 64, 3)
    assert max(abs(a - b) for a, b in zip(json.loads(out.read_text())["losses"], reference)) < 1e-4


@pytest.mark.slow  # over a second here: the slow suite, which CI runs too
def test_a_mixed_stage_whose_shares_miss_the_batch_is_refused_naming_it(tmp_path):
    plan = _mixed_plan(tmp_path, (10, 5))
    done = heterps("run", str(plan), "--map", "cpu=cpu", "--map", "cpu2=cpu", "--steps", "1")
    assert done.returncode == 2
    said = " ".join(done.stderr.split())
    assert "stages[0].samples" in said and "15 samples" in said and "Traceback" not in said


@pytest.mark.slow  # over a second here: the slow suite, which CI runs too
def test_a_joined_part_at_a_degree_with_nothing_to_shard_is_refused_naming_it(tmp_path):
    """Stage 1 holds one ReLU: its joined cpu2 replica at tp 2 has no pair of linear layers to shard."""
    plan = _mixed_plan(tmp_path, (10, 6), (2, 1), (1, 2))
    data = json.loads(plan.read_text())
    mixed, rest = data["stages"]
    data["stages"] = [
        {**rest, "layers": ["0"], "first": 0, "last": 0},
        {**mixed, "layers": ["1"], "first": 1, "last": 1},
        {**rest, "layers": MLP_LAYERS[2:], "first": 2, "last": len(MLP_LAYERS) - 1},
    ]
    plan.write_text(json.dumps(data))
    done = heterps("run", str(plan), "--map", "cpu=cpu", "--map", "cpu2=cpu", "--steps", "1", "--max-processes", "8")
    said = " ".join(done.stderr.split())
    assert done.returncode == 2 and "stages[1].joined[0].tp" in said and "no pair of linear layers" in said, said


@pytest.mark.slow  # over a second here: the slow suite, which CI runs too
def test_launch_starts_every_replica_of_a_mixed_stage(tmp_path):
    """One machine: torchrun starts the joined replica too (4 processes), and maps each type's device."""
    plan = _mixed_plan(tmp_path, (10, 6))
    out = tmp_path / "launch"
    done = heterps("launch", str(plan), "-o", str(out), "--model", "mlp", "--map", "cpu=cpu", "--map", "cpu2=cpu")
    assert done.returncode == 0, done.stderr
    script = (out / "node-0.sh").read_text()
    assert "--nproc-per-node 4" in script and "--map cpu2=cpu" in script


@pytest.mark.slow  # three runs of four processes, then of five: about 70 s
@pytest.mark.parametrize(
    ("replicas", "degrees", "files"),
    [
        ((2, 1), (1, 1), ["stage-0.pt", "stage-1.pt"]),
        ((1, 2), (2, 1), ["stage-0-shard-0.pt", "stage-0-shard-1.pt", "stage-0-tp1.pt", "stage-1.pt"]),
    ],
)
def test_a_mixed_run_resumes_to_the_uninterrupted_runs_losses(tmp_path, replicas, degrees, files):
    """A stage at two degrees checkpoints one replica of each (its own shards, the joined part's whole
    weights, named for its degree), and each replica resumes from its degree's files."""
    plan = _mixed_plan(tmp_path, (10, 6), replicas, degrees)
    common = ["run", str(plan), "--map", "cpu=cpu", "--map", "cpu2=cpu", "--warmup", "0", "--max-processes", "8",
              "--checkpoint-every", "2"]  # fmt: skip

    def trained(steps: int, folder: str, *more: str) -> list[float]:
        out = tmp_path / f"{folder}-{steps}.json"
        done = heterps(
            *common, "--steps", str(steps), "--checkpoint-dir", str(tmp_path / folder), "--out", str(out), *more
        )
        assert done.returncode == 0, done.stderr
        return json.loads(out.read_text())["losses"]

    whole = trained(6, "whole")
    trained(4, "cut")
    step = tmp_path / "cut" / "step-000004"
    assert sorted(p.name for p in step.glob("stage-*")) == files
    # model.pt: the first stage's shards joined are the weights its replica at degree 1 holds whole
    import torch

    joined = torch.load(step / "model.pt", weights_only=True)
    whole_file = step / ("stage-0-tp1.pt" if "stage-0-tp1.pt" in files else "stage-0.pt")
    for key, tensor in torch.load(whole_file, weights_only=True)["model"].items():
        assert torch.allclose(joined[key], tensor, rtol=1e-6, atol=1e-7), key
    resumed = trained(6, "cut", "--resume")
    assert resumed == whole[4:]


@pytest.mark.slow  # two torchrun "nodes" on this machine: about 20 s
def test_a_mixed_stage_placed_on_two_nodes_launches_and_trains_as_one_process(tmp_path):
    """Stage 0's two cpu replicas on node box#1, its joined cpu2 replica and stage 1 on box#2: the scripts
    `heterps launch` writes, each started as its own node, train with the losses of one process."""
    from heterps_cli.runtime import single_process_losses
    from tests.test_launch import free_port, run_node_scripts

    plan = _mixed_plan(tmp_path, (10, 6))
    data = json.loads(plan.read_text())
    data["rental"] = {"box": 2}
    data["stages"][0]["nodes"], data["stages"][1]["nodes"] = {"box#1": 2}, {"box#2": 1}
    data["stages"][0]["joined"][0]["nodes"] = {"box#2": 1}
    plan.write_text(json.dumps(data))
    out, report = tmp_path / "launch", tmp_path / "report.json"
    maps = ["--map", "cpu=cpu", "--map", "cpu2=cpu", "--master-port", str(free_port()), "--report", str(report)]
    made = heterps("launch", str(plan), "-o", str(out), "--model", "mlp", "--steps", "3", "--warmup", "0", *maps)
    assert made.returncode == 0, made.stderr
    assert "--nproc-per-node 2" in (out / "node-0.sh").read_text()
    assert "--nproc-per-node 2" in (out / "node-1.sh").read_text()
    run_node_scripts(out, 2, {})
    measured = json.loads(report.read_text())
    assert measured["processes"] == 4
    reference = single_process_losses("mlp", 64, 3)
    assert max(abs(a - b) for a, b in zip(measured["losses"], reference)) < 1e-5
