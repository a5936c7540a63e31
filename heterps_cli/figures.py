"""Figures as people read them: dollars, counts and durations that stay short at any magnitude.

A 28-second job costs fractions of a cent and must not read "$0.00"; a job of
1e280 epochs must not print a 300-digit number. Plan files keep full precision:
this is for the screen, the markdown and the messages only.
"""

from __future__ import annotations

import math

HUGE = 1e15  # from here on, engineering form: digit groups stop helping


def usd(x: float) -> str:
    """$1,234.56 (cents from a dollar up); under a dollar three significant digits, so that no two
    figures a plan can tell apart print alike: $0.80, $0.0164, $0.00781, $1.09e-05; $8.002e+31."""
    if not math.isfinite(x):
        return f"${x}"
    if abs(x) >= HUGE:
        return f"${x:.4g}"
    if x == 0 or abs(x) >= 1:
        return f"${x:,.2f}"
    text = f"{x:.3g}"
    if "e" not in text and len(text.partition(".")[2]) < 2:
        text = f"{x:.2f}"  # $0.80, not $0.8
    return f"${text}"


def signed_usd(x: float) -> str:
    """+$0.05 or -$1.20: the sign before the dollar sign, as a cost diff reads."""
    return ("+" if x >= 0 else "-") + usd(abs(x))


def count(x: float, decimals: int = 0) -> str:
    """1,326,103; 3,292.4 with ``decimals`` under 10,000 (from there on a fraction adds nothing a
    reader uses); 1.326e+18 when huge; a small non-zero figure keeps 3 significant digits."""
    if not math.isfinite(x) or abs(x) >= HUGE:
        return f"{x:.4g}"
    if 0 < abs(x) < 0.5 * 10.0**-decimals:
        return f"{x:.3g}"
    return f"{x:,.{decimals if abs(x) < 1e4 else 0}f}"


def number(x: float) -> str:
    """A setting or a flag's value as a reader compares it: 1,000,000,000; 3e+06 never, but
    3,000,000; 0.25; 3,292.45 (six significant digits); 1.5e+20 when huge."""
    if not math.isfinite(x) or abs(x) >= HUGE:
        return f"{x:.4g}"
    if float(x).is_integer() or abs(x) >= 1e5:
        return f"{x:,.0f}"
    return f"{x:,.6g}"


def exact(x: float) -> str:
    """A number as a command line must carry it: every digit that makes the float what it is
    (``3292.44674195768``, not 3292.45), integers without a fraction (``10000000``)."""
    if float(x).is_integer() and abs(x) < 2**53:
        return str(int(x))
    return repr(float(x))


def duration(seconds: float) -> str:
    """4710.1 -> '1 h 18 min'; short times keep seconds, long ones go to days and years."""
    if not math.isfinite(seconds):
        return f"{seconds} s"
    if seconds < 120:
        return f"{seconds:.1f} s" if seconds >= 0.05 else f"{seconds:.2g} s"
    minutes = seconds / 60
    if minutes < 120:
        return f"{minutes:.0f} min"
    if seconds < 48 * 3600:
        hours, minutes = divmod(round(minutes), 60)
        return f"{hours} h {minutes:02d} min"
    days = seconds / 86400
    if days < 1000:
        return f"{days:.1f} days"
    return f"{days / 365.25:,.0f} years" if days / 365.25 < HUGE else f"{days / 365.25:.3g} years"


def plural(n: int, word: str, words: str | None = None) -> str:
    """'1 stage', '3 stages'."""
    return f"{n:,} {word if n == 1 else (words or word + 's')}"


def setting(value) -> str:
    """A job setting as a message shows it: 'ctr', none, 1,000,000,000."""
    return repr(str(value)) if isinstance(value, str) else "none" if value is None else number(value)
