"""Markdown tables for the benchmark scripts, and writing one into its docs page between the script's
markers (``<!-- bench_x.py: begin -->`` ... ``<!-- bench_x.py: end -->``), so a page's figures are
what the script printed."""

from __future__ import annotations

from pathlib import Path


def header(columns: list[tuple[str, str]]) -> str:
    """A table's first two lines, for ``columns``: (header, "l" or "r" for the alignment)."""
    head = "| " + " | ".join(name for name, _ in columns) + " |"
    return head + "\n|" + "|".join("---:" if align == "r" else "---" for _, align in columns) + "|"


def row(cells: list[str]) -> str:
    """One line of a table (a script that prints rows as they are measured prints these)."""
    return "| " + " | ".join(cells) + " |"


def markdown(columns: list[tuple[str, str]], rows: list[list[str]]) -> str:
    """A table of ``rows`` (cells as text) under ``columns``."""
    return "\n".join([header(columns), *(row(cells) for cells in rows)])


def write_into(page: Path, script: str, text: str) -> None:
    """Replace the block between ``script``'s markers in ``page`` with ``text``."""
    begin, end = f"<!-- {script}: begin -->", f"<!-- {script}: end -->"
    doc = page.read_text()
    if begin not in doc or end not in doc:
        raise SystemExit(f"{page}: no {begin} … {end} block to write the table into")
    head, rest = doc.split(begin, 1)
    page.write_text(f"{head}{begin}\n{text}\n{end}{rest.split(end, 1)[1]}")
