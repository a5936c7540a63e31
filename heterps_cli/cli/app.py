"""The ``heterps`` command line: thin wrappers that load, call the library, and render."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, cast

import typer
from rich.text import Text

from heterps_cli import STARTED, __version__
from heterps_cli.cli.ci_commands import check, diff, validate
from heterps_cli.cli.cluster_command import cluster_command
from heterps_cli.cli.export_command import export_command
from heterps_cli.cli.launch_command import launch_command
from heterps_cli.cli.options import (
    FRONTIER_TIME_LIMIT,
    BatchOpt,
    ClusterArg,
    EpochsOpt,
    FrontierMixedStagesOpt,
    GlobalBatchOpt,
    MaxCostOpt,
    MaximalStagesOpt,
    MicroBatchOpt,
    MinThroughputOpt,
    MixedStagesAutoOpt,
    ObjectiveOpt,
    OutOpt,
    PlanObjectiveOpt,
    ProfileArg,
    SamplesOpt,
    SchedulerName,
    SeedOpt,
    StepsOpt,
    TimeLimitOpt,
    job_from,
    non_negative_number,
    positive_number,
    resolution_fraction,
    scheduler_list,
)
from heterps_cli.cli.profile_commands import profile_app
from heterps_cli.cli.run_command import run_command
from heterps_cli.cli.session import (
    DEBUG,
    err,
    exit_codes,
    not_a_folder_for_files,
    not_an_input,
    out,
    progress_bar,
    say_interrupted,
    write_output,
)
from heterps_cli.cli.shape_options import (
    EngineOpt,
    LayerTypeOpt,
    MaxTpOpt,
    RecomputeOpt,
    ReplicasOpt,
    StagesOpt,
    StageTypesOpt,
    TpOpt,
    refuse_mixed,
    refuse_other_scheduler,
    shape_from,
)
from heterps_cli.errors import (
    InputError,
)
from heterps_cli.figures import count, plural, usd
from heterps_cli.objective import Objective
from heterps_cli.schedulers.names import (
    DEFAULT_EVALUATIONS,
    POLICY_VARIANTS,
    SCHEDULERS,
)

ALL_SCHEDULERS = ",".join(SCHEDULERS)  # heterps compare's default
TABLE_ROWS = 20  # heterps frontier: rows its table shows unless --points says otherwise


app = typer.Typer(
    name="heterps",
    help="Plan DNN training on heterogeneous, priced resources: which layers go on which resource, "
    "how many replicas each stage gets, the throughput, and the dollar cost.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        out.print(f"heterps {__version__}")
        raise typer.Exit()


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


_PlanSchedulerOpt = Annotated[
    SchedulerName | None,
    typer.Option(
        "--scheduler",
        "-s",
        help="How to search (default rl; exact with --engine or a shape option). "
        + " ".join(f"[bold]{k}[/]: {v}." for k, (_, v) in SCHEDULERS.items()),
        show_default=False,
    ),
]
_PlanAsJsonOpt = Annotated[
    bool, typer.Option("--json", metavar="", help="Print the plan as JSON on stdout, and nothing else.")
]
_PlanExplainOpt = Annotated[
    bool,
    typer.Option(
        "--explain",
        help="Also what one node more or fewer of each kind would give (a cluster with nodes: the fastest "
        "plan on that rental and its cost), or one unit more or fewer of each type's limit (the optimum "
        "then); by the exact solver.",
    ),
]
_PlanEvaluationsOpt = Annotated[
    int | None,
    typer.Option(
        min=1,
        help=f"genetic, random: cost-model evaluations at each micro-batch (default {DEFAULT_EVALUATIONS:,}, "
        "fewer on a long model or many micro-batches).",
        show_default=False,
        rich_help_panel="Search budget",
    ),
]
_PlanPolicyInOpt = Annotated[
    Path | None,
    typer.Option(
        help="rl: warm-start from a policy saved by --policy-out (same cluster types, any model).",
        show_default=False,
        rich_help_panel="Search budget",
    ),
]
_PlanPolicyOutOpt = Annotated[
    Path | None,
    typer.Option(
        help=f"rl: save the trained policy to this file, first fitted to plans of {POLICY_VARIANTS} nearby models "
        "(a few seconds more) so that it warm-starts a changed model well.",
        show_default=False,
        rich_help_panel="Search budget",
    ),
]


@app.command()
def plan(
    profile: ProfileArg,
    cluster: ClusterArg,
    scheduler: _PlanSchedulerOpt = None,
    objective: PlanObjectiveOpt = None,
    min_throughput: MinThroughputOpt = None,
    samples: SamplesOpt = None,
    epochs: EpochsOpt = None,
    global_batch: GlobalBatchOpt = None,
    maximal_stages: MaximalStagesOpt = False,
    mixed_stages: MixedStagesAutoOpt = None,
    micro_batch: MicroBatchOpt = None,
    max_cost: MaxCostOpt = None,
    seed: SeedOpt = 0,
    out_file: OutOpt = None,
    as_json: _PlanAsJsonOpt = False,
    steps: StepsOpt = None,
    batch: BatchOpt = None,
    time_limit: TimeLimitOpt = None,
    explain: _PlanExplainOpt = False,
    evaluations: _PlanEvaluationsOpt = None,
    policy_in: _PlanPolicyInOpt = None,
    policy_out: _PlanPolicyOutOpt = None,
    engine: EngineOpt = None,
    stages: StagesOpt = None,
    tp: TpOpt = None,
    max_tp: MaxTpOpt = None,
    replicas: ReplicasOpt = None,
    recompute: RecomputeOpt = None,
    layer_type: LayerTypeOpt = None,
    stage_types: StageTypesOpt = None,
) -> None:
    """Plan which layers run on which resource, with replica counts, throughput and cost."""
    with exit_codes():
        from heterps_cli import api
        from heterps_cli.schedulers import options_for

        not_an_input(out_file, profile, cluster, policy_in)
        not_an_input(policy_out, profile, cluster, policy_in, field="--policy-out")
        shape = shape_from(stages, tp, max_tp, replicas, recompute, layer_type, stage_types)
        name = refuse_other_scheduler(scheduler.value if scheduler else None, shape, engine)
        refuse_mixed(engine, shape, mixed_stages)
        if objective is None:
            objective = Objective.TIME if name == "tapp" else Objective.COST
        options = options_for(
            name,
            strict=True,
            steps=steps,
            batch=batch,
            time_limit=time_limit,
            policy_in=policy_in,
            policy_out=policy_out,
            evaluations=evaluations,
            started=STARTED if time_limit is not None else None,  # loading the files counts too
            mixed_stages=mixed_stages,
        )
        with progress_bar() as report:
            result = api.plan(
                str(profile),
                str(cluster),
                name,
                job_from(
                    objective, samples, epochs, min_throughput, max_cost, global_batch, maximal_stages, micro_batch
                ),
                seed=seed,
                options=options,
                progress=report,
                explain=explain,
                shape=shape,
                engine=engine.value if engine else None,
            )
        _show_plan(result, out_file, as_json)
    if result.interrupted:
        say_interrupted("the plan above is the best found before Ctrl-C (exit 130)")


def _show_plan(result, out_file: str | None, as_json: bool) -> None:
    """Write the plan to ``out_file`` (atomically) and show it, or its JSON; a failed write is raised
    after the plan is shown (the run is done)."""
    from heterps_cli.cli.render import print_plan
    from heterps_cli.yamlio import dump_yaml

    write_failed = None
    if out_file is not None:
        try:
            write_output(out_file, dump_yaml(result.to_dict()))
        except InputError as exc:
            write_failed = exc
    if as_json:
        print(result.to_json())
    elif out_file != "-":
        print_plan(out, result)
        if out_file is not None and write_failed is None:
            out.print(Text(f"wrote {out_file}"))
    if write_failed is not None:
        raise write_failed


_FrontierMinThroughputOpt = Annotated[
    float | None,
    typer.Option(
        callback=non_negative_number,
        help="The curve's lower end in samples/s. Default: the profile's job.min_throughput, else 0.",
        show_default=False,
    ),
]
_FrontierMaxCostOpt = Annotated[
    float | None,
    typer.Option(callback=positive_number, help="Leave out plans costing more than this (USD).", show_default=False),
]
_FrontierPointsOpt = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="Keep N plans spread evenly over throughput: both ends and the knee always; 1 gives the knee. "
        f"Default: all of them (the table shows at most {TABLE_ROWS}).",
        show_default=False,
    ),
]
_FrontierAsJsonOpt = Annotated[
    bool,
    typer.Option("--json", metavar="", help="Print the frontier as JSON, every plan in full, and nothing else."),
]
_FrontierOutDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--out",
        "-o",
        metavar="DIR",
        help="Write each plan to DIR/plan-NNN.yaml (NNN: its place on the frontier), atomically; "
        "plan-NNN.yaml files an earlier run left in DIR are removed.",
        show_default=False,
    ),
]
_FrontierPlotOpt = Annotated[
    str | None,
    typer.Option(
        metavar="FILE",
        help="Draw cost against throughput as a step curve, knee marked, to this PNG (- for standard output).",
        show_default=False,
    ),
]
_FrontierResolutionOpt = Annotated[
    float,
    typer.Option(
        callback=resolution_fraction,
        help="List, for every plan, one at most this fraction slower and dearer (0.05: 5%), instead of every "
        "Pareto-optimal plan: on clusters of hundreds of units the exact frontier has thousands. 0: exact.",
    ),
]
_FrontierTimeLimitOpt = Annotated[
    float,
    typer.Option(
        callback=positive_number,
        help="Stop walking the frontier after this many seconds: the plans up to the throughput reached are "
        "exact, and the output says where it stopped (limits of millions of units make frontiers of "
        "hundreds of thousands of plans).",
    ),
]


@app.command()
def frontier(
    profile: ProfileArg,
    cluster: ClusterArg,
    min_throughput: _FrontierMinThroughputOpt = None,
    samples: SamplesOpt = None,
    epochs: EpochsOpt = None,
    global_batch: GlobalBatchOpt = None,
    maximal_stages: MaximalStagesOpt = False,
    micro_batch: MicroBatchOpt = None,
    max_cost: _FrontierMaxCostOpt = None,
    points: _FrontierPointsOpt = None,
    as_json: _FrontierAsJsonOpt = False,
    out_dir: _FrontierOutDirOpt = None,
    plot: _FrontierPlotOpt = None,
    time_limit: _FrontierTimeLimitOpt = FRONTIER_TIME_LIMIT,
    mixed_stages: FrontierMixedStagesOpt = None,
    resolution: _FrontierResolutionOpt = 0.0,
    engine: EngineOpt = None,
    stages: StagesOpt = None,
    tp: TpOpt = None,
    max_tp: MaxTpOpt = None,
    replicas: ReplicasOpt = None,
    recompute: RecomputeOpt = None,
    layer_type: LayerTypeOpt = None,
    stage_types: StageTypesOpt = None,
) -> None:
    """Every plan no other plan beats on both cost and throughput, from the cheapest to the fastest (exact,
    or within --resolution)."""
    _one_stdout(as_json, plot)
    with exit_codes():
        from heterps_cli import api
        from heterps_cli.cli.render import frontier_view
        from heterps_cli.frontier import thin, write_plans
        from heterps_cli.plots import frontier_png

        not_an_input(plot, profile, cluster, field="--plot")
        not_a_folder_for_files(out_dir)
        shape = shape_from(stages, tp, max_tp, replicas, recompute, layer_type, stage_types)
        refuse_mixed(engine, shape, mixed_stages)

        with progress_bar() as report:
            whole = api.frontier(
                str(profile),
                str(cluster),
                job_from(
                    Objective.COST, samples, epochs, min_throughput, max_cost, global_batch, maximal_stages, micro_batch
                ),
                time_limit=time_limit,
                progress=report,
                mixed_stages=mixed_stages,
                resolution=resolution,
                shape=shape,
                engine=engine.value if engine else None,
            )
        kept = whole if points is None else thin(whole, points)
        if plot is not None:
            write_output(plot, frontier_png(whole, kept))
        if out_dir is not None:
            write_plans(kept, out_dir)
        if as_json:
            print(json.dumps(kept.to_dict(), indent=2, allow_nan=False))
        elif plot != "-":
            shown = thin(kept, TABLE_ROWS) if points is None else kept
            # a file or a pipe: every row whole, unless COLUMNS asks for a width (a CI log's 80)
            width = out.width if out.is_terminal or os.environ.get("COLUMNS") else None
            out.print(frontier_view(shown, thinned_by_default=len(shown.plans) < len(kept.plans), width=width))
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


_CompareSchedulersOpt = Annotated[
    str, typer.Option(help="Comma-separated schedulers to run, in table order.", callback=scheduler_list)
]
_CompareAsJsonOpt = Annotated[
    bool, typer.Option("--json", metavar="", help="Print the results as JSON on stdout, and nothing else.")
]
_ComparePlotOpt = Annotated[
    str | None,
    typer.Option(
        metavar="FILE",
        help="Draw each scheduler's plan on the exact cost-throughput frontier, with solve times beside, "
        "to this PNG (- for standard output).",
        show_default=False,
    ),
]
_CompareEvaluationsOpt = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="genetic, random: cost-model evaluations. Default: as many as rl used (when rl runs), "
        f"else {DEFAULT_EVALUATIONS:,}.",
        show_default=False,
        rich_help_panel="Search budget",
    ),
]


@app.command()
def compare(
    profile: ProfileArg,
    cluster: ClusterArg,
    schedulers: _CompareSchedulersOpt = ALL_SCHEDULERS,
    objective: ObjectiveOpt = Objective.COST,
    min_throughput: MinThroughputOpt = None,
    samples: SamplesOpt = None,
    epochs: EpochsOpt = None,
    global_batch: GlobalBatchOpt = None,
    maximal_stages: MaximalStagesOpt = False,
    micro_batch: MicroBatchOpt = None,
    max_cost: MaxCostOpt = None,
    seed: SeedOpt = 0,
    as_json: _CompareAsJsonOpt = False,
    plot: _ComparePlotOpt = None,
    steps: StepsOpt = None,
    batch: BatchOpt = None,
    time_limit: TimeLimitOpt = None,
    evaluations: _CompareEvaluationsOpt = None,
    mixed_stages: MixedStagesAutoOpt = None,
) -> None:
    """Run several schedulers on one problem with the same budget and seed, against the exact optimum."""
    _one_stdout(as_json, plot)
    with exit_codes():
        from heterps_cli import api
        from heterps_cli.cli.render import compare_view
        from heterps_cli.plots import compare_png
        from heterps_cli.schedulers import Budget

        not_an_input(plot, profile, cluster, field="--plot")
        budget = Budget(time_limit, steps, batch, evaluations, mixed_stages)

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

        with progress_bar() as report:
            comparison = api.compare(
                str(profile),
                str(cluster),
                cast(list[str], schedulers),  # the callback made the text a list
                job_from(
                    objective, samples, epochs, min_throughput, max_cost, global_batch, maximal_stages, micro_batch
                ),
                seed=seed,
                budget=budget,
                progress=report,
                on_done=done,
                with_frontier=plot is not None,
            )
        entries = comparison.entries
        if plot is not None:
            write_output(plot, compare_png(comparison.problem, entries, comparison.frontier))
        if as_json:
            print(json.dumps(comparison.to_dict(), indent=2, allow_nan=False))
        elif plot != "-":
            out.print(compare_view(entries, comparison.problem.objective, width=out.width))
            if plot is not None:
                out.print(Text(f"wrote {plot}"))
    cut = [e.scheduler for e in entries if e.plan is not None and e.plan.interrupted]
    if cut:
        say_interrupted(
            f"Ctrl-C cut {', '.join(cut)} short: {'its' if len(cut) == 1 else 'their'} row shows the best "
            "plan found before it (exit 130)"
        )


# The commands of the other modules, in the order --help lists them.
app.add_typer(profile_app, name="profile")
app.command(name="run")(run_command)
app.command(name="launch")(launch_command)
app.command(name="export")(export_command)
app.command(name="cluster")(cluster_command)
app.command()(check)
app.command()(diff)
app.command()(validate)
