"""Section 1k: what a user or an engine fixes of a plan's shape, as constraints of the exact search.

A :class:`Shape` says what every plan must be: its number of stages, its tensor-parallel degree (or the
largest), every stage's replicas, recomputation on or off, a type for a range of layers or for each
stage. :func:`constrained` makes it part of the problem, so that the exact solver searches only the
plans that keep it and stays exact over them (the type of a layer range as where the layers may run,
the rest as the ways and places of the DP's stages, docs/exact.md); :func:`breaks` says what of it a
plan does not keep, which the engines' rules (:mod:`heterps_cli.engines`) and the exports share.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from heterps_cli.errors import InputError
from heterps_cli.formats import Plan
from heterps_cli.problem import Problem, where_allowed
from heterps_cli.problem_terms import Fixed

ANY = "*"  # a stage of any type, in --stage-types


@dataclass(frozen=True)
class Shape:
    """What every plan must be; None (or empty): free."""

    stages: int | None = None
    tp: int | None = None  # every stage's tensor-parallel degree
    max_tp: int | None = None
    replicas: int | None = None  # every stage's replicas: one data-parallel degree, splitting the micro-batch evenly
    recompute: bool | None = None  # every stage recomputes its activations (True), or none does (False)
    layer_types: tuple[tuple[str, str, str], ...] = ()  # (first layer, last layer, type): where those layers run
    stage_types: tuple[str, ...] = ()  # each stage's type, ANY for any

    @property
    def free(self) -> bool:
        return self == Shape()

    def but(self, **changes) -> Shape:
        return dataclasses.replace(self, **changes)

    def said(self) -> str:
        """The shape in words, for a plan's notes."""
        parts = []
        if self.stages is not None:
            parts.append(f"{self.stages} stages")
        if self.stage_types:
            parts.append("stage types " + ",".join(self.stage_types))
        if self.tp is not None:
            parts.append(f"tp {self.tp}")
        elif self.max_tp is not None:
            parts.append(f"tp at most {self.max_tp}")
        if self.replicas is not None:
            parts.append(f"{self.replicas} replicas a stage")
        if self.recompute is not None:
            parts.append("every stage recomputing" if self.recompute else "no recomputation")
        parts += [f"layers {a}..{b} on {t}" if a != b else f"layer {a} on {t}" for a, b, t in self.layer_types]
        return ", ".join(parts) or "none"


def constrained(problem: Problem, shape: Shape) -> Problem:
    """``problem`` searched only over the plans that keep ``shape`` (exit 2, naming the option, where
    the shape cannot apply to it)."""
    if shape.free:
        return problem
    _check(problem, shape)
    degrees = [d for d in problem.degrees if (shape.tp is None or d == shape.tp) and d <= (shape.max_tp or d)]
    mask = _layer_mask(problem, shape) if shape.layer_types else None
    fixed = Fixed(
        replicas=shape.replicas,
        degrees=tuple(degrees) if len(degrees) < len(problem.degrees) else None,
        recompute=shape.recompute,
        stages=shape.stages,
        stage_types=tuple(-1 if t == ANY else problem.types.index(t) for t in shape.stage_types) or None,
        layer_allowed=mask,
    )
    out = problem.replace(fixed=fixed)
    if problem.pipelined and not out.stage_ways:
        raise InputError(None, None, "--tp" if shape.tp else "--recompute", f"no stage can run as {shape.said()} "
                         "asks: the profile times no layer that way (sections 1g and 1h)")  # fmt: skip
    if shape.max_tp is not None and problem.tensor:  # every scheduler then sees only the degrees allowed
        out = dataclasses.replace(
            out, tensor={d: p for d, p in (out.tensor or {}).items() if d <= shape.max_tp} or None
        )
    return where_allowed(out)


def _check(problem: Problem, shape: Shape) -> None:
    field_of = {"stages": "--stages", "tp": "--tp", "recompute": "--recompute"}

    def refuse(what: str, message: str) -> InputError:
        return InputError(None, None, field_of.get(what, what), message)

    if (shape.stages is not None or shape.stage_types) and not problem.pipelined:
        raise refuse("stages", "--stages and --stage-types fix a plan's stages under a pipeline schedule (docs/spec.md "
                     "section 1d): give the profile's job micro_batches, or --global-batch")  # fmt: skip
    if shape.stages is not None and shape.stages > (most := int(min(problem.n_layers, problem.limits.sum()))):
        raise refuse("stages", f"{shape.stages} stages: no plan has more than {most} (one layer and one unit each)")
    if shape.stage_types and shape.stages is not None and len(shape.stage_types) != shape.stages:
        raise refuse("--stage-types", f"gives {len(shape.stage_types)} types for {shape.stages} stages")
    for name in shape.stage_types:
        if name != ANY and name not in problem.types:
            raise refuse("--stage-types", f"{name!r} is none of the cluster's types: {', '.join(problem.types)}")
    if shape.tp is not None and shape.tp not in problem.degrees:
        given = ", ".join(map(str, problem.degrees))
        raise refuse("tp", f"tp {shape.tp} is not a degree the profile times (it times {given}: section 1h)")
    if shape.recompute and not problem.can_recompute:
        raise refuse("recompute", "no stage can recompute: that needs a pipeline schedule and the layers' "
                     "forward times (docs/spec.md section 1g)")  # fmt: skip
    if shape.replicas is not None and shape.replicas > problem.limits.sum():
        units = int(problem.limits.sum())
        raise refuse("--replicas", f"{shape.replicas} replicas a stage: the cluster has {units} units")


def _layer_mask(problem: Problem, shape: Shape) -> np.ndarray:
    """``[n, T]``: where each layer may run under the shape's layer ranges."""
    mask = np.ones((problem.n_layers, problem.n_types), dtype=bool)
    for first, last, name in shape.layer_types:
        a, b = layer_index(problem, first), layer_index(problem, last)
        if b < a:
            raise InputError(None, None, "--layer-type", f"{first}..{last}: the range ends before it starts")
        if name not in problem.types:
            raise InputError(None, None, "--layer-type", f"{name!r} is none of the cluster's types: "
                             + ", ".join(problem.types))  # fmt: skip
        t = problem.types.index(name)
        if not mask[a : b + 1].all():
            raise InputError(None, None, "--layer-type", f"{first}..{last}={name}: these layers already have a type "
                             "from another --layer-type")  # fmt: skip
        cannot = [problem.layer_names[i] for i in range(a, b + 1) if not problem.runnable[i, t]]
        if cannot:
            raise InputError(None, None, "--layer-type", f"layer {cannot[0]} cannot run on {name} (the profile "
                             "times it nowhere there)")  # fmt: skip
        mask[a : b + 1] = False
        mask[a : b + 1, t] = True
    return mask


def layer_index(problem: Problem, layer: str) -> int:
    """The index of a layer given by name or by its index (exit 2 where it is neither)."""
    if layer in problem.layer_names:
        return problem.layer_names.index(layer)
    if layer.isdigit() and int(layer) < problem.n_layers:
        return int(layer)
    raise InputError(None, None, "--layer-type", f"{layer!r} is no layer of the model (a name, or an index "
                     f"0..{problem.n_layers - 1})")  # fmt: skip


def breaks(plan: Plan, shape: Shape, layer_names: tuple[str, ...]) -> list[str]:
    """What of ``shape`` the plan does not keep, one phrase each (empty: it keeps it all)."""
    out = []
    stages = plan.stages
    if shape.stages is not None and len(stages) != shape.stages:
        out.append(f"the plan has {len(stages)} stages, not {shape.stages}")
    for i, s in enumerate(stages):
        tp = s.tp or 1
        if shape.tp is not None and tp != shape.tp:
            out.append(f"stage {i} runs at tp {tp}, not {shape.tp}")
        if shape.max_tp is not None and tp > shape.max_tp:
            out.append(f"stage {i} runs at tp {tp}, above {shape.max_tp}")
        if shape.replicas is not None and s.replicas != shape.replicas:
            out.append(f"stage {i} has {s.replicas} replicas, not {shape.replicas}")
        if shape.recompute is not None and bool(s.recompute) != shape.recompute:
            out.append(f"stage {i} {'recomputes' if s.recompute else 'does not recompute'}")
        if i < len(shape.stage_types) and shape.stage_types[i] not in (ANY, s.resource):
            out.append(f"stage {i} runs on {s.resource}, not {shape.stage_types[i]}")
    where = {name: s.resource for s in stages for name in s.layers}
    for first, last, name in shape.layer_types:
        a, b = (layer_names.index(x) if x in layer_names else int(x) for x in (first, last))
        off = [n for n in layer_names[a : b + 1] if where.get(n) != name]
        if off:
            out.append(f"layer {off[0]} runs on {where.get(off[0])}, not {name}")
    if shape.replicas is not None and plan.batch_size % shape.replicas:
        out.append(f"the micro-batch of {plan.batch_size} does not split evenly over {shape.replicas} replicas")
    return out
