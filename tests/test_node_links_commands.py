"""Section 1e's node links through the commands: a plan on one node's links, check and --explain on
them, the errors a bad link gives, and a type whose replicas fit its first node."""

from __future__ import annotations

import json
import math
import shlex

import pytest
import yaml

from heterps_cli.cli.app import app
from heterps_cli.formats import Cluster, Profile
from tests.helpers import runner, write_yaml

# One layer of 4e8 weight bytes, on V100s of a node whose links move 1,200 Gbit/s (150 GB/s) and a
# network of 25 Gbit/s: the all-reduce between two replicas is 4e8 / 1.5e11 s on the node, and the
# profile's odt (4e8 / 3.125e9 s, the network) between nodes.
PROFILE = {
    "model": "one",
    "batch_size": 64,
    "job": {"samples": 1_000_000, "epochs": 1, "global_batch": 512},
    "layers": [
        {
            "name": "fc",
            "type": "fc",
            "input_size": 4096,
            "weight_size": 4e8,
            "times": {"v100": {"oct": 0.01, "odt": 4e8 / 3.125e9, "alpha": 1.0, "beta": 0.0}},
        }
    ],
}
CLUSTER = {
    "cluster": "links",
    "resources": {"v100": {"unit": "V100", "bandwidth_gbps": 25}},
    "nodes": {
        "p3.8xlarge": {"price": 12.24, "units": {"v100": 4}, "available": 1, "link_gbps": {"v100": 1200}},
    },
}


def test_on_one_node_the_all_reduce_goes_over_its_links(tmp_path):
    profile = write_yaml(tmp_path / "p.yaml", PROFILE)
    cluster = write_yaml(tmp_path / "c.yaml", CLUSTER)
    out = tmp_path / "plan.yaml"
    args = ["plan", profile, cluster, "--objective", "time", "--scheduler", "exact", "-o", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    plan = yaml.safe_load(out.read_text())
    (stage,) = plan["stages"]
    assert stage["replicas"] == 4 and plan["link_gbps"] == {"v100": 1200}
    assert math.isclose(stage["comm_s"], 2 * 4e8 / 1.5e11 * 3 / 4, rel_tol=1e-12)  # 2 Y (k-1)/k, section 1d
    assert "links" in result.output
    checked = runner.invoke(app, ["check", str(out), "--profile", profile, "--cluster", cluster, "--objective", "time"])
    assert checked.exit_code == 0, checked.output


def test_without_links_the_same_node_pays_the_network(tmp_path):
    node = {k: v for k, v in CLUSTER["nodes"]["p3.8xlarge"].items() if k != "link_gbps"}
    cluster = {**CLUSTER, "nodes": {"p3.8xlarge": node}}
    profile = write_yaml(tmp_path / "p.yaml", PROFILE)
    out = tmp_path / "plan.yaml"
    args = ["plan", profile, write_yaml(tmp_path / "c.yaml", cluster), "--objective", "time", "--scheduler", "exact"]
    assert runner.invoke(app, [*args, "-o", str(out)]).exit_code == 0
    plan = yaml.safe_load(out.read_text())
    assert "link_gbps" not in plan
    k = plan["stages"][0]["replicas"]
    assert math.isclose(plan["stages"][0]["comm_s"], 2 * 4e8 / 3.125e9 * (k - 1) / k, rel_tol=1e-12)


def test_check_fails_a_plan_whose_rental_no_longer_has_links(tmp_path):
    profile = write_yaml(tmp_path / "p.yaml", PROFILE)
    cluster = write_yaml(tmp_path / "c.yaml", CLUSTER)
    out = tmp_path / "plan.yaml"
    args = ["plan", profile, cluster, "--objective", "time", "-s", "exact", "-o", str(out)]
    assert runner.invoke(app, args).exit_code == 0
    slow = {**CLUSTER, "nodes": {"p3.8xlarge": {**CLUSTER["nodes"]["p3.8xlarge"], "link_gbps": {"v100": 30}}}}
    slower = write_yaml(tmp_path / "slow.yaml", slow)
    result = runner.invoke(app, ["check", str(out), "--profile", profile, "--cluster", slower, "--objective", "time"])
    assert result.exit_code == 1, result.output
    assert "comm_s" in result.output


@pytest.mark.parametrize(
    ("link", "where", "says"),
    [
        ({"cpu": 100}, "nodes.p3.8xlarge.link_gbps.cpu", "holds no cpu"),
        ({"v100": 0}, "nodes.p3.8xlarge.link_gbps.v100", "must be > 0"),
        ({"v100": "fast"}, "nodes.p3.8xlarge.link_gbps.v100", "number"),
        ({"v100": 1e300}, "nodes.p3.8xlarge.link_gbps.v100", "1,000,000,000"),
    ],
)
def test_a_bad_link_is_one_line_naming_its_field(tmp_path, link, where, says):
    cluster = {
        "cluster": "bad",
        "resources": {"v100": {"unit": "V100"}, "cpu": {"unit": "CPU core"}},
        "nodes": {
            "p3.8xlarge": {"price": 12.24, "units": {"v100": 4}, "available": 1, "link_gbps": link},
            "c5": {"price": 3.06, "units": {"cpu": 36}, "available": 1},
        },
    }
    path = write_yaml(tmp_path / "c.yaml", cluster)
    result = runner.invoke(app, ["validate", path])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert where in result.output and says in result.output, result.output


def test_a_cluster_whose_links_can_be_chosen_in_too_many_ways_is_refused(tmp_path):
    """Seven types each linked on three kinds: 4^7 ways to choose where each type talks (the network,
    or one node of a kind), past the 4,096 the exact solver asks its fastest plan of."""
    types = [f"t{i}" for i in range(7)]
    profile = {
        "model": "wide",
        "batch_size": 8,
        "job": {"samples": 1000, "epochs": 1},
        "layers": [
            {
                "name": "l0",
                "type": "fc",
                "input_size": 4,
                "weight_size": 4,
                "times": {t: {"oct": 0.01, "odt": 0.001, "alpha": 1.0, "beta": 0.0} for t in types},
            }
        ],
    }
    cluster = {
        "cluster": "wide",
        "resources": {t: {} for t in types},
        "nodes": {
            f"k{k}": {
                "price": 1.0 + k,
                "units": dict.fromkeys(types, 1),
                "available": 1,
                "link_gbps": dict.fromkeys(types, 100),
            }
            for k in range(3)
        },
    }
    args = ["plan", write_yaml(tmp_path / "p.yaml", profile), write_yaml(tmp_path / "c.yaml", cluster), "-s", "exact"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "4,096 ways" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("scheduler", ["greedy", "genetic", "random"])
def test_heuristics_find_the_plan_that_needs_one_nodes_links(tmp_path, scheduler):
    """Four single-V100 nodes are cheaper than one 4-V100 node, but over the network four replicas'
    all-reduce (0.128 s) outweighs what they divide (one replica: 6,400 samples/s); over the big
    node's NVLink it takes 2.7 ms (21,333 samples/s). Scored over the network alone, a heuristic
    never sees the second: it must score schedules on the single node too, as exact does."""
    cluster = {
        **CLUSTER,
        "nodes": {
            "p3.2xlarge": {"price": 3.0, "units": {"v100": 1}, "available": 4},
            "p3.8xlarge": {"price": 12.5, "units": {"v100": 4}, "available": 1, "link_gbps": {"v100": 1200}},
        },
    }
    args = ["plan", write_yaml(tmp_path / "p.yaml", PROFILE), write_yaml(tmp_path / "c.yaml", cluster)]
    args += ["--objective", "time", "--json"]
    exact_plan = json.loads(runner.invoke(app, [*args, "-s", "exact"]).output)
    found = runner.invoke(app, [*args, "-s", scheduler, "--seed", "1"])
    assert found.exit_code == 0, found.output
    plan = json.loads(found.output)
    assert exact_plan["rental"] == plan["rental"] == {"p3.8xlarge": 1}
    assert plan["link_gbps"] == {"v100": 1200} and plan["stages"][0]["replicas"] == 4
    assert math.isclose(plan["throughput"], 512 / (8 * 0.01 / 4 + 2 * 4e8 / 1.5e11 * 3 / 4), rel_tol=1e-9)
    assert math.isclose(plan["throughput"], exact_plan["throughput"], rel_tol=1e-12)


def test_a_stale_plan_with_a_what_if_is_refreshed_with_it(tmp_path):
    """check's fix command for a plan made with --explain keeps --explain, so the refreshed plan
    still holds its what-if, and it passes the check that suggested it."""
    two = {**CLUSTER, "nodes": {"p3.8xlarge": {**CLUSTER["nodes"]["p3.8xlarge"], "available": 2}}}
    profile = write_yaml(tmp_path / "p.yaml", PROFILE)
    cluster = write_yaml(tmp_path / "c.yaml", two)
    out = tmp_path / "plan.yaml"
    args = ["plan", profile, cluster, "--objective", "time", "-s", "exact", "--explain", "-o", str(out)]
    assert runner.invoke(app, args).exit_code == 0
    faster = {**two, "nodes": {"p3.8xlarge": {**two["nodes"]["p3.8xlarge"], "link_gbps": {"v100": 2400}}}}
    write_yaml(tmp_path / "c.yaml", faster)
    check = ["check", str(out), "--profile", profile, "--cluster", cluster, "--objective", "time"]
    result = runner.invoke(app, check, env={"COLUMNS": "400"})
    assert result.exit_code == 1, result.output
    fix = next(line for line in result.output.splitlines() if "refresh it: heterps plan" in line)
    command = shlex.split(fix.split("refresh it: ", 1)[1].strip())
    assert "--explain" in command
    assert runner.invoke(app, command[1:]).exit_code == 0
    assert yaml.safe_load(out.read_text())["what_if"]
    assert runner.invoke(app, check).exit_code == 0


@pytest.mark.parametrize(("replicas", "over_link"), [(4, True), (5, False)])
def test_on_several_nodes_a_type_that_fits_its_first_node_all_reduces_over_its_links(replicas, over_link):
    """Two 4-V100 nodes rented (for their cores, say): four replicas are placed on the first and
    all-reduce over its NVLink; a fifth lands on the second node and the ring crosses the network."""
    from heterps_cli.plan import make_plan
    from heterps_cli.problem import build_problem

    cluster = {
        **CLUSTER,
        "nodes": {"p3.8xlarge": {**CLUSTER["nodes"]["p3.8xlarge"], "available": 2}},
    }
    problem = build_problem(Profile.model_validate(PROFILE), Cluster.model_validate(cluster))
    plan = make_plan(problem, [0], [replicas], scheduler="exact", rental={"p3.8xlarge": 2})
    y = 4e8 / 1.5e11 if over_link else 4e8 / 3.125e9  # the all-reduce between two replicas, Y
    assert math.isclose(plan.stages[0].comm_s, 2 * y * (replicas - 1) / replicas, rel_tol=1e-12)
    assert plan.link_gbps == ({"v100": 1200} if over_link else None)
    assert plan.stages[0].nodes == ({"p3.8xlarge#1": 4} if over_link else {"p3.8xlarge#1": 4, "p3.8xlarge#2": 1})
