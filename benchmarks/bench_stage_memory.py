"""What a pipeline stage holds on a CPU, taken apart: saved activations against resident memory.

    python benchmarks/bench_stage_memory.py                 # vgg16's layers 0-12 at batch 64
    python benchmarks/bench_stage_memory.py --layers 13 --batch-size 64

Linux only: the peak is the process's VmHWM, reset after the set-up (``/proc/self/clear_refs``),
so that the imports' own peak does not hide the stage's.

Runs the first stage of a two-stage 1F1B step (two micro-batches in flight, 8 in all) of the zoo's
vgg16 in fresh processes with one thread, and prints: the bytes autograd saves for one
micro-batch, counted once per storage (what the plan's ``B0 · A_s`` stands for, docs/spec.md
section 1b); the resident memory added by two forwards in flight; and by the whole step with
the optimiser, with glibc's default allocator and with the one ``heterps run`` sets. The gap
between the plan and the step is working memory the model has no term for (docs/fidelity.md).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import json, sys, torch
sys.path.insert(0, {root!r})
torch.set_num_threads(1)
from heterps_cli.profiling.zoo import vgg16
from heterps_cli.profiling.timing import steady_allocator
layers, batch, phase, steady = {layers}, {batch}, {phase!r}, {steady}
if steady:
    steady_allocator()
def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 / 1e9 for line in f if line.startswith(key))
stage = vgg16(batch)[0][:layers]
params = {{p.untyped_storage().data_ptr() for p in stage.parameters()}}
optimiser = torch.optim.Adam(stage.parameters())
data = [torch.randn(batch, 3, 32, 32) for _ in range(8)]
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset the peak (VmHWM) to what is resident now: the imports' peak no longer counts
before, saved = status("VmRSS"), {{}}
rss = lambda: status("VmHWM")
def pack(t):
    saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return t
outs = []
with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
    outs.append(stage(data[0]))
one = sum(v for k, v in saved.items() if k not in params) / 1e9
for mb in range(1, 8):
    outs.append(stage(data[mb]))
    if phase == "forward":
        break
    out = outs.pop(0)
    out.backward(torch.ones_like(out))
while phase == "step" and outs:
    out = outs.pop(0)
    out.backward(torch.ones_like(out))
if phase == "step":
    optimiser.step()
print(json.dumps({{"saved": one, "added": rss() - before}}))
"""


def measure(layers: int, batch: int, phase: str, steady: bool) -> dict:
    code = CHILD.format(root=str(ROOT), layers=layers, batch=batch, phase=phase, steady=steady)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=600)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=13, help="the stage: vgg16's first LAYERS layers")
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    forward = measure(args.layers, args.batch_size, "forward", False)
    step = measure(args.layers, args.batch_size, "step", False)
    steady = measure(args.layers, args.batch_size, "step", True)
    print(f"vgg16 layers 0-{args.layers - 1}, batch {args.batch_size}, 1F1B first of 2 stages, 8 micro-batches")
    print(f"  saved by autograd, one micro-batch (each storage once): {forward['saved']:.4f} GB")
    print(f"  resident memory added by two forwards in flight:        {forward['added']:.3f} GB")
    print(f"  ... by the whole step with Adam (default allocator):    {step['added']:.3f} GB")
    print(f"  ... by the whole step with Adam (heterps run's):        {steady['added']:.3f} GB")


if __name__ == "__main__":
    main()
