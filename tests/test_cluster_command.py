"""``heterps cluster``: cluster files of whole instances from the instance catalogue; the catalogue's
names agree with the device catalogue's; bad picks and bad catalogues exit 2 in one paragraph."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from heterps_cli.cli.app import app
from heterps_cli.loading import load_cluster
from tests.helpers import ROOT, refused, runner

CATALOGUE = ROOT / "heterps_cli/instances.yaml"
DEVICES = ROOT / "heterps_cli/profiling/devices.yaml"
GB_PER_GIB = 2**30 / 1e9


def _catalogue() -> dict:
    return yaml.safe_load(CATALOGUE.read_text())["instances"]


def test_the_catalogue_names_its_units_as_the_device_catalogue_does():
    devices = set(yaml.safe_load(DEVICES.read_text())["devices"])
    for name, instance in _catalogue().items():
        assert set(instance["units"]) <= devices, name
        assert instance["source"] and instance["network_source"] and instance["read"], name
        if instance["spot"] is not None:
            assert instance["spot"] <= instance["on_demand"], name
    kinds = {t for i in _catalogue().values() for t in i["units"]}
    assert {"v100-16gb", "a10g", "l4", "a100-40gb", "h100", "h200", "cpu"} <= kinds


def test_no_instances_lists_the_catalogue():
    result = runner.invoke(app, ["cluster"], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    for name in _catalogue():
        assert name in result.stdout


@pytest.mark.parametrize("spot", [False, True])
def test_a_built_cluster_prices_whole_instances_and_gives_each_unit_its_least_share(tmp_path, spot):
    out = tmp_path / "cluster.yaml"
    args = ["cluster", "p5.48xlarge=2", "c7i.24xlarge=3", "g6.24xlarge", "--out", str(out)]
    result = runner.invoke(app, args + (["--spot"] if spot else []))
    assert result.exit_code == 0, result.output
    cluster, _ = load_cluster(str(out))  # the file heterps writes, heterps reads
    catalogue = _catalogue()
    assert cluster.cluster == "aws-us-east-1"
    for name, count in [("p5.48xlarge", 2), ("c7i.24xlarge", 3), ("g6.24xlarge", 1)]:
        node = cluster.nodes[name]
        assert node.price == catalogue[name]["spot" if spot else "on_demand"]
        assert node.available == count and node.units == catalogue[name]["units"]
    holders = ["p5.48xlarge", "c7i.24xlarge", "g6.24xlarge"]
    # cpu: every instance holds cores; the least memory and network per core wins
    cpu = cluster.resources["cpu"]
    per_core_memory = [catalogue[n]["host_memory_gib"] * GB_PER_GIB / catalogue[n]["units"]["cpu"] for n in holders]
    per_core_network = [catalogue[n]["network_gbps"] / catalogue[n]["units"]["cpu"] for n in holders]
    assert cpu.memory_gb == pytest.approx(min(per_core_memory), rel=1e-3)
    assert cpu.bandwidth_gbps == pytest.approx(min(per_core_network), rel=1e-3)
    assert cluster.resources["h100"].memory_gb == 80 and cluster.resources["h100"].bandwidth_gbps == 3200 / 8
    assert cluster.resources["l4"].bandwidth_gbps == 50 / 4
    text = out.read_text()
    assert "skypilot-catalog" in text and "read 2026-11-24" in text  # every figure says where it comes from


def test_the_bundled_catalogue_example_is_what_the_command_and_the_planner_give(tmp_path):
    built = subprocess.run(
        ["heterps", "cluster", "p3.8xlarge=4", "g6.24xlarge=4", "c7i.24xlarge=8"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert built.stdout == (ROOT / "clusters/aws-catalogue.yaml").read_text(), (
        "clusters/aws-catalogue.yaml is stale: run sh profiles/make_aws_example.sh"
    )
    plan = ROOT / "docs/plans/vgg16-aws.yaml"
    files = ["--profile", str(ROOT / "profiles/vgg16-aws.yaml"), "--cluster", str(ROOT / "clusters/aws-catalogue.yaml")]
    job = ["--samples", "1000000", "--global-batch", "1024", "--min-throughput", "15000"]
    result = runner.invoke(app, ["check", str(plan), *files, *job, "--replan", "exact"])
    assert result.exit_code == 0, result.output
    written = yaml.safe_load(plan.read_text())
    assert written["optimal"] is True and written["rental"] == {"g6.24xlarge": 1}
    assert written["link_gbps"] == {"l4": 256}  # four L4s all-reduce over the node's PCIe links
    assert written["what_if"]  # the explanation: one node more or fewer of each kind


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["p9.huge=2"], "'p9.huge' is not in the instance catalogue"),
        (["p3.8xlarge=0"], "COUNT must be a whole number from 1 to 1,000,000"),
        (["p3.8xlarge=-1"], "COUNT must be a whole number"),
        (["p3.8xlarge=two"], "COUNT must be a whole number"),
        (["p3.8xlarge=99999999999999999999"], "COUNT must be a whole number"),
        (["p3.8xlarge=1", "p3.8xlarge=2"], "p3.8xlarge is given twice"),
        (["p3.8xlarge", "--name", "a\x1b[2Jb"], "--name"),
    ],
)
def test_bad_picks_exit_2_in_one_paragraph(args, says):
    stderr = refused(["cluster", *args], says)
    assert len(stderr.strip().splitlines()) <= 3


def _own_catalogue(tmp_path, text: str) -> str:
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    return str(path)


MINE = """catalogue: heterps-instances/1
instances:
  box:
    cloud: lab
    region: basement
    title: 2 GPUs
    units: {h100: 2, cpu: 8}
    host_memory_gib: 64
    network_gbps: 25
    on_demand: 3.5
    read: 2026-11-24
    source: our invoice
    network_source: the switch's datasheet
"""


def test_an_own_catalogue_is_used_and_spot_needs_a_spot_price(tmp_path):
    mine = _own_catalogue(tmp_path, MINE)
    result = runner.invoke(app, ["cluster", "box=3", "--catalogue", mine, "--name", "lab"])
    assert result.exit_code == 0, result.output
    data = yaml.safe_load(result.stdout)
    assert data["cluster"] == "lab" and data["nodes"]["box"]["price"] == 3.5
    refused(["cluster", "box", "--catalogue", mine, "--spot"], "no spot price for box")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (MINE.replace("on_demand: 3.5", "on_demand: -3.5"), "mine.yaml:10: instances.box.on_demand"),
        (MINE.replace("units: {h100: 2, cpu: 8}", "units: {}"), "instances.box.units"),
        (MINE.replace("read: 2026-11-24", "read: yesterday"), "instances.box.read"),
        (MINE.replace("    region: basement\n", ""), "region"),
        (MINE + "    link_gbps: {h100: 3600}\n", "instances.box: gives link_gbps without a link_source"),
        (MINE + "    link_gbps: {a100: 3600}\n    link_source: a datasheet\n", "instances.box.link_gbps.a100"),
        (MINE + "    link_gbps: {h100: 0}\n    link_source: a datasheet\n", "instances.box.link_gbps.h100"),
        ("a: &x [*x]\n", "mine.yaml"),
        ("\x00\x01binary", "mine.yaml"),
    ],
)
def test_a_bad_catalogue_names_its_file_line_and_field(tmp_path, text, says):
    refused(["cluster", "box", "--catalogue", _own_catalogue(tmp_path, text)], says)
