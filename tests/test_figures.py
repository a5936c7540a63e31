"""How figures read: dollars with significant digits, one number style, plot ticks that are the values."""

from __future__ import annotations

import pytest

from heterps_cli import plots
from heterps_cli.figures import count, exact, number, usd
from heterps_cli.frontier import pareto_frontier
from heterps_cli.problem import load_problem
from tests.test_frontier_command import CTR, PAPER


@pytest.mark.parametrize(
    "x, shown",
    [
        (0.0, "$0.00"),
        (0.8, "$0.80"),
        (0.0164, "$0.0164"),  # once "$0.02", beside "+162.1%"
        (0.0078, "$0.0078"),  # once "$0.01" in a message while the table said $0.0078
        (0.0000109, "$1.09e-05"),  # once "(costing $0.00)"
        (29.222618, "$29.22"),
        (29.279416, "$29.28"),
        (1234.5, "$1,234.50"),
        (8.002e31, "$8.002e+31"),
    ],
)
def test_money_keeps_the_digits_that_tell_figures_apart(x, shown):
    assert usd(x) == shown


def test_settings_and_counts_share_one_style_and_commands_carry_every_digit():
    assert number(1e9) == "1,000,000,000"  # once 1e+09
    assert number(3e6) == "3,000,000"  # once 3e+06 beside 150,000
    assert number(0.25) == "0.25"
    assert count(60000.0, 1) == "60,000"  # once 60,000.0
    assert count(1e9, 1) == "1,000,000,000"
    assert count(3292.4467, 1) == "3,292.4"
    assert exact(3292.44674195768) == "3292.44674195768"  # once rounded up to 3292.45
    assert exact(1e7) == "10000000" and float(exact(0.1 + 0.2)) == 0.1 + 0.2


@pytest.mark.parametrize(
    "values, money, labels",
    [
        ([8000, 16000, 24000], False, ["8k", "16k", "24k"]),  # once "8,000, 1.6k, 2.4k"
        ([92000, 93000, 94000], False, ["92k", "93k", "94k"]),  # 93,389 once sat on an axis of 6k..9k
        ([93380, 93385, 93390], False, ["93.380k", "93.385k", "93.390k"]),
        ([0, 2e6, 4e6], False, ["0", "2M", "4M"]),
        ([1e9, 2e9], False, ["1G", "2G"]),
        ([0.014, 0.016, 0.018, 0.02], True, ["$0.014", "$0.016", "$0.018", "$0.020"]),  # once "$0.02" four times
        ([0.5, 1.0, 1.5], True, ["$0.50", "$1.00", "$1.50"]),
        ([20, 40, 60], True, ["$20", "$40", "$60"]),
        ([1200, 1400], True, ["$1,200", "$1,400"]),
    ],
)
def test_tick_labels_read_as_the_values_and_differ(values, money, labels):
    assert plots.tick_labels(values, money) == labels


def test_a_drawn_frontier_labels_its_axes_with_its_own_values():
    pytest.importorskip("matplotlib")
    from matplotlib import pyplot as plt

    frontier = pareto_frontier(load_problem(CTR, PAPER))
    fig, ax = plt.subplots()
    try:
        plots._curve(ax, frontier)
        plots._axes_style(ax)
        fig.canvas.draw()
        for axis in (ax.xaxis, ax.yaxis):
            ticks = [t for t in axis.get_major_ticks() if t.label1.get_visible()]
            locs = axis.get_majorticklocs()
            shown = [t.label1.get_text() for t in ticks]
            assert len(set(shown)) == len(shown)
            for loc, text in zip(locs, shown):
                value = float(text.replace("$", "").replace(",", "").replace("k", "e3").replace("M", "e6"))
                assert value == pytest.approx(loc, rel=0.01, abs=1e-9), (text, loc)
    finally:
        plt.close(fig)


def test_tables_keep_one_line_per_row_in_80_columns():
    # Pipes and CI logs: frontier's stage cells once wrapped to 5-7 lines, plan's layer names and
    # compare's resources wrapped too.
    import re

    from heterps_cli.cli.app import app
    from tests.helpers import ROOT, runner

    transformer = [str(ROOT / "profiles/transformer.yaml"), str(ROOT / "clusters/three-type.yaml")]
    runs = {
        "frontier": ["frontier", *transformer],
        "plan": ["plan", *transformer, "-s", "exact"],
        "compare": ["compare", CTR, PAPER, "--schedulers", "greedy,random,exact", "--evaluations", "100"],
    }
    for name, args in runs.items():
        result = runner.invoke(app, args, env={"COLUMNS": "80"})
        assert result.exit_code == 0, result.output
        after = result.stdout.split("───", 1)[1].splitlines()[1:]
        table = after[: next(i for i, line in enumerate(after) if not line.strip())]
        assert all(len(line) <= 80 for line in table), name
        assert all(re.match(r"^ *(\d|greedy|random|exact)", line) for line in table), (name, table)
        figures = [line[-45:] if name == "plan" else line[:40] for line in table]
        assert "…" not in "".join(figures), (name, table)  # only names give way, never a figure
