"""Warm start: does a saved policy plan a slightly changed model in fewer steps than a fresh one?

    python benchmarks/bench_warmstart.py

For each instance: train a policy on the model and save it; then change the
model slightly (one more layer, and 10% slower compute on a few layers) and
plan it twice, cold and warm-started from the saved policy, with the same seed.
The table gives the steps each needed for the best plan its policy sampled
(not the pre-training pool, not the final polish) to come within the gap the
cold run's policy ends with, and both gaps.
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.make_instances import paths  # noqa: E402
from benchmarks.tables import header  # noqa: E402
from benchmarks.tables import row as table_row  # noqa: E402
from heterps_cli.problem import load_problem  # noqa: E402
from heterps_cli.schedulers import RLOptions, exact, rl  # noqa: E402

INSTANCES = ("chain16x3", "chain32x2", "chain32x3", "chain64x2")
STEPS = 150


def changed(profile_path: Path, out: Path, seed: int = 0) -> Path:
    """The same model with its last layer duplicated and 3 layers' compute 10% slower."""
    data = yaml.safe_load(profile_path.read_text())
    rng = np.random.default_rng(seed)
    extra = copy.deepcopy(data["layers"][-1])
    extra["name"] = extra["name"] + "_b"
    data["layers"].append(extra)
    for i in rng.choice(len(data["layers"]), 3, replace=False):
        for entry in data["layers"][i]["times"].values():
            entry["oct"] = entry["oct"] * 1.1
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def curve(problem, options, seed: int) -> list[float]:
    best: list[float] = []
    rl.solve(problem, seed=seed, options=options, on_step=lambda step, key: best.append(key))
    return best


def steps_to(curve_: list[float], goal: float) -> int | None:
    return next((i + 1 for i, v in enumerate(curve_) if v <= goal * (1 + 1e-9)), None)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=3, help="plan each changed model with this many seeds")
    parser.add_argument("--only", help="run the instances whose name contains this")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in [n for n in INSTANCES if not args.only or args.only in n]:
            profile, cluster = paths(name)
            policy = Path(tmp) / f"{name}.pt"
            rl.solve(
                load_problem(str(profile), str(cluster)), seed=0, options=RLOptions(steps=STEPS, policy_out=policy)
            )
            new = load_problem(str(changed(profile, Path(tmp) / f"{name}.yaml")), str(cluster))
            optimum = exact.solve(new).cost_usd
            for seed in range(args.seeds):
                cold = curve(new, RLOptions(steps=STEPS), seed)
                warm = curve(new, RLOptions(steps=STEPS, policy_in=policy), seed)
                goal = cold[-1]
                row = (
                    name,
                    seed,
                    optimum,
                    cold[-1] / optimum - 1,
                    warm[-1] / optimum - 1,
                    steps_to(cold, goal),
                    steps_to(warm, goal),
                )
                rows.append(row)
                print(f"  {name} seed {seed}: cold {row[5]} steps, warm {row[6]}", file=sys.stderr, flush=True)
    numbers = ("seed", "optimum $", "cold gap", "warm gap", "cold steps to cold's final gap", "warm steps to it")
    print(header([("changed model", "l"), *((name, "r") for name in numbers)]))
    for name, seed, opt, gc, gw, sc, sw in rows:
        cells = [f"{name} +1 layer", str(seed), f"{opt:.2f}", f"{100 * gc:.2f}%", f"{100 * gw:.2f}%", str(sc)]
        print(table_row([*cells, str(sw) if sw is not None else "not reached"]))
    fewer = sum(sw is not None and sw < sc for *_, sc, sw in rows)
    print(
        f"\nwarm reached the cold run's final gap in fewer steps on {fewer}/{len(rows)} runs; "
        f"median steps cold {np.median([r[5] for r in rows]):.0f}, "
        f"warm {np.median([r[6] if r[6] is not None else STEPS + 1 for r in rows]):.0f}"
    )


if __name__ == "__main__":
    main()
