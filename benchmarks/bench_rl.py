"""The rl scheduler against the exact optimum on the benchmark instances.

    python benchmarks/bench_rl.py                 # all 24 instances, default settings
    python benchmarks/bench_rl.py --only chain64x3

Prints a markdown table (instance, optimum, RL cost, gap, RL seconds) and the
issue's targets: feasible whenever a plan exists, gap <= 2% on >= 95% of the
instances and <= 5% on all, a 64-layer 3-type instance in < 20 s. The
"policy samples only" column is the best plan the policy itself sampled in
training (not the pre-training pool, not the final polish), so the table shows
what each part contributes.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.compare_suite import pct  # noqa: E402
from benchmarks.make_instances import names, paths  # noqa: E402
from heterps_cli.errors import InfeasibleError  # noqa: E402
from heterps_cli.problem import load_problem  # noqa: E402
from heterps_cli.schedulers import SolveOptions, exact, rl  # noqa: E402


def run_one(name: str, options: SolveOptions = SolveOptions(), seed: int = 0) -> dict:
    profile, cluster = paths(name)
    problem = load_problem(str(profile), str(cluster))
    optimum = exact.solve(problem).cost_usd
    sampled: list[float] = []
    start = time.perf_counter()
    try:
        plan = rl.solve(problem, seed=seed, options=options, on_step=lambda step, key: sampled.append(key))
        cost, feasible = plan.cost_usd, plan.feasible
    except InfeasibleError:
        cost, feasible = float("nan"), False
    seconds = time.perf_counter() - start
    before = sampled[-1] / optimum - 1 if sampled else float("inf")
    return {
        "instance": name,
        "layers": problem.n_layers,
        "types": problem.n_types,
        "optimum": optimum,
        "rl": cost,
        "feasible": feasible,
        "gap": cost / optimum - 1 if feasible else float("inf"),
        "sampled": before,
        "seconds": seconds,
    }


def table(rows: list[dict]) -> str:
    out = [
        "| instance | layers | types | optimum $ | rl $ | gap | policy samples only | rl s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        out.append(
            f"| {r['instance']} | {r['layers']} | {r['types']} | {r['optimum']:.3f} | {r['rl']:.3f} | "
            f"{pct(r['gap'])} | {pct(r['sampled'])} | {r['seconds']:.1f} |"
        )
    return "\n".join(out)


def summary(rows: list[dict]) -> str:
    gaps = [r["gap"] for r in rows]
    within2 = sum(g <= 0.02 for g in gaps)
    big = [f"{r['instance']} {r['seconds']:.1f} s" for r in rows if r["layers"] == 64 and r["types"] == 3]
    lines = [
        f"- feasible: {sum(r['feasible'] for r in rows)}/{len(rows)} (every instance has a feasible plan)",
        f"- gap <= 2%: {within2}/{len(rows)} = {within2 / len(rows):.0%} (target >= 95%)",
        f"- worst gap: {100 * max(gaps):.2f}% (target <= 5%); median {100 * sorted(gaps)[len(gaps) // 2]:.2f}%",
        f"- sampled by the policy (no pool, no polish): "
        f"{sum(r['sampled'] <= 0.02 for r in rows)}/{len(rows)} within 2%",
    ]
    if big:
        lines.append(f"- 64 layers x 3 types (target < 20 s): {', '.join(big)}")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", help="run the instances whose name contains this")
    parser.add_argument("--hardware", action="store_true", help="the 6 instances with memory or bandwidth (SPEC 1b)")
    parser.add_argument("--steps", type=int)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    chosen = [n for n in names(args.hardware) if not args.only or args.only in n]
    rows = []
    for name in chosen:
        rows.append(run_one(name, SolveOptions(steps=args.steps), seed=args.seed))
        r = rows[-1]
        print(f"  {name}: gap {100 * r['gap']:.2f}% in {r['seconds']:.1f} s", file=sys.stderr, flush=True)
    print(table(rows))
    print()
    print(summary(rows))
