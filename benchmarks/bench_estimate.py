"""How far an estimated profile is from a measured one: every zoo model, per layer and in total.

    python benchmarks/bench_estimate.py                  # this machine's cpu: measured vs estimated
    python benchmarks/bench_estimate.py --only mlp --batch-size 64
    python benchmarks/bench_estimate.py --device cuda --estimate h100   # on a GPU machine
    python benchmarks/bench_estimate.py --cpu-peaks      # the figures of the catalogue's cpu entry

For each model: measure its layers (``heterps profile``'s measurement, in
process), estimate them on the catalogue's device without calibration, and
compare. "calibrated" fits the efficiencies to that same measurement
(``--calibrate``): in-sample, so it shows how much of the error is a bias per
layer kind, which calibration removes, and how much is scatter between layers
of one kind, which it cannot.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.tables import markdown  # noqa: E402
from heterps_cli.profiling.estimate import estimate, measure_cpu_core  # noqa: E402
from heterps_cli.profiling.measure import load_model, measure  # noqa: E402
from heterps_cli.profiling.write import measured_text  # noqa: E402
from heterps_cli.profiling.zoo import MODELS  # noqa: E402


def errors(estimated: list[float], measured: list[float]) -> dict:
    ratios = [e / m for e, m in zip(estimated, measured)]
    off = sorted(abs(r - 1) for r in ratios)
    return {
        "median": statistics.median(off),
        "p90": off[min(len(off) - 1, int(0.9 * len(off)))],
        "within_2x": sum(0.5 <= r <= 2 for r in ratios) / len(ratios),
        "total": sum(estimated) / sum(measured) - 1,
    }


def run_one(
    name: str, batch_size: int, device: str, target: str, resource: str, granularity: str, catalogue: str | None = None
) -> dict:
    model = load_model(name, batch_size, granularity=granularity)
    began = time.perf_counter()
    measured = measure(model, resource, device=device)
    seconds = time.perf_counter() - began
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "measured.yaml"
        path.write_text(measured_text(measured))
        plain = estimate(
            load_model(name, batch_size, granularity=granularity), resource, target, catalogue_path=catalogue
        )
        fitted = estimate(
            load_model(name, batch_size, granularity=granularity),
            resource,
            target,
            catalogue_path=catalogue,
            calibrate=str(path),
            calibrate_on=target,
        )
    truth = [layer.oct for layer in measured.layers]
    return {
        "model": name + (" (blocks)" if granularity == "blocks" else ""),
        "layers": len(truth),
        "measured_s": sum(truth),
        "step_s": measured.step,
        "estimated_s": plain.total_oct,
        "plain": errors([layer.oct for layer in plain.layers], truth),
        "calibrated": errors([layer.oct for layer in fitted.layers], truth),
        "factors": fitted.calibration,
        "measure_s": seconds,
    }


def pct(x: float) -> str:
    return f"{100 * x:+.0f}%" if x >= 0 else f"{100 * x:.0f}%"


COLUMNS = [("model", "l")] + [
    (name, "r")
    for name in (
        "layers",
        "measured ms",
        "estimated ms",
        "total error",
        "per-layer median error",
        "per-layer p90",
        "layers within 2x",
        "calibrated: total",
        "calibrated: median",
        "calibrated: within 2x",
    )
]


def table(rows: list[dict]) -> str:
    cells = []
    for r in rows:
        p, c = r["plain"], r["calibrated"]
        cells.append(
            [r["model"], str(r["layers"]), f"{1e3 * r['measured_s']:.3g}", f"{1e3 * r['estimated_s']:.3g}"]
            + [pct(p["total"]), f"{100 * p['median']:.0f}%", f"{100 * p['p90']:.0f}%", f"{100 * p['within_2x']:.0f}%"]
            + [pct(c["total"]), f"{100 * c['median']:.0f}%", f"{100 * c['within_2x']:.0f}%"]
        )
    return markdown(COLUMNS, cells)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", action="append", help="a zoo model (repeat); default all")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--estimate", default="cpu", help="the catalogue device to estimate (default cpu)")
    parser.add_argument("--json", help="also write every model's figures here")
    parser.add_argument(
        "--catalogue", help="a device catalogue of your own (this machine's --cpu-peaks in its cpu entry)"
    )
    parser.add_argument("--cpu-peaks", action="store_true", help="measure one core's matmul and add rates")
    args = parser.parse_args()
    if args.cpu_peaks:
        tflops, gbps = measure_cpu_core()
        print(f"one core: {1e3 * tflops:.0f} GFLOP/s fp32 (best of matmul and conv), {gbps:.0f} GB/s (add, 128 MiB)")
        return
    rows = []
    # The residual models once more at --granularity blocks: what a plan of them would use.
    runs = [(name, "layers") for name in args.only or list(MODELS)]
    runs += [(name, "blocks") for name in ("transformer", "resnet") if not args.only or name in args.only]
    for name, granularity in runs:
        print(f"{name} ({granularity}): measuring on {args.device} ...", file=sys.stderr, flush=True)
        rows.append(
            run_one(name, args.batch_size, args.device, args.estimate, args.estimate, granularity, args.catalogue)
        )
        print(f"  {rows[-1]['measure_s']:.0f} s; factors {rows[-1]['factors']}", file=sys.stderr, flush=True)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
