"""Machine and pull-request formats of ``check`` and ``diff``: JSON, markdown, GitHub workflow commands."""

from __future__ import annotations

import json

from heterps_cli.ci.diff import Change
from heterps_cli.ci.gate import Finding
from heterps_cli.figures import count, signed_usd, usd
from heterps_cli.untrusted import markdown_text, printable

ICON = {"pass": "✅", "warn": "⚠️", "fail": "❌"}


def findings_json(plan_path: str, findings: list[Finding]) -> str:
    return json.dumps(
        {
            "plan": plan_path,
            "passed": all(f.ok for f in findings),
            "findings": [
                {"gate": f.gate, "status": f.status, "message": f.message, "fix": f.fix or None} for f in findings
            ],
        },
        indent=2,
        allow_nan=False,
    )


def findings_markdown(plan_path: str, findings: list[Finding]) -> str:
    failed = sum(not f.ok for f in findings)
    verdict = f"❌ {failed} check{'s' if failed > 1 else ''} failed" if failed else "✅ all checks passed"
    lines = [
        f"### heterps check: {_code(plan_path)} — {verdict}",
        "",
        "| | check | result | fix |",
        "|---|---|---|---|",
    ]
    for f in findings:
        fix = _code(printable(f.fix)).replace("|", "\\|") if f.fix else ""
        lines.append(f"| {ICON[f.status]} | {f.gate} | {markdown_text(f.message)} | {fix} |")
    return "\n".join(lines) + "\n"


def github_annotations(plan_path: str, findings: list[Finding]) -> str:
    """``::error``/``::warning`` workflow commands, one per failed or noteworthy gate."""
    out = []
    for f in findings:
        if f.status == "pass":
            continue
        level = "error" if f.status == "fail" else "warning"
        text = f.message + (f" — fix: {f.fix}" if f.fix else "")
        out.append(f"::{level} file={_escape(plan_path)},title=heterps check {f.gate}::{_escape(text)}")
    return "\n".join(out) + ("\n" if out else "")


def diff_annotations(new_path: str, warnings: list[str]) -> str:
    return "".join(f"::warning file={_escape(new_path)},title=heterps diff::{_escape(w)}\n" for w in warnings)


def diff_json(old_path: str, new_path: str, changes: list[Change], warnings: list[str]) -> str:
    return json.dumps(
        {
            "old": old_path,
            "new": new_path,
            "warnings": warnings,
            "changes": [
                {"what": c.what, "old": c.old, "new": c.new, "delta": c.delta, "percent": c.percent} for c in changes
            ],
        },
        indent=2,
        allow_nan=False,
    )


def diff_markdown(old_path: str, new_path: str, changes: list[Change], warnings: list[str]) -> str:
    lines = [f"### heterps diff: {_code(old_path)} → {_code(new_path)}", ""]
    lines += [f"> ⚠️ **warning:** {_cell(w)}" for w in warnings] + ([""] if warnings else [])
    lines += ["| | old | new | change |", "|---|---:|---:|---:|"]
    for c in changes:
        cells = (c.what, value(c.old, c.what), value(c.new, c.what), change(c))
        lines.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
    return "\n".join(lines) + "\n"


def value(x, what: str) -> str:
    if isinstance(x, str):
        return x
    if what.startswith("cost"):
        return usd(x)
    return count(x) if abs(x) >= 100 or float(x).is_integer() else f"{x:,.4g}"


def change(c: Change) -> str:
    if c.delta is None:
        return "changed" if c.old != c.new else ""
    if c.delta == 0:
        return "—"
    if c.what.startswith("cost"):
        amount = signed_usd(c.delta)
    else:
        amount = (
            ("+" if c.delta >= 0 else "") + count(c.delta)
            if abs(c.delta) >= 100 or float(c.delta).is_integer()
            else f"{c.delta:+,.4g}"
        )
    return amount + (f" ({c.percent:+.1f}%)" if c.percent is not None else "")


def _code(text: str) -> str:
    """Inline code that a backtick in the text cannot end early."""
    text = printable(text)
    fence = "``" if "`" in text else "`"
    return f"{fence} {text} {fence}" if fence == "``" else f"`{text}`"


def _cell(text: str) -> str:
    return markdown_text(text)


def _escape(text: str) -> str:
    # GitHub workflow command data: %, CR and LF must be escaped
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
