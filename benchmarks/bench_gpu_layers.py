"""Measure, on this machine's GPU, what an estimate of a GPU has to predict: layer times per precision.

    python benchmarks/bench_gpu_layers.py --out h200.json            # on a GPU machine (minutes)
    python benchmarks/bench_gpu_layers.py --device cpu --small --out /tmp/x.json   # a smoke run here
    python benchmarks/bench_gpu_layers.py --shape llama-7b-8k --batches 1,2 --no-matmul --out l.json  # a 7B block

Three tables, written as one JSON file (``benchmarks/data/gpu/`` keeps the ones measured):

* **layers**: a GPT-Neo-2.7B-shaped chain as Megatron runs it (hidden 2560, 20 heads, sequence
  2048, vocabulary 50257; attention unfused: scores, causal mask, softmax, weighted sum): the
  embedding, one transformer block and the head (final norm, logits and the loss), forward and
  backward apart, at micro-batch 1, 2, 4 and 8, in fp32 (TF32 off), tf32, and bf16/fp16 autocast
  (bf16 also with ``scaled_dot_product_attention``). Each row has the FLOPs that
  ``torch.utils.flop_counter`` counts and the CUDA allocator's growth over the forward pass (the
  activations the layer keeps for its backward).
* **matmul**: products of many shapes (square, GPT-Neo's own, attention's batched ones) per
  precision, as TFLOP/s: how the efficiency a device reaches depends on a product's size.
* **memory**: the bandwidth of a copy and of element-wise work, and what one small kernel and one
  small layer cost in launch and framework time.
* **kernels** (``--kernels``): every CUDA kernel of one block's forward and of its backward under
  ``torch.profiler``, per precision: where a block's time goes, kernel by kernel (issue 65: the
  estimate is 15-30% fast on Hopper's tensor-core blocks, in the backward at tf32, in both passes in
  half precision, by an amount that follows the attention's score elements).
* **layouts** (``--kernels``): the block's products with their operands laid out as a linear layer's
  forward (both contiguous along k), its input's gradient and its weight's gradient run them.

The shared GPT-Neo layer times (``../shared/fidelity/sailor-gpt-neo``) cover V100, A100 and GH200;
a table from another GPU checks an estimate on a device it was not fitted on (issue 49).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.gpt import SHAPES, Block, Embedding, Head, Shape  # noqa: E402

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")


def precision(name: str, device: str) -> contextlib.AbstractContextManager:
    """TF32 on for every precision but fp32; autocast for the half types."""
    torch.backends.cuda.matmul.allow_tf32 = name != "fp32"
    torch.backends.cudnn.allow_tf32 = name != "fp32"
    if name in ("bf16", "fp16"):
        return torch.autocast(device, dtype=torch.bfloat16 if name == "bf16" else torch.float16)
    return contextlib.nullcontext()


class Timer:
    """Wall time on the CPU, CUDA events on a GPU: the median of ``reps`` runs after ``warmup``."""

    def __init__(self, device: str, warmup: int, reps: int):
        self.device, self.warmup, self.reps = device, warmup, reps

    def sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def median(self, work, reps: int | None = None) -> float:
        for _ in range(self.warmup):
            work()
        self.sync()
        times = []
        for _ in range(reps or self.reps):
            if self.device == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                work()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            else:
                begin = time.perf_counter()
                work()
                times.append(time.perf_counter() - begin)
        return statistics.median(times)


def flops_of(run) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        run()
    return int(counter.get_total_flops())


def one_layer(kind: str, s: Shape, batch: int, prec: str, sdpa: bool, device: str, timer: Timer) -> dict:
    """Forward and backward of one layer at one micro-batch: seconds, FLOPs, activation bytes."""
    torch.manual_seed(0)
    layer = {"embedding": lambda: Embedding(s), "block": lambda: Block(s, sdpa), "head": lambda: Head(s)}[kind]()
    layer = layer.to(device)
    tokens = torch.randint(0, s.vocab, (batch, s.sequence), device=device)
    hidden = torch.randn(batch, s.sequence, s.hidden, device=device, requires_grad=kind != "embedding")
    with precision(prec, device):

        def forward() -> torch.Tensor:
            if kind == "embedding":
                return layer(tokens)
            return layer(hidden, tokens) if kind == "head" else layer(hidden)

        out = forward()
    grad = torch.ones_like(out) if out.dim() == 0 else torch.randn_like(out)

    def step() -> None:
        with precision(prec, device):
            y = forward()
        y.backward(grad)

    def forward_only() -> None:
        with precision(prec, device):
            forward()

    row = {"layer": kind, "batch": batch, "precision": prec, "attention": "sdpa" if sdpa else "eager"}
    row["forward_s"] = timer.median(forward_only)
    row["step_s"] = timer.median(step)
    row["backward_s"] = max(row["step_s"] - row["forward_s"], 0.0)
    with precision(prec, device):
        row["forward_flops"] = flops_of(forward)
    row["step_flops"] = flops_of(step)
    if device == "cuda":
        layer.zero_grad(set_to_none=True)
        hidden.grad = None
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        with precision(prec, device):
            y = forward()
        torch.cuda.synchronize()
        row["activation_bytes"] = torch.cuda.memory_allocated() - before - y.numel() * y.element_size()
        del y
    row["parameters"] = sum(p.numel() for p in layer.parameters())
    return row


def matmul_shapes(s: Shape, small: bool) -> list[tuple[int, int, int, int]]:
    """(batch, m, n, k): squares, GPT-Neo's linear layers at 1 and 8 samples, attention's products."""
    if small:
        return [(1, 64, 64, 64), (1, 128, 256, 64), (4, 32, 32, 16)]
    shapes = [(1, n, n, n) for n in (256, 512, 1024, 2048, 4096, 8192)]
    for samples in (1, 8):
        tokens = samples * s.sequence
        for n, k in (
            (3 * s.hidden, s.hidden),
            (s.hidden, s.hidden),
            (4 * s.hidden, s.hidden),
            (s.hidden, 4 * s.hidden),
        ):
            shapes.append((1, tokens, n, k))
        shapes.append((1, tokens, s.vocab, s.hidden))
        d = s.hidden // s.heads
        shapes += [(samples * s.heads, s.sequence, s.sequence, d), (samples * s.heads, s.sequence, d, s.sequence)]
    shapes += [(1, 128, 128, 128), (1, 16384, 16384, 16384)]
    return shapes


def one_matmul(shape: tuple[int, int, int, int], prec: str, device: str, timer: Timer) -> dict:
    batch, m, n, k = shape
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(prec, torch.float32)
    a = torch.randn(batch, m, k, device=device, dtype=dtype)
    b = torch.randn(batch, k, n, device=device, dtype=dtype)
    with precision(prec if prec in ("fp32", "tf32") else "tf32", device):
        seconds = timer.median(lambda: torch.bmm(a, b))
    return {
        "batch": batch,
        "m": m,
        "n": n,
        "k": k,
        "precision": prec,
        "seconds": seconds,
        "tflops": 2 * batch * m * n * k / seconds / 1e12,
    }


def kernel_table(s: Shape, batch: int, prec: str, sdpa: bool, device: str) -> dict[str, list[dict]]:
    """One block's forward and, apart, its backward under torch.profiler (after a warm-up step): each
    kernel's microseconds on the device (on the cpu, a smoke run: each operator's own time)."""
    torch.manual_seed(0)
    layer = Block(s, sdpa).to(device)
    hidden = torch.randn(batch, s.sequence, s.hidden, device=device, requires_grad=True)
    grad = torch.randn(batch, s.sequence, s.hidden, device=device)

    def forward() -> torch.Tensor:
        with precision(prec, device):
            return layer(hidden)

    forward().backward(grad)
    passes = {"forward": _profiled(forward, device)}
    y = forward()
    passes["backward"] = _profiled(lambda: y.backward(grad), device)
    return passes


def _profiled(run, device: str) -> list[dict]:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = device == "cuda"
    with profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]) as prof:
        run()
        if cuda:
            torch.cuda.synchronize()
    if cuda:  # the kernels themselves: an operator's device time counts its children's kernels again
        return [
            {"name": e.key, "us": e.self_device_time_total, "count": e.count}
            for e in prof.key_averages()
            if e.device_type == DeviceType.CUDA and e.self_device_time_total > 0
        ]
    return [
        {"name": e.key, "us": e.self_cpu_time_total, "count": e.count}
        for e in prof.key_averages()
        if e.self_cpu_time_total > 0
    ]


def layout_table(s: Shape, batch: int, prec: str, timer: Timer, device: str) -> list[dict]:
    """The block's linear products at ``batch`` samples in the three layouts a linear layer runs them:
    forward x @ W.t() (both operands contiguous along k), the input's gradient g @ W, the weight's
    gradient g.t() @ x."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(prec, torch.float32)
    tokens, rows = batch * s.sequence, []
    for n, k in ((3 * s.hidden, s.hidden), (s.hidden, s.hidden), (4 * s.hidden, s.hidden), (s.hidden, 4 * s.hidden)):
        x = torch.randn(tokens, k, device=device, dtype=dtype)
        w = torch.randn(n, k, device=device, dtype=dtype)
        g = torch.randn(tokens, n, device=device, dtype=dtype)
        runs = {
            "forward": lambda x=x, w=w: x @ w.t(),
            "input_grad": lambda g=g, w=w: g @ w,
            "weight_grad": lambda g=g, x=x: g.t() @ x,
        }
        for name, run in runs.items():
            with precision(prec if prec in ("fp32", "tf32") else "tf32", device):
                seconds = timer.median(run)
            flops = 2 * tokens * n * k
            rows.append(
                {
                    "tokens": tokens,
                    "n": n,
                    "k": k,
                    "precision": prec,
                    "layout": name,
                    "seconds": seconds,
                    "tflops": flops / seconds / 1e12,
                }
            )
    return rows


def memory_table(device: str, timer: Timer, small: bool) -> dict:
    """Copy and element-wise bandwidth (bytes read + written), and launch and framework overheads."""
    n = (1 << 16) if small else (1 << 28)
    x = torch.randn(n, device=device)
    y = torch.empty_like(x)
    copy = timer.median(lambda: y.copy_(x))
    add = timer.median(lambda: torch.add(x, x, out=y))
    tiny = torch.randn(1, device=device)
    kernels = 200

    def launches() -> None:
        for _ in range(kernels):
            tiny.add_(1)

    per_kernel = timer.median(launches, reps=5) / kernels
    norm = nn.LayerNorm(64).to(device)
    small_in = torch.randn(4, 64, device=device, requires_grad=True)
    small_layer = timer.median(lambda: norm(small_in).sum().backward())
    return {
        "elements": n,
        "copy_gbps": 2 * 4 * n / copy / 1e9,
        "add_gbps": 3 * 4 * n / add / 1e9,
        "kernel_launch_s": per_kernel,
        "small_layer_step_s": small_layer,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    parser.add_argument("--small", action="store_true", help="tiny shapes: a smoke run of the script itself")
    parser.add_argument("--batches", default="1,2,4,8", help="micro-batches, comma-separated")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="gpt-neo-2.7b")
    parser.add_argument("--no-matmul", action="store_true", help="leave out the products per shape")
    parser.add_argument(
        "--kernels", action="store_true", help="only the kernels of a block per precision and the products per layout"
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    s = Shape(hidden=64, heads=4, sequence=32, vocab=500) if args.small else SHAPES[args.shape]
    timer = Timer(args.device, warmup=3, reps=args.reps)
    report: dict = {"shape": s.__dict__, "torch": torch.__version__, "python": platform.python_version()}
    if args.device == "cuda":
        props = torch.cuda.get_device_properties(0)
        report["device"] = {
            "name": props.name,
            "memory_bytes": props.total_memory,
            "multiprocessors": props.multi_processor_count,
            "cuda": torch.version.cuda,
        }

    def save() -> None:
        args.out.write_text(json.dumps(report, indent=1))

    if args.kernels:
        report["kernels"], report["layouts"] = [], []
        for batch in (int(b) for b in args.batches.split(",")):
            wanted = PRECISIONS if args.device == "cuda" else ("fp32", "bf16")
            for prec, sdpa in [(p, False) for p in wanted] + [("bf16", True)]:
                passes = kernel_table(s, batch, prec, sdpa, args.device)
                report["kernels"].append({"batch": batch, "precision": prec, "sdpa": sdpa, **passes})
                took = {k: f"{sum(r['us'] for r in v) / 1e3:.2f} ms" for k, v in passes.items()}
                print(f"kernels b={batch} {prec} sdpa={sdpa}: {took}", flush=True)
            for prec in wanted:
                report["layouts"] += layout_table(s, batch, prec, timer, args.device)
            save()
        print(f"wrote {args.out}", file=sys.stderr)
        return
    report["memory"] = memory_table(args.device, timer, args.small)
    print(json.dumps(report["memory"]), flush=True)
    save()
    report["layers"] = []
    variants = [(p, False) for p in PRECISIONS] + [("bf16", True)]
    for batch in (int(b) for b in args.batches.split(",")):
        for prec, sdpa in variants:
            for kind in ("embedding", "block", "head"):
                if sdpa and kind != "block" or args.device == "cpu" and prec == "fp16":
                    continue
                row = one_layer(kind, s, batch, prec, sdpa, args.device, timer)
                report["layers"].append(row)
                rate = row["step_flops"] / row["step_s"] / 1e12
                print(
                    f"{kind:9} b={batch} {prec} {row['attention']:5} fwd {1e3 * row['forward_s']:8.2f} ms"
                    f"  bwd {1e3 * row['backward_s']:8.2f} ms  {rate:6.1f} TFLOP/s",
                    flush=True,
                )
                if args.device == "cuda":
                    torch.cuda.empty_cache()
        save()
    report["matmul"] = []
    for prec in () if args.no_matmul else PRECISIONS if args.device == "cuda" else ("fp32", "bf16"):
        for shape in matmul_shapes(s, args.small):
            report["matmul"].append(one_matmul(shape, prec, args.device, timer))
        print(prec, " ".join(f"{r['tflops']:.0f}" for r in report["matmul"] if r["precision"] == prec), flush=True)
        save()
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
