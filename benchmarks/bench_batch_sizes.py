"""Profiles of many batch sizes (docs/spec.md section 1f): a plan's wall time against its budget, and the
time to read the file.

    python benchmarks/bench_batch_sizes.py          # the cases below (about 6 minutes on 2 cores)
    python benchmarks/bench_batch_sizes.py --json

Each profile is a bundled one with times at every batch size from 1 to ``sizes`` (each a share of the
profile's own, by its Amdahl terms), and a global batch of 720,720 (240 divisors, 107 of them sizes
such a profile measures), so a plan chooses among a hundred micro-batches. Each run is a fresh
``heterps plan`` process measured by GNU time (wall seconds and peak resident memory, reading the
files included). The bar (issue 62): every scheduler within its time limit (the guard where none is
given, schedulers.guard_time_limit: without a limit a search's budget is a count of steps) + 10% + 2 s,
whatever the file; reading is part of the time.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_scale import held  # noqa: E402
from benchmarks.tables import markdown  # noqa: E402

GLOBAL_BATCH = 720_720
# profile, batch sizes 1..N, cluster, scheduler, --time-limit (None: the default count, and the guard)
CASES = [
    ("ctr", 1343, "paper", "rl", None),
    ("ctr", 1343, "paper", "exact", 10),
    ("ctr", 1343, "aws-p3-nodes", "exact", 10),
    ("transformer", 1342, "three-type-hardware", "exact", 10),
    ("transformer", 1342, "three-type-hardware", "greedy", 10),
]


def many_sizes(name: str, sizes: int, folder: Path) -> Path:
    """The bundled profile ``name`` with times at batch sizes 1 to ``sizes``."""
    path = folder / f"{name}-{sizes}.yaml"
    if path.exists():
        return path
    profile = yaml.safe_load((ROOT / "profiles" / f"{name}.yaml").read_text())
    B0 = profile["batch_size"]
    for layer in profile["layers"]:
        for entry in layer["times"].values():
            a = entry.get("alpha", layer.get("alpha", 0.9))
            shares = {b: float(entry["oct"]) * (1 - a + a * b / B0) for b in range(1, sizes + 1) if b != B0}
            entry["batches"] = {b: {"oct": max(oct_, 1e-9), "odt": entry["odt"]} for b, oct_ in shares.items()}
    profile["job"]["global_batch"] = GLOBAL_BATCH
    path.write_text(yaml.safe_dump(profile, sort_keys=False))
    return path


def read_seconds(path: Path) -> float:
    from heterps_cli.yamlio import load_yaml

    start = time.perf_counter()
    load_yaml(path)
    return time.perf_counter() - start


def run(case, folder: Path) -> dict:
    from heterps_cli.schedulers import guard_time_limit

    name, sizes, cluster, scheduler, limit = case
    profile = many_sizes(name, sizes, folder)
    command = ["heterps", "plan", str(profile), str(ROOT / "clusters" / f"{cluster}.yaml"), "-s", scheduler]
    command += ["--json", *(["--time-limit", str(limit)] if limit is not None else [])]
    done = subprocess.run(["/usr/bin/time", "-f", "%e %M", *command], capture_output=True, text=True, timeout=1800)
    wall, kb = done.stderr.strip().splitlines()[-1].split()
    layers = len(yaml.safe_load((ROOT / "profiles" / f"{name}.yaml").read_text())["layers"])
    budget = limit if limit is not None else guard_time_limit(layers)
    row = {"profile": f"{name} × {sizes:,} sizes", "mb": profile.stat().st_size / 1e6, "cluster": cluster}
    row |= {"scheduler": scheduler, "limit": limit, "budget": budget, "seconds": float(wall)}
    row |= {"peak_mb": int(kb) / 1024, "exit": done.returncode, "read_s": read_seconds(profile)}
    if done.returncode == 0:
        plan = json.loads(done.stdout)
        row |= {"solve_s": plan["solve_s"], "optimal": plan["optimal"], "batch": plan["batch_size"]}
        row["unasked"] = sum(note.count("not asked") for note in plan["notes"])
    print(f"  {row['profile']:28} {scheduler:7} {row['seconds']:7.1f} s of {budget:g}", file=sys.stderr)
    return row


COLUMNS = [("profile", "l"), ("MB", "r"), ("cluster", "l"), ("scheduler", "l"), ("limit s", "r")]
COLUMNS += [("wall s", "r"), ("within + 10% + 2 s", "l"), ("reading s", "r"), ("peak MB", "r")]
COLUMNS += [("micro-batches not asked", "r")]


def table(rows: list[dict]) -> str:
    cells = []
    for r in rows:
        limit = f"{r['limit']:g}" if r["limit"] is not None else f"{r['budget']:g} (guard)"
        within = "yes" if held(r["seconds"], r["budget"]) else "**no**"
        cells.append(
            [r["profile"], f"{r['mb']:.1f}", r["cluster"], r["scheduler"], limit, f"{r['seconds']:.1f}", within]
            + [f"{r['read_s']:.1f}", f"{r['peak_mb']:,.0f}", str(r.get("unasked", f"exit {r['exit']}"))]
        )
    return markdown(COLUMNS, cells)


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        rows = [run(case, Path(tmp)) for case in CASES]
    print(json.dumps(rows, indent=2) if "--json" in sys.argv else table(rows))
