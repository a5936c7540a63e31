"""A placed plan's processes node by node (docs/spec.md section 1e; docs/guide/launching.md): pure, no torch.

A plan's ranks go stage by stage (:mod:`.layout`); ``torchrun`` numbers its processes node by node,
each node's contiguous. With ``heterps run --placed`` every process turns its torchrun rank into
the plan rank the placement puts there: the nodes in the order the plan names them (``KIND#i``),
and on each node the replicas the plan places on it, stage by stage. A replica at tensor-parallel
degree ``d`` is ``d`` processes, its shards, all on the node it is placed on (section 1h: its
shards gather inside the node), each on a unit of its own. A process's GPU is its place among that
node's processes of its type, not its torchrun local rank, since a node may run CPU replicas
beside GPU ones.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Process:
    node: str
    rank: int  # the plan's rank (stage by stage)
    resource: str
    device_index: int  # its place among this node's replicas of its type: cuda:N for a GPU type


def nodes_in_order(stages) -> list[str]:
    """The nodes a placed plan uses, in the order it names them (first use, stage by stage, part by part)."""
    return list(dict.fromkeys(node for s in stages for p in s.parts for node in (p.nodes or {})))


def processes(stages) -> list[Process]:
    r"""Every process of a placed plan, node by node in :func:`nodes_in_order`: what torchrun rank
    ``g`` is (the plan's :class:`~heterps_cli.formats.Stage`\ s, each with its :attr:`parts`)."""
    parts = [p for s in stages for p in s.parts]
    if any(p.nodes is None or sum(p.nodes.values()) != p.replicas for p in parts):
        raise ValueError("the plan does not place every replica on a node")
    on_node: dict[str, list[tuple[int, str]]] = {node: [] for node in nodes_in_order(stages)}
    rank = 0
    for p in parts:  # ranks go stage by stage, part by part within a stage, a replica's shards together
        width = p.tp or 1
        for node, count in p.nodes.items():
            on_node[node] += [(r, p.resource) for r in range(rank, rank + count * width)]
            rank += count * width
    out = []
    for node, ranks in on_node.items():
        seen: dict[str, int] = {}
        for rank, resource in ranks:
            out.append(Process(node, rank, resource, seen.get(resource, 0)))
            seen[resource] = seen.get(resource, 0) + 1
    return out


def per_node(stages) -> dict[str, int]:
    """Processes each node runs (torchrun's ``--nproc-per-node`` there), in launch order."""
    counts: dict[str, int] = {}
    for p in processes(stages):
        counts[p.node] = counts.get(p.node, 0) + 1
    return counts
