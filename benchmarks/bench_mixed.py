"""The exact optimum over mixed stages (docs/exact.md section 9) against the climb (docs/spec.md section 1i):
how far the climb falls short, and what each costs, on random chains of two GPU types within 3x of each
other's speed, at the sizes where the DP runs.

    python benchmarks/bench_mixed.py                 # 2-8 layers, 2-8 units of each type, 30 instances each
    python benchmarks/bench_mixed.py --instances 10  # quicker
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.tables import markdown  # noqa: E402
from heterps_cli.formats import Cluster, Profile  # noqa: E402
from heterps_cli.problem import build_problem  # noqa: E402
from heterps_cli.schedulers import SolveOptions, mixed_optimum, solve  # noqa: E402


def instance(rng: np.random.Generator, n: int, limit: int) -> tuple[dict, dict]:
    """``n`` layers on types ``a`` and ``b`` (``b`` 1-3x slower), ``limit`` units each, micro-batch 8, 4 a step,
    the gradients' all-reduce a tenth of the compute or less; prices so that neither type is free."""
    slow = rng.uniform(1.0, 3.0)
    layers = []
    for i in range(n):
        work = float(rng.uniform(0.05, 1.0))
        times = {
            t: {"oct": work * f, "odt": float(rng.uniform(0.0, 0.1)) * work, "alpha": float(rng.uniform(0.8, 1.0)),
                "beta": 0.0}
            for t, f in (("a", 1.0), ("b", slow))
        }  # fmt: skip
        layers.append({"name": f"l{i}", "type": "fc", "input_size": 1e6, "weight_size": 1e8, "times": times})
    job = {"samples": 1e5, "epochs": 1, "global_batch": 32}
    resources = {t: {"price": float(rng.uniform(0.5, 4.0)), "limit": limit} for t in ("a", "b")}
    return {"model": "m", "batch_size": 8, "job": job, "layers": layers}, {"cluster": "c", "resources": resources}


def one(profile: dict, cluster: dict) -> dict:
    problem = build_problem(Profile.model_validate(profile), Cluster.model_validate(cluster), objective="time")
    options = SolveOptions(mixed_stages=True)
    start = time.perf_counter()
    exact = solve("exact", problem, options=options)
    exact_s = time.perf_counter() - start
    saved, mixed_optimum.MOST_WORK = mixed_optimum.MOST_WORK, 0  # the climb's answer, as past the DP's reach
    try:
        start = time.perf_counter()
        climb = solve("exact", problem, options=options)
        climb_s = time.perf_counter() - start
    finally:
        mixed_optimum.MOST_WORK = saved
    one_type = solve("exact", problem)
    return {
        "exact": exact.throughput,
        "climb": climb.throughput,
        "one_type": one_type.throughput,
        "exact_s": exact_s,
        "climb_s": climb_s,
        "mixes": any(s.joined for s in exact.stages),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--instances", type=int, default=30)
    args = parser.parse_args()
    rows = []
    for n, limit in ((2, 2), (2, 4), (3, 4), (4, 4), (4, 8), (6, 8), (8, 4), (8, 8)):
        rng = np.random.default_rng(n * 100 + limit)
        found = [one(*instance(rng, n, limit)) for _ in range(args.instances)]
        short = [1 - f["climb"] / f["exact"] for f in found]
        rows.append(
            {
                "layers": n,
                "units of each type": limit,
                "instances": len(found),
                "the optimum mixes": sum(f["mixes"] for f in found),
                "over one-type (median, max)": _pair([f["exact"] / f["one_type"] - 1 for f in found]),
                "climb short of it on": sum(s > 1e-9 for s in short),
                "by (median, max)": _pair([s for s in short if s > 1e-9]),
                "DP s (median, max)": _pair([f["exact_s"] for f in found], percent=False),
                "climb s (median, max)": _pair([f["climb_s"] for f in found], percent=False),
            }
        )
    print(markdown([(k, "r") for k in rows[0]], [[str(v) for v in r.values()] for r in rows]))


def _pair(values: list[float], percent: bool = True) -> str:
    if not values:
        return "-"
    med, top = float(np.median(values)), max(values)
    return f"{med:.1%}, {top:.1%}" if percent else f"{med:.2f}, {top:.2f}"


if __name__ == "__main__":
    main()
