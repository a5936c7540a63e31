"""The ``heterps`` command line: thin wrappers that load, call the library, and render."""

from __future__ import annotations

import enum
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.text import Text

from heterps_cli import __version__
from heterps_cli.errors import EXIT_BAD_INPUT, EXIT_INFEASIBLE, InfeasibleError, InputError
from heterps_cli.formats import load_cluster, load_profile
from heterps_cli.problem import build_problem, usable_types
from heterps_cli.render import print_plan, print_summary
from heterps_cli.schedulers import SCHEDULERS, SolveOptions, solve
from heterps_cli.schedulers.rl import Config as RLConfig
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

SchedulerName = enum.Enum("SchedulerName", {name: name for name in SCHEDULERS}, type=str)


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
    except KeyboardInterrupt:
        err.print(Text("interrupted", style="bold red"))
        raise typer.Exit(130) from None


@contextmanager
def _progress_bar():
    """A transient progress bar on stderr; yields the callback schedulers report to."""
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=True) as bar:
        task = bar.add_task("starting…", total=None)

        def report(description: str, completed: float | None = None, total: float | None = None) -> None:
            bar.update(task, description=description, completed=completed, total=total)

        yield report


ProfileArg = Annotated[Path, typer.Argument(help="Model profile YAML (SPEC section 2).", show_default=False)]
ClusterArg = Annotated[Path, typer.Argument(help="Cluster YAML (SPEC section 3).", show_default=False)]


@app.command()
def plan(
    profile: ProfileArg,
    cluster: ClusterArg,
    scheduler: Annotated[
        SchedulerName,
        typer.Option("--scheduler", "-s", help="How to search. " + " ".join(f"[bold]{k}[/]: {v}." for k, (_, v) in SCHEDULERS.items())),
    ] = "rl",
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
    steps: Annotated[
        Optional[int], typer.Option(min=0, help=f"rl: training steps (default {RLConfig.steps}).", show_default=False, rich_help_panel="Learning")
    ] = None,
    batch: Annotated[
        Optional[int], typer.Option(min=1, help=f"rl: schedules sampled per step (default {RLConfig.batch}).", show_default=False, rich_help_panel="Learning")
    ] = None,
    time_limit: Annotated[
        Optional[float], typer.Option(callback=_positive, help="rl: stop training after this many seconds (the plan may then depend on machine speed).", show_default=False, rich_help_panel="Learning")
    ] = None,
    policy_in: Annotated[
        Optional[Path], typer.Option(help="rl: warm-start from a policy saved by --policy-out (same cluster types, any model).", show_default=False, rich_help_panel="Learning")
    ] = None,
    policy_out: Annotated[
        Optional[Path], typer.Option(help="rl: save the trained policy to this file.", show_default=False, rich_help_panel="Learning")
    ] = None,
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
        options = SolveOptions(steps=steps, batch=batch, time_limit=time_limit, policy_in=policy_in, policy_out=policy_out)
        with _progress_bar() as report:
            result = solve(scheduler.value, problem, seed=seed, progress=report, options=options)
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
