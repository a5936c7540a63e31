"""The lines under a benchmark's table: each target with the worst time measured against it."""

from __future__ import annotations

from collections.abc import Callable


def worst_times(rows: list[dict], targets: list[tuple[str, Callable[[dict], bool], float]]) -> str:
    """For each (label, which rows, limit in seconds): the worst ``seconds`` of those rows and met/MISSED."""
    lines = []
    for label, pick, limit in targets:
        chosen = [r for r in rows if pick(r)]
        if chosen:
            worst = max(r["seconds"] for r in chosen)
            refused = sum(1 for r in chosen if r.get("refused"))
            verdict = f"MISSED (refused {refused})" if refused else "met" if worst < limit else "MISSED"
            lines.append(f"- {label}: worst {worst:.2f} s over {len(chosen)} runs (target < {limit:g} s): {verdict}")
    return "\n".join(lines)
