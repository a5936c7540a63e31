"""Time the exact solver over rentals of whole nodes (docs/spec.md section 1e) and print a markdown table.

    python benchmarks/bench_nodes.py                          # 16 and 64 layers x 3 types, 4 node kinds
    python benchmarks/bench_nodes.py --docs docs/exact.md     # also write the table into that page

The chains are benchmarks/generate.py's (cpu, v100, a100 at its per-unit prices). Their units come
in four node kinds shaped like cloud instances: 36 CPU cores; 4 V100 with 16 cores; 8 V100 with 32
cores; 8 A100 with 48 cores; each priced at its units' prices, and as many available as the
generated limits allow (tight: fewer GPUs). With links, the GPU kinds give their GPUs' NVLink
(V100 1,200 Gbit/s, A100 2,400 Gbit/s one way, heterps_cli/instances.yaml's figures): a type that
one node of a rental holds all-reduces over it (docs/spec.md section 1e). Target (issue 35): 64
layers x 3 types, 4 node kinds, under 5 s on 2 cores.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.generate import chain  # noqa: E402
from benchmarks.tables import markdown, write_into  # noqa: E402
from heterps_cli.errors import InfeasibleError  # noqa: E402
from heterps_cli.formats import Cluster, Profile  # noqa: E402
from heterps_cli.problem import build_problem  # noqa: E402
from heterps_cli.schedulers import exact  # noqa: E402

KINDS = {  # name: units
    "cpu36": {"cpu": 36},
    "v100x4": {"v100": 4, "cpu": 16},
    "v100x8": {"v100": 8, "cpu": 32},
    "a100x8": {"a100": 8, "cpu": 48},
}
LINKS = {"v100x4": {"v100": 1200}, "v100x8": {"v100": 1200}, "a100x8": {"a100": 2400}}  # Gbit/s, one way


def with_nodes(cluster: dict, links: bool = False) -> dict:
    """The generated cluster's types, their units in :data:`KINDS` (at the types' prices), as many
    nodes of each as the types' limits allow (at least one); ``links``: the GPU kinds' :data:`LINKS`."""
    resources = cluster["resources"]
    nodes = {}
    for name, units in KINDS.items():
        price = sum(resources[t]["price"] * n for t, n in units.items())
        main = next(iter(units))
        available = max(1, resources[main]["limit"] // units[main])
        nodes[name] = {"price": round(price, 4), "units": units, "available": int(available)}
        if links and name in LINKS:
            nodes[name]["link_gbps"] = LINKS[name]
    return {
        "cluster": cluster["cluster"] + "-nodes",
        "resources": {t: {} for t in resources},
        "nodes": nodes,
    }


def run(sizes=(16, 64), repeats: int = 3) -> list[dict]:
    rows = []
    for n, links in ((n, links) for n in sizes for links in (False, True)):
        for tight in (False, True):
            for objective in ("cost", "time"):
                profile, cluster = chain(n, 3, seed=0, tight=tight)
                nodes = with_nodes(cluster, links)
                problem = build_problem(
                    Profile.model_validate(profile), Cluster.model_validate(nodes), objective=objective
                )
                times, plan = [], None
                for _ in range(repeats):
                    start = time.perf_counter()
                    try:
                        plan = exact.solve(problem)
                    except InfeasibleError:
                        plan = None
                    times.append(time.perf_counter() - start)
                rows.append(
                    {
                        "layers": n,
                        "links": "NVLink" if links else "none",
                        "limits": "tight" if tight else "loose",
                        "objective": objective,
                        "seconds": min(times),
                        "rentals": len(problem.nodes.menu.rate) if problem.nodes is not None else 0,
                        "asked": plan.notes[0].split(" rentals")[0] if plan is not None else "—",
                        "rental": ", ".join(f"{k}×{v}" for k, v in (plan.rental or {}).items()) if plan else "none",
                        "cost": plan.cost_usd if plan is not None else math.nan,
                    }
                )
                print(
                    f"  {n} layers, links {rows[-1]['links']}, {rows[-1]['limits']}, {objective}: "
                    f"{rows[-1]['seconds']:.2f} s",
                    file=sys.stderr,
                )
    return rows


COLUMNS = [
    ("layers", "r"),
    ("links", "l"),
    ("limits", "l"),
    ("objective", "l"),
    ("seconds", "r"),
    ("rentals on the menu", "r"),
    ("asked", "r"),
    ("rents", "l"),
    ("cost $", "r"),
]


def table(rows: list[dict]) -> str:
    cells = [
        [str(r["layers"]), r["links"], r["limits"], r["objective"], f"{r['seconds']:.2f}", f"{r['rentals']:,}"]
        + [r["asked"]]
        + [r["rental"], f"{r['cost']:.2f}"]
        for r in rows
    ]
    return markdown(COLUMNS, cells)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs per row; the fastest is shown")
    parser.add_argument("--docs", type=Path, help="write the table into this page, between the benchmark's markers")
    args = parser.parse_args()
    rows = run(repeats=args.repeats)
    worst = max(r["seconds"] for r in rows if r["layers"] == 64)
    text = f"{table(rows)}\n\n64 layers x 3 types, 4 node kinds: worst {worst:.2f} s (target < 5 s)"
    print(text)
    if args.docs:
        write_into(args.docs, "bench_nodes.py", text)


if __name__ == "__main__":
    main()
