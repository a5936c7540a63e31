"""rl and tapp as `heterps plan` runs them (schedulers.solve: the search, then the exact cut of its runs),
against the exact optimum, on the 3-type instances and on held-out chains.

    python benchmarks/bench_searches.py                        # rl and tapp, seeds 0-3, every problem
    python benchmarks/bench_searches.py --search rl --only held --seeds 0 1
    python benchmarks/bench_searches.py --json runs.json       # keep every run (resumes from the file)

The problems: the benchmark instances with 3 types (benchmarks/instances: 8-64 layers, loose, tight,
memory, bandwidth; generated from seed 1), and held-out chains the searches were never tuned on
(benchmarks/generate.py at seed 2: 40 and 64 layers x 3 types, loose, tight, memory and bandwidth,
a tight one's target 85% of its fastest plan, as make_instances does). rl runs under each problem's
own objective (cost), tapp under objective time (its paper's); both with the default budget (120 steps).
The issue's targets: rl within 2% of the optimum on >= 95% of runs and within 5% on every run; tapp
within 5% of the fastest plan on all problems but one.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_exact import problem_for  # noqa: E402
from benchmarks.compare_suite import pct  # noqa: E402
from benchmarks.generate import chain  # noqa: E402
from benchmarks.make_instances import names, paths  # noqa: E402
from benchmarks.tables import markdown  # noqa: E402
from heterps_cli.errors import InfeasibleError  # noqa: E402
from heterps_cli.objective import Objective  # noqa: E402
from heterps_cli.problem import Problem, load_problem  # noqa: E402
from heterps_cli.schedulers import solve  # noqa: E402

HELD_OUT_SEED = 2
HELD_OUT = tuple((n, kind) for n in (40, 64) for kind in ("loose", "tight", "memory", "bandwidth"))


def problems() -> dict[str, object]:
    """Name -> a loader of the problem (loaded when run)."""
    out: dict[str, object] = {}
    for name in names() + names(hardware=True):
        if "x3" in name:
            out[name] = lambda name=name: load_problem(*(str(p) for p in paths(name)))
    for n, kind in HELD_OUT:
        out[f"held{n}x3-{kind}"] = lambda n=n, kind=kind: _held_out(n, kind)
    return out


def _held_out(n: int, kind: str) -> Problem:
    tight = kind in ("tight", "bandwidth")
    hardware = kind if kind in ("memory", "bandwidth") else None
    profile, cluster = chain(n, 3, seed=HELD_OUT_SEED, tight=tight, hardware=hardware)
    problem = problem_for(profile, cluster, "cost")
    if tight:
        fastest = solve("exact", problem.replace(objective=Objective.TIME, min_throughput=0.0)).throughput
        problem = problem.replace(min_throughput=float(f"{0.85 * fastest:.6g}"))
    return problem


def run_one(name: str, problem: Problem, search: str, seed: int) -> dict:
    if search == "tapp":
        problem = problem.replace(objective=Objective.TIME)
    optimum = solve("exact", problem)
    start = time.perf_counter()
    try:
        plan = solve(search, problem, seed=seed)
        cost, thr = plan.cost_usd, plan.throughput
    except InfeasibleError:
        cost, thr = float("nan"), 0.0
    seconds = time.perf_counter() - start
    if search == "tapp":  # throughput short of the fastest
        gap = 1 - thr / optimum.throughput if thr > 0 else float("inf")
    else:
        gap = cost / optimum.cost_usd - 1 if cost == cost else float("inf")
    return {"problem": name, "search": search, "seed": seed, "gap": gap, "seconds": seconds}


def summary(rows: list[dict], search: str) -> str:
    mine = [r for r in rows if r["search"] == search]
    if not mine:
        return ""
    n = len(mine)
    worst = max(mine, key=lambda r: r["gap"])
    if search == "rl":
        within = sum(r["gap"] <= 0.02 for r in mine)
        return (
            f"- rl: within 2% of the optimum on {within}/{n} = {within / n:.0%} of runs (target >= 95%); "
            f"worst {pct(worst['gap'])} ({worst['problem']} seed {worst['seed']}; target <= 5%)"
        )
    by_problem: dict[str, float] = {}
    for r in mine:
        by_problem[r["problem"]] = max(by_problem.get(r["problem"], 0.0), r["gap"])
    over = sorted(p for p, g in by_problem.items() if g > 0.05)
    return (
        f"- tapp: within 5% of the fastest plan on every seed of {len(by_problem) - len(over)}/{len(by_problem)} "
        f"problems (target: all but one); worst {pct(worst['gap'])} ({worst['problem']} seed {worst['seed']})"
    )


def table(rows: list[dict], seeds: list[int]) -> str:
    columns = [("problem", "l"), ("search", "l"), *((f"seed {s}", "r") for s in seeds), ("median s", "r")]
    cells = []
    order = {name: i for i, name in enumerate(problems())}
    keys = sorted({(r["problem"], r["search"]) for r in rows}, key=lambda k: (k[1], order.get(k[0], len(order))))
    for problem, search in keys:
        runs = {r["seed"]: r for r in rows if r["problem"] == problem and r["search"] == search}
        seconds = sorted(r["seconds"] for r in runs.values())
        gaps = [pct(runs[s]["gap"]) if s in runs else "—" for s in seeds]
        cells.append([problem, search, *gaps, f"{seconds[len(seconds) // 2]:.1f}"])
    return markdown(columns, cells)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--search", choices=("rl", "tapp"), action="append")
    parser.add_argument("--only", help="the problems whose name contains this")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("--json", type=Path, help="keep every run here; runs already in it are not repeated")
    args = parser.parse_args()
    searches = args.search or ["rl", "tapp"]
    done = json.loads(args.json.read_text()) if args.json and args.json.exists() else []
    have = {(r["problem"], r["search"], r["seed"]) for r in done}
    chosen = {k: v for k, v in problems().items() if not args.only or args.only in k}
    for name, load in chosen.items():
        problem = None
        for search in searches:
            for seed in args.seeds:
                if (name, search, seed) in have:
                    continue
                problem = problem or load()  # type: ignore[operator]
                r = run_one(name, problem, search, seed)
                print(f"  {name} {search} seed {seed}: gap {pct(r['gap'])}, {r['seconds']:.1f} s", file=sys.stderr)
                done.append(r)
                if args.json:
                    args.json.write_text(json.dumps(done, indent=1))
    rows = [r for r in done if r["problem"] in chosen and r["search"] in searches and r["seed"] in args.seeds]
    print(table(rows, args.seeds))
    print()
    print("\n".join(s for s in (summary(rows, search) for search in searches) if s))


if __name__ == "__main__":
    main()
