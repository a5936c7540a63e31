"""docs/spec.md section 1g: a stage may recompute its activations. Known answers come from the
enumeration oracle, which tries every choice of recomputing stages on every cut and replica vector."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from heterps_cli.cli.app import app
from tests.helpers import exact_against, plan_and_check, write_yaml
from tests.oracle import assert_figures_are_the_oracles, pipeline_optimum
from tests.strategies import SETTINGS
from tests.test_pipeline import pipelined

runner = CliRunner()


@st.composite
def recomputable(draw):
    """A pipelined instance whose entries give forward times (most of them), with activations large
    enough beside the memory that holding many micro-batches of them binds."""
    profile, cluster = draw(pipelined(batches=(4,), max_limit=3))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    grow = float(draw(st.sampled_from([1.0, 4.0, 16.0])))
    for layer in profile["layers"]:
        layer["activation_size"] = layer.get("activation_size", 0.0) * grow
        for entry in layer["times"].values():
            if rng.random() < 0.8:
                entry["forward"] = float(np.round(entry["oct"] * rng.choice([0.2, 0.4]), 9))
    return profile, cluster


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
@settings(max_examples=150, **SETTINGS)
@given(recomputable(), st.sampled_from(["cost", "time"]))
def test_exact_chooses_recomputation_as_enumeration_does(inst, objective):
    profile, cluster = inst
    expected = pipeline_optimum(profile, cluster, objective, profile["job"]["min_throughput"])
    plan = exact_against(profile, cluster, objective, expected, micro_batch=profile["batch_size"])  # its B0
    if plan is not None:
        assert_figures_are_the_oracles(profile, cluster, plan)


def long_sequences(tmp_path):
    """Four layers whose activations per sample (14 GB each) exceed what a pipeline holds in flight
    on a 40 GB unit, but whose inputs (0.1 GB) do not: only recomputation fits."""
    layers = [
        {
            "name": f"l{i}",
            "type": "block",
            "input_size": 1e8,
            "weight_size": 5e8,
            "activation_size": 14e9,
            "times": {"gpu": {"oct": 0.3, "odt": 0.01, "alpha": 1.0, "beta": 0.0, "forward": 0.1}},
        }
        for i in range(4)
    ]
    profile = {"model": "long", "batch_size": 1, "job": {"samples": 1e5, "global_batch": 16}, "layers": layers}
    cluster = {"cluster": "c", "resources": {"gpu": {"price": 2.0, "limit": 4, "memory_gb": 40}}}
    return write_yaml(tmp_path / "p.yaml", profile), write_yaml(tmp_path / "c.yaml", cluster)


def test_recomputation_makes_a_plan_fit_says_so_and_check_recomputes_it(tmp_path):
    import yaml

    profile, cluster = long_sequences(tmp_path)
    plan = plan_and_check(profile, cluster, tmp_path / "plan.yaml")
    assert any(s.get("recompute") for s in plan["stages"])
    assert all(s["memory_gb"] <= 40 for s in plan["stages"])
    # without forward times there is nothing to recompute, and memory binds
    data = yaml.safe_load(open(profile))
    for layer in data["layers"]:
        del layer["times"]["gpu"]["forward"]
    write_yaml(tmp_path / "p.yaml", data)
    refused = runner.invoke(app, ["plan", profile, cluster, "-s", "exact", "--objective", "time"])
    assert refused.exit_code == 3 and "memory" in refused.output


@pytest.mark.parametrize("scheduler", ["greedy", "rl"])
def test_the_searches_recompute_where_only_that_fits(tmp_path, scheduler):
    profile, cluster = long_sequences(tmp_path)
    result = runner.invoke(
        app, ["plan", profile, cluster, "-s", scheduler, "--json", "--steps", "20"][: None if scheduler == "rl" else -2]
    )
    assert result.exit_code == 0, result.output
    assert '"recompute": true' in result.output


def test_a_forward_longer_than_the_whole_pass_is_refused(tmp_path):
    profile, cluster = long_sequences(tmp_path)
    import yaml

    data = yaml.safe_load(open(profile))
    data["layers"][1]["times"]["gpu"]["forward"] = 0.5
    write_yaml(tmp_path / "p.yaml", data)
    result = runner.invoke(app, ["validate", profile, cluster])
    assert result.exit_code == 2
    said = " ".join(result.output.split())
    assert "layers[1].times.gpu.forward" in said and "more than the entry's oct" in said


@pytest.mark.slow
def test_run_recomputes_a_stage_with_the_same_losses(tmp_path):
    """heterps run executes a recomputing stage with torch.utils.checkpoint: the training is the same."""
    import json

    from heterps_cli.runtime import single_process_losses
    from tests.helpers import MLP_LAYERS, heterps, write_plan

    plan = write_plan(tmp_path / "plan.json", [("cpu", 1, MLP_LAYERS[:4]), ("cpu2", 1, MLP_LAYERS[4:])])
    data = json.loads(plan.read_text())
    data["stages"][0]["recompute"] = True
    plan.write_text(json.dumps(data))
    out = tmp_path / "report.json"
    done = heterps(
        "run", str(plan), "--model", "mlp", "--map", "cpu2=cpu", "--steps", "3", "--warmup", "0", "--out", str(out)
    )
    assert done.returncode == 0, done.stderr
    losses = json.loads(out.read_text())["losses"]
    reference = single_process_losses("mlp", 64 * 16, 3)
    assert max(abs(a - b) for a, b in zip(losses, reference)) < 1e-5


def test_the_explanation_names_the_recomputed_forward_pass(tmp_path):
    """Stage 0 recomputes: of its 7.6 s a step (16 micro-batches of 0.3 s, 3 slots of fill at 0.4 s),
    the second forward pass takes 16 x 0.1 s."""
    profile, cluster = long_sequences(tmp_path)
    args = ["plan", profile, cluster, "-s", "exact", "--objective", "time", "--micro-batch", "1", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    import json

    plan = json.loads(result.output)
    assert plan["stages"][plan["bottleneck"]].get("recompute")
    assert "compute takes 4.8 s of its 7.6 s per step (its recomputed forward pass 1.6 s)" in plan["explanation"][0]
