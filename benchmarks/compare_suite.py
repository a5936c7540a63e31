"""Every scheduler on every benchmark instance, against the exact optimum.

    python benchmarks/compare_suite.py                      # writes docs/compare.md
    python benchmarks/compare_suite.py --only chain16 --out /tmp/compare.md

Runs ``heterps compare``'s library call on each instance of benchmarks/instances/
(rl first, so that genetic and random get exactly rl's number of cost-model
evaluations), then writes a markdown report: per scheduler the median and worst
gap to the optimum, how often it found a feasible plan, its median solve time and
evaluations; then the per-instance gaps.
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.make_instances import names, paths  # noqa: E402
from benchmarks.tables import header, row  # noqa: E402
from heterps_cli.compare import compare_schedulers  # noqa: E402
from heterps_cli.problem import load_problem  # noqa: E402
from heterps_cli.schedulers import SCHEDULERS  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

SUMMARY = ("feasible", "median gap", "worst gap", "within 2%", "median s", "worst s", "median evaluations")


def pct(gap: float | None) -> str:
    return "none feasible" if gap is None or not np.isfinite(gap) else f"{100 * gap:.2f}%"


def report(results: dict[str, list], schedulers: list[str], objective: str) -> str:
    lines = [
        "# Schedulers compared on the benchmark instances",
        "",
        f"Written by `python benchmarks/compare_suite.py` ({platform.python_implementation()} "
        f"{platform.python_version()}, {len(results)} instances from benchmarks/instances/, objective {objective}, "
        "seed 0, default settings; genetic and random get as many evaluations as rl used on the same instance).",
        "Gap: cost above the exact optimum. Time: wall seconds of the solve on this machine.",
        "",
        header([("scheduler", "l")] + [(name, "r") for name in SUMMARY]),
    ]
    for s in schedulers:
        rows = [entries[s] for entries in results.values()]
        gaps = np.array([e.gap if e.plan is not None else np.inf for e in rows])
        seconds = np.array([e.solve_s for e in rows])
        evals = [e.plan.evaluations for e in rows if e.plan is not None and e.plan.evaluations is not None]
        cells = [s, f"{sum(e.plan is not None for e in rows)}/{len(rows)}", pct(float(np.median(gaps)))]
        cells += [pct(float(gaps.max())), f"{int((gaps <= 0.02).sum())}/{len(rows)}", f"{np.median(seconds):.2f}"]
        lines.append(row([*cells, f"{seconds.max():.2f}", f"{int(np.median(evals)):,}" if evals else "—"]))
    lines += [
        "",
        "## Per instance (gap, seconds)",
        "",
        header([("instance", "l"), ("optimum $", "r")] + [(s, "r") for s in schedulers]),
    ]
    for name, entries in results.items():
        optimum = entries["exact"].plan.cost_usd if "exact" in entries and entries["exact"].plan else float("nan")
        cells = [f"{pct(entries[s].gap if entries[s].plan else None)} ({entries[s].solve_s:.1f} s)" for s in schedulers]
        lines.append(row([name, f"{optimum:.3f}", *cells]))
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", help="run the instances whose name contains this")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "compare.md")
    args = parser.parse_args()
    schedulers = list(SCHEDULERS)
    results = {}
    for name in [n for n in names() if not args.only or args.only in n]:
        profile, cluster = paths(name)
        entries = compare_schedulers(load_problem(str(profile), str(cluster)), schedulers, seed=0)
        results[name] = {e.scheduler: e for e in entries}
        print(
            f"  {name}: "
            + ", ".join(f"{e.scheduler} {pct(e.gap if e.plan else None)} {e.solve_s:.1f}s" for e in entries),
            file=sys.stderr,
            flush=True,
        )
    text = report(results, schedulers, "cost")
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
