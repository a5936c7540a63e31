"""heterps run: a plan trained on real processes (gloo on this CPU), checked against one process.

The runs take seconds each, so they are marked slow (.ci/run runs them); the layout's
brute-force check and the refusals before any process starts run every time. What a run does when
a worker dies, raises or is interrupted is in tests/test_run_failures.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from heterps_cli.cli.app import app
from heterps_cli.runtime import single_process_losses
from heterps_cli.runtime.layout import layout
from heterps_cli.runtime.report import split_sync
from tests.helpers import MLP_LAYERS, heterps, write_plan

# -- the layout: every sample goes to exactly one replica, and sends match receives -------------------


@settings(max_examples=200, deadline=None)
@given(
    replicas=st.lists(st.integers(1, 5), min_size=1, max_size=4),
    batch=st.integers(1, 40),
    micro=st.integers(1, 10),
)
def test_layout_sends_each_sample_once_to_its_owner(replicas, batch, micro):
    if max(replicas) > batch:
        return
    lay = layout([(f"t{i}", k, [f"l{i}"]) for i, k in enumerate(replicas)], batch, micro)
    micro_bounds = [lay.micro(j) for j in range(lay.micro_batches)]
    assert [i for a, b in micro_bounds for i in range(a, b)] == list(range(batch * micro))  # a step's samples
    for j in range(lay.micro_batches):
        for stage in lay.stages:
            owned = sorted(i for r in range(stage.replicas) for i in range(*lay.shard(stage, r, j)))
            assert owned == list(range(*lay.micro(j)))  # each sample of the micro-batch, once
            assert all(lay.shard(stage, r, j)[1] > lay.shard(stage, r, j)[0] for r in range(stage.replicas))
        for left, right in zip(lay.stages, lay.stages[1:]):
            sent = {
                (left.first_of(r), right.first_of(d), lo, hi)
                for r in range(left.replicas)
                for d, lo, hi in lay.overlapping(left, r, right, j)
            }
            got = {
                (left.first_of(src), right.first_of(r), lo, hi)
                for r in range(right.replicas)
                for src, lo, hi in lay.overlapping(right, r, left, j)
            }
            assert sent == got
            for dst_r in range(right.replicas):  # brute force: who owns each sample on both sides
                for i in range(*lay.shard(right, dst_r, j)):
                    owner = next(
                        r for r in range(left.replicas) if lay.shard(left, r, j)[0] <= i < lay.shard(left, r, j)[1]
                    )
                    assert any(
                        left.first_of(src) == left.first_rank + owner and lo <= i < hi
                        for src, lo, hi in lay.overlapping(right, dst_r, left, j)
                    )


# -- training: the losses of one process -------------------------------------------------------------


def _losses(report: dict) -> list[float]:
    return report["losses"]


@pytest.mark.slow
def test_two_stage_run_matches_one_process_and_reports(tmp_path):
    plan = write_plan(tmp_path / "plan.json", [("cpu", 1, MLP_LAYERS[:4]), ("cpu2", 1, MLP_LAYERS[4:])])
    out = tmp_path / "report.json"
    done = heterps(
        "run", str(plan), "--model", "mlp", "--map", "cpu2=cpu", "--steps", "5", "--warmup", "0", "--out", str(out)
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    reference = single_process_losses("mlp", 64 * 16, 5)  # 16 micro-batches: the default for 2 stages
    assert len(_losses(report)) == 5
    assert max(abs(a - b) for a, b in zip(_losses(report), reference)) < 1e-5
    assert report["processes"] == 2 and len(report["stages"]) == 2
    assert report["micro_batches"] == 16
    assert report["throughput"] > 0 and report["ratio"] == pytest.approx(report["throughput"] / 6400)
    for stage in report["stages"]:
        assert stage["compute_s"] > 0 and stage["wait_s"] >= 0 and stage["idle_s"] >= 0 and stage["update_s"] > 0
    assert "measured/predicted" in done.stdout and "bottleneck: stage" in done.stdout


def test_the_last_replica_to_reach_the_all_reduce_gives_sync_and_the_others_wait_the_difference():
    """No barrier before the all-reduce (a trainer has none): per step, the group's shortest all-reduce is
    the collective itself, and what the others measured beyond it was waiting for the slowest replica.
    Groups are a stage's replicas of one shard; a stage of one replica keeps its own."""

    def rank(stage, replica, sync, wait, tp_rank=0):
        return {"stage": stage, "replica": replica, "tp_rank": tp_rank, "sync": sync, "wait": wait}

    ranks = [
        rank(0, 0, [0.0, 0.0], [0.5, 0.5]),
        rank(1, 0, [3.0, 1.0], [0.0, 0.25], tp_rank=0),
        rank(1, 0, [9.0, 9.0], [0.0, 0.0], tp_rank=1),
        rank(1, 1, [1.0, 2.0], [0.5, 0.0], tp_rank=0),
        rank(1, 1, [8.0, 10.0], [0.0, 0.0], tp_rank=1),
    ]
    split = split_sync(ranks)
    assert [r["sync"] for r in split] == [[0.0, 0.0], [1.0, 1.0], [8.0, 9.0], [1.0, 1.0], [8.0, 9.0]]
    assert [r["wait"] for r in split] == [[0.5, 0.5], [2.0, 0.25], [1.0, 0.0], [0.5, 1.0], [0.0, 1.0]]
    assert ranks[1]["sync"] == [3.0, 1.0]  # the workers' own measurements are left as they were


@pytest.mark.slow
def test_replicas_of_a_stage_split_the_batch_and_still_match(tmp_path):
    """3 processes: stage 1 has 2 replicas, so its shards differ from stage 0's and gradients are summed."""
    plan = write_plan(tmp_path / "plan.json", [("cpu", 1, MLP_LAYERS[:3]), ("cpu2", 2, MLP_LAYERS[3:])], batch_size=30)
    done = heterps(
        "run", str(plan), "--model", "mlp", "--map", "cpu2=cpu", "--steps", "5", "--warmup", "0",
        "--micro-batches", "4", "--max-processes", "3", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    reference = single_process_losses("mlp", 30 * 4, 5)
    assert max(abs(a - b) for a, b in zip(_losses(report), reference)) < 1e-5
    assert [s["replicas"] for s in report["stages"]] == [1, 2] and report["processes"] == 3
    replicated = report["stages"][1]
    assert replicated["sync_s"] > 0 and 0 < replicated["baseline_memory_gb"] < replicated["peak_memory_gb"]
    assert report["losses"][-1] < report["losses"][0]  # it trains


@pytest.mark.slow
def test_a_plan_from_heterps_plan_runs(tmp_path):
    """The whole path: a profile with two CPU types, heterps plan, then heterps run of that plan."""
    layers = []
    for i, name in enumerate(MLP_LAYERS):
        fast_first = i < 4
        layers.append(
            {
                "name": name,
                "type": "fc" if i % 2 == 0 else "activation",
                "input_size": 4096,
                "weight_size": 4_000_000 if i % 2 == 0 else 0,
                "times": {
                    "cpu": {"oct": 0.004 if fast_first else 0.02, "odt": 0.0, "alpha": 0.8, "beta": 0},
                    "cpu2": {"oct": 0.02 if fast_first else 0.004, "odt": 0.0, "alpha": 0.8, "beta": 0},
                },
            }
        )
    import yaml

    (tmp_path / "mlp.yaml").write_text(yaml.safe_dump({"model": "mlp", "batch_size": 64, "layers": layers}))
    (tmp_path / "two.yaml").write_text(
        "cluster: two\nresources:\n  cpu: {price: 1.0, limit: 1}\n  cpu2: {price: 1.5, limit: 1}\n"
    )
    planned = heterps(
        "plan", str(tmp_path / "mlp.yaml"), str(tmp_path / "two.yaml"), "--objective", "time", "--samples", "1000",
        "--scheduler", "exact", "--out", str(tmp_path / "plan.yaml"),
    )  # fmt: skip
    assert planned.returncode == 0, planned.stderr
    done = heterps("run", str(tmp_path / "plan.yaml"), "--model", "mlp", "--map", "cpu2=cpu", "--steps", "2", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert [(s["resource"], s["first"], s["last"]) for s in report["stages"]] == [("cpu", "0", "3"), ("cpu2", "4", "6")]
    assert report["predicted_throughput"] > 0 and report["stages"][0]["predicted_compute_s"] > 0


def test_gradients_live_in_one_bucket_per_dtype_that_backward_adds_into():
    import torch

    from heterps_cli.runtime.worker import gradient_buckets

    first, second = torch.nn.Linear(3, 2), torch.nn.Linear(2, 1).double()
    params = [*first.parameters(), *second.parameters()]
    buckets = gradient_buckets(params, torch.device("cpu"))
    assert [b.dtype for b in buckets] == [torch.float32, torch.float64]
    for _ in range(2):  # two micro-batches: the second adds into the first's gradients, in place
        second(first(torch.ones(4, 3)).double()).sum().backward()
    for bucket, dtype in zip(buckets, (torch.float32, torch.float64)):
        mine = [p for p in params if p.dtype == dtype]
        assert torch.equal(bucket, torch.cat([p.grad.reshape(-1) for p in mine]))  # the views are the gradients
    assert float(buckets[1][-1]) == 8.0  # the last bias: 4 samples, 2 micro-batches


# -- bad input: one paragraph, exit 2, before any process starts -------------------------------------


@pytest.mark.parametrize(
    ("stages", "args", "message"),
    [
        ([("cpu", 1, ["0", "1", "9"]), ("cpu", 1, MLP_LAYERS[3:])], [], "layer '9' is not a layer of the model"),
        ([("cpu", 1, MLP_LAYERS[:4]), ("cpu", 1, MLP_LAYERS[5:])], [], "differ from the model's chain at position 4"),
        ([("cpu", 1, MLP_LAYERS[:4]), ("gpu", 1, MLP_LAYERS[4:])], [], "no device for resource type gpu"),
        ([("cpu", 1, MLP_LAYERS[:4]), ("gpu", 1, MLP_LAYERS[4:])], ["--map", "gpu"], "is not TYPE=cpu"),
        ([("cpu", 3, MLP_LAYERS)], ["--max-processes", "2"], "more than --max-processes 2"),
    ],
)
def test_bad_runs_are_refused_before_starting(runner, tmp_path, stages, args, message):
    plan = write_plan(tmp_path / "plan.json", stages)
    result = runner.invoke(app, ["run", str(plan), "--model", "mlp", *args])
    assert result.exit_code == 2, result.output
    assert message in result.stderr and "Traceback" not in result.output
    said = [line for line in result.stderr.splitlines() if not line.startswith("heterps run: ")]  # its progress
    assert len(said) == 1 and said[0].startswith("error: ")


@pytest.mark.parametrize(
    ("stages", "devices", "gpus", "refused"),
    [
        ([[("gpu", 2)]], {"gpu": "cuda"}, 1, True),  # seen on an H100: NCCL's "Duplicate GPU detected"
        ([[("gpu", 2)]], {"gpu": "cuda"}, 2, False),
        ([[("gpu", 2)]], {"gpu": "cuda:1"}, 2, True),
        ([[("cpu", 1)], [("gpu", 2)]], {"cpu": "cpu", "gpu": "cuda"}, 2, False),  # ranks 1, 2: cuda:1, cuda:0
        ([[("a", 1)], [("b", 1)]], {"a": "cuda:0", "b": "cuda:0"}, 1, False),  # two stages: no all-reduce between
        ([[("cpu", 4)]], {"cpu": "cpu"}, 0, False),
        ([[("a", 1), ("b", 1)]], {"a": "cuda", "b": "cuda"}, 1, True),  # section 1i: one stage's two types
        ([[("a", 1), ("b", 1)]], {"a": "cuda", "b": "cuda"}, 2, False),
        ([[("a", 1), ("b", 1)]], {"a": "cpu", "b": "cuda:0"}, 1, False),  # with a CPU replica: gloo
    ],
)
def test_two_replicas_of_a_stage_on_one_gpu_are_refused(stages, devices, gpus, refused):
    from heterps_cli.errors import InputError
    from heterps_cli.runtime import check_gpus_unshared

    if refused:
        with pytest.raises(InputError, match="refuses two processes on one GPU"):
            check_gpus_unshared(stages, devices, gpus)
    else:
        check_gpus_unshared(stages, devices, gpus)


@pytest.mark.parametrize("model", ["transformer", "ctr"])
def test_a_model_that_is_not_a_chain_is_refused(runner, tmp_path, model):
    plan = write_plan(tmp_path / "plan.json", [("cpu", 1, ["embedding"])], model=model)
    result = runner.invoke(app, ["run", str(plan), "--model", model])
    assert result.exit_code == 2 and "is not a chain of the plan's layers" in result.stderr, result.output


@pytest.mark.slow
def test_the_plans_own_model_name_runs_without_model_and_a_stand_in_device_is_said(tmp_path):
    # A profile of mymodel.py:small names its model mymodel:small; --model mymodel:small failed
    # (No module named 'mymodel') under the console script, and --model was required.
    (tmp_path / "mymodel.py").write_text(
        textwrap.dedent(
            """
            import torch
            from torch import nn

            def small(batch_size):
                return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)), torch.randn(batch_size, 4)
            """
        )
    )
    plan = write_plan(tmp_path / "plan.json", [("cpu", 1, ["0", "1"]), ("a100", 1, ["2"])], batch_size=8)
    data = json.loads(plan.read_text())
    data["model"] = "mymodel:small"
    plan.write_text(json.dumps(data))
    done = subprocess.run(
        [shutil.which("heterps") or "heterps", "run", "plan.json", "--map", "a100=cpu", "--steps", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert done.returncode == 0, done.stderr
    shown = " ".join(done.stdout.split())
    assert "with mymodel:small" in shown and "measured end to end" in shown and "stage alone" in shown
    assert "note: a100 on cpu (--map): the plan predicts the hardware it was profiled on" in shown
