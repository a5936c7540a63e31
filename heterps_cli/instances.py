"""Cluster files from the instance catalogue (``heterps cluster``, docs/guide/renting.md).

The catalogue (``instances.yaml``, or ``--catalogue FILE``) lists machines rented whole: the units
of each resource type they hold, named as in the device catalogue of ``heterps profile --estimate``,
their memory and network, and their hourly price. A cluster file built from it has one node kind
(docs/spec.md section 1e) per instance picked, at its on-demand or spot price, and one resource
type per kind of unit, whose per-unit memory and network bandwidth are the least any picked
instance gives a unit of that type: a plan that fits on the smallest share fits on every node.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from heterps_cli.errors import InputError
from heterps_cli.formats import Catalogue, Cluster, InstanceCatalogue
from heterps_cli.loading import load_catalogue, load_instances
from heterps_cli.yamlio import dump_yaml

CATALOGUE = Path(__file__).with_name("instances.yaml")
DEVICES = Path(__file__).parent / "profiling" / "devices.yaml"
GIB = 2**30 / 1e9  # GB per GiB
FIELD = "INSTANCE=COUNT"


@dataclass(frozen=True)
class Pick:
    instance: str
    count: int  # how many of it may be rented


def parse_picks(entries: list[str], catalogue: InstanceCatalogue, shown: str) -> list[Pick]:
    """``KIND=COUNT`` arguments (COUNT 1 when left out), each kind once and in the catalogue."""
    picks: dict[str, Pick] = {}
    for entry in entries:
        name, sep, count_text = entry.partition("=")
        if name not in catalogue.instances:
            known = ", ".join(catalogue.instances)
            raise InputError(None, None, FIELD, f"{name!r} is not in the instance catalogue {shown} (it has: {known})")
        if not sep:
            count = 1
        elif not re.fullmatch("[0-9]{1,7}", count_text) or not 1 <= int(count_text) <= 10**6:  # ASCII digits only
            raise InputError(None, None, FIELD, f"{entry!r}: COUNT must be a whole number from 1 to 1,000,000")
        else:
            count = int(count_text)
        if name in picks:
            raise InputError(None, None, FIELD, f"{name} is given twice: give each instance once, with its count")
        picks[name] = Pick(name, count)
    if not picks:
        raise InputError(None, None, FIELD, "name an instance, e.g. p3.8xlarge=4 (heterps cluster lists them)")
    return list(picks.values())


def cluster_text(
    picks: list[Pick], catalogue: InstanceCatalogue, devices: Catalogue, *, spot: bool, name: str, shown: str
) -> str:
    """The cluster file, with a header saying where every figure comes from."""
    chosen = {p.instance: catalogue.instances[p.instance] for p in picks}
    if spot:
        missing = [n for n, i in chosen.items() if i.spot is None]
        if missing:
            raise InputError(None, None, "--spot", f"no spot price for {', '.join(missing)} in {shown}")
    types = list(dict.fromkeys(t for i in chosen.values() for t in i.units))
    resources: dict[str, dict] = {}
    for t in types:
        holders = {n: i for n, i in chosen.items() if t in i.units}
        if t == "cpu":  # a core's share of the host's memory, on the instance that gives the least
            memory = _figure(min(i.host_memory_gib * GIB / i.units[t] for i in holders.values()), 3)
            entry: dict = {"unit": "CPU core", "memory_gb": memory}  # 2 vCPUs
        elif t in devices.devices:
            entry = {"unit": devices.devices[t].title, "memory_gb": devices.devices[t].memory_gb}
        else:  # a user's catalogue may name a device the device catalogue does not hold
            entry = {"unit": t}
        entry["bandwidth_gbps"] = _figure(min(i.network_gbps / i.units[t] for i in holders.values()), 4)
        resources[t] = entry
    nodes = {
        n: {
            "price": chosen[n].spot if spot else chosen[n].on_demand,
            "units": dict(chosen[n].units),
            "available": p.count,
            "label": f"{chosen[n].title}, {'spot' if spot else 'on-demand'}",
            **({"link_gbps": dict(chosen[n].link_gbps or {})} if chosen[n].link_gbps else {}),
        }
        for p in picks
        for n in [p.instance]
    }
    price = "lowest spot price seen" if spot else "on-demand price"
    header = [
        f"Built by heterps cluster from the instance catalogue {shown}:",
        f"{', '.join(f'{p.instance} x{p.count}' for p in picks)}, at the {price}, USD per instance-hour.",
    ]
    for n, i in chosen.items():
        links = f"; links: {i.link_source}" if i.link_source else ""
        header.append(f"  {n} ({i.cloud} {i.region}, read {i.read}): {i.source}; network: {i.network_source}{links}")
    header += [
        "Per unit: a GPU's memory is its device's (heterps_cli/profiling/devices.yaml); a cpu core's memory",
        "and every unit's bandwidth_gbps are the instance's memory and network divided over its units of",
        "that type, the least over the instances above. A node's link_gbps is one unit's link to the",
        "others inside it, one way (docs/spec.md section 1e).",
    ]
    data = {"cluster": name, "resources": resources, "nodes": nodes}
    from heterps_cli.problem import unrentable  # numpy: only once a cluster is built

    if (too_many := unrentable(Cluster.model_validate(data))) is not None:
        raise InputError(None, None, FIELD, f"{too_many} (the COUNTs here): every plan command would refuse it")
    body = dump_yaml(data)
    return "".join(f"# {line}\n" for line in header) + body


def _figure(x: float, decimals: int) -> float:
    """``decimals`` decimals, and at least four significant digits: a small share (a network over many
    units) never rounds to 0, which the cluster's own schema refuses."""
    return round(x, max(decimals, 3 - math.floor(math.log10(x)))) if x > 0 else x


def build(entries: list[str], *, spot: bool = False, name: str | None = None, catalogue_path: str | None = None) -> str:
    """``heterps cluster``: the cluster file's text for the instances picked."""
    shown = catalogue_path or "built in (heterps_cli/instances.yaml)"
    catalogue = load_instances(catalogue_path or str(CATALOGUE))
    picks = parse_picks(entries, catalogue, shown)
    clouds = {catalogue.instances[p.instance].cloud for p in picks}
    regions = {catalogue.instances[p.instance].region for p in picks}
    default = f"{clouds.pop()}-{regions.pop()}" if len(clouds) == len(regions) == 1 else "rented"
    return cluster_text(picks, catalogue, load_catalogue(str(DEVICES)), spot=spot, name=name or default, shown=shown)


def listing(catalogue_path: str | None = None) -> InstanceCatalogue:
    return load_instances(catalogue_path or str(CATALOGUE))
