"""Text from input files as it reaches a person: on a terminal, and in a pull-request comment.

Names are refused at validation when they hold control characters (:data:`UNPRINTABLE`), but a
message can still quote what failed validation (an unknown key, a bad value), so every error line
and every table cell passes through :func:`printable` on its way out, and markdown through
:func:`markdown_text`.
"""

from __future__ import annotations

import re

# C0 and C1 controls and DEL (ESC starts terminal sequences), the bidirectional marks, overrides and
# isolates, which reorder what a reader sees, and the characters that show as nothing (zero-width
# spaces and joiners, the word joiner, U+FEFF, the soft hyphen, line and paragraph separators).
UNPRINTABLE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ufeff]"
)


def printable(text: str) -> str:
    """``text`` with every :data:`UNPRINTABLE` character written as its escape (``\\x1b``, ``\\u202e``)."""
    return UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def first_unprintable(text: str) -> str | None:
    """The first :data:`UNPRINTABLE` character of ``text`` as ``U+001B``, or None."""
    found = UNPRINTABLE.search(text)
    return None if found is None else f"U+{ord(found.group()):04X}"


def markdown_text(text: str) -> str:
    """``text`` for a markdown table cell, read as text: no HTML (``<!--`` would hide the rest of a
    comment), no cell break (``|``), one line."""
    text = printable(text.replace("\r", " ").replace("\n", " "))
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")
