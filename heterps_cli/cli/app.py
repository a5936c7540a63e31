"""The ``heterps`` command line: thin wrappers that load, call the library, and render."""

from __future__ import annotations

import enum
import errno
import json
import math
import os
import sys
from contextlib import contextmanager, redirect_stdout
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, cast

import typer
import typer.core
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.text import Text

from heterps_cli import STARTED, __version__
from heterps_cli.errors import (
    EXIT_BAD_INPUT,
    EXIT_CHECK_FAILED,
    EXIT_INFEASIBLE,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    InfeasibleError,
    InputError,
    SearchGaveUp,
)
from heterps_cli.figures import count, number, plural, usd
from heterps_cli.objective import Objective
from heterps_cli.schedulers.names import (
    BATCH_LAYERS,
    DEFAULT_BATCH,
    DEFAULT_EVALUATIONS,
    DEFAULT_STEPS,
    MIN_BATCH,
    POLICY_VARIANTS,
    SCHEDULERS,
)
from heterps_cli.untrusted import printable

if TYPE_CHECKING:
    from heterps_cli.formats import Cluster, PlanFile, Profile

TABLE_ROWS = 20  # heterps frontier: rows its table shows unless --points says otherwise
# Start-up time is part of the interface (benchmarks/bench_startup.py): each command imports the
# library it uses when it runs, so `heterps --help` loads no numpy and `validate` no numpy or torch.
# torch (seconds) is imported only by `heterps profile`, rl and tapp. The zoo's names are here so
# that --help does not import the zoo.
ZOO_NAMES = ("ctr", "vgg16", "mlp", "transformer", "resnet")

app = typer.Typer(
    name="heterps",
    help="Plan DNN training on heterogeneous, priced resources: which layers go on which resource, "
    "how many replicas each stage gets, the throughput, and the dollar cost.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
)

out = Console(soft_wrap=True, highlight=False)
err = Console(stderr=True, soft_wrap=True, highlight=False)
FRONTIER_TIME_LIMIT = 300.0  # seconds: the bundled models' frontiers take under one (docs/commands.md)

# Built from the registry, so a new scheduler needs no change here (mypy cannot see the members).
SchedulerName = enum.Enum("SchedulerName", {name: name for name in SCHEDULERS}, type=str)  # type: ignore[misc]
DEFAULT_SCHEDULER = SchedulerName("rl")


def _version(value: bool) -> None:
    if value:
        out.print(f"heterps {__version__}")
        raise typer.Exit()


DEBUG = {"on": False}  # set by the root callback, which every command runs first


@app.callback()
def _root(
    version: Annotated[
        bool | None,
        typer.Option("--version", callback=_version, is_eager=True, metavar="", help="Show the version and exit."),
    ] = None,
    debug: Annotated[
        bool,
        typer.Option(
            "--debug", metavar="", help="Show the full traceback of an internal error (also HETERPS_DEBUG=1)."
        ),
    ] = False,
) -> None:
    DEBUG["on"] = debug or os.environ.get("HETERPS_DEBUG", "") not in ("", "0")


def _positive(value: float | None) -> float | None:
    if value is not None and not (value > 0 and math.isfinite(value)):
        raise typer.BadParameter(f"must be a finite number > 0 (got {number(value)})")
    return _normal(value)


def _non_negative(value: float | None) -> float | None:
    if value is not None and not (value >= 0 and math.isfinite(value)):
        raise typer.BadParameter(f"must be a finite number >= 0 (got {number(value)})")
    return _normal(value)


def _normal(value: float | None) -> float | None:
    # As in the files: a subnormal figure is no setting, and dividing by it overflows.
    if value is not None and value != 0 and abs(value) < sys.float_info.min:
        raise typer.BadParameter(f"is below the smallest normal float ({sys.float_info.min:.3g}; got {value!r})")
    return value


INTERRUPT_REPORTED = {"done": False}  # cli.entry.main says "interrupted" only when no command did


def _print_error(prefix: str, lines: list[str]) -> None:
    for line in lines:  # a message may quote what a file held (an unknown key): never raw
        err.print(Text(prefix, style="bold red") + Text(printable(line)))


@contextmanager
def _exit_codes():
    """Turn the library's errors into one-paragraph messages and exit codes of docs/spec.md section 5."""
    try:
        if sys.stdout is None:  # `>&-`: whatever the command wrote would be lost without a word
            raise InputError(
                None,
                None,
                "stdout",
                "standard output is closed, and heterps writes its result there: redirect it (> FILE, or "
                "> /dev/null to keep only --out) instead of closing it",
            )
        yield
        sys.stdout.flush()  # a full disk or a closed pipe fails here, while it can still be said
    except InputError as exc:
        _print_error("error: ", exc.lines())
        raise typer.Exit(EXIT_BAD_INPUT) from None
    except SearchGaveUp as exc:  # before InfeasibleError, its base: no proof, so not exit 3
        _print_error("no plan found: ", [str(exc)])
        raise typer.Exit(EXIT_NOT_FOUND) from None
    except InfeasibleError as exc:
        _print_error("infeasible: ", [str(exc)])
        raise typer.Exit(EXIT_INFEASIBLE) from None
    except KeyboardInterrupt:
        _report_interrupt("")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except typer.Exit:
        raise
    except Exception as exc:  # a bug: one line and its own exit code, the traceback on request
        if isinstance(exc, OSError) and exc.errno in STDOUT_ERRNOS:
            _silence_stdout()
            _print_error(
                "error: ",
                [f"cannot write standard output ({exc.strerror or exc}): what heterps printed there is incomplete"],
            )
            raise typer.Exit(EXIT_BAD_INPUT) from None
        if DEBUG["on"]:
            raise
        _print_error(
            "internal error: ",
            [
                f"{type(exc).__name__}: {exc} (heterps {__version__}; please report it with "
                "the command that caused it; --debug or HETERPS_DEBUG=1 shows the traceback)"
            ],
        )
        raise typer.Exit(EXIT_INTERNAL) from None


# Write failures only standard output can still raise here: files are read and written through
# yamlio, which turns every OSError into an InputError naming the file.
STDOUT_ERRNOS = {errno.ENOSPC, errno.EPIPE, errno.EDQUOT, errno.EFBIG, errno.EIO}


def _silence_stdout() -> None:
    """Point standard output at /dev/null once it has refused a write (a full disk, a reader that went
    away), so that Python's own flush at exit neither fails again nor changes the exit code."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    except (OSError, ValueError, AttributeError):  # no real descriptor (a test runner's buffer)
        pass


def _users_prints_to_stderr():
    """Around the user's model code (its module, factory and forward): what it prints goes to stderr,
    since stdout carries heterps's result (a profile with --out -, run's JSON)."""
    return redirect_stdout(sys.stderr)


@contextmanager
def _progress_bar():
    """A transient progress bar on stderr; yields the callback schedulers report to."""
    columns = (SpinnerColumn(), TextColumn("{task.description}", markup=False), BarColumn(), TimeElapsedColumn())
    # Not drawn when stderr is a file or a pipe: a log would keep only a stray blank line of it.
    with Progress(*columns, console=err, transient=True, disable=not err.is_terminal) as bar:
        task = bar.add_task("starting…", total=None)

        def report(description: str, completed: float | None = None, total: float | None = None) -> None:
            bar.update(task, description=description, completed=completed, total=total)

        yield report


def _not_an_input(out_file: str | Path | None, *inputs: Path | str | None) -> None:
    """Refuse an ``--out`` that names one of the command's own input files (``plan p.yaml c.yaml
    --out p.yaml`` replaced the profile with a plan)."""
    if out_file is None or str(out_file) == "-":
        return
    target = Path(out_file)
    for given in inputs:
        if given is not None and target.exists() and Path(given).exists() and os.path.samefile(target, given):
            raise InputError(
                str(out_file), None, "--out", f"is {given}, an input of this command: write the result elsewhere"
            )


def _write(path: str, data: str | bytes) -> None:
    """``--out FILE`` atomically, or ``--out -`` to standard output."""
    from heterps_cli.yamlio import write_atomic

    if path == "-":
        if isinstance(data, bytes):
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
        else:
            sys.stdout.write(data)
            sys.stdout.flush()
        return
    write_atomic(path, data)


def _interrupted(what: str) -> None:
    """After the output of a run that Ctrl-C cut short: say so, and exit 130 so scripts see it."""
    _report_interrupt(what)
    raise typer.Exit(EXIT_INTERRUPTED)


def _report_interrupt(what: str) -> None:
    """'interrupted' (with what it means for the output, when there is some); cli.entry.main then
    adds nothing of its own."""
    INTERRUPT_REPORTED["done"] = True
    _print_error("interrupted: " if what else "interrupted", [what])


ProfileArg = Annotated[Path, typer.Argument(help="Model profile YAML (docs/spec.md section 2).", show_default=False)]
ClusterArg = Annotated[Path, typer.Argument(help="Cluster YAML (docs/spec.md section 3).", show_default=False)]


OBJECTIVE_HELP = "cost: cheapest plan meeting --min-throughput; time: fastest plan within the limits (and --max-cost)."
ObjectiveOpt = Annotated[Objective, typer.Option(help=OBJECTIVE_HELP)]
PlanObjectiveOpt = Annotated[
    Objective | None,
    typer.Option(
        help=OBJECTIVE_HELP + " Default: time for --scheduler tapp (TAPP's own objective), else cost.",
        show_default=False,
    ),
]
MinThroughputOpt = Annotated[
    float | None,
    typer.Option(
        callback=_non_negative,
        help="Required samples/s. Default: the profile's job.min_throughput, else 0.",
        show_default=False,
    ),
]
SamplesOpt = Annotated[
    float | None,
    typer.Option(callback=_positive, help="Samples per epoch. Default: the profile's job.samples.", show_default=False),
]
EpochsOpt = Annotated[
    float | None,
    typer.Option(callback=_positive, help="Epochs. Default: the profile's job.epochs, else 1.", show_default=False),
]
GlobalBatchOpt = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="Samples per optimiser step: a whole number of micro-batches of the profile's batch_size, run "
        "through a 1F1B pipeline (docs/spec.md section 1d). Default: the profile's job.global_batch, else none "
        "(sections 1 and 1b: no pipeline schedule).",
        show_default=False,
    ),
]
MaxCostOpt = Annotated[
    float | None,
    typer.Option(
        callback=_positive,
        help="Budget in USD a plan must not exceed (mostly for --objective time).",
        show_default=False,
    ),
]


def _increase(value: str) -> str:
    from heterps_cli.ci.gate import Increase

    try:
        Increase.parse(value)
    except InputError as exc:
        raise typer.BadParameter(exc.message) from None
    return value


def _tolerance(value: str) -> str:
    from heterps_cli.ci.gate import percent

    try:
        percent(value, "tolerance")
    except InputError as exc:
        raise typer.BadParameter(exc.message) from None
    return value


def _seed(value: int) -> int:
    if not 0 <= value < 2**63:
        raise typer.BadParameter(f"must be a whole number from 0 to 2**63 - 1 (got {value})")
    return value


SeedOpt = Annotated[int, typer.Option(callback=_seed, help="Random seed; the same inputs and seed give the same plan.")]
StepsOpt = Annotated[
    int | None,
    typer.Option(
        min=0,
        help=f"rl, tapp: training steps (default {DEFAULT_STEPS}).",
        show_default=False,
        rich_help_panel="Search budget",
    ),
]
BatchOpt = Annotated[
    int | None,
    typer.Option(
        min=1,
        max=65536,
        help=(
            f"rl, tapp: schedules sampled per step (default {DEFAULT_BATCH}; on models over "
            f"{BATCH_LAYERS // DEFAULT_BATCH:,} layers fewer, {BATCH_LAYERS:,} / layers but at least {MIN_BATCH})."
        ),
        show_default=False,
        rich_help_panel="Search budget",
    ),
]
TimeLimitOpt = Annotated[
    float | None,
    typer.Option(
        callback=_positive,
        help="Stop searching after this many seconds (the plan may then depend on machine speed). "
        "exact then returns its best plan with the proven gap to the optimum.",
        show_default=False,
        rich_help_panel="Search budget",
    ),
]


OutOpt = Annotated[
    str | None,
    typer.Option(
        "--out",
        "-o",
        metavar="FILE",
        show_default=False,
        help="Write the plan as YAML (docs/spec.md section 4), atomically; - for standard output.",
    ),
]


def _job(
    objective: Objective,
    samples: float | None,
    epochs: float | None,
    min_throughput: float | None,
    max_cost: float | None,
    global_batch: int | None = None,
):
    from heterps_cli.api import Job

    return Job(objective.value, samples, epochs, min_throughput, max_cost, global_batch)


@app.command()
def plan(
    profile: ProfileArg,
    cluster: ClusterArg,
    scheduler: Annotated[
        SchedulerName,
        typer.Option(
            "--scheduler",
            "-s",
            help="How to search. " + " ".join(f"[bold]{k}[/]: {v}." for k, (_, v) in SCHEDULERS.items()),
        ),
    ] = DEFAULT_SCHEDULER,
    objective: PlanObjectiveOpt = None,
    min_throughput: MinThroughputOpt = None,
    samples: SamplesOpt = None,
    epochs: EpochsOpt = None,
    global_batch: GlobalBatchOpt = None,
    max_cost: MaxCostOpt = None,
    seed: SeedOpt = 0,
    out_file: OutOpt = None,
    as_json: Annotated[
        bool, typer.Option("--json", metavar="", help="Print the plan as JSON on stdout, and nothing else.")
    ] = False,
    steps: StepsOpt = None,
    batch: BatchOpt = None,
    time_limit: TimeLimitOpt = None,
    evaluations: Annotated[
        int | None,
        typer.Option(
            min=1,
            help=f"genetic, random: cost-model evaluations (default {DEFAULT_EVALUATIONS:,}).",
            show_default=False,
            rich_help_panel="Search budget",
        ),
    ] = None,
    policy_in: Annotated[
        Path | None,
        typer.Option(
            help="rl: warm-start from a policy saved by --policy-out (same cluster types, any model).",
            show_default=False,
            rich_help_panel="Search budget",
        ),
    ] = None,
    policy_out: Annotated[
        Path | None,
        typer.Option(
            help=f"rl: save the trained policy to this file, first fitted to plans of {POLICY_VARIANTS} nearby models "
            "(a few seconds more) so that it warm-starts a changed model well.",
            show_default=False,
            rich_help_panel="Search budget",
        ),
    ] = None,
) -> None:
    """Plan which layers run on which resource, with replica counts, throughput and cost."""
    with _exit_codes():
        from heterps_cli import api
        from heterps_cli.cli.render import print_plan
        from heterps_cli.schedulers import SolveOptions
        from heterps_cli.yamlio import dump_yaml

        _not_an_input(out_file, profile, cluster, policy_in)
        if objective is None:
            objective = Objective.TIME if scheduler.value == "tapp" else Objective.COST
        options = SolveOptions(
            steps=steps,
            batch=batch,
            time_limit=time_limit,
            policy_in=policy_in,
            policy_out=policy_out,
            evaluations=evaluations,
            started=STARTED if time_limit is not None else None,  # loading the files counts too
        )
        with _progress_bar() as report:
            result = api.plan(
                str(profile),
                str(cluster),
                scheduler.value,
                _job(objective, samples, epochs, min_throughput, max_cost, global_batch),
                seed=seed,
                options=options,
                progress=report,
            )
        write_failed = None
        if out_file is not None:
            try:
                _write(out_file, dump_yaml(result.to_dict()))
            except InputError as exc:  # the run is done: show its plan all the same, then fail
                write_failed = exc
        if as_json:
            print(result.to_json())
        elif out_file != "-":
            print_plan(out, result)
            if out_file is not None and write_failed is None:
                out.print(Text(f"wrote {out_file}"))
        if write_failed is not None:
            raise write_failed
    if result.interrupted:
        _interrupted("the plan above is the best found before Ctrl-C (exit 130)")


@app.command()
def frontier(
    profile: ProfileArg,
    cluster: ClusterArg,
    min_throughput: Annotated[
        float | None,
        typer.Option(
            callback=_non_negative,
            help="The curve's lower end in samples/s. Default: the profile's job.min_throughput, else 0.",
            show_default=False,
        ),
    ] = None,
    samples: SamplesOpt = None,
    epochs: EpochsOpt = None,
    global_batch: GlobalBatchOpt = None,
    max_cost: Annotated[
        float | None,
        typer.Option(callback=_positive, help="Leave out plans costing more than this (USD).", show_default=False),
    ] = None,
    points: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Keep N plans spread evenly over throughput: both ends and the knee always; 1 gives the knee. "
            f"Default: all of them (the table shows at most {TABLE_ROWS}).",
            show_default=False,
        ),
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option("--json", metavar="", help="Print the frontier as JSON, every plan in full, and nothing else."),
    ] = False,
    out_dir: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            metavar="DIR",
            help="Write each plan to DIR/plan-NNN.yaml (NNN: its place on the frontier), atomically; "
            "plan-NNN.yaml files an earlier run left in DIR are removed.",
            show_default=False,
        ),
    ] = None,
    plot: Annotated[
        str | None,
        typer.Option(
            metavar="FILE",
            help="Draw cost against throughput as a step curve, knee marked, to this PNG (- for standard output).",
            show_default=False,
        ),
    ] = None,
    time_limit: Annotated[
        float,
        typer.Option(
            callback=_positive,
            help="Stop walking the frontier after this many seconds: the plans up to the throughput reached are "
            "exact, and the output says where it stopped (limits of millions of units make frontiers of "
            "hundreds of thousands of plans).",
        ),
    ] = FRONTIER_TIME_LIMIT,
) -> None:
    """Every plan no other plan beats on both cost and throughput, from the cheapest to the fastest (exact)."""
    _one_stdout(as_json, plot)
    with _exit_codes():
        from heterps_cli import api
        from heterps_cli.cli.render import frontier_view
        from heterps_cli.frontier import thin, write_plans
        from heterps_cli.plots import frontier_png

        with _progress_bar() as report:
            whole = api.frontier(
                str(profile),
                str(cluster),
                _job(Objective.COST, samples, epochs, min_throughput, max_cost, global_batch),
                time_limit=time_limit,
                progress=report,
            )
        kept = whole if points is None else thin(whole, points)
        if plot is not None:
            _write(plot, frontier_png(whole, kept))
        if out_dir is not None:
            write_plans(kept, out_dir)
        if as_json:
            print(json.dumps(kept.to_dict(), indent=2, allow_nan=False))
        elif plot != "-":
            shown = thin(kept, TABLE_ROWS) if points is None else kept
            out.print(frontier_view(shown, thinned_by_default=len(shown.plans) < len(kept.plans), width=out.width))
            if out_dir is not None:
                out.print(Text(f"wrote {plural(len(kept.plans), 'plan')} to {out_dir}"))
            if plot is not None:
                out.print(Text(f"wrote {plot}"))


def _one_stdout(as_json: bool, plot: str | None) -> None:
    if as_json and plot == "-":
        raise typer.BadParameter("--json and --plot - both write to standard output: give --plot a file")
    if plot == "-" and sys.stdout is not None and sys.stdout.isatty():
        raise typer.BadParameter(
            "--plot - writes PNG bytes, and standard output is a terminal: give a file, or pipe it"
        )


def _scheduler_list(value: str) -> list[str]:
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in SCHEDULERS]
    if unknown or not names:
        raise typer.BadParameter(
            f"unknown scheduler {', '.join(unknown) or '(none given)'}; choose from {', '.join(SCHEDULERS)}"
        )
    return list(dict.fromkeys(names))


@app.command()
def compare(
    profile: ProfileArg,
    cluster: ClusterArg,
    schedulers: Annotated[
        str, typer.Option(help="Comma-separated schedulers to run, in table order.", callback=_scheduler_list)
    ] = ",".join(SCHEDULERS),
    objective: ObjectiveOpt = Objective.COST,
    min_throughput: MinThroughputOpt = None,
    samples: SamplesOpt = None,
    epochs: EpochsOpt = None,
    global_batch: GlobalBatchOpt = None,
    max_cost: MaxCostOpt = None,
    seed: SeedOpt = 0,
    as_json: Annotated[
        bool, typer.Option("--json", metavar="", help="Print the results as JSON on stdout, and nothing else.")
    ] = False,
    plot: Annotated[
        str | None,
        typer.Option(
            metavar="FILE",
            help="Draw each scheduler's plan on the exact cost-throughput frontier, with solve times beside, "
            "to this PNG (- for standard output).",
            show_default=False,
        ),
    ] = None,
    steps: StepsOpt = None,
    batch: BatchOpt = None,
    time_limit: TimeLimitOpt = None,
    evaluations: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="genetic, random: cost-model evaluations. Default: as many as rl used (when rl runs), "
            f"else {DEFAULT_EVALUATIONS:,}.",
            show_default=False,
            rich_help_panel="Search budget",
        ),
    ] = None,
) -> None:
    """Run several schedulers on one problem with the same budget and seed, against the exact optimum."""
    _one_stdout(as_json, plot)
    with _exit_codes():
        from heterps_cli import api
        from heterps_cli.cli.render import compare_view
        from heterps_cli.plots import compare_png
        from heterps_cli.schedulers import SolveOptions

        options = SolveOptions(steps=steps, batch=batch, time_limit=time_limit, evaluations=evaluations)

        def done(entry) -> None:
            figure = (
                "no feasible plan"
                if entry.plan is None
                else (
                    f"{count(entry.plan.throughput, 1)} samples/s"
                    if objective == Objective.TIME
                    else usd(entry.plan.cost_usd)
                )
            )
            cut = " (interrupted)" if entry.plan is not None and entry.plan.interrupted else ""
            err.print(Text.assemble((entry.scheduler, "bold"), f": {figure} in {entry.solve_s:.2f} s{cut}"))

        with _progress_bar() as report:
            comparison = api.compare(
                str(profile),
                str(cluster),
                cast(list[str], schedulers),  # the callback made the text a list
                _job(objective, samples, epochs, min_throughput, max_cost, global_batch),
                seed=seed,
                options=options,
                progress=report,
                on_done=done,
                with_frontier=plot is not None,
            )
        entries = comparison.entries
        if plot is not None:
            _write(plot, compare_png(comparison.problem, entries, comparison.frontier))
        if as_json:
            print(json.dumps(comparison.to_dict(), indent=2, allow_nan=False))
        elif plot != "-":
            out.print(compare_view(entries, comparison.problem.objective, width=out.width))
            if plot is not None:
                out.print(Text(f"wrote {plot}"))
    cut = [e.scheduler for e in entries if e.plan is not None and e.plan.interrupted]
    if cut:
        _interrupted(
            f"Ctrl-C cut {', '.join(cut)} short: {'its' if len(cut) == 1 else 'their'} row shows the best "
            "plan found before it (exit 130)"
        )


class Granularity(str, enum.Enum):
    layers = "layers"
    blocks = "blocks"


class Device(str, enum.Enum):
    cpu = "cpu"
    cuda = "cuda"


def _shape(value: str | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        shape = tuple(int(v) for v in value.replace("x", ",").split(",") if v.strip())
    except ValueError:
        shape = ()
    if not shape or min(shape) < 1:
        raise typer.BadParameter(f"expected sizes like 3,32,32 (got {value!r})")
    return shape


class _MeasureByDefault(typer.core.TyperGroup):
    """``heterps profile MODEL ...`` is ``heterps profile measure MODEL ...``: a first word that names
    no subcommand (and is no option) is the model, as it was before profile had subcommands."""

    def resolve_command(self, ctx, args):
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["measure", *args]
        return super().resolve_command(ctx, args)


profile_app = typer.Typer(
    cls=_MeasureByDefault,
    help="Measure a PyTorch model's layers (or estimate them on a device you do not have) and write a profile; "
    "or merge profiles of one model from several machines.\n\n"
    "[bold]heterps profile MODEL[/] (with measure's options) is short for [bold]heterps profile measure MODEL[/].",
    no_args_is_help=True,
    rich_markup_mode="rich",
)
app.add_typer(profile_app, name="profile")


@profile_app.command(name="merge")
def merge_command(
    files: Annotated[
        list[Path],
        typer.Argument(help="The profiles to join, one per resource type, of one model.", show_default=False),
    ],
    out_file: Annotated[
        str,
        typer.Option(
            "--out",
            "-o",
            metavar="FILE",
            help="Write the merged profile YAML here, atomically (- for standard output).",
            show_default=False,
        ),
    ],
) -> None:
    """Join profiles of one model measured (or estimated) on several machines into one profile.

    [bold]heterps profile merge cpu.yaml a100.yaml -o model.yaml[/]
    """
    with _exit_codes():
        from heterps_cli import api

        _not_an_input(out_file, *files)
        _write(out_file, api.merge([str(f) for f in files]))
        if out_file != "-":
            out.print(Text(f"wrote {out_file} ({len(files)} profiles merged)"))


@profile_app.command(name="measure")
def profile_command(
    model: Annotated[
        str,
        typer.Argument(
            help=f"A built-in model ({', '.join(ZOO_NAMES)}), FILE.py:FACTORY or package.module:FACTORY.",
            show_default=False,
        ),
    ],
    as_type: Annotated[
        str | None,
        typer.Option(
            "--as",
            help="The resource type name this machine is in the cluster file (e.g. cpu, v100).",
            show_default=False,
        ),
    ] = None,
    batch_size: Annotated[
        int | None, typer.Option(min=1, help="B0: the batch size to measure at.", show_default=False)
    ] = None,
    device: Annotated[Device, typer.Option(help="Where to run the layers.")] = Device.cpu,
    out_file: Annotated[
        str | None,
        typer.Option(
            "--out",
            "-o",
            metavar="FILE",
            help="Write the profile YAML here, atomically (- for standard output).",
            show_default=False,
        ),
    ] = None,
    input_shape: Annotated[
        str | None,
        typer.Option(
            help="Per-sample input shape, e.g. 3,224,224 (vgg16), 784 (mlp), 128 (transformer: sequence length), "
            "4 (ctr: ids per bag).",
            callback=_shape,
            show_default=False,
        ),
    ] = None,
    repetitions: Annotated[
        int,
        typer.Option(
            min=20, help="Timed runs per layer at least (after warm-up; short layers get more); oct is their median."
        ),
    ] = 20,
    link_gbps: Annotated[
        float | None,
        typer.Option(
            callback=_positive, help="Link bandwidth in Gbit/s for odt, instead of measuring it.", show_default=False
        ),
    ] = None,
    processes: Annotated[
        int,
        typer.Option(
            min=1,
            help="Profile in this many fresh processes and keep each layer's median: steadier on a shared machine, "
            "N times longer.",
        ),
    ] = 1,
    estimate: Annotated[
        str | None,
        typer.Option(
            metavar="DEVICE",
            help="Estimate, do not measure: each layer's time on this device of the catalogue (a100-80gb, h100, "
            "t4, ...; see --catalogue) by a roofline model of its FLOPs and bytes, counted here.",
            show_default=False,
        ),
    ] = None,
    catalogue: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE",
            help="--estimate: your own device catalogue (laid out as the built-in heterps_cli/profiling/devices.yaml).",
            show_default=False,
        ),
    ] = None,
    calibrate: Annotated[
        Path | None,
        typer.Option(
            metavar="PROFILE",
            help="--estimate: fit the efficiencies per layer kind to this measured profile of the same model "
            "(e.g. this machine's cpu profile).",
            show_default=False,
        ),
    ] = None,
    granularity: Annotated[
        Granularity,
        typer.Option(
            help="layers: every leaf module; blocks: the finest modules at which the model is a chain (a "
            "ResNet's residual blocks, a transformer's blocks), each one layer of the profile. A plan can "
            "only cut a model where it is a chain; profiling layers warns when they are not one.",
        ),
    ] = Granularity.layers,
    calibrate_on: Annotated[
        str | None,
        typer.Option(
            metavar="DEVICE",
            help="--calibrate: the catalogue device the profile was measured on (default: its type, if the "
            "catalogue has it).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Measure a PyTorch model's layers on this machine and write a profile, or estimate them elsewhere.

    [bold]heterps profile MODEL --as TYPE --batch-size B0 --out P.yaml[/] measures;
    [bold]heterps profile MODEL --as a100 --estimate a100-80gb --batch-size B0 --out P.yaml[/] estimates.
    """
    with _exit_codes():
        from heterps_cli import api
        from heterps_cli.cli.render_measured import profile_view
        from heterps_cli.profiling.measure import NOISY_CV  # imports torch: only here
        from heterps_cli.profiling.write import measured_text

        _profile_flags_agree(
            {"--as": as_type, "--batch-size": batch_size, "--out": out_file},
            estimating=estimate is not None,
            estimating_only={"--catalogue": catalogue, "--calibrate": calibrate, "--calibrate-on": calibrate_on},
            measuring_only={
                "--device": device is not Device.cpu,
                "--processes": processes != 1,
                "--link-gbps": link_gbps is not None,
            },
        )
        assert as_type is not None and batch_size is not None and out_file is not None
        if estimate is not None:
            from heterps_cli.cli.render_measured import estimate_view
            from heterps_cli.profiling.write import cluster_snippet, estimated_text

            with _progress_bar() as report, _users_prints_to_stderr():
                estimated = api.estimate(
                    model,
                    as_type,
                    batch_size,
                    estimate,
                    input_shape=cast(tuple[int, ...] | None, input_shape),
                    catalogue=None if catalogue is None else str(catalogue),
                    calibrate=None if calibrate is None else str(calibrate),
                    calibrate_on=calibrate_on,
                    granularity=granularity.value,
                    progress=report,
                )
            _write(out_file, estimated_text(estimated))
            if out_file != "-":
                out.print(estimate_view(estimated, cluster_snippet(estimated)))
                out.print(Text(f"wrote {out_file}"))
            return

        with _progress_bar() as report, _users_prints_to_stderr():
            measured = api.measure(
                model,
                as_type,
                batch_size,
                device=device.value,
                input_shape=cast(tuple[int, ...] | None, input_shape),  # the callback parsed it
                repetitions=repetitions,
                link_gbps=link_gbps,
                processes=processes,
                granularity=granularity.value,
                progress=report,
            )
        _write(out_file, measured_text(measured))
        if out_file == "-":
            return
        out.print(profile_view(measured, NOISY_CV))
        out.print(Text(f"wrote {out_file}"))
        out.print(
            Text(
                f"next: heterps validate {out_file} CLUSTER, then heterps plan {out_file} CLUSTER --samples N "
                "(a measured profile has no job section: --samples is the samples per epoch; merge profiles "
                "of other types first with heterps profile merge)",
                style="dim",
            )
        )


def _profile_flags_agree(required: dict, estimating: bool, estimating_only: dict, measuring_only: dict) -> None:
    """Exit 2 naming the first flag that is missing, or that belongs to the other mode of ``heterps profile``
    (measuring here, or ``--estimate`` for a device elsewhere)."""
    missing = [flag for flag, value in required.items() if value is None]
    if missing:
        raise InputError(None, None, missing[0], f"profiling needs {', '.join(missing)}")
    if not estimating:
        for flag, given in estimating_only.items():
            if given is not None:
                raise InputError(None, None, flag, f"{flag} goes with --estimate DEVICE")
        return
    for flag, measuring in measuring_only.items():
        if measuring:
            raise InputError(None, None, flag, f"{flag} applies to measuring; --estimate runs nothing on the device")
    if estimating_only["--calibrate-on"] is not None and estimating_only["--calibrate"] is None:
        raise InputError(None, None, "--calibrate-on", "--calibrate-on goes with --calibrate PROFILE")


@app.command(name="run")
def run_command(
    plan_file: Annotated[
        Path, typer.Argument(metavar="PLAN", help="A plan written by heterps plan --out.", show_default=False)
    ],
    model: Annotated[
        str | None,
        typer.Option(
            help=f"The model the plan's profile was measured from: {', '.join(ZOO_NAMES)}, FILE.py:FACTORY or "
            "module:FACTORY (a module.py in the current directory is found by that name too). "
            "Default: the model the plan names.",
            show_default=False,
        ),
    ] = None,
    device_map: Annotated[
        list[str] | None,
        typer.Option(
            "--map",
            metavar="TYPE=DEVICE",
            help="What a resource type of the plan is on this machine: cpu, cuda or cuda:N (repeat per type; "
            "a type named cpu is the CPU unless mapped).",
            show_default=False,
        ),
    ] = None,
    input_shape: Annotated[
        str | None,
        typer.Option(help="Per-sample input shape, as for heterps profile.", callback=_shape, show_default=False),
    ] = None,
    steps: Annotated[
        int, typer.Option(min=1, help="Training steps measured (each runs --micro-batches batches, then a flush).")
    ] = 10,
    warmup: Annotated[int, typer.Option(min=0, help="Steps run first and not measured.")] = 2,
    micro_batches: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Batches of the plan's batch size per step (1F1B: they fill the pipeline, then a flush and "
            "one optimiser step). Default: the plan's micro_batches (docs/spec.md section 1d), else 16 x "
            "(stages - 1), at most 64: the fill and drain then idle a stage 6% of a step.",
            show_default=False,
        ),
    ] = None,
    threads: Annotated[int, typer.Option(min=1, help="Threads per process (one unit of a CPU type = one core).")] = 1,
    max_processes: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Refuse a plan that needs more processes than this (default: the cores here).",
            show_default=False,
        ),
    ] = None,
    seed: Annotated[int, typer.Option(callback=_seed, help="Seeds the model's weights and the synthetic data.")] = 0,
    lr: Annotated[float, typer.Option(callback=_positive, help="SGD learning rate.")] = 0.01,
    timeout: Annotated[
        float,
        typer.Option(
            min=1.0,
            max=86_400.0,
            help="Seconds any process may wait for another before the run fails (1 to 86,400: gloo's own timers "
            "take whole milliseconds and a day at most).",
        ),
    ] = 120.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    out_file: Annotated[
        str | None,
        typer.Option(
            "--out", "-o", metavar="FILE", help="Also write the report as JSON here, atomically.", show_default=False
        ),
    ] = None,
) -> None:
    """Train with a plan on real processes (torch.distributed) and measure it against its prediction.

    One process per replica of every stage; the stages form a pipeline (1F1B, micro-batches and a flush),
    the replicas of a stage split each micro-batch and sum their gradients. Synthetic data: the model's
    example batch and a fixed random target. Under torchrun each process is one rank (docs/guide/running.md).
    """
    with _exit_codes():
        from heterps_cli import api
        from heterps_cli.cli.render_measured import run_view
        from heterps_cli.runtime import parse_map

        with _progress_bar() as report, _users_prints_to_stderr():
            result = api.run(
                str(plan_file),
                model,
                mapping=parse_map(device_map or []),
                input_shape=cast(tuple[int, ...] | None, input_shape),
                steps=steps,
                warmup=warmup,
                micro_batches=micro_batches,
                threads=threads,
                max_processes=max_processes,
                seed=seed,
                lr=lr,
                timeout_s=timeout,
                progress=report,
            )
        if result is None:  # a torchrun rank other than 0: rank 0 reports
            return
        if out_file is not None:
            _write(out_file, result.to_json())
        if as_json:
            sys.stdout.write(result.to_json())
            return
        out.print(run_view(result))
        if out_file is not None and out_file != "-":
            out.print(Text(f"wrote {out_file}"))


class Format(str, enum.Enum):
    table = "table"
    json = "json"
    markdown = "markdown"
    github = "github"


def _emit_report(fmt: Format, markdown: str, json_text: str, annotations: str = "") -> bool:
    """Print a json/markdown/github report; False for the table format, which the caller renders."""
    if fmt == Format.json:
        print(json_text)
    elif fmt == Format.markdown:
        print(markdown, end="")
    elif fmt == Format.github:
        print(annotations + markdown, end="")
        summary = os.environ.get("GITHUB_STEP_SUMMARY")
        if summary:
            try:
                with open(summary, "a", encoding="utf-8") as fh:
                    fh.write(markdown + "\n")
            except OSError as exc:
                raise InputError(
                    summary, None, "GITHUB_STEP_SUMMARY", f"cannot append the summary: {exc.strerror}"
                ) from None
    return fmt != Format.table


@app.command()
def check(
    plan_file: Annotated[
        Path,
        typer.Argument(
            metavar="PLAN", help="The committed plan (YAML written by heterps plan --out).", show_default=False
        ),
    ],
    profile: Annotated[Path, typer.Option(help="The current model profile.", show_default=False)],
    cluster: Annotated[Path, typer.Option(help="The current cluster.", show_default=False)],
    objective: Annotated[
        Objective, typer.Option(help="The job's objective, as given to heterps plan: a plan made for another is stale.")
    ] = Objective.COST,
    samples: SamplesOpt = None,
    epochs: EpochsOpt = None,
    global_batch: GlobalBatchOpt = None,
    max_cost: Annotated[
        float | None,
        typer.Option(
            callback=_positive, help="Fail when the plan costs more (USD); also the job's budget.", show_default=False
        ),
    ] = None,
    min_throughput: Annotated[
        float | None,
        typer.Option(
            callback=_non_negative,
            help="Fail when the plan is slower (samples/s); also the job's requirement. "
            "Default: the profile's job.min_throughput.",
            show_default=False,
        ),
    ] = None,
    baseline: Annotated[
        Path | None,
        typer.Option(help="An older plan: fail when the cost rose by more than --max-increase.", show_default=False),
    ] = None,
    max_increase: Annotated[
        str,
        typer.Option(
            callback=_increase,
            help="With --baseline: the allowed cost increase, with its unit: a percentage of the baseline's cost "
            "(10%) or dollars ('$25' or 25usd).",
        ),
    ] = "0%",
    replan: Annotated[
        SchedulerName | None,
        typer.Option(
            help="Fail when this scheduler finds a plan cheaper (faster, for an --objective time plan) "
            "by more than --tolerance.",
            show_default=False,
        ),
    ] = None,
    tolerance: Annotated[
        str,
        typer.Option(
            callback=_tolerance,
            help="With --replan: how much cheaper (faster, for a time plan) a new plan may be before the committed "
            "one counts as wasteful, as a percentage (1%).",
        ),
    ] = "1%",
    seed: SeedOpt = 0,
    fmt: Annotated[
        Format,
        typer.Option(
            "--format",
            help="table, json, markdown (a pull-request comment), or github (workflow annotations + markdown, "
            "appended to $GITHUB_STEP_SUMMARY when set).",
        ),
    ] = Format.table,
) -> None:
    """A cost gate for CI: recompute a committed plan from the current files and fail (exit 1) when it no longer holds.

    The job (samples, epochs, required throughput, budget, objective) comes from the profile and these
    flags, as for heterps plan; a plan made for another job fails as stale."""
    with _exit_codes():
        from heterps_cli import api
        from heterps_cli.ci.report import findings_json, findings_markdown, github_annotations
        from heterps_cli.cli.render import findings_view

        with _progress_bar() as report:
            findings = api.check(
                str(plan_file),
                str(profile),
                str(cluster),
                _job(objective, samples, epochs, min_throughput, max_cost, global_batch),
                baseline_path=str(baseline) if baseline is not None else None,
                max_increase=max_increase,
                replan=replan.value if replan else None,
                tolerance=tolerance,
                seed=seed,
                progress=report,
            )
        shown = str(plan_file)
        if not _emit_report(
            fmt, findings_markdown(shown, findings), findings_json(shown, findings), github_annotations(shown, findings)
        ):
            out.print(findings_view(shown, findings))
    if any(f.interrupted for f in findings):
        _interrupted("the replan gate's search was cut short, so the check did not pass (exit 130)")
    if not all(f.ok for f in findings):
        raise typer.Exit(EXIT_CHECK_FAILED)


@app.command()
def diff(
    old_plan: Annotated[Path, typer.Argument(metavar="OLD_PLAN", help="The plan before.", show_default=False)],
    new_plan: Annotated[Path, typer.Argument(metavar="NEW_PLAN", help="The plan after.", show_default=False)],
    fmt: Annotated[
        Format,
        typer.Option(
            "--format", help="table, json, markdown, or github (the markdown, also appended to $GITHUB_STEP_SUMMARY)."
        ),
    ] = Format.table,
) -> None:
    """Two plans side by side: stages, resources, throughput, time and cost, with the changes.

    Plans of different jobs (model, cluster, objective, samples, …) still diff, with a warning."""
    with _exit_codes():
        from heterps_cli import api
        from heterps_cli.ci.report import diff_annotations, diff_json, diff_markdown
        from heterps_cli.cli.render import diff_view

        result = api.diff(str(old_plan), str(new_plan))
        changes, warnings = result.changes, result.warnings
        a, b = str(old_plan), str(new_plan)
        if fmt == Format.table:
            for w in warnings:
                err.print(Text("warning: ", style="bold yellow") + Text(w))
            out.print(diff_view(a, b, changes, []))
        else:
            _emit_report(
                fmt,
                diff_markdown(a, b, changes, warnings),
                diff_json(a, b, changes, warnings),
                diff_annotations(b, warnings),
            )


@app.command()
def validate(
    file: Annotated[
        Path,
        typer.Argument(
            help="A model profile, a cluster or a plan (YAML; which one, the file's keys say).", show_default=False
        ),
    ],
    cluster: Annotated[
        Path | None,
        typer.Argument(help="With a profile: a cluster to check it against.", show_default=False),
    ] = None,
) -> None:
    """Check a profile, a cluster or a plan file, or a profile against a cluster, and summarise it."""
    with _exit_codes():
        from heterps_cli import api
        from heterps_cli.cli.render import print_cluster, print_plan_file, print_summary

        read = api.validate(str(file), str(cluster) if cluster is not None else None)
        if read.kind == "cluster":
            print_cluster(out, cast("Cluster", read.found), str(file))
        elif read.kind == "plan":
            print_plan_file(out, cast("PlanFile", read.found), str(file))
        else:
            print_summary(out, cast("Profile", read.found), str(file), read.cluster, str(cluster) if cluster else None)
