"""The default `heterps plan` (rl, no --steps, no --time-limit) as a new user runs it: the whole command's
seconds and its plan's gap to the exact optimum, on every bundled profile of at most 16 layers on every
bundled cluster and on the benchmark instances of at most 16 layers, seeds 0-3 (issue 84 item 3).

    python benchmarks/bench_rl_default.py             # every pair, seeds 0-3
    python benchmarks/bench_rl_default.py --seeds 0   # one seed
    python benchmarks/bench_rl_default.py --scheduler tapp   # under objective time, its paper's

Targets: under 10 s a command; within 2% of the optimum on at least 95% of runs, never above 5%.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.tables import markdown  # noqa: E402

MOST_LAYERS = 16


def pairs() -> list[tuple[str, Path, Path]]:
    """(name, profile, cluster): the bundled profiles of at most 16 layers on each bundled cluster they
    run on, then the benchmark instances of at most 16 layers."""
    out = []
    for profile in sorted((ROOT / "profiles").glob("*.yaml")):
        if len(yaml.safe_load(profile.read_text())["layers"]) > MOST_LAYERS:
            continue
        for cluster in sorted((ROOT / "clusters").glob("*.yaml")):
            out.append((f"{profile.stem} on {cluster.stem}", profile, cluster))
    for profile in sorted((ROOT / "benchmarks" / "instances").glob("*.profile.yaml")):
        if len(yaml.safe_load(profile.read_text())["layers"]) <= MOST_LAYERS:
            name = profile.name.removesuffix(".profile.yaml")
            out.append((name, profile, profile.with_name(f"{name}.cluster.yaml")))
    return out


def command(profile: Path, cluster: Path, *more: str) -> tuple[dict | None, float]:
    """``heterps plan --json`` and its wall seconds (None: it found no plan, or the pair does not run)."""
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "heterps_cli", "plan", str(profile), str(cluster), "--json", *more],
        capture_output=True,
        text=True,
    )
    return (json.loads(done.stdout) if done.returncode == 0 else None), time.perf_counter() - start


def _gap(plan: dict, optimum: dict, objective: str) -> float:
    """How much worse than the optimum: the extra cost, or the throughput lost."""
    if objective == "cost":
        return plan["cost_usd"] / optimum["cost_usd"] - 1
    return 1 - plan["throughput"] / optimum["throughput"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("--scheduler", default="rl", choices=["rl", "tapp"])
    parser.add_argument("--objective", choices=["cost", "time"], help="default: cost for rl, time for tapp")
    args = parser.parse_args()
    objective = args.objective or ("time" if args.scheduler == "tapp" else "cost")  # tapp's paper: time
    rows, gaps, seconds = [], [], []
    for name, profile, cluster in pairs():
        optimum, _ = command(profile, cluster, "-s", "exact", "--objective", objective)
        if optimum is None:
            continue  # no plan meets this job on this cluster: nothing to compare
        cells = [name]
        for seed in args.seeds:
            plan, wall = command(profile, cluster, "-s", args.scheduler, "--seed", str(seed), "--objective", objective)
            gap = float("inf") if plan is None else _gap(plan, optimum, objective)
            gaps.append(gap)
            seconds.append(wall)
            cells.append(f"{100 * gap:.2f}% ({wall:.1f} s)")
            print(f"  {name} seed {seed}: {100 * gap:.2f}% in {wall:.1f} s", file=sys.stderr)
        rows.append(cells)
    columns = [("problem", "l"), *((f"seed {s}", "r") for s in args.seeds)]
    print(markdown(columns, rows))
    within = sum(g <= 0.02 for g in gaps)
    print(
        f"\n- {args.scheduler}: within 2% on {within}/{len(gaps)} = {100 * within / len(gaps):.0f}% of runs, worst "
        f"{100 * max(gaps):.2f}%; seconds median {statistics.median(seconds):.1f}, most {max(seconds):.1f}"
    )


if __name__ == "__main__":
    main()
