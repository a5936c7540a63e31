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
from heterps_cli.shell import Word, address, command, comment, quote
from heterps_cli.slurm import SlurmOptions, check_lines, components, slurm_script


@dataclass(frozen=True)
class NodeLaunch:
    index: int  # torchrun's node rank
    node: str  # the plan's name for it (KIND#i), or "this machine"
    kind: str | None  # its node kind, or None for a plan without nodes
    processes: int
    command: str


@dataclass(frozen=True)
class NodeNeeds:
    """What the processes of a launch need of the nodes: the environment they run in, each node's GPUs,
    and the threads of a process (each Slurm component asks for the most any of its nodes needs)."""

    env: tuple[tuple[str, str], ...] = ()
    gpus: tuple[int, ...] = ()  # per node, in launch order: its processes on a GPU type
    threads: int = 1  # per process


@dataclass(frozen=True)
class Launch:
    nodes: tuple[NodeLaunch, ...]
    slurm: str
    env: tuple[tuple[str, str], ...] = ()
    setup: str | None = None  # a shell line each node runs first (heterps launch --setup)
    shared: tuple[str, ...] = ()  # the paths every node must see

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
    slurm: SlurmOptions | None = None,
) -> Launch:
    """The commands that run ``plan`` (a :class:`~heterps_cli.formats.Plan` read from ``plan_path``)
    node by node; ``run_args`` are ``heterps run``'s own options (``--model``, ``--map``, ...). The
    plan is named by its absolute path: every node starts in its own directory, and a name like
    ``-x.yaml`` is never read as an option. ``needs``: the environment and each node's GPUs; ``source``:
    the plan as the user named it, for the scripts' comments (``plan_path`` is the copy they run);
    ``slurm``: what the batch script asks of Slurm, and the setup and shared paths every script checks."""
    needs = needs or NodeNeeds()
    placed = all(s.nodes is not None for s in plan.stages)
    counts = per_node(plan.stages) if placed else {"this machine": plan.processes}
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
    slurm = slurm or SlurmOptions()
    parts = components(counts, [n.kind for n in nodes], needs.gpus or tuple(0 for _ in counts))
    script = slurm_script(plan, source or plan_path, run, parts, master_port, needs.env, needs.threads, slurm)
    return Launch(tuple(nodes), script, needs.env, slurm.setup, slurm.shared)


def _exports(env: tuple[tuple[str, str], ...]) -> list[str]:
    return [f"export {name}={quote(value)}" for name, value in env]


def node_script(plan_path: str, launch: Launch, node: NodeLaunch) -> str:
    head = f"node {node.index} of {len(launch.nodes)}: {node.node}" + (f" (a {node.kind})" if node.kind else "")
    lines = [
        "#!/bin/sh",
        comment(f"heterps launch {plan_path}: {head}, {plural(node.processes, 'process', 'processes')}"),
        f"# of {launch.world_size} in all. Run it on that node; node 0's address is MASTER_ADDR on every node.",
        "# Every node must see the plan copy, the task or model file and the checkpoint folder at these paths (a",
        "# shared file system); this script checks before it starts.",
        "set -eu",
        *([launch.setup] if launch.setup else []),
    ]
    if '"$MASTER_ADDR"' in node.command:
        lines.append(': "${MASTER_ADDR:?set MASTER_ADDR to the address of node 0, the same on every node}"')
    lines += check_lines(launch.shared, f"this machine (node {node.index})")
    lines += [*_exports(launch.env), node.command, ""]
    return "\n".join(lines)


NETWORK_FS = frozenset(
    "nfs nfs4 lustre gpfs beegfs cephfs ceph glusterfs fuse.glusterfs cifs smb3 panfs wekafs afs fuse.sshfs 9p".split()
)


def local_file_system(path: str, mounts: str = "/proc/self/mounts") -> tuple[str, str] | None:
    """The type and mount point of the file system holding ``path`` (or the nearest folder above it
    that exists) where it is none that machines share; None where it is one, or unknown."""
    try:
        with open(mounts, encoding="utf-8", errors="replace") as f:
            table = [line.split()[1:3] for line in f if len(line.split()) >= 3]
    except OSError:
        return None
    where = os.path.realpath(path)
    best: tuple[str, str] | None = None
    for point, kind in table:
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), point)  # \040 is a space
        inside = where == point or where.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best[1])):
            best = (kind, point)
    return best if best is not None and best[0] not in NETWORK_FS else None
