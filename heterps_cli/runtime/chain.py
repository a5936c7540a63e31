"""A model as the chain of layers a plan splits: checked, cut into stages, with the shapes between them.

``heterps run`` can split a model only where one layer's output is the next
layer's whole input. So the model's forward pass is traced once (forward hooks
on the same layers ``heterps profile`` measures) and it must be such a chain:
the model's input goes into the first layer, each layer's only tensor argument
is the tensor the layer before returned, and the model returns the last layer's
output (:func:`heterps_cli.profiling.granularity.breaks`). ``nn.Sequential`` models are
chains; a model with residual connections is a chain of its blocks, which a profile
lists with ``--granularity blocks`` (or a factory returns as a third item); the
layers a plan names are the modules the run splits at (:func:`~heterps_cli.profiling.granularity.use_layers`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
from torch import nn

from heterps_cli.errors import InputError
from heterps_cli.profiling.granularity import breaks, record_calls
from heterps_cli.profiling.models import Model, layers_of


@dataclass(frozen=True)
class Boundary:
    """The tensor that leaves a layer: its shape per sample and its dtype."""

    shape: tuple[int, ...]
    dtype: torch.dtype


@dataclass
class Chain:
    names: list[str]
    modules: list[nn.Module]
    outputs: list[Boundary]  # after each layer

    def stage(self, layers: list[str] | tuple[str, ...]) -> nn.Sequential:
        index = {name: i for i, name in enumerate(self.names)}
        return nn.Sequential(*(self.modules[index[name]] for name in layers))

    def output_after(self, layer: str) -> Boundary:
        return self.outputs[self.names.index(layer)]


def _not_chain(model: Model, why: str) -> InputError:
    return InputError(
        None,
        None,
        "MODEL",
        f"model {model.name} is not a chain of the plan's layers: {why}. heterps run splits a model only where "
        "one layer's output is the next one's whole input: profile it again with heterps profile (--granularity "
        "auto, the default, profiles the blocks that chain, and its profile says chain: true) and plan again",
    )


def trace_chain(model: Model) -> Chain:
    """The model's layers in call order, checked to form a chain (else an exit-2 InputError)."""
    if len(model.inputs) != 1:
        raise _not_chain(model, f"its forward takes {len(model.inputs)} inputs, a chain takes one")
    layers = layers_of(model)
    recorded = record_calls(model)
    problems = breaks(recorded, layers)
    if problems:
        raise _not_chain(model, problems[0][1])
    calls = [c for c in recorded.calls if c.module in layers]
    outputs = [cast(torch.Tensor, c.output) for c in calls]  # breaks() refused any other kind
    return Chain(
        names=[layers[c.module] or type(c.module).__name__.lower() for c in calls],
        modules=[c.module for c in calls],
        outputs=[Boundary(tuple(out.shape[1:]), out.dtype) for out in outputs],
    )


def check_plan_layers(chain: Chain, stages: list[list[str]], plan_path: str) -> None:
    """The plan's stages, in order, must be exactly the chain's layers."""
    known = set(chain.names)
    for s, layers in enumerate(stages):
        for name in layers:
            if name not in known:
                raise InputError(
                    plan_path,
                    None,
                    f"stages[{s}].layers",
                    f"layer {name!r} is not a layer of the model (its layers: {_listed(chain.names)}); "
                    "run the plan with the model its profile was measured from",
                )
    flat = [name for layers in stages for name in layers]
    if flat != chain.names:
        at = next((i for i, (a, b) in enumerate(zip(flat, chain.names)) if a != b), min(len(flat), len(chain.names)))
        raise InputError(
            plan_path,
            None,
            "stages",
            f"the plan's layers differ from the model's chain at position {at} "
            f"(plan: {_listed(flat[at : at + 3])}, model: {_listed(chain.names[at : at + 3])}); "
            f"the plan has {len(flat)} layers, the model {len(chain.names)}",
        )


def _listed(names: list[str]) -> str:
    shown = ", ".join(names[:8])
    return shown + (f", … ({len(names)} in all)" if len(names) > 8 else "") if names else "none"
