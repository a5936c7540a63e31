"""Regenerate the bundled example profiles from FLOP and byte counts.

    python profiles/make_examples.py        # rewrites profiles/*.yaml

The bundled profiles are *estimates*, not measurements (``heterps profile``
measures a real model). Every number is derived here, from the layer shapes and
the device constants below, so anyone can check or change the assumptions:

* oct  = max(FLOPs / sustained FLOP/s, bytes touched / memory bandwidth)
         + a fixed per-layer launch overhead; FLOPs and bytes count forward and
         backward (x3 of forward), for one batch of ``batch_size`` samples.
* odt  = (gradient sync + data in) / link bandwidth of one unit. Gradient sync
         is a ring all-reduce (2 x weight bytes). Data in is the training input
         for the first layer (for the CTR embedding, whose table sits on
         parameter servers, the rows each sample pulls and pushes). Activations
         passed between layers are not counted: the spec's model (docs/spec.md) charges a layer's
         odt wherever it runs, while real activations only cross a link at a
         stage boundary, so counting them would reward splitting stages.
* alpha = the share of oct that shrinks with more replicas: everything but the
         launch overhead (each replica still launches every kernel).
* beta  = the share of odt that shrinks with more replicas: the input data is
         split between replicas, the all-reduce volume per replica is not.
* activation_size (docs/spec.md section 1b) = bytes per sample a layer keeps for its
         backward pass, from its shapes: a dense layer or convolution its input,
         an elementwise layer or norm its input, dropout a one-byte mask, a max
         pool its input, a sum pool nothing, attention its input, Q, K, V, the
         attention probabilities and the context, an embedding its ids.
* sharded (docs/spec.md section 1b): the CTR embedding table lives on parameter
         servers, split across them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

HERE = Path(__file__).parent
FLOAT = 4  # bytes, fp32


@dataclass(frozen=True)
class Device:
    name: str
    flops: float  # sustained FLOP/s for dense math, fp32
    mem_bw: float  # bytes/s
    overhead: float  # s per layer per batch (kernel launches, forward + backward)
    link: float  # bytes/s this unit can send and receive
    source: str


DEVICES = {
    "cpu": Device(
        "cpu",
        40e9,
        6e9,
        20e-6,
        1.5e9,
        "one Xeon Gold 6271C core (paper's CPU servers): ~40 GFLOP/s AVX-512 sustained, "
        "~6 GB/s of memory bandwidth per core, 100 Gb/s NIC shared by 48 cores + PS traffic ~1.5 GB/s",
    ),
    "v100": Device(
        "v100",
        10e12,
        700e9,
        30e-6,
        10e9,
        "V100: 15.7 TFLOP/s fp32 peak at ~65% sustained, 900 GB/s HBM2 at ~78%, "
        "PCIe 3 x16 ~12 GB/s less protocol overhead",
    ),
    "a100": Device(
        "a100",
        30e12,
        1.5e12,
        25e-6,
        20e9,
        "A100: 156 TFLOP/s TF32 peak at ~20% sustained for these shapes, 2 TB/s HBM2e at ~75%, "
        "PCIe 4 x16 ~25 GB/s less overhead",
    ),
}


@dataclass(frozen=True)
class LayerShape:
    name: str
    type: str
    flops: float  # forward FLOPs per sample
    touched: float  # forward bytes read+written per sample (memory-bound work)
    input_size: float  # bytes of input per sample
    weight_size: float  # bytes of parameters
    sync: float  # bytes each replica exchanges per batch for its parameters (0 if none)
    moved: float = 0.0  # bytes per sample this layer reads from off the device
    saved: float = 0.0  # bytes per sample kept for the backward pass (docs/spec.md section 1b activation_size)
    sharded: bool = False  # weights split across the stage's replicas (docs/spec.md section 1b)


def fc(name, n_in, n_out, tokens=1):
    w = (n_in * n_out + n_out) * FLOAT
    return LayerShape(
        name,
        "fc",
        2 * n_in * n_out * tokens,
        (n_in + n_out) * tokens * FLOAT,
        n_in * tokens * FLOAT,
        w,
        2 * w,
        saved=n_in * tokens * FLOAT,
    )


def elementwise(name, kind, elements, saved_per_element=FLOAT):
    return LayerShape(
        name, kind, 4 * elements, 2 * elements * FLOAT, elements * FLOAT, 0, 0, saved=elements * saved_per_element
    )


def conv(name, c_in, c_out, size):  # 3x3, stride 1, "same" padding
    w = (c_in * c_out * 9 + c_out) * FLOAT
    return LayerShape(
        name,
        "conv",
        2 * c_in * c_out * 9 * size * size,
        (c_in + c_out) * size * size * FLOAT,
        c_in * size * size * FLOAT,
        w,
        2 * w,
        saved=c_in * size * size * FLOAT,
    )


def pool(name, channels, size):  # 2x2 max pool, stride 2
    return LayerShape(
        name,
        "pool",
        channels * size * size,
        1.25 * channels * size * size * FLOAT,
        channels * size * size * FLOAT,
        0,
        0,
        saved=channels * size * size * FLOAT,
    )


def times(layer: LayerShape, dev: Device, batch: int) -> dict:
    busy = max(3 * layer.flops * batch / dev.flops, 3 * layer.touched * batch / dev.mem_bw)
    oct_ = busy + dev.overhead
    acts = layer.moved * batch
    odt = (layer.sync + acts) / dev.link
    return {
        "oct": float(f"{oct_:.4g}"),
        "odt": float(f"{odt:.4g}"),
        "alpha": round(busy / oct_, 3),
        "beta": round(acts / (layer.sync + acts), 3) if odt > 0 else 1.0,
    }


def ctr() -> tuple[list[LayerShape], int]:
    """A sparse CTR DNN as in HeterPS: 26 sparse slots, ~10 ids each, 16-dim embeddings."""
    slots, ids, dim, rows = 26, 10, 16, 16_000_000
    touched = slots * ids * dim * FLOAT
    # The table lives on parameter servers: each replica pulls and pushes the rows its
    # samples touch, so that traffic is per sample (parallel), with no dense all-reduce.
    emb = LayerShape(
        "embedding",
        "embedding",
        0,
        touched,
        slots * ids * 8,
        rows * dim * FLOAT,
        0,
        moved=slots * ids * 8 + 2 * touched,
        saved=slots * ids * 8,
        sharded=True,
    )
    return [
        emb,
        elementwise("sum_pool", "pool", slots * ids * dim, saved_per_element=0),
        fc("fc1", slots * dim, 1024),
        elementwise("relu1", "activation", 1024),
        fc("fc2", 1024, 512),
        elementwise("relu2", "activation", 512),
        fc("fc3", 512, 256),
        elementwise("relu3", "activation", 256),
        fc("fc4", 256, 1),
        elementwise("logloss", "loss", 1),
    ], 4096


def vgg16() -> tuple[list[LayerShape], int]:
    """VGG-16 on 224x224 RGB images; ReLUs fused into the convolutions."""
    layers, c, size = [], 3, 224
    for block, (width, n) in enumerate([(64, 2), (128, 2), (256, 3), (512, 3), (512, 3)], start=1):
        for i in range(1, n + 1):
            layers.append(conv(f"conv{block}_{i}", c, width, size))
            c = width
        layers.append(pool(f"pool{block}", c, size))
        size //= 2
    layers += [
        fc("fc6", 512 * 7 * 7, 4096),
        elementwise("dropout6", "dropout", 4096, saved_per_element=1),
        fc("fc7", 4096, 4096),
        elementwise("dropout7", "dropout", 4096, saved_per_element=1),
        fc("fc8", 4096, 1000),
        elementwise("softmax_loss", "loss", 1000),
    ]
    return layers, 64


def transformer() -> tuple[list[LayerShape], int]:
    """A 12-block encoder (BERT-base shapes: d=768, 12 heads, sequence 128)."""
    L, d, vocab = 128, 768, 30522
    touched = L * d * FLOAT
    layers = [
        LayerShape(
            "embedding",
            "embedding",
            0,
            3 * touched,
            L * 8,
            (vocab + 512) * d * FLOAT,
            2 * (vocab + 512) * d * FLOAT,
            saved=L * 8,
        )
    ]
    for b in range(1, 13):
        w = 4 * (d * d + d) * FLOAT
        layers += [
            LayerShape(
                f"attn{b}",
                "attention",
                8 * L * d * d + 4 * L * L * d,
                6 * touched,
                touched,
                w,
                2 * w,
                saved=5 * touched + 12 * L * L * FLOAT,  # input, Q, K, V, context; 12 heads' probabilities
            ),
            elementwise(f"norm{b}a", "norm", L * d),
            fc(f"ffn{b}_up", d, 4 * d, tokens=L),
            elementwise(f"gelu{b}", "activation", 4 * L * d),
            fc(f"ffn{b}_down", 4 * d, d, tokens=L),
            elementwise(f"norm{b}b", "norm", L * d),
        ]
    layers += [fc("pooler", d, d), elementwise("cls_loss", "loss", 2)]
    return layers, 32


EXAMPLES = {
    # name: (builder, types, job)
    "ctr": (ctr, ("cpu", "v100", "a100"), {"samples": 1_000_000_000, "epochs": 1, "min_throughput": 150_000}),
    "vgg16": (vgg16, ("cpu", "v100", "a100"), {"samples": 1_281_167, "epochs": 10, "min_throughput": 600}),
    "transformer": (
        transformer,
        ("cpu", "v100", "a100"),
        {"samples": 10_000_000, "epochs": 1, "min_throughput": 1_000},
    ),
}


def _num(x: float) -> str:
    return repr(int(x)) if float(x).is_integer() and abs(x) < 1e15 else repr(float(x))


def render(name: str) -> str:
    build, types, job = EXAMPLES[name]
    layers, batch = build()
    if layers[0].moved == 0:  # the first layer reads the training input
        layers[0] = replace(layers[0], moved=layers[0].input_size)
    lines = [
        f"# {name}: generated by profiles/make_examples.py -- edit that script, not this file.",
        "# estimated, not measured: oct/odt/alpha/beta come from FLOP and byte counts and these",
        "# device constants (see the script's docstring for the formulas):",
    ]
    lines += [f"#   {t}: {DEVICES[t].source}" for t in types]
    lines += [
        f"model: {name}",
        f"batch_size: {batch}",
        "job:",
        f"  samples: {job['samples']}",
        f"  epochs: {job['epochs']}",
        f"  min_throughput: {job['min_throughput']}",
        "layers:",
    ]
    for layer in layers:
        lines += [
            f"  - name: {layer.name}",
            f"    type: {layer.type}",
            f"    input_size: {_num(layer.input_size)}",
            f"    weight_size: {_num(layer.weight_size)}",
            f"    activation_size: {_num(layer.saved)}",
            *(["    sharded: true"] if layer.sharded else []),
            "    times:",
        ]
        for t in types:
            e = times(layer, DEVICES[t], batch)
            lines.append(
                f"      {t}: {{oct: {_num(e['oct'])}, odt: {_num(e['odt'])}, alpha: {e['alpha']}, beta: {e['beta']}}}"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    for name in EXAMPLES:
        (HERE / f"{name}.yaml").write_text(render(name), encoding="utf-8")
        print(f"wrote profiles/{name}.yaml")


if __name__ == "__main__":
    main()
