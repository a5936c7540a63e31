"""The ``heterps`` command line: thin wrappers that load, call the library, and render."""

from __future__ import annotations

import enum
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.text import Text

from heterps_cli import __version__
from heterps_cli.errors import EXIT_BAD_INPUT, EXIT_INFEASIBLE, InfeasibleError, InputError
from heterps_cli.formats import load_cluster, load_profile
from heterps_cli.problem import build_problem, usable_types
from heterps_cli.render import print_plan, print_summary
from heterps_cli.schedulers import DESCRIPTIONS, solve
from heterps_cli.yamlio import dump_yaml, write_atomic

app = typer.Typer(
    name="heterps",
    help="Plan DNN training on heterogeneous, priced resources: which layers go on which resource, "
    "how many replicas each stage gets, the throughput, and the dollar cost.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
)

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)

SchedulerName = enum.Enum("SchedulerName", {name: name for name in DESCRIPTIONS}, type=str)


class Objective(str, enum.Enum):
    cost = "cost"
    time = "time"


def _version(value: bool) -> None:
    if value:
        out.print(f"heterps {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        Optional[bool], typer.Option("--version", callback=_version, is_eager=True, help="Show the version and exit.")
    ] = None,
) -> None:
    pass


def _positive(value: float | None) -> float | None:
    if value is not None and not value > 0:
        raise typer.BadParameter(f"must be > 0 (got {value:g})")
    return value


@contextmanager
def _exit_codes():
    """Turn the library's errors into one-paragraph messages and SPEC exit codes."""
    try:
        yield
    except InputError as exc:
        err.print(Text("error: ", style="bold red") + Text(str(exc)))
        raise typer.Exit(EXIT_BAD_INPUT) from None
    except InfeasibleError as exc:
        err.print(Text("infeasible: ", style="bold red") + Text(str(exc)))
        raise typer.Exit(EXIT_INFEASIBLE) from None


ProfileArg = Annotated[Path, typer.Argument(help="Model profile YAML (SPEC section 2).", show_default=False)]
ClusterArg = Annotated[Path, typer.Argument(help="Cluster YAML (SPEC section 3).", show_default=False)]


@app.command()
def plan(
    profile: ProfileArg,
    cluster: ClusterArg,
    scheduler: Annotated[
        SchedulerName,
        typer.Option("--scheduler", "-s", help="How to search: " + "; ".join(f"{k}: {v}" for k, v in DESCRIPTIONS.items())),
    ] = "exact",
    objective: Annotated[
        Objective, typer.Option(help="cost: cheapest plan meeting --min-throughput; time: fastest plan within the limits (and --max-cost).")
    ] = Objective.cost,
    min_throughput: Annotated[
        Optional[float], typer.Option(min=0, help="Required samples/s. Default: the profile's job.min_throughput, else 0.", show_default=False)
    ] = None,
    samples: Annotated[
        Optional[float], typer.Option(callback=_positive, help="Samples per epoch. Default: the profile's job.samples.", show_default=False)
    ] = None,
    epochs: Annotated[
        Optional[float], typer.Option(callback=_positive, help="Epochs. Default: the profile's job.epochs, else 1.", show_default=False)
    ] = None,
    max_cost: Annotated[
        Optional[float], typer.Option(callback=_positive, help="Budget in USD a plan must not exceed (mostly for --objective time).", show_default=False)
    ] = None,
    seed: Annotated[int, typer.Option(help="Random seed; the same inputs and seed give the same plan.")] = 0,
    out_file: Annotated[
        Optional[Path], typer.Option("--out", "-o", help="Write the plan as YAML (SPEC section 4), atomically.", show_default=False)
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON on stdout, and nothing else.")] = False,
) -> None:
    """Plan which layers run on which resource, with replica counts, throughput and cost."""
    with _exit_codes():
        prof, pdoc = load_profile(str(profile))
        clus, cdoc = load_cluster(str(cluster))
        problem = build_problem(
            prof, pdoc, clus, cdoc,
            objective=objective.value, samples=samples, epochs=epochs,
            min_throughput=min_throughput, max_cost=max_cost,
        )
        name = scheduler.value
        with err.status(f"planning with {name}…") as status:
            result = solve(name, problem, seed=seed, progress=lambda msg: status.update(msg))
        if out_file is not None:
            write_atomic(out_file, dump_yaml(result.to_dict()))
    if as_json:
        print(result.to_json())
        return
    print_plan(out, result)
    if out_file is not None:
        out.print(f"wrote {out_file}")


@app.command()
def validate(
    profile: ProfileArg,
    cluster: Annotated[Optional[Path], typer.Argument(help="Optional cluster YAML to check against the profile.", show_default=False)] = None,
) -> None:
    """Check a profile (and a cluster) and summarise them: layers, types, which layers each type runs."""
    with _exit_codes():
        prof, pdoc = load_profile(str(profile))
        clus = None
        if cluster is not None:
            clus, cdoc = load_cluster(str(cluster))
            usable_types(prof, pdoc, clus, cdoc)
    print_summary(out, prof, str(profile), clus, str(cluster) if cluster else None)


def main() -> None:
    app(prog_name="heterps")
