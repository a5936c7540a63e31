"""``heterps check``, ``diff`` and ``validate``: the cost gate for CI and the checks of input files
(docs/guide/check.md)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, cast

import typer
from rich.text import Text

from heterps_cli.errors import (
    EXIT_CHECK_FAILED,
    InputError,
)
from heterps_cli.objective import Objective

if TYPE_CHECKING:
    from heterps_cli.formats import Cluster, Plan, Profile
from heterps_cli.cli.options import (
    EpochsOpt,
    Format,
    GlobalBatchOpt,
    MaximalStagesOpt,
    MicroBatchOpt,
    SamplesOpt,
    SchedulerName,
    SeedOpt,
    increase_rule,
    job_from,
    non_negative_number,
    positive_number,
    tolerance_rule,
)
from heterps_cli.cli.session import err, exit_codes, out, progress_bar, say_interrupted
from heterps_cli.cli.shape_options import EngineOpt
from heterps_cli.cli.terminal import write_stdout
from heterps_cli.outfiles import append_text


def emit_report(fmt: Format, markdown: str, json_text: str, annotations: str = "") -> bool:
    """Print a json/markdown/github report; False for the table format, which the caller renders."""
    # Documents, not words for a terminal: UTF-8 whatever its encoding, as a file of them would be.
    if fmt == Format.json:
        write_stdout(json_text + "\n")
    elif fmt == Format.markdown:
        write_stdout(markdown)
    elif fmt == Format.github:
        write_stdout(annotations + markdown)
        summary = os.environ.get("GITHUB_STEP_SUMMARY")
        if summary:
            append_text(summary, markdown + "\n", "GITHUB_STEP_SUMMARY")
    return fmt != Format.table


_CheckPlanFileArg = Annotated[
    Path,
    typer.Argument(metavar="PLAN", help="The committed plan (YAML written by heterps plan --out).", show_default=False),
]
_CheckObjectiveOpt = Annotated[
    Objective, typer.Option(help="The job's objective, as given to heterps plan: a plan made for another is stale.")
]
_CheckMaxCostOpt = Annotated[
    float | None,
    typer.Option(
        callback=positive_number,
        help="Fail when the plan costs more (USD); also the job's budget.",
        show_default=False,
    ),
]
_CheckMinThroughputOpt = Annotated[
    float | None,
    typer.Option(
        callback=non_negative_number,
        help="Fail when the plan is slower (samples/s); also the job's requirement. "
        "Default: the profile's job.min_throughput.",
        show_default=False,
    ),
]
_CheckBaselineOpt = Annotated[
    Path | None,
    typer.Option(help="An older plan: fail when the cost rose by more than --max-increase.", show_default=False),
]
_CheckMaxIncreaseOpt = Annotated[
    str,
    typer.Option(
        callback=increase_rule,
        help="With --baseline: the allowed cost increase, with its unit: a percentage of the baseline's cost "
        "(10%) or dollars ('$25' or 25usd).",
    ),
]
_CheckReplanOpt = Annotated[
    SchedulerName | None,
    typer.Option(
        help="Fail when this scheduler finds a plan cheaper (faster, for an --objective time plan) "
        "by more than --tolerance.",
        show_default=False,
    ),
]
_CheckToleranceOpt = Annotated[
    str,
    typer.Option(
        callback=tolerance_rule,
        help="With --replan: how much cheaper (faster, for a time plan) a new plan may be before the committed "
        "one counts as wasteful, as a percentage (1%).",
    ),
]
_CheckFmtOpt = Annotated[
    Format,
    typer.Option(
        "--format",
        help="table, json, markdown (a pull-request comment), or github (workflow annotations + markdown, "
        "appended to $GITHUB_STEP_SUMMARY when set).",
    ),
]


def check(
    plan_file: _CheckPlanFileArg,
    profile: Annotated[Path, typer.Option(help="The current model profile.", show_default=False)],
    cluster: Annotated[Path, typer.Option(help="The current cluster.", show_default=False)],
    objective: _CheckObjectiveOpt = Objective.COST,
    samples: SamplesOpt = None,
    epochs: EpochsOpt = None,
    global_batch: GlobalBatchOpt = None,
    maximal_stages: MaximalStagesOpt = False,
    micro_batch: MicroBatchOpt = None,
    max_cost: _CheckMaxCostOpt = None,
    min_throughput: _CheckMinThroughputOpt = None,
    baseline: _CheckBaselineOpt = None,
    max_increase: _CheckMaxIncreaseOpt = "0%",
    replan: _CheckReplanOpt = None,
    tolerance: _CheckToleranceOpt = "1%",
    seed: SeedOpt = 0,
    fmt: _CheckFmtOpt = Format.table,
    engine: EngineOpt = None,
) -> None:
    """A cost gate for CI: recompute a committed plan from the current files and fail (exit 1) when it no longer holds.

    The job (samples, epochs, required throughput, budget, objective) comes from the profile and these
    flags, as for heterps plan; a plan made for another job fails as stale."""
    with exit_codes():
        from heterps_cli import api
        from heterps_cli.ci.report import findings_json, findings_markdown, github_annotations
        from heterps_cli.cli.render_ci import findings_view

        if engine is not None and replan is not None and replan.value != "exact":
            raise InputError(None, None, "--replan", "with --engine the replan gate is exact's (the best plan the "
                             "engine runs): give --replan exact")  # fmt: skip
        with progress_bar() as report:
            findings = api.check(
                str(plan_file),
                str(profile),
                str(cluster),
                job_from(
                    objective, samples, epochs, min_throughput, max_cost, global_batch, maximal_stages, micro_batch
                ),
                baseline_path=str(baseline) if baseline is not None else None,
                max_increase=max_increase,
                replan=replan.value if replan else None,
                tolerance=tolerance,
                seed=seed,
                progress=report,
                engine=engine.value if engine else None,
            )
        shown = str(plan_file)
        if not emit_report(
            fmt, findings_markdown(shown, findings), findings_json(shown, findings), github_annotations(shown, findings)
        ):
            out.print(findings_view(shown, findings))
    if any(f.interrupted for f in findings):
        say_interrupted("the replan gate's search was cut short, so the check did not pass (exit 130)")
    if not all(f.ok for f in findings):
        raise typer.Exit(EXIT_CHECK_FAILED)


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
    with exit_codes():
        from heterps_cli import api
        from heterps_cli.ci.report import diff_annotations, diff_json, diff_markdown
        from heterps_cli.cli.render_ci import diff_view

        result = api.diff(str(old_plan), str(new_plan))
        changes, warnings = result.changes, result.warnings
        a, b = str(old_plan), str(new_plan)
        if fmt == Format.table:
            for w in warnings:
                err.print(Text("warning: ", style="bold yellow") + Text(w))
            out.print(diff_view(a, b, changes, []))
        else:
            emit_report(
                fmt,
                diff_markdown(a, b, changes, warnings),
                diff_json(a, b, changes, warnings),
                diff_annotations(b, warnings),
            )


def validate(
    file: Annotated[
        Path,
        typer.Argument(
            help="A model profile, a cluster or a plan (YAML; which one, the file's keys say).", show_default=False
        ),
    ],
    cluster: Annotated[
        Path | None,
        typer.Argument(help="With a profile or a plan: a cluster to check it against.", show_default=False),
    ] = None,
) -> None:
    """Check a profile, a cluster or a plan file, or a profile or a plan against a cluster, and summarise it."""
    with exit_codes():
        from heterps_cli import api
        from heterps_cli.cli.render_files import print_cluster, print_plan_file, print_summary

        read = api.validate(str(file), str(cluster) if cluster is not None else None)
        if read.kind == "cluster":
            print_cluster(out, cast("Cluster", read.found), str(file))
        elif read.kind == "plan":
            print_plan_file(out, cast("Plan", read.found), str(file), str(cluster) if cluster else None)
        else:
            print_summary(out, cast("Profile", read.found), str(file), read.cluster, str(cluster) if cluster else None)
