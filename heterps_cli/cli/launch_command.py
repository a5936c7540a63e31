"""``heterps launch``: the commands that start a plan on its nodes (docs/guide/launching.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from heterps_cli.cli.options import DeviceMapOpt, RunModelOpt
from heterps_cli.cli.session import exit_codes, out
from heterps_cli.shell import quote
from heterps_cli.untrusted import printable


def launch_command(
    plan_file: Annotated[
        Path, typer.Argument(metavar="PLAN", help="A plan written by heterps plan --out.", show_default=False)
    ],
    out_dir: Annotated[
        Path,
        typer.Option(
            "--out-dir", "-o", help="Write node-I.sh (one per node) and launch.sbatch here.", show_default=False
        ),
    ],
    model: RunModelOpt = None,
    device_map: DeviceMapOpt = None,
    steps: Annotated[int, typer.Option(min=1, help="heterps run --steps on every node.")] = 10,
    master_addr: Annotated[
        str,
        typer.Option(help="Node 0's address, as the other nodes reach it (default: $MASTER_ADDR when run)."),
    ] = "$MASTER_ADDR",
    master_port: Annotated[int, typer.Option(min=1, max=65535, help="The port torchrun meets at on node 0.")] = 29500,
) -> None:
    """Write the commands that start a plan on its nodes: one torchrun per node, and a Slurm script.

    Each node runs heterps run PLAN --placed under torchrun, with the processes the plan places on it.
    """
    with exit_codes():
        from heterps_cli.errors import InputError
        from heterps_cli.formats import load_plan
        from heterps_cli.launchfiles import LAUNCH_FILES, launch_for, node_script
        from heterps_cli.outfiles import OutFile, write_set
        from heterps_cli.runtime import parse_map

        plan, _ = load_plan(str(plan_file))
        parse_map(device_map or [])  # the same errors as heterps run's, before any file is written
        run_args = [*(["--model", model] if model else []), *(a for m in device_map or [] for a in ("--map", m))]
        run_args += ["--steps", str(steps)]
        try:
            launch = launch_for(plan, str(plan_file), run_args, master_addr=master_addr, master_port=master_port)
        except ValueError as exc:
            raise InputError(str(plan_file), None, "stages", str(exc)) from None
        files = {f"node-{n.index}.sh": OutFile(node_script(str(plan_file), launch, n), 0o755) for n in launch.nodes}
        files["launch.sbatch"] = OutFile(launch.slurm)
        written = write_set(out_dir, files, LAUNCH_FILES, "--out-dir")
        for node in launch.nodes:
            kind = f" ({node.kind})" if node.kind else ""
            out.print(Text(f"node {node.index}: {node.node}{kind}, {node.processes} processes", style="bold"))
            out.print(Text(f"  {printable(node.command)}"))  # a path's newline, quoted, is still one line here
        out.print(Text(printable(f"wrote {', '.join(quote(str(p)) for p in written)}")))
