"""Malformed inputs: exit 2, one message naming the file, the line and the field; no traceback."""

from __future__ import annotations

import json

import pytest

from heterps_cli.cli.app import app
from tests.helpers import runner

PROFILE = """\
model: tiny
batch_size: 64
job:
  samples: 1e6
  min_throughput: 100
layers:
  - name: emb
    type: embedding
    input_size: 208
    weight_size: 4.2e9
    alpha: 0.9
    beta: 0.5
    times:
      cpu: {oct: 0.030, odt: 0.012}
      gpu: {oct: 0.004, odt: 0.020, alpha: 0.95}
  - name: fc1
    type: fc
    input_size: 1664
    weight_size: 1.7e6
    alpha: 0.9
    beta: 0.2
    times:
      cpu: {oct: 0.20, odt: 0.001}
      gpu: {oct: 0.002, odt: 0.001}
"""

CLUSTER = """\
cluster: small
resources:
  cpu: {price: 0.04, limit: 48, unit: CPU core}
  gpu: {price: 2.42, limit: 4, unit: V100}
"""


def _run(tmp_path, profile=PROFILE, cluster=CLUSTER, *extra):
    (tmp_path / "p.yaml").write_text(profile)
    (tmp_path / "c.yaml").write_text(cluster)
    return runner.invoke(app, ["plan", str(tmp_path / "p.yaml"), str(tmp_path / "c.yaml"), *extra])


def test_the_valid_files_plan(tmp_path):
    result = _run(tmp_path)
    assert result.exit_code == 0, result.output


PROFILE_CASES = {
    # name: (old, new, line, expected text in the message)
    "not yaml": ("    times:\n      cpu: {oct: 0.030", "    times:\n      cpu: {oct: [0.030", 14, "not valid YAML"),
    "missing field": (
        "      cpu: {oct: 0.20, odt: 0.001}",
        "      cpu: {oct: 0.20}",
        23,
        "layers[1].times.cpu.odt: required field is missing",
    ),
    "unknown field": (
        "      gpu: {oct: 0.002, odt",
        "      gpu: {octt: 0.002, odt",
        24,
        "layers[1].times.gpu.octt: unknown field 'octt'; did you mean 'oct'?",
    ),
    "string for number": (
        "      cpu: {oct: 0.20,",
        "      cpu: {oct: fast,",
        23,
        "layers[1].times.cpu.oct: must be a number",
    ),
    "quoted number": ("batch_size: 64", "batch_size: '64'", 2, "batch_size: must be a whole number"),
    "bool for number": ("    input_size: 1664", "    input_size: true", 18, "layers[1].input_size: must be a number"),
    "negative oct": (
        "      cpu: {oct: 0.20,",
        "      cpu: {oct: -0.20,",
        23,
        "layers[1].times.cpu.oct: must be > 0 (got -0.2)",
    ),
    "zero oct": ("      cpu: {oct: 0.20,", "      cpu: {oct: 0,", 23, "layers[1].times.cpu.oct: must be > 0"),
    "negative odt": ("odt: 0.012}", "odt: -1}", 14, "layers[0].times.cpu.odt: must be >= 0"),
    "nan": ("    weight_size: 1.7e6", "    weight_size: .nan", 19, "layers[1].weight_size: must be a finite number"),
    "infinity": (
        "    weight_size: 1.7e6",
        "    weight_size: .inf",
        19,
        "layers[1].weight_size: must be a finite number",
    ),
    "alpha above 1": (
        "    alpha: 0.9\n    beta: 0.2",
        "    alpha: 1.5\n    beta: 0.2",
        20,
        "layers[1].alpha: must be <= 1",
    ),
    "beta below 0": ("    beta: 0.5", "    beta: -0.1", 12, "layers[0].beta: must be >= 0"),
    "per-type alpha above 1": ("alpha: 0.95}", "alpha: 1.95}", 15, "layers[0].times.gpu.alpha: must be <= 1"),
    "duplicate layer name": ("  - name: fc1", "  - name: emb", 16, "layers[1].name: duplicate layer name 'emb'"),
    "duplicate key": (
        "    type: fc\n",
        "    type: fc\n    type: conv\n",
        18,
        "layers[1].type: duplicate key (first given on line 17)",
    ),
    "empty layers": (PROFILE[PROFILE.index("layers:") :], "layers: []\n", 6, "layers: must not be empty"),
    "no alpha anywhere": ("    alpha: 0.9\n    beta: 0.2", "    beta: 0.2", 22, "layers[1].times.cpu: no alpha"),
    "missing model": ("model: tiny\n", "", 1, "model: required field is missing"),
    "top-level list": (PROFILE, "- a\n- b\n", 1, "expected a YAML mapping"),
    "empty file": (PROFILE, "", 1, "file is empty"),
    "layer no type can run": (
        "      cpu: {oct: 0.20, odt: 0.001}\n      gpu: {oct: 0.002, odt: 0.001}\n",
        "      tpu: {oct: 0.20, odt: 0.001}\n",
        22,
        "layers[1].times: layer 'fc1' can run on none of the resource types",
    ),
    "samples missing": ("  samples: 1e6\n", "", 3, "job.samples: samples per epoch are not given"),
    "empty type name": ("      gpu: {oct: 0.004", "      '': {oct: 0.004", 15, "layers[0].times"),
    "fixed costs of a type no layer has": (
        "layers:\n",
        "fixed:\n  gpu: {pass_start: 1e-4}\n  tpu: {pass_start: 1e-4}\nlayers:\n",
        8,
        "fixed.tpu: no layer has times on tpu",
    ),
    "negative all-reduce latency": (
        "layers:\n",
        "fixed:\n  gpu: {all_reduce_latency: -1e-4}\nlayers:\n",
        7,
        "fixed.gpu.all_reduce_latency: must be >= 0",
    ),
    "misspelt fixed cost": (
        "layers:\n",
        "fixed:\n  cpu: {pass_starts: 1e-4}\nlayers:\n",
        7,
        "fixed.cpu.pass_starts: unknown field 'pass_starts'; did you mean 'pass_start'?",
    ),
}


@pytest.mark.parametrize("case", PROFILE_CASES, ids=list(PROFILE_CASES))
def test_bad_profile(tmp_path, case):
    old, new, line, text = PROFILE_CASES[case]
    assert old in PROFILE
    result = _run(tmp_path, PROFILE.replace(old, new, 1))
    assert result.exit_code == 2, result.output
    message = result.stderr
    assert f"p.yaml:{line}: " in message, message
    assert text in message, message
    assert "Traceback" not in result.output and result.exception is None or isinstance(result.exception, SystemExit)
    assert result.stdout == ""
    # one line per problem, each naming the file and line (a layer without alpha has two such entries)
    assert all(line.startswith("error: ") and "p.yaml:" in line for line in message.strip().splitlines()), message


CLUSTER_CASES = {
    "negative price": ("price: 0.04", "price: -0.04", 3, "resources.cpu.price: must be >= 0"),
    "zero limit": ("limit: 4,", "limit: 0,", 4, "resources.gpu.limit: must be >= 1"),
    "fractional limit": ("limit: 4,", "limit: 2.5,", 4, "resources.gpu.limit: must be a whole number"),
    "unknown field": (
        "unit: V100",
        "units: V100",
        4,
        "resources.gpu.units: unknown field 'units'; did you mean 'unit'?",
    ),
    "no resources": (
        "resources:\n  cpu: {price: 0.04, limit: 48, unit: CPU core}\n  gpu: {price: 2.42, limit: 4, unit: V100}\n",
        "resources: {}\n",
        2,
        "resources: must not be empty",
    ),
}


@pytest.mark.parametrize("case", CLUSTER_CASES, ids=list(CLUSTER_CASES))
def test_bad_cluster(tmp_path, case):
    old, new, line, text = CLUSTER_CASES[case]
    assert old in CLUSTER
    result = _run(tmp_path, PROFILE, CLUSTER.replace(old, new, 1))
    assert result.exit_code == 2, result.output
    assert f"c.yaml:{line}: " in result.stderr and text in result.stderr, result.stderr


def test_no_type_in_common(tmp_path):
    cluster = "cluster: other\nresources:\n  tpu: {price: 1, limit: 2}\n"
    result = _run(tmp_path, PROFILE, cluster)
    assert result.exit_code == 2
    assert "p.yaml:6: layers: no resource type in common with cluster file" in result.stderr
    assert "c.yaml" in result.stderr


def test_missing_file(runner, tmp_path):
    result = runner.invoke(app, ["plan", str(tmp_path / "nope.yaml"), str(tmp_path / "c.yaml")])
    assert result.exit_code == 2
    assert "nope.yaml: file not found" in result.stderr


@pytest.mark.parametrize(
    "option",
    [
        ["--samples", "0"],
        ["--epochs", "-1"],
        ["--max-cost", "0"],
        ["--min-throughput", "-5"],
        ["--objective", "speed"],
        ["--scheduler", "magic"],
    ],
)
def test_bad_options_exit_2(tmp_path, option):
    result = _run(tmp_path, PROFILE, CLUSTER, *option)
    assert result.exit_code == 2
    assert "Traceback" not in result.output


def test_validate_reports_the_same_errors(runner, tmp_path):
    (tmp_path / "p.yaml").write_text(PROFILE.replace("odt: 0.012}", "odt: -1}"))
    result = runner.invoke(app, ["validate", str(tmp_path / "p.yaml")])
    assert result.exit_code == 2
    assert "p.yaml:14: layers[0].times.cpu.odt: must be >= 0" in result.stderr


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
def test_unreadable_inputs_and_unwritable_output(runner, tmp_path):
    (tmp_path / "bin.yaml").write_bytes(b"\x7fELF\x02\x01\x01\x00\xff\xfe")
    (tmp_path / "c.yaml").write_text(CLUSTER)
    for args, text in [
        ([str(tmp_path / "bin.yaml"), str(tmp_path / "c.yaml")], "not UTF-8 text"),
        ([str(tmp_path), str(tmp_path / "c.yaml")], "is a directory"),
    ]:
        result = runner.invoke(app, ["plan", *args])
        assert result.exit_code == 2 and text in result.stderr, result.output
    (tmp_path / "p.yaml").write_text(PROFILE)
    result = runner.invoke(app, ["plan", str(tmp_path / "p.yaml"), str(tmp_path / "c.yaml"), "--out", str(tmp_path)])
    assert result.exit_code == 2 and "exists and is a directory" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin.yaml", "c.yaml", "p.yaml"], "no temporary file left"


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
def test_one_layer_on_a_one_type_cluster(tmp_path):
    profile = PROFILE[: PROFILE.index("  - name: fc1")]
    cluster = "cluster: one\nresources:\n  cpu: {price: 0.04, limit: 8}\n"
    result = _run(tmp_path, profile, cluster, "--json")
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert [s["resource"] for s in plan["stages"]] == ["cpu"] and plan["resources"] == {
        "cpu": plan["stages"][0]["replicas"]
    }
