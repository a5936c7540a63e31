"""The input file formats of SPEC sections 2 and 3, as strict pydantic models.

Strict on purpose: unknown keys, quoted numbers, booleans for numbers, NaN and
infinities are all errors, because a typo that silently changes a plan is worse
than a refusal. Every error names the file, the line and the field path.
"""

from __future__ import annotations

import difflib
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from heterps_cli.yamlio import Document, load_yaml

Name = Annotated[str, StringConstraints(min_length=1)]
Positive = Annotated[float, Field(gt=0)]
NonNegative = Annotated[float, Field(ge=0)]
Fraction = Annotated[float, Field(ge=0, le=1)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)


class TimeEntry(_Strict):
    oct: Positive
    odt: NonNegative
    alpha: Fraction | None = None
    beta: Fraction | None = None


class Layer(_Strict):
    name: Name
    type: Name
    input_size: NonNegative
    weight_size: NonNegative
    alpha: Fraction | None = None
    beta: Fraction | None = None
    times: Annotated[dict[Name, TimeEntry], Field(min_length=1)]

    def fractions(self, resource: str) -> tuple[float, float]:
        """(alpha, beta) of this layer on ``resource``: the per-type override, else the layer's."""
        entry = self.times[resource]
        alpha = entry.alpha if entry.alpha is not None else self.alpha
        beta = entry.beta if entry.beta is not None else self.beta
        assert alpha is not None and beta is not None  # guaranteed by load_profile
        return alpha, beta


class Job(_Strict):
    samples: Positive | None = None
    epochs: Positive | None = None
    min_throughput: NonNegative | None = None


class Profile(_Strict):
    model: Name
    batch_size: Annotated[int, Field(ge=1)]
    job: Job = Job()
    layers: Annotated[list[Layer], Field(min_length=1)]


class Resource(_Strict):
    price: NonNegative
    limit: Annotated[int, Field(ge=1)]
    unit: str | None = None


class Cluster(_Strict):
    cluster: Name
    resources: Annotated[dict[Name, Resource], Field(min_length=1)]


class PlanStage(_Strict):
    first: Annotated[int, Field(ge=0)]
    last: Annotated[int, Field(ge=0)]
    layers: list[Name]
    resource: Name
    replicas: Annotated[int, Field(ge=1)]
    compute_s: NonNegative
    comm_s: NonNegative
    throughput: NonNegative


class PlanFile(_Strict):
    """A plan as ``heterps plan --out`` writes it (SPEC section 4, plus heterps' own extra fields)."""

    model: Name
    cluster: Name
    objective: Name
    scheduler: Name
    seed: int
    batch_size: Annotated[int, Field(ge=1)]
    samples: Positive
    epochs: Positive
    min_throughput: NonNegative
    stages: Annotated[list[PlanStage], Field(min_length=1)]
    resources: dict[Name, Annotated[int, Field(ge=0)]]
    throughput: NonNegative
    bottleneck: Annotated[int, Field(ge=0)]
    time_s: NonNegative
    cost_usd: NonNegative
    feasible: bool
    solve_s: NonNegative
    max_cost: Positive | None = None
    limits: dict[Name, int] | None = None
    optimal: bool | None = None
    evaluations: int | None = None
    notes: list[str] = []


_KNOWN_FIELDS = sorted(
    {name for model in (TimeEntry, Layer, Job, Profile, Resource, Cluster, PlanStage, PlanFile)
     for name in model.model_fields}
)


def _describe(error: dict[str, Any]) -> str:
    kind, ctx, got = error["type"], error.get("ctx") or {}, error.get("input")
    if kind == "missing":
        return "required field is missing"
    if kind == "extra_forbidden":
        name = str(error["loc"][-1])
        close = difflib.get_close_matches(name, _KNOWN_FIELDS, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        return f"unknown field '{name}'{hint} (unknown fields are refused so a typo cannot change a plan)"
    bounds = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}
    if kind in bounds:
        (limit,) = ctx.values()
        return f"must be {bounds[kind]} {limit:g} (got {got!r})"
    if kind == "finite_number":
        return f"must be a finite number (got {got!r})"
    if kind in ("float_type", "int_type", "string_type", "dict_type", "list_type", "model_type"):
        wanted = {"float": "a number", "int": "a whole number", "string": "a string",
                  "dict": "a mapping", "list": "a list", "model": "a mapping"}[kind.split("_")[0]]
        return f"must be {wanted} (got {type(got).__name__} {got!r})"
    if kind == "too_short":
        return "must not be empty"
    return f"{error['msg']} (got {got!r})"


def _validate(model: type[_Strict], doc: Document) -> Any:
    try:
        return model.model_validate(doc.data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        # A typo shows up as an unknown key *and* a missing one; the unknown key is the useful half.
        error = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
        loc = tuple(error["loc"])
        if loc and loc[-1] == "[key]":
            raise doc.error(loc[:-1], f"a name must be a non-empty string (got {loc[-2]!r})") from None
        more = exc.error_count() - 1
        suffix = f" ({more} more problem{'s' if more > 1 else ''} in this file)" if more else ""
        raise doc.error(loc, _describe(error) + suffix) from None


def load_profile(path: str) -> tuple[Profile, Document]:
    doc = load_yaml(path)
    profile: Profile = _validate(Profile, doc)
    seen: dict[str, int] = {}
    for i, layer in enumerate(profile.layers):
        if layer.name in seen:
            raise doc.error(("layers", i, "name"), f"duplicate layer name '{layer.name}' (also layers[{seen[layer.name]}])")
        seen[layer.name] = i
        for resource, entry in layer.times.items():
            for frac in ("alpha", "beta"):
                if getattr(entry, frac) is None and getattr(layer, frac) is None:
                    raise doc.error(
                        ("layers", i, "times", resource),
                        f"no {frac}: give the layer a default '{frac}' or this entry its own",
                    )
    return profile, doc


def load_cluster(path: str) -> tuple[Cluster, Document]:
    doc = load_yaml(path)
    return _validate(Cluster, doc), doc


def load_plan(path: str) -> tuple[PlanFile, Document]:
    doc = load_yaml(path)
    return _validate(PlanFile, doc), doc
