"""Training with real data against the synthetic measurement of the same plan (``heterps run --task``).

    python benchmarks/bench_task.py              # two-stage and data-parallel plans of the guide's task
    python benchmarks/bench_task.py --rounds 5
    python benchmarks/bench_task.py --device cuda  # one stage on one GPU

The guide's task (``docs/guide/classify.py``: an MLP classifier, a dataset of 4,096 samples in two
``.npy`` files read back from disk, cross-entropy, Adam) is profiled as ``cpu`` and ``cpu2`` on both
cores at once and planned as ``bench_fidelity`` plans (a global batch of 8 micro-batches of 64). Each
plan then runs, in turn, with synthetic data (``--model docs/guide/classify.py:model``: the example
batch on the device from the start, a mean-squared loss, SGD) and with the task (``--task ...:task``:
every micro-batch's samples read from the files, its own loss and optimiser), ``--rounds`` times each,
fresh processes each round. A row shows the median throughput of each and their ratio, and the time
the task's stages spent reading samples per micro-batch (the report's ``data`` column). Target: the
task within 10% of the synthetic throughput. With ``--device cuda`` the model is profiled once on the GPU
as type ``gpu`` and planned on that one GPU (one stage, one replica), run with ``--map gpu=cuda``. Each
row also shows both runs' throughput against the plan's prediction.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_fidelity import PRICES, UNITS, heterps, plan, profile_gpu, steps_for  # noqa: E402
from heterps_cli.profiling.links import loopback_allreduce_bandwidth  # noqa: E402

TASK = ROOT / "docs/guide/classify.py"
BATCH = 64


def profile(tmp: Path) -> Path:
    """The task's model measured as cpu and cpu2 on both cores at once, each with its own link, merged
    (bench_fidelity's way)."""
    paths = []
    for resource in PRICES:
        path = tmp / f"classify-{resource}.yaml"
        heterps("profile", f"{TASK}:model", "--as", resource, "--batch-size", str(BATCH), "--out", str(path),
                "--concurrent", str(UNITS), "--processes", str(2 * UNITS))  # fmt: skip
        paths.append(str(path))
    merged = tmp / "classify.yaml"
    heterps("profile", "merge", *paths, "--out", str(merged))
    return merged


def run(plan_path: Path, how: list[str], steps: int, mapping: str) -> dict:
    return json.loads(heterps("run", str(plan_path), *how, "--map", mapping, "--steps", str(steps), "--json"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0, help="each run lasts about this long, predicted")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cuda: one stage on one GPU")
    args = parser.parse_args()
    bandwidth = loopback_allreduce_bandwidth()
    gbps = 8 * bandwidth / 1e9 if bandwidth else 10.0
    print(
        "| plan | stages | synthetic samples/s | task samples/s | task / synthetic (rounds) | "
        "measured / predicted: synthetic, task | reading ms per batch |"
    )
    print("|---|---|---:|---:|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("CLASSIFY_DATA", str(Path(tmp) / "data"))
        if args.device == "cuda":
            merged, labels, mapping = profile_gpu(f"{TASK}:model", BATCH, Path(tmp)), ["one GPU"], "gpu=cuda"
        else:  # bench_fidelity's clusters: one cpu and one cpu2; two cpu
            merged, labels, mapping = profile(Path(tmp)), ["two stages", "data-parallel"], "cpu2=cpu"
        for label in labels:
            planned = plan(merged, BATCH, label, Path(tmp), gbps)
            steps = steps_for(planned, 8, args.seconds)
            synthetic, task = [], []
            for _ in range(args.rounds):
                synthetic.append(run(planned, ["--model", f"{TASK}:model", "--warmup", "1"], steps, mapping))
                task.append(run(planned, ["--task", f"{TASK}:task", "--warmup", "1"], steps + 1, mapping))
            ratios = [t["throughput"] / s["throughput"] for s, t in zip(synthetic, task)]
            fidelity = ", ".join(
                f"{statistics.median(r['throughput'] / r['predicted_throughput'] for r in runs):.2f}"
                for runs in (synthetic, task)
            )
            stages = yaml.safe_load(planned.read_text())["stages"]
            shown = " → ".join(f"{s['resource']}×{s['replicas']}" for s in stages)
            reading = ", ".join(f"{statistics.median(t['stages'][i]['data_s'] for t in task) * 1e3:.3f}"
                                for i in range(len(stages)))  # fmt: skip
            print(
                f"| {label} | {shown} | {statistics.median(r['throughput'] for r in synthetic):,.0f} | "
                f"{statistics.median(r['throughput'] for r in task):,.0f} | **{statistics.median(ratios):.2f}** "
                f"({', '.join(f'{r:.2f}' for r in ratios)}) | {fidelity} | {reading} |"
            )


if __name__ == "__main__":
    main()
