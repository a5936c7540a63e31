"""GPU estimates against measured layer times (issue 49): ``heterps profile estimate``'s model of each
operator, held against GPUs it was not fitted on.

    python benchmarks/bench_gpu_estimates.py            # the tables (a minute)
    python benchmarks/bench_gpu_estimates.py --fit      # how the catalogue's fitted efficiencies come about
    python benchmarks/bench_gpu_estimates.py --passes   # each block's forward and backward apart

Measured data:

* ``benchmarks/data/sailor-gpt-neo``: GPT-Neo-2.7B trained by Megatron-DeepSpeed in fp32 on V100-16,
  A100-40, A100-80 and GH200 (Sailor's published profiles), forward + backward per layer at tp 1 and
  micro-batch 1 to 64. The A100 and GH200 runs reach 66-141 TFLOP/s on the blocks, above the fp32 peaks
  (19.5, 67): they ran their products on tensor cores (TF32), so they are estimated at ``--precision
  tf32``; the V100 has no TF32 (``fp32``).
* ``benchmarks/data/gpu/h200-*.json``, ``h100-*.json``: the same shapes, and OPT-350M's, OPT-30B's and a
  7B's at sequence 8,192, timed on the H200s and the H100 the device tool lent, by ``bench_gpu_layers.py``
  at fp32, tf32, bf16 and fp16, and products of many shapes.

The model estimated is ``benchmarks/gpt.py:gpt_neo`` (a user's plain PyTorch GPT of GPT-Neo's shapes,
Megatron's unfused attention and dropout 0.1); for the H200 rows, ``bench_gpu_layers``'s block (no
dropout). Sailor's layer 33 is not ours: its Megatron-DeepSpeed fork ends GPT-Neo with the final norm
(5,120 parameters) and computes the pipeline's loss, Megatron's vocabulary-parallel cross-entropy, on
the normed hidden states as they are, with no logits layer; its profile times the two together. So the
last layer compared is ``benchmarks/gpt.py:SailorLast`` (that norm and that loss, written in plain
PyTorch), and the whole model is the embedding, the 32 blocks and that layer.

What is fitted, and on what (``--fit``): the H200's large-product efficiency per precision and the
half-dimension D per precision, on the H200's products (not its layers); the A100's TF32 and the
V100's fp32 efficiency, each on its own GPT-Neo block at micro-batch 1 alone. Everything else is held
out: the H200's layers at four precisions, every other micro-batch, the A100-80 (the A100-40's
efficiency, its own memory), the GH200 (the H200's efficiency: the same GPU, its own memory), the
embeddings and last layers, and the speed ratios between GPUs.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from heterps_cli.formats import Efficiencies  # noqa: E402
from heterps_cli.loading import load_catalogue  # noqa: E402
from heterps_cli.profiling.counting import Work, abstract  # noqa: E402
from heterps_cli.profiling.estimate import CATALOGUE, Pricer, work  # noqa: E402
from heterps_cli.profiling.measure import load_model, traced  # noqa: E402

SAILOR = ROOT / "benchmarks/data/sailor-gpt-neo/sailor/Planner/simulations/profiles_tmp.json"
H200 = ROOT / "benchmarks/data/gpu/h200-2026-11-26-layers.json"
GPUS = {  # Sailor's name -> (catalogue device, the precision its runs used)
    "V100-16": ("v100-16gb", "fp32"),
    "A100-40": ("a100-40gb", "tf32"),
    "A100-80": ("a100-80gb", "tf32"),
    "GH-96": ("gh200", "tf32"),
}
PEAKS = {"fp32": 67, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5}  # the H200's, for --fit


def counted(batch: int, precision: str, model: str = "gpt_neo") -> dict[str, Work]:
    """The embedding's, a block's and Sailor's last layer's work at ``batch`` samples, counted on fake
    tensors."""
    import torch

    from benchmarks.gpt import SHAPES, SailorLast
    from heterps_cli.profiling.models import Call

    s = SHAPES["gpt-neo-2.7b"]
    with abstract():
        calls, _ = traced(load_model(f"{ROOT}/benchmarks/gpt.py:{model}", batch, None, "blocks"))
        hidden = torch.randn(batch, s.sequence, s.hidden)
        targets = torch.randint(0, s.hidden, (batch, s.sequence))  # its "vocabulary" is the hidden size
        last = Call("last", SailorLast(s), (hidden, targets), {}, ((True, False), {}))
        names = {"embedding": calls[0], "block": calls[1], "last": last}
        return {name: work(call, precision) for name, call in names.items()}


def sailor() -> dict[str, dict[int, dict[str, float]]]:
    """Per GPU and micro-batch at tp 1: the measured forward + backward of the embedding, a block (the
    mean of the 32) and the last layer, and the whole model (layers 0-33)."""
    data = json.loads(SAILOR.read_text())["GPT-Neo-2.7"]
    out: dict[str, dict[int, dict[str, float]]] = {}
    for gpu, by_batch in data.items():
        for batch, by_tp in by_batch.items():
            layers = by_tp.get("1")
            if layers is None:
                continue
            times = {int(i): fwd + bwd for i, (fwd, bwd, _) in layers.items()}
            out.setdefault(gpu, {})[int(batch)] = {
                "embedding": times[0],
                "block": statistics.mean(times[i] for i in range(1, 33)),
                "last": times[33],
                "model": sum(times.values()),
            }
    return out


def estimated(w: dict[str, Work], pricer: Pricer) -> dict[str, float]:
    times = {name: pricer.seconds(x, name) for name, x in w.items()}
    times["model"] = times["embedding"] + 32 * times["block"] + times["last"]
    return times


def sailor_tables() -> str:
    catalogue = load_catalogue(str(CATALOGUE))
    measured = sailor()
    rows, ratios, whole = [], {"block": [], "embedding": [], "last": []}, {}
    works: dict[int, dict[str, Work]] = {}
    for gpu, (device, precision) in GPUS.items():
        pricer = Pricer(catalogue.devices[device], catalogue, precision)
        for batch, m in sorted(measured[gpu].items()):
            works.setdefault(batch, counted(batch, "fp32"))  # fp32 and tf32 count alike; they price apart
            e = estimated(works[batch], pricer)
            for name in ratios:
                ratios[name].append(e[name] / m[name])
            rows.append(
                f"| {gpu} ({device}, {precision}) | {batch} | {m['block'] * 1e3:.2f} | {e['block'] * 1e3:.2f} | "
                f"{e['block'] / m['block']:.2f} | {m['embedding'] * 1e3:.2f} | {e['embedding'] * 1e3:.2f} | "
                f"{m['last'] * 1e3:.2f} | {e['last'] * 1e3:.2f} |"
            )
            if batch == 1:
                whole[gpu] = (m["model"], e["model"])
    head = (
        "| GPU (estimated as) | micro-batch | block measured ms | block estimated ms | ratio | embedding measured | "
        "estimated | last layer measured | estimated |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    pairs = []
    names = list(whole)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            real, est = whole[b][0] / whole[a][0], whole[b][1] / whole[a][1]
            pairs.append(f"| {b} / {a} | {real:.2f} | {est:.2f} | {est / real - 1:+.0%} |")
    order = (
        f"order by measured time: {' < '.join(sorted(whole, key=lambda g: whole[g][0]))}; "
        f"by estimate: {' < '.join(sorted(whole, key=lambda g: whole[g][1]))}"
    )
    text = "\n".join(
        [
            head,
            *rows,
            "",
            f"block estimated / measured: {spread(ratios['block'])}; embedding {spread(ratios['embedding'])}; "
            f"last layer (final norm and loss) {spread(ratios['last'])}; embedding and last layer together "
            f"{spread(ratios['embedding'] + ratios['last'])}",
            "",
            "| whole model at micro-batch 1, slower / faster | measured | estimated | error |\n|---|---:|---:|---:|",
            *pairs,
            "",
            order,
        ]
    )
    return text


def spread(ratios: list[float]) -> str:
    return f"median {statistics.median(ratios):.2f}, range {min(ratios):.2f}-{max(ratios):.2f}"


def gpu_tables() -> tuple[str, str, list[float], list[float]]:
    """bench_gpu_layers' embedding, block and head (final norm, logits, cross-entropy) on the lent H200s and
    H100 at each precision and micro-batch, every model whose layers were timed (GPT-Neo's shapes, OPT-350M's,
    OPT-30B's, the 7B's at sequence 8,192): each row measured and estimated, and per (model, GPU, precision)
    the spread of the ratios; the blocks' ratios, and the embeddings' and heads'."""
    rows = [
        "| shape | GPU | layer | precision | attention | micro-batch | measured ms | estimated ms | ratio |",
        "|---|---|---|---|---|---:|---:|---:|---:|",
    ]
    blocks, ends, groups = [], [], {}
    for shape, gpu, r, w, pricer in timed_layers():
        e = pricer.seconds(w, r["layer"])
        (blocks if r["layer"] == "block" else ends).append(e / r["step_s"])
        precision = r["precision"] + (" sdpa" if r["attention"] == "sdpa" else "")
        groups.setdefault((shape, gpu, precision, r["layer"]), []).append(e / r["step_s"])
        rows.append(
            f"| {shape} | {gpu} | {r['layer']} | {r['precision']} | {r['attention']} | {r['batch']} | "
            f"{r['step_s'] * 1e3:.2f} | {e * 1e3:.2f} | {e / r['step_s']:.2f} |"
        )
    summary = [
        "| shape | GPU | precision | blocks: median (range) | embeddings | heads |",
        "|---|---|---|---|---|---|",
    ]
    for shape, gpu, precision in sorted({k[:3] for k in groups}):
        cells = [groups.get((shape, gpu, precision, layer)) for layer in ("block", "embedding", "head")]
        shown = [f"{statistics.median(c):.2f} ({min(c):.2f}-{max(c):.2f})" if c else "-" for c in cells]
        summary.append(f"| {shape} | {gpu} | {precision} | {' | '.join(shown)} |")
    return "\n".join(rows), "\n".join(summary), blocks, ends


def timed_layers():
    """Each layer bench_gpu_layers timed on a lent GPU (``benchmarks/data/gpu/h*.json``): its shape's name,
    the GPU's catalogue name, the row, its work counted, and the GPU's pricer at the row's precision."""
    from benchmarks.gpt import SHAPES

    catalogue = load_catalogue(str(CATALOGUE))
    for path in sorted(H200.parent.glob("h*.json")):
        data = json.loads(path.read_text())
        if "layers" not in data or "shape" not in data:
            continue
        gpu = path.name.split("-")[0]  # the catalogue's name of the GPU it ran on
        shape = next(name for name, s in SHAPES.items() if s.hidden == data["shape"]["hidden"])
        for r in data["layers"]:
            w = h200_layer(shape, r["layer"], r["batch"], r["precision"], r["attention"] == "sdpa")
            yield shape, gpu, r, w, Pricer(catalogue.devices[gpu], catalogue, r["precision"])


def passes_table() -> str:
    """Every timed block's forward and backward apart, measured and estimated, and of the estimate its
    products' kernels and its memory-bound ones: which pass, and which kind of work, the estimate misses."""
    rows = [
        "| shape | GPU | precision | attention | micro-batch | forward measured ms | estimated (products + rest) "
        "| backward measured ms | estimated (products + rest) |",
        "|---|---|---|---|---:|---:|---|---:|---|",
    ]
    for shape, gpu, r, w, pricer in timed_layers():
        if r["layer"] != "block":
            continue
        cells = []
        for measured, ops in ((r["forward_s"], w.ops[: w.ahead]), (r["backward_s"], w.ops[w.ahead :])):
            products = sum(pricer.core(op, "block") for op in ops if op.flops)
            rest = sum(pricer.core(op, "block") for op in ops if not op.flops)
            cells.append(
                f"{measured * 1e3:.2f} | {(products + rest) * 1e3:.2f} ({products * 1e3:.2f} + {rest * 1e3:.2f})"
            )
        rows.append(f"| {shape} | {gpu} | {r['precision']} | {r['attention']} | {r['batch']} | {' | '.join(cells)} |")
    return "\n".join(rows)


def h200_layer(shape: str, layer: str, batch: int, precision: str, sdpa: bool) -> Work:
    """One of bench_gpu_layers' layers, counted as it timed it: forward and backward at ``precision``."""
    import torch

    from benchmarks.gpt import SHAPES, Block, Embedding, Head
    from heterps_cli.profiling.models import Call

    s = SHAPES[shape]
    with abstract():
        tokens = torch.randint(0, s.vocab, (batch, s.sequence))
        hidden = torch.randn(batch, s.sequence, s.hidden)
        if layer == "embedding":
            call = Call("embedding", Embedding(s), (tokens,), {})
        elif layer == "head":
            call = Call("head", Head(s), (hidden, tokens), {}, ((True, False), {}))
        else:
            call = Call("block", Block(s, sdpa), (hidden,), {})
        return work(call, precision)


def fit() -> str:
    """The fitted efficiencies: D and the large-product efficiency per precision on the H200's products;
    the A100's and V100's efficiency on their micro-batch-1 blocks (bisection on the estimate)."""
    data = json.loads(H200.read_text())
    lines = []
    for precision, peak in PEAKS.items():
        rows = [
            r
            for r in data["matmul"]
            if r["precision"] == precision and r["seconds"] > 2e-4 and 50257 not in (r["m"], r["n"], r["k"])
        ]
        best = None
        for half in range(0, 257, 8):
            for e in (x / 100 for x in range(30, 101)):
                errors = []
                for r in rows:
                    shape = (r["m"] / (r["m"] + half)) * (r["n"] / (r["n"] + half)) * (r["k"] / (r["k"] + half))
                    errors.append(abs(1 - r["tflops"] / (peak * e * shape)))
                score = statistics.mean(errors)
                if best is None or score < best[0]:
                    best = (score, half, e)
        assert best is not None
        _, half, e = best
        lines.append(f"h200 {precision}: D {half}, efficiency {e:.2f} (mean error {best[0]:.1%}, {len(rows)} products)")
        odd = [r for r in data["matmul"] if r["precision"] == precision and 50257 in (r["m"], r["n"], r["k"])]
        shares = [r["tflops"] / (peak * e * math.prod(x / (x + half) for x in (r["m"], r["n"], r["k"]))) for r in odd]
        lines.append(
            f"h200 {precision}: a misaligned product (vocabulary 50,257) reaches {statistics.median(shares):.2f} "
            f"of the aligned one's ({', '.join(f'{x:.2f}' for x in shares)})"
        )
    catalogue = load_catalogue(str(CATALOGUE))
    measured = sailor()
    w = counted(1, "fp32")["block"]
    for gpu in ("A100-40", "V100-16"):
        device, precision = GPUS[gpu]
        spec = catalogue.devices[device]
        low, high = 0.05, 1.0
        for _ in range(40):
            mid = (low + high) / 2
            given = spec.matmul_efficiency or Efficiencies()
            tried = spec.model_copy(update={"matmul_efficiency": given.model_copy(update={precision: mid})})
            if Pricer(tried, catalogue, precision).seconds(w, "block") > measured[gpu][1]["block"]:
                low = mid
            else:
                high = mid
        lines.append(f"{device} {precision}: efficiency {high:.2f} (its GPT-Neo block at micro-batch 1)")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fit", action="store_true", help="print how the catalogue's fitted figures come about")
    parser.add_argument("--passes", action="store_true", help="each timed block's forward and backward apart")
    args = parser.parse_args()
    if args.fit:
        print(fit())
        return
    if args.passes:
        print(passes_table())
        return
    start = time.perf_counter()
    print(sailor_tables())
    print()
    table, summary, blocks, ends = gpu_tables()
    print(table)
    print()
    print(summary)
    print(f"\nH200 and H100 blocks estimated / measured: {spread(blocks)}; embeddings and heads: {spread(ends)}")
    print(f"\n({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
