"""Writing measured profiles (docs/spec.md section 2) and merging profiles of one model from several machines.

A written profile says how every number was obtained: a header comment for the
run, and on each ``times`` entry a ``# estimated: ...`` comment naming the
fields that were not measured and why. Comments keep the file a plain
profile; ``merge`` reads them back from the source lines so they survive it.
Each type's alpha and beta go on its ``times`` entry (docs/spec.md section 2's per-type
override), so that merging is a union of entries.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from heterps_cli.errors import InputError
from heterps_cli.figures import exact
from heterps_cli.formats import Profile
from heterps_cli.loading import load_profile
from heterps_cli.profiling.estimate import UPDATE_KERNELS, UPDATE_PASSES, Estimated
from heterps_cli.profiling.measure import MAX_RUNS, MIN_SECONDS, LayerProfile, Profiled, python_path_note
from heterps_cli.profiling.ties import Tie
from heterps_cli.yamlio import Document


@dataclass
class Entry:
    oct: float
    odt: float
    alpha: float
    beta: float
    comment: str = ""  # "estimated: ..." or empty
    update: float | None = None  # docs/spec.md section 1d, where measured
    batches: dict[int, Entry] | None = None  # section 2: the times at other batch sizes
    forward: float | None = None  # section 1g: the forward pass's part of oct, where measured
    tp: dict[int, Entry] | None = None  # section 1h: one replica's times at each degree


@dataclass(frozen=True)
class ShardRow:
    """Section 1h: one unit's share of a layer at a tensor-parallel degree."""

    weight_size: float
    activation_size: float
    input_saved: float
    cast_size: float = 0.0  # docs/spec.md section 1b


@dataclass
class LayerRow:
    name: str
    kind: str
    input_size: float
    weight_size: float
    times: dict[str, Entry]
    activation_size: float = 0.0  # docs/spec.md section 1b
    sharded: bool = False
    input_saved: float = 0.0  # docs/spec.md section 1b
    tp: dict[int, ShardRow] | None = None  # docs/spec.md section 1h
    cast_size: float = 0.0  # docs/spec.md section 1b: half-precision weight copies, bytes a batch keeps


def _number(x: float) -> str:
    if float(x).is_integer() and abs(x) < 1e15:
        return str(int(x))
    return f"{x:.6g}"


def render(
    model: str,
    batch_size: int,
    layers: list[LayerRow],
    header: list[str],
    *,
    state_factor: float | None = None,
    job: dict[str, float] | None = None,
    precision: str | None = None,
    fixed: dict[str, dict[str, float]] | None = None,
    chain: bool | None = None,
    ties: list[Tie] | None = None,
) -> str:
    _refuse_what_no_profile_holds(layers)
    lines = [f"# {h}" for h in header]
    lines += [f"model: {json.dumps(model)}", f"batch_size: {batch_size}"]
    if chain is not None:  # section 2: whether heterps run can cut between any two of the layers
        lines.append(f"chain: {'true' if chain else 'false'}")
    if precision is not None:
        lines.append(f"precision: {precision}")
    if job:
        lines += ["job:", *(f"  {key}: {exact(value)}" for key, value in job.items())]
    if state_factor is not None:
        lines.append(f"state_factor: {exact(state_factor)}")
    if fixed:  # docs/spec.md section 1d
        lines.append("fixed:")
        lines += [
            f"  {json.dumps(t)}: {{{', '.join(f'{k}: {_number(v)}' for k, v in costs.items())}}}"
            for t, costs in fixed.items()
        ]
    lines += tie_lines(ties or [], [row.name for row in layers])
    lines.append("layers:")
    for row in layers:
        lines += [
            f"  - name: {json.dumps(row.name)}",
            f"    type: {json.dumps(row.kind)}",
            f"    input_size: {_number(row.input_size)}",
            f"    weight_size: {_number(row.weight_size)}",
            f"    activation_size: {_number(row.activation_size)}",
            *([f"    input_saved: {_number(row.input_saved)}"] if row.input_saved else []),
            *([f"    cast_size: {_number(row.cast_size)}"] if row.cast_size else []),
            *(["    sharded: true"] if row.sharded else []),
            "    times:",
        ]
        for t, e in row.times.items():
            shards = ", ".join(f"{d}: {{{_entry(x)}}}" for d, x in sorted((e.tp or {}).items()))
            entry = f"      {json.dumps(t)}: {{{_entry(e)}" + (f", tp: {{{shards}}}}}" if shards else "}")
            lines.append(entry + (f"  # {e.comment}" if e.comment else ""))
        if row.tp:
            lines.append("    tp:")
            lines += [
                f"      {d}: {{weight_size: {_number(x.weight_size)}, activation_size: {_number(x.activation_size)}"
                + (f", input_saved: {_number(x.input_saved)}" if x.input_saved else "")
                + (f", cast_size: {_number(x.cast_size)}}}" if x.cast_size else "}")
                for d, x in sorted(row.tp.items())
            ]
    return "\n".join(lines) + "\n"


def tie_lines(ties: list[Tie], names: list[str]) -> list[str]:
    """Section 1j: the profile's ``ties``, each tensor with its holders by layer name."""
    if not ties:
        return []
    lines = ["ties:  # tensors several layers hold (spec section 1j): counted once, in the first holder's weight_size"]
    for tie in ties:
        held = ", ".join(json.dumps(names[i]) for i in tie.layers)
        lines.append(
            f"  - {{tensor: {json.dumps(tie.tensor)}, kind: {tie.kind}, bytes: {_number(tie.bytes)}, layers: [{held}]}}"
        )
    return lines


def _refuse_what_no_profile_holds(layers: list[LayerRow]) -> None:
    """heterps writes no profile it would refuse: a time that came out infinite or not a number (from a
    rate so small that a division overflowed) stops the command, naming the layer, the type and the field."""

    def times(e: Entry, where: str) -> Iterator[tuple[str, float]]:
        yield from ((f"{where}.{k}", getattr(e, k)) for k in ("oct", "odt", "forward", "update"))
        for b, x in (e.batches or {}).items():
            yield from times(x, f"{where}.batches.{b}")
        for d, x in (e.tp or {}).items():
            yield from times(x, f"{where}.tp.{d}")

    for i, row in enumerate(layers):
        for t, e in row.times.items():
            for field, value in times(e, f"layers[{i}].times.{t}"):
                if value is not None and not math.isfinite(value):
                    raise InputError(
                        None,
                        None,
                        field,
                        f"came out as {value} for layer {row.name!r}, which no profile may hold: a figure it "
                        "is computed from (a rate of the device catalogue, --link-gbps) is too small or too large",
                    )


def _entry(e: Entry) -> str:
    """An entry's fields but tp: its times, update and batches."""
    update = f", update: {_number(e.update)}" if e.update is not None else ""
    more = ", ".join(f"{b}: {{{_times(x)}}}" for b, x in sorted((e.batches or {}).items()))
    return _times(e) + update + (f", batches: {{{more}}}" if more else "")


def _times(e: Entry) -> str:
    forward = f", forward: {_number(e.forward)}" if e.forward is not None else ""
    return f"oct: {_number(e.oct)}, odt: {_number(e.odt)}, alpha: {e.alpha:.4g}, beta: {e.beta:.4g}{forward}"


def measured_text(p: Profiled, note: str | None = None) -> str:
    """The profile file of one measurement run; ``note`` says where (default: this Python and machine)."""
    note = note if note is not None else python_path_note()
    header = [
        f"measured by heterps profile: model {p.model} as resource type {p.resource!r} on {p.device} ({note})",
        f"oct: median of {p.repetitions} or more forward+backward runs of each layer in step order (every "
        f"forward in order, then every backward in reverse in one call, as a training step; at least {MIN_SECONDS:g} s "
        f"of passes, up to {MAX_RUNS}), batch {p.batch_size}"
        + (", one thread (one cpu unit = one core)" if p.device == "cpu" else ", timed by CUDA events")
        + (
            f"; the last layer's with the {p.loss} loss of its output, as training's last stage"
            if p.loss != "none"
            else ""
        ),
        "forward: the median of the same runs' forward parts (spec section 1g: what a stage that recomputes "
        "its activations runs again)",
        f"odt: gradient all-reduce bytes per batch (as big as the weights) / link bandwidth; bandwidth "
        f"{p.bandwidth_how}; activations move at stage boundaries (spec section 1b: input_size over bandwidth_gbps)",
        "activation_size: bytes per sample the layer keeps for backward (tensors autograd saves, each storage once); "
        "input_saved: of those, the bytes the layer before also keeps, in one forward of the whole model; "
        "cast_size: what it saves that autograd made from its weights alone (autocast's half-precision copies), "
        "bytes a batch keeps whatever its samples",
        f"update: median of the optimiser step ({p.optimizer}) and the gradients' reset on the layer's weights, "
        "each after a step-order backward pass, s per step (spec section 1d)",
        "fixed: pass_start, the median time from the backward call to its first layer (given to no layer); "
        "all_reduce_latency, the link's, fitted with its bandwidth to mean all-reduces of 4 KiB to 16 MiB, or "
        "timed as replicas pay it (see the notes); "
        "transfer_latency, half the mean of 4 KiB sent there and back "
        "(spec section 1d)",
        "alpha: fitted over batch shares (B0/k, what each of k replicas runs, in step order) unless the entry "
        "says estimated; "
        "beta: derived (see the entry)",
        f"sum of the layers' oct {p.total_oct:.4g} s; a whole-model forward+backward step {p.step:.4g} s "
        f"(ratio {p.total_oct / p.step:.2f}: code between modules is in the step only, and each layer's "
        "forward is a call of its own here)",
        *([f"precision {p.precision}: {MEASURED_AT[p.precision]}"] if p.precision is not None else []),
        *([p.load.describe()] if p.load is not None else []),
        *p.notes,
        *(f"profile again: {why}" for why in p.advice),
    ]
    if p.degrees:
        header.append(
            f"tp {', '.join(map(str, p.degrees))}: one unit of a replica at that degree (spec section 1h), timed in "
            "as many processes, each with one shard of the layer's pairs of linear layers as heterps run shards "
            "them, their all-reduces included; the slowest unit's median; a layer with no pair is its time at 1"
        )
    rows = []
    for i, layer in enumerate(p.layers):
        why = "; ".join(f"{f}: {r}" for f, r in layer.estimated.items())
        rows.append(
            _row(layer, p.resource, f"estimated: {why}" if why else "", {d: p.degrees[d][i] for d in p.degrees})
        )
    fixed = {p.resource: _fixed_of(p)}
    return render(p.model, p.batch_size, rows, header, fixed=fixed, chain=p.chain, precision=p.precision, ties=p.ties)


def _fixed_of(p: Profiled) -> dict[str, float]:
    """Section 1d's fixed costs the profile measured on its type."""
    costs = {"pass_start": p.pass_start}
    if p.all_reduce_latency is not None:
        costs["all_reduce_latency"] = p.all_reduce_latency
    if p.transfer_latency is not None:
        costs["transfer_latency"] = p.transfer_latency
    return costs


def _row(layer: LayerProfile, resource: str, comment: str, degrees: dict[int, LayerProfile] | None = None) -> LayerRow:
    """A profiled layer as a profile row with one ``times`` entry, for ``resource``, and its times and
    one unit's sizes at each tensor-parallel degree of ``degrees``."""
    shards = {d: _entry_of(x) for d, x in (degrees or {}).items()}
    return LayerRow(
        layer.name,
        layer.kind,
        layer.input_size,
        layer.weight_size,
        {resource: dataclasses.replace(_entry_of(layer), comment=comment, tp=shards or None)},
        layer.activation_size,
        layer.sharded,
        layer.input_saved,
        {d: ShardRow(x.weight_size, x.activation_size, x.input_saved, x.cast_size) for d, x in (degrees or {}).items()}
        or None,
        layer.cast_size,
    )


def _entry_of(layer: LayerProfile) -> Entry:
    return Entry(layer.oct, layer.odt, layer.alpha, layer.beta, "", layer.update, forward=layer.forward)


def estimated_text(e: Estimated) -> str:
    """The profile file of an estimate: every entry says it is one, and how it was found."""
    header = _estimated_header(e)
    rows = []
    for i, (layer, x) in enumerate(zip(e.layers, e.estimates)):
        how = (
            f"estimated: on {e.device}, {x.work.flops:.3g} flops"
            + (f" at {x.peak} x{x.efficiency:.2g}" if x.work.flops else "")
            + f", {x.work.bytes:.3g} bytes, {x.work.kernels} operators"
            + (" (calibrated)" if e.calibrated_on else "")
            + (
                f"; no FLOP formula for {', '.join(x.work.unpriced)}, "
                f"priced by bytes alone ({x.unpriced_s * 1e3:.3g} ms)"
                if x.work.unpriced
                else ""
            )
        )
        shards = "; ".join(
            f"tp {d}: "
            + (
                f"{s[i].pairs} pair{'s' if s[i].pairs > 1 else ''} split, {s[i].reduced:.3g} bytes all-reduced "
                f"in {s[i].reduce_s * 1e3:.3g} ms"
                if s[i].pairs
                else "no pair to split, whole on every unit"
            )
            for d, s in e.sharded.items()
        )
        rows.append(
            _row(layer, e.resource, how + (f"; {shards}" if shards else ""), {d: e.degrees[d][i] for d in e.degrees})
        )
    return render(e.model, e.batch_size, rows, header, precision=e.precision, chain=e.chain, ties=e.ties)


def _estimated_header(e: Estimated) -> list[str]:
    """The estimate's header lines: the device's figures, the formulas each field was priced by, the
    calibration and the tensor-parallel degrees, and the estimate's own notes."""
    spec = e.spec
    peaks = ", ".join(
        f"{getattr(spec.tflops, p):g} {p}" for p in ("fp32", "tf32", "fp16", "bf16") if getattr(spec.tflops, p)
    )
    reached = (
        ", ".join(f"{p} {v:g}" for p, v in spec.matmul_efficiency.model_dump(exclude_none=True).items())
        if spec.matmul_efficiency is not None
        else ""
    )
    header = [
        f"estimated by heterps profile: model {e.model} as resource type {e.resource!r} on {e.device} "
        f"({spec.title}), NOT measured: every operator of each layer counted on fake tensors and priced on "
        f"the device, device catalogue {e.catalogue}",
        f"{e.device}: {peaks} TFLOP/s peak, {spec.memory_gbps:g} GB/s memory, {spec.memory_gb:g} GB, "
        f"{spec.network_gbps:g} Gbit/s network, {spec.launch_us:g} us per operator at least"
        + (f"; large products reach {reached} of the peak" if reached else ""),
        f"precision {e.precision}: {PRECISION_SAID[e.precision]}",
        "kernel = max(flops / (peak x efficiency x shape), bytes / (bandwidth x memory efficiency)) per operator, "
        "shape = m/(m+D) n/(n+D) k/(k+D) of a product; oct = "
        + (
            "the sum of each operator's kernel + its launch floor"
            if spec.processor == "cpu"
            else "the longer of the kernels back to back and the host's layer_us + a launch floor per operator"
        )
        + f"; the forward and backward of batch {e.batch_size}"
        + (f", the last layer's with the {e.loss} loss" if e.loss != "none" else ""),
        "odt: gradient all-reduce bytes per batch (as big as the weights) / the device's network bandwidth",
        "alpha: the kind's default (not measurable without the devices); beta: 0 (odt does not shrink with replicas)",
        f"update: the {e.optimizer} step and the gradients' reset, {UPDATE_PASSES[e.optimizer]} x weight bytes / "
        f"(bandwidth x memory efficiency) + {UPDATE_KERNELS[e.optimizer]} x launch floor",
        "forward: the forward pass's own operators, priced the same (spec section 1g)",
        f"sum of the layers' oct {e.total_oct:.4g} s",
    ]
    if e.calibrated_on:
        header.append(f"calibrated on {e.calibrated_on}: measured / estimated time per kind, {e.factors}")
    if e.degrees:
        header.append(
            f"tp {', '.join(map(str, e.degrees))}: one unit of a replica at that degree (spec section 1h): one shard "
            "of the layer's pairs of linear layers (as heterps run shards them), priced the same, the rest "
            "whole, plus a ring all-reduce of each pair's output (forward) and input gradient (backward) among the "
            f"units, 2 (d-1)/d x bytes over the {spec.link_gbps:g} Gbit/s in-node link + a launch floor each; "
            "a layer with no such pair runs whole on every unit (its times and sizes as at tp 1)"
        )
    header += e.notes
    return header


MEASURED_AT = {  # heterps profile --precision (profiling.precision)
    "fp32": "timed as PyTorch trains by default, fp32 products (convolutions with TF32 on a GPU)",
    "tf32": "timed with TF32 products and convolutions",
    "bf16": "every forward timed under bf16 autocast; weights, their gradients and the optimiser's step in fp32",
    "fp16": "every forward timed under fp16 autocast; weights, their gradients and the optimiser's step in fp32",
}
PRECISION_SAID = {
    "fp32": "PyTorch's default, fp32 products at the fp32 peak, fp32 convolutions at TF32 where the device has it",
    "tf32": "fp32 tensors, products and convolutions at the TF32 peak (torch.backends.cuda.matmul.allow_tf32)",
    "bf16": "autocast to bfloat16: products in bf16 at its peak, what autocast keeps in fp32 in fp32",
    "fp16": "autocast to float16: products in fp16 at its peak, what autocast keeps in fp32 in fp32",
}


def cluster_snippet(e: Estimated) -> str:
    """The cluster file's entry for the estimated type: memory and network from the catalogue."""
    return "\n".join(
        [
            f"  {e.resource}:  # {e.spec.title}, from the device catalogue",
            "    price: ...  # USD per device-hour: yours to fill in",
            "    limit: ...  # devices available",
            f"    memory_gb: {e.spec.memory_gb:g}",
            f"    bandwidth_gbps: {e.spec.network_gbps:g}",
        ]
    )


def merge_profiles(paths: list[str], said: list[str] | None = None) -> str:
    """One profile from profiles of the same model measured as different types, at different batch
    sizes, or both (docs/spec.md section 2): its ``batch_size`` the largest size every type was
    measured at, each other size under the entry's ``batches``."""
    if len(paths) < 2:
        raise InputError(None, None, "merge", "give at least two profiles to merge")
    loaded = [load_profile(path) for path in paths]
    (first, fdoc) = loaded[0]
    text_lines = {path: doc.text.splitlines() for path, (_, doc) in zip(paths, loaded)}
    # activation_size, input_saved and sharded come from the first profile: they describe the model.
    rows = [
        LayerRow(
            layer.name,
            layer.type,
            layer.input_size,
            layer.weight_size,
            {},
            layer.activation_size,
            layer.sharded,
            layer.input_saved,
            cast_size=layer.cast_size,
        )
        for layer in first.layers
    ]
    sizes_by: dict[tuple[int, int], str] = {}  # (layer, degree) -> the profile that gave its sizes
    said_precision: tuple[str, str] | None = None  # the first precision a profile states, and its file
    sized: list[dict[str, dict[int, Entry]]] = [{} for _ in rows]  # per layer: type -> size -> times
    owner: dict[tuple[str, int], str] = {}
    # ``said``: what the header calls each source, where they are no files of the user's (heterps
    # profile --batch-sizes); the user's files are named by their names, under one "merged" line
    header = [] if said else [f"merged by heterps profile merge from {', '.join(paths)}"]
    for (prof, doc), path, name in zip(loaded, paths, said or [Path(path).name for path in paths]):
        header += [
            f"{name}: {line[2:]}"
            for line in text_lines[path]
            if line.startswith("# ") and not line.startswith("# merged by")
        ]
        _same_model(prof, doc, first, paths[0])
        said_precision = _one_precision(prof, doc, path, said_precision)
        _take_shard_sizes(prof, doc, rows, sizes_by, path)
        _take_times(prof, doc, rows, sized, owner, path, text_lines[path], paths[0])
    batch_size = _common_size(sized, owner)
    fixed = _fixed_costs([prof for prof, _ in loaded], batch_size)
    _nest_sizes(rows, sized, owner, batch_size)
    given = first.model_fields_set  # a default stays unwritten, so plain merges read as before
    return render(
        first.model,
        batch_size,
        rows,
        header,
        state_factor=first.state_factor if "state_factor" in given else None,
        job={k: v for k, v in vars(first.job).items() if v is not None} if "job" in given else None,
        precision=said_precision[0] if said_precision else None,
        fixed=fixed or None,
        chain=_chain_of([prof for prof, _ in loaded]),
        ties=_ties_of(loaded, paths),
    )


def _ties_of(loaded: list[tuple[Profile, Document]], paths: list[str]) -> list[Tie]:
    """Section 1j: the ties the profiles record, which describe the model: the same in every profile that
    records any (one written by hand may record none)."""
    said = [(prof, doc, path) for (prof, doc), path in zip(loaded, paths) if prof.ties]
    if not said:
        return []
    first, _, first_path = said[0]

    def key(prof: Profile) -> list:
        return sorted((t.tensor, t.kind, t.bytes, tuple(t.layers)) for t in prof.ties or [])

    for prof, doc, _ in said[1:]:
        if key(prof) != key(first):
            raise doc.error(
                ("ties",), f"the ties differ from those of {first_path}: profiles of one model record the same"
            )
    index = {layer.name: i for i, layer in enumerate(first.layers)}
    return [Tie(t.tensor, t.kind, t.bytes, tuple((index[name], "") for name in t.layers)) for t in first.ties or []]


def _one_precision(prof: Profile, doc, path: str, said: tuple[str, str] | None) -> tuple[str, str] | None:
    """The first precision a profile states and its file, once ``prof`` is checked against it: a profile
    that states none (a measured one) joins any; two precisions are refused."""
    if prof.precision is None:
        return said
    said = said or (prof.precision, path)
    if prof.precision != said[0]:
        raise doc.error(
            ("precision",),
            f"precision {prof.precision!r} differs from {said[0]!r} in {said[1]}: "
            "times at two precisions are two models (estimate both at one --precision, then merge)",
        )
    return said


def _fixed_costs(profiles: list[Profile], batch_size: int) -> dict[str, dict[str, float]]:
    """Each type's fixed costs as the first profile giving them says, a profile at ``batch_size`` first."""
    fixed: dict[str, dict[str, float]] = {}
    for prof in sorted(profiles, key=lambda prof: prof.batch_size != batch_size):  # that size's first
        for t, costs in (prof.fixed or {}).items():
            fixed.setdefault(t, {k: v for k, v in dict(costs).items() if k in costs.model_fields_set})
    return fixed


def _nest_sizes(rows: list[LayerRow], sized: list[dict[str, dict[int, Entry]]], owner: dict, batch_size: int) -> None:
    """Each layer's entry per type at ``batch_size``, with every other size under its ``batches`` (and its
    tensor-parallel degrees' under theirs): a degree must be at ``batch_size`` too."""
    for i, (row, times) in enumerate(zip(rows, sized)):
        for t, by_size in times.items():
            main = by_size.pop(batch_size)
            main.batches = dict(sorted(by_size.items())) or None
            for size, other in by_size.items():
                for d, shard in (other.tp or {}).items():
                    if d not in (main.tp or {}):
                        raise InputError(
                            owner[(t, size)],
                            None,
                            f"layers[{i}].times.{t}.tp.{d}",
                            f"type {t!r} has times at tp {d} at batch {size} but not at batch {batch_size}, the "
                            "size every type shares: estimate or measure that degree at it too",
                        )
                    assert main.tp is not None
                    main.tp[d].batches = (main.tp[d].batches or {}) | {size: shard}
            row.times[t] = main


def _chain_of(profiles: list[Profile]) -> bool | None:
    """Section 2: the merged profile's chain: false where any says false (it is one model), true where
    every one says true, else unknown."""
    said = [p.chain for p in profiles]
    return False if False in said else (True if all(said) else None)


def _take_shard_sizes(
    prof: Profile, doc: Document, rows: list[LayerRow], sizes_by: dict[tuple[int, int], str], path: str
) -> None:
    """Each layer's one-unit sizes at each tensor-parallel degree of ``prof`` (section 1h) into its row:
    the first profile to give a degree gives them, and another that gives it must hold the same weights
    (its activations per sample may differ, measured at another batch, as at tp 1)."""
    for i, (layer, row) in enumerate(zip(prof.layers, rows)):
        for d, x in (layer.tp or {}).items():
            taken = ShardRow(x.weight_size, x.activation_size, x.input_saved, x.cast_size)
            given = (row.tp or {}).get(d)
            if given is None:
                row.tp = (row.tp or {}) | {d: taken}
                sizes_by[(i, d)] = path
            elif not _close(taken.weight_size, given.weight_size):  # activations per sample move with the batch
                raise doc.error(
                    ("layers", i, "tp", d),
                    f"layer {layer.name!r} at tp {d} holds other sizes than in {sizes_by[(i, d)]}: not the same "
                    "sharding of the model",
                )


def _common_size(sized: list[dict[str, dict[int, Entry]]], owner: dict[tuple[str, int], str]) -> int:
    """The largest batch size at which every layer was measured on every type it has."""
    common = set.intersection(*(set(by_size) for times in sized for by_size in times.values()))
    if not common:
        seen = sorted({(t, b) for t, b in owner})
        raise InputError(
            None,
            None,
            "merge",
            "no batch size is measured for every layer on every type ("
            + ", ".join(f"{t} at {b}" for t, b in seen)
            + "), and a profile's times at its batch_size need one: measure each type at one size in common too",
        )
    return max(common)


def _same_model(prof: Profile, doc: Document, first: Profile, first_path: str) -> None:
    """``prof`` describes the model ``first`` does: its name, job, and layers' names and order."""
    if prof.model != first.model:
        raise doc.error(
            ("model",),
            f"model {prof.model!r} is not {first.model!r} of {first_path}: "
            "only profiles of the same model can be merged",
        )
    for field in ("state_factor", "job"):  # the model's and the job's: all must say the same
        if getattr(prof, field) != getattr(first, field):
            raise doc.error(
                (field,),
                f"{field} {_said(getattr(prof, field))} differs from {_said(getattr(first, field))} in "
                f"{first_path}: profiles of one model must agree on it (set it alike in each, then merge)",
            )
    if [layer.name for layer in prof.layers] != [layer.name for layer in first.layers]:
        raise doc.error(
            ("layers",),
            f"the layers ({len(prof.layers)}) differ from those of {first_path} "
            f"({len(first.layers)}) in number, names or order: not the same model",
        )


def _take_times(
    prof: Profile,
    doc: Document,
    rows: list[LayerRow],
    sized: list[dict[str, dict[int, Entry]]],
    owner: dict[tuple[str, int], str],
    path: str,
    lines: list[str],
    first_path: str,
) -> None:
    """Each layer's entries of ``prof``, at each of its sizes, into ``sized``, with their estimate
    comments; a type measured twice at one size, or a layer of another type or size, is an error."""
    for i, (layer, row) in enumerate(zip(prof.layers, rows)):
        if (
            layer.type != row.kind
            or not _close(layer.input_size, row.input_size)
            or not _close(layer.weight_size, row.weight_size)
        ):
            raise doc.error(
                ("layers", i),
                f"layer {layer.name!r} has another type or size than in {first_path}: not the same model",
            )
        for t, e in layer.times.items():
            found = re.search(r"#\s*(estimated:.*)$", lines[doc.line(("layers", i, "times", t)) - 1])
            comment = found.group(1).strip() if found else ""
            for size in (prof.batch_size, *(e.batches or {})):
                if size in sized[i].get(t, {}):
                    raise doc.error(
                        ("layers", i, "times", t),
                        f"type {t!r} at batch {size} is measured in {owner[(t, size)]} too: merge one profile per "
                        "resource type and batch size",
                    )
                at = e.at(size, prof.batch_size)
                assert at is not None
                alpha, beta = layer.fractions(t, at)
                shards = {}
                for d, shard in (e.tp or {}).items():
                    if (on := shard.at(size, prof.batch_size)) is not None:
                        # section 1h: a degree's alpha and beta fall back on the entry's at tp 1
                        shard_alpha = on.alpha if on.alpha is not None else shard.alpha
                        shard_beta = on.beta if on.beta is not None else shard.beta
                        shards[d] = Entry(
                            on.oct,
                            on.odt,
                            shard_alpha if shard_alpha is not None else alpha,
                            shard_beta if shard_beta is not None else beta,
                            update=shard.update,
                            forward=on.forward,
                        )
                sized[i].setdefault(t, {})[size] = Entry(
                    at.oct, at.odt, alpha, beta, comment, e.update, forward=at.forward, tp=shards or None
                )
                owner[(t, size)] = path


def _said(value) -> str:
    return repr(value.model_dump(exclude_none=True)) if hasattr(value, "model_dump") else repr(value)


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)
