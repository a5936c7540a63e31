"""At which modules a model is a chain: the layers a profile may list and a plan may cut between.

A pipeline can cut a model only where one layer's output is the next layer's
whole input. A ResNet profiled leaf by leaf is not such a chain: a block's
shortcut reads the block's input, and the residual addition is code between
modules, in no layer at all. So one forward pass is recorded, every module call
with the tensors it took and gave (:func:`record_calls`), and a list of modules
is checked against it (:func:`breaks`): each called once, the first on the
model's input, each next one on exactly the tensor the one before returned, and
the model returning the last one's output.

:func:`blocks` finds the finest such list: it starts from the whole model and
replaces a module by its children (in the order they are called) wherever the
list stays a chain, so a ResNet becomes its stem's layers, its residual blocks
and its head, and a transformer its embedding, its blocks and its head.
``heterps profile`` profiles those where the leaves are no chain (``--granularity
auto``, the default; :func:`settle`) and writes whether its layers chain, so that
no plan cuts where ``heterps run``, which splits at whatever modules the plan
names (:func:`use_layers`), cannot.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
from torch import nn

from heterps_cli.errors import SIGNALLED, InputError
from heterps_cli.profiling.models import Model, layers_of, model_error


@dataclass
class Recorded:
    """One module call: the tensors it took (positional and keyword) and what it returned."""

    module: nn.Module
    args: tuple
    tensors: list[torch.Tensor]
    output: object


@dataclass
class Calls:
    """Every module call of one forward pass, in the order the calls began."""

    calls: list[Recorded]
    input: torch.Tensor | None  # the model's input, when it takes one tensor
    result: object

    @cached_property
    def _first_call(self) -> dict[nn.Module, int]:
        first: dict[nn.Module, int] = {}
        for i, c in enumerate(self.calls):
            first.setdefault(c.module, i)
        return first

    def called_children(self, module: nn.Module) -> list[nn.Module]:
        """``module``'s children that the pass called, in the order their first calls began."""
        return sorted((c for c in module.children() if c in self._first_call), key=self._first_call.__getitem__)


def record_calls(model: Model) -> Calls:
    """One forward pass on two samples in eval mode (only shapes and identities matter, and no
    batch-norm statistics or random numbers change), every module call recorded."""
    calls: list[Recorded] = []
    started: dict[int, list[int]] = {}  # id(module) -> indices of its calls still running

    def before(module, args, kwargs):
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        tensors += [v for v in kwargs.values() if isinstance(v, torch.Tensor)]
        started.setdefault(id(module), []).append(len(calls))
        calls.append(Recorded(module, args, tensors, None))

    def after(module, args, kwargs, output):
        calls[started[id(module)].pop()].output = output

    example = tuple(x[:2] for x in model.inputs)
    training = model.module.training
    handles = []
    for m in model.module.modules():
        handles.append(m.register_forward_pre_hook(before, with_kwargs=True))
        handles.append(m.register_forward_hook(after, with_kwargs=True))
    try:
        model.module.eval()
        with torch.no_grad():
            result = model.module(*example)
    except SIGNALLED:
        raise
    except BaseException as exc:  # the user's code: sys.exit and its own BaseExceptions too
        raise model_error(model, exc, "the model's forward pass failed") from None
    finally:
        model.module.train(training)
        for h in handles:
            h.remove()
    return Calls(calls, example[0] if len(example) == 1 else None, result)


def breaks(recorded: Calls, layers: dict[nn.Module, str]) -> list[tuple[str, str]]:
    """Where ``layers`` fail to be a chain of the recorded pass: (layer name, why), in call order."""
    out: list[tuple[str, str]] = []
    if recorded.input is None:
        return [("", "the model's forward takes several inputs, a chain takes one")]
    chosen = [c for c in recorded.calls if c.module in layers]
    if not chosen:
        return [("", "its forward calls none of its layers")]
    seen: set[int] = set()
    previous: object = recorded.input
    made_by: dict[int, str] = {id(recorded.input): "the model's input"}  # which layer returned each tensor
    expected = "the model's input"
    for c in chosen:
        name = layers[c.module] or type(c.module).__name__.lower()
        if id(c.module) in seen:
            out.append((name, f"layer {name!r} is called more than once"))
        elif len(c.tensors) != 1 or not c.args or c.args[0] is not c.tensors[0]:
            out.append((name, f"layer {name!r} takes {len(c.tensors)} tensors, a link of a chain takes one"))
        elif not isinstance(c.output, torch.Tensor):
            out.append((name, f"layer {name!r} returns a {type(c.output).__name__}, not one tensor"))
        elif c.tensors[0] is not previous:
            source = made_by.get(id(c.tensors[0]))
            fed = "a tensor computed between layers (an addition, say)" if source is None else source
            out.append((name, f"layer {name!r} takes {fed}, not {expected}"))
        seen.add(id(c.module))
        previous, expected = c.output, f"the output of layer {name!r}"
        made_by[id(c.output)] = expected
    if not out and recorded.result is not previous:
        last = layers[chosen[-1].module]
        out.append((last, f"the model does not return the output of its last layer {last!r}"))
    return out


def blocks(model: Model, recorded: Calls | None = None) -> dict[nn.Module, str]:
    """The finest modules at which the model is a chain, in call order, by their module paths
    (the whole model, named after it, when no split of it is a chain)."""
    recorded = recorded or record_calls(model)
    named = {m: n for n, m in model.module.named_modules()}
    sequence = [model.module]
    i = 0
    while i < len(sequence):
        children = recorded.called_children(sequence[i])
        candidate = sequence[:i] + children + sequence[i + 1 :]
        if children and not breaks(recorded, {m: named[m] or model.name for m in candidate}):
            sequence = candidate  # look at the first child next
        else:
            i += 1
    return {m: named[m] or model.name for m in sequence}


def settle(model: Model, granularity: str) -> Model:
    """``model`` with the layers a profile of it lists at ``granularity``, its ``chain`` (docs/spec.md
    section 2: whether ``heterps run`` can cut between any two of them) and its notes on them.

    ``layers``: every leaf (the factory's own blocks where it gave them); ``blocks``: :func:`blocks`;
    ``auto``: the leaves where they chain, else the blocks, else (a model of several inputs) an exit-2
    error, since no plan of it could run."""
    recorded = record_calls(model)
    if model.blocks is None and granularity == "blocks":
        _at_blocks(model, recorded)
    elif model.blocks is None and granularity == "auto" and (problems := breaks(recorded, layers_of(model))):
        found = blocks(model, recorded)
        if breaks(recorded, found):
            raise InputError(
                None,
                None,
                "MODEL",
                f"model {model.name} is a chain at no granularity: {problems[0][1]}. heterps run trains a model "
                "whose layers each take the one before's output, from one input; --granularity layers "
                "profiles it anyway (chain: false, and no plan of that profile is made)",
            )
        model.blocks = list(found)
        model.notes.append(
            f"the layers are not a chain ({problems[0][1]}): profiled "
            + (
                f"at the {len(found)} blocks that are (--granularity blocks), where a plan can cut and "
                "heterps run can split"
                if len(found) > 1
                else f"the whole model as one layer: a plan can only replicate it. {_unsplit(model, recorded)}"
            )
        )
    problems = breaks(recorded, layers_of(model))
    model.chain = not problems
    if problems:
        model.notes.append(_chain_note(model, recorded, problems))
    return model


def _unsplit(model: Model, recorded: Calls) -> str:
    """Why the model's own children are no chain, the first split :func:`blocks` tries, and the fix."""
    named = {m: n for n, m in model.module.named_modules()}
    why = [reason for _, reason in breaks(recorded, {c: named[c] for c in recorded.called_children(model.module)})]
    shown = "; ".join(why[:3]) + (f"; and {len(why) - 3} more" if len(why) > 3 else "")
    return (
        f"Its forward computes between its own modules ({shown}): put that code in modules (nn.ReLU, "
        "nn.Flatten, a block's own forward) and profile again, so that a plan can cut between them"
    )


def _at_blocks(model: Model, recorded: Calls) -> None:
    """``--granularity blocks``: the model's layers set to :func:`blocks`; an exit-2 error when the
    model is a chain only as a whole, or not even that (several inputs)."""
    found = blocks(model, recorded)
    problems = breaks(recorded, found)
    if problems or len(found) < 2:
        why = problems[0][1] if problems else "no split of it into modules is a chain"
        raise InputError(
            None,
            None,
            "--granularity",
            f"model {model.name} has no blocks that form a chain: {why}. Code between modules (an addition, "
            "torch.flatten) must sit inside a module for a cut there to be possible",
        )
    model.blocks = list(found)


def _chain_note(model: Model, recorded: Calls, problems: list[tuple[str, str]]) -> str:
    """What a profile of layers that are not a chain says: which blocks hold the breaks, and the fix."""
    layers = layers_of(model)
    if recorded.input is None:
        return f"the layers are not a chain ({problems[0][1]}): heterps run cannot split this model"
    found = blocks(model, recorded)
    by_name = {name: m for m, name in layers.items()}
    holders: list[str] = []
    for name, _ in problems:
        layer = by_name.get(name)
        holder = next(
            (f"{bname} ({type(b).__name__})" for b, bname in found.items() if layer is not None and _inside(layer, b)),
            None,
        )
        if holder is not None and holder not in holders:
            holders.append(holder)
    where = f" inside {', '.join(holders[:6])}" + (f" and {len(holders) - 6} more" if len(holders) > 6 else "")
    fix = (
        f"profile with --granularity blocks ({len(found)} blocks that chain) or auto, the default"
        if len(found) >= 2 and not breaks(recorded, found)
        else "no split of the model into modules is a chain"
    )
    return (
        f"the layers are not a chain: {len(problems)} of {len(layers)} do not take the output of the layer "
        f"before{where} (first: {problems[0][1]}); the profile says chain: false and no plan of it is made, "
        f"since heterps run could not split the model there, and code between modules (residual additions) "
        f"is in no layer's time; {fix}"
    )


def _inside(module: nn.Module, block: nn.Module) -> bool:
    return any(m is module for m in block.modules())


def use_layers(model: Model, names: list[str]) -> Model:
    """``model`` with the layers a plan of it names: its leaves if every name is one (the default),
    else its :func:`blocks` if every name is one of those (a ``--granularity blocks`` profile), else the
    modules the names give by path. The plan is then checked against them, so a missing or extra
    layer is reported by its position."""
    if model.blocks is not None or set(names) <= set(layers_of(model).values()):
        return model
    found = blocks(model)
    named = dict(model.module.named_modules())
    if set(names) <= set(found.values()):
        model.blocks = list(found)
    elif names and all(n in named for n in names) and len(set(names)) == len(names):
        model.blocks = [named[n] for n in names]
    return model
