"""How trustworthy are measured profiles? Two numbers per zoo model, on this machine's cpu.

    python benchmarks/bench_profile.py

* sum of layer oct / a timed full forward+backward step of the same model (one
  thread each): how much the per-layer split loses or adds (functional code
  between modules, e.g. residual adds and concatenations, is in the step only);
* two profiles of the same model, run one after the other: the largest
  per-layer difference of oct among layers above 1 ms (target: within 15%).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from heterps_cli import profiler  # noqa: E402

MODELS = {"mlp": 256, "ctr": 512, "vgg16": 32, "transformer": 16}


def main() -> None:
    print("| model | batch | layers | sum of layer oct | full step | ratio | layers > 1 ms | worst repeat difference |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    threads = torch.get_num_threads()
    for name, batch in MODELS.items():
        model = profiler.load_model(name, batch)
        runs = [profiler.profile(model, "cpu", link_gbps=10) for _ in range(2)]
        torch.set_num_threads(1)
        try:
            step = statistics.median(profiler.step_times(model, "cpu", 20))
        finally:
            torch.set_num_threads(threads)
        total = sum(layer.oct for layer in runs[0].layers)
        pairs = [(a.oct, b.oct) for a, b in zip(runs[0].layers, runs[1].layers) if max(a.oct, b.oct) > 1e-3]
        worst = max((abs(a - b) / min(a, b) for a, b in pairs), default=0.0)
        print(f"| {name} | {batch} | {len(runs[0].layers)} | {total * 1e3:.1f} ms | {step * 1e3:.1f} ms | "
              f"{total / step:.2f} | {len(pairs)} | {100 * worst:.1f}% |", flush=True)


if __name__ == "__main__":
    main()
