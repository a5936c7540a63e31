"""The rl scheduler against the exact optimum on every benchmark instance, for several seeds.

    python benchmarks/bench_rl.py                       # 30 instances x seeds 0-3, default settings
    python benchmarks/bench_rl.py --only chain64x3 --seeds 0 1
    python benchmarks/bench_rl.py --hardware            # the 6 instances of docs/spec.md section 1b
    python benchmarks/bench_rl.py --json rl.json        # also write every run (resumes from the file)

The instances are the 24 of the paper's model and the 6 of docs/spec.md section 1b
(memory-tight, bandwidth-heavy). Every run is reported, not the best seed: a
table of gaps per instance and seed, then the issue's targets over all runs:
feasible on every run; within 2% of the optimum on >= 95% of runs and within 5%
on every run; the policy's own samples (not the pre-training pool, not the
final polish) within 2% on >= 75% of runs; 64 layers x 3 types (chain64x3)
under 8 s median and every instance under 15 s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.compare_suite import pct  # noqa: E402
from benchmarks.make_instances import names, paths  # noqa: E402
from benchmarks.tables import markdown  # noqa: E402
from heterps_cli.errors import InfeasibleError  # noqa: E402
from heterps_cli.problem import load_problem  # noqa: E402
from heterps_cli.schedulers import RLOptions, exact, rl  # noqa: E402

SEEDS = (0, 1, 2, 3)


def run_one(name: str, options: RLOptions = RLOptions(), seed: int = 0) -> dict:
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
    return {
        "instance": name,
        "seed": seed,
        "layers": problem.n_layers,
        "types": problem.n_types,
        "optimum": optimum,
        "rl": cost,
        "feasible": feasible,
        "gap": cost / optimum - 1 if feasible else float("inf"),
        "sampled": sampled[-1] / optimum - 1 if sampled else float("inf"),
        "seconds": seconds,
    }


def table(rows: list[dict], seeds: list[int]) -> str:
    """One line per instance: the gap, the policy-only gap and the seconds of every seed."""
    numbers = ["layers", "types", "optimum $", *(f"gap s{s}" for s in seeds), *(f"policy s{s}" for s in seeds)]
    columns = [("instance", "l"), *((name, "r") for name in [*numbers, "median s", "worst s"])]
    cells = []
    by_instance: dict[str, dict[int, dict]] = {}
    for r in rows:
        by_instance.setdefault(r["instance"], {})[r["seed"]] = r
    for name, runs in by_instance.items():
        first = next(iter(runs.values()))
        gaps = [pct(runs[s]["gap"]) if s in runs else "—" for s in seeds]
        policy = [pct(runs[s]["sampled"]) if s in runs else "—" for s in seeds]
        seconds = [r["seconds"] for r in runs.values()]
        cells.append(
            [name, str(first["layers"]), str(first["types"]), f"{first['optimum']:.3f}", *gaps, *policy]
            + [f"{statistics.median(seconds):.1f}", f"{max(seconds):.1f}"]
        )
    return markdown(columns, cells)


def summary(rows: list[dict]) -> str:
    n = len(rows)
    gaps = sorted(r["gap"] for r in rows)
    within2 = sum(g <= 0.02 for g in gaps)
    policy2 = sum(r["sampled"] <= 0.02 for r in rows)
    worst = max(rows, key=lambda r: r["gap"])
    slowest = max(rows, key=lambda r: r["seconds"])
    lines = [
        f"- feasible: {sum(r['feasible'] for r in rows)}/{n} runs (target: every run)",
        f"- within 2% of the optimum: {within2}/{n} = {within2 / n:.0%} of runs (target >= 95%)",
        f"- worst gap: {pct(worst['gap'])} ({worst['instance']} seed {worst['seed']}; target <= 5% on every run); "
        f"median {pct(gaps[n // 2])}",
        f"- the policy's own samples within 2%: {policy2}/{n} = {policy2 / n:.0%} of runs (target >= 75%)",
        f"- slowest run: {slowest['seconds']:.1f} s ({slowest['instance']} seed {slowest['seed']}; target < 15 s)",
    ]
    # The issue sets the 8 s against "64 x 3 layers" (13-17 s then) apart from "tight instances" (25+ s then,
    # under the 15 s for every instance), so the target is the plain chain64x3; all four of that size are shown.
    plain = [r["seconds"] for r in rows if r["instance"] == "chain64x3"]
    if plain:
        lines.append(
            f"- chain64x3 (64 layers x 3 types): median {statistics.median(plain):.1f} s, worst {max(plain):.1f} s "
            f"over {len(plain)} runs (target: median < 8 s)"
        )
    big = [r["seconds"] for r in rows if r["layers"] == 64 and r["types"] == 3]
    if len(big) > len(plain):
        lines.append(
            f"- all 64 x 3 instances (with -tight, -memory, -bandwidth): median {statistics.median(big):.1f} s, "
            f"worst {max(big):.1f} s over {len(big)} runs"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", help="run the instances whose name contains this")
    parser.add_argument("--hardware", action="store_true", help="only the 6 instances of docs/spec.md section 1b")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--steps", type=int)
    parser.add_argument("--json", type=Path, help="keep every run here; runs already in it are not repeated")
    args = parser.parse_args()
    every = names(hardware=True) if args.hardware else names() + names(hardware=True)
    chosen = [n for n in every if not args.only or args.only in n]
    done = json.loads(args.json.read_text()) if args.json and args.json.exists() else []
    have = {(r["instance"], r["seed"]) for r in done}
    rows = [r for r in done if r["instance"] in chosen and r["seed"] in args.seeds]
    for name in chosen:
        for seed in args.seeds:
            if (name, seed) in have:
                continue
            r = run_one(name, RLOptions(steps=args.steps), seed=seed)
            rows.append(r)
            print(
                f"  {name} seed {seed}: gap {pct(r['gap'])}, policy {pct(r['sampled'])}, {r['seconds']:.1f} s",
                file=sys.stderr,
                flush=True,
            )
            if args.json:
                done.append(r)
                args.json.write_text(json.dumps(done, indent=1))
    order = {name: i for i, name in enumerate(chosen)}
    rows.sort(key=lambda r: (order[r["instance"]], r["seed"]))
    print(table(rows, args.seeds))
    print()
    print(summary(rows))


if __name__ == "__main__":
    main()
