"""PNG pictures (matplotlib): the cost-throughput frontier, and schedulers' plans against it.

Labels never sit on top of each other: points on the curve carry short numbers
and what each number means is written in a caption under the axes.
"""

from __future__ import annotations

import io
import logging
import math
from typing import TYPE_CHECKING

from heterps_cli.figures import count, usd
from heterps_cli.objective import Objective

if TYPE_CHECKING:
    from heterps_cli.compare import Entry
    from heterps_cli.frontier import Frontier
    from heterps_cli.problem import Problem

LABELS = 8  # numbered points on a frontier picture, at most
STAGES = 5  # a layout with more stages is cut in the caption (its lines then fit the axes' width)
MARKERS = "o^sDvP*X<>"


# With HOME unwritable matplotlib makes a temporary cache (and rebuilds its font list) and says so
# on stderr at warning level; the picture is the same, so only its errors are shown. Set before any
# matplotlib module is imported, which happens only in this module's functions.
logging.getLogger("matplotlib").setLevel(logging.ERROR)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a CI machine
    from matplotlib import pyplot as plt

    return plt


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", bbox_inches="tight", pad_inches=0.25)  # grows to hold the caption
    return buffer.getvalue()


def tick_labels(values, money: bool = False) -> list[str]:
    """Labels for one axis's ticks: one scale for all (from the largest: 950, 12k, 3.5M, 2G; money
    in dollars with digit groups up to a million) and the fewest decimals that write every tick as it
    is (``12.5k``, not ``12k``; ``$0.016, $0.018`` rather than ``$0.02`` twice): ticks are round
    numbers, so a few decimals always do."""
    values = [float(v) for v in values]
    top = max((abs(v) for v in values), default=0.0)
    scale, suffix = 1.0, ""
    for size, name in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if top >= size and (not money or size >= 1e6):
            scale, suffix = size, name
            break
    prefix = "$" if money else ""
    fewest = 2 if money and not suffix and top < 10 else 0  # cents at least under $10: "$0.50", not "$0" and "$1"
    for must_be_exact in (True, False):  # ticks off the round numbers (never matplotlib's): just apart
        for decimals in range(fewest, 7):
            labels = [f"{prefix}{v / scale:,.{decimals}f}{suffix}" if v else f"{prefix}0" for v in values]
            exact = all(math.isclose(round(v / scale, decimals), v / scale, rel_tol=1e-9) for v in values)
            if (exact or not must_be_exact) and len(set(labels)) == len(labels):
                return [label.replace(f"{prefix}-", f"-{prefix}") for label in labels]
    return [f"{prefix}{v:.6g}" for v in values]


def _formatter(money: bool):
    """A matplotlib tick formatter over :func:`tick_labels`, which must see all of an axis's ticks at once."""
    from matplotlib.ticker import Formatter

    class Labels(Formatter):
        def format_ticks(self, values):
            return tick_labels(values, money)

        def __call__(self, x, pos=None):
            return tick_labels([x], money)[0]

    return Labels()


def _axes_style(ax) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(7))
    ax.xaxis.set_major_formatter(_formatter(money=False))
    ax.yaxis.set_major_formatter(_formatter(money=True))
    ax.set_xlabel("throughput (samples/s)")
    ax.set_ylabel("cost of the training run (USD)")
    ax.grid(True, linewidth=0.3)


def _curve(ax, frontier: Frontier) -> None:
    """The frontier as a step curve: the least cost of any plan at least this fast."""
    thr = [plan.throughput for plan in frontier.plans]
    cost = [plan.cost_usd for plan in frontier.plans]
    floor = frontier.problem.min_throughput
    if 0 < floor < thr[0]:
        thr, cost = [floor, *thr], [cost[0], *cost]
    ax.step(thr, cost, where="pre", color="#4c72b0", linewidth=1.4, zorder=2, label="frontier (exact)")
    size = 12 if len(frontier.plans) <= 50 else 4
    ax.scatter(
        [p.throughput for p in frontier.plans], [p.cost_usd for p in frontier.plans], s=size, color="#4c72b0", zorder=3
    )


def frontier_png(frontier: Frontier, shown: Frontier | None = None) -> bytes:
    """``frontier`` (whole, not thinned) as a step curve, the knee starred, and up to :data:`LABELS` of the plans in
    ``shown`` (default: an even selection) numbered, with their layouts in the caption."""
    from heterps_cli.frontier import layout, thin

    plt = _pyplot()
    labelled = thin(shown or frontier, LABELS)
    lines = [
        f"{position + 1:>4}{'*' if position == frontier.knee else ' '} {count(plan.throughput, 1):>15} samples/s "
        f"{usd(plan.cost_usd):>10}   {layout(plan, STAGES)}"
        for position, plan in zip(labelled.positions, labelled.plans)
    ]
    if frontier.knee is not None:
        lines.append("   * the knee: farthest below the line from the cheapest to the fastest plan (axes scaled 0..1)")
    fig, ax = plt.subplots(figsize=(9, 5), dpi=110)
    try:
        _curve(ax, frontier)
        for position, plan in zip(labelled.positions, labelled.plans):
            ax.annotate(
                str(position + 1),
                (plan.throughput, plan.cost_usd),
                textcoords="offset points",
                xytext=(-4, 7),
                ha="right",
                fontsize=9,
                fontweight="bold",
            )
        if frontier.knee is not None:
            k = frontier.plans[frontier.knee]  # the whole frontier: positions are indices
            ax.scatter([k.throughput], [k.cost_usd], marker="*", s=220, color="#dd8452", zorder=4, label="knee")
        _axes_style(ax)
        ax.legend(loc="best", fontsize=9)
        p = frontier.problem
        ax.set_title(
            f"{p.model} on {p.cluster}: cost against throughput, {frontier.size:,} Pareto-optimal plans", fontsize=11
        )
        caption = "\n".join(lines)
        ax.text(0, -0.15, caption, transform=ax.transAxes, va="top", ha="left", fontsize=8.5, family="monospace")
        return _png(fig)
    finally:
        plt.close(fig)


def compare_png(problem: Problem, entries: list[Entry], frontier: Frontier | None) -> bytes:
    """Each scheduler's plan as a point on the cost-throughput plane over the exact frontier (when
    there is one), and a small panel with each scheduler's solve time."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    plt = _pyplot()
    found = [e for e in entries if e.plan is not None]
    fig, (ax, side) = plt.subplots(
        1, 2, figsize=(10, 5.4), dpi=110, gridspec_kw={"width_ratios": [3.2, 1], "wspace": 0.35}
    )
    try:
        if frontier is not None:
            _curve(ax, frontier)
        for i, entry in enumerate(found):
            plan = entry.plan
            assert plan is not None
            gap = "" if entry.gap is None else f", gap {100 * entry.gap:.2f}%"
            ax.scatter(
                [plan.throughput],
                [plan.cost_usd],
                marker=MARKERS[i % len(MARKERS)],
                color=f"C{1 + i % 9}",
                s=70,
                zorder=5,
                alpha=0.85,
                label=f"{entry.scheduler}: {usd(plan.cost_usd)}, {count(plan.throughput)} samples/s{gap}",
            )
        _axes_style(ax)
        ax.legend(loc="upper left", bbox_to_anchor=(0, -0.13), fontsize=8.5, frameon=False)  # under: never on a point
        goal = "cheapest plan" if problem.objective is Objective.COST else "fastest plan"
        ax.set_title(f"{problem.model} on {problem.cluster}: each scheduler's {goal}", fontsize=11)
        names = [e.scheduler for e in entries]
        seconds = [max(e.solve_s, 1e-3) for e in entries]
        colours = [f"C{1 + found.index(e) % 9}" if e.plan is not None else "lightgrey" for e in entries]
        side.barh(names, seconds, color=colours, height=0.6)
        side.set_xscale("log")
        side.set_xlim(min(seconds) / 2, max(seconds) * 8)  # room for each bar's figure
        side.xaxis.set_minor_formatter(NullFormatter())  # under a decade, minor labels pile up
        side.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
        for name, value in zip(names, seconds):
            side.annotate(
                f"{value:.2g} s", (value, name), textcoords="offset points", xytext=(3, 0), va="center", fontsize=8
            )
        side.invert_yaxis()
        side.set_xlabel("solve time (s, log)")
        side.set_title("time to plan", fontsize=11)
        side.set_axisbelow(True)
        side.grid(True, axis="x", which="major", linewidth=0.3)
        return _png(fig)
    finally:
        plt.close(fig)
