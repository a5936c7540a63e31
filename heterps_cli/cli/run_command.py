"""``heterps run``: train a plan on real processes and hold it against its prediction
(docs/guide/running.md)."""

from __future__ import annotations

import os
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Annotated, cast

import typer
from rich.text import Text

from heterps_cli.cli.options import MAX_THREADS, DeviceMapOpt, RunModelOpt, parse_shape, positive_number, seed_callback
from heterps_cli.cli.session import (
    exit_codes,
    not_an_input,
    out,
    progress_or_lines,
    users_prints_to_stderr,
    write_output,
)
from heterps_cli.progress import quiet
from heterps_cli.runtime import DEFAULT_WARMUP

_RunPlanFileArg = Annotated[
    Path, typer.Argument(metavar="PLAN", help="A plan written by heterps plan --out.", show_default=False)
]
_RunInputShapeOpt = Annotated[
    str | None,
    typer.Option(help="Per-sample input shape, as for heterps profile.", callback=parse_shape, show_default=False),
]
_RunStepsOpt = Annotated[
    int,
    typer.Option(
        min=1,
        help="Training steps (each runs --micro-batches batches, then a flush and one optimiser step): with "
        "--task, the steps trained in all, the first --warmup of each run unmeasured; without, the steps "
        "measured after --warmup.",
    ),
]
_RunTaskOpt = Annotated[
    str | None,
    typer.Option(
        "--task",
        metavar="FILE.py:FACTORY",
        help="Train your own model, data, loss and optimiser: FACTORY returns a heterps_cli.Task (or a dict of "
        "its fields: model, data, loss, optimizer). Without it, synthetic data and a mean-squared loss "
        "measure the plan (docs/guide/training.md).",
        show_default=False,
    ),
]
_RunCheckpointDirOpt = Annotated[
    str | None,
    typer.Option(
        "--checkpoint-dir",
        metavar="DIR",
        help="Save every stage's weights and optimiser state here (DIR/step-N), atomically, every "
        "--checkpoint-every steps and after the last.",
        show_default=False,
    ),
]
_RunCheckpointEveryOpt = Annotated[
    int | None,
    typer.Option(min=1, help="Steps between checkpoints (default 100; needs --checkpoint-dir).", show_default=False),
]
_RunResumeOpt = Annotated[
    bool,
    typer.Option(
        "--resume",
        help="Continue from the newest complete checkpoint in --checkpoint-dir (from step 1 where there is "
        "none); the run trains on to --steps.",
    ),
]
_RunMicroBatchesOpt = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="Batches of the plan's batch size per step (1F1B: they fill the pipeline, then a flush and "
        "one optimiser step). Default: the plan's micro_batches (docs/spec.md section 1d), else 16 x "
        "(stages - 1), at most 64: the fill and drain then idle a stage 6% of a step.",
        show_default=False,
    ),
]
_RunMaxProcessesOpt = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="Refuse a plan that needs more processes than this (default: the cores here).",
        show_default=False,
    ),
]
_RunSeedOpt = Annotated[
    int, typer.Option(callback=seed_callback, help="Seeds the model's weights and the synthetic data.")
]
_RunTimeoutOpt = Annotated[
    float,
    typer.Option(
        min=1.0,
        max=86_400.0,
        help="Seconds any process may wait for another before the run fails (1 to 86,400: gloo's own timers "
        "take whole milliseconds and a day at most).",
    ),
]
_RunPlacedOpt = Annotated[
    bool,
    typer.Option(
        "--placed",
        help="Under torchrun: the processes run where the plan places them (its stages' nodes), node by "
        "node, as heterps launch writes the commands.",
    ),
]
_RunOutFileOpt = Annotated[
    str | None,
    typer.Option(
        "--out", "-o", metavar="FILE", help="Also write the report as JSON here, atomically.", show_default=False
    ),
]


def run_command(
    plan_file: _RunPlanFileArg,
    model: RunModelOpt = None,
    device_map: DeviceMapOpt = None,
    input_shape: _RunInputShapeOpt = None,
    steps: _RunStepsOpt = 10,
    warmup: Annotated[int, typer.Option(min=0, help="Steps run first and not measured.")] = DEFAULT_WARMUP,
    micro_batches: _RunMicroBatchesOpt = None,
    threads: Annotated[
        int, typer.Option(min=1, max=MAX_THREADS, help="Threads per process (one unit of a CPU type = one core).")
    ] = 1,
    max_processes: _RunMaxProcessesOpt = None,
    seed: _RunSeedOpt = 0,
    lr: Annotated[float, typer.Option(callback=positive_number, help="SGD learning rate (without --task).")] = 0.01,
    timeout: _RunTimeoutOpt = 120.0,
    placed: _RunPlacedOpt = False,
    task: _RunTaskOpt = None,
    checkpoint_dir: _RunCheckpointDirOpt = None,
    checkpoint_every: _RunCheckpointEveryOpt = None,
    resume: _RunResumeOpt = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    out_file: _RunOutFileOpt = None,
) -> None:
    """Train with a plan on real processes (torch.distributed) and measure it against its prediction.

    One process per replica of every stage; the stages form a pipeline (1F1B, micro-batches and a flush),
    the replicas of a stage split each micro-batch and sum their gradients. With --task, your model, data,
    loss and optimiser, and checkpoints to resume from (docs/guide/training.md); without, synthetic data:
    the model's example batch and a fixed random target. Under torchrun each process is one rank
    (docs/guide/running.md).
    """
    with exit_codes():
        from heterps_cli import api
        from heterps_cli.cli.render_measured import run_view
        from heterps_cli.runtime import parse_map
        from heterps_cli.runtime.launch import torchrun_env

        files = [spec.rpartition(":")[0] for spec in (task, model) if spec and ":" in spec]
        not_an_input(out_file, plan_file, *files)  # before the training, whose report it would lose
        env = torchrun_env()
        rank = env[0] if env is not None else 0  # under torchrun rank 0 speaks for the job, as it reports
        said = progress_or_lines("heterps run") if rank == 0 else nullcontext(quiet)
        with said as report, users_prints_to_stderr():
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
                placed=placed,
                task=task,
                checkpoint_dir=checkpoint_dir,
                checkpoint_every=checkpoint_every,
                resume=resume,
                progress=report,
            )
        if result is not None:  # None: a torchrun rank other than 0, as rank 0 reports
            written = result.to_json()
            if out_file is not None:
                write_output(out_file, written)
            if as_json:
                sys.stdout.write(written)
            else:
                out.print(run_view(result))
                if out_file is not None and out_file != "-":
                    out.print(Text(f"wrote {out_file}"))
    if env is not None:
        # Done and said: leave without C++ destructors, as a local worker does (runtime.worker.spawned), since
        # gloo's threads still winding down sometimes abort the exit ("terminate called without an active
        # exception"), and torchrun then fails the whole job.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
