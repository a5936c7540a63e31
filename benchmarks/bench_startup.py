"""Start-up time of the ``heterps`` command: the median wall time of fresh processes.

    python benchmarks/bench_startup.py          # 10 processes per command
    python benchmarks/bench_startup.py --runs 3

Targets (issue 12), on 2 cores: ``heterps --help`` and ``heterps validate`` on a
bundled profile under 0.5 s; ``heterps plan --scheduler exact`` on ctr under 1 s.
Each process is the installed console script, so the time includes Python's own
start, the imports, the work and the output, as a user waits for them.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.tables import header, row  # noqa: E402

COMMANDS = [
    ("heterps --help", ["--help"], 0.5),
    ("heterps validate profiles/ctr.yaml", ["validate", "profiles/ctr.yaml"], 0.5),
    (
        "heterps validate profiles/vgg16.yaml clusters/three-type.yaml",
        ["validate", "profiles/vgg16.yaml", "clusters/three-type.yaml"],
        0.5,
    ),
    (
        "heterps plan profiles/ctr.yaml clusters/paper.yaml --scheduler exact",
        ["plan", "profiles/ctr.yaml", "clusters/paper.yaml", "--scheduler", "exact"],
        1.0,
    ),
]


def measure(args: list[str], runs: int) -> list[float]:
    exe = shutil.which("heterps")
    command = [exe] if exe else [sys.executable, "-m", "heterps_cli"]
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(command + args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    runs = parser.parse_args().runs
    print(
        header([("command", "l"), ("median s", "r"), ("min s", "r"), ("max s", "r"), ("target s", "r"), ("met", "l")])
    )
    for shown, args, target in COMMANDS:
        times = measure(args, runs)
        median = statistics.median(times)
        cells = [f"`{shown}`", f"{median:.3f}", f"{min(times):.3f}", f"{max(times):.3f}", f"{target:g}"]
        print(row([*cells, "yes" if median < target else "NO"]))


if __name__ == "__main__":
    main()
