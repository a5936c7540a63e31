"""Time the exact cost-throughput frontier (heterps frontier) on generated chains; print a markdown table.

    python benchmarks/bench_frontier.py           # 64 and 256 layers
    python benchmarks/bench_frontier.py --quick   # 64 layers only
    python benchmarks/bench_frontier.py --json    # the rows as JSON

Each run is the whole frontier from the generated job's min_throughput to the
fastest plan. Targets (issue 17): 64 layers x 3 types under 5 s; 256 layers
under 60 s, on 2 cores. "steps" counts the exact solver's cheapest-plan
evaluations (the walk's and the probes'); "limited" how many of them needed the
limit-aware DP because a type limit binds.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.generate import chain  # noqa: E402
from benchmarks.tables import markdown  # noqa: E402
from benchmarks.verdicts import worst_times  # noqa: E402
from heterps_cli.formats import Cluster, Profile  # noqa: E402
from heterps_cli.frontier import pareto_frontier  # noqa: E402
from heterps_cli.problem import build_problem  # noqa: E402
from heterps_cli.schedulers.exact import kernel  # noqa: E402

CASES = [  # layers, types, tight limits, docs/spec.md section 1b hardware
    (64, 2, False, None),
    (64, 2, True, None),
    (64, 3, False, None),
    (64, 3, True, None),
    (64, 3, False, "memory"),
    (64, 3, False, "bandwidth"),
    (64, 4, False, None),
    (64, 4, True, None),
    (256, 3, False, None),
    (256, 3, True, None),
    (256, 3, False, "memory"),
    (256, 3, False, "bandwidth"),
]


def run(cases=CASES) -> list[dict]:
    rows = []
    limited = [0]
    plain_limited = kernel.chain_dp_limited

    def counting(*args, **kwargs):
        limited[0] += 1
        return plain_limited(*args, **kwargs)

    kernel.chain_dp_limited = counting
    try:
        for n, T, tight, hardware in cases:
            profile, cluster = chain(n, T, seed=0, tight=tight, hardware=hardware)
            problem = build_problem(Profile.model_validate(profile), Cluster.model_validate(cluster))
            limited[0] = 0
            start = time.perf_counter()
            frontier = pareto_frontier(problem)
            seconds = time.perf_counter() - start
            rows.append(
                {
                    "layers": n,
                    "types": T,
                    "limits": ("tight" if tight else "loose") + (f", {hardware}" if hardware else ""),
                    "seconds": seconds,
                    "points": frontier.size,
                    "steps": frontier.steps,
                    "limited": limited[0],
                    "from": frontier.plans[0].throughput,
                    "to": frontier.plans[-1].throughput,
                    "cost_from": frontier.plans[0].cost_usd,
                    "cost_to": frontier.plans[-1].cost_usd,
                }
            )
            r = rows[-1]
            print(
                f"  {n:>4} x {T} {r['limits']:16} {seconds:7.2f} s  {r['points']:>5} plans  {r['steps']:>5} steps",
                file=sys.stderr,
                flush=True,
            )
    finally:
        kernel.chain_dp_limited = plain_limited
    return rows


COLUMNS = [
    ("layers", "r"),
    ("types", "r"),
    ("limits", "l"),
    ("frontier s", "r"),
    ("plans on it", "r"),
    ("solver steps", "r"),
    ("limit-aware DPs", "r"),
    ("samples/s from → to", "l"),
    ("cost $ from → to", "l"),
]


def table(rows: list[dict]) -> str:
    return markdown(
        COLUMNS,
        [
            [str(r["layers"]), str(r["types"]), r["limits"], f"{r['seconds']:.2f}", f"{r['points']:,}"]
            + [f"{r['steps']:,}", f"{r['limited']:,}", f"{r['from']:,.0f} → {r['to']:,.0f}"]
            + [f"{r['cost_from']:,.2f} → {r['cost_to']:,.2f}"]
            for r in rows
        ],
    )


def targets(rows: list[dict]) -> str:
    return worst_times(
        rows,
        [
            ("64 layers x 3 types", lambda r: r["layers"] == 64 and r["types"] == 3, 5.0),
            ("256 layers", lambda r: r["layers"] == 256, 60.0),
        ],
    )


if __name__ == "__main__":
    cases = [c for c in CASES if c[0] == 64] if "--quick" in sys.argv else CASES
    rows = run(cases)
    if "--json" in sys.argv:
        print(json.dumps(rows, indent=2))
    else:
        print(table(rows))
        print()
        print(targets(rows))
