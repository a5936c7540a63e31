"""``heterps profile``: measure a model's layers (or estimate them on a device you do not have), or
merge profiles of one model (docs/guide/profiling.md)."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, cast

import typer
import typer.core
from rich.text import Text

from heterps_cli.cli.options import (
    ZOO_NAMES,
    Device,
    Granularity,
    Loss,
    Optimizer,
    Precision,
    parse_degrees,
    parse_shape,
    parse_sizes,
    positive_number,
)
from heterps_cli.cli.session import exit_codes, not_an_input, out, progress_bar, users_prints_to_stderr, write_output
from heterps_cli.errors import (
    InputError,
)


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


ModelArg = Annotated[
    str,
    typer.Argument(
        help=f"A built-in model ({', '.join(ZOO_NAMES)}), FILE.py:FACTORY or package.module:FACTORY.",
        show_default=False,
    ),
]

InputShapeOpt = Annotated[
    str | None,
    typer.Option(
        help="Per-sample input shape, e.g. 3,224,224 (vgg16), 784 (mlp), 128 (transformer: sequence length), "
        "4 (ctr: ids per bag).",
        callback=parse_shape,
        show_default=False,
    ),
]

CatalogueOpt = Annotated[
    Path | None,
    typer.Option(
        metavar="FILE",
        help="--estimate: your own device catalogue (laid out as the built-in heterps_cli/profiling/devices.yaml).",
        show_default=False,
    ),
]

CalibrateOpt = Annotated[
    Path | None,
    typer.Option(
        metavar="PROFILE",
        help="--estimate: fit the efficiencies per layer kind to this measured profile of the same model "
        "(e.g. this machine's cpu profile).",
        show_default=False,
    ),
]

GranularityOpt = Annotated[
    Granularity,
    typer.Option(
        help="auto: every leaf module where they form a chain, else blocks; layers: every leaf module; blocks: "
        "the finest modules at which the model is a chain (a ResNet's residual blocks, a transformer's blocks), "
        "each one layer of the profile. heterps run can only cut a model where it is a chain: the profile says "
        "whether its layers are one (chain), and no plan is made of layers that are not.",
    ),
]

TpOpt = Annotated[
    str | None,
    typer.Option(
        "--tp",
        metavar="D1,D2,...",
        help="Also profile each layer at these tensor-parallel degrees (docs/spec.md section 1h: one shard of "
        "its pairs of linear layers, as heterps run shards them, and their all-reduces), so a plan can choose a "
        "degree per stage: measured in as many processes, one per cpu core or GPU; estimated over the device's "
        "in-node link.",
        callback=parse_degrees,
        show_default=False,
    ),
]

PrecisionOpt = Annotated[
    Precision | None,
    typer.Option(
        help="What the model trains at, measured (every forward under autocast for bf16 and fp16; TF32 "
        "switched on for tf32, a GPU's) or estimated. fp32 is PyTorch's default (products at the fp32 peak, "
        "convolutions at TF32 where the device has it); tf32 puts fp32 products on the TF32 peak too; bf16 and "
        "fp16 run the model under autocast, as mixed-precision training does. The profile says which. "
        "[default: fp32 estimated; measured: the model as it is, and the profile says none]",
        show_default=False,
    ),
]

LossOpt = Annotated[
    Loss | None,
    typer.Option(
        help="The loss training takes of the model's output, timed (or with --estimate counted) as the last "
        "layer's: mse (what heterps run trains without --task), cross-entropy (its outputs' last dimension as "
        "classes: a classifier's or a language model's logits), or none. [default: mse]",
        show_default=False,
    ),
]

OptimizerOpt = Annotated[
    Optimizer,
    typer.Option(
        help="The optimiser whose step each layer's update times, or prices where estimated (spec section 1d): "
        "sgd (what heterps run trains without --task), adam or adamw.",
    ),
]

CalibrateOnOpt = Annotated[
    str | None,
    typer.Option(
        metavar="DEVICE",
        help="--calibrate: the catalogue device the profile was measured on (default: its type, if the "
        "catalogue has it).",
        show_default=False,
    ),
]


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
    with exit_codes():
        from heterps_cli import api

        not_an_input(out_file, *files)
        write_output(out_file, api.merge([str(f) for f in files]))
        if out_file != "-":
            out.print(Text(f"wrote {out_file} ({len(files)} profiles merged)"))


_ProfileAsTypeOpt = Annotated[
    str | None,
    typer.Option(
        "--as",
        help="The resource type name this machine is in the cluster file (e.g. cpu, v100).",
        show_default=False,
    ),
]
_ProfileBatchSizeOpt = Annotated[
    int | None, typer.Option(min=1, help="B0: the batch size to measure at.", show_default=False)
]
BatchSizesOpt = Annotated[
    str | None,
    typer.Option(
        metavar="B1,B2,...",
        help="Profile at each of these batch sizes, into one profile (docs/spec.md section 1f: a plan then "
        "chooses its micro-batch among them): the largest is the profile's batch_size. Instead of --batch-size.",
        callback=parse_sizes,
        show_default=False,
    ),
]
_ProfileOutFileOpt = Annotated[
    str | None,
    typer.Option(
        "--out",
        "-o",
        metavar="FILE",
        help="Write the profile YAML here, atomically (- for standard output).",
        show_default=False,
    ),
]
_ProfileRepetitionsOpt = Annotated[
    int,
    typer.Option(
        min=20, help="Timed runs per layer at least (after warm-up; short layers get more); oct is their median."
    ),
]
_ProfileLinkGbpsOpt = Annotated[
    float | None,
    typer.Option(
        callback=positive_number,
        help="Link bandwidth in Gbit/s for odt, instead of measuring it.",
        show_default=False,
    ),
]
_ProfileProcessesOpt = Annotated[
    int,
    typer.Option(
        min=1,
        help="Profile in this many fresh processes and keep each layer's median: steadier on a shared machine, "
        "N times longer.",
    ),
]
_ProfileConcurrentOpt = Annotated[
    int | None,
    typer.Option(
        "--concurrent",
        metavar="K",
        help="Run the --processes K at a time, one per core, so that every layer is timed while K - 1 other "
        "cpu units are busy, as in a plan that uses K units of this machine (cpu only; --processes defaults "
        "to K and must be a multiple of it).",
        show_default=False,
    ),
]
_ProfileEstimateOpt = Annotated[
    str | None,
    typer.Option(
        metavar="DEVICE",
        help="Estimate, do not measure: each layer's time on this device of the catalogue (a100-80gb, h100, "
        "t4, ...; see --catalogue) by a roofline model of its FLOPs and bytes, counted here.",
        show_default=False,
    ),
]


@profile_app.command(name="measure")
def profile_command(
    model: ModelArg,
    as_type: _ProfileAsTypeOpt = None,
    batch_size: _ProfileBatchSizeOpt = None,
    batch_sizes: BatchSizesOpt = None,
    device: Annotated[Device, typer.Option(help="Where to run the layers.")] = Device.cpu,
    out_file: _ProfileOutFileOpt = None,
    input_shape: InputShapeOpt = None,
    repetitions: _ProfileRepetitionsOpt = 20,
    link_gbps: _ProfileLinkGbpsOpt = None,
    processes: _ProfileProcessesOpt = 1,
    concurrent: _ProfileConcurrentOpt = None,
    estimate: _ProfileEstimateOpt = None,
    catalogue: CatalogueOpt = None,
    calibrate: CalibrateOpt = None,
    granularity: GranularityOpt = Granularity.auto,
    calibrate_on: CalibrateOnOpt = None,
    tp: TpOpt = None,
    precision: PrecisionOpt = None,
    loss: LossOpt = None,
    optimizer: OptimizerOpt = Optimizer.sgd,
) -> None:
    """Measure a PyTorch model's layers on this machine and write a profile, or estimate them elsewhere.

    [bold]heterps profile MODEL --as TYPE --batch-size B0 --out P.yaml[/] measures;
    [bold]heterps profile MODEL --as a100-80gb --estimate a100-80gb --batch-size B0 --out P.yaml[/] estimates.
    """
    with exit_codes():
        from heterps_cli import api

        sizes = _sizes(batch_size, batch_sizes)
        profile_flags_agree(
            {"--as": as_type, "--batch-size": sizes, "--out": out_file},
            estimating=estimate is not None,
            estimating_only={"--catalogue": catalogue, "--calibrate": calibrate, "--calibrate-on": calibrate_on},
            measuring_only={
                "--device": device is not Device.cpu,
                "--processes": processes != 1,
                "--concurrent": concurrent is not None,
                "--link-gbps": link_gbps is not None,
            },
        )
        assert as_type is not None and sizes is not None and out_file is not None
        not_an_input(out_file, catalogue, calibrate)  # before the measuring, whose result it would lose
        if concurrent is not None and processes == 1:
            processes = concurrent  # one wave
        if estimate is not None:
            _Estimate(
                model,
                as_type,
                sizes,
                estimate,
                input_shape,
                catalogue,
                calibrate,
                calibrate_on,
                cast(tuple, tp),
                precision,
                loss,
                optimizer=optimizer,
            ).run(granularity, out_file)
            return
        options = {
            "device": device.value,
            "input_shape": cast(tuple[int, ...] | None, input_shape),  # the callback parsed it
            "repetitions": repetitions,
            "link_gbps": link_gbps,
            "processes": processes,
            "granularity": granularity.value,
            "concurrent": concurrent,
            "loss": (loss or Loss.mse).value,
            "optimizer": optimizer.value,
            "precision": None if precision is None else precision.value,
            "tp": cast(tuple, tp),
        }
        with progress_bar() as report, users_prints_to_stderr():
            text, measured = api.measure_sizes(model, as_type, sizes, progress=report, **options)
        write_output(out_file, text)
        if out_file != "-":
            _show_measured(measured, out_file, sizes)


def _show_measured(measured, out_file: str, sizes: tuple[int, ...]) -> None:
    """The measured profile's table, where it went, and what to run next."""
    from heterps_cli.cli.render_measured import profile_view
    from heterps_cli.profiling.measure import NOISY_CV  # imports torch: only here

    out.print(profile_view(measured, NOISY_CV))
    out.print(Text(f"wrote {out_file}" + (f" (batch sizes {', '.join(map(str, sizes))})" if len(sizes) > 1 else "")))
    out.print(
        Text(
            f"next: heterps validate {out_file} CLUSTER, then heterps plan {out_file} CLUSTER --samples N "
            "(a measured profile has no job section: --samples is the samples per epoch; merge profiles "
            "of other types first with heterps profile merge)",
            style="dim",
        )
    )


def _sizes(batch_size: int | None, batch_sizes: object) -> tuple[int, ...] | None:
    """The sizes to profile at: ``--batch-size`` or ``--batch-sizes`` (exit 2 for both)."""
    if batch_size is not None and batch_sizes is not None:
        raise InputError(None, None, "--batch-sizes", "give --batch-size B or --batch-sizes B1,B2,..., not both")
    if batch_sizes is not None:
        return cast(tuple[int, ...], batch_sizes)  # the callback parsed it
    return (batch_size,) if batch_size is not None else None


def profile_flags_agree(required: dict, estimating: bool, estimating_only: dict, measuring_only: dict) -> None:
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


@profile_app.command(name="estimate")
def estimate_command(
    model: ModelArg,
    device: Annotated[
        str,
        typer.Argument(
            help="The catalogue device to estimate on (a100-80gb, h100, t4, ...; see --catalogue).", show_default=False
        ),
    ],
    as_type: Annotated[
        str,
        typer.Option("--as", help="The resource type name of the device in the cluster file (e.g. a100)."),
    ],
    out_file: Annotated[
        str,
        typer.Option(
            "--out", "-o", metavar="FILE", help="Write the profile YAML here, atomically (- for standard output)."
        ),
    ],
    batch_size: Annotated[
        int | None, typer.Option(min=1, help="B0: the batch size to estimate at.", show_default=False)
    ] = None,
    batch_sizes: BatchSizesOpt = None,
    input_shape: InputShapeOpt = None,
    catalogue: CatalogueOpt = None,
    calibrate: CalibrateOpt = None,
    granularity: GranularityOpt = Granularity.auto,
    calibrate_on: CalibrateOnOpt = None,
    tp: TpOpt = None,
    precision: PrecisionOpt = None,
    loss: LossOpt = None,
    optimizer: OptimizerOpt = Optimizer.sgd,
) -> None:
    """Estimate a PyTorch model's layers on a device you do not have and write a profile.

    [bold]heterps profile estimate MODEL a100-80gb --as a100-80gb --batch-size B0 --out P.yaml[/] is
    [bold]heterps profile MODEL --estimate a100-80gb --as a100-80gb --batch-size B0 --out P.yaml[/].
    """
    with exit_codes():
        if calibrate_on is not None and calibrate is None:
            raise InputError(None, None, "--calibrate-on", "--calibrate-on goes with --calibrate PROFILE")
        sizes = _sizes(batch_size, batch_sizes)
        if sizes is None:
            raise InputError(None, None, "--batch-size", "estimating needs --batch-size B or --batch-sizes B1,B2,...")
        job = _Estimate(
            model,
            as_type,
            sizes,
            device,
            input_shape,
            catalogue,
            calibrate,
            calibrate_on,
            cast(tuple, tp),
            precision,
            loss,
            "DEVICE",
            optimizer,
        )
        job.run(granularity, out_file)


@dataclass
class _Estimate:
    """An estimated profile (a roofline of the FLOPs and bytes counted here, on a catalogue device), as
    both spellings of ``heterps profile`` ask for it."""

    model: str
    as_type: str
    sizes: tuple[int, ...]
    device: str
    input_shape: str | None
    catalogue: Path | None
    calibrate: Path | None
    calibrate_on: str | None
    tp: tuple[int, ...]  # the callback parsed --tp
    precision: Precision | None  # None: not given, PyTorch's default (fp32)
    loss: Loss | None  # None: not given, mse (what heterps run trains with)
    device_field: str = "--estimate"  # what an error about the device names: the option, or the argument
    optimizer: Optimizer = Optimizer.sgd  # whose step each layer's update prices

    def run(self, granularity: Granularity, out_file: str) -> None:
        from heterps_cli import api
        from heterps_cli.cli.render_measured import estimate_view
        from heterps_cli.profiling.write import cluster_snippet

        not_an_input(out_file, self.catalogue, self.calibrate)
        with progress_bar() as report, users_prints_to_stderr(), self._naming_the_device():
            text, estimated = api.estimate_sizes(
                self.model,
                self.as_type,
                self.sizes,
                self.device,
                input_shape=cast(tuple[int, ...] | None, self.input_shape),  # the callback parsed it
                catalogue=None if self.catalogue is None else str(self.catalogue),
                calibrate=None if self.calibrate is None else str(self.calibrate),
                calibrate_on=self.calibrate_on,
                tp=self.tp,
                precision=(self.precision or Precision.fp32).value,
                loss=(self.loss or Loss.mse).value,
                optimizer=self.optimizer.value,
                granularity=granularity.value,
                progress=report,
            )
        write_output(out_file, text)
        if out_file != "-":
            out.print(estimate_view(estimated, cluster_snippet(estimated)))
            out.print(Text(f"wrote {out_file}"))

    @contextmanager
    def _naming_the_device(self):
        try:
            yield
        except InputError as exc:
            if exc.field != "--estimate" or self.device_field == "--estimate":
                raise
            raise InputError(exc.path, exc.line, self.device_field, exc.message, exc.more) from None
