"""Time the exact solver on generated chains and print a markdown table.

    python benchmarks/bench_exact.py            # 16, 64, 256 layers x 2-4 types
    python benchmarks/bench_exact.py --quick    # 16 and 64 layers only
    python benchmarks/bench_exact.py --hardware # 64 and 256 layers x 3 types with memory, then bandwidth (spec 1b)
    python benchmarks/bench_exact.py --pipeline # 16, 32 and 64 layers x 3 types, 8 micro-batches a step (spec 1d)
    python benchmarks/bench_exact.py --pipeline --docs docs/schedulers/exact.md   # also write it into that page

Targets (issue 2): 64 layers x 3 types under 1 s; 256 layers under 30 s, on 2 cores.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.generate import chain  # noqa: E402
from benchmarks.tables import markdown, write_into  # noqa: E402
from benchmarks.verdicts import worst_times  # noqa: E402
from heterps_cli.errors import InfeasibleError, TooLarge  # noqa: E402
from heterps_cli.formats import Cluster, Profile  # noqa: E402
from heterps_cli.problem import build_problem  # noqa: E402
from heterps_cli.schedulers import exact  # noqa: E402


def problem_for(profile: dict, cluster: dict, objective: str):
    return build_problem(Profile.model_validate(profile), Cluster.model_validate(cluster), objective=objective)


def run(
    sizes=(16, 64, 256), types=(2, 3, 4), repeats: int = 3, hardware: str | None = None, micro_batches: int = 0
) -> list[dict]:
    rows = []
    for n in sizes:
        for T in types:
            for tight in (False, True):
                for objective in ("cost", "time"):
                    profile, cluster = chain(n, T, seed=0, tight=tight, hardware=hardware)
                    if micro_batches:
                        profile["job"]["global_batch"] = micro_batches * profile["batch_size"]
                    problem = problem_for(profile, cluster, objective)
                    times, plan, dps, refused = [], None, 0, False
                    for _ in range(repeats if n < 256 else 1):
                        calls = []
                        start = time.perf_counter()
                        try:
                            plan = exact.solve(problem, progress=lambda text, *_, calls=calls: calls.append(text))
                        except InfeasibleError:
                            plan = None
                        except TooLarge:  # more stage cells than the solver may hold
                            plan, refused = None, True
                        times.append(time.perf_counter() - start)
                        dps = len(calls)
                    binding = plan is not None and any(plan.resources[t] == plan.limits[t] for t in plan.resources)
                    rows.append(
                        {
                            "layers": n,
                            "types": T,
                            "limits": ("tight" if tight else "loose") + (f", {hardware}" if hardware else ""),
                            "objective": objective,
                            "seconds": min(times),
                            "dps": dps,
                            "stages": len(plan.stages) if plan else 0,
                            "binding": binding,
                            "cost": plan.cost_usd if plan else None,
                            "refused": refused,
                        }
                    )
                    r = rows[-1]
                    print(
                        f"  {n:>4} layers x {T} types, {r['limits']:5} limits, {objective}: {r['seconds']:.3f} s",
                        file=sys.stderr,
                        flush=True,
                    )
    return rows


COLUMNS = [
    ("layers", "r"),
    ("types", "r"),
    ("limits", "l"),
    ("objective", "l"),
    ("exact s", "r"),
    ("cheapest-plan DPs", "r"),
    ("stages", "r"),
    ("a limit binds", "l"),
    ("cost $", "r"),
]


def table(rows: list[dict]) -> str:
    cells = []
    for r in rows:
        cost = f"{r['cost']:.2f}" if r["cost"] is not None else "refused" if r["refused"] else "infeasible"
        cells.append(
            [str(r["layers"]), str(r["types"]), r["limits"], r["objective"], f"{r['seconds']:.3f}", str(r["dps"])]
            + [str(r["stages"]), "yes" if r["binding"] else "no", cost]
        )
    return markdown(COLUMNS, cells)


def targets(rows: list[dict]) -> str:
    return worst_times(
        rows,
        [
            ("64 layers x 3 types", lambda r: r["layers"] == 64 and r["types"] == 3, 1.0),
            ("256 layers", lambda r: r["layers"] == 256, 30.0),
        ],
    )


if __name__ == "__main__":
    sizes = (16, 64) if "--quick" in sys.argv else (16, 64, 256)
    if "--pipeline" in sys.argv:
        rows = run((16, 32, 64), (3,), repeats=1, micro_batches=8)
    elif "--hardware" in sys.argv:
        rows = run((64, 256), (3,), hardware="memory") + run((64, 256), (3,), hardware="bandwidth")
    else:
        rows = run(sizes)
    print(table(rows))
    print()
    print(targets(rows))
    if "--docs" in sys.argv:
        write_into(Path(sys.argv[sys.argv.index("--docs") + 1]), "bench_exact.py", table(rows))
