"""Human output of ``heterps check`` (each gate's finding and the verdict) and ``heterps diff`` (two
plans' figures side by side)."""

from __future__ import annotations

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from heterps_cli.cli.render import bold, clip
from heterps_cli.figures import plural


def findings_view(plan_path: str, findings) -> Group:
    marks = {
        "pass": Text("✓ pass", style="green"),
        "warn": Text("! warn", style="yellow"),
        "fail": Text("✗ FAIL", style="bold red"),
    }
    table = Table(
        title=Text.assemble("heterps check ", bold(plan_path)),
        title_justify="left",
        box=box.SIMPLE_HEAD,
        header_style="bold",
        show_header=False,
    )
    table.add_column(no_wrap=True)
    table.add_column(no_wrap=True)
    table.add_column()
    for f in findings:
        message = Text(f.message)
        if f.fix:
            message.append("\nfix: ", style="dim")
            message.append(f.fix)
        table.add_row(marks[f.status], f.gate, message)
    failed = sum(not f.ok for f in findings)
    verdict = (
        Text(f"{plural(failed, 'check')} failed", style="bold red")
        if failed
        else Text("all checks passed", style="bold green")
    )
    return Group(table, verdict)


def diff_view(old_path: str, new_path: str, changes, warnings: list[str]) -> Group:
    from heterps_cli.ci.report import change, value

    table = Table(
        title=Text(f"{clip(old_path)} → {clip(new_path)}"),
        title_justify="left",
        box=box.SIMPLE_HEAD,
        header_style="bold",
    )
    table.add_column("")
    table.add_column("old", justify="right")
    table.add_column("new", justify="right")
    table.add_column("change", justify="right")
    for c in changes:
        style = None
        if c.delta and c.what.startswith(("cost", "training time", "throughput")):
            worse = c.delta < 0 if c.what.startswith("throughput") else c.delta > 0
            style = "red" if worse else "green"
        table.add_row(Text(c.what), Text(value(c.old, c.what)), Text(value(c.new, c.what)), change(c), style=style)
    return Group(*(Text(f"warning: {w}", style="yellow") for w in warnings), table)
