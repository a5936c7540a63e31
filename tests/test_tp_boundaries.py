"""Section 1h's stage boundaries at tensor-parallel degree d: each unit moves 1/d of the bytes over its own
link and the units gather the rest inside the node, in the model (by hand here) and in ``heterps run``."""

from __future__ import annotations

import pytest
import torch
import yaml

from heterps_cli.runtime.sharding import boundary_parts, whole_of
from tests.helpers import plan_and_check, problem_from_dicts, write_yaml
from tests.test_tensor_parallel import big_layers

GBIT = 1e9 / 8  # bytes/s in one Gbit/s


def _files(tmp_path, **gpu):
    """big_layers (four blocks that fit a 40 GB GPU only at tp 2 or 4, 1e6 bytes a sample between them)
    on GPUs of 8 Gbit/s, with ``gpu``'s fields."""
    profile, cluster = big_layers(tmp_path)
    data = yaml.safe_load(open(cluster))
    data["resources"]["gpu"] |= {"bandwidth_gbps": 8} | gpu
    return profile, write_yaml(tmp_path / "c.yaml", data)


def _by_hand(plan: dict, stage: dict, gather_gbps: float | None, shared: bool) -> float:
    """transfer_s of ``stage`` from section 1h's formula: the busiest replica's share of the micro-batch."""
    B0, n = plan["batch_size"], 4
    d, k = stage.get("tp", 1), stage["replicas"]
    share = -(-B0 // k)
    io = 1e6 * ((stage["first"] > 0) + (stage["last"] < n - 1))
    bw = 8 * GBIT
    lk = (gather_gbps or 8) * GBIT
    return 2 * share * io / bw / (1 if shared else d) + share * io * (d - 1) / d / lk


@pytest.mark.parametrize("shared", [False, True])
def test_a_tp_stages_boundary_is_charged_as_its_units_send_and_gather(tmp_path, shared):
    profile, cluster = _files(tmp_path, **({"shared_link": True} if shared else {}))
    plan = plan_and_check(profile, cluster, tmp_path / "plan.yaml")
    inner = [s for s in plan["stages"] if s["first"] > 0 or s["last"] < 3]
    assert inner and all(s.get("tp", 1) > 1 for s in plan["stages"])
    for stage in plan["stages"]:
        assert stage["transfer_s"] == pytest.approx(_by_hand(plan, stage, None, shared), rel=1e-12)


@pytest.mark.parametrize(("links", "gather_gbps"), [({"a": 2400, "b": 800}, 800), ({"a": 2400}, 8), ({}, 8)])
def test_the_gather_runs_at_the_least_link_of_a_kind_holding_the_type(tmp_path, links, gather_gbps):
    """Two node kinds of four GPUs: the gather's link is the least kind's, the network where a kind gives none."""
    profile, cluster = big_layers(tmp_path, nodes=True)
    data = yaml.safe_load(open(cluster))
    data["resources"]["gpu"]["bandwidth_gbps"] = 8
    data["nodes"] = {
        kind: {"price": 8.0, "units": {"gpu": 4}, "available": 2}
        | ({"link_gbps": {"gpu": links[kind]}} if kind in links else {})
        for kind in ("a", "b")
    }
    problem = problem_from_dicts(yaml.safe_load(open(profile)), data)
    two = problem.view_at(2)
    per_byte = 1 / (2 * 8 * GBIT) + 1 / 4 / (gather_gbps * GBIT)
    assert two.boundary_rate[0] == pytest.approx(per_byte, rel=1e-12)
    assert problem.boundary_rate[0] == pytest.approx(1 / (8 * GBIT), rel=1e-12)  # tp 1: as section 1b


@pytest.mark.parametrize("shape", [(3, 5), (1, 7), (0, 4), (4, 2, 3)])
@pytest.mark.parametrize("d", [1, 2, 4])
def test_boundary_parts_are_equal_and_give_back_the_tensor(shape, d):
    tensor = torch.arange(int(torch.tensor(shape).prod())).reshape(shape).float()
    parts = boundary_parts(tensor, d)
    assert len(parts) == d and len({p.numel() for p in parts}) == 1
    assert torch.equal(whole_of(parts, shape), tensor)
