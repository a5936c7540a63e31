"""``heterps export``: a plan in the form an engine users train with takes (docs/guide/engines.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from heterps_cli.cli.session import exit_codes, not_an_input, out, write_output
from heterps_cli.cli.shape_options import EngineName as Engine

WROTE = {
    "megatron": "Megatron-LM's arguments for pretrain_gpt.py",
    "torchtitan": "torchtitan's job config (--job.config_file)",
    "deepspeed": "DeepSpeed's config (--deepspeed_config) with the PipelineModule's parts",
}


def export_command(
    plan_file: Annotated[
        Path, typer.Argument(metavar="PLAN", help="A plan written by heterps plan --out.", show_default=False)
    ],
    to: Annotated[
        Engine,
        typer.Option(
            help="The engine: pipelining (torch.distributed.pipelining, a torchrun script), megatron (Megatron-LM's "
            "pretrain_gpt.py arguments; needs --profile), torchtitan (its TOML job config) or deepspeed (its JSON "
            "config with the PipelineModule's parts)."
        ),
    ] = Engine.pipelining,
    profile: Annotated[
        Path | None,
        typer.Option(
            help="The profile the plan was made from: which layer is the embedding, a decoder layer, the "
            "output (megatron).",
            show_default=False,
        ),  # fmt: skip
    ] = None,
    micro_batches: Annotated[
        int | None,
        typer.Option(
            min=1, help="Micro-batches a step (default: the plan's, as heterps run takes them).", show_default=False
        ),  # fmt: skip
    ] = None,
    out_file: Annotated[
        str,
        typer.Option("--out", "-o", help="Where to write it (- for standard output).", show_default=True),
    ] = "-",
) -> None:
    """Write the plan as an engine runs it: its stages, split points, micro-batches and schedule in the
    engine's own names; what the engine cannot express is refused (exit 2), naming it."""
    with exit_codes():
        from heterps_cli.errors import InputError
        from heterps_cli.exports.pipelining import script
        from heterps_cli.loading import load_plan
        from heterps_cli.runtime import default_micro_batches

        if out_file != "-":
            not_an_input(Path(out_file), plan_file, profile, field="--out")
        plan, _ = load_plan(str(plan_file))
        M = micro_batches or plan.micro_batches or default_micro_batches(len(plan.stages))
        if to is Engine.megatron:
            from heterps_cli.exports.megatron import arguments
            from heterps_cli.loading import load_profile

            if profile is None:
                raise InputError(None, None, "--profile", "--to megatron needs the plan's profile (--profile FILE)")
            text = arguments(plan, load_profile(str(profile))[0], str(plan_file), str(profile), M)
        elif to is Engine.torchtitan:
            from heterps_cli.exports import torchtitan

            text = torchtitan.config(plan, str(plan_file), M)
        elif to is Engine.deepspeed:
            from heterps_cli.exports import deepspeed

            text = deepspeed.config(plan, str(plan_file), M)
        else:
            text = script(plan, str(plan_file), M)
        write_output(out_file, text)
        if out_file != "-" and to.value in WROTE:
            out.print(Text(f"wrote {out_file}: {WROTE[to.value]}"))
        elif out_file != "-":
            count = len(plan.stages)
            said = f"wrote {out_file}: torchrun --standalone --nproc-per-node {count} {out_file} --task FILE.py:FACTORY"
            out.print(Text(said))
