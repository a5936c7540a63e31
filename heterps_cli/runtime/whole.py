"""A checkpoint in the model's own names (docs/spec.md section 4b): what leaves heterps, and what a run
under another plan resumes from.

Each stage's file keys its tensors by the stage's own module (``0.tok.weight``: the stage's first layer),
holds a sharded weight's shards in one file per shard and a tied tensor once. Rank 0 joins them, once every
process has saved, into two more files of the checkpoint:

* ``model.pt``: the model's ``state_dict`` as the user's factory names it, one whole tensor per entry (a
  sharded weight's shards joined, a tied tensor under each of its names, as ``nn.Module.state_dict`` gives
  it), so that ``model.load_state_dict(torch.load(".../model.pt"), strict=True)`` loads it;
* ``optimizer.pt``: the optimiser's state keyed by parameter names, as
  ``torch.distributed.checkpoint.state_dict.get_optimizer_state_dict`` writes it, which
  ``set_optimizer_state_dict(model, optimizer, torch.load(".../optimizer.pt"))`` loads into an optimiser
  over the whole model.

A run resumed under another plan (other stages, replicas, degrees, types or micro-batch, the same job) takes
its stage's part of both: each weight cut as its stage shards it (:func:`stage_part`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

MODEL_FILE = "model.pt"
OPTIMIZER_FILE = "optimizer.pt"


@dataclass(frozen=True)
class Names:
    """The model's names of every stage's tensors: per stage, its module's state key -> the model's key
    (a tied tensor's first name, as ``named_parameters`` gives it); every key of the model's state_dict
    under which each tensor appears (several for a tie); each tensor's whole shape; the model's
    parameters in order."""

    stages: tuple[dict[str, str], ...]
    aliases: dict[str, tuple[str, ...]]
    shapes: dict[str, tuple[int, ...]]
    params: tuple[str, ...]


def names_of(model: nn.Module, stage_modules: list[nn.Module]) -> Names:
    """:class:`Names` of ``model`` cut into ``stage_modules`` (made of its own layers, before any is moved
    or sharded: tensors are matched by identity)."""
    owner: dict[int, str] = {}
    aliases: dict[str, list[str]] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    for key, tensor in model.state_dict(keep_vars=True).items():
        first = owner.setdefault(id(tensor), key)
        aliases.setdefault(first, []).append(key)
        shapes[first] = tuple(tensor.shape)
    stages = []
    for s, module in enumerate(stage_modules):
        mine = {}
        for key, tensor in module.state_dict(keep_vars=True).items():
            if id(tensor) not in owner:
                raise RuntimeError(f"stage {s}'s {key} is not a tensor of the model's state_dict")
            mine[key] = owner[id(tensor)]
        stages.append(mine)
    params = tuple(dict.fromkeys(owner[id(p)] for _, p in model.named_parameters()))
    return Names(tuple(stages), {k: tuple(v) for k, v in aliases.items()}, shapes, params)


def joined(parts: list[torch.Tensor], shape: tuple[int, ...]) -> torch.Tensor:
    """The whole tensor of ``shape`` whose shards (in order) are ``parts``: each whole where it already is
    (a tensor every shard holds), else concatenated along the one dimension they split."""
    first = parts[0]
    if tuple(first.shape) == shape or len(parts) == 1:
        return first
    for dim, (mine, whole) in enumerate(zip(first.shape, shape)):
        if mine * len(parts) == whole and all(p.shape[dim] == mine for p in parts):
            return torch.cat(parts, dim)
    raise ValueError(f"shards of shape {tuple(first.shape)} do not make a tensor of shape {shape}")


def gather(stage_states: list[list[dict]], names: Names) -> tuple[dict, dict]:
    """``model.pt``'s and ``optimizer.pt``'s contents from each stage's files (every shard's, in order, stage
    by stage: a tied tensor a later stage's file leaves out is taken from its first holder's, read before):
    the model's state_dict and the optimiser's state by parameter name."""
    whole: dict[str, torch.Tensor] = {}
    state: dict[str, dict] = {}
    hyper: dict = {}
    for s, shards in enumerate(stage_states):
        local = names.stages[s]
        for key in shards[0]["model"]:
            canon = local[key]
            if canon not in whole:
                whole[canon] = joined([f["model"][key] for f in shards], names.shapes[canon])
        order = shards[0]["parameter_order"]
        for index, kept in shards[0]["optimizer"]["state"].items():
            canon = local[order[int(index)]]
            if canon in state:
                continue
            state[canon] = {
                k: joined([f["optimizer"]["state"][index][k] for f in shards], names.shapes[canon])
                if isinstance(v, torch.Tensor) and v.dim() > 0
                else v
                for k, v in kept.items()
            }
        groups = shards[0]["optimizer"]["param_groups"]
        hyper = hyper or {k: v for k, v in groups[0].items() if k != "params"}
    model = {key: whole[canon] for canon, keys in names.aliases.items() for key in keys if canon in whole}
    optimizer = {"state": state, "param_groups": [{**hyper, "params": list(names.params)}]}
    return model, optimizer


def stage_part(module: nn.Module, names: dict[str, str], model: dict, optimizer: dict, path: Path) -> dict:
    """The stage's file (:func:`~.checkpoint.stage_state`'s form, this process's shard of each sharded
    tensor) cut from ``model.pt``'s and ``optimizer.pt``'s contents, for a run under another plan.
    A tensor the model lacks or of another shape stops the run, naming it."""
    from heterps_cli.runtime.sharding import local_of

    mine = module.state_dict()
    cuts = {key: _cut_of(tensor) for key, tensor in mine.items()}
    part: dict[str, torch.Tensor] = {}
    for key, tensor in mine.items():
        canon = names[key]
        if canon not in model:
            raise RuntimeError(f"{path}: holds no {canon!r}, which this plan's stage holds as {key}")
        part[key] = _cut(model[canon], cuts[key], tuple(local_of(tensor).shape), canon, path)
    order = [name for name, _ in module.named_parameters()]
    state = {}
    for index, key in enumerate(order):
        kept = optimizer["state"].get(names[key])
        if kept is None:
            continue
        shape = tuple(local_of(module.get_parameter(key)).shape)
        state[index] = {
            k: _cut(v, cuts[key], shape, names[key], path) if isinstance(v, torch.Tensor) and v.dim() > 0 else v
            for k, v in kept.items()
        }
    hyper = {k: v for k, v in optimizer["param_groups"][0].items() if k != "params"}
    groups = [{**hyper, "params": list(range(len(order)))}]
    return {"model": part, "optimizer": {"state": state, "param_groups": groups}, "parameter_order": order}


def _cut_of(tensor: torch.Tensor) -> tuple[int, int, int] | None:
    """(dimension, shards, this shard) of a DTensor sharded along one dimension; None for a whole tensor."""
    placements = getattr(tensor, "placements", None)
    if not placements:
        return None
    dim = getattr(placements[0], "dim", None)
    if dim is None:
        return None
    mesh = tensor.device_mesh  # type: ignore[attr-defined]
    return dim, mesh.size(), mesh.get_local_rank()


def _cut(whole: torch.Tensor, cut, shape: tuple[int, ...], name: str, path: Path) -> torch.Tensor:
    if cut is not None:
        dim, shards, mine = cut
        whole = whole.chunk(shards, dim)[mine]
    if tuple(whole.shape) != shape:
        raise RuntimeError(f"{path}: {name} is {tuple(whole.shape)} there, {shape} in this plan's stage")
    return whole
