"""Which layers a replica at tensor-parallel degree ``d`` shards, and one shard of them (docs/spec.md section 1h).

``heterps run`` shards these pairs with ``torch.distributed.tensor.parallel``;
``heterps profile estimate --tp`` prices one shard of the same pairs, so the
estimate describes what the run executes.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch
from torch import nn


def matrix_pairs(module: nn.Module, prefix: str = "") -> dict[str, str]:
    """Section 1h: the pairs of linear layers a replica can shard Megatron's way, by their names in
    ``module``: within any nn.Sequential, a Linear, element-wise layers, then a Linear that takes the
    first's outputs. The first splits its outputs (column-parallel), the second its inputs
    (row-parallel); one all-reduce after the second, one of the input's gradient before the first."""
    plan: dict[str, str] = {}
    if isinstance(module, nn.Sequential):
        children = list(module.named_children())
        i = 0
        while i < len(children):
            name, first = children[i]
            k = i + 1
            while (
                k < len(children)
                and not isinstance(children[k][1], nn.Linear)
                and not list(children[k][1].parameters())
            ):
                k += 1
            if isinstance(first, nn.Linear) and k < len(children) and isinstance(children[k][1], nn.Linear):
                second_name, second = children[k]
                if second.in_features == first.out_features:
                    plan[prefix + name], plan[prefix + second_name] = "colwise", "rowwise"
                    i = k + 1
                    continue
            i += 1
    for name, child in module.named_children():
        if prefix + name not in plan:
            plan |= matrix_pairs(child, f"{prefix}{name}.")
    return plan


def shardable(module: nn.Module, tp: int) -> dict[str, str] | None:
    """:func:`matrix_pairs` where there are some and ``tp`` divides each pair's inner width; else None."""
    pairs = matrix_pairs(module)
    widths = [m.out_features for n, m in module.named_modules() if pairs.get(n) == "colwise"]
    return pairs if pairs and not any(w % tp for w in widths) else None


def block_dims(module: nn.Module, blocks: int) -> dict[str, int]:
    """Section 1i: the dimension along which each parameter of ``module``'s :func:`shardable` pairs is
    sharded, by name (a column-parallel layer's outputs: its weight's and bias's dim 0; a row-parallel
    one's inputs: its weight's dim 1); parameters not named run whole on every shard."""
    pairs = shardable(module, blocks) or {}
    out = {}
    for name, style in pairs.items():
        out[f"{name}.weight"] = 0 if style == "colwise" else 1
        if style == "colwise" and module.get_submodule(name).bias is not None:
            out[f"{name}.bias"] = 0
    return out


@contextlib.contextmanager
def one_shard(module: nn.Module, tp: int) -> Iterator[dict[str, str] | None]:
    """Inside, ``module`` runs as one of ``tp`` shards runs it: each :func:`shardable` pair's first linear
    layer keeps ``1/tp`` of its outputs, the second ``1/tp`` of its inputs (its bias whole, as
    ``RowwiseParallel`` adds it once after the all-reduce), the rest whole; the pairs, or None where
    nothing shards. The layers are swapped in place and back (a copy of a module of fake tensors
    would need a fake mode of its own)."""
    pairs = shardable(module, tp)
    if pairs is None:
        yield None
        return
    wholes: dict[str, nn.Module] = {}
    try:
        for name, style in pairs.items():
            parent_name, _, leaf = name.rpartition(".")
            parent = module.get_submodule(parent_name)
            whole = wholes[name] = getattr(parent, leaf)
            inputs, outputs = whole.in_features, whole.out_features
            if style == "colwise":
                outputs //= tp
            else:
                inputs //= tp
            part = nn.Linear(
                inputs, outputs, bias=whole.bias is not None, dtype=whole.weight.dtype, device=whole.weight.device
            )
            setattr(parent, leaf, part.requires_grad_(whole.weight.requires_grad))
        yield pairs
    finally:
        for name, whole in wholes.items():
            parent_name, _, leaf = name.rpartition(".")
            setattr(module.get_submodule(parent_name), leaf, whole)


def local_of(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's own shard (itself for a plain tensor)."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def part_length(shape: tuple[int, ...], d: int) -> int:
    """Section 1h: the length of each of the ``d`` parts :func:`boundary_parts` cuts a tensor of ``shape``
    into."""
    return -(-math.prod(shape) // d)


def boundary_parts(part: torch.Tensor, d: int) -> list[torch.Tensor]:
    """Section 1h: the ``d`` parts of a boundary tensor that a replica at degree ``d`` receives, one per
    unit (Megatron's scatter of the activations between pipeline stages): the flattened tensor in ``d``
    pieces of equal length (:func:`part_length`), the last padded with zeros."""
    flat = part.reshape(-1)
    size = part_length(tuple(part.shape), d)
    padded = torch.cat([flat, flat.new_zeros(size * d - flat.numel())]) if size * d > flat.numel() else flat
    return [piece.contiguous() for piece in padded.split(size)] if size else [flat] * d


def whole_of(parts: list[torch.Tensor], shape: tuple[int, ...]) -> torch.Tensor:
    """The tensor of ``shape`` that :func:`boundary_parts` cut into ``parts``."""
    return torch.cat(parts)[: math.prod(shape)].reshape(shape)
