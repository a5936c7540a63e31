"""Text from input files as it reaches a person: on a terminal, and in a pull-request comment.

Names are refused at validation when they hold control characters (:data:`UNPRINTABLE`), but a
message can still quote what failed validation (an unknown key, a bad value), so every error line
and every table cell passes through :func:`printable` on its way out, and markdown through
:func:`markdown_text`.
"""

from __future__ import annotations

import re
import unicodedata

# C0 and C1 controls and DEL (ESC starts terminal sequences), the bidirectional marks, overrides and
# isolates, which reorder what a reader sees, and the characters that show as nothing (zero-width
# spaces and joiners, the word joiner, U+FEFF, the soft hyphen, line and paragraph separators).
UNPRINTABLE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ufeff]"
)


# What else shows as nothing or as a space, so that a name holding it reads as another name ("gpu" and
# "gpu" + U+200B): format characters (Cf), separators but the plain space, private and unassigned
# code points, and the default-ignorable letters and marks no category singles out.
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs"})
_IGNORABLE = re.compile("[\u034f\u115f\u1160\u17b4\u17b5\u180b-\u180f\u3164\ufe00-\ufe0f\uffa0\U000e0100-\U000e01ef]")


def invisible(char: str) -> bool:
    """Whether ``char`` prints as nothing or as a space (the plain space itself excepted)."""
    if char == " ":
        return False
    return unicodedata.category(char) in _HIDDEN_CATEGORIES or bool(_IGNORABLE.match(char)) or char.isspace()


def printable(text: str) -> str:
    """``text`` with every :data:`UNPRINTABLE` and :func:`invisible` character written as its escape
    (``\\x1b``, ``\\u202e``, ``\\u200b``)."""
    if text.isascii():  # every invisible ASCII character is a control: the regex alone, as fast as before
        return UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)
    return "".join(
        c.encode("unicode_escape").decode("ascii") if UNPRINTABLE.match(c) or invisible(c) else c for c in text
    )


def first_unprintable(text: str) -> str | None:
    """The first :data:`UNPRINTABLE` character of ``text`` as ``U+001B``, or None."""
    found = UNPRINTABLE.search(text)
    return None if found is None else f"U+{ord(found.group()):04X}"


def markdown_text(text: str) -> str:
    """``text`` for a markdown table cell, read as text: no HTML (``<!--`` would hide the rest of a
    comment), no cell break (``|``), one line."""
    text = printable(text.replace("\r", " ").replace("\n", " "))
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")
