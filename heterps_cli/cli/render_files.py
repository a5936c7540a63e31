"""Human output of ``heterps validate``: what a profile, cluster or plan file says, and how a profile's
types meet a cluster's."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from heterps_cli.cli.render import bold, clip, ranges
from heterps_cli.figures import count, number, plural, usd
from heterps_cli.formats import Cluster, Plan, Profile


def print_summary(
    console: Console, profile: Profile, path: str, cluster: Cluster | None, cluster_path: str | None
) -> None:
    job = profile.job
    console.print(
        Text.assemble(
            ("✓", "bold green"),
            f" {clip(path)}: model ",
            bold(profile.model),
            f", {plural(len(profile.layers), 'layer')}, batch size {profile.batch_size}"
            + (f" (times at {', '.join(map(str, profile.sizes))})" if len(profile.sizes) > 1 else ""),
        )
    )
    if job.samples or job.epochs or job.min_throughput:
        parts = [
            f"{field} {number(getattr(job, field))}"
            for field in ("samples", "epochs", "min_throughput")
            if getattr(job, field) is not None
        ]
        console.print(f"  job: {', '.join(parts)}")
    if job.samples is None:
        console.print(
            Text.assemble(
                ("  note:", "yellow"),
                " no job.samples, so `heterps plan` will need "
                "--samples N (samples per epoch); add a job section to the profile to keep it there",
            )
        )
    kinds: dict[str, int] = {}
    for layer in profile.layers:
        kinds[layer.type] = kinds.get(layer.type, 0) + 1
    console.print(Text("  layer kinds: " + ", ".join(f"{clip(k)} ×{n}" for k, n in kinds.items())))
    types = list(profile.types)
    sharded = {  # section 1h: the degrees each type's layers give beside tp 1
        t: sorted({d for layer in profile.layers if t in layer.times for d in (layer.times[t].tp or {})}) for t in types
    }
    if any(sharded.values()):
        given = "; ".join(f"{clip(t)} at tp {', '.join(map(str, d))}" for t, d in sharded.items() if d)
        console.print(Text(f"  tensor parallelism (docs/spec.md section 1h, with a global batch): {given}"))
    if profile.precision is not None:
        console.print(Text(f"  precision: {profile.precision} (what its times assume the model trains at)"))
    if profile.fixed:
        given = "; ".join(
            f"{clip(t)} pass start {c.pass_start:.3g} s, all-reduce latency {c.all_reduce_latency:.3g} s, "
            f"transfer latency {c.transfer_latency:.3g} s"
            for t, c in profile.fixed.items()
        )
        console.print(Text(f"  fixed costs per stage (docs/spec.md section 1d, with a global batch): {given}"))
    for tie in profile.ties or []:  # section 1j
        console.print(
            Text(
                f"  tied {tie.kind} {clip(tie.tensor)} ({number(tie.bytes)} bytes), held by layers "
                f"{', '.join(clip(name) for name in tie.layers)}: counted once; a plan keeps its holders at tp 1 "
                "and sums its gradient across the stages that hold it (docs/spec.md section 1j)"
            )
        )
    console.print(_types_table(profile, types, cluster))
    if cluster is not None:
        _print_cluster_fit(console, cluster, cluster_path, types)


def _types_table(profile: Profile, types: list[str], cluster: Cluster | None) -> Table:
    """Per resource type: the layers it times, their total OCT and ODT, and the cluster's price and limit."""
    table = Table(header_style="bold", box=box.SIMPLE_HEAD)
    table.add_column("resource")
    table.add_column("runs layers")
    table.add_column("total OCT s/batch", justify="right")
    table.add_column("total ODT s/batch", justify="right")
    if cluster is not None:
        table.add_column("price $/h", justify="right")
        table.add_column("limit", justify="right")
    for t in types:
        idx = [i for i, layer in enumerate(profile.layers) if t in layer.times]
        row: list = [
            Text(clip(t)),
            f"{len(idx)}/{len(profile.layers)}: {ranges(idx)}",
            f"{sum(profile.layers[i].times[t].oct for i in idx):.4g}",
            f"{sum(profile.layers[i].times[t].odt for i in idx):.4g}",
        ]
        if cluster is not None:
            row += list(_price_and_limit(cluster, t)) if t in cluster.resources else ["[dim]not in cluster[/]", ""]
        table.add_row(*row)
    return table


def _print_cluster_fit(console: Console, cluster: Cluster, cluster_path: str | None, types: list[str]) -> None:
    """The cluster's line, and the types that one of the profile and the cluster has and the other lacks."""
    unused = [t for t in cluster.resources if t not in types]
    ignored = [t for t in types if t not in cluster.resources]
    console.print(
        Text.assemble(
            ("✓", "bold green"),
            f" {clip(cluster_path or '')}: cluster ",
            bold(cluster.cluster),
            f", {plural(len(cluster.resources), 'resource type')}",
        )
    )
    if ignored:
        console.print(
            Text.assemble(
                ("  note:", "yellow"),
                f" profiled types not in the cluster are ignored when planning: {', '.join(clip(t) for t in ignored)}",
            )
        )
    if unused:
        console.print(
            Text.assemble(
                ("  note:", "yellow"),
                f" cluster types the profile never times cannot be used: {', '.join(clip(t) for t in unused)}",
            )
        )


def print_cluster(console: Console, cluster: Cluster, path: str) -> None:
    """``heterps validate CLUSTER``: each type's price, limit and what section 1b knows of it."""
    console.print(
        Text.assemble(
            ("✓", "bold green"),
            f" {clip(path)}: cluster ",
            bold(cluster.cluster),
            f", {plural(len(cluster.resources), 'resource type')}",
        )
    )
    table = Table(header_style="bold", box=box.SIMPLE_HEAD)
    for name in ("resource", "unit", "price $/h", "limit", "memory GB", "network Gbit/s"):
        table.add_column(name, justify="left" if name in ("resource", "unit") else "right")
    for t, r in cluster.resources.items():
        table.add_row(
            Text(clip(t)),
            Text(clip(r.unit or t)),
            *_price_and_limit(cluster, t),
            "—" if r.memory_gb is None else f"{r.memory_gb:,.6g}",
            "—" if r.bandwidth_gbps is None else f"{r.bandwidth_gbps:,.6g}",
        )
    console.print(table)
    if cluster.nodes is not None:
        nodes = Table(header_style="bold", box=box.SIMPLE_HEAD)
        for name in ("node kind", "units", "price $/h", "available", "links in node, Gbit/s"):
            nodes.add_column(
                name, justify="left" if name in ("node kind", "units", "links in node, Gbit/s") else "right"
            )
        for kind, node in cluster.nodes.items():
            held = ", ".join(f"{clip(t)}×{n:,}" for t, n in node.units.items())
            links = ", ".join(f"{clip(t)} {g:,.6g}" for t, g in (node.link_gbps or {}).items()) or "—"
            price = usd(node.price).removeprefix("$")
            nodes.add_row(Text(clip(kind)), Text(held), price, count(node.available), Text(links))
        console.print(nodes)
        console.print("  units come in whole nodes: a plan pays for every unit of the nodes it rents")
    if any(r.memory_gb is None or r.bandwidth_gbps is None for r in cluster.resources.values()):
        console.print("  — not given: memory is not checked, or stage-boundary transfer is free, on that type")


def _price_and_limit(cluster: Cluster, t: str) -> tuple[str, str]:
    """A type's price per unit-hour and its limit, or with nodes (section 1e): per node, and the units
    of every available node."""
    r = cluster.resources[t]
    if cluster.nodes is None:
        assert r.price is not None and r.limit is not None, "load_cluster refuses a type without them"
        return usd(r.price).removeprefix("$"), count(r.limit)
    return "per node", count(sum(node.units.get(t, 0) * node.available for node in cluster.nodes.values()))


def print_plan_file(console: Console, plan: Plan, path: str, cluster_path: str | None = None) -> None:
    """``heterps validate PLAN [CLUSTER]``: what the plan file says, well-formed (and on the cluster's types,
    units and nodes); its figures are check's to judge."""
    layout = " | ".join(
        f"{clip(s.resource)}×{s.replicas}" + "".join(f"+{clip(j.resource)}{j.way}×{j.replicas}" for j in s.joined or ())
        for s in plan.stages
    )
    console.print(
        Text.assemble(
            ("✓", "bold green"),
            f" {clip(path)}: a plan of ",
            bold(plan.model),
            " on ",
            bold(plan.cluster),
            f" by {clip(plan.scheduler)}, {plural(len(plan.stages), 'stage')}: {layout}",
        )
    )
    console.print(f"  throughput {count(plan.throughput, 1)} samples/s, cost {usd(plan.cost_usd)}")
    on = f", on types, units and nodes {clip(cluster_path)} has" if cluster_path else ""
    console.print(f"  well-formed{on}; to recompute its figures: heterps check PLAN --profile P --cluster C")
