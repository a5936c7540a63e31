"""Mixed clusters (issue 84 item 5): the whole `heterps plan -s exact` command with mixed stages offered,
its proven gap and its plan, beside the one-type optimum, on the shared GPT-Neo data and on an OPT-30-sized
model derived from it.

    python benchmarks/bench_mixed_clusters.py          # every row (minutes on 2 cores)
    python benchmarks/bench_mixed_clusters.py --quick  # the 8 + 8 rows only

Profiles (``bench_sailor_plans.py``'s, every figure one the data measures or states): GPT-Neo-2.7B with a
unit of one GPU at tp 1, and the same with every layer's times at tp 1, 2 and 4 (each stage, and each part
of a mixed stage, its own degree). The **OPT-30-sized** model: 48 blocks of hidden size 7,168 and the two
end layers (50 layers), each block the measured GPT-Neo block of the same index modulo 32 with its times
scaled by the multiply-adds per token (``12 h^2 + 2 s h``), its weights by ``h^2`` and its activations and
boundary bytes by ``h`` (OPT-30B's sizes; the efficiency a block reaches is GPT-Neo's). Global batch 1,024
(2,048 on the 64 + 64 row), objective time. A GPU node holds 4 GPUs.
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_fidelity_gpu import measured_reserved  # noqa: E402
from benchmarks.bench_sailor_plans import (  # noqa: E402
    GPUS_PER_NODE,
    HIDDEN,
    SEQUENCE,
    cluster_of,
    plan_command,
    profile_and_fits,
    profile_every_tp,
    shape,
)
from benchmarks.tables import markdown  # noqa: E402

OPT30_HIDDEN, OPT30_BLOCKS = 7168, 48

# (cluster, nodes per type, profile: "tp1", "tp124" or "opt30", global batch)
ROWS = [
    ("a100_40 x8 + v100 x8", {"a100_40": 8, "v100": 8}, "tp1", 1024),
    ("a100_40 x8 + v100 x8", {"a100_40": 8, "v100": 8}, "tp124", 1024),
    ("gh200 x8 + a100_40 x8", {"gh200": 8, "a100_40": 8}, "tp124", 1024),
    ("a100_40 x32 + v100 x32", {"a100_40": 32, "v100": 32}, "tp124", 1024),
    ("a100_40 x64 + v100 x64", {"a100_40": 64, "v100": 64}, "tp124", 2048),
    ("gh200 x8 + a100_40 x8 + v100 x8", {"gh200": 8, "a100_40": 8, "v100": 8}, "tp124", 1024),
    ("a100_40 x16 + v100 x16", {"a100_40": 16, "v100": 16}, "opt30", 1024),
]


def opt30_sized(profile: dict) -> dict:
    """The OPT-30-sized model of the module's docstring, from the tp-1 GPT-Neo profile."""
    out = copy.deepcopy(profile)
    out["model"] = "opt-30b-sized"
    first, *blocks, last = out["layers"]
    width = OPT30_HIDDEN / HIDDEN
    flops = (12.0 * OPT30_HIDDEN**2 + 2.0 * SEQUENCE * OPT30_HIDDEN) / (12.0 * HIDDEN**2 + 2.0 * SEQUENCE * HIDDEN)
    grown = []
    for i in range(OPT30_BLOCKS):
        block = copy.deepcopy(blocks[i % len(blocks)])
        block["name"] = f"layer{i + 1}"
        block["weight_size"] *= width**2
        block["input_size"] *= width
        block["activation_size"] *= width
        _scaled(block, flops, width**2)  # the gradients' bytes over the same bandwidth
        grown.append(block)
    for end in (first, last):  # the embedding and the head: a hidden-wide table of the same vocabulary
        end["weight_size"] *= width
        end["activation_size"] *= width
        _scaled(end, width, width)
    last["name"] = f"layer{OPT30_BLOCKS + 1}"
    last["input_size"] *= width
    out["layers"] = [first, *grown, last]
    return out


def _scaled(layer: dict, compute: float, weights: float) -> None:
    """A layer's times on every type at every size: its passes by ``compute``, its all-reduce and optimiser
    step by ``weights`` (its parameters' bytes)."""
    for entry in layer["times"].values():
        for at in [entry, *entry.get("batches", {}).values()]:
            at["oct"] *= compute
            at["forward"] *= compute
            at["odt"] *= weights
        entry["update"] = entry.get("update", 0.0) * weights


def _figures(plan: dict) -> tuple[str, str]:
    if "error" in plan:
        return "none fits", "—"
    proven = "optimal" if plan["optimal"] else (f"{100 * plan['gap']:.2f}%" if plan.get("gap") is not None else "none")
    return f"{plan['throughput']:,.1f}", proven


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="the 8 + 8 rows only")
    parser.add_argument("--keep", type=Path, help="keep the profiles and clusters in this folder")
    args = parser.parse_args()
    reserved = measured_reserved()
    tp1, entries = profile_and_fits(reserved, 1)
    every, _ = profile_every_tp(reserved)
    profiles = {"tp1": tp1, "tp124": every, "opt30": opt30_sized(tp1)}
    rows = [r for r in ROWS if not args.quick or all(n == 8 for n in r[1].values())]
    cells = []
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.keep or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        for name, nodes, kind, batch in rows:
            profile_path = folder / f"{profiles[kind]['model']}.yaml"
            profile_path.write_text(yaml.safe_dump(profiles[kind], sort_keys=False))
            cluster_path = folder / f"{cluster_of(name, nodes, entries, 1)['cluster']}.yaml"
            cluster_path.write_text(yaml.safe_dump(cluster_of(name, nodes, entries, 1), sort_keys=False))
            more = ("--global-batch", str(batch))
            mixed, mixed_s = plan_command(profile_path, cluster_path, *more, "--mixed-stages")
            one, one_s = plan_command(profile_path, cluster_path, *more, "--no-mixed-stages")
            mixes = "error" not in mixed and any(s.get("joined") for s in mixed["stages"])
            gpus = sum(nodes.values()) * GPUS_PER_NODE
            row = [name, kind, str(gpus), str(batch), *_figures(mixed), "yes" if mixes else "no", f"{mixed_s:.1f}"]
            row += [*_figures(one), f"{one_s:.1f}", shape(mixed) if "error" not in mixed else mixed["error"][:100]]
            print(" | ".join(row), file=sys.stderr)
            cells.append(row)
    columns = [("cluster", "l"), ("profile", "l"), ("GPUs", "r"), ("global batch", "r")]
    columns += [("mixed offered: samples/s", "r"), ("proven gap", "r"), ("mixes", "l"), ("command s", "r")]
    columns += [("one type: samples/s", "r"), ("proven gap", "r"), ("command s", "r"), ("plan (mixed offered)", "l")]
    print(markdown(columns, cells))


if __name__ == "__main__":
    main()
