"""The tapp scheduler beside rl under objective time, against the exact fastest plan.

    python benchmarks/bench_tapp.py                 # all 24 instances, default settings, seed 0
    python benchmarks/bench_tapp.py --only chain64

Every instance is solved with ``objective time`` (the fastest plan within the
limits; TAPP's own objective). Prints a markdown table (instance, the optimum's
throughput, tapp's and rl's throughput, their gaps and seconds) and the issue's
target: tapp within 5% of the optimum's throughput on at least 90% of the
instances.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.compare_suite import pct  # noqa: E402
from benchmarks.make_instances import names, paths  # noqa: E402
from benchmarks.tables import markdown  # noqa: E402
from heterps_cli.errors import InfeasibleError  # noqa: E402
from heterps_cli.problem import load_problem  # noqa: E402
from heterps_cli.schedulers import SolveOptions, exact, rl, tapp  # noqa: E402


def _run(solver, problem, seed: int) -> tuple[float, float]:
    start = time.perf_counter()
    try:
        throughput = solver(problem, seed=seed, options=SolveOptions()).throughput
    except InfeasibleError:
        throughput = float("nan")
    return throughput, time.perf_counter() - start


def run_one(name: str, seed: int = 0) -> dict:
    profile, cluster = paths(name)
    problem = load_problem(str(profile), str(cluster), objective="time")
    optimum = exact.solve(problem).throughput
    row = {"instance": name, "layers": problem.n_layers, "types": problem.n_types, "optimum": optimum}
    for label, solver in (("tapp", tapp.solve), ("rl", rl.solve)):
        throughput, seconds = _run(solver, problem, seed)
        row[label] = throughput
        row[f"{label} gap"] = 1 - throughput / optimum if np.isfinite(throughput) else float("inf")
        row[f"{label} s"] = seconds
    return row


COLUMNS = [("instance", "l")] + [
    (name, "r")
    for name in ("layers", "types", "optimum samples/s", "tapp", "tapp gap", "tapp s", "rl", "rl gap", "rl s")
]


def table(rows: list[dict]) -> str:
    return markdown(
        COLUMNS,
        [
            [r["instance"], str(r["layers"]), str(r["types"]), f"{r['optimum']:,.1f}", f"{r['tapp']:,.1f}"]
            + [pct(r["tapp gap"]), f"{r['tapp s']:.1f}", f"{r['rl']:,.1f}", pct(r["rl gap"]), f"{r['rl s']:.1f}"]
            for r in rows
        ],
    )


def summary(rows: list[dict]) -> str:
    lines = []
    for label in ("tapp", "rl"):
        gaps = [r[f"{label} gap"] for r in rows]
        within = sum(g <= 0.05 for g in gaps)
        lines.append(
            f"- {label}: within 5% of the optimum's throughput on {within}/{len(rows)} = "
            f"{within / len(rows):.0%}"
            + (" (target >= 90%)" if label == "tapp" else "")
            + f"; within 1% on {sum(g <= 0.01 for g in gaps)}; worst {100 * max(gaps):.2f}%; "
            f"median {np.median([r[f'{label} s'] for r in rows]):.1f} s"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", help="run the instances whose name contains this")
    parser.add_argument(
        "--hardware", action="store_true", help="the 6 instances with memory or bandwidth (spec section 1b)"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rows = []
    for name in [n for n in names(args.hardware) if not args.only or args.only in n]:
        rows.append(run_one(name, seed=args.seed))
        r = rows[-1]
        print(
            f"  {name}: tapp {100 * r['tapp gap']:.2f}% in {r['tapp s']:.1f} s, "
            f"rl {100 * r['rl gap']:.2f}% in {r['rl s']:.1f} s",
            file=sys.stderr,
            flush=True,
        )
    print(table(rows))
    print()
    print(summary(rows))
