"""Predicted against measured: plan a zoo model from its measured profile, run the plan, compare.

    python benchmarks/bench_fidelity.py                  # mlp and vgg16, one and two stages
    python benchmarks/bench_fidelity.py --only mlp --steps 30

Each model is profiled here with ``heterps profile`` on the CPU twice, as
resource types ``cpu`` (price 1) and ``cpu2`` (price 1.5), one thread per unit,
and the two profiles merged. The cluster gives both types the loopback
bandwidth this machine measures, so the plan pays for the activations that
cross a stage boundary (docs/spec.md section 1b). Two plans per model, objective time:

* one stage: a limit of one ``cpu`` unit and no ``cpu2``;
* two stages: one unit of each type (2 units in all), so the plan splits the
  model into a pipeline.

Each plan then runs with ``heterps run`` (default micro-batches) and the table
shows predicted and measured throughput and their ratio. Target: within 15% on
every row.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from heterps_cli.profiling.measure import loopback_allreduce_bandwidth  # noqa: E402

MODELS = {"mlp": 256, "vgg16": 64}  # the chain models of the zoo, and the batch size to profile and run at


def heterps(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "heterps_cli", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"heterps {' '.join(args)} failed:\n{done.stderr}")
    return done.stdout


def run_model(model: str, batch: int, tmp: Path, gbps: float, steps: int) -> list[dict]:
    profiles = []
    for resource in ("cpu", "cpu2"):
        path = tmp / f"{model}-{resource}.yaml"
        heterps(
            "profile",
            model,
            "--as",
            resource,
            "--batch-size",
            str(batch),
            "--out",
            str(path),
            "--link-gbps",
            f"{gbps:.4g}",
        )
        profiles.append(str(path))
    merged = tmp / f"{model}.yaml"
    heterps("profile", "merge", *profiles, "--out", str(merged))
    rows = []
    for label, limits in (("1 stage", {"cpu": 1}), ("2 stages", {"cpu": 1, "cpu2": 1})):
        cluster = tmp / f"{model}-{len(limits)}.cluster.yaml"
        lines = ["cluster: here", "resources:"]
        for resource, price in (("cpu", 1.0), ("cpu2", 1.5)):
            if resource in limits:
                lines.append(f"  {resource}: {{price: {price}, limit: {limits[resource]}, bandwidth_gbps: {gbps:.4g}}}")
        cluster.write_text("\n".join(lines) + "\n")
        plan = tmp / f"{model}-{len(limits)}.plan.yaml"
        heterps(
            "plan", str(merged), str(cluster), "--objective", "time", "--scheduler", "exact",
            "--samples", "100000", "--out", str(plan),
        )  # fmt: skip
        report = json.loads(
            heterps(
                "run",
                str(plan),
                "--model",
                model,
                "--map",
                "cpu2=cpu",
                "--steps",
                str(steps),
                "--warmup",
                "1",
                "--json",
            )
        )
        rows.append(
            {
                "model": model,
                "plan": label,
                "batch": batch,
                "stages": " → ".join(
                    f"{s['resource']}×{s['replicas']} {s['first']}…{s['last']}" for s in report["stages"]
                ),
                "micro_batches": report["micro_batches"],
                "predicted": report["predicted_throughput"],
                "measured": report["throughput"],
                "ratio": report["ratio"],
                "per_stage": [
                    {
                        "predicted_ct": s["predicted_compute_s"],
                        "predicted_dt": s["predicted_comm_s"],
                        "compute": s["compute_s"],
                        "wait": s["wait_s"],
                        "sync": s["sync_s"],
                        "idle": s["idle_s"],
                    }
                    for s in report["stages"]
                ],
            }
        )
        print(f"  {model}, {label}: {rows[-1]['ratio']:.2f}", file=sys.stderr, flush=True)
    return rows


def table(rows: list[dict]) -> str:
    out = [
        "| model | plan | batch | stages | micro-batches | predicted samples/s | measured | measured/predicted |",
        "|---|---|---:|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        out.append(
            f"| {r['model']} | {r['plan']} | {r['batch']} | {r['stages']} | {r['micro_batches']} | "
            f"{r['predicted']:,.0f} | {r['measured']:,.0f} | {r['ratio']:.2f} |"
        )
    return "\n".join(out)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", help="the models whose name contains this")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="every figure, per stage too, as JSON")
    args = parser.parse_args()
    bandwidth = loopback_allreduce_bandwidth()
    gbps = 8 * bandwidth / 1e9 if bandwidth else 10.0
    print(f"loopback bandwidth: {gbps:.2f} Gbit/s", file=sys.stderr)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model, batch in MODELS.items():
            if not args.only or args.only in model:
                rows += run_model(model, batch, Path(tmp), gbps, args.steps)
    print(json.dumps(rows, indent=2) if args.json else table(rows))
    worst = max(abs(r["ratio"] - 1) for r in rows)
    print(f"\nworst |measured/predicted - 1|: {worst:.0%} (target <= 15%)")
