"""Generated layer chains for benchmarks: deterministic from (layers, types, seed).

Layers alternate, at random, between compute-heavy kinds (fc, conv, attention:
GPUs are 20-200x faster than a CPU core) and data-heavy kinds (embedding, pool,
norm: GPUs only 0.5-5x faster, and their links are the bottleneck), which is the
heterogeneity HeterPS exploits. Types are a CPU core (cheap, plentiful) and up to
three GPU kinds (faster, dearer, scarce). ``tight=True`` shrinks the GPU limits
and raises the throughput target so that the limits bind.

``hardware`` adds docs/spec.md section 1b (drawn from a second random stream, so the
chain itself is the same): ``"memory"`` gives every layer an activation size,
shards some embedding tables and gives each type a memory of a fraction of the
whole model's, so that memory binds; ``"bandwidth"`` gives each type a network
bandwidth at which moving a boundary's activations costs about as much as a
fast layer's compute.
"""

from __future__ import annotations

import numpy as np

TYPES = [  # name, price $/h, limit, speed vs a CPU core (compute, data), link speed
    ("cpu", 0.04, 480, (1.0, 1.0), 1.0),
    ("v100", 2.42, 32, (60.0, 2.0), 6.0),
    ("a100", 4.10, 16, (150.0, 4.0), 12.0),
    ("t4", 0.53, 24, (20.0, 1.0), 4.0),
]
COMPUTE, DATA = ("fc", "conv", "attention"), ("embedding", "pool", "norm")


# Section 1b: memory per unit as a share of the whole model's training state and activations,
# and network bandwidth per unit of link speed.
MEMORY_SHARE = {"cpu": 0.06, "v100": 0.25, "a100": 0.4, "t4": 0.15}
GBPS_PER_LINK = 0.5


def chain(n_layers: int, n_types: int, seed: int = 0, tight: bool = False, hardware: str | None = None):
    rng = np.random.default_rng([n_layers, n_types, seed, int(tight)])
    types = TYPES[:n_types]
    layers = []
    for i in range(n_layers):
        heavy = rng.random() < 0.6
        kind = str(rng.choice(COMPUTE if heavy else DATA))
        cpu_oct = float(np.exp(rng.uniform(np.log(0.01), np.log(0.5))))
        cpu_odt = float(np.exp(rng.uniform(np.log(0.001), np.log(0.05 if heavy else 0.2))))
        times = {}
        for name, _, _, (fast_c, fast_d), link in types:
            speed = (fast_c if heavy else fast_d) * float(np.exp(rng.normal(0, 0.3)))
            if name != "cpu" and rng.random() < 0.05:
                continue  # an op this accelerator does not support
            times[name] = {
                "oct": float(f"{cpu_oct / speed:.6g}"),
                "odt": float(f"{cpu_odt / link:.6g}"),
                "alpha": round(float(rng.uniform(0.8, 0.995)), 4),
                "beta": round(float(rng.uniform(0.2, 1.0)), 4),
            }
        layers.append(
            {
                "name": f"{kind}{i}",
                "type": kind,
                "input_size": float(rng.integers(1, 1 << 16)),
                "weight_size": float(rng.integers(0, 1 << 26)),
                "times": times,
            }
        )
    B0 = 256
    # Throughput target: a multiple of what the cheapest single unit per layer would give.
    single = B0 / sum(min(e["oct"] for e in layer["times"].values()) for layer in layers)
    target = single * (8.0 if tight else 2.0)
    profile = {
        "model": f"chain{n_layers}x{n_types}-s{seed}{'-tight' if tight else ''}",
        "batch_size": B0,
        "job": {"samples": 1e8, "epochs": 1, "min_throughput": float(f"{target:.6g}")},
        "layers": layers,
    }
    cluster = {
        "cluster": f"gen{n_types}{'-tight' if tight else ''}",
        "resources": {
            name: {"price": price, "limit": max(2, limit // 4) if tight and name != "cpu" else limit}
            for name, price, limit, _, _ in types
        },
    }
    if hardware is not None:
        _add_hardware(profile, cluster, hardware, np.random.default_rng([n_layers, n_types, seed, int(tight), 1]))
    return profile, cluster


def _add_hardware(profile: dict, cluster: dict, hardware: str, rng: np.random.Generator) -> None:
    B0, layers = profile["batch_size"], profile["layers"]
    for layer in layers:
        layer["activation_size"] = float(int(layer["input_size"] * rng.uniform(0.5, 4.0)))
        if layer["type"] == "embedding" and rng.random() < 0.5:
            layer["sharded"] = True
    profile["model"] += f"-{hardware}"
    cluster["cluster"] += f"-{hardware}"
    links = {name: link for name, _, _, _, link in TYPES}
    if hardware == "memory":
        profile["state_factor"] = 4.0
        whole = sum(4.0 * layer["weight_size"] + B0 * layer["activation_size"] for layer in layers)
        for name, resource in cluster["resources"].items():
            resource["memory_gb"] = float(f"{MEMORY_SHARE[name] * whole / 1e9:.4g}")
    elif hardware == "bandwidth":
        for name, resource in cluster["resources"].items():
            resource["bandwidth_gbps"] = GBPS_PER_LINK * links[name]
    else:
        raise ValueError(f"hardware must be memory or bandwidth, not {hardware!r}")
