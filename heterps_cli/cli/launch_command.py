"""``heterps launch``: the commands that start a plan on its nodes (docs/guide/launching.md)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from heterps_cli.cli.options import DeviceMapOpt, RunModelOpt
from heterps_cli.cli.session import exit_codes, out


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
        from heterps_cli.launchfiles import launch_for, node_script
        from heterps_cli.runtime import parse_map
        from heterps_cli.yamlio import write_atomic

        plan, _ = load_plan(str(plan_file))
        parse_map(device_map or [])  # the same errors as heterps run's, before any file is written
        if out_dir.exists() and not out_dir.is_dir():
            raise InputError(str(out_dir), None, "--out-dir", "is a file, not a directory")
        run_args = [*(["--model", model] if model else []), *(a for m in device_map or [] for a in ("--map", m))]
        run_args += ["--steps", str(steps)]
        try:
            launch = launch_for(plan, str(plan_file), run_args, master_addr=master_addr, master_port=master_port)
        except ValueError as exc:
            raise InputError(str(plan_file), None, "stages", str(exc)) from None
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for node in launch.nodes:
            path = out_dir / f"node-{node.index}.sh"
            write_atomic(path, node_script(str(plan_file), launch, node))
            path.chmod(0o755)
            written.append(path)
        write_atomic(out_dir / "launch.sbatch", launch.slurm)
        for node in launch.nodes:
            kind = f" ({node.kind})" if node.kind else ""
            out.print(Text(f"node {node.index}: {node.node}{kind}, {node.processes} processes", style="bold"))
            out.print(Text(f"  {node.command}"))
        where = ", ".join(shlex.quote(str(p)) for p in written)
        out.print(Text(f"wrote {where} and {out_dir / 'launch.sbatch'}"))
