"""Every byte heterps writes for a shell to read (launch scripts, the commands a check suggests) goes
through here: a word is always quoted, a variable is expanded only where heterps asks for one, and
a comment is one line whatever the text it quotes."""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from heterps_cli.untrusted import printable

VARIABLE = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")


@dataclass(frozen=True)
class Env:
    """A shell variable heterps means to be expanded where the script runs (``$MASTER_ADDR``)."""

    name: str

    def __post_init__(self) -> None:
        assert VARIABLE.fullmatch("$" + self.name)


Word = str | Env


def quote(word: Word) -> str:
    """One shell word: a variable heterps put there as ``"$NAME"``; any other text in single quotes
    where it needs them, so ``$HOME``, a backquote or a newline reach the program as written."""
    if isinstance(word, Env):
        return f'"${word.name}"'
    return shlex.quote(word)


def command(argv: Sequence[Word]) -> str:
    return " ".join(quote(a) for a in argv)


def comment(text: str) -> str:
    """``# text`` on one line: a newline or a control character in ``text`` (a file name) is written as
    its escape, so nothing after it runs as a command."""
    return "# " + printable(text)


def address(text: str) -> Word:
    """``--master-addr``: ``$NAME`` is that variable where the script runs (the default, ``$MASTER_ADDR``);
    anything else is a host name, taken as written."""
    found = VARIABLE.fullmatch(text)
    return Env(found.group(1)) if found else text
