"""heterps's plans for GPT-Neo-2.7B beside a published planner's (Sailor, SOSP'25), on the shared data.

    python benchmarks/bench_sailor_plans.py            # the tables
    python benchmarks/bench_sailor_plans.py --keep DIR # also keep the profile and clusters it writes

One profile of GPT-Neo-2.7B from Sailor's data (eth-easl/sailor, MIT licence, kept unmodified in
``benchmarks/data/sailor-gpt-neo``), every figure one the data measures or states:

* **unit**: one GPU at tensor parallelism 1 (the peer's), or ``tp`` GPUs of a node at tp 4 (as
  ``bench_fidelity_gpu.py``; sizes are one GPU's share, ``llm_info.json`` at that tp, and so is
  memory); types ``gh200``, ``a100_40``, ``a100_80`` and ``v100`` (Sailor's GH-96, A100-40, A100-80,
  V100-16), each where the data measures it at that tp.
* **times at every micro-batch size** ``profiles_tmp.json`` has at that tp for that GPU (docs/spec.md
  section 1f): **oct** = fwd + bwd at that size, **forward** = fwd (section 1g: what a stage that
  recomputes its activations runs again), **update** the measured optimiser step. **alpha** at
  a size ``s``: the part of the time that halves with half the samples, ``2 (1 - t(s/2) / t(s))`` from
  the measured time at ``s/2`` (clipped to 0..1; 1 at the smallest size, which nothing splits).
  **batch_size** the largest size every GPU was measured at; the others under ``batches``.
* **odt** = the layer's gradient bytes over the fitted node-to-node bandwidth of one GPU at that
  message size (as ``bench_fidelity_gpu.py``; A100-80 has no fit in the data and takes A100-40's);
  **bandwidth_gbps** the same fit at one sample's boundary activations.
* **memory**: each GPU's ``mem_per_gpu``; **state_factor** 4 (fp32 weights, gradients, two Adam
  moments); **activation_size** ``act_mem_bytes``; **memory_reserved_gb** what
  ``bench_fidelity_gpu.py`` measures the runtime to hold on a GH200 (its calibration run), on every GPU.
* **job**: global batch 1,024 samples (Sailor's runs), objective time (the fastest plan).
* **price**: Sailor's 11.06 USD per GH200 GPU-hour; for the others GCP's on-demand list prices per
  GPU-hour (A100-40 3.67, A100-80 5.07, V100 2.48), times the GPUs of a unit: only ties depend on
  them (the objective is time).

The peer's plans (stages x replicas, layer ranges; each replica trains micro-batches of 1 sample, so a
stage's micro-batch is its replica count ``k``, with ``ceil(1024 / k)`` of them per step, rescaled to
1,024 samples) are scored by heterps's model on the same profile. Each row also times the whole
``heterps plan --scheduler exact`` command.

Two more tables (issue 48): one profile whose unit is one GPU with every layer's times at tp 1, 2 and 4
(docs/spec.md section 1h; sizes per degree from ``llm_info.json``) on GH200 nodes of four GPUs, each
stage choosing its degree, against the best plan at each one degree; and GPT-Neo-2.7B at sequence
8,192, derived from the measured 2,048 by each layer's multiply-adds and its tokens (:func:`at_sequence`),
with and without forward times (recomputation).
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_fidelity_gpu import CALIBRATION, bandwidth, measured_reserved  # noqa: E402
from benchmarks.tables import header, row  # noqa: E402
from heterps_cli.formats import Cluster, Profile  # noqa: E402
from heterps_cli.plan import make_plan  # noqa: E402
from heterps_cli.problem import build_problem  # noqa: E402
from heterps_cli.stages import labelled  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "sailor-gpt-neo" / "sailor"
MODEL, GLOBAL_BATCH = "GPT-Neo-2.7", 1024
GPUS = {  # heterps type: (Sailor's name, the network fit it takes, USD per GPU-hour)
    "gh200": ("GH-96", "GH-96", 11.06),
    "a100_40": ("A100-40", "A100-40", 3.67),
    "a100_80": ("A100-80", "A100-40", 5.07),
    "v100": ("V100-16", "V100-16", 2.48),
}
GPUS_PER_NODE = 4
# Sailor's plans on GH200 nodes (issue 47): stages x replicas over these layer ranges.
PEER = {
    8: [(0, 16, 16), (17, 33, 16)],
    16: [(0, 16, 32), (17, 33, 32)],
    32: [(a, b, 18) for a, b in ((0, 3), (4, 8), (9, 13), (14, 18), (19, 23), (24, 28), (29, 33))],
    64: [(3 * i, 3 * i + 2, 23) for i in range(10)] + [(30, 33, 23)],
}
CLUSTERS = [  # (name, nodes per type, tensor parallelism: a unit is tp GPUs of one node)
    *((f"gh200 x{n}", {"gh200": n}, tp) for n in PEER for tp in (1, 2, 4)),
    ("a100_40 x16", {"a100_40": 16}, 1),
    ("a100_80 x8", {"a100_80": 8}, 1),
    ("gh200 x4 + a100_80 x4", {"gh200": 4, "a100_80": 4}, 1),
    ("v100 x16", {"v100": 16}, 1),
    ("v100 x16", {"v100": 16}, 4),
    ("a100_40 x8 + v100 x8", {"a100_40": 8, "v100": 8}, 1),
    ("a100_40 x8 + v100 x8", {"a100_40": 8, "v100": 8}, 4),
    ("a100_40 x32 + v100 x32", {"a100_40": 32, "v100": 32}, 1),  # issue 63's mixed cluster
    ("a100_40 x32 + v100 x32", {"a100_40": 32, "v100": 32}, 4),
]


def _alpha(times: dict, layer: int, size: int) -> float:
    """The part of the time at ``size`` that halves with half the samples (the module's rule)."""
    half = times.get(str(size // 2)) if size > 1 else None
    if half is None:
        return 1.0
    t, h = sum(times[str(size)][str(layer)][:2]), sum(half[str(layer)][:2])
    return min(max(2.0 * (1.0 - h / t), 0.0), 1.0)


def _at(times: dict, layer: int, size: int, odt: float) -> dict:
    """A layer's entry at one size: the measured fwd + bwd, its alpha, and the all-reduce."""
    fwd, bwd, _ = times[str(size)][str(layer)]
    return {"oct": fwd + bwd, "odt": odt, "alpha": _alpha(times, layer, size), "beta": 0.0, "forward": fwd}


def profile_and_fits(reserved_gb: float, tp: int) -> tuple[dict, dict]:
    """The profile at tensor parallelism ``tp`` (every GPU measured at it) and each GPU's cluster
    entry but its limit; a unit is ``tp`` GPUs, each holding the same share."""
    data = json.loads((DATA / "Planner/simulations/profiles_tmp.json").read_text())[MODEL]
    sizes = json.loads((DATA / "Planner/llm_info.json").read_text())[MODEL][str(tp)]
    fits = json.loads((DATA / "providers/multizone_bandwidths_het.json").read_text())["us-central1-a"]
    memory = json.loads((DATA / "Planner/simulations/configs/basic_cluster_config.json").read_text())
    at_tp = {t: {s: d[str(tp)] for s, d in data[g].items() if str(tp) in d} for t, (g, _, _) in GPUS.items()}
    gpus = {t: GPUS[t] for t in GPUS if at_tp[t]}
    measured = {t: sorted(int(s) for s in at_tp[t]) for t in gpus}
    main = max(set.intersection(*(set(s) for s in measured.values())))
    layers, entries = [], {}
    for i in range(len(sizes)):
        grads = sizes[str(i)]["params_bytes"]
        times = {}
        for t, (_, net, _) in gpus.items():
            g = at_tp[t]
            fit = fits[net]["1"]["us-central1-a"][net]["1"]
            odt = grads / bandwidth(fit, grads)
            entry = {**_at(g, i, main, odt), "update": g[str(main)][str(i)][2]}
            entry["batches"] = {s: _at(g, i, s, odt) for s in measured[t] if s != main}
            times[t] = entry
        kind = "embedding" if i == 0 else "head" if i == len(sizes) - 1 else "transformer"
        layers.append(
            {
                "name": f"layer{i}",
                "type": kind,
                "input_size": float(sizes[str(i - 1)]["act_output_bytes"]) if i else 0.0,
                "weight_size": float(grads),
                "activation_size": float(sizes[str(i)]["act_mem_bytes"]),
                "times": times,
            }
        )
    boundary = sizes["1"]["act_output_bytes"]
    for t, (gpu, net, price) in gpus.items():
        fit = fits[net]["1"]["us-central1-a"][net]["1"]
        entries[t] = {
            "price": price * tp,
            "unit": f"{gpu} GPU" if tp == 1 else f"{tp} {gpu} GPUs",  # a unit is tp GPUs of one node
            "memory_gb": memory[gpu]["mem_per_gpu"] / 1e9,
            "bandwidth_gbps": bandwidth(fit, boundary) * 8 / 1e9,
            "memory_reserved_gb": round(reserved_gb, 6),
        }
    profile = {
        "model": f"gpt-neo-2.7b-tp{tp}",
        "batch_size": main,
        "state_factor": 4.0,
        "job": {"samples": 1024000.0, "epochs": 1.0, "global_batch": GLOBAL_BATCH},
        "layers": layers,
    }
    return profile, entries


DEGREES = (1, 2, 4)  # the tensor-parallel degrees the data measures


def profile_every_tp(reserved_gb: float) -> tuple[dict, dict]:
    """One profile whose unit is one GPU, with each layer's times at tp 2 and 4 beside tp 1 where the
    data measures them (section 1h), and the layer's one-GPU share of its sizes at each degree
    (``llm_info.json`` at that degree); the entries as :func:`profile_and_fits` at tp 1."""
    profile, entries = profile_and_fits(reserved_gb, 1)
    sizes = json.loads((DATA / "Planner/llm_info.json").read_text())[MODEL]
    for d in DEGREES[1:]:
        shard, _ = profile_and_fits(reserved_gb, d)
        for i, (layer, at_d) in enumerate(zip(profile["layers"], shard["layers"])):
            mine = sizes[str(d)][str(i)]
            layer.setdefault("tp", {})[d] = {
                "weight_size": float(mine["params_bytes"]),
                "activation_size": float(mine["act_mem_bytes"]),
            }
            for t, entry in at_d["times"].items():
                if t in layer["times"]:
                    if shard["batch_size"] != profile["batch_size"]:  # times at the tp-1 profile's sizes
                        entry = _rebased(entry, shard["batch_size"], profile["batch_size"])
                        if entry is None:
                            continue
                    layer["times"][t].setdefault("tp", {})[d] = entry
    profile["model"] = "gpt-neo-2.7b-tp124"
    return profile, entries


def _rebased(entry: dict, own: int, main: int) -> dict | None:
    """An entry measured with ``own`` as its main size, re-keyed on ``main`` (None: not measured there)."""
    sizes = {own: {k: v for k, v in entry.items() if k not in ("batches", "update")}, **entry.get("batches", {})}
    if main not in sizes:
        return None
    out = {**sizes[main], "update": entry.get("update", 0.0)}
    rest = {s: e for s, e in sizes.items() if s != main}
    return {**out, "batches": rest} if rest else out


HIDDEN, SEQUENCE = 2560, 2048  # GPT-Neo-2.7B's hidden size, and the sequence the data was measured at


def block_flops(seq: int) -> float:
    """A transformer block's multiply-adds per token at sequence ``seq``: its matrix products (query, key,
    value, output and the two MLP matrices, 12 h^2) and attention's scores and weighted values (2 s h)."""
    return 12.0 * HIDDEN**2 + 2.0 * seq * HIDDEN


def at_sequence(profile: dict, seq: int) -> dict:
    """The profile at sequence ``seq``, derived from the data's measurements at 2,048 by two named terms:
    time in proportion to each layer's multiply-adds per sample (a block's :func:`block_flops` times the
    tokens; the embedding's and the final norm's in proportion to the tokens), the efficiency the layer
    reaches unchanged; and activation and boundary bytes in proportion to the tokens (the data's own
    activation sizes are linear in the sequence: a block holds s h (4.5 + 28 / tp) floats, no s x s
    scores). The optimiser step and the weights do not change, but for the position table, which grows
    with the sequence (its gradient all-reduce with it)."""
    tokens = seq / SEQUENCE
    out = copy.deepcopy(profile)
    out["model"] = f"{profile['model']}-seq{seq}"
    positions = (seq - SEQUENCE) * HIDDEN * 4.0  # fp32 bytes of the position rows added
    for i, layer in enumerate(out["layers"]):
        block = layer["type"] == "transformer"
        time = tokens * (block_flops(seq) / block_flops(SEQUENCE) if block else 1.0)
        layer["input_size"] *= tokens
        layer["activation_size"] *= tokens
        for sizes in layer.get("tp", {}).values():
            sizes["activation_size"] *= tokens
        if i == 0:
            layer["weight_size"] += positions
            for sizes in layer.get("tp", {}).values():
                sizes["weight_size"] += positions
        for entry in layer["times"].values():
            for shard in [entry, *entry.get("tp", {}).values()]:
                for at in [shard, *shard.get("batches", {}).values()]:
                    at["oct"] *= time
                    at["forward"] *= time
                    if i == 0:  # the all-reduce of the grown table, at the entry's own bandwidth
                        at["odt"] *= (layer["weight_size"]) / (layer["weight_size"] - positions)
    return out


def nodes_cluster(name: str, nodes: dict, entries: dict) -> dict:
    """Section 1e: GPUs in nodes of four (price per node, its four GPUs' list price), one kind per type."""
    return {
        "cluster": name.replace(" ", "").replace("+", "-") + "-nodes",
        "resources": {t: {k: v for k, v in entries[t].items() if k != "price"} for t in nodes},
        "nodes": {
            f"{t}_node": {"price": entries[t]["price"] * GPUS_PER_NODE, "units": {t: GPUS_PER_NODE}, "available": n}
            for t, n in nodes.items()
        },
    }


def cluster_of(name: str, nodes: dict, entries: dict, tp: int) -> dict:
    return {
        "cluster": name.replace(" ", "").replace("+", "-") + f"-tp{tp}",
        "resources": {t: {**entries[t], "limit": n * GPUS_PER_NODE // tp} for t, n in nodes.items()},
    }


def peer_figure(profile: dict, cluster: dict, stages: list) -> tuple[float, bool]:
    """The peer's plan by heterps's model: samples/s rescaled to 1,024 a step, and whether it fits."""
    k = stages[0][2]
    steps = k * math.ceil(GLOBAL_BATCH / k)
    problem = build_problem(
        Profile.model_validate(profile),
        Cluster.model_validate(cluster),
        objective="time",
        global_batch=steps,
        micro_batch=k,
    )
    t = problem.types.index("gh200")
    schedule = labelled(problem.n_types, [(a, b + 1, t) for a, b, _ in stages])
    plan = make_plan(problem, schedule, [r for _, _, r in stages], scheduler="sailor")
    return plan.throughput * GLOBAL_BATCH / steps, plan.feasible


def plan_command(profile_path: Path, cluster_path: Path, *more: str) -> tuple[dict, float]:
    """``heterps plan --scheduler exact --objective time --json``, and its wall time."""
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "heterps_cli", "plan", str(profile_path), str(cluster_path), "-s", "exact"]
        + ["--objective", "time", "--json", *more],
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - start
    if done.returncode not in (0, 3):
        raise SystemExit(f"heterps plan failed:\n{done.stderr}")
    return (json.loads(done.stdout) if done.returncode == 0 else {"error": done.stderr.strip()}), wall


def shape(plan: dict) -> str:
    """A plan's stages as ``type first-last xk``, ``↻`` where the stage recomputes its activations, ``+ type
    xk`` for each type that joins it (section 1i)."""
    parts = [
        f"{s['resource']} {s['first']}-{s['last']} x{s['replicas']}"
        + (f" tp{s['tp']}" if s.get("tp") else "")
        + (" ↻" if s.get("recompute") else "")
        + "".join(f" + {j['resource']} x{j['replicas']}" for j in s.get("joined") or ())
        for s in plan["stages"]
    ]
    return f"{len(parts)} stages: " + ", ".join(parts)


EVERY = "1,2,4"
# Issue 63's mixed clusters at its global batch, with the peer's figure (by heterps's formulas) where the
# issue gives it: on 32 + 32 nodes, layers 0-5 on 32 V100 replicas at tp 4, then four stages of 7 layers on
# 32 A100 GPUs each at tp 1, one sample a replica.
# "1,2,4": the profile of one GPU with every degree (profile_every_tp), each part of each stage its own.
MIXED = [
    ("a100_40 x8 + v100 x8", {"a100_40": 8, "v100": 8}, (1, 4, EVERY), None),
    ("a100_40 x32 + v100 x32", {"a100_40": 32, "v100": 32}, (1, 4, EVERY), 153.8),
    ("gh200 x8 + a100_40 x8", {"gh200": 8, "a100_40": 8}, (1, 4, EVERY), None),
]
MIXED_BATCH = 2048


def mixed_table(folder: Path, profiles: dict) -> None:
    """heterps's plan on each mixed cluster at global batch 2,048 with ``--mixed-stages`` (GPUs of several
    types may share a stage), its cost and the whole command's time, beside the best plan whose every
    stage runs on one type."""
    print(f"\nMixed clusters at global batch {MIXED_BATCH:,} (issue 63):\n")
    columns = ("cluster", "tp", "GPUs", "heterps samples/s", "USD an hour", "micro-batch", "plan", "command s")
    one = ("one type a stage: samples/s", "command s")
    print(header([(c, "l") for c in (*columns, *one, "peer samples/s")]))
    for name, nodes, degrees, peer in MIXED:
        for tp in degrees:
            profile, entries, profile_path = profiles[tp]
            cluster = cluster_of(name, nodes, entries, 1 if tp == EVERY else tp)
            cluster_path = folder / f"{cluster['cluster']}-g{MIXED_BATCH}.yaml"
            cluster_path.write_text(yaml.safe_dump(cluster, sort_keys=False))
            batch = ("--global-batch", str(MIXED_BATCH))
            plan, wall = plan_command(profile_path, cluster_path, *batch, "--mixed-stages")
            single, single_wall = plan_command(profile_path, cluster_path, *batch, "--no-mixed-stages")
            gpus = sum(nodes.values()) * GPUS_PER_NODE
            if "error" in plan:
                cells = [name, str(tp), str(gpus), "none fits", "—", "—", " ".join(plan["error"].split())[:120]]
            else:
                rate = plan["cost_usd"] / plan["time_s"] * 3600
                cells = [name, str(tp), str(gpus), f"{plan['throughput']:,.1f}", f"{rate:,.2f}"]
                cells += [f"{plan['batch_size']} (M {plan['micro_batches']})", shape(plan)]
            alone = "none fits" if "error" in single else f"{single['throughput']:,.1f}"
            said = f"{peer:,.1f}" if peer and tp != 4 else "—"
            print(row([*cells, f"{wall:.2f}", alone, f"{single_wall:.2f}", said]))


def every_tp_table(folder: Path, fixed: dict) -> None:
    """Issue 48's table: on GH200 nodes, each stage's degree chosen (tp 1, 2, 4 all offered) against
    the best plan at each one degree, and the peer's plans."""
    profile, entries, path = fixed["profiles"][EVERY]
    print()
    columns = ("cluster", "heterps, tp chosen", "tp 1", "tp 2", "tp 4", "peer", "chosen / best one tp")
    print(header([(c, "l") for c in (*columns, "plan (tp, ↻ per stage)", "command s")]))
    for n in PEER:
        name = f"gh200 x{n}"
        cluster = nodes_cluster(name, {"gh200": n}, entries)
        cluster_path = folder / f"{cluster['cluster']}.yaml"
        cluster_path.write_text(yaml.safe_dump(cluster, sort_keys=False))
        plan, wall = plan_command(path, cluster_path)
        one = [fixed.get((name, d)) for d in DEGREES]
        best = max((f for f in one if f is not None), default=0.0)
        peer_profile, peer_entries, _ = fixed["profiles"][1]
        peer, _ = peer_figure(peer_profile, cluster_of(name, {"gh200": n}, peer_entries, 1), PEER[n])
        mine = plan.get("throughput", 0.0)
        cells = [name, f"{mine:,.1f}" if "error" not in plan else "none fits"]
        cells += [f"{f:,.1f}" if f is not None else "—" for f in one]
        cells += [f"{peer:,.1f}", f"{mine / best:.3f}" if best else "—"]
        cells += [shape(plan) if "error" not in plan else plan["error"][:80], f"{wall:.2f}"]
        print(row(cells))
    long_sequence_table(folder, profile, entries)


LONG = (("gh200", 4), ("gh200", 8), ("gh200", 16), ("a100_40", 16))  # (GPU, nodes of four)
ENGINES = ("megatron", "torchtitan", "deepspeed", "pipelining")


def engine_table(folder: Path, profiles: dict) -> None:
    """Issue 83's table: each engine's best plan (``plan --engine``: one tensor-parallel and one data-parallel
    degree for every stage; DeepSpeed at tp 1; the pipelining export one GPU a stage) beside heterps run's
    best (each stage its own degree and replicas; on mixed clusters ``--mixed-stages`` too) and the peer's,
    on the profile of one GPU with every degree: what the engine's rules cost."""
    profile, entries, path = profiles[EVERY]
    peer_profile, peer_entries, _ = profiles[1]
    print("\nEach engine's best plan beside heterps run's best and the peer's (issue 83; samples/s, and / heterps):\n")
    columns = ("cluster", "GPUs", "heterps run", *ENGINES, "peer", "engines' command s")
    print(header([(c, "l") for c in columns]))
    rows = [(f"gh200 x{n}", {"gh200": n}, None, True) for n in PEER]
    rows += [(name, nodes, peer, False) for name, nodes, _, peer in MIXED]
    for name, nodes, peer, on_nodes in rows:
        if on_nodes:
            cluster = nodes_cluster(name, nodes, entries)
            more: tuple[str, ...] = ()
            figure, _ = peer_figure(peer_profile, cluster_of(name, nodes, peer_entries, 1), PEER[nodes["gh200"]])
            peer = figure
        else:
            cluster = cluster_of(name, nodes, entries, 1)
            more = ("--global-batch", str(MIXED_BATCH))
        cluster_path = folder / f"{cluster['cluster']}-engines.yaml"
        cluster_path.write_text(yaml.safe_dump(cluster, sort_keys=False))
        free, _ = plan_command(path, cluster_path, *more, *(() if on_nodes else ("--mixed-stages",)))
        best = free.get("throughput", 0.0)
        cells = [name, str(sum(nodes.values()) * GPUS_PER_NODE), f"{best:,.1f}" if best else "none fits"]
        walls = []
        for engine in ENGINES:
            plan, wall = plan_command(path, cluster_path, *more, "--engine", engine)
            walls.append(f"{wall:.1f}")
            got = plan.get("throughput")
            cells.append(f"{got:,.1f} ({got / best:.3f})" if got and best else "none fits")
        cells += [f"{peer:,.1f}" if peer else "—", " / ".join(walls)]
        print(row(cells))


def long_sequence_table(folder: Path, profile: dict, entries: dict) -> None:
    """Issue 48: GPT-Neo-2.7B's shapes at sequence 8,192 (:func:`at_sequence`) on the nodes of :data:`LONG`,
    with every degree and recomputation offered, and with recomputation taken away."""
    long = at_sequence(profile, 8192)
    print()
    columns = ("GPT-Neo-2.7B at sequence 8,192", "nodes", "samples/s", "micro-batch", "plan", "command s")
    print(header([(c, "l") for c in columns]))
    ways = (("every degree, recomputation", long), ("every degree, no forward times", _without_forward(long)))
    for (label, model), (gpu, nodes) in itertools.product(ways, LONG):
        path = folder / f"{model['model']}.yaml"
        path.write_text(yaml.safe_dump(model, sort_keys=False))
        cluster = nodes_cluster(f"{gpu} x{nodes} seq8192", {gpu: nodes}, entries)
        cluster_path = folder / f"{cluster['cluster']}.yaml"
        cluster_path.write_text(yaml.safe_dump(cluster, sort_keys=False))
        plan, wall = plan_command(path, cluster_path)
        if "error" in plan:
            print(
                row([label, f"{gpu} x{nodes}", "none fits", "—", " ".join(plan["error"].split())[:160], f"{wall:.2f}"])
            )
            continue
        cells = [
            label,
            f"{gpu} x{nodes}",
            f"{plan['throughput']:,.1f}",
            f"{plan['batch_size']} (M {plan['micro_batches']})",
        ]
        print(row(cells + [shape(plan), f"{wall:.2f}"]))


def _without_forward(profile: dict) -> dict:
    """The profile with no forward times: no stage can recompute."""
    out = copy.deepcopy(profile)
    out["model"] += "-noforward"
    for layer in out["layers"]:
        for entry in layer["times"].values():
            for shard in [entry, *entry.get("tp", {}).values()]:
                for at in [shard, *shard.get("batches", {}).values()]:
                    at.pop("forward", None)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keep", type=Path, help="keep the profiles and clusters in this folder")
    parser.add_argument("--engines", action="store_true", help="only the engines' table (issue 83)")
    args = parser.parse_args()
    reserved = measured_reserved()
    print(f"memory_reserved_gb {reserved:.2f} per GPU ({CALIBRATION})")
    columns = ("cluster", "tp", "GPUs", "heterps samples/s", "micro-batch", "plan", "command s")
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.keep or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        profiles: dict = {}
        fixed: dict = {"profiles": profiles}  # (cluster, tp): heterps's samples/s at that one degree
        for tp in sorted({tp for _, _, tp in CLUSTERS}):
            profile, entries = profile_and_fits(reserved, tp)
            path = folder / f"{profile['model']}.yaml"
            path.write_text(yaml.safe_dump(profile, sort_keys=False))
            profiles[tp] = profile, entries, path
        every, entries = profile_every_tp(reserved)
        path = folder / f"{every['model']}.yaml"
        path.write_text(yaml.safe_dump(every, sort_keys=False))
        profiles[EVERY] = every, entries, path
        if args.engines:
            engine_table(folder, profiles)
            return
        print(header([(c, "l") for c in (*columns, "peer samples/s", "heterps / peer")]))
        for name, nodes, tp in CLUSTERS:
            profile, entries, profile_path = profiles[tp]
            cluster = cluster_of(name, nodes, entries, tp)
            cluster_path = folder / f"{cluster['cluster']}.yaml"
            cluster_path.write_text(yaml.safe_dump(cluster, sort_keys=False))
            plan, wall = plan_command(profile_path, cluster_path, "--no-mixed-stages")  # the mixed table offers them
            gpus = sum(nodes.values()) * GPUS_PER_NODE
            if "error" in plan:
                why = " ".join(plan["error"].split())
                cells = [name, str(tp), str(gpus), "none fits", "—", why[why.find("(") + 1 :][:140], f"{wall:.2f}"]
            else:
                fixed[name, tp] = plan["throughput"]
                cells = [name, str(tp), str(gpus), f"{plan['throughput']:,.1f}"]
                cells += [f"{plan['batch_size']} (M {plan['micro_batches']})", shape(plan), f"{wall:.2f}"]
            peer = PEER.get(nodes.get("gh200", 0)) if list(nodes) == ["gh200"] and tp == 1 else None
            peer_cells = ["—", "—"]
            if peer is not None:
                figure, fits = peer_figure(profile, cluster, peer)
                ratio = plan["throughput"] / figure if "error" not in plan else 0.0
                peer_cells = [f"{figure:,.1f}" + ("" if fits else " (breaks memory)"), f"{ratio:.3f}"]
            print(row(cells + peer_cells))
        mixed_table(folder, profiles)
        every_tp_table(folder, fixed)
        engine_table(folder, profiles)


if __name__ == "__main__":
    main()
