"""Every scheduler on every bundled profile and cluster, against the exact optimum (docs/spec.md section 1's
plan space: whole samples, several stages per type).

    python benchmarks/bench_bundled.py                      # all five searches (minutes: rl and tapp train)
    python benchmarks/bench_bundled.py --only greedy,genetic

Per pair: the exact optimum, and each search's gap to it (cost under objective cost; throughput under
objective time, tapp's); a plan whose stage has more replicas than its batch has samples, or a
search that finds no plan where exact does, is counted. vgg16-aws plans with ``--samples 1000000
--global-batch 1024``, as its example does.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.tables import markdown  # noqa: E402
from heterps_cli.errors import InfeasibleError  # noqa: E402
from heterps_cli.formats import Job  # noqa: E402
from heterps_cli.objective import Objective  # noqa: E402
from heterps_cli.schedulers import solve  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PROFILES = ("ctr", "transformer", "vgg16", "vgg16-aws")
CLUSTERS = (
    "paper",
    "paper-hardware",
    "three-type",
    "three-type-hardware",
    "workstation",
    "aws-p3-nodes",
    "aws-catalogue",
)
SEARCHES = ("rl", "tapp", "genetic", "greedy", "random")


def problem_of(profile: str, cluster: str, objective: Objective):
    from heterps_cli.api import _problem

    job = Job(objective=objective, samples=1e6, global_batch=1024) if profile == "vgg16-aws" else Job(objective)
    return _problem(job, str(ROOT / f"profiles/{profile}.yaml"), str(ROOT / f"clusters/{cluster}.yaml"))


def gap(plan, best, objective: Objective) -> float:
    if objective is Objective.TIME:
        return 1 - plan.throughput / best.throughput
    return plan.cost_usd / best.cost_usd - 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="comma-separated searches (default: all five)")
    args = parser.parse_args()
    searches = args.only.split(",") if args.only else list(SEARCHES)
    rows, worst = [], {s: 0.0 for s in searches}
    for profile in PROFILES:
        for cluster in CLUSTERS:
            row = [profile, cluster]
            for name in ["exact", *searches]:
                objective = Objective.TIME if name == "tapp" else Objective.COST
                try:
                    problem = problem_of(profile, cluster, objective)
                except Exception as exc:  # a pair the files do not make (types that do not meet)
                    row.append(f"- ({type(exc).__name__})")
                    break
                start = time.perf_counter()
                try:
                    plan = solve(name, problem, seed=0)
                except InfeasibleError:
                    row.append("infeasible")
                    continue
                over = sum(s.replicas > problem.batch_size for s in plan.stages)
                if name == "exact":
                    best = {Objective.COST: plan}
                    row.append(f"${plan.cost_usd:.4g} ({len(plan.stages)} stages)")
                    continue
                if objective not in best:
                    best[objective] = solve("exact", problem)
                g = gap(plan, best[objective], objective)
                worst[name] = max(worst[name], g)
                row.append(f"{100 * g:+.1f}%{' OVER' if over else ''} ({time.perf_counter() - start:.1f} s)")
            rows.append(row)
            print(" | ".join(row), file=sys.stderr, flush=True)
    columns = [("profile", "l"), ("cluster", "l"), ("exact", "r")] + [(s, "r") for s in searches]
    print(markdown(columns, rows))
    print("\nworst gap to exact: " + ", ".join(f"{s} {100 * w:.1f}%" for s, w in worst.items()))


if __name__ == "__main__":
    main()
