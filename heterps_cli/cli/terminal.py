"""Where heterps's words go: the two consoles, and what they do with any width, any encoding and a
reader that goes away (docs/commands.md, "Output"). Every command prints through these; nothing
else makes a console."""

from __future__ import annotations

import os
import sys
from typing import Any

from rich.console import Console, ConsoleDimensions, Group
from rich.table import Table

# Narrower than this, tables lose their figures ($0.0…) and COLUMNS=0 printed nothing at all: below
# it heterps renders at this width and lets the terminal wrap the lines.
MIN_WIDTH = 60
UNBOUNDED = 100_000  # wide enough to measure what a table needs, not what the terminal allows


class _Console(Console):
    """A rich console that never renders narrower than :data:`MIN_WIDTH` and survives a closed pipe."""

    @property
    def size(self) -> ConsoleDimensions:
        size = Console.size.fget(self)  # type: ignore[attr-defined]
        return ConsoleDimensions(max(size.width, MIN_WIDTH), size.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)  # type: ignore[attr-defined]

    def print(self, *objects: Any, **options: Any) -> None:
        # A table is never squeezed below what its figures need (they would be cut: $0.0…): it is
        # drawn that wide and the terminal wraps its lines.
        need = max((self._need(o) for o in objects), default=0)
        if need <= self.width:
            super().print(*objects, **options)
            return
        given = self._width
        self._width = need
        try:
            super().print(*objects, **options)
        finally:
            self._width = given

    def _need(self, renderable: Any) -> int:
        """The narrowest width that shows ``renderable`` as its view meant: a table's unwrapped columns
        at their widest cell, up to their max_width (rich's own measure lets them break between words,
        then cuts them to fit)."""
        if isinstance(renderable, Group):
            return max((self._need(r) for r in renderable.renderables), default=0)
        if not isinstance(renderable, Table):
            return 0
        unbounded = self.options.update_width(UNBOUNDED)
        widths = [renderable._measure_column(self, unbounded, column) for column in renderable.columns]
        cells = sum(m.maximum if c.no_wrap else m.minimum for m, c in zip(widths, renderable.columns))
        return cells + renderable._extra_width

    def on_broken_pipe(self) -> None:
        _keep_going(self)


def _keep_going(console: Console) -> None:
    """rich exits 1 when the reader of standard output goes away, which a CI step reads as a failed
    gate (`heterps check | head`): instead the rest of the output goes nowhere and the command
    still ends with its own code."""
    console.quiet = True
    silence_stdout()


out = _Console(soft_wrap=True, highlight=False)
err = _Console(stderr=True, soft_wrap=True, highlight=False)


def silence_stdout() -> None:
    """Point standard output at /dev/null once it has refused a write (a full disk, a reader that went
    away), so that Python's own flush at exit neither fails again nor changes the exit code."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    except (OSError, ValueError, AttributeError):  # no real descriptor (a test runner's buffer)
        pass


def stderr_is_a_terminal() -> bool:
    """Whether a person watches standard error: a progress bar is drawn only then. FORCE_COLOR asks for
    colour, not for a bar redrawn into a log file."""
    try:
        return os.isatty(sys.stderr.fileno())
    except (OSError, ValueError, AttributeError):
        return False


def install() -> None:
    """For the whole process (the console script): every rich console, typer's help too, keeps going
    when its reader leaves; and words that the terminal's encoding cannot hold (×, —, a name in
    Greek) are written as escapes instead of ending the command with an internal error after its
    output file was written (PYTHONIOENCODING=ascii, LANG=C). Files heterps writes are UTF-8
    whatever the terminal's encoding."""
    Console.on_broken_pipe = _keep_going  # type: ignore[method-assign,assignment]
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None and stream.errors == "strict":
            try:
                reconfigure(errors="backslashreplace")
            except (ValueError, OSError):  # already written to in a way that forbids it
                pass


def write_stdout(data: str | bytes) -> None:
    """A file's contents on standard output (``--out -``): UTF-8 bytes, as the file would hold, whatever
    the terminal's encoding; after whatever was printed before it."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    sys.stdout.flush()
    buffer = getattr(sys.stdout, "buffer", None)
    if buffer is None:  # a test runner's text stream
        sys.stdout.write(raw.decode("utf-8"))
        sys.stdout.flush()
        return
    buffer.write(raw)
    buffer.flush()
