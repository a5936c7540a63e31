"""Predicted against measured on this machine: plan a zoo model from its measured profile, run the plan, compare.

    python benchmarks/bench_fidelity.py                  # every row: mlp at 64 and 256, vgg16 at 64
    python benchmarks/bench_fidelity.py --only mlp --rounds 1
    python benchmarks/bench_fidelity.py --docs docs/fidelity.md   # also write the table into that page
    python benchmarks/bench_fidelity.py --device cuda              # on one GPU (the "GPU, here" table)

Each model is profiled here with ``heterps profile`` on the CPU twice, as
resource types ``cpu`` (price 1) and ``cpu2`` (price 1.5), one thread per unit,
and the two profiles merged; each measures its own link, with its latencies
(the guide's way; ``--alone``: the one loopback bandwidth measured first, and
no latencies). The cluster gives both types that loopback bandwidth for the
stage boundary. Every plan has a global batch of
``MICRO_BATCHES`` micro-batches (docs/spec.md section 1d) and objective time,
planned by the exact solver on one of two clusters:

* data-parallel: two ``cpu`` units and no ``cpu2``, so one stage whose replicas
  split each micro-batch and all-reduce their gradients once per step;
* two stages: one unit of each type, so a two-stage 1F1B pipeline.

With ``--device cuda`` each model is profiled once on the GPU as type ``gpu``
(``heterps profile --device cuda``) and planned on a cluster of that one GPU
(one stage, one replica), run with ``--map gpu=cuda``: it checks the profile's
compute and memory against a training step on the same GPU. One GPU cannot
check replicas or their NCCL all-reduce (two ranks on one GPU are refused).

Each plan runs ``--rounds`` times with ``heterps run`` (fresh processes each
round); a row shows the median round. With ``--profiles N`` the model is
profiled N times, each profile planned and its plans run ``--rounds`` times in
turn, so that the profiles and the runs sample the machine's slow and fast
spells alike (this machine drifts between them: docs/fidelity.md); a row is
then the median over every profile's rounds, and shows the range of the
profiles' predictions.

Memory: the plan's per-replica figure against what the training added to a
replica's process (peak resident memory less what the process held before its
model was built: the interpreter, torch and the process group, the part
``memory_reserved_gb`` stands for). Target: throughput within 15% on every row.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.tables import markdown, write_into  # noqa: E402
from heterps_cli.profiling.links import loopback_allreduce_bandwidth  # noqa: E402

ROWS = [("mlp", 64), ("mlp", 256), ("vgg16", 64)]  # the zoo's chain models, at the micro-batch to profile and run at
MICRO_BATCHES = 8
PLANS = {"data-parallel": {"cpu": 2}, "two stages": {"cpu": 1, "cpu2": 1}}
PRICES = {"cpu": 1.0, "cpu2": 1.5}
GPU_PLANS = {"one GPU": {"gpu": 1}}
# On a GPU also at batches that keep it busy: at 64 these models wait on the CPU's kernel launches.
GPU_ROWS = [("mlp", 64), ("mlp", 4096), ("vgg16", 64), ("vgg16", 1024)]
UNITS = 2  # every plan here runs two processes, one per core of this machine


def heterps(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "heterps_cli", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"heterps {' '.join(args)} failed:\n{done.stderr}")
    return done.stdout


def profile_gpu(model: str, batch: int, tmp: Path) -> Path:
    path = tmp / f"{Path(model).name.replace(':', '-')}-{batch}.yaml"
    heterps("profile", model, "--device", "cuda", "--as", "gpu", "--batch-size", str(batch), "--out", str(path))
    return path


def profile(model: str, batch: int, tmp: Path, gbps: float, concurrent: bool) -> Path:
    """The model measured as cpu and as cpu2, merged into one profile; with ``concurrent``, on both cores at
    once, four profiles in two waves (``--concurrent 2 --processes 4``), as every plan here runs: two
    processes, one per core. With ``concurrent`` each measures its own link, as the guide's command does
    (its latencies, section 1d's fixed costs, come only with a measured link, and the all-reduce's is then
    timed as replicas pay it); alone, the link is ``gbps``, measured once."""
    busy = ["--concurrent", str(UNITS), "--processes", str(2 * UNITS)] if concurrent else []
    link = [] if concurrent else ["--link-gbps", f"{gbps:.4g}"]
    paths = []
    for resource in PRICES:
        path = tmp / f"{model}-{batch}-{resource}.yaml"
        heterps("profile", model, "--as", resource, "--batch-size", str(batch), "--out", str(path),
                *link, *busy)  # fmt: skip
        paths.append(str(path))
    merged = tmp / f"{model}-{batch}.yaml"
    heterps("profile", "merge", *paths, "--out", str(merged))
    return merged


def plan(merged: Path, batch: int, label: str, tmp: Path, gbps: float) -> Path:
    limits = {**PLANS, **GPU_PLANS}[label]
    cluster = tmp / f"{merged.stem}-{len(limits)}.cluster.yaml"
    lines = ["cluster: here", "resources:"]
    lines += [
        f"  {r}: {{price: {PRICES.get(r, 1.0)}, limit: {n}, bandwidth_gbps: {gbps:.4g}}}" for r, n in limits.items()
    ]
    cluster.write_text("\n".join(lines) + "\n")
    out = tmp / f"{merged.stem}-{len(limits)}.plan.yaml"
    heterps("plan", str(merged), str(cluster), "--objective", "time", "--scheduler", "exact", "--samples", "100000",
            "--global-batch", str(MICRO_BATCHES * batch), "--out", str(out))  # fmt: skip
    return out


def steps_for(plan_path: Path, steps: int, seconds: float) -> int:
    """At least ``steps``, and enough that a round lasts ``seconds`` at the plan's predicted pace: four
    steps of mlp at batch 64 last a third of a second, where one late wake-up of a process shows."""
    plan = yaml.safe_load(plan_path.read_text())
    return max(steps, math.ceil(seconds * plan["throughput"] / plan["global_batch"]))


def measure(plan_path: Path, model: str, steps: int, rounds: int, device: str = "cpu") -> list[dict]:
    mapping = "gpu=cuda" if device == "cuda" else "cpu2=cpu"
    return [
        json.loads(
            heterps(
                "run",
                str(plan_path),
                "--model",
                model,
                "--map",
                mapping,
                "--steps",
                str(steps),
                "--warmup",
                "1",
                "--json",
            )  # fmt: skip
        )
        for _ in range(rounds)
    ]


def row(model: str, batch: int, label: str, reports: list[dict]) -> dict:
    """The row of one plan: every round of every profile's plan, by their median ratio."""
    ratios = [r["ratio"] for r in reports]
    predictions = sorted({r["predicted_throughput"] for r in reports})
    median = sorted(reports, key=lambda r: r["ratio"])[len(reports) // 2]
    return {
        "model": model,
        "plan": label,
        "batch": batch,
        "stages": " → ".join(f"{s['resource']}×{s['replicas']} {s['first']}…{s['last']}" for s in median["stages"]),
        "micro_batches": median["micro_batches"],
        "predicted": statistics.median(r["predicted_throughput"] for r in reports),
        "predictions": predictions,
        "measured": statistics.median(r["throughput"] for r in reports),
        "ratio": statistics.median(ratios),
        "ratios": ratios,
        "memory": [
            {
                "predicted_gb": s["predicted_memory_gb"],
                "added_gb": s["peak_memory_gb"] - s["baseline_memory_gb"],
                "baseline_gb": s["baseline_memory_gb"],
            }
            for s in median["stages"]
        ],
        "per_stage": [  # seconds per micro-batch, but comm: the plan's all-reduce per step
            {k: s[k] for k in ("predicted_compute_s", "predicted_comm_s", "compute_s", "wait_s", "sync_s", "idle_s")}
            for s in median["stages"]
        ],
    }


COLUMNS = [
    ("model", "l"),
    ("plan", "l"),
    ("batch", "r"),
    ("stages", "l"),
    ("M", "r"),
    ("predicted samples/s", "r"),
    ("measured", "r"),
    ("measured/predicted (rounds)", "l"),
    ("memory GB: plan / added", "l"),
]


def _predicted(r: dict) -> str:
    """The median prediction, and with several profiles their range."""
    low, high = min(r["predictions"]), max(r["predictions"])
    shown = f"{r['predicted']:,.0f}"
    return shown if len(r["predictions"]) == 1 else f"{shown} ({low:,.0f}–{high:,.0f})"


def table(rows: list[dict]) -> str:
    cells = []
    for r in rows:
        rounds = ", ".join(f"{x:.2f}" for x in r["ratios"])
        memory = "; ".join(f"{m['predicted_gb']:.3f} / {m['added_gb']:.3f}" for m in r["memory"])
        cells.append(
            [r["model"], r["plan"], str(r["batch"]), r["stages"], str(r["micro_batches"]), _predicted(r)]
            + [f"{r['measured']:,.0f}", f"**{r['ratio']:.2f}** ({rounds})", memory]
        )
    return markdown(COLUMNS, cells)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", help="the rows whose model name contains this")
    parser.add_argument("--steps", type=int, default=4, help="measured steps per round at least (after one warm-up)")
    parser.add_argument("--seconds", type=float, default=3.0, help="and enough of them to last this long, predicted")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profiles", type=int, default=1, help="profile each model this many times, each "
                        "profile's plans run --rounds times in turn; a row is the median over all")  # fmt: skip
    parser.add_argument("--alone", action="store_true", help="profile each layer with the other core idle, "
                        "not busy (the profile before --concurrent)")  # fmt: skip
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cuda: profile and run on one GPU")
    parser.add_argument("--json", action="store_true", help="every figure, per stage too, as JSON")
    parser.add_argument("--docs", type=Path, help="write the table into this page, between the benchmark's markers")
    args = parser.parse_args()
    if args.docs and args.device == "cuda":
        parser.error("--docs writes the CPU table; docs/fidelity.md's GPU table sets runs side by side by hand")
    bandwidth = loopback_allreduce_bandwidth()
    gbps = 8 * bandwidth / 1e9 if bandwidth else 10.0
    print(f"loopback bandwidth: {gbps:.2f} Gbit/s", file=sys.stderr)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model, batch in GPU_ROWS if args.device == "cuda" else ROWS:
            if args.only and args.only not in model:
                continue
            reports: dict[str, list[dict]] = {}
            for n in range(args.profiles):
                where = Path(tmp) / str(n)
                where.mkdir(exist_ok=True)
                if args.device == "cuda":
                    merged, labels = profile_gpu(model, batch, where), GPU_PLANS
                else:
                    merged, labels = profile(model, batch, where, gbps, concurrent=not args.alone), PLANS
                for label in labels:
                    planned = plan(merged, batch, label, where, gbps)
                    steps = steps_for(planned, args.steps, args.seconds)
                    got = measure(planned, model, steps, args.rounds, args.device)
                    reports.setdefault(label, []).extend(got)
                    said = ", ".join(f"{r['ratio']:.2f}" for r in got)
                    print(f"  {model} at {batch}, {label}, profile {n + 1}: {said}", file=sys.stderr, flush=True)
            for label, theirs in reports.items():
                rows.append(row(model, batch, label, theirs))
    worst = max(abs(r["ratio"] - 1) for r in rows)
    summary = (
        f"{'one GPU, ' if args.device == 'cuda' else ''}loopback bandwidth {gbps:.2f} Gbit/s; "
        f"{args.profiles} profile{'s' if args.profiles > 1 else ''}, each with "
        f"{args.rounds} rounds of at least {args.steps} steps and "
        f"{args.seconds:g} s; "
        f"worst |measured/predicted − 1| over the rows' medians: {worst:.0%} (target ≤ 15%)"
    )
    print(json.dumps(rows, indent=2) if args.json else f"{table(rows)}\n\n{summary}")
    if args.docs:
        write_into(args.docs, "bench_fidelity.py", f"{table(rows)}\n\n{summary}")


if __name__ == "__main__":
    main()
