"""``heterps launch``: the commands that start a plan on its nodes (docs/guide/launching.md)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from heterps_cli.cli.options import MAX_THREADS, DeviceMapOpt, RunModelOpt
from heterps_cli.cli.session import exit_codes, not_an_input, out, users_prints_to_stderr
from heterps_cli.shell import quote
from heterps_cli.untrusted import printable

_PlanArg = Annotated[
    Path, typer.Argument(metavar="PLAN", help="A plan written by heterps plan --out.", show_default=False)
]
_OutDirOpt = Annotated[
    Path,
    typer.Option(
        "--out-dir",
        "-o",
        help="Write node-I.sh (one per node), launch.sbatch and a copy of the plan here.",
        show_default=False,
    ),
]
_TaskOpt = Annotated[
    str | None,
    typer.Option(
        metavar="FILE.py:FACTORY",
        help="heterps run --task on every node (a file, by its absolute path).",
        show_default=False,
    ),
]
_StepsOpt = Annotated[int, typer.Option(min=1, help="heterps run --steps on every node.")]
_WarmupOpt = Annotated[int | None, typer.Option(min=0, help="heterps run --warmup.", show_default=False)]
_ThreadsOpt = Annotated[
    int, typer.Option(min=1, max=MAX_THREADS, help="Threads per process: heterps run --threads, and OMP_NUM_THREADS.")
]
_CheckpointDirOpt = Annotated[
    Path | None, typer.Option(help="heterps run --checkpoint-dir (by its absolute path).", show_default=False)
]
_CheckpointEveryOpt = Annotated[
    int | None, typer.Option(min=1, help="heterps run --checkpoint-every.", show_default=False)
]
_ResumeOpt = Annotated[bool, typer.Option("--resume", help="heterps run --resume.")]
_ReportOpt = Annotated[
    Path | None,
    typer.Option(help="heterps run --out: where rank 0 writes the report (absolute path).", show_default=False),
]
_IfnameOpt = Annotated[
    str | None,
    typer.Option(
        help="The network interface the nodes reach each other on: GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME.",
        show_default=False,
    ),
]
_MasterAddrOpt = Annotated[
    str, typer.Option(help="Node 0's address, as the other nodes reach it (default: $MASTER_ADDR when run).")
]
_MasterPortOpt = Annotated[int, typer.Option(min=1, max=65535, help="The port torchrun meets at on node 0.")]
_TimeOpt = Annotated[
    str | None,
    typer.Option(
        "--time",
        metavar="D-HH:MM:SS",
        help="The Slurm job's wall time. Default: twice the steps' predicted time, and 15 minutes to start.",
        show_default=False,
    ),
]
_ConstraintOpt = Annotated[
    list[str] | None,
    typer.Option(
        metavar="KIND=FEATURE",
        help="The Slurm feature that picks a node kind's nodes (repeat per kind). Default: the kind's name.",
        show_default=False,
    ),
]
_SetupOpt = Annotated[
    str | None,
    typer.Option(
        metavar="LINE",
        help="A shell line every node runs first (sh, and bash under Slurm), e.g. '. ~/venv/bin/activate' "
        "(the environment heterps is installed in). Default: none, and a node without torchrun on its PATH "
        "stops, saying so.",
        show_default=False,
    ),
]


def launch_command(
    plan_file: _PlanArg,
    out_dir: _OutDirOpt,
    model: RunModelOpt = None,
    device_map: DeviceMapOpt = None,
    task: _TaskOpt = None,
    steps: _StepsOpt = 10,
    warmup: _WarmupOpt = None,
    threads: _ThreadsOpt = 1,
    checkpoint_dir: _CheckpointDirOpt = None,
    checkpoint_every: _CheckpointEveryOpt = None,
    resume: _ResumeOpt = False,
    report: _ReportOpt = None,
    ifname: _IfnameOpt = None,
    master_addr: _MasterAddrOpt = "$MASTER_ADDR",
    master_port: _MasterPortOpt = 29500,
    time: _TimeOpt = None,
    constraint: _ConstraintOpt = None,
    setup: _SetupOpt = None,
) -> None:
    """Write the commands that start a plan on its nodes: one torchrun per node, and a Slurm script.

    Each node runs heterps run PLAN --placed under torchrun, with the processes the plan places on it,
    the plan copied beside the scripts and every path absolute. Every type that is not cpu needs --map.
    """
    with exit_codes():
        from heterps_cli.errors import InputError
        from heterps_cli.launchfiles import launch_for, node_needs
        from heterps_cli.loading import load_plan
        from heterps_cli.runtime import DEFAULT_WARMUP, check_options, check_runnable, mapped, parse_map
        from heterps_cli.runtime.precision import check_devices
        from heterps_cli.slurm import SlurmOptions, check_feature, check_time

        ck = str(checkpoint_dir) if checkpoint_dir is not None else None
        check_options(model, task, ck, checkpoint_every, resume)  # here: every node would fail on them later
        copy = out_dir / f"plan{plan_file.suffix if plan_file.suffix in ('.yaml', '.yml', '.json') else '.yaml'}"
        if report is not None:  # rank 0 writes it when the run ends: not over the plan, nor a folder
            if os.path.abspath(report) == os.path.abspath(copy):
                raise InputError(str(report), None, "--report", f"is {copy}, the plan every node runs")
            not_an_input(report, plan_file, *([task.rpartition(":")[0]] if task else []), field="--report")
        plan, doc = load_plan(str(plan_file))
        mapping = parse_map(device_map or [])
        devices = mapped(plan.types_used, mapping, strict=True)
        check_devices(plan.precision, devices, str(plan_file))  # as run refuses it on every node
        run_args = [*(["--model", _absolute(model)] if model else []), *(["--task", _absolute(task)] if task else [])]
        run_args += [a for t, d in mapping.items() for a in ("--map", f"{t}={d}")]
        run_args += _run_options(steps, warmup, threads, ck, checkpoint_every, resume, report)
        shared = _shared_paths(copy, model, task, ck, report)
        slurm = SlurmOptions(
            time=check_time(time) if time is not None else None,
            features=dict(check_feature(c, _kinds(plan)) for c in constraint or []),
            output_dir=os.path.abspath(out_dir),
            setup=setup,
            shared=tuple(shared),
            steps=steps if task else (warmup if warmup is not None else DEFAULT_WARMUP) + steps,
        )
        try:
            needs = node_needs(plan, devices, threads, ifname)
            at = os.path.abspath(copy)
            launch = launch_for(plan, at, run_args, master_addr=master_addr, master_port=master_port, needs=needs,
                                source=str(plan_file), slurm=slurm)  # fmt: skip
        except ValueError as exc:
            raise InputError(str(plan_file), None, "stages", str(exc)) from None
        with users_prints_to_stderr():  # every node's run would refuse what this refuses, after the rental
            check_runnable(plan, doc, model or plan.model, task)
        _write(launch, plan_file, out_dir, copy.name)
        if len(launch.nodes) > 1:
            _warn_local(shared)


def _run_options(steps, warmup, threads, checkpoint_dir, checkpoint_every, resume, report) -> list[str]:
    """heterps run's own options on every node, every path absolute."""
    args = ["--steps", str(steps), *(["--warmup", str(warmup)] if warmup is not None else [])]
    args += ["--threads", str(threads)]
    args += ["--checkpoint-dir", os.path.abspath(checkpoint_dir)] if checkpoint_dir is not None else []
    args += [*(["--checkpoint-every", str(checkpoint_every)] if checkpoint_every else [])]
    return args + [*(["--resume"] if resume else []), *(["--out", os.path.abspath(report)] if report else [])]


def _write(launch, plan_file: Path, out_dir: Path, copy: str) -> None:
    """The node scripts, the Slurm script and the plan's copy, as one set; what each node runs."""
    from heterps_cli.launchfiles import node_script
    from heterps_cli.outfiles import OutFile, write_set

    files = {f"node-{n.index}.sh": OutFile(node_script(str(plan_file), launch, n), 0o755) for n in launch.nodes}
    files["launch.sbatch"] = OutFile(launch.slurm)
    files[copy] = OutFile(plan_file.read_bytes())
    written = write_set(out_dir, files, "--out-dir", "launch")
    for node in launch.nodes:
        kind = f" ({node.kind})" if node.kind else ""
        out.print(Text(f"node {node.index}: {node.node}{kind}, {node.processes} processes", style="bold"))
        out.print(Text(f"  {printable(node.command)}"))  # a path's newline, quoted, is still one line here
    out.print(Text(printable(f"wrote {', '.join(quote(str(p)) for p in written)}")))


def _kinds(plan) -> list[str]:
    return list(dict.fromkeys(node.rpartition("#")[0] for s in plan.stages for node in s.nodes or {}))


def _shared_paths(copy: Path, model: str | None, task: str | None, checkpoint_dir: str | None, report) -> list[str]:
    """What every node reads or writes at the path launch passes on: the plan copy, a FILE.py model or
    task, the folders of the checkpoints and the report."""
    paths = [os.path.abspath(copy)]
    paths += [_absolute(spec).rpartition(":")[0] for spec in (model, task) if spec and _absolute(spec) != spec]
    if checkpoint_dir is not None:  # run makes the folder: its parent must be there
        paths.append(os.path.dirname(os.path.abspath(checkpoint_dir)))
    if report is not None:
        paths.append(os.path.dirname(os.path.abspath(report)))
    return list(dict.fromkeys(paths))


def _warn_local(paths: list[str]) -> None:
    from heterps_cli.cli.terminal import err
    from heterps_cli.launchfiles import local_file_system

    for path in paths:
        found = local_file_system(path)
        if found is not None:
            said = (
                f"{path} is on {found[0]} (mounted at {found[1]}), not a file system machines share unless your "
                "cluster makes it one: every node must see it at this path (each node's script checks first)"
            )
            err.print(Text("warning: ", style="bold yellow") + Text(printable(said)))


def _absolute(spec: str) -> str:
    """A ``FILE.py:FACTORY`` by its absolute path, as every node reads it; a zoo name or a module as given."""
    where, sep, name = spec.rpartition(":")
    return f"{os.path.abspath(where)}:{name}" if sep and where.endswith(".py") else spec
