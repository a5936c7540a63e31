"""``heterps cluster``: a cluster file of whole instances from the instance catalogue (docs/guide/renting.md)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from heterps_cli.cli.session import exit_codes, out, write_output


def cluster_command(
    instances: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="[INSTANCE=COUNT]...",
            help="Instances to rent and how many of each may be (COUNT 1 when left out), e.g. p4d.24xlarge=2. "
            "None: list the catalogue.",
            show_default=False,
        ),
    ] = None,
    spot: Annotated[bool, typer.Option("--spot", help="Price at the lowest spot price seen, not on-demand.")] = False,
    name: Annotated[
        str | None, typer.Option(help="The cluster's name. Default: CLOUD-REGION of the instances.")
    ] = None,
    catalogue: Annotated[
        str | None,
        typer.Option(help="Your own instance catalogue (laid out as the built-in heterps_cli/instances.yaml)."),
    ] = None,
    out_file: Annotated[
        str, typer.Option("--out", "-o", help="Write the cluster YAML here, atomically; - for standard output.")
    ] = "-",
) -> None:
    """Build a cluster file of whole instances (section 1e nodes) from the instance catalogue.

    [bold]heterps cluster p3.8xlarge=4 c7i.24xlarge=8 --out cluster.yaml[/] prices both at their on-demand
    prices; [bold]heterps cluster[/] alone lists the catalogue.
    """
    with exit_codes():
        from heterps_cli import instances as catalogue_of
        from heterps_cli.loading import check_name

        if not instances:
            out.print(listing_table(catalogue_of.listing(catalogue)))
            return
        if name is not None:
            name = check_name(name, "--name")
        text = catalogue_of.build(instances, spot=spot, name=name, catalogue_path=catalogue)
        write_output(out_file, text)
        if out_file != "-":
            out.print(Text(f"wrote {out_file}"))
            out.print(Text(f"next: heterps plan PROFILE {out_file} --samples N (profile types: its resources)"))


def listing_table(catalogue) -> Table:
    instances = catalogue.instances.values()
    dates = sorted({i.read for i in instances})
    sources = sorted({i.source for i in instances})
    regions = ", ".join(sorted({f"{i.cloud} {i.region}" for i in instances}))
    table = Table(
        title="instance catalogue: USD per instance-hour",
        caption=f"{regions}; read {', '.join(dates)} from {'; '.join(sources)}; network: each instance's "
        "published figure (heterps_cli/instances.yaml says which)",
        title_justify="left",
        caption_justify="left",
        box=None,
    )
    table.add_column("instance", overflow="fold")
    table.add_column("cloud", no_wrap=True)
    table.add_column("units", no_wrap=True)
    for column in ("Gbit/s", "on-demand", "spot"):
        table.add_column(column, justify="right", no_wrap=True)
    for name, i in catalogue.instances.items():
        units = ", ".join(f"{n} {t}" for t, n in i.units.items())
        spot = f"{i.spot:,.2f}" if i.spot is not None else "-"
        table.add_row(name, i.cloud, units, f"{i.network_gbps:g}", f"{i.on_demand:,.2f}", spot)
    return table
