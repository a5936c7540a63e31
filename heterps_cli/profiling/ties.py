"""Tensors that several layers of a model hold, found in its modules (docs/spec.md section 1j).

GPT-2 and nanoGPT give the output head the token embedding's weight; ALBERT shares one block's weights
across its depth; a mask or a table of positions may be one buffer that several blocks read. Such a
tensor is one tensor of the model, so it is one set of bytes in memory and one gradient, the sum of
what each of its holders contributes. A profile records every tie (:func:`find_ties`) and counts its
bytes once, in its first holder; ``heterps run`` keeps the copies that stages on other processes hold
bit-equal (:mod:`heterps_cli.runtime.tied`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class Tie:
    """One tensor that several layers hold: its name in its first holder (``LAYER.PATH``), whether it is a
    parameter or a buffer, its bytes, and every holder's layer index and local name, in layer order."""

    tensor: str
    kind: str  # "parameter" or "buffer"
    bytes: float
    holders: tuple[tuple[int, str], ...]

    @property
    def layers(self) -> tuple[int, ...]:
        return tuple(i for i, _ in self.holders)


def _members(module: nn.Module) -> list[tuple[str, str, torch.Tensor]]:
    """(kind, local name, tensor) for every parameter and buffer the module holds, each name once (a
    tensor held twice inside one layer is one tensor of that layer)."""
    out = [("parameter", n, p) for n, p in module.named_parameters(remove_duplicate=False)]
    return out + [("buffer", n, b) for n, b in module.named_buffers(remove_duplicate=False) if b is not None]


def find_ties(layers: Sequence[nn.Module], names: Sequence[str]) -> list[Tie]:
    """Every parameter and buffer that two or more of ``layers`` hold (the same tensor object, or two
    views of one storage), in the order of its first holder; each holder by its first local name."""
    seen: dict[object, dict] = {}
    for index, module in enumerate(layers):
        for what, local, tensor in _members(module):
            key = _storage_key(tensor)
            entry = seen.setdefault(key, {"kind": what, "tensor": tensor, "holders": {}})
            entry["holders"].setdefault(index, local)
    ties = []
    for entry in seen.values():
        holders = tuple(sorted(entry["holders"].items()))
        if len(holders) < 2:
            continue
        first, local = holders[0]
        tensor = entry["tensor"]
        ties.append(
            Tie(f"{names[first]}.{local}", entry["kind"], float(tensor.numel() * tensor.element_size()), holders)
        )
    return sorted(ties, key=lambda t: (t.layers, t.tensor))


def _storage_key(tensor: torch.Tensor) -> object:
    """What makes two tensors one: the same storage at the same offset and shape (a tied weight is the
    same Parameter; a shared buffer the same tensor), or, on a meta or fake tensor, the object itself."""
    try:
        storage = tensor.untyped_storage()
        pointer = storage.data_ptr()
    except (RuntimeError, NotImplementedError):
        return id(tensor)
    if pointer == 0:  # meta tensors have no data: identity alone says which are one
        return id(tensor)
    return (pointer, tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype)


def once_bytes(tie_list: Sequence[Tie], n_layers: int) -> list[float]:
    """Per layer, the bytes of tied parameters it holds beyond its first holder's: what its ``weight_size``
    leaves out, since the first holder counts them."""
    out = [0.0] * n_layers
    for tie in tie_list:
        if tie.kind == "parameter":
            for index, _ in tie.holders[1:]:
                out[index] += tie.bytes
    return out
