"""Snapshots of what ``heterps plan`` answers on every bundled profile x cluster x scheduler (issue 66).

    python benchmarks/snapshots.py --out /tmp/before          # before a refactor (minutes)
    python benchmarks/snapshots.py --out /tmp/after
    python benchmarks/snapshots.py --compare /tmp/before /tmp/after

A refactor that changes no behaviour leaves every file identical: each is one
``plan --json`` and one ``plan --explain`` (the table) of a profile in ``profiles/`` on
a cluster in ``clusters/`` with one scheduler, seed 0, its exit code first. The
seconds a solve took are the only field that differs between two runs of the same
code, so they are blanked, and so are the spaces that padded a table's line to
their width. ``--quick`` gives rl and tapp 10 steps and genetic and random 200
schedules: the same code paths in a fraction of the time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SCHEDULERS = ("exact", "greedy", "genetic", "random", "rl", "tapp")
SECONDS = re.compile(r"(solved in +)[0-9.]+ s")


def answers(profile: Path, cluster: Path, scheduler: str, quick: bool) -> dict[str, str]:
    """The JSON answer and the table with --explain, each with its exit code, the solve's seconds blanked."""
    from typer.testing import CliRunner

    from heterps_cli.cli.app import app

    budget: list[str] = []
    if quick and scheduler in ("genetic", "random"):
        budget = ["--evaluations", "200"]
    elif quick and scheduler in ("rl", "tapp"):
        budget = ["--steps", "10"]
    base = ["plan", str(profile), str(cluster), "-s", scheduler, "--seed", "0", *budget]
    runner = CliRunner()
    out = {}
    for name, extra in (("json", ["--json"]), ("explain", ["--explain"])):
        result = runner.invoke(app, [*base, *extra])
        text = result.output
        if name == "json" and result.exit_code == 0:
            data = json.loads(text)
            data["solve_s"] = None
            text = json.dumps(data, indent=1, sort_keys=True)
        out[name] = f"exit {result.exit_code}\n" + blanked(text)
    return out


def blanked(text: str) -> str:
    """``text`` with a solve's seconds blanked, and the spaces that padded a table's line to the width those
    seconds took."""
    return "\n".join(line.rstrip() for line in SECONDS.sub(r"\1- s", text).splitlines()) + "\n"


def write(folder: Path, quick: bool) -> None:
    """Every snapshot into ``folder``, which must be new or empty (a file left from another run would
    compare as this one's). The files are named relative to the checkout, so that the snapshots of two
    checkouts (a worktree of the commit before, and yours) compare as they are."""
    folder = folder.resolve()
    if folder.exists() and any(folder.iterdir()):
        sys.exit(f"error: {folder} is not empty: give a new folder")
    folder.mkdir(parents=True, exist_ok=True)
    os.chdir(ROOT)
    start = time.perf_counter()
    for profile in sorted(Path("profiles").glob("*.yaml")):
        for cluster in sorted(Path("clusters").glob("*.yaml")):
            for scheduler in SCHEDULERS:
                began = time.perf_counter()
                for name, text in answers(profile, cluster, scheduler, quick).items():
                    (folder / f"{profile.stem}__{cluster.stem}__{scheduler}.{name}").write_text(text)
                print(f"{profile.stem} x {cluster.stem} x {scheduler}: {time.perf_counter() - began:.1f} s", flush=True)
    print(f"wrote {folder} in {time.perf_counter() - start:.0f} s")


def compare(before: Path, after: Path) -> int:
    names = sorted({p.name for p in before.iterdir()} | {p.name for p in after.iterdir()})
    differ = [n for n in names if not (before / n).exists() or not (after / n).exists()]
    differ += [n for n in names if n not in differ and _read(before / n) != _read(after / n)]
    for name in differ:
        print(f"differs: {name}")
    print(f"{len(names) - len(differ)} of {len(names)} snapshots identical")
    return 1 if differ else 0


def _read(path: Path) -> str:
    return blanked(path.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="write the snapshots into this folder")
    parser.add_argument("--quick", action="store_true", help="small search budgets: the same paths, faster")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args()
    if args.compare:
        missing = [str(p) for p in args.compare if not p.is_dir()]
        if missing:
            parser.error(f"--compare: {', '.join(missing)}: no such folder of snapshots (--out FOLDER writes one)")
        sys.exit(compare(*args.compare))
    if args.out is None:
        parser.error("--out FOLDER or --compare BEFORE AFTER")
    write(args.out, args.quick)


if __name__ == "__main__":
    main()
