"""How long work reports how far it has got: schedulers, the profiler, compare (the CLI draws a bar)."""

from __future__ import annotations

from typing import Protocol


class Progress(Protocol):
    def __call__(self, description: str, completed: float | None = None, total: float | None = None) -> None: ...


def quiet(description: str, completed: float | None = None, total: float | None = None) -> None:
    """A :class:`Progress` that reports nothing."""
