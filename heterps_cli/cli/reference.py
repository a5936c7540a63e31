"""The CLI reference page (docs/cli.md), written from the commands themselves so it cannot drift.

    python -m heterps_cli.cli.reference > docs/cli.md

``tests/test_docs.py`` fails when the page differs from what this writes, or when a
command, argument or option has no help text.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import typer
from rich.text import Text

from heterps_cli.cli.app import app

HEADER = """# CLI reference

Every command, argument and option of `heterps`, as `--help` gives them. This page
is generated (`python -m heterps_cli.cli.reference > docs/cli.md`) and a test fails
when it is out of date. The exit codes are in [Commands](commands.md#exit-codes).
"""


def commands() -> Iterator[tuple[str, Any]]:
    """(``heterps …`` path, command) for every command and subcommand, in the order ``--help`` lists them."""

    def walk(path: str, command) -> Iterator[tuple[str, Any]]:
        yield path, command
        for name, sub in getattr(command, "commands", {}).items():
            yield from walk(f"{path} {name}", sub)

    for name, command in typer.main.get_command(app).commands.items():  # type: ignore[attr-defined]
        yield from walk(f"heterps {name}", command)


def undocumented() -> list[str]:
    """Every command, argument or option with no help text, as ``heterps plan --seed``."""
    missing = []
    for path, command in commands():
        if not (command.help or "").strip():
            missing.append(path)
        missing += [f"{path} {_name(p)}" for p in command.params if not (getattr(p, "help", None) or "").strip()]
    return missing


def _name(param) -> str:
    return ", ".join(f"`{o}`" for o in param.opts) if param.param_type_name == "option" else f"`{param.name.upper()}`"


def _default(param) -> str:
    value = param.default
    if param.param_type_name != "option" or value is None or callable(value) or value is False or value == ():
        return ""
    return f"`{getattr(value, 'value', value)}`"


def _plain(text: str) -> str:
    """The help as a reader sees it: rich markup (``[bold]rl[/]``) rendered to plain text."""
    return Text.from_markup(text).plain


def _cell(text: str) -> str:
    return " ".join(_plain(text).split()).replace("|", "\\|")


def reference() -> str:
    out = [HEADER]
    for path, command in commands():
        out.append(f"## {path}\n")
        out.append(_plain(inspect.cleandoc(command.help or "")) + "\n")
        if command.params:
            out.append("| argument or option | default | what |")
            out.append("|---|---|---|")
            for param in command.params:
                out.append(f"| {_name(param)} | {_default(param)} | {_cell(getattr(param, 'help', '') or '')} |")
            out.append("")
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    print(reference(), end="")
