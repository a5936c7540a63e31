"""Human output of plans: one plan (``heterps plan``), several side by side (``compare``), and the
frontier. No logic, only presentation; what validate, check and diff show is in render_files and
render_ci."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from heterps_cli.figures import count, duration, number, plural, usd
from heterps_cli.formats import Plan
from heterps_cli.objective import Objective
from heterps_cli.untrusted import printable

# User strings (model, layer and type names, paths) are data, never markup: a layer named "[/]"
# must print as itself. They reach rich only through Text() or escape().
NAME_WIDTH = 60  # a name longer than this is cut for the screen (files keep it whole)


def clip(text: str) -> str:
    """A user string made printable and cut to NAME_WIDTH, for Text() or after escape()."""
    text = printable(text)
    return text if len(text) <= NAME_WIDTH else text[: NAME_WIDTH - 1] + "…"


def bold(text: str) -> Text:
    return Text(clip(text), style="bold")


def _on(stage) -> str:
    """A stage's type, with its tensor-parallel degree (section 1h) and ↻ where it recomputes (1g), and
    the types that join it (section 1i)."""
    return clip(stage.resource) + stage.way + "".join(f" + {clip(j.resource)}{j.way}" for j in stage.joined or ())


def _replicas(stage) -> str:
    """A stage's replicas, and each joined type's with the samples each part trains (section 1i)."""
    if not stage.joined:
        return count(stage.replicas)
    parts = [(stage.replicas, stage.samples), *((j.replicas, j.samples) for j in stage.joined)]
    return " + ".join(f"{count(k)} ({count(n)})" for k, n in parts)


def _layers(stage) -> Text:
    """'2-7 fc1 … relu3': the index range and the first and last layer names."""
    names = [clip(n) for n in stage.layers]
    if len(names) == 1:
        return Text(f"{stage.first} {names[0]}")
    joiner = ", " if len(names) == 2 else " … "
    return Text(f"{stage.first}-{stage.last} {names[0]}{joiner}{names[-1]}")


def ranges(indices: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8'."""
    out, start = [], None
    for a, b in zip(indices, indices[1:] + [None]):
        start = a if start is None else start
        if b != a + 1:
            out.append(f"{start}" if start == a else f"{start}-{a}")
            start = None
    return ", ".join(out) or "none"


def plan_view(plan: Plan, width: int = 120) -> Group:
    table, summary = _stages_table(plan, width), _plan_summary(plan)
    hardware = _hardware_view(plan)
    extra = [hardware] if hardware is not None else []
    return Group(table, *extra, summary, *([what_if_view(plan)] if plan.what_if is not None else []))


def _stages_table(plan: Plan, width: int) -> Table:
    """A row per stage, the bottleneck marked; the layer names give way to the terminal's width."""
    title = Text.assemble(
        bold(plan.model), " on ", bold(plan.cluster), f" · objective {plan.objective} · scheduler {plan.scheduler}"
    )
    table = Table(
        title=title,
        title_justify="left",
        header_style="bold",
        box=box.SIMPLE_HEAD,
        caption="◀ the bottleneck stage, which sets the throughput",
        caption_justify="left",
    )
    # Numbers keep their width; only the layer names give way on a narrow terminal.
    numeric: dict[str, Any] = dict(justify="right", no_wrap=True)
    table.add_column("stage", **numeric)
    # The only column that gives way: cut to one line at the terminal's width (the file holds every name).
    table.add_column("layers", no_wrap=True, overflow="ellipsis", max_width=max(12, min(36, width - 64)))
    table.add_column("on", no_wrap=True)
    table.add_column("replicas", **numeric)
    piped = bool(plan.micro_batches)  # section 1d: per micro-batch compute, per step all-reduce and step
    table.add_column("µbatch s" if piped else "CT s", **numeric)
    table.add_column("sync s" if piped else "DT s", **numeric)
    if piped:
        table.add_column("step s", **numeric)
    table.add_column("samples/s", **numeric)
    for i, s in enumerate(plan.stages):
        bottleneck = i == plan.bottleneck
        step = [f"{s.step_s:.3g}"] if piped and s.step_s is not None else []
        table.add_row(
            str(i),
            _layers(s),
            Text(_on(s)),
            _replicas(s),
            f"{s.compute_s + ((s.transfer_s or 0.0) if piped else 0.0):.3g}",
            f"{s.comm_s:.3g}",
            *step,
            count(s.throughput) + (" ◀" if bottleneck else "  "),
            style="bold yellow" if bottleneck else None,
        )
    if any(s.recompute for s in plan.stages):
        table.caption = f"{table.caption}; ↻ recomputes its activations in the backward pass (docs/spec.md section 1g)"
    if any(s.tp for s in plan.stages):
        table.caption = f"{table.caption}; tpN: each replica is N units of one node, tensor-parallel (section 1h)"
    return table


def _plan_summary(plan: Plan) -> Table:
    """What the plan reaches and costs, how it was solved, and what it assumes."""
    summary = Table.grid(padding=(0, 2))
    summary.add_column(style="bold")
    summary.add_column()
    need = f" (required ≥ {count(plan.min_throughput)})" if plan.min_throughput > 0 else ""
    caveats = figure_caveats(plan)
    summary.add_row(
        "throughput",
        Text.assemble(f"{count(plan.throughput, 1)} samples/s{need}", (f", if {caveats}" if caveats else "", "yellow")),
    )
    epochs = f"{number(plan.epochs)} epoch{'s' if plan.epochs != 1 else ''}"
    exact_s = f" ({count(plan.time_s)} s)" if plan.time_s >= 120 else ""  # shorter ones are already in seconds
    summary.add_row("training time", f"{duration(plan.time_s)}{exact_s} for {epochs} × {count(plan.samples)} samples")
    summary.add_row("resources", Text(", ".join(_units(plan, t) for t in plan.resources)))
    if plan.rental is not None:
        summary.add_row("rents", Text(rental_line(plan)))
    budget = f" (budget {usd(plan.max_cost)})" if plan.max_cost is not None else ""
    summary.add_row("cost", Text.assemble((usd(plan.cost_usd), "bold green"), budget))
    summary.add_row("schedule", Text(schedule_line(plan), style="" if plan.micro_batches else "yellow"))
    if plan.precision is not None:
        summary.add_row("precision", Text(f"{plan.precision}: the profile's times assume it; train at it"))
    verdict = "optimal (certified by the exact solver)" if plan.optimal else f"{plan.scheduler}, not proved optimal"
    if plan.gap is not None:
        verdict = f"{plan.scheduler}, not proved optimal: {certificate(plan)}"
    scored = f" · {plan.evaluations:,} schedules scored" if plan.evaluations else ""
    summary.add_row("solved in", f"{plan.solve_s:.2f} s · {verdict}{scored}")
    for i, why in enumerate(plan.explanation or ()):
        summary.add_row("why" if i == 0 else "", Text(why))
    for note in plan.notes:
        summary.add_row("note", Text(note))
    assumed = assumptions(plan)
    if assumed:
        summary.add_row("assumes", Text(assumed, style="yellow"))
    return summary


def certificate(plan: Plan) -> str:
    """What a plan's proven ``gap`` says, in words a user can act on: the bound itself, and how far the plan
    may be from the optimum where that is a useful figure (a gap past half the plan's figure says little
    of where the optimum lies between the two)."""
    gap = float(plan.gap or 0.0)
    if plan.objective == "time":
        bound = f"no plan is faster than {count(plan.throughput / (1 - gap), 1)} samples/s" if gap < 1 else ""
    else:
        bound = f"no plan costs less than {usd(plan.cost_usd / (1 + gap))}"
    if not bound:
        return "no useful bound on the optimum was proven"
    if gap <= 0.5:
        return f"{bound}, so it is within {100 * gap:.2f}% of the optimum"
    return f"{bound} (proven): a weak bound, the optimum lies between that and this plan"


def what_if_view(plan: Plan) -> Group:
    """``--explain``: one node more or fewer of each kind (section 1e), or one unit more or fewer of
    each type's limit, against the plan."""
    title = (
        "what if the rental had one node more or fewer (the fastest plan on it, every node paid for)"
        if plan.rental is not None
        else "what if a type's limit were one higher or lower (the optimum then, by the exact solver)"
    )
    table = Table(
        title=title,
        title_justify="left",
        header_style="bold",
        box=box.SIMPLE_HEAD,
    )
    first = "node kind" if plan.rental is not None else "type"
    for name in (first, "change", "samples/s", "faster", "cost", "dearer", "meets the job"):
        table.add_column(name, justify="left" if name in (first, "change", "meets the job") else "right")
    for w in plan.what_if or ():
        x, cost = w.throughput, w.cost_usd
        table.add_row(
            Text(clip(w.kind)),
            ("one more" if w.change > 0 else "one fewer")
            + (f" (limit {count(w.limit)})" if w.limit is not None else ""),
            "no plan fits" if x is None else count(x),
            "" if x is None else f"{100 * (x / plan.throughput - 1):+.1f}%",
            "" if cost is None else usd(cost),
            "" if cost is None or not plan.cost_usd else f"{100 * (cost / plan.cost_usd - 1):+.1f}%",
            "yes" if w.meets else "no",
        )
    return Group(table, *(Text(line, style="yellow") for line in _what_if_reasons(plan)))


def _what_if_reasons(plan: Plan) -> list[str]:
    """Why one node more would give a slower plan, which reads as wrong: on one node a plan's stages and
    all-reduces use the node's links, on two they cross the network (section 1e)."""
    slower = [w.kind for w in plan.what_if or () if w.change > 0 and w.throughput and w.throughput < plan.throughput]
    if not slower or plan.rental is None:
        return []
    network = plan.bandwidth_gbps or {}
    pairs = [(t, g, network.get(t)) for t, g in (plan.link_gbps or {}).items()]
    where = ", ".join(f"{clip(t)}: {number(g)} Gbit/s there, {number(n)} over the network" for t, g, n in pairs if n)
    where = f" ({where})" if where else ""
    alone = sum(plan.rental.values()) == 1
    return [
        f"why one more {', '.join(clip(k) for k in slower)} is slower: "
        + (
            f"on one node the stages pass activations and all-reduce over the node's links{where}; on two they "
            "cross the network"
            if alone
            else "a type spread over more nodes all-reduces over the network, not one node's links"
        )
        + ", and a rental is paid whole, so its fastest plan is slower than this one"
    ]


def rental_line(plan: Plan) -> str:
    """Section 1e: the nodes a plan rents, what they cost an hour, and the units it leaves idle."""
    assert plan.rental is not None and plan.rate_usd_per_hour is not None
    nodes = ", ".join(f"{count(n)} × {clip(kind)}" for kind, n in plan.rental.items())
    idle = {t: n for t, n in (plan.idle_units or {}).items() if n}
    left = f"; idle: {', '.join(f'{count(n)} {clip(t)}' for t, n in idle.items())}" if idle else ""
    links = ""
    if plan.link_gbps:
        over = ", ".join(f"{clip(t)} {number(g)} Gbit/s" for t, g in plan.link_gbps.items())
        what = "all-reduce and stage transfers" if sum(plan.rental.values()) == 1 else "all-reduce"
        links = f"; {what} over the node's links: {over}"
    return f"{nodes} ({usd(plan.rate_usd_per_hour)}/h, billed whole){left}{links}"


def schedule_line(plan: Plan) -> str:
    """How a step runs (docs/spec.md section 1d), or that the plan has no pipeline schedule."""
    if not plan.micro_batches:
        return "none (no job.global_batch): no fill or drain, sync overlaps compute"
    M, B0 = plan.micro_batches, plan.batch_size
    return f"1F1B, {count(M)} micro-batch{'es' if M != 1 else ''} of {count(B0)} per step, then sync and update"


def figure_caveats(plan: Plan) -> str:
    """What the throughput takes for granted that a run may not give, said beside it (the schedule and
    assumes lines say why): without a pipeline schedule (no global batch), that the replicas' gradient
    sync overlaps compute; where the cluster gives no bandwidth, that stage-boundary transfers' bytes are free
    (their latency is charged where the profile gives one: section 1d's transfer_latency)."""
    parts = []
    if not plan.micro_batches and any(s.replicas > 1 for s in plan.stages):
        parts.append("sync overlaps compute")
    if _free_transfer(plan):
        parts.append("transfers' bytes are free")
    return " and ".join(parts)


def _free_transfer(plan: Plan) -> list[str]:
    """The types with a stage boundary whose transfer is free: the cluster gives them no bandwidth."""
    edges = [s.resource for s in plan.stages[1:]] + [s.resource for s in plan.stages[:-1]]
    return [t for t in dict.fromkeys(edges) if (plan.bandwidth_gbps or {}).get(t) is None]


def assumptions(plan: Plan) -> str:
    """What the plan's figures leave out because the cluster does not say: free transfer across a
    stage boundary on a type with no ``bandwidth_gbps``, unchecked memory on one with no ``memory_gb``."""
    memory = plan.memory_gb or {}
    free = _free_transfer(plan)
    used = [t for t, n in plan.resources.items() if n]
    unchecked = [t for t in used if memory.get(t) is None]
    parts = []
    if free:
        parts.append(
            f"activations' bytes cross stage boundaries for free on {', '.join(map(clip, free))} (no bandwidth_gbps)"
        )
    if unchecked:
        parts.append(f"memory unchecked on {', '.join(map(clip, unchecked))} (no memory_gb)")
    return "; ".join(parts)


def _gb(x: float) -> str:
    return "<0.01" if 0 < x < 0.01 else f"{x:,.3g}" if x < 1000 else count(x)


def _hardware_view(plan: Plan) -> Table | None:
    """Section 1b per stage, when the cluster gives memory or bandwidth: what each replica holds
    against its unit's memory, and the stage-boundary transfer inside DT."""
    units_gb = plan.memory_gb or {}
    memory = any(v is not None for v in units_gb.values())
    transfer = any(v is not None for v in (plan.bandwidth_gbps or {}).values())
    if not (memory or transfer):
        return None  # the paper's model: nothing to show
    numeric: dict[str, Any] = dict(justify="right", no_wrap=True)
    table = Table(
        box=box.SIMPLE_HEAD, header_style="bold", title="memory and stage-boundary transfer", title_justify="left"
    )
    table.add_column("stage", **numeric)
    table.add_column("on", no_wrap=True)
    if memory:
        table.add_column("GB per unit" if any(s.tp for s in plan.stages) else "GB per replica", **numeric)
        table.add_column("of unit GB", **numeric)
        table.add_column("used", **numeric)
    if transfer:
        table.add_column("transfer s", **numeric)
        table.add_column("of µbatch" if plan.micro_batches else "of DT", **numeric)
    for i, s in enumerate(plan.stages):
        row: list[str | Text] = [str(i), Text(_on(s))]
        if memory:
            of, held = units_gb.get(s.resource), s.memory_gb or 0.0
            row += [
                _gb(held),
                "no limit" if of is None else number(of),
                "" if of is None else f"{100 * held / of:.0f}%",
            ]
        if transfer:
            moved = s.transfer_s or 0.0
            whole = s.compute_s + moved if plan.micro_batches else s.comm_s  # section 1d: waited for
            row += [f"{moved:.3g}", f"{100 * moved / whole:.0f}%" if whole > 0 else "—"]
        table.add_row(*row)
    return table


def _units(plan: Plan, t: str) -> str:
    """'cpu 35 of 480 CPU cores': the type, units used of its limit, and the cluster's unit label."""
    label = plan.units.get(t, t)
    used, limit = plan.resources[t], (plan.limits or plan.resources)[t]  # a plan heterps makes has limits
    shown = f"{clip(t)} {count(used)} of {count(limit)}"
    if label.lower() == t.lower():
        return shown
    return f"{shown} {clip(label) if limit == 1 or label.endswith('s') else clip(label) + 's'}"


def print_plan(console: Console, plan: Plan) -> None:
    console.print(plan_view(plan, console.width))


def compare_view(entries, objective: Objective, width: int = 120) -> Group:
    """One row per scheduler: feasible, cost, throughput, resources, evaluations, seconds, gap.

    Fits 80 columns: one space between columns, and the legend under the table."""
    table = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1))
    numeric: dict[str, Any] = dict(justify="right", no_wrap=True)
    table.add_column("scheduler", no_wrap=True)
    table.add_column("ok", no_wrap=True)
    table.add_column("cost $", **numeric)
    table.add_column("samples/s", **numeric)
    table.add_column("resources", no_wrap=True, overflow="ellipsis", max_width=max(9, width - 67))
    table.add_column("evals", **numeric)
    table.add_column("solve s", **numeric)
    table.add_column("gap", **numeric)
    failures = []
    for e in entries:
        p = e.plan
        if p is None:
            table.add_row(e.scheduler, "[red]no[/]", "—", "—", "—", "—", f"{e.solve_s:.2f}", "—")
            failures.append(Text(f"{e.scheduler}: ", style="bold") + Text(e.failure or ""))
            continue
        gap = "" if e.gap is None else f"{100 * e.gap:.2f}%"
        cut = "*" if p.interrupted else ""
        table.add_row(
            e.scheduler + cut,
            "yes",
            usd(p.cost_usd).lstrip("$"),
            count(p.throughput),
            Text(", ".join(f"{clip(t)} {count(n)}" for t, n in p.resources.items() if n)),
            "—" if p.evaluations is None else count(p.evaluations),
            f"{e.solve_s:.2f}",
            gap,
            style="bold green" if e.gap is not None and e.gap <= 1e-9 else None,
        )
    legend = []
    if any(e.gap is not None for e in entries):
        what = "lost throughput" if objective is Objective.TIME else "extra cost"
        legend.append(Text(f"gap: {what} relative to the exact optimum", style="dim"))
        legend.append(Text("evals: schedules scored by the cost model", style="dim"))
    if any(e.plan is not None and e.plan.interrupted for e in entries):
        legend.append(Text("* interrupted (Ctrl-C): the best plan found before it", style="yellow"))
    return Group(table, *legend, *failures)


STAGES = 6  # heterps frontier's table cuts a longer layout (--json and --out give it whole)


def frontier_view(frontier, *, thinned_by_default: bool, width: int | None = 120) -> Group:
    """One row per frontier plan, cheapest first, with what each costs and gains against the cheapest.

    ``thinned_by_default``: the table shows fewer plans than the frontier has because
    no ``--points`` was given, which the footer says. ``width``: the terminal's, which every row fits;
    None (a file or a pipe, read later or by a program) cuts nothing."""
    p = frontier.problem
    title = Text.assemble(
        bold(p.model),
        " on ",
        bold(p.cluster),
        f" · cost-throughput frontier · {plural(frontier.size, 'Pareto-optimal plan')}",
    )
    table = Table(title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    numeric: dict[str, Any] = dict(justify="right", no_wrap=True)
    figures = ("#", "samples/s", "faster", "time", "cost", "dearer")
    base = frontier.plans[0] if frontier.positions[0] == 0 else None
    rows = _frontier_rows(frontier, base)
    for name in figures:
        table.add_column(name, min_width=len(name), **numeric)
    # One line per plan at any width (pipes and CI logs are 80 columns): the figures whole, the two
    # text columns cut to what they leave, never wrapped; the stage count leads its cell so a cut
    # keeps it. --json and --out hold every plan whole.
    widest = [max(len(name), *(len(r[1][i]) for r in rows)) for i, name in enumerate(figures)]
    columns = len(figures) + 2
    if width is None:
        resources_width = stages_width = None
    else:
        spare = width - sum(widest) - (3 * columns - 1)  # padding and a separator between columns, one edge each
        resources_width = max(7, min(18, spare // 3))
        stages_width = max(9, spare - resources_width)
    table.add_column("resources", no_wrap=True, overflow="ellipsis", max_width=resources_width)
    table.add_column("stages", no_wrap=True, overflow="ellipsis", max_width=stages_width)
    for knee, shown, words, stages in rows:
        table.add_row(*shown, Text(words), Text(stages), style="bold" if knee else None)
    return Group(table, *_frontier_notes(frontier, base is not None, thinned_by_default))


def _frontier_rows(frontier, base) -> list[tuple[bool, list[str], str, str]]:
    """Each plan's row: whether it is the knee, its figures, its resources and its stages."""
    from heterps_cli.frontier import layout

    rows = []
    for position, plan in zip(frontier.positions, frontier.plans):
        knee = position == frontier.knee
        faster = dearer = "—"
        if base is not None and position > 0:
            faster = f"+{100 * (plan.throughput / base.throughput - 1):.1f}%"
            dearer = f"+{100 * (plan.cost_usd / base.cost_usd - 1):.1f}%" if base.cost_usd > 0 else "—"
        shown = [
            f"{position + 1}{' ◆' if knee else ''}",
            count(plan.throughput, 1 if plan.throughput < 1000 else 0),
            faster,
            duration(plan.time_s),
            usd(plan.cost_usd),
            dearer,
        ]
        words = ", ".join(f"{clip(t)} {count(n)}" for t, n in plan.resources.items() if n)
        rows.append((knee, shown, words, f"{len(plan.stages)}: {layout(plan, STAGES)}"))
    return rows


def _frontier_notes(frontier, against_cheapest: bool, thinned_by_default: bool) -> list[Text]:
    """The lines under the frontier's table: what its columns mean, how much of it is shown, how exact it is."""
    from heterps_cli.frontier import KNEE_RULE

    notes = [Text("faster, dearer: against plan 1, the cheapest", style="dim")] if against_cheapest else []
    if frontier.knee is not None:
        notes.append(Text(f"◆ knee (plan {frontier.knee + 1}): {KNEE_RULE}", style="dim"))
    else:
        notes.append(Text("no knee: fewer than three plans, or cost rises no slower than throughput", style="dim"))
    if thinned_by_default:
        notes.append(
            Text(
                f"showing {len(frontier.plans)} of {frontier.size:,} plans, spread evenly over throughput "
                "(both ends and the knee kept); --points N shows another number, --json or --out DIR all of them",
                style="yellow",
            )
        )
    elif len(frontier.plans) < frontier.size:
        notes.append(Text(f"{len(frontier.plans)} of {frontier.size:,} plans, as --points asked", style="dim"))
    steps = f"{frontier.steps:,} solver steps, {frontier.solve_s:.2f} s"
    within = f"{100 * frontier.resolution:g}%"
    over, plan = (" over one-type stages", "one-type plan") if frontier.climbed is not None else ("", "plan")
    if frontier.resolution > 0:
        said = (
            f"at a resolution of {within}{over}: every {plan} is matched by a row at most {within} slower and "
            f"{within} dearer ({steps}; leave --resolution out for every Pareto-optimal plan)"
        )
    else:
        said = (
            f"exact{over}: each {plan} is the cheapest reaching its throughput, and no throughput between two rows "
            f"costs less than the faster row ({steps})"
        )
    notes.append(Text(said, style="dim"))
    if frontier.climbed is not None:
        notes.append(Text(frontier.climbed, style="yellow"))
    if frontier.cut_at is not None:
        held = f"within {within}" if frontier.resolution > 0 else "exact"
        notes.append(
            Text(
                f"stopped at the time limit: the frontier above is {held} up to {count(frontier.cut_at, 1)} "
                "samples/s; faster plans were not explored (raise --time-limit"
                + (")" if frontier.resolution > 0 else ", or give --resolution 0.05)"),
                style="yellow",
            )
        )
    return notes
