"""docs/spec.md section 1h: each stage chooses its tensor-parallel degree among those profiled. Known
answers come from the enumeration oracle, which tries every degree of every stage on every cut,
replica vector and choice of recomputing stages."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from heterps_cli.cli.app import app
from tests.helpers import exact_against, plan_and_check, write_plan, write_yaml
from tests.oracle import assert_figures_are_the_oracles, pipeline_optimum, pipeline_optimum_on_nodes
from tests.strategies import SETTINGS
from tests.test_pipeline import pipelined

runner = CliRunner()


@st.composite
def sharded(draw):
    """A pipelined instance of at most three layers where most entries also give times at tp 2 (a
    little more than half the work, half the all-reduce), some at tp 4, and the layers one unit's
    share of their sizes there; forward times on some entries, so recomputation plays too, and update
    times on some, which a degree's entry gives or leaves to spec 1h's share."""
    profile, cluster = draw(pipelined(batches=(4,), max_limit=4))
    profile["layers"] = profile["layers"][:3]
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    four = draw(st.booleans())
    grow = float(draw(st.sampled_from([1.0, 16.0])))  # activations that make recomputation pay
    for layer in profile["layers"]:
        layer["activation_size"] = layer.get("activation_size", 0.0) * grow
        if layer.get("input_saved"):
            layer["input_saved"] *= grow
        degrees = [2, 4] if four else [2]
        layer["tp"] = {}
        for d in degrees:
            act = layer.get("activation_size", 0.0) * float(rng.choice([1.0 / d, 1.0]))
            layer["tp"][d] = {"weight_size": layer["weight_size"] / d, "activation_size": act}
            if layer.get("input_saved"):
                layer["tp"][d]["input_saved"] = min(layer["input_saved"], act)
        for entry in layer["times"].values():
            if rng.random() < 0.5:
                entry["forward"] = float(np.round(entry["oct"] * 0.3, 9))
            if rng.random() < 0.5:  # section 1d's optimiser step, which a degree's entry may leave out
                entry["update"] = float(np.round(entry["oct"] * 0.2, 9))
            if rng.random() < 0.2:
                continue
            entry["tp"] = {}
            for d in degrees:
                shard = {
                    "oct": float(np.round(entry["oct"] * rng.choice([0.55, 0.7, 1.2]) * 2 / d, 9)),
                    "odt": float(np.round(entry["odt"] / d, 9)),
                }
                if "update" in entry and rng.random() < 0.5:  # else spec 1h's: the tp-1 step on a unit's share
                    shard["update"] = float(np.round(entry["update"] * rng.choice([0.5, 1.0]) / d, 9))
                if "forward" in entry and rng.random() < 0.8:
                    shard["forward"] = float(np.round(shard["oct"] * 0.3, 9))
                entry["tp"][d] = shard
    for res in cluster["resources"].values():  # section 1h: a node's units behind one network link
        if res.get("bandwidth_gbps") and rng.random() < 0.3:
            res["shared_link"] = True
    return profile, cluster


@st.composite
def sharded_on_nodes(draw):
    """:func:`sharded` on one or two node kinds of one or two nodes, holding 1 to 4 units of each type
    (so tp 2 and 4 are offered on some types and not on others)."""
    profile, cluster = draw(sharded())
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    types = list(cluster["resources"])
    K = draw(st.integers(1, 2))
    units = rng.choice([0, 1, 2, 2, 4], size=(K, len(types)))
    units[rng.integers(0, K, len(types)), np.arange(len(types))] = rng.choice([1, 2, 4], len(types))
    units[units.sum(axis=1) == 0, 0] = 2
    cluster["resources"] = {
        t: {k: v for k, v in r.items() if k not in ("price", "limit")} for t, r in cluster["resources"].items()
    }
    cluster["nodes"] = {
        f"n{k}": {
            "price": round(float(rng.uniform(1.0, 9.0)), 2),
            "units": {t: int(u) for t, u in zip(types, units[k]) if u},
            "available": int(rng.integers(1, 3)),
        }
        for k in range(K)
    }
    return profile, cluster


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
@settings(max_examples=60, **SETTINGS)
@given(sharded_on_nodes(), st.sampled_from(["cost", "time"]))
def test_exact_on_nodes_chooses_degrees_and_rentals_as_enumeration_does(inst, objective):
    profile, cluster = inst
    expected = pipeline_optimum_on_nodes(profile, cluster, objective, profile["job"]["min_throughput"])
    plan = exact_against(profile, cluster, objective, expected, micro_batch=profile["batch_size"])  # its B0
    if plan is None:
        return
    per_node: dict[tuple[str, str], int] = {}
    for s in plan.stages:  # every replica's units on one node, no node over what it holds of the type
        assert sum(s.nodes.values()) == s.replicas
        for node, count in s.nodes.items():
            per_node[node, s.resource] = per_node.get((node, s.resource), 0) + count * (s.tp or 1)
    for (node, t), used in per_node.items():
        assert used <= cluster["nodes"][node.split("#")[0]]["units"].get(t, 0)


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
@settings(max_examples=120, **SETTINGS)
@given(sharded(), st.sampled_from(["cost", "time"]))
def test_exact_chooses_each_stages_degree_as_enumeration_does(inst, objective):
    profile, cluster = inst
    expected = pipeline_optimum(profile, cluster, objective, profile["job"]["min_throughput"])
    plan = exact_against(profile, cluster, objective, expected, micro_batch=profile["batch_size"])  # its B0
    if plan is not None:
        ref = assert_figures_are_the_oracles(profile, cluster, plan)
        assert plan.resources == {t: ref["resources"][t] for t in plan.resources}


def big_layers(tmp_path, nodes: bool = False):
    """Four blocks whose training state (48 GB each) fits a 40 GB GPU only as a share at tp 2 or 4;
    tp 4 runs a block in 0.3 of its tp-1 time."""
    layers = [
        {
            "name": f"b{i}",
            "type": "block",
            "input_size": 1e6,
            "weight_size": 12e9,
            "activation_size": 1e8,
            "tp": {2: {"weight_size": 6e9, "activation_size": 5e7}, 4: {"weight_size": 3e9, "activation_size": 2.5e7}},
            "times": {
                "gpu": {
                    "oct": 1.0,
                    "odt": 0.5,
                    "alpha": 1.0,
                    "beta": 0.0,
                    "tp": {2: {"oct": 0.55, "odt": 0.25}, 4: {"oct": 0.3, "odt": 0.125}},
                }
            },
        }
        for i in range(4)
    ]
    profile = {"model": "big", "batch_size": 4, "job": {"samples": 1e5, "global_batch": 64}, "layers": layers}
    gpu = {"price": 2.0, "limit": 16, "memory_gb": 40}
    cluster: dict = {"cluster": "c", "resources": {"gpu": gpu}}
    if nodes:
        cluster["resources"]["gpu"] = {"memory_gb": 40}
        cluster["nodes"] = {"box": {"price": 8.0, "units": {"gpu": 4}, "available": 4}}
    return write_yaml(tmp_path / "p.yaml", profile), write_yaml(tmp_path / "c.yaml", cluster)


@pytest.mark.parametrize("nodes", [False, True])
def test_a_model_too_big_for_one_gpu_is_planned_at_a_higher_degree_and_checks(tmp_path, nodes):
    profile, cluster = big_layers(tmp_path, nodes)
    plan = plan_and_check(profile, cluster, tmp_path / "plan.yaml")
    assert all(s.get("tp", 1) > 1 for s in plan["stages"])
    assert all(s["memory_gb"] <= 40 for s in plan["stages"])
    units = sum(s["replicas"] * s.get("tp", 1) for s in plan["stages"])
    assert plan["resources"]["gpu"] == units <= 16
    if nodes:  # every replica's units on one node, no node over its four GPUs
        per_node: dict[str, int] = {}
        for s in plan["stages"]:
            assert sum(s["nodes"].values()) == s["replicas"]
            for node, count in s["nodes"].items():
                per_node[node] = per_node.get(node, 0) + count * s.get("tp", 1)
        assert max(per_node.values()) <= 4
    shown = runner.invoke(app, ["plan", profile, cluster, "-s", "exact", "--objective", "time"])
    assert shown.exit_code == 0 and "tp4" in shown.output.replace(" ", "")


def test_without_higher_degrees_the_same_model_does_not_fit(tmp_path):
    profile, cluster = big_layers(tmp_path)
    data = yaml.safe_load(open(profile))
    for layer in data["layers"]:
        del layer["tp"], layer["times"]["gpu"]["tp"]
    write_yaml(tmp_path / "p.yaml", data)
    refused = runner.invoke(app, ["plan", profile, cluster, "-s", "exact", "--objective", "time"])
    assert refused.exit_code == 3 and "memory" in refused.output


@pytest.mark.parametrize("objective", ["time", "cost"])
@pytest.mark.parametrize("scheduler", ["greedy", "rl", "tapp", "genetic", "random"])
def test_the_searches_plan_in_the_same_space(tmp_path, scheduler, objective):
    """No plan fits at tp 1: every search finds one at a higher degree (the local search cuts a stage
    keeping its degree)."""
    profile, cluster = big_layers(tmp_path)
    steps = ["--steps", "20"] if scheduler in ("rl", "tapp") else []
    result = runner.invoke(app, ["plan", profile, cluster, "-s", scheduler, "--objective", objective, "--json", *steps])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    assert plan["feasible"] and all(s.get("tp", 1) > 1 for s in plan["stages"])


def test_validate_says_which_degrees_the_profile_gives(tmp_path):
    profile, cluster = big_layers(tmp_path)
    result = runner.invoke(app, ["validate", profile, cluster])
    assert result.exit_code == 0
    assert "tensor parallelism" in result.output and "gpu at tp 2, 4" in " ".join(result.output.split())


def test_times_at_a_degree_need_the_layers_sizes_there(tmp_path):
    profile, cluster = big_layers(tmp_path)
    data = yaml.safe_load(open(profile))
    del data["layers"][2]["tp"]
    write_yaml(tmp_path / "p.yaml", data)
    result = runner.invoke(app, ["validate", profile, cluster])
    assert result.exit_code == 2
    said = " ".join(result.output.split())
    assert "layers[2].times.gpu.tp[2]" in said and "sizes" in said


def test_degrees_that_do_not_divide_each_other_are_refused(tmp_path):
    profile, cluster = big_layers(tmp_path)
    data = yaml.safe_load(open(profile))
    for layer in data["layers"]:
        layer["tp"][3] = {"weight_size": 2e9}
    data["layers"][1]["times"]["gpu"]["tp"][3] = {"oct": 0.4, "odt": 0.2}
    write_yaml(tmp_path / "p.yaml", data)
    result = runner.invoke(app, ["validate", profile, cluster])
    assert result.exit_code == 2
    said = " ".join(result.output.split())
    assert "layers[1].times.gpu.tp[3]" in said and "divide" in said


def test_check_fails_a_tp_plan_edited_to_more_units_than_its_rental_holds(tmp_path):
    """Spec 5: more replicas than the rental's units (at tp d, d units each), though not than the cluster's:
    a failed gate (exit 1), not a crash; the rental is counted in units, not replicas."""
    profile, cluster = big_layers(tmp_path, nodes=True)
    plan = plan_and_check(profile, cluster, tmp_path / "plan.yaml")
    held = 4 * sum(plan["rental"].values())
    stage = plan["stages"][0]
    stage["replicas"] += (held - plan["resources"]["gpu"]) // stage["tp"] + 1
    stage["nodes"] = {next(iter(stage["nodes"])): stage["replicas"]}  # placed on a node it rents, too many
    more = yaml.safe_load(open(cluster))
    more["nodes"]["box"]["available"] = 8  # 32 GPUs: the edited plan's units fit the cluster
    write_yaml(tmp_path / "c.yaml", more)
    assert held < sum(s["replicas"] * s.get("tp", 1) for s in plan["stages"]) <= 32
    write_yaml(tmp_path / "edited.yaml", plan)
    args = ["check", str(tmp_path / "edited.yaml"), "--profile", profile, "--cluster", cluster, "--objective", "time"]
    checked = runner.invoke(app, args)
    assert checked.exit_code == 1 and "internal error" not in checked.output, checked.output


def test_check_refuses_a_degree_the_profile_no_longer_gives(tmp_path):
    profile, cluster = big_layers(tmp_path)
    plan = plan_and_check(profile, cluster, tmp_path / "plan.yaml")
    data = yaml.safe_load(open(profile))
    for layer in data["layers"]:
        del layer["times"]["gpu"]["tp"][plan["stages"][0]["tp"]]
    write_yaml(tmp_path / "p.yaml", data)
    checked = runner.invoke(
        app, ["check", str(tmp_path / "plan.yaml"), "--profile", profile, "--cluster", cluster, "--objective", "time"]
    )
    assert checked.exit_code != 0
    assert f"tp {plan['stages'][0]['tp']}" in " ".join(checked.output.split())


def _tp_plan(tmp_path, name: str, stages, degrees, model: str = "mlp", batch: int = 64):
    """A plan file of ``stages`` (resource, replicas, layers) whose stages run at ``degrees``."""
    from tests.helpers import write_plan

    path = write_plan(tmp_path / f"{name}.json", stages, batch_size=batch, model=model)
    data = json.loads(path.read_text())
    first = 0
    for stage, degree in zip(data["stages"], degrees):
        stage["first"], stage["last"] = first, first + len(stage["layers"]) - 1
        first = stage["last"] + 1
        if degree > 1:
            stage["tp"] = degree
    path.write_text(json.dumps(data))
    return path


def test_run_refuses_a_tensor_parallel_stage_with_nothing_to_shard(tmp_path):
    """A stage of one ReLU holds no pair of linear layers: run says so before it starts a process."""
    plan = _tp_plan(
        tmp_path, "plan", [("cpu", 1, ["0"]), ("cpu", 1, ["1"]), ("cpu", 1, ["2", "3", "4", "5", "6"])], [1, 2, 1]
    )
    result = runner.invoke(app, ["run", str(plan), "--max-processes", "8"])
    assert result.exit_code == 2
    said = " ".join(result.output.split())
    assert "stages[1].tp" in said and "no pair of linear layers" in said


@pytest.mark.slow
def test_run_shards_linear_pairs_with_the_losses_of_one_process(tmp_path):
    """mlp with both stages at tp 2, and with stage 0 at two replicas of tp 2 (data parallel over
    sharded replicas): torch.distributed.tensor.parallel on gloo, the single-process losses."""
    from heterps_cli.runtime import single_process_losses
    from tests.helpers import MLP_LAYERS, heterps

    reference = single_process_losses("mlp", 64 * 16, 3)
    for name, replicas, degrees in (("tp", 1, [2, 2]), ("dp_tp", 2, [2, 1])):
        plan = _tp_plan(tmp_path, name, [("cpu", replicas, MLP_LAYERS[:4]), ("cpu", 1, MLP_LAYERS[4:])], degrees)
        out = tmp_path / f"{name}.report.json"
        done = heterps("run", str(plan), "--steps", "3", "--warmup", "0", "--max-processes", "6", "--out", str(out))
        assert done.returncode == 0, done.stderr
        report = json.loads(out.read_text())
        assert report["processes"] == replicas * degrees[0] + degrees[1]
        assert max(abs(a - b) for a, b in zip(report["losses"], reference)) < 1e-5


@pytest.mark.slow
def test_run_shards_the_bundled_transformers_blocks_with_the_same_losses(tmp_path):
    """The zoo transformer at its blocks, each stage's block MLP sharded at tp 2: the losses of the same
    plan at tp 1."""
    from tests.helpers import heterps

    stages = [("cpu", 1, ["embedding", "blocks.0"]), ("cpu", 1, ["blocks.1", "norm", "head"])]
    losses = []
    for degrees in ([1, 1], [2, 2]):
        plan = _tp_plan(tmp_path, f"tp{degrees[0]}", stages, degrees, model="transformer", batch=8)
        out = tmp_path / f"tp{degrees[0]}.report.json"
        done = heterps("run", str(plan), "--steps", "3", "--warmup", "0", "--max-processes", "4", "--out", str(out))
        assert done.returncode == 0, done.stderr
        losses.append(json.loads(out.read_text())["losses"])
    assert max(abs(a - b) for a, b in zip(*losses)) < 1e-5


@pytest.mark.parametrize("two_sizes", [False, True])
def test_a_node_that_cannot_hold_a_degree_never_gets_it(tmp_path, two_sizes):
    """Nodes of six GPUs hold no whole set of tp-4 replicas' units: only tp 1 and 2 are offered, at
    every micro-batch the plan may choose among (``two_sizes``: times at 2 and 4)."""
    profile, cluster = big_layers(tmp_path, nodes=True)
    data = yaml.safe_load(open(profile))
    for layer in data["layers"] if two_sizes else []:
        entry = layer["times"]["gpu"]
        entry["batches"] = {2: {"oct": 0.6, "odt": 0.5}}
        for shard in entry["tp"].values():
            shard["batches"] = {2: {"oct": shard["oct"] * 0.6, "odt": shard["odt"]}}
    write_yaml(tmp_path / "p.yaml", data)
    nodes = yaml.safe_load(open(cluster))
    nodes["nodes"]["box"]["units"]["gpu"] = 6
    write_yaml(tmp_path / "c.yaml", nodes)
    for micro in ([], ["--micro-batch", "2"], ["--micro-batch", "4"])[: 3 if two_sizes else 1]:
        result = runner.invoke(app, ["plan", profile, cluster, "-s", "exact", "--objective", "time", "--json", *micro])
        assert result.exit_code == 0, result.output
        assert {s.get("tp", 1) for s in json.loads(result.output)["stages"]} == {2}
    from heterps_cli.problem import load_problem

    problem = load_problem(profile, cluster)
    # the measured sizes, and the multiples of the largest (spec 1f) that divide the global batch
    largest = 4
    multiples = tuple(largest * m for m in (2, 4, 8, 16) if problem.step_samples % (largest * m) == 0)
    assert problem.micro_batch_choices == ((2, 4) if two_sizes else (4,)) + multiples
    for batch in problem.micro_batch_choices:  # the problem the plan chooses at, each micro-batch's own
        at = problem.at_micro_batch(batch)
        assert not at.tensor[4].runnable.any() and at.tensor[2].runnable.all()


def test_a_size_at_a_degree_that_overflows_is_refused_naming_it(tmp_path):
    profile, cluster = big_layers(tmp_path)
    data = yaml.safe_load(open(profile))
    data["layers"][3]["tp"][4]["weight_size"] = 1e308
    write_yaml(tmp_path / "p.yaml", data)
    result = runner.invoke(app, ["plan", profile, cluster])
    assert result.exit_code == 2
    said = " ".join(result.output.split())
    assert "layers[3].tp[4].weight_size" in said and "overflows" in said


@pytest.mark.parametrize("where", ["entry", "layer"])
@pytest.mark.parametrize("degree", [1, "x"])
def test_a_degree_that_is_no_degree_is_refused_naming_it(tmp_path, where, degree):
    profile, cluster = big_layers(tmp_path)
    data = yaml.safe_load(open(profile))
    if where == "entry":
        data["layers"][0]["times"]["gpu"]["tp"][degree] = {"oct": 1.0, "odt": 0.1}
        field = f"layers[0].times.gpu.tp[{degree}]" if degree == 1 else "layers[0].times.gpu.tp.x"
    else:
        data["layers"][0]["tp"][degree] = {"weight_size": 1.0}
        field = f"layers[0].tp[{degree}]" if degree == 1 else "layers[0].tp.x"
    write_yaml(tmp_path / "p.yaml", data)
    result = runner.invoke(app, ["plan", profile, cluster])
    assert result.exit_code == 2
    said = " ".join(result.output.split())
    assert field in said and "tensor-parallel degree" in said and "Traceback" not in said


def test_launch_lays_each_tensor_parallel_replica_on_one_node_a_process_per_shard(tmp_path):
    """Section 1h: a replica at degree d is d processes on the node it is placed on; each node's torchrun
    starts replicas x d processes there, and the plan's ranks go replica by replica, shards together."""
    from heterps_cli.loading import load_plan
    from heterps_cli.runtime.placement import processes

    stages = [("gpu", 3, ["0", "1", "2"]), ("gpu", 2, ["3", "4", "5", "6"])]
    path = write_plan(tmp_path / "plan.yaml", stages, 8)
    plan = json.loads(path.read_text())
    plan["rental"] = {"box": 3}
    plan["stages"][0].update(tp=2, nodes={"box#1": 2, "box#2": 1})
    plan["stages"][1].update(tp=4, nodes={"box#2": 1, "box#3": 1})
    path.write_text(json.dumps(plan))
    args = ["launch", str(path), "-o", str(tmp_path / "launch"), "--model", "mlp"]
    result = runner.invoke(app, [*args, "--map", "gpu=cuda"])
    assert result.exit_code == 0, result.output
    expected: dict[str, int] = {}  # from the plan file alone: processes per node
    for s in plan["stages"]:
        for node, k in s["nodes"].items():
            expected[node] = expected.get(node, 0) + k * s["tp"]
    scripts = sorted((tmp_path / "launch").glob("node-*.sh"))
    assert len(scripts) == len(expected)
    for script, (node, n) in zip(scripts, expected.items()):
        assert f"--nproc-per-node {n}" in script.read_text(), (node, script.read_text())
    order = processes(load_plan(str(path))[0].stages)
    assert sorted(p.rank for p in order) == list(range(sum(expected.values())))
    first = 0
    for s in plan["stages"]:  # each replica's shards: consecutive ranks, one node, GPUs of their own
        for r in range(s["replicas"]):
            shards = [p for p in order if first + r * s["tp"] <= p.rank < first + (r + 1) * s["tp"]]
            assert len({p.node for p in shards}) == 1
        first += s["replicas"] * s["tp"]
    for node in expected:
        assert sorted(p.device_index for p in order if p.node == node) == list(range(expected[node]))
