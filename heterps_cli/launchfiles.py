"""Launch files for a placed plan (``heterps launch``, docs/guide/launching.md): one ``torchrun`` command
per node, and a Slurm batch script that runs them.

Every node runs ``heterps run PLAN --placed`` under ``torchrun``, with as many processes as the plan
places on it (:func:`heterps_cli.runtime.placement.per_node`), in the order the plan names its
nodes: node rank ``i`` is the plan's ``i``-th node, and torchrun rank ``g`` is the plan rank
:func:`heterps_cli.runtime.placement.processes` puts there. A plan with one node (or none: a
cluster priced per unit, all on this machine) runs with ``torchrun --standalone``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from heterps_cli.errors import InputError
from heterps_cli.runtime.placement import per_node
from heterps_cli.shell import Env, Word, address, command, comment, quote

# What a launch writes into its folder; the same names left there by an earlier launch are removed.
LAUNCH_FILES = re.compile(r"node-\d+\.sh|launch\.sbatch")


@dataclass(frozen=True)
class NodeLaunch:
    index: int  # torchrun's node rank
    node: str  # the plan's name for it (KIND#i), or "this machine"
    kind: str | None  # its node kind, or None for a plan without nodes
    processes: int
    command: str


@dataclass(frozen=True)
class Launch:
    nodes: tuple[NodeLaunch, ...]
    slurm: str

    @property
    def world_size(self) -> int:
        return sum(n.processes for n in self.nodes)


def launch_for(
    plan,
    plan_path: str,
    run_args: list[str],
    *,
    master_addr: str = "$MASTER_ADDR",
    master_port: int = 29500,
) -> Launch:
    """The commands that run ``plan`` (a :class:`~heterps_cli.formats.Plan` read from ``plan_path``)
    node by node; ``run_args`` are ``heterps run``'s own options (``--model``, ``--map``, ...). The
    plan is named by its absolute path: every node starts in its own directory, and a name like
    ``-x.yaml`` is never read as an option."""
    placed = all(s.nodes is not None for s in plan.stages)
    if placed and any(s.tp for s in plan.stages):
        raise InputError(
            plan_path,
            None,
            "stages",
            "the plan places tensor-parallel replicas (tp) on nodes, which heterps launch does not lay out yet: "
            "run it under torchrun with heterps run (a process per shard), or plan at tp 1",
        )
    counts = per_node(plan.stages) if placed else {"this machine": sum(s.units for s in plan.stages)}
    run: list[Word] = ["-m", "heterps_cli", "run", os.path.abspath(plan_path), *(["--placed"] if placed else [])]
    run += run_args
    nodes = []
    for i, (node, n) in enumerate(counts.items()):
        where: list[Word]
        if len(counts) == 1:
            where = ["--standalone", "--nnodes", "1"]
        else:
            where = ["--nnodes", str(len(counts)), "--node-rank", str(i)]
            where += ["--master-addr", address(master_addr), "--master-port", str(master_port)]
        argv: list[Word] = ["torchrun", *where, "--nproc-per-node", str(n), *run]
        kind = node.rpartition("#")[0] if placed else None
        nodes.append(NodeLaunch(i, node, kind, n, command(argv)))
    return Launch(tuple(nodes), _slurm(plan, plan_path, run, counts, master_port))


def node_script(plan_path: str, launch: Launch, node: NodeLaunch) -> str:
    head = f"node {node.index} of {len(launch.nodes)}: {node.node}" + (f" (a {node.kind})" if node.kind else "")
    lines = [
        "#!/bin/sh",
        comment(f"heterps launch {plan_path}: {head}, {node.processes} processes"),
        f"# of {launch.world_size} in all. Run it on that node; node 0's address is MASTER_ADDR on every node.",
        "set -eu",
        node.command,
        "",
    ]
    return "\n".join(lines)


def _slurm(plan, plan_path: str, run: list[Word], counts: dict[str, int], master_port: int) -> str:
    """An sbatch script: one task per node, each starting torchrun with its own process count. Slurm
    numbers a job's nodes 0..N-1; node kinds must land in the plan's order (a heterogeneous job, or
    --nodelist), which the header lists."""
    n = len(counts)
    lines = [
        "#!/bin/bash",
        comment(f"heterps launch {plan_path}: {sum(counts.values())} processes on {n} node{'s' if n != 1 else ''}."),
        "# Slurm node i must be the plan's node i (its kind below): use --nodelist, or one component per",
        "# kind of a heterogeneous job, in this order.",
    ]
    lines += [comment(f"  node {i}: {node}, {count} processes") for i, (node, count) in enumerate(counts.items())]
    lines += [
        f"#SBATCH --job-name=heterps-{_slug(plan.model)}",
        f"#SBATCH --nodes={n}",
        "#SBATCH --ntasks-per-node=1",
        "set -euo pipefail",
        'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "export MASTER_ADDR",
    ]
    # Each node's own task picks its process count: the case runs there, under srun.
    per_task = ['case "$SLURM_NODEID" in']
    per_task += [f"  {i}) NPROC={count} ;;" for i, count in enumerate(counts.values())]
    per_task += ['  *) echo "heterps: the plan has no node $SLURM_NODEID" >&2; exit 2 ;;', "esac"]
    rendezvous: list[Word] = ["--nnodes", str(n), "--node-rank", Env("SLURM_NODEID"), "--master-addr"]
    rendezvous += [Env("MASTER_ADDR"), "--master-port", str(master_port), "--nproc-per-node", Env("NPROC")]
    per_task.append(f"exec {command(['torchrun', *rendezvous, *run])}")
    lines.append("srun --ntasks-per-node=1 bash -c " + quote("\n".join(per_task)))
    lines.append("")
    return "\n".join(lines)


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in text)[:40] or "plan"
