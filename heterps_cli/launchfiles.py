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
from heterps_cli.figures import plural
from heterps_cli.runtime.placement import per_node, processes
from heterps_cli.shell import Env, Word, address, command, comment, quote


@dataclass(frozen=True)
class NodeLaunch:
    index: int  # torchrun's node rank
    node: str  # the plan's name for it (KIND#i), or "this machine"
    kind: str | None  # its node kind, or None for a plan without nodes
    processes: int
    command: str


@dataclass(frozen=True)
class NodeNeeds:
    """What the processes of a launch need of every node: the environment they run in, and the most GPUs
    and cores any one node's processes use (Slurm asks each node for that many)."""

    env: tuple[tuple[str, str], ...] = ()
    gpus: tuple[int, ...] = ()  # per node, in launch order: its processes on a GPU type
    threads: int = 1  # per process


@dataclass(frozen=True)
class Launch:
    nodes: tuple[NodeLaunch, ...]
    slurm: str
    env: tuple[tuple[str, str], ...] = ()

    @property
    def world_size(self) -> int:
        return sum(n.processes for n in self.nodes)


IFNAME = re.compile(r"[A-Za-z0-9_.:-]{1,15}")


def node_needs(plan, devices: dict[str, str], threads: int, ifname: str | None) -> NodeNeeds:
    """Each node's GPUs (its processes of a type ``devices`` maps to ``cuda``) and the processes'
    environment: ``OMP_NUM_THREADS`` (torch's threads, and OpenMP's in the libraries under it), NCCL
    ending a job whose collective failed instead of leaving it hung where GPUs take part, and the
    interface gloo and NCCL use where given. ValueError where the plan does not place every replica."""
    on_gpu = {t for t, d in devices.items() if d.startswith("cuda")}
    if all(s.nodes is not None for s in plan.stages):
        gpus: dict[str, int] = {}
        for p in processes(plan.stages):
            gpus[p.node] = gpus.get(p.node, 0) + (p.resource in on_gpu)
        per_node = tuple(gpus.values())
    else:
        per_node = (sum(s.units for s in plan.stages if s.resource in on_gpu),)
    env = [("OMP_NUM_THREADS", str(threads))]
    if on_gpu:
        env.append(("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"))
    if ifname is not None:
        if not IFNAME.fullmatch(ifname):
            raise InputError(None, None, "--ifname", f"{ifname!r} is not a network interface name (as ip link lists)")
        env += [("GLOO_SOCKET_IFNAME", ifname), ("NCCL_SOCKET_IFNAME", ifname)]
    return NodeNeeds(tuple(env), per_node, threads)


def launch_for(
    plan,
    plan_path: str,
    run_args: list[str],
    *,
    master_addr: str = "$MASTER_ADDR",
    master_port: int = 29500,
    needs: NodeNeeds | None = None,
    source: str | None = None,
) -> Launch:
    """The commands that run ``plan`` (a :class:`~heterps_cli.formats.Plan` read from ``plan_path``)
    node by node; ``run_args`` are ``heterps run``'s own options (``--model``, ``--map``, ...). The
    plan is named by its absolute path: every node starts in its own directory, and a name like
    ``-x.yaml`` is never read as an option. ``needs``: the environment and each node's GPUs; ``source``:
    the plan as the user named it, for the scripts' comments (``plan_path`` is the copy they run)."""
    needs = needs or NodeNeeds()
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
    return Launch(tuple(nodes), _slurm(plan, source or plan_path, run, counts, master_port, needs), needs.env)


SHARED = (
    "# Every node must see the plan copy, the task or model file and the checkpoint folder at these paths (a "
    "shared file system), and run a Python with heterps installed."
)


def _exports(env: tuple[tuple[str, str], ...]) -> list[str]:
    return [f"export {name}={quote(value)}" for name, value in env]


def node_script(plan_path: str, launch: Launch, node: NodeLaunch) -> str:
    head = f"node {node.index} of {len(launch.nodes)}: {node.node}" + (f" (a {node.kind})" if node.kind else "")
    lines = [
        "#!/bin/sh",
        comment(f"heterps launch {plan_path}: {head}, {plural(node.processes, 'process', 'processes')}"),
        f"# of {launch.world_size} in all. Run it on that node; node 0's address is MASTER_ADDR on every node.",
        SHARED,
        "set -eu",
    ]
    if '"$MASTER_ADDR"' in node.command:
        lines.append(': "${MASTER_ADDR:?set MASTER_ADDR to the address of node 0, the same on every node}"')
    lines += [*_exports(launch.env), node.command, ""]
    return "\n".join(lines)


def _slurm(plan, plan_path: str, run: list[Word], counts: dict[str, int], master_port: int, needs: NodeNeeds) -> str:
    """An sbatch script: one task per node, each starting torchrun with its own process count. Slurm
    numbers a job's nodes 0..N-1; node kinds must land in the plan's order (a heterogeneous job, or
    --nodelist), which the header lists. Every node is asked for the most GPUs and cores a node needs."""
    n, total = len(counts), plural(sum(counts.values()), "process", "processes")
    lines = [
        "#!/bin/bash",
        comment(f"heterps launch {plan_path}: {total} on {plural(n, 'node')}."),
        "# Slurm node i must be the plan's node i (its kind below): use --nodelist, or one component per",
        "# kind of a heterogeneous job, in this order.",
        SHARED,
    ]
    gpus = needs.gpus or tuple(0 for _ in counts)
    lines += [
        comment(f"  node {i}: {node}, {plural(count, 'process', 'processes')}" + (f", {g} on GPUs" if g else ""))
        for i, ((node, count), g) in enumerate(zip(counts.items(), gpus, strict=True))
    ]
    lines += [
        f"#SBATCH --job-name=heterps-{_slug(plan.model)}",
        f"#SBATCH --nodes={n}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --cpus-per-task={max(counts.values()) * needs.threads}",
        *([f"#SBATCH --gres=gpu:{max(gpus)}"] if max(gpus) else []),
        "set -euo pipefail",
        *_exports(needs.env),
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
