"""Issue 64's benchmark: how long the whole ``heterps plan`` command takes on the peer planner's problems in
the grown space, and how close the seeds' schedulers come to the certified optimum there.

    python benchmarks/bench_planning.py              # exact, mixed and frontier rows (under a minute)
    python benchmarks/bench_planning.py --seeds 0-3  # also rl (the default) and tapp at each seed (long)
    python benchmarks/bench_planning.py --keep DIR   # keep the profile and clusters it writes
    python benchmarks/bench_planning.py --repeat 3   # each exact and frontier row the median of 3 runs
    python benchmarks/bench_planning.py --baseline DIR  # also time another checkout's commands, alternately
    python benchmarks/bench_planning.py --resolution 0.02  # also --mixed-stages frontiers within 2%

The problems come from the shared GPT-Neo-2.7B data as ``bench_sailor_plans.py`` builds them: the
profile whose unit is one GPU with every layer's times at tp 1, 2 and 4 and forward times (so every
degree, recomputation and every micro-batch the profile measured are offered), on GH200 nodes of four
GPUs (8-64 nodes), and on the mixed clusters of issue 63 (A100-40 + V100-16 nodes, GH200 + A100-40) with
``--mixed-stages`` at global batch 2,048. Each row times the whole command (a new process: imports, reading
the files, the search, writing JSON), as a user waits for it.

This machine's speed wanders (two to three times slower on some days than on others), so a figure is
comparable with another day's only beside a fixed reference: ``--baseline DIR`` runs each exact and
frontier command of a checkout of other code (``git worktree add DIR a0cf5a3``, the code whose rows
docs/benchmarks.md gives for 2026-11-27) alternately with this one's, and prints both.

Targets (issue 64): the exact plan under 1 s at 64 GH200 nodes with every choice offered, under 3 s with
mixed stages on 64 + 64 nodes of two types, ``heterps frontier`` on the same under 30 s; rl within 2% of
the certified optimum on 95% of runs (never above 5%), tapp within 5%.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_fidelity_gpu import measured_reserved  # noqa: E402
from benchmarks.bench_sailor_plans import (  # noqa: E402
    MIXED_BATCH,
    cluster_of,
    nodes_cluster,
    profile_every_tp,
    shape,
)
from benchmarks.tables import header, row  # noqa: E402

GH200_NODES = (8, 16, 32, 64)
MIXED = (
    ("a100_40 x8 + v100 x8", {"a100_40": 8, "v100": 8}),
    ("a100_40 x32 + v100 x32", {"a100_40": 32, "v100": 32}),
    ("a100_40 x64 + v100 x64", {"a100_40": 64, "v100": 64}),
    ("gh200 x8 + a100_40 x8", {"gh200": 8, "a100_40": 8}),
)


def command(*args: str, timeout: float = 3600, repeat: int = 1, where: Path | None = None) -> tuple[dict, float]:
    """``heterps ARGS --json`` in a new process (of the checkout at ``where``; None: this one): its JSON
    (or its error, where it answers none or refuses) and its wall time, the median of ``repeat`` runs."""
    walls = []
    env = None if where is None else {**os.environ, "PYTHONPATH": str(where)}
    for _ in range(repeat):
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "heterps_cli", *args, "--json"],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=where,
            env=env,
        )
        walls.append(time.perf_counter() - start)
        if done.returncode not in (0, 2, 3):
            raise SystemExit(f"heterps {' '.join(args)} failed:\n{done.stderr}")
    found = json.loads(done.stdout) if done.returncode == 0 else {"error": done.stderr.strip()}
    return found, statistics.median(walls)


def beside(*args: str, repeat: int, baseline: Path | None) -> tuple[dict, float, str]:
    """:func:`command` here, and with a ``baseline`` checkout also there, alternately (its median wall
    time as a column: "" without one)."""
    if baseline is None:
        found, wall = command(*args, repeat=repeat)
        return found, wall, ""
    walls, others = [], []
    for _ in range(repeat):
        found, wall = command(*args)
        walls.append(wall)
        others.append(command(*args, where=baseline)[1])
    return found, statistics.median(walls), f"{statistics.median(others):.2f}"


def seeds_of(text: str) -> list[int]:
    first, _, last = text.partition("-")
    return list(range(int(first), int(last or first) + 1))


def problems(folder: Path) -> list[tuple[str, Path, Path, tuple[str, ...]]]:
    """(name, profile, cluster, extra plan options) for every row, its files written into ``folder``."""
    profile, entries = profile_every_tp(measured_reserved())
    path = folder / "gpt-neo-2.7b-tp124.yaml"
    path.write_text(yaml.safe_dump(profile, sort_keys=False))
    out = []
    for n in GH200_NODES:
        cluster = nodes_cluster(f"gh200 x{n}", {"gh200": n}, entries)
        where = folder / f"{cluster['cluster']}.yaml"
        where.write_text(yaml.safe_dump(cluster, sort_keys=False))
        out.append((f"gh200 x{n} nodes", path, where, ()))
    for name, nodes in MIXED:
        cluster = cluster_of(name, nodes, entries, 1)
        where = folder / f"{cluster['cluster']}.yaml"
        where.write_text(yaml.safe_dump(cluster, sort_keys=False))
        out.append((name, path, where, ("--global-batch", str(MIXED_BATCH), "--mixed-stages")))
    return out


def exact_rows(rows, repeat: int = 1, baseline: Path | None = None) -> dict:
    """The exact plan of every problem: its figures, its certificate and the command's time."""
    columns = ["problem", "samples/s", "certified", "plan", "command s"] + (["baseline s"] if baseline else [])
    print(header([(c, "l") for c in columns]))
    found = {}
    for name, profile, cluster, extra in rows:
        args = ("plan", str(profile), str(cluster), "-s", "exact", "--objective", "time", *extra)
        plan, wall, other = beside(*args, repeat=repeat, baseline=baseline)
        found[name] = plan
        times = [f"{wall:.2f}"] + ([other] if baseline else [])
        if "error" in plan:
            print(row([name, "none fits", "—", " ".join(plan["error"].split())[:100], *times]))
            continue
        proof = "optimal" if plan.get("optimal") else f"within {100 * (plan.get('gap') or 0):.1f}%"
        print(row([name, f"{plan['throughput']:,.1f}", proof, shape(plan), *times]))
    return found


def frontier_rows(rows, repeat: int = 1, baseline: Path | None = None, resolution: float | None = None) -> None:
    """``heterps frontier`` on 64 GH200 nodes; with a ``resolution``, also ``--mixed-stages`` on the two-type
    clusters within it: past the exact DP over mixed stages, the one-type frontier climbed, whose exact walk
    does not end in minutes there."""
    print()
    columns = ["problem", "frontier points", "up to samples/s", "command s"] + (["baseline s"] if baseline else [])
    print(header([(c, "l") for c in columns]))
    asked = []  # (row name, the command's arguments, whether the baseline runs it too)
    for name, profile, cluster, extra in rows:
        if name == f"gh200 x{GH200_NODES[-1]} nodes":
            asked.append((name, (str(profile), str(cluster), *extra), True))
        if resolution is not None and "--mixed-stages" in extra:
            args = (str(profile), str(cluster), *extra, "--resolution", str(resolution))
            asked.append((f"{name}, --mixed-stages within {resolution:g}", args, False))  # older code has no option
    for name, args, both in asked:
        found, wall, other = beside("frontier", *args, repeat=repeat, baseline=baseline if both else None)
        if "error" in found:
            points, fastest = " ".join(found["error"].split())[:100], "—"
        else:
            points, fastest = str(len(found["plans"])), f"{found['plans'][-1]['throughput']:,.1f}"
        print(row([name, points, fastest, f"{wall:.2f}"] + ([other or "—"] if baseline else [])))


def scheduler_rows(rows, exact: dict, seeds: list[int]) -> None:
    """rl (the default) and tapp at each seed against the exact plan's throughput (a lower bound on the
    optimum, and the optimum where it is certified)."""
    print()
    print(header([(c, "l") for c in ("problem", "scheduler", "seed", "samples/s", "short of exact", "command s")]))
    for name, profile, cluster, extra in rows:
        best = exact[name].get("throughput")
        for scheduler in ("rl", "tapp"):
            for seed in seeds:
                args = ("-s", scheduler, "--seed", str(seed), "--objective", "time", *extra)
                plan, wall = command("plan", str(profile), str(cluster), *args)
                thr = plan.get("throughput")
                short = f"{100 * (1 - thr / best):.1f}%" if thr and best else "—"
                print(row([name, scheduler, str(seed), f"{thr:,.1f}" if thr else "none", short, f"{wall:.2f}"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keep", type=Path, help="keep the profile and clusters in this folder")
    parser.add_argument("--seeds", help="also run rl and tapp at these seeds, e.g. 0-3")
    parser.add_argument("--repeat", type=int, default=1, help="time each exact and frontier row N times (median)")
    parser.add_argument("--baseline", type=Path, help="a checkout of other code, timed alternately with this one")
    parser.add_argument("--resolution", type=float, help="also --mixed-stages frontiers within this fraction")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.keep or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        rows = problems(folder)
        exact = exact_rows(rows, args.repeat, args.baseline)
        frontier_rows(rows, args.repeat, args.baseline, args.resolution)
        if args.seeds:
            scheduler_rows(rows, exact, seeds_of(args.seeds))


if __name__ == "__main__":
    main()
