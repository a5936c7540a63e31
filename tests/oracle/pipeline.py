"""The oracle of docs/spec.md sections 1d to 1i (the pipeline schedule, nodes, the micro-batch,
recomputation, tensor parallelism and mixed stages): each plan's figures, and the optimum by
enumeration."""

from __future__ import annotations

import itertools
import math

import numpy as np

from tests.oracle.paper import _better, _tied, pareto, partitions_of, share, stages_of


def _at_degree(layer: dict, t: str, d: int) -> tuple[dict | None, dict]:
    """Section 1h: a layer's times on ``t`` and its sizes at tensor-parallel degree ``d`` (None: no
    times there), alpha and beta falling back on the tp-1 entry's, then the layer's."""
    e = layer["times"][t]
    if d == 1:
        return e, layer
    shard = e.get("tp", {}).get(d)
    if shard is None:
        return None, layer
    a, b = e.get("alpha", layer.get("alpha")), e.get("beta", layer.get("beta"))
    sizes = layer["tp"][d]
    times = {"alpha": a, "beta": b, **shard}
    if "update" not in shard and "update" in e:  # spec 1h: the tp-1 step on one unit's share of the weights
        times["update"] = e["update"] * (sizes["weight_size"] / layer["weight_size"] if layer["weight_size"] else 0.0)
    return times, {"input_size": layer["input_size"], **sizes}


def pipeline_figures(
    profile: dict,
    cluster: dict,
    schedule: list[str],
    replicas: list[int],
    stages=None,
    recompute=None,
    degrees=None,
) -> dict:
    """Every figure of a plan under docs/spec.md section 1d, written from its formulas alone: stage
    ``s`` of ``S`` on ``t`` with ``k`` replicas takes ``(M + S - 1) c + 2 Y (k - 1) / k + U`` per step,
    ``c`` its compute and boundary transfer per micro-batch (and its type's pass start), ``Y`` its
    all-reduce (and its type's latency), and holds ``min(S - s, M)`` micro-batches
    of activations. Section 1g: a stage that ``recompute``s runs each layer's forward once more per
    micro-batch and holds its input for ``min(S - s, M)`` micro-batches and one micro-batch's
    activations. Section 1h: a stage at degree ``d`` takes its times and one unit's sizes at ``d``,
    and each replica holds ``d`` units."""
    layers, B0 = profile["layers"], profile["batch_size"]
    M = profile["job"]["global_batch"] // B0
    n = len(layers)
    stages = stages_of(schedule) if stages is None else stages
    S = len(stages)
    recompute = recompute or [False] * S
    degrees = degrees or [1] * S
    step, memory, fits, k_t = [], [], [], {t: 0 for t in cluster["resources"]}
    can = True
    for s, ((t, ls), k) in enumerate(zip(stages, replicas)):
        res = cluster["resources"][t]
        d = degrees[s]
        at = {layer: _at_degree(layers[layer], t, d) for layer in ls}
        if any(e is None for e, _ in at.values()):
            can = False
            at = {layer: (layers[layer]["times"][t], layers[layer]) for layer in ls}
        fixed = profile.get("fixed", {}).get(t, {})  # section 1d: once per stage, whatever its layers
        c, y, u = fixed.get("pass_start", 0.0), fixed.get("all_reduce_latency", 0.0), 0.0
        # a message each way per micro-batch across each of its boundaries with another stage
        c += fixed.get("transfer_latency", 0.0) * 2 * ((ls[0] > 0) + (ls[-1] < n - 1))
        for layer in ls:
            e = at[layer][0]
            a = e.get("alpha", layers[layer].get("alpha"))
            c += e["oct"] * (1 - a + a * share(B0, k) / B0)
            if recompute[s]:
                can &= "forward" in e
                c += e.get("forward", 0.0) * (1 - a + a * share(B0, k) / B0)
            y += e["odt"]
            u += e.get("update", 0.0)
        first, last = ls[0], ls[-1]
        if res.get("bandwidth_gbps"):
            moved = (layers[first]["input_size"] if first > 0 else 0.0) + (
                layers[last + 1]["input_size"] if last < n - 1 else 0.0
            )
            # section 1h: each of a replica's d units moves 1/d of it over its own link (all of it over
            # one shared link), then gathers the rest of what it receives, one way, inside the node
            bw = res["bandwidth_gbps"] * 1e9 / 8
            c += 2 * share(B0, k) * moved / bw / (1 if res.get("shared_link") else d)
            c += share(B0, k) * moved * (d - 1) / d / bw
        sf = profile.get("state_factor", 4.0)
        tied_u, tied_mem, tied_ok = _tied(profile, cluster, t, ls, d)
        can &= tied_ok
        step.append((M + S - 1) * c + 2 * y * (k - 1) / k + u + tied_u)
        held = min(S - s, M)
        mem = (res.get("memory_reserved_gb") or 0.0) * 1e9 + sf * tied_mem
        if recompute[s]:  # its input, for every micro-batch in flight
            mem += held * share(B0, k) * layers[ls[0]]["input_size"]
        for layer in ls:
            size = at[layer][1]
            w = sf * size["weight_size"]
            mem += (1 if recompute[s] else held) * size.get("cast_size", 0.0)  # a whole copy per micro-batch held
            kept = size.get("activation_size", 0.0)
            if layer != ls[0]:  # a stage holds once what a layer and the one before it both save
                kept -= size.get("input_saved", 0.0)
            mem += (w / k if layers[layer].get("sharded") else w) + (1 if recompute[s] else held) * share(B0, k) * kept
        memory.append(mem / 1e9)
        fits.append(res.get("memory_gb") is None or mem <= res["memory_gb"] * 1e9 * (1 + 1e-12))
        k_t[t] += k * d
    thr = M * B0 / max(step)
    time_s = profile["job"]["epochs"] * profile["job"]["samples"] / thr
    rate = sum(cluster["resources"][t]["price"] * k for t, k in k_t.items())
    within = all(k <= cluster["resources"][t]["limit"] for t, k in k_t.items()) and max(replicas) <= B0
    return {
        "step_s": step,
        "recompute_ok": can,
        "throughput": thr,
        "cost_usd": time_s / 3600 * rate,
        "memory_gb": memory,
        "feasible": within and all(fits) and can,
        "resources": k_t,
    }


def figures_of_plan(profile: dict, cluster: dict, plan) -> dict:
    """:func:`pipeline_figures` of a plan as it cuts its stages (two on one type kept two), with each
    stage's recomputation and tensor-parallel degree (sections 1g, 1h)."""
    stages = [(s.resource, list(range(s.first, s.last + 1))) for s in plan.stages]
    return pipeline_figures(
        profile,
        cluster,
        plan.schedule,
        [s.replicas for s in plan.stages],
        stages,
        [bool(s.recompute) for s in plan.stages],
        [s.tp or 1 for s in plan.stages],
    )


def assert_figures_are_the_oracles(profile: dict, cluster: dict, plan) -> dict:
    """The plan is feasible by the oracle, and its throughput and each stage's step and memory are
    the oracle's; the oracle's figures."""
    ref = figures_of_plan(profile, cluster, plan)
    assert ref["feasible"]
    assert math.isclose(plan.throughput, ref["throughput"], rel_tol=1e-9)
    for stage, step, memory in zip(plan.stages, ref["step_s"], ref["memory_gb"]):
        assert math.isclose(stage.step_s, step, rel_tol=1e-9)
        assert math.isclose(stage.memory_gb, memory, rel_tol=1e-9, abs_tol=1e-15)
    return ref


def pipeline_optimum(
    profile: dict,
    cluster: dict,
    objective: str = "cost",
    min_throughput: float = 0.0,
    max_cost: float | None = None,
    fewest=None,
    keep=None,
):
    """(cost, throughput) of the best plan under section 1d by enumerating every schedule and every
    replica vector within the limits (and the budget, when given); None when no plan is feasible.
    ``fewest(type, layers)``: the fewest replicas a stage of them may take (section 1f), if any.
    ``keep(stages, replicas, degrees, recomputes)``: only the plans it keeps (section 1k's shapes)."""
    types = list(cluster["resources"])
    layers = profile["layers"]
    best = None
    for sched in itertools.product(types, repeat=len(layers)):
        if not all(t in layer["times"] for t, layer in zip(sched, layers)):
            continue
        B0 = profile["batch_size"]
        for stages, ks, ds in _cuts_replicas_degrees(sched, cluster, B0, layers):
            if fewest is not None and any(k < fewest(t, ls) for (t, ls), k in zip(stages, ks)):
                continue
            for again in _recomputes(layers, stages, ds):
                if keep is not None and not keep(stages, ks, ds, again):
                    continue
                f = pipeline_figures(profile, cluster, list(sched), list(ks), stages, list(again), list(ds))
                if not f["feasible"] or f["throughput"] < min_throughput * (1 - 1e-12):
                    continue
                if max_cost is not None and f["cost_usd"] > max_cost * (1 + 1e-12):
                    continue
                if best is None or _better(objective, f["cost_usd"], f["throughput"], *best):
                    best = (f["cost_usd"], f["throughput"])
    return best


def pipeline_optimum_on_nodes(profile: dict, cluster: dict, objective: str = "cost", min_throughput: float = 0.0):
    """:func:`pipeline_optimum` on a cluster of node kinds (section 1e): every plan within the units of
    every node rented, priced by the cheapest rental holding its units; a degree ``d`` offered on a
    type only where every kind holding it holds a multiple of ``d`` (section 1h)."""
    types = list(cluster["resources"])
    kinds = list(cluster["nodes"].values())
    units = np.array([[k["units"].get(t, 0) for t in types] for k in kinds])
    capacity, rate = rentals(units, [k["price"] for k in kinds], [k["available"] for k in kinds])
    most = capacity.max(axis=0)
    flat = {
        "resources": {t: {**cluster["resources"][t], "price": 0.0, "limit": int(most[i])} for i, t in enumerate(types)}
    }

    def offered(t: str, d: int) -> bool:
        column = units[:, types.index(t)]
        return bool((column[column > 0] % d == 0).all())

    layers, B0 = profile["layers"], profile["batch_size"]
    work = profile["job"]["epochs"] * profile["job"]["samples"]
    best = None
    for sched in itertools.product(types, repeat=len(layers)):
        if not all(t in layer["times"] for t, layer in zip(sched, layers)):
            continue
        for stages, ks, ds in _cuts_replicas_degrees(sched, flat, B0, layers):
            if not all(offered(t, d) for (t, _), d in zip(stages, ds)):
                continue
            for again in _recomputes(layers, stages, ds):
                f = pipeline_figures(profile, flat, list(sched), list(ks), stages, list(again), list(ds))
                if not f["feasible"] or f["throughput"] < min_throughput * (1 - 1e-12):
                    continue
                used = np.array([[f["resources"][t] for t in types]], dtype=float)
                hourly = cheapest_rental(used, capacity, rate)[0]
                if not np.isfinite(hourly):
                    continue
                cost = work / f["throughput"] / 3600 * hourly
                if best is None or _better(objective, cost, f["throughput"], *best):
                    best = (cost, f["throughput"])
    return best


def _recomputes(layers, stages, degrees=None):
    """Section 1g: every choice of stages that recompute, among those whose every layer gives a forward time
    (at the stage's degree, section 1h)."""
    degrees = degrees or [1] * len(stages)
    able = [all("forward" in (_at_degree(layers[i], t, d)[0] or {}) for i in ls) for (t, ls), d in zip(stages, degrees)]
    return itertools.product(*([False, True] if a else [False] for a in able))


def _cuts_and_replicas(sched, cluster, B0):
    """Every cut of ``sched`` into stages with every replica vector of at most each type's limit and ``B0``."""
    for stages, ks, _ in _cuts_replicas_degrees(sched, cluster, B0):
        yield stages, ks


def _cuts_replicas_degrees(sched, cluster, B0, layers=None):
    """:func:`_cuts_and_replicas` with each stage's tensor-parallel degree (section 1h): every degree all
    of its layers give on its type (1 without ``layers``), and replicas of at most the limit's units."""
    for stages in partitions_of(list(sched)):
        choices = [
            [1]
            + sorted(
                set.intersection(*(set(layers[i]["times"][t].get("tp", {})) for i in ls))
                if layers is not None
                else set()
            )
            for t, ls in stages
        ]
        for ds in itertools.product(*choices):
            ranges = (range(1, min(cluster["resources"][t]["limit"] // d, B0) + 1) for (t, _), d in zip(stages, ds))
            for ks in itertools.product(*ranges):
                yield stages, ks, ds


def rentals(units, price, available):
    """Section 1e: every rental (a count of each node kind, 0 to its available) as (capacity[N, T], rate[N])."""
    counts = np.array(list(itertools.product(*(range(a + 1) for a in available))), dtype=float)
    return counts @ np.asarray(units, dtype=float), counts @ np.asarray(price, dtype=float)


def cheapest_rental(used, capacity, rate):
    """For each row of ``used[M, T]``, the least rate of a rental holding it (inf: none does)."""
    holds = (capacity[None, :, :] >= used[:, None, :]).all(axis=2)
    return np.where(holds, rate[None, :], np.inf).min(axis=1)


def assert_is_the_optimum(plan, expected, objective) -> bool:
    """The exact solver's ``plan`` (None: infeasible) against the enumerated optimum ``expected``
    ((cost, throughput) or None); True when there is a plan to check further."""
    assert (plan is None) == (expected is None), f"exact: {plan and plan.cost_usd}, enumeration: {expected}"
    if plan is None:
        return False
    assert plan.optimal and plan.feasible
    assert math.isclose(plan.cost_usd, expected[0], rel_tol=1e-9, abs_tol=1e-12)
    if objective == "time":
        assert math.isclose(plan.throughput, expected[1], rel_tol=1e-9)
    return True


def assert_is_the_frontier(problem, cost, thr, mixed_stages: bool = False) -> None:
    """The exact frontier of ``problem`` is the Pareto set of the enumerated plans ``cost``, ``thr``."""
    from heterps_cli.errors import InfeasibleError
    from heterps_cli.frontier import pareto_frontier

    if len(cost) == 0:
        try:
            pareto_frontier(problem, mixed_stages=mixed_stages)
        except InfeasibleError:
            return
        raise AssertionError("a frontier where enumeration finds no feasible plan")
    got = [(p.throughput, p.cost_usd) for p in pareto_frontier(problem, mixed_stages=mixed_stages).plans]
    want = pareto(cost, thr)
    assert len(got) == len(want), (got, want)
    for (x, c), (wx, wc) in zip(got, want):
        assert math.isclose(x, wx, rel_tol=1e-9) and math.isclose(c, wc, rel_tol=1e-9)
