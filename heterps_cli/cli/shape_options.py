"""The options that fix a plan's shape or plan within an engine's rules (docs/spec.md section 1k), shared by
``plan``, ``check`` and ``frontier``."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Annotated

import typer

from heterps_cli.errors import InputError

if TYPE_CHECKING:
    from heterps_cli.shape import Shape

PANEL = "Shape and engine (section 1k; the exact solver)"


class EngineName(str, enum.Enum):
    megatron = "megatron"
    torchtitan = "torchtitan"
    deepspeed = "deepspeed"
    pipelining = "pipelining"


EngineOpt = Annotated[
    EngineName | None,
    typer.Option(
        "--engine",
        help="Plan within this engine's rules (one tensor-parallel and one data-parallel degree for every stage, "
        "recomputation for all or none, no mixed stage): the best plan it runs, beside heterps run's best. "
        "heterps export writes it for the engine.",
        show_default=False,
        rich_help_panel=PANEL,
    ),
]
StagesOpt = Annotated[
    int | None,
    typer.Option(
        "--stages", min=1, help="Exactly this many pipeline stages.", show_default=False, rich_help_panel=PANEL
    ),
]
TpOpt = Annotated[
    int | None,
    typer.Option(
        "--tp", min=1, help="Every stage at this tensor-parallel degree.", show_default=False, rich_help_panel=PANEL
    ),
]
MaxTpOpt = Annotated[
    int | None,
    typer.Option(
        "--max-tp", min=1, help="No stage above this tensor-parallel degree.", show_default=False, rich_help_panel=PANEL
    ),
]
ReplicasOpt = Annotated[
    int | None,
    typer.Option(
        "--replicas",
        min=1,
        help="Every stage with this many replicas (one data-parallel degree; it splits each micro-batch evenly).",
        show_default=False,
        rich_help_panel=PANEL,
    ),
]
RecomputeOpt = Annotated[
    bool | None,
    typer.Option(
        "--recompute/--no-recompute",
        help="Every stage recomputes its activations, or none does (default: each stage chooses).",
        show_default=False,
        rich_help_panel=PANEL,
    ),
]
LayerTypeOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--layer-type",
        metavar="FIRST..LAST=TYPE",
        help="These layers (names or indices, inclusive; one layer: LAYER=TYPE) run on TYPE. Repeatable.",
        show_default=False,
        rich_help_panel=PANEL,
    ),
]
StageTypesOpt = Annotated[
    str | None,
    typer.Option(
        "--stage-types",
        metavar="T1,T2,...",
        help="Each stage's type, first to last (* for any); as many stages as types.",
        show_default=False,
        rich_help_panel=PANEL,
    ),
]


def shape_from(
    stages: int | None,
    tp: int | None,
    max_tp: int | None,
    replicas: int | None,
    recompute: bool | None,
    layer_type: list[str] | None,
    stage_types: str | None,
) -> Shape | None:
    """The shape the options state (None: they state none)."""
    from heterps_cli.shape import Shape

    ranges = tuple(_layer_range(text) for text in layer_type or [])
    types = tuple(t.strip() for t in stage_types.split(",")) if stage_types else ()
    if types and stages is None:
        stages = len(types)
    if tp is not None and max_tp is not None:
        raise InputError(None, None, "--max-tp", "give --tp or --max-tp, not both")
    shape = Shape(stages, tp, max_tp, replicas, recompute, ranges, types)
    return None if shape.free else shape


def _layer_range(text: str) -> tuple[str, str, str]:
    where, sep, name = text.rpartition("=")
    first, _, last = where.partition("..")
    if not sep or not name or not first:
        raise InputError(None, None, "--layer-type", f"{text!r}: write FIRST..LAST=TYPE or LAYER=TYPE")
    return first.strip(), (last or first).strip(), name.strip()


def refuse_other_scheduler(scheduler: str | None, shape: Shape | None, engine: EngineName | None) -> str:
    """The scheduler to run: exact where a shape or an engine is given (refusing another one named),
    else the one named, or rl."""
    if shape is None and engine is None:
        return scheduler or "rl"
    if scheduler not in (None, "exact"):
        raise InputError(None, None, "--scheduler", f"{'--engine' if engine else 'a shape option'} plans with "
                         "the exact solver (its rules are constraints of the exact search): drop --scheduler, "
                         "or give -s exact")  # fmt: skip
    return "exact"


def refuse_mixed(engine: EngineName | None, shape: Shape | None, mixed_stages: bool | None) -> None:
    """An engine never mixes types in a stage, and a shape is a space of one-type stages (exit 2)."""
    if mixed_stages and (engine is not None or shape is not None):
        said = f"--engine {engine.value}: the engine never mixes types in a stage" if engine else (
            "a shape option plans stages of one type each (section 1k)")  # fmt: skip
        raise InputError(None, None, "--mixed-stages", f"{said}: drop --mixed-stages")
