"""Reading the input files: each validated against its model in :mod:`.formats`, every error one
paragraph naming the file, the line and the field; then what no single field says: a profile's
fields against each other, a cluster's prices, a plan's stages, and a file against the file it
goes with (a plan's or a profile's cluster).
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import (
    BaseModel,
    TypeAdapter,
    ValidationError,
)

from heterps_cli.errors import InputError
from heterps_cli.figures import number
from heterps_cli.formats import (
    KINDS,
    MAX_BATCH,
    MAX_MICRO_BATCHES,
    MAX_UNITS,
    PLAN_FORMAT,
    BatchTime,
    Catalogue,
    Cluster,
    InstanceCatalogue,
    Name,
    Plan,
    Profile,
    ShardTime,
    Stage,
)
from heterps_cli.yamlio import Document, compatible, load_yaml


def _strip(annotation: Any) -> Any:
    """X from Annotated[X, ...] and from X | None."""
    while True:
        if get_origin(annotation) is Annotated:
            annotation = get_args(annotation)[0]
        elif get_origin(annotation) in (Union, UnionType):
            annotation = next(a for a in get_args(annotation) if a is not type(None))
        else:
            return annotation


def _fields_at(root: type[BaseModel], loc: tuple) -> tuple[str, ...]:
    """The field names allowed in the mapping at ``loc`` of a ``root`` document (empty if not a model)."""
    annotation: Any = root
    for part in loc:
        annotation = _strip(annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            field = annotation.model_fields.get(str(part))
            if field is None:
                return ()
            annotation = field.annotation
        elif get_origin(annotation) in (list, dict):
            annotation = get_args(annotation)[-1]
        else:
            return ()
    annotation = _strip(annotation)
    return tuple(annotation.model_fields) if isinstance(annotation, type) and issubclass(annotation, BaseModel) else ()


def _describe(error: Any, root: type[BaseModel], missing_beside: list[str]) -> str:
    kind, ctx, got = error["type"], error.get("ctx") or {}, error.get("input")
    if kind == "missing":
        return "required field is missing"
    if kind == "extra_forbidden":
        name = str(error["loc"][-1])
        allowed = _fields_at(root, tuple(error["loc"][:-1]))
        close = difflib.get_close_matches(name, [f for f in allowed if f != name], n=1)
        if not close and len(missing_beside) == 1:
            close = missing_beside  # the one required field not given is the likeliest meaning
        hint = (
            f"; did you mean '{close[0]}'?" if close else (f" (allowed here: {', '.join(allowed)})" if allowed else "")
        )
        return f"unknown field '{name}'{hint} (unknown fields are refused so a typo cannot change a plan)"
    bounds = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}
    if kind in bounds:
        (limit,) = ctx.values()
        return f"must be {bounds[kind]} {number(limit)} (got {_shown(got)})"
    if kind == "finite_number":
        return f"must be a finite number (got {_shown(got)})"
    if kind in ("float_type", "int_type", "string_type", "dict_type", "list_type", "model_type", "bool_type"):
        wanted = {
            "float": "a number",
            "int": "a whole number",
            "string": "a string",
            "bool": "true or false",
            "dict": "a mapping",
            "list": "a list",
            "model": "a mapping",
        }[kind.split("_")[0]]
        return f"must be {wanted} (got {type(got).__name__} {_shown(got)})"
    if kind in ("too_short", "string_too_short"):
        return "must not be empty"
    if kind == "string_too_long":
        return f"must be at most {ctx.get('max_length')} characters (got {len(got):,})"
    if kind == "value_error":
        return f"{str(ctx.get('error', error['msg']))} (got {_shown(got)})"
    return f"{error['msg']} (got {_shown(got)})"


def _shown(value: Any) -> str:
    """A value as the user wrote it, cut short: a hostile file may hold a megabyte in one field."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "…"


def _kind_of(data: dict) -> str | None:
    if "stages" in data:  # a plan also has 'resources'
        return "plan"
    found = [kind for kind, (_, key) in KINDS.items() if key in data]
    return found[0] if len(found) == 1 else None


def _validate(model: type[BaseModel], doc: Document, kind: str) -> Any:
    actual = _kind_of(doc.data)
    if actual is not None and actual != kind:
        (wanted, key), (is_, is_key) = KINDS[kind], KINDS[actual]
        raise InputError(
            doc.path,
            doc.line((is_key,)),
            None,
            f"this is {is_}, not {wanted} (it has '{is_key}' where {wanted} has '{key}'): "
            "check the order of the files on the command line",
        )
    try:
        return model.model_validate(doc.data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        # A typo shows up as an unknown key *and* a missing one; the unknown key is the useful half.
        unknown_parents = {tuple(e["loc"][:-1]) for e in errors if e["type"] == "extra_forbidden"}
        missing: dict[tuple, list[str]] = {}
        for e in errors:
            if e["type"] == "missing":
                missing.setdefault(tuple(e["loc"][:-1]), []).append(str(e["loc"][-1]))
        problems = []
        for error in errors:
            loc = tuple(error["loc"])
            if error["type"] == "missing" and loc[:-1] in unknown_parents:
                continue
            if loc and loc[-1] == "[key]" and len(loc) > 2 and loc[-3] == "batches":
                problems.append(
                    doc.error(
                        loc[:-1], f"the batch size {_shown(loc[-2])} must be a whole number from 1 to {MAX_BATCH:,}"
                    )
                )
                continue
            if loc and loc[-1] == "[key]" and len(loc) > 2 and loc[-3] == "tp":  # section 1h
                problems.append(
                    doc.error(
                        loc[:-1],
                        f"the tensor-parallel degree {_shown(loc[-2])} must be a whole number from 2 to "
                        f"{MAX_UNITS:,} (tp 1 is what the entry and the layer give themselves)",
                    )
                )
                continue
            if loc and loc[-1] == "[key]":
                why = str(error.get("ctx", {}).get("error", "")) if error["type"] == "value_error" else ""
                problems.append(
                    doc.error(loc[:-1], f"the name {_shown(loc[-2])} {why or 'must be a non-empty string'}")
                )
                continue
            problems.append(doc.error(loc, _describe(error, model, missing.get(loc[:-1], []))))
        problems.sort(key=lambda e: e.line or 0)
        raise InputError.joined(problems) from None


def check_name(text: str, field: str) -> str:
    """A name given on the command line (``--as``) or made from one (a model's), held to the rules a
    file's names meet, so that heterps never writes a profile it would then refuse to read."""
    try:
        return TypeAdapter(Name).validate_python(text)  # NFC: callers use what it returns
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        raise InputError(None, None, field, _describe(error, Profile, [])) from None


def _raise_all(problems: list[InputError]) -> None:
    if problems:
        raise InputError.joined(problems)


def load_any(path: str) -> tuple[str, Profile | Cluster | Plan, Document]:
    """A profile, a cluster or a plan, whichever the file is (read once): its kind, model and document.
    A file that says none of them is read as a profile, whose errors then say what is missing."""
    doc = load_yaml(path)
    kind = _kind_of(doc.data) if isinstance(doc.data, dict) else None
    if kind == "cluster":
        return kind, _checked_cluster(doc), doc
    if kind == "plan":
        return kind, _plan_of(doc), doc
    return "profile", _profile_of(doc), doc


def load_profile(path: str) -> tuple[Profile, Document]:
    doc = load_yaml(path)
    return _profile_of(doc), doc


def _profile_of(doc: Document) -> Profile:
    profile: Profile = _validate(Profile, doc, "profile")
    problems = []
    seen: dict[str, int] = {}
    for i, layer in enumerate(profile.layers):
        if layer.name in seen:
            problems.append(
                doc.error(
                    ("layers", i, "name"), f"duplicate layer name '{layer.name}' (also layers[{seen[layer.name]}])"
                )
            )
        seen.setdefault(layer.name, i)
        problems += _saved_problems(doc, ("layers", i), layer, "the layer's activation_size")
        for d, sizes in (layer.tp or {}).items():
            problems += _saved_problems(doc, ("layers", i, "tp", d), sizes, "its activation_size")
        for resource, entry in layer.times.items():
            problems += _entry_problems(profile, doc, i, resource, entry)
    problems += _degree_chains(profile, doc)
    timed = profile.types
    for t in profile.fixed or {}:
        if t not in timed:
            problems.append(
                doc.error(
                    ("fixed", t),
                    f"no layer has times on {t}: fixed costs belong to a type the layers give "
                    f"({', '.join(sorted(timed))})",
                )
            )
    if profile.job.global_batch is not None:
        try:
            micro_batches(profile.job.global_batch, profile.sizes, "job.global_batch")
        except ValueError as exc:
            problems.append(doc.error(("job", "global_batch"), str(exc)))
    problems += _tie_problems(profile, doc, seen)
    _raise_all(problems)
    return profile


def _tie_problems(profile: Profile, doc: Document, index: dict[str, int]) -> list[InputError]:
    """Section 1j: each tie's holders are layers of the profile, each once, in the profile's order; a tied
    parameter fits in its first holder's weight_size, which counts it; a tensor is tied once."""
    problems, named = [], set()
    for k, tie in enumerate(profile.ties or []):
        where = ("ties", k)
        if tie.tensor in named:
            problems.append(
                doc.error((*where, "tensor"), f"{tie.tensor!r} is tied twice: give one entry with every holder")
            )
        named.add(tie.tensor)
        unknown = [name for name in tie.layers if name not in index]
        if len(tie.layers) < 2 or unknown:
            why = f"{unknown[0]!r} is not a layer of the profile" if unknown else "a tie has two holders or more"
            problems.append(doc.error((*where, "layers"), why))
            continue
        at = [index[name] for name in tie.layers]
        if len(set(at)) != len(at) or at != sorted(at):
            problems.append(
                doc.error((*where, "layers"), "list each holder once, in the order of the profile's layers")
            )
            continue
        first = profile.layers[at[0]]
        if not math.isfinite(2.0 * tie.bytes * profile.state_factor):  # what a stage moves and holds of it
            problems.append(doc.error((*where, "bytes"), f"{number(tie.bytes)} bytes overflow what a stage holds"))
        elif tie.kind == "parameter" and tie.bytes > first.weight_size * (1 + 1e-12):
            problems.append(
                doc.error(
                    (*where, "bytes"),
                    f"{number(tie.bytes)} is more than the weight_size of its first holder {first.name!r} "
                    f"({number(first.weight_size)}), which counts the tensor once for all its holders",
                )
            )
    return problems


def _saved_problems(doc: Document, where: tuple, sizes, whose: str) -> list[InputError]:
    """A layer's (or one tensor-parallel unit's) input_saved: part of its activation, none on the first layer."""
    problems = []
    if sizes.input_saved > sizes.activation_size:
        problems.append(
            doc.error(
                (*where, "input_saved"),
                f"{number(sizes.input_saved)} is more than {whose} "
                f"({number(sizes.activation_size)}): it is the part of it the layer before also keeps",
            )
        )
    if where[1] == 0 and sizes.input_saved:
        problems.append(doc.error((*where, "input_saved"), "the first layer has no layer before it: give 0"))
    return problems


def _entry_problems(profile: Profile, doc: Document, i: int, resource: str, entry) -> list[InputError]:
    """One layer's times on one type: its fractions given, its degrees sized, forward within oct, sizes once."""
    layer = profile.layers[i]
    problems = []
    for frac in ("alpha", "beta"):
        if getattr(entry, frac) is None and getattr(layer, frac) is None:
            problems.append(
                doc.error(
                    ("layers", i, "times", resource),
                    f"no {frac}: give the layer a default '{frac}' or this entry its own",
                )
            )
    shards: list[tuple[tuple, ShardTime]] = [((), entry)]
    shards += [(("tp", d), shard) for d, shard in (entry.tp or {}).items()]
    for d, _ in (entry.tp or {}).items():
        if d not in (layer.tp or {}):
            problems.append(
                doc.error(
                    ("layers", i, "times", resource, "tp", d),
                    f"times at tp {d} need the layer's sizes there: give layers[{i}].tp[{d}] with one "
                    "unit's weight_size (and activation_size, input_saved) at that degree",
                )
            )
    for inside, shard in shards:
        where = ("layers", i, "times", resource, *inside)
        sized: list[tuple[int, ShardTime | BatchTime]] = [(profile.batch_size, shard)]
        for size, at in [*sized, *(shard.batches or {}).items()]:
            if at.forward is not None and at.forward > at.oct:
                problems.append(
                    doc.error(
                        (*where, *(("batches", size) if at is not shard else ()), "forward"),
                        f"{number(at.forward)} s is more than the entry's oct ({number(at.oct)} s), of "
                        "which it is the forward pass's part",
                    )
                )
        if profile.batch_size in (shard.batches or {}):
            problems.append(
                doc.error(
                    (*where, "batches", profile.batch_size),
                    f"batch {profile.batch_size} is the profile's batch_size, whose times are the entry's "
                    "own oct and odt: give each size once",
                )
            )
    return problems


def _degree_chains(profile: Profile, doc: Document) -> list[InputError]:
    """Section 1h: each type's tensor-parallel degrees must each divide the next (1, 2, 4, 8), so that
    replicas of any of them fill whole nodes; an error at the first entry giving a degree that breaks it."""
    problems = []
    for t in profile.types:
        given = sorted({d for layer in profile.layers if t in layer.times for d in (layer.times[t].tp or {})})
        for low, high in zip([1, *given], given):
            if high % low:
                i = next(
                    i
                    for i, layer in enumerate(profile.layers)
                    if high in (layer.times.get(t) and layer.times[t].tp or {})
                )
                problems.append(
                    doc.error(
                        ("layers", i, "times", t, "tp", high),
                        f"tensor-parallel degree {high} on {t} is not a multiple of its degree {low}: a type's "
                        "degrees must each divide the next (1, 2, 4, 8 …) so that replicas fill whole nodes",
                    )
                )
                break
    return problems


def micro_batches(global_batch: int, sizes: int | tuple[int, ...], what: str = "--global-batch") -> int:
    """Section 1d's M: the micro-batches of ``sizes`` samples in a step of ``global_batch`` (of the
    largest of several sizes that gives a whole number of them; ValueError, in words, when none does
    or they are too many)."""
    sizes = (sizes,) if isinstance(sizes, int) else sizes
    whole = [b for b in sizes if global_batch % b == 0]
    if not whole:
        b = sizes[-1]
        said = f"batch_size {b:,}" if len(sizes) == 1 else f"any of the sizes {', '.join(map(str, sizes))}"
        raise ValueError(
            f"{what} {global_batch:,} is not a whole number of micro-batches of {said} "
            f"(the batch the times were measured at): give a multiple of {b:,}, e.g. "
            f"{max(1, round(global_batch / b)) * b:,}"
        )
    count_ = global_batch // whole[-1]
    if count_ > MAX_MICRO_BATCHES:
        raise ValueError(
            f"{what} {global_batch:,} is {count_:,} micro-batches of {whole[-1]:,}, more than "
            f"{MAX_MICRO_BATCHES:,}: a step that long is no pipeline; profile at a larger batch_size"
        )
    return count_


def check_plan_on_cluster(plan: Plan, pdoc: Document, cluster: Cluster, cdoc: Document) -> None:
    """``heterps validate PLAN CLUSTER``: the types, units and node kinds the plan names are the cluster's.
    Its figures are ``check``'s to recompute, from the profile too."""
    problems = []
    used: dict[str, int] = {}
    for i, stage in enumerate(plan.stages):
        if stage.resource not in cluster.resources:
            offered = ", ".join(cluster.resources)
            problems.append(
                pdoc.error(("stages", i, "resource"), f"{stage.resource!r} is no type of {cdoc.path} ({offered})")
            )
        for n, part in enumerate(stage.joined or ()):  # section 1i
            if part.resource not in cluster.resources:
                offered = ", ".join(cluster.resources)
                problems.append(
                    pdoc.error(
                        ("stages", i, "joined", n, "resource"),
                        f"{part.resource!r} is no type of {cdoc.path} ({offered})",
                    )
                )
        for t, units in stage.units_by_type.items():
            used[t] = used.get(t, 0) + units
    for t, n in used.items():
        limit = cluster.resources[t].limit if t in cluster.resources else None
        if limit is not None and n > limit:
            problems.append(
                pdoc.error(("stages",), f"uses {n} units of {t}, more than its limit of {limit} in {cdoc.path}")
            )
    for kind, count in (plan.rental or {}).items():
        if cluster.nodes is None or kind not in cluster.nodes:
            problems.append(pdoc.error(("rental", kind), f"rents node kind {kind!r}, which {cdoc.path} does not offer"))
        elif count > cluster.nodes[kind].available:
            available = cluster.nodes[kind].available
            problems.append(
                pdoc.error(("rental", kind), f"rents {count} of {kind}, more than the {available} available")
            )
    if cluster.nodes is not None and not plan.rental:
        problems.append(
            pdoc.error(("stages",), f"{cdoc.path} rents whole nodes, and the plan says none: plan it on this cluster")
        )
    if problems:
        raise InputError.joined(problems)


def load_cluster(path: str) -> tuple[Cluster, Document]:
    doc = load_yaml(path)
    return _checked_cluster(doc), doc


def _checked_cluster(doc: Document) -> Cluster:
    """The cluster a document holds, with every rule the schema alone cannot say (``validate`` and
    ``plan`` refuse the same files)."""
    cluster: Cluster = _validate(Cluster, doc, "cluster")
    _check_pricing(cluster, doc)
    for name, r in cluster.resources.items():
        if r.memory_reserved_gb is not None and r.memory_gb is not None and r.memory_reserved_gb >= r.memory_gb:
            raise doc.error(
                ("resources", name, "memory_reserved_gb"),
                f"{number(r.memory_reserved_gb)} GB reserved is not below the unit's memory_gb of "
                f"{number(r.memory_gb)}: nothing would be left for training",
            )
    return cluster


def _check_pricing(cluster: Cluster, doc: Document) -> None:
    """Units are priced and counted per type (sections 1-1d) or per node (section 1e), never both."""
    if cluster.nodes is None:
        for name, r in cluster.resources.items():
            for field in ("price", "limit"):
                if getattr(r, field) is None:
                    raise doc.error(
                        ("resources", name),
                        f"needs a {field}: {'USD per unit-hour' if field == 'price' else 'the units available'} "
                        "(or list the cluster's nodes, which give both; docs/spec.md section 3)",
                    )
        return
    for name, r in cluster.resources.items():
        for field in ("price", "limit"):
            if getattr(r, field) is not None:
                raise doc.error(
                    ("resources", name, field),
                    f"this cluster lists nodes, which set the {field} of its units (nodes.KIND.price, "
                    "nodes.KIND.units, nodes.KIND.available): remove it here",
                )
    held = set()
    for kind, node in cluster.nodes.items():
        for t in node.units:
            if t not in cluster.resources:
                close = difflib.get_close_matches(t, list(cluster.resources), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise doc.error(
                    ("nodes", kind, "units", t),
                    f"no resource type {t!r} in this cluster{hint}: the types are {', '.join(cluster.resources)}",
                )
            held.add(t)
        _links_held(doc, ("nodes", kind), "node", node.link_gbps, node.units)
    for name in cluster.resources:
        if name not in held:
            raise doc.error(("resources", name), f"no node kind holds {name}: add it to a node's units, or remove it")


def _links_held(doc: Document, where: tuple, what: str, links: dict | None, units: dict) -> None:
    """Section 1e: a link is given only for a type the node (or instance) holds."""
    for t in links or {}:
        if t not in units:
            raise doc.error(
                (*where, "link_gbps", t),
                f"this {what} holds no {t}: a link is given for the types in its units ({', '.join(units)})",
            )


def load_catalogue(path: str) -> Catalogue:
    doc = load_yaml(path)
    catalogue: Catalogue = _validate(Catalogue, doc, "catalogue")
    if "other" not in catalogue.efficiency:
        raise doc.error(("efficiency",), "needs an 'other' entry: the efficiency of kinds not listed")
    # The roofline divides by peak x efficiency: a product under one operation (or byte) a second
    # underflows or makes a layer's time infinite, which no profile can hold.
    least = min(catalogue.efficiency.values())
    for name, device in catalogue.devices.items():
        for peak, tflops in device.tflops.model_dump(exclude_none=True).items():
            if tflops * 1e12 * least < 1:
                raise doc.error(
                    ("devices", name, "tflops", peak),
                    f"{tflops:.3g} TFLOP/s at an efficiency of {least:.3g} is under one operation a second: "
                    "give the device's real peak (and efficiencies)",
                )
        if device.memory_gbps * 1e9 * catalogue.memory_efficiency < 1:
            raise doc.error(
                ("devices", name, "memory_gbps"),
                f"{device.memory_gbps:.3g} GB/s at a memory efficiency of {catalogue.memory_efficiency:.3g} is "
                "under one byte a second: give the device's real bandwidth",
            )
    return catalogue


def load_instances(path: str) -> InstanceCatalogue:
    doc = load_yaml(path)
    catalogue: InstanceCatalogue = _validate(InstanceCatalogue, doc, "instances")
    for name, instance in catalogue.instances.items():
        _links_held(doc, ("instances", name), "instance", instance.link_gbps, instance.units)
        if instance.link_gbps and instance.link_source is None:
            raise doc.error(("instances", name), "gives link_gbps without a link_source: say where the figure is from")
    return catalogue


def load_plan(path: str) -> tuple[Plan, Document]:
    doc = load_yaml(path)
    return _plan_of(doc), doc


def _joined_rules(doc: Document, plan: Plan, i: int, stage: Stage) -> list:
    """Section 1i: a mixed stage's parts train the whole micro-batch, each replica a sample at least, each
    part of its own type, without recomputation, under a pipeline schedule."""
    if stage.joined is None:
        return [doc.error(("stages", i, "samples"), "samples is given only with joined")] if stage.samples else []
    where = ("stages", i)
    if stage.samples is None:
        return [doc.error((*where, "joined"), f"stage {i} is joined by other types but gives no samples of its own")]
    out = []
    if plan.global_batch is None:
        out.append(doc.error((*where, "joined"), f"stage {i} mixes types, which needs a pipeline (global_batch)"))
    if stage.recompute:
        out.append(doc.error((*where, "recompute"), f"stage {i} mixes types, which it does without recomputation only"))
    parts: list[tuple[str, int, int, tuple]] = [(stage.resource, stage.replicas, stage.samples, (*where, "samples"))]
    parts += [(j.resource, j.replicas, j.samples, (*where, "joined", n, "samples")) for n, j in enumerate(stage.joined)]
    if len({p[0] for p in parts}) < len(parts):
        out.append(doc.error((*where, "joined"), f"stage {i} names a type twice: each type is one part"))
    for resource, replicas, samples, field in parts:
        if samples < replicas:
            said = f"stage {i}'s {replicas} {resource} replicas train {samples} samples: a replica trains one at least"
            out.append(doc.error(field, said))
    total = sum(p[2] for p in parts)
    if total != plan.batch_size:
        out.append(
            doc.error(
                (*where, "samples"),
                f"stage {i}'s parts train {total} samples of each micro-batch, not the batch_size {plan.batch_size}",
            )
        )
    return out


def _placement_problems(doc: Document, plan: Plan) -> list[InputError]:
    """Section 1e: every node a stage (or a mixed stage's part) places replicas on is one the plan rents,
    ``KIND#i`` with ``i`` at most the rental's count of ``KIND``, and the replicas placed are the part's."""
    rented = plan.rental or {}
    out = []
    for i, stage in enumerate(plan.stages):
        parts = [(stage, ("stages", i))] + [(j, ("stages", i, "joined", n)) for n, j in enumerate(stage.joined or [])]
        for part, where in parts:
            if part.nodes is None:
                continue
            for node in part.nodes:
                kind, _, index = node.rpartition("#")
                if kind not in rented:
                    said = f"the plan rents no {kind!r} nodes" + (f" (rental: {dict(rented)})" if rented else "")
                    out.append(doc.error((*where, "nodes", node), f"stage {i} places replicas on {node}, but {said}"))
                elif int(index) > rented[kind]:
                    out.append(
                        doc.error(
                            (*where, "nodes", node),
                            f"stage {i} places replicas on {node}, but the plan rents {rented[kind]} {kind} node"
                            + (f"s ({kind}#1 to {kind}#{rented[kind]})" if rented[kind] > 1 else f" (only {kind}#1)"),
                        )
                    )
            if (placed := sum(part.nodes.values())) != part.replicas:
                out.append(
                    doc.error(
                        (*where, "nodes"),
                        f"stage {i} places {placed} {part.resource} replicas on nodes but has {part.replicas}",
                    )
                )
    return out


def _plan_of(doc: Document) -> Plan:
    """A plan file, with the rules between its fields that the schema cannot state."""
    plan: Plan = _validate(Plan, doc, "plan")
    problems = []
    if plan.format is not None and plan.format > PLAN_FORMAT:
        problems.append(
            doc.error(
                ("format",),
                f"plan format {plan.format} is a newer heterps's (this one reads up to {PLAN_FORMAT}): upgrade "
                "heterps, or re-plan with this one",
            )
        )
    if plan.gap is not None and plan.optimal:
        problems.append(
            doc.error(("gap",), "a gap says exact stopped before proving the plan optimal, yet it says optimal: true")
        )
    if (plan.global_batch is None) != (plan.micro_batches is None):
        given, missing = (
            ("global_batch", "micro_batches") if plan.micro_batches is None else ("micro_batches", "global_batch")
        )
        problems.append(doc.error((given,), f"a pipelined plan (docs/spec.md section 1d) gives {missing} too"))
    elif plan.global_batch is not None and plan.micro_batches is not None:
        if plan.global_batch != plan.batch_size * plan.micro_batches:
            problems.append(
                doc.error(
                    ("micro_batches",),
                    f"global_batch {plan.global_batch} is not batch_size {plan.batch_size} × micro_batches "
                    f"{plan.micro_batches}",
                )
            )
    for i, stage in enumerate(plan.stages):
        problems += _joined_rules(doc, plan, i, stage)
    problems += _placement_problems(doc, plan)
    for i, stage in enumerate(plan.stages):  # docs/spec.md section 1: a replica trains whole samples
        if stage.replicas > plan.batch_size:
            problems.append(
                doc.error(
                    ("stages", i, "replicas"),
                    f"stage {i} has {stage.replicas} replicas but a batch of {plan.batch_size} samples, and a "
                    f"replica trains whole samples: give it at most {plan.batch_size} (heterps plan does), or "
                    "profile the model at a larger batch",
                )
            )
    _raise_all(problems)
    return plan


def _load_together(*loads: tuple[Callable[[str], Any], str]) -> list[Any]:
    """Each ``load(path)``, with the problems of every file reported together."""
    loaded: list[Any] = []
    problems: list[InputError] = []
    for load, path in loads:
        try:
            loaded.append(load(path))
        except InputError as exc:
            problems.append(exc)
    _raise_all(problems)
    return loaded


def load_pair(profile_path: str, cluster_path: str) -> tuple[tuple[Profile, Document], tuple[Cluster, Document]]:
    """Both files, with the problems of both reported together."""
    profile, cluster = _load_together((load_profile, profile_path), (load_cluster, cluster_path))
    return profile, cluster


def load_with_cluster(path: str, cluster_path: str) -> tuple[str, Profile | Plan, Document, Cluster, Document]:
    """A profile or a plan (its kind, what it holds, its document) and a cluster, with the problems of both
    reported together (``heterps validate FILE CLUSTER``)."""
    (kind, found, doc), (cluster, cdoc) = _load_together((load_any, path), (load_cluster, cluster_path))
    if kind == "cluster":
        raise doc.error((), f"this is a cluster: give a profile or a plan, then the cluster ({cluster_path})")
    return kind, found, doc, cluster, cdoc


def usable_types(profile: Profile, cluster: Cluster) -> tuple[str, ...]:
    """The cluster's types that the profile times, in cluster order (a type that runs no layer
    can never be part of a plan)."""
    timed = profile.types
    return tuple(t for t in cluster.resources if t in timed)


def check_plannable(profile: Profile, doc: Document) -> None:
    """Section 2: a profile whose layers heterps found not to chain makes no plan (none could run)."""
    if profile.chain is False:
        raise doc.error(
            ("chain",),
            "the layers are not a chain (heterps profile found some layer not taking the output of the one "
            "before, its header says where), so heterps run could split no plan of them: profile the model "
            "with --granularity auto (the default) or blocks",
        )


def _check_names_meet(profile: Profile, pdoc: Document, cluster: Cluster, cdoc: Document) -> None:
    """A profile type no cluster type matches beside a cluster type the profile has no times on, the two
    names alike (``a100`` and ``a100-40gb``), is most likely one device named twice: a plan would leave
    it out without a word, so it is refused, naming both sets and the likely pairs."""
    timed = set(profile.types)
    unmatched = [t for t in profile.types if t not in cluster.resources]
    untimed = [t for t in cluster.resources if t not in timed]
    pairs = [f"{p!r} and {c!r}" for p in unmatched for c in untimed if _alike(p, c)]
    if not pairs:
        return
    raise pdoc.error(
        ("layers",),
        f"the profile times {', '.join(map(repr, unmatched))}, which {cdoc.path} does not offer, and the cluster "
        f"offers {', '.join(map(repr, untimed))}, which the profile does not time; likely one device named twice: "
        f"{', '.join(pairs)}. A plan would leave that hardware out: name each type alike in both files (profile "
        "it again with --as NAME, the device catalogue's and heterps cluster's names, or rename the cluster's "
        "type)",
    )


def _alike(a: str, b: str) -> bool:
    """Two type names that likely name one device: the same first part, before a dash, underscore, dot or
    space (``a100``, ``A100_40GB``, ``a100-40gb``; ``v100`` and ``h100`` are two devices)."""
    return re.split(r"[-_. ]", a.lower())[0] == re.split(r"[-_. ]", b.lower())[0]


def check_pair(profile: Profile, pdoc: Document, cluster: Cluster, cdoc: Document) -> None:
    """An error naming the profile's line if its layers make no plan (:func:`check_plannable`) or the
    cluster offers no type some layer can run on."""
    check_plannable(profile, pdoc)
    theirs = {compatible(t): t for t in cluster.resources}
    for t in profile.types:
        other = theirs.get(compatible(t), t)
        if other != t:
            raise pdoc.error(
                ("layers",),
                f"the profile's type {t!r} is the cluster's {other!r} ({cdoc.path}) written with other characters "
                "of the same meaning (Unicode NFKC): heterps would take them as two types; write them alike",
            )
    _check_names_meet(profile, pdoc, cluster, cdoc)
    types = usable_types(profile, cluster)
    if not types:
        profiled = sorted(profile.types)
        raise pdoc.error(
            ("layers",),
            f"no resource type in common with cluster file {cdoc.path} "
            f"(profile times: {', '.join(profiled)}; cluster offers: {', '.join(cluster.resources)})",
        )
    for i, layer in enumerate(profile.layers):
        if not any(t in layer.times for t in types):
            raise pdoc.error(
                ("layers", i, "times"),
                f"layer '{layer.name}' can run on none of the resource types in {cdoc.path} "
                f"(it is timed on: {', '.join(layer.times)}; the cluster offers: {', '.join(cluster.resources)})",
            )
