"""Human output for what heterps measured: a profile, an estimate and a run of a plan (rich tables;
no logic, only presentation)."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from heterps_cli.cli.render import bold, clip
from heterps_cli.figures import count, plural


def _seconds(x: float) -> str:
    return f"{x * 1e3:.3g} ms" if x < 1 else f"{x:.3g} s"


def estimate_view(estimated, snippet: str) -> Group:
    """Per layer: type, FLOPs, bytes, kernels, the peak it runs at, whether compute or memory bounds it, oct."""
    title = Text.assemble(
        bold(estimated.model),
        " as ",
        bold(estimated.resource),
        f" on {estimated.device} ({estimated.spec.title}), batch {estimated.batch_size}: ",
        Text("estimated, not measured", style="yellow"),
    )
    table = Table(title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD)
    numeric: dict[str, Any] = dict(justify="right", no_wrap=True)
    table.add_column("layer", max_width=28)
    table.add_column("type", no_wrap=True)
    for name in ("GFLOP", "MB moved", "kernels", "peak", "oct", *(f"oct tp{d}" for d in estimated.degrees)):
        table.add_column(name, **numeric)
    for i, (layer, x) in enumerate(zip(estimated.layers, estimated.estimates)):
        table.add_row(
            Text(clip(layer.name)),
            Text(clip(layer.kind)),
            f"{x.work.flops / 1e9:.3g}",
            f"{x.work.bytes / 1e6:.3g}",
            str(x.work.kernels),
            x.peak,
            _seconds(layer.oct),
            *(
                _seconds(at[i].oct) if estimated.sharded[d][i].pairs else Text("whole", style="dim")
                for d, at in estimated.degrees.items()
            ),
        )
    lines = [Text(f"sum of oct {_seconds(estimated.total_oct)} per batch")]
    lines += [
        Text(
            f"at tp {d}: sum of oct {_seconds(sum(x.oct for x in at))} per batch, "
            f'{sum(1 for s in estimated.sharded[d] if s.pairs)} of {len(at)} layers split ("whole": nothing to '
            "split, the layer runs whole on every GPU)"
        )
        for d, at in estimated.degrees.items()
    ]
    if estimated.calibrated_on:
        lines.append(Text(f"calibrated on {estimated.calibrated_on}: {estimated.factors}"))
    lines += [Text(note, style="yellow") for note in estimated.notes]
    lines += [Text("for the cluster file (resources:):", style="dim"), Text(snippet)]
    return Group(table, *lines)


def profile_view(measured, noisy_cv: float) -> Group:
    """Per layer: type, oct, odt, alpha, the spread of the repetitions; noisy layers flagged."""
    title = Text.assemble(
        bold(measured.model), " as ", bold(measured.resource), f" on {measured.device}, batch {measured.batch_size}"
    )
    table = Table(title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD)
    numeric: dict[str, Any] = dict(justify="right", no_wrap=True)
    table.add_column("layer", max_width=28)
    table.add_column("type", no_wrap=True)
    for name in ("oct", "odt", "alpha", "spread"):
        table.add_column(name, **numeric)
    noisy = 0
    for layer in measured.layers:
        flag = layer.cv > noisy_cv
        noisy += flag
        alpha = f"{layer.alpha:.2f}" + ("*" if "alpha" in layer.estimated else " ")
        table.add_row(
            Text(clip(layer.name)),
            Text(clip(layer.kind)),
            _seconds(layer.oct),
            _seconds(layer.odt),
            alpha,
            f"{100 * layer.cv:.0f}%" + (" noisy" if flag else ""),
            style="yellow" if flag else None,
        )
    return Group(table, *_profile_lines(measured, noisy, noisy_cv))


def _profile_lines(measured, noisy: int, noisy_cv: float) -> list[Text]:
    """The lines under a measured profile's table: the step it adds up to, the fixed costs, the warnings."""
    total = measured.total_oct
    lines = [
        Text(
            f"sum of oct {_seconds(total)} per batch, {total / measured.step:.0%} of a whole-model step "
            f"({_seconds(measured.step)}) · link {measured.bandwidth_how}"
        ),
        Text(
            f"fixed (spec section 1d): a backward pass starts {_seconds(measured.pass_start)} before its first layer"
            + (
                f"; an all-reduce takes {_seconds(measured.all_reduce_latency)} beyond its bytes"
                if measured.all_reduce_latency is not None
                else ""
            )
            + (
                f"; a message across a stage boundary {_seconds(measured.transfer_latency)}"
                if measured.transfer_latency is not None
                else ""
            )
        ),
    ]
    if abs(total / measured.step - 1) > 0.25:
        lines.append(
            Text(
                "the layers' sum is far from a whole step: code between modules (e.g. torch.cat, "
                "indexing, residual adds) is in no layer, and a layer timed alone keeps its data in "
                "cache where a whole step may not; --granularity blocks (or a factory's own list of "
                "blocks) profiles whole blocks instead",
                style="yellow",
            )
        )
    lines.append(Text("* alpha estimated (see the comment in the file); spread: coefficient of variation of the runs"))
    if noisy:
        lines.append(
            Text(
                f"{noisy} noisy layer{'s' if noisy > 1 else ''} (spread > {100 * noisy_cv:.0f}%): "
                "profile on an idle machine, raise --repetitions, or take the median over fresh "
                "processes with --processes 3",
                style="yellow",
            )
        )
    if measured.load is not None:
        lines.append(Text(measured.load.describe()))
    lines += [Text(f"note: {n}") for n in measured.notes]
    lines += [Text(f"profile again: {why}", style="bold yellow") for why in measured.advice]
    return lines


def _cpu_type(name: str) -> bool:
    return name.lower().startswith("cpu")


def run_view(report) -> Group:
    """``heterps run``: what each stage spent per batch, then the plan's prediction beside the run."""
    return Group(*_run_tables(report), *_run_lines(report))


def _run_tables(report) -> tuple[Table, Table, Table]:
    """``heterps run``'s tables: time spent per stage, the plan beside the run, memory per process."""
    title = Text.assemble(
        "run of ",
        bold(report.plan),
        " with ",
        bold(report.model),
        f": {plural(report.processes, 'process', 'processes')}, {report.steps} measured steps after "
        f"{report.warmup} warm-up, each {plural(report.micro_batches, 'batch', 'batches')} of {report.batch_size} "
        "(micro-batches, 1F1B), then a flush",
    )
    numeric: dict[str, Any] = dict(justify="right", no_wrap=True)
    spent = Table(title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD)
    spent.add_column("stage", no_wrap=True)
    spent.add_column("layers", max_width=24)
    spent.add_column("device", no_wrap=True)
    reads = any(s.data_s for s in report.stages)  # --task: reading the samples gets its own column
    for name in ("compute", "wait", "sync", *(["data"] if reads else []), "update", "idle"):
        spent.add_column(name, **numeric)
    versus = Table(title="per batch, against the plan", title_justify="left", header_style="bold", box=box.SIMPLE_HEAD)
    versus.add_column("stage", no_wrap=True)
    for name in ("plan CT", "plan DT", "plan update", "plan samples/s", "stage alone", "run/plan"):
        versus.add_column(name, **numeric)
    memory = Table(title="memory per process", title_justify="left", header_style="bold", box=box.SIMPLE_HEAD)
    memory.add_column("stage", no_wrap=True)
    memory.add_column("peak GB", **numeric)
    memory.add_column("before model GB", **numeric)
    memory.add_column("plan GB", **numeric)
    memory.add_column("measured as", overflow="fold")
    for s in report.stages:
        on = clip(s.resource) + (f" tp{s.tp}" if s.tp > 1 else "")  # section 1h
        stage = Text(f"{s.index} {on}×{s.replicas}" + (" ◀" if s.index == report.bottleneck else ""))
        spent.add_row(
            stage,
            Text(clip(s.first if s.first == s.last else f"{s.first} … {s.last}")),
            Text(s.device),
            _seconds(s.compute_s),
            _seconds(s.wait_s),
            _seconds(s.sync_s),
            *([_seconds(s.data_s)] if reads else []),
            _seconds(s.update_s),
            _seconds(s.idle_s),
        )
        versus.add_row(
            stage.copy(),
            _seconds(s.predicted_compute_s),
            _seconds(s.predicted_comm_s),
            _seconds(s.predicted_update_s),
            count(s.predicted_throughput),
            count(s.throughput),
            f"{s.ratio:.2f}",
        )
        memory.add_row(
            stage.copy(),
            f"{s.peak_memory_gb:.3g}",
            f"{s.baseline_memory_gb:.3g}",
            "—" if s.predicted_memory_gb is None else f"{s.predicted_memory_gb:.3g}",
            s.peak_memory_how or "not measured",
        )
    return spent, versus, memory


def _run_lines(report) -> list[Text]:
    """``heterps run``'s figures in all, what its columns mean, and what to keep in mind."""
    lines = [
        Text.assemble(
            "throughput ",
            bold(f"{count(report.throughput, 1)} samples/s"),
            f" measured end to end, {count(report.predicted_throughput, 1)} predicted: measured/predicted ",
            bold(f"{report.ratio:.2f}"),
        ),
        Text(
            f"bottleneck: stage {report.bottleneck} measured (◀: most compute + sync per batch), "
            f"stage {report.predicted_bottleneck} in the plan"
        ),
        Text(
            "compute: the stage's layers forward and backward (its slowest replica); wait: blocked on a "
            "neighbour stage, receiving or until it received (its work, the pipeline's fill and drain, the "
            "transfer), or on the stage's slowest replica before the all-reduce; sync: the gradient all-reduce "
            "among the replicas; update: the optimiser step and the gradients' reset; idle: the rest (Python between "
            "the pieces); all per micro-batch; stage alone: the "
            "samples/s the stage would sustain by itself, batch / (compute + sync), where the end-to-end "
            "throughput above also pays the waits",
            style="dim",
        ),
    ]
    stand_ins = [f"{s.resource} on {s.device}" for s in report.stages if (s.device == "cpu") != _cpu_type(s.resource)]
    if stand_ins:
        lines.append(
            Text(
                f"note: {', '.join(dict.fromkeys(stand_ins))} (--map): the plan predicts the hardware it was "
                "profiled on, so measured/predicted here compares two machines, not the model's accuracy",
                style="yellow",
            )
        )
    if report.losses:
        first, last = report.first_step + 1, report.first_step + len(report.losses)
        resumed = f" (resumed after step {report.first_step})" if report.first_step else ""
        lines.append(
            Text(f"loss {report.losses[0]:.6g} at step {first}, {report.losses[-1]:.6g} at step {last}{resumed}")
        )
    if report.diverged is not None:
        lines.append(
            Text(
                f"warning: the loss is not a finite number from step {report.diverged} (the training diverged: "
                "lower the learning rate); --json gives it as null",
                style="yellow",
            )
        )
    return lines
