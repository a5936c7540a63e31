"""Tied tensors across stages in a run: one tensor of the model, kept one (docs/spec.md section 1j).

Every process builds the whole model and keeps its stage, so a weight that layers of two stages hold
(a tied embedding and output head) becomes one copy per stage. Each copy's gradient would hold only its
own stage's part, and the copies would drift apart. Here, after a step's backward passes, each copy's
gradient is summed over every process of every stage that holds it: the raw gradients of all replicas
of all holders, in one all-reduce, which is the sum one process's autograd makes (Megatron-LM's embedding
group does the same between its first and last stage). Every copy then takes the same optimiser step
from the same state, so the copies stay bit-equal, and a checkpoint holds the tensor once: in its first
holder's stage file; the others name where it is (:func:`drop_copies`, :func:`fill_copies`).

A buffer that stages share is the first holder stage's after every step (a broadcast), and a stage's
replicas take their first replica's buffers after every step (running statistics of normalisation,
as DDP's ``broadcast_buffers`` does): a buffer changed in a forward pass changes identically in every
replica's copy only where they ran the same samples.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from heterps_cli.profiling.ties import Tie, find_ties


@dataclass(frozen=True)
class Crossing:
    """A tie whose holders sit in several stages: the stages, and each holder's stage-local name."""

    tie: Tie
    stages: tuple[int, ...]
    local: dict[int, str]  # stage -> the name of the tensor in that stage's module (its first holder there)


def crossings(modules: list[nn.Module], names: list[str], stages: list[list[str]]) -> list[Crossing]:
    """The ties of a chain whose holders sit in more than one of ``stages`` (each a list of layer names)."""
    where = {name: (s, i) for s, layers in enumerate(stages) for i, name in enumerate(layers)}
    out = []
    for tie in find_ties(modules, names):
        local: dict[int, str] = {}
        for index, name in tie.holders:
            s, position = where[names[index]]
            local.setdefault(s, f"{position}.{name}")
        if len(local) > 1:
            out.append(Crossing(tie, tuple(sorted(local)), local))
    return out


def crossings_of(chain, lay) -> list[Crossing]:
    """:func:`crossings` of a traced chain (:class:`~.chain.Chain`) cut as ``lay`` cuts it."""
    return crossings(chain.modules, chain.names, [list(s.layers) for s in lay.stages])


def check_plan_ties(plan, doc, chain) -> None:
    """Exit 2 where a run could not keep a tied tensor one: a holder in a stage at tp > 1 (its copy would
    be sharded) or in a mixed stage (summed among parts at other degrees)."""
    stage_of = {name: i for i, s in enumerate(plan.stages) for name in s.layers}
    for tie in find_ties(chain.modules, chain.names):
        for index, _ in tie.holders:
            i = stage_of[chain.names[index]]
            stage = plan.stages[i]
            degree = max(p.tp or 1 for p in stage.parts)
            if degree == 1 and len(stage.parts) == 1:
                continue
            how = f"tp {degree}" if len(stage.parts) == 1 else "a mixed stage (parts of several types or degrees)"
            holders = ", ".join(repr(chain.names[h]) for h in tie.layers)
            raise doc.error(
                ("stages", i),
                f"layer {chain.names[index]!r} holds the tied {tie.kind} {tie.tensor} (held by layers {holders}), "
                f"and stage {i} runs it at {how}: heterps run keeps a tied tensor one only in stages of one type at "
                "tp 1; plan again from a profile that records the tie (heterps plan keeps a tie's holders at tp 1 "
                "and out of mixed stages)",
            )


class TiedSums:
    """This process's part in keeping the crossing ties one: their groups (every rank makes every group,
    in the same order, as torch.distributed requires) and the tensors it holds."""

    def __init__(self, chain, lay, stage, module: nn.Module, devices: dict[str, str]):
        self.crossing = crossing = crossings_of(chain, lay)
        self.params: list[tuple[torch.Tensor, object, int]] = []
        self.buffers: list[tuple[torch.Tensor, object, int]] = []
        names: dict[str, list[str]] = {"parameter": [], "buffer": []}
        for c in crossing:
            holding = [lay.stages[s] for s in c.stages]
            ranks = [r for s in holding for r in range(s.first_rank, s.first_rank + s.processes)]
            on_gpus = all(devices[s.kind(r)].startswith("cuda") for s in holding for r in range(s.replicas))
            group = dist.new_group(ranks, backend="nccl" if on_gpus else "gloo")
            if stage.index not in c.local:
                continue
            name = c.local[stage.index]
            names[c.tie.kind].append(c.tie.tensor)
            if c.tie.kind == "parameter":
                self.params.append((module.get_parameter(name), group, holding[0].first_rank))
            else:
                self.buffers.append((module.get_buffer(name), group, holding[0].first_rank))
        self.names = names["parameter"] + names["buffer"]

    @property
    def held(self) -> set[int]:
        """The ids of the parameters summed here, which the stage's own all-reduce leaves out."""
        return {id(p) for p, _, _ in self.params}

    def gradients(self) -> None:
        """Each tied parameter's gradient, the sum over every process of every stage that holds it."""
        for p, group, _ in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            _in_place(dist.all_reduce, p.grad, group)

    def check_equal(self) -> None:
        """Before a checkpoint keeps one copy of each tied parameter: every copy is bit-equal to the first
        holder's (else an internal error: the sums above have failed)."""
        for p, group, src in self.params:
            first = p.detach().clone()
            _in_place(lambda t, group, src=src: dist.broadcast(t, src=src, group=group), first, group)
            if not torch.equal(first, p.detach()):
                diff = float((first - p.detach()).abs().max())
                raise RuntimeError(f"a tied parameter's copies differ by up to {diff:.3g}: a bug in heterps run")

    def digests(self) -> dict[str, str]:
        """Each tied tensor this process holds, by its name in its first holder: a digest of its bytes, which
        the run's report compares across processes."""
        import hashlib

        out = {}
        for (tensor, *_), name in zip((*self.params, *self.buffers), self.names):
            data = tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()
            out[name] = hashlib.blake2b(data, digest_size=16).hexdigest()
        return out

    def after_step(self) -> None:
        """The first holder stage's value of each tied buffer, in every copy."""
        for b, group, src in self.buffers:
            _in_place(lambda t, group, src=src: dist.broadcast(t, src=src, group=group), b, group)


def _in_place(collective, tensor: torch.Tensor, group) -> None:
    """``collective(tensor, group)`` in place, through host memory where the group is gloo's and the tensor
    on a GPU (a tie between a CPU stage and a GPU stage)."""
    if tensor.device.type == "cpu" or dist.get_backend(group) != "gloo":
        collective(tensor, group=group)
        return
    host = tensor.detach().cpu()
    collective(host, group=group)
    with torch.no_grad():
        tensor.copy_(host)


class ReplicaBuffers:
    """A stage's buffers kept its first replica's, as DDP's ``broadcast_buffers`` keeps rank 0's: after the
    first step every replica learns which buffers a step changes (batch normalisation's running statistics
    and counter; a constant mask changes in none), agreed among them with one all-reduce so that all take
    part in the same broadcasts, and from then on those are broadcast from the first replica every step."""

    def __init__(self, module: nn.Module, group, source: int):
        self.group, self.source = group, source
        self.buffers = [b for b in module.buffers() if b is not None]
        self.before: list[torch.Tensor] | None = [b.detach().clone() for b in self.buffers] if group else None
        self.changing: list[torch.Tensor] = []

    def after_step(self) -> None:
        if self.group is None:
            return
        if self.before is not None:  # the first step: which buffers does a step change, on any replica?
            changed = [not torch.equal(a, b) for a, b in zip(self.before, self.buffers)]
            flags = torch.tensor(changed or [False], dtype=torch.int32)
            dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.group)
            self.changing = [b for b, flag in zip(self.buffers, flags.tolist()) if flag]
            self.before = None
        for b in self.changing:
            _in_place(lambda t, group: dist.broadcast(t, src=self.source, group=group), b, self.group)


def drop_copies(state: dict, module: nn.Module, crossing: list[Crossing], stage_index: int) -> dict:
    """A stage file's ``state`` without the tied tensors an earlier stage's file holds: each is named in
    ``tied`` (this stage's key -> the stage and key that hold it), its optimiser state in ``tied_optimizer``."""
    order = [n for n, _ in module.named_parameters()]
    model, optimiser = dict(state["model"]), state["optimizer"]
    kept_state = dict(optimiser["state"])
    tied, tied_opt = {}, {}
    for c in crossing:
        if stage_index not in c.local or c.stages[0] == stage_index:
            continue
        mine, first = c.local[stage_index], c.local[c.stages[0]]
        model.pop(mine, None)
        tied[mine] = [c.stages[0], first]
        if c.tie.kind == "parameter" and mine in order:
            kept_state.pop(order.index(mine), None)
            tied_opt[order.index(mine)] = [c.stages[0], first]
    return {**state, "model": model, "optimizer": {**optimiser, "state": kept_state}, "tied": tied,
            "tied_optimizer": tied_opt}  # fmt: skip


def fill_copies(state: dict, read_stage) -> dict:
    """:func:`drop_copies` undone: each tied tensor (and its optimiser state) from the file of the stage
    that holds it; ``read_stage(index)`` reads that stage's state (its :func:`drop_copies` form)."""
    tied, tied_opt = state.get("tied") or {}, state.get("tied_optimizer") or {}
    if not tied and not tied_opt:
        return state
    model, optimiser = dict(state["model"]), state["optimizer"]
    kept_state = dict(optimiser["state"])
    for mine, (s, key) in tied.items():
        model[mine] = read_stage(s)["model"][key]
    for index, (s, key) in tied_opt.items():
        other = read_stage(s)
        order = other["parameter_order"]
        held = other["optimizer"]["state"].get(order.index(key))
        if held is not None:
            kept_state[int(index)] = held
    return {**state, "model": model, "optimizer": {**optimiser, "state": kept_state}}
