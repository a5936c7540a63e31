"""How trustworthy are measured profiles? Two numbers per zoo model, on this machine's cpu.

    python benchmarks/bench_profile.py [--only NAME] [--processes N]

Each model is profiled twice, each time in a fresh process, as two
``heterps profile`` runs would be:

* sum of layer oct / a whole-model forward+backward step (one thread each):
  how much the per-layer split loses or adds (functional code between modules,
  e.g. residual adds and concatenations, is in the step only);
* the largest per-layer difference of oct between the two runs among layers
  above 1 ms (target: within 15%), and the median difference.

With ``--processes N`` each of the two profiles is itself the median over N
fresh processes, as ``heterps profile --processes N`` measures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.tables import header  # noqa: E402
from heterps_cli.profiling import measure  # noqa: E402
from heterps_cli.profiling.processes import measure_in_processes  # noqa: E402

MODELS = {"mlp": 256, "ctr": 512, "vgg16": 32, "transformer": 16}


def one(name: str, batch: int, out: Path, processes: int) -> None:
    if processes > 1:
        measured = measure_in_processes(
            name, batch, None, "cpu", device="cpu", repetitions=20, link_gbps=10, processes=processes
        )
    else:
        measured = measure.measure(measure.load_model(name, batch), "cpu", link_gbps=10)
    out.write_text(
        json.dumps(
            {
                "oct": [layer.oct for layer in measured.layers],
                "step": measured.step,
                "names": [layer.name for layer in measured.layers],
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", help="profile only this zoo model")
    parser.add_argument("--processes", type=int, default=1, help="each profile the median over N fresh processes")
    parser.add_argument("--one", nargs=3, metavar=("MODEL", "BATCH", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        return one(args.one[0], int(args.one[1]), Path(args.one[2]), args.processes)
    numbers = ("batch", "layers", "sum of layer oct", "whole step", "ratio", "layers > 1 ms", "within 15%")
    numbers += ("median repeat difference", "worst repeat difference")
    print(header([("model", "l"), *((name, "r") for name in numbers)]))
    with tempfile.TemporaryDirectory() as tmp:
        for name, batch in MODELS.items():
            if args.only and args.only != name:
                continue
            runs = []
            for r in range(2):
                out = Path(tmp) / f"{name}-{r}.json"
                subprocess.run(
                    [sys.executable, __file__, "--one", name, str(batch), str(out), "--processes", str(args.processes)],
                    check=True,
                )
                runs.append(json.loads(out.read_text()))
            total = sum(runs[0]["oct"])
            pairs = [
                (a, b, name) for a, b, name in zip(runs[0]["oct"], runs[1]["oct"], runs[0]["names"]) if max(a, b) > 1e-3
            ]
            diffs = [abs(a - b) / min(a, b) for a, b, _ in pairs]
            worst = max(range(len(pairs)), key=diffs.__getitem__, default=None)
            print(
                f"| {name} | {batch} | {len(runs[0]['oct'])} | {total * 1e3:.1f} ms | {runs[0]['step'] * 1e3:.1f} ms "
                f"| {total / runs[0]['step']:.2f} | {len(pairs)} | {sum(d <= 0.15 for d in diffs)} "
                f"| {100 * statistics.median(diffs or [0]):.1f}% "
                f"| {100 * max(diffs, default=0.0):.1f}%"
                + (
                    f" ({pairs[worst][2]}: {pairs[worst][0] * 1e3:.2f} / {pairs[worst][1] * 1e3:.2f} ms)"
                    if worst is not None
                    else ""
                )
                + " |",
                flush=True,
            )


if __name__ == "__main__":
    main()
