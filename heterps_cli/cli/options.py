"""The options and arguments the commands share, with their checks (docs/cli.md lists them all)."""

from __future__ import annotations

import enum
import math
import sys
from pathlib import Path
from typing import Annotated

import typer

from heterps_cli.errors import (
    InputError,
)
from heterps_cli.figures import number
from heterps_cli.objective import Objective
from heterps_cli.schedulers.names import (
    BATCH_LAYERS,
    DEFAULT_BATCH,
    DEFAULT_STEPS,
    MIN_BATCH,
    SCHEDULERS,
)

# Start-up time is part of the interface (benchmarks/bench_startup.py): each command imports the
# library it uses when it runs, so `heterps --help` loads no numpy and `validate` no numpy or torch.
# torch (seconds) is imported only by `heterps profile`, rl and tapp. The zoo's names are here so
# that --help does not import the zoo.
ZOO_NAMES = ("ctr", "vgg16", "mlp", "transformer", "resnet")
FRONTIER_TIME_LIMIT = 300.0  # seconds: the bundled models' frontiers take under one (docs/commands.md)


# Built from the registry, so a new scheduler needs no change here (mypy cannot see the members).
SchedulerName = enum.Enum("SchedulerName", {name: name for name in SCHEDULERS}, type=str)  # type: ignore[misc]
DEFAULT_SCHEDULER = SchedulerName("rl")
MAX_THREADS = 1024  # per process: torch asked for 100,000 crashed (SIGSEGV) starting them


def positive_number(value: float | None) -> float | None:
    if value is not None and not (value > 0 and math.isfinite(value)):
        raise typer.BadParameter(f"must be a finite number > 0 (got {number(value)})")
    return fraction(value)


def non_negative_number(value: float | None) -> float | None:
    if value is not None and not (value >= 0 and math.isfinite(value)):
        raise typer.BadParameter(f"must be a finite number >= 0 (got {number(value)})")
    return fraction(value)


def resolution_fraction(value: float) -> float:
    """``frontier --resolution``: a fraction from 0 (exact) to below 1."""
    if not (0 <= value < 1):
        raise typer.BadParameter(f"must be a fraction from 0 (exact) to below 1, such as 0.05 (got {number(value)})")
    return fraction(value) or 0.0


def fraction(value: float | None) -> float | None:
    # As in the files: a subnormal figure is no setting, and dividing by it overflows.
    if value is not None and value != 0 and abs(value) < sys.float_info.min:
        raise typer.BadParameter(f"is below the smallest normal float ({sys.float_info.min:.3g}; got {value!r})")
    return value


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
        callback=non_negative_number,
        help="Required samples/s. Default: the profile's job.min_throughput, else 0.",
        show_default=False,
    ),
]

SamplesOpt = Annotated[
    float | None,
    typer.Option(
        callback=positive_number, help="Samples per epoch. Default: the profile's job.samples.", show_default=False
    ),
]

EpochsOpt = Annotated[
    float | None,
    typer.Option(
        callback=positive_number, help="Epochs. Default: the profile's job.epochs, else 1.", show_default=False
    ),
]

MaximalStagesOpt = Annotated[
    bool,
    typer.Option(
        "--maximal-stages",
        metavar="",
        help="Plan in the papers' space: a stage is a maximal run of layers on one type, so two "
        "neighbouring stages never share a type (docs/spec.md section 1). Default: they may.",
    ),
]

# plan and compare offer mixed stages where the problem's types can share a stage and a bound proves the plan
MixedStagesAutoOpt = Annotated[
    bool | None,
    typer.Option(
        "--mixed-stages/--no-mixed-stages",
        metavar="",
        show_default=False,
        help="Whether replicas of other types may join a stage, each type training its own share of every "
        "micro-batch at its own tensor-parallel degree (docs/spec.md section 1i). Default: they may wherever "
        "the cluster has several types, a global batch gives a pipeline schedule, no --engine or shape "
        "option is given, and a bound proves the plan over them (objective time without --max-cost, or a "
        "problem small enough for the exact DP over them); --no-mixed-stages plans stages of one type each.",
    ),
]

# frontier offers them where the exact DP over mixed stages runs, so that every point stays proven
FrontierMixedStagesOpt = Annotated[
    bool | None,
    typer.Option(
        "--mixed-stages/--no-mixed-stages",
        metavar="",
        show_default=False,
        help="Whether replicas of other types may join a stage (docs/spec.md section 1i). Default: they may "
        "where the cluster has several types, a global batch gives a pipeline schedule and the problem is "
        "small enough for the exact DP over mixed stages (every point then proven); --mixed-stages also past "
        "it (the one-type frontier's points, each climbed: not proven); --no-mixed-stages: one type a stage.",
    ),
]

GlobalBatchOpt = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="Samples per optimiser step: a whole number of micro-batches, run through a 1F1B pipeline "
        "(docs/spec.md section 1d); the plan chooses the micro-batch among the sizes the profile measured and "
        "the multiples of the largest, each replica training at most that (section 1f). Default: the profile's "
        "job.global_batch, else none (sections 1 and 1b: no pipeline "
        "schedule).",
        show_default=False,
    ),
]

MicroBatchOpt = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="Samples per micro-batch, instead of the plan choosing it (docs/spec.md section 1f): a measured size "
        "or below one (charged as its share); never above the largest the profile measured. Default: the best "
        "of the measured sizes that divide the global batch, else the profile's batch_size.",
        show_default=False,
    ),
]

MaxCostOpt = Annotated[
    float | None,
    typer.Option(
        callback=positive_number,
        help="Budget in USD a plan must not exceed (mostly for --objective time).",
        show_default=False,
    ),
]


def increase_rule(value: str) -> str:
    from heterps_cli.ci.gate import Increase

    try:
        Increase.parse(value)
    except InputError as exc:
        raise typer.BadParameter(exc.message) from None
    return value


def tolerance_rule(value: str) -> str:
    from heterps_cli.ci.gate import percent

    try:
        percent(value, "tolerance")
    except InputError as exc:
        raise typer.BadParameter(exc.message) from None
    return value


def seed_callback(value: int) -> int:
    if not 0 <= value < 2**63:
        raise typer.BadParameter(f"must be a whole number from 0 to 2**63 - 1 (got {value})")
    return value


RunModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model",
        help=f"The model the plan's profile was measured from: {', '.join(ZOO_NAMES)}, FILE.py:FACTORY or "
        "module:FACTORY (a module.py in the current directory is found by that name too). "
        "Default: the model the plan names.",
        show_default=False,
    ),
]
DeviceMapOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--map",
        metavar="TYPE=DEVICE",
        help="What a resource type of the plan is where it runs: cpu, cuda or cuda:N (repeat per type; "
        "a type named cpu is the CPU unless mapped).",
        show_default=False,
    ),
]
SeedOpt = Annotated[
    int, typer.Option(callback=seed_callback, help="Random seed; the same inputs and seed give the same plan.")
]

StepsOpt = Annotated[
    int | None,
    typer.Option(
        min=0,
        help=f"rl, tapp: training steps at each micro-batch (default {DEFAULT_STEPS}, fewer on a long model "
        "or many micro-batches; never seconds, so the plan is the same on any machine).",
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
        callback=positive_number,
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


def job_from(
    objective: Objective,
    samples: float | None,
    epochs: float | None,
    min_throughput: float | None,
    max_cost: float | None,
    global_batch: int | None = None,
    maximal_stages: bool = False,
    micro_batch: int | None = None,
):
    from heterps_cli.api import Job

    return Job(objective, samples, epochs, min_throughput, max_cost, global_batch, maximal_stages, micro_batch)


class Granularity(str, enum.Enum):
    auto = "auto"
    layers = "layers"
    blocks = "blocks"


class Precision(str, enum.Enum):
    """docs/spec.md section 2's precision: what the products run at (the half ones under autocast)."""

    fp32 = "fp32"
    tf32 = "tf32"
    bf16 = "bf16"
    fp16 = "fp16"


class Loss(str, enum.Enum):
    mse = "mse"
    cross_entropy = "cross-entropy"
    none = "none"


class Optimizer(str, enum.Enum):
    sgd = "sgd"
    adam = "adam"
    adamw = "adamw"


class Device(str, enum.Enum):
    cpu = "cpu"
    cuda = "cuda"


def parse_shape(value: str | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        shape = tuple(int(v) for v in value.replace("x", ",").split(",") if v.strip())
    except ValueError:
        shape = ()
    if not shape or min(shape) < 1:
        raise typer.BadParameter(f"expected sizes like 3,32,32 (got {value!r})")
    return shape


def parse_sizes(value: str | None) -> tuple[int, ...] | None:
    """``--batch-sizes 1,2,4,8``: distinct batch sizes, ascending."""
    if value is None:
        return None
    try:
        sizes = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1 or max(sizes) > 10**9 or len(set(sizes)) != len(sizes):
        raise typer.BadParameter(f"expected distinct batch sizes like 1,2,4,8 (got {value!r})")
    return tuple(sorted(sizes))


def parse_degrees(value: str | None) -> tuple[int, ...]:
    """``--tp 2,4``: tensor-parallel degrees above 1, ascending, each dividing the next (docs/spec.md 1h).
    A replica's units sit on one node, and no node holds 1024 devices: a larger degree is a typo."""
    if value is None:
        return ()
    try:
        degrees = tuple(sorted(int(v) for v in value.split(",") if v.strip()))
    except ValueError:
        degrees = ()
    if (
        not degrees
        or degrees[0] < 2
        or degrees[-1] > 1024
        or len(set(degrees)) != len(degrees)
        or any(high % low for low, high in zip(degrees, degrees[1:]))
    ):
        raise typer.BadParameter(
            "expected distinct tensor-parallel degrees from 2 to 1024, each dividing the next, like 2,4 "
            f"(got {value!r})"
        )
    return degrees


class Format(str, enum.Enum):
    table = "table"
    json = "json"
    markdown = "markdown"
    github = "github"


def scheduler_list(value: str) -> list[str]:
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in SCHEDULERS]
    if unknown or not names:
        raise typer.BadParameter(
            f"unknown scheduler {', '.join(unknown) or '(none given)'}; choose from {', '.join(SCHEDULERS)}"
        )
    return list(dict.fromkeys(names))
