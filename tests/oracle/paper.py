"""The oracle of docs/spec.md sections 1 and 1b (the papers' model, and memory and transfer): each
plan's figures layer by layer, and the optimum by enumerating every plan."""

from __future__ import annotations

import itertools
import math

import numpy as np


def share(B0, k):
    """docs/spec.md section 1: a replica trains whole samples, the busiest ``ceil(B0 / k)`` of ``B0``."""
    return np.ceil(B0 / k) if isinstance(k, np.ndarray) else math.ceil(B0 / k)


def spec_figures(profile: dict, cluster: dict, plan: dict) -> dict:
    """Recompute every figure of a plan from the raw profile and cluster mappings (docs/spec.md sections 1, 1b)."""
    layers = profile["layers"]
    B0 = profile["batch_size"]
    n = len(layers)
    stage_thr, ct, dt, transfer, memory, fits = [], [], [], [], [], []
    k_t = {t: 0 for t in cluster["resources"]}
    for s in plan["stages"]:
        t, k = s["resource"], s["replicas"]
        a_, b_ = s["first"], s["last"]
        c = d = 0.0
        for layer in layers[a_ : b_ + 1]:
            e = layer["times"][t]
            a = e.get("alpha", layer.get("alpha"))
            b = e.get("beta", layer.get("beta"))
            c += e["oct"] * (1 - a + a * share(B0, k) / B0)
            d += e["odt"] * (1 - b + b * share(B0, k) / B0)
        resource = cluster["resources"][t]
        x = 0.0
        if resource.get("bandwidth_gbps"):
            moved = (layers[a_]["input_size"] if a_ > 0 else 0.0) + (
                layers[b_ + 1]["input_size"] if b_ < n - 1 else 0.0
            )
            x = 2 * B0 * moved / (resource["bandwidth_gbps"] * 1e9 / 8)
        d += x * share(B0, k) / B0
        sf = profile.get("state_factor", 4.0)
        tied_s, copies, _ = _tied(profile, cluster, t, list(range(a_, b_ + 1)), 1, False)  # 1j
        d += tied_s
        mem = sf * copies
        for i, layer in enumerate(layers[a_ : b_ + 1]):
            w = sf * layer["weight_size"]
            mem += layer.get("cast_size", 0.0)  # a half-precision copy of the weights, whole on each replica
            held = layer.get("activation_size", 0.0) - (layer.get("input_saved", 0.0) if i else 0.0)
            mem += (w / k if layer.get("sharded") else w) + share(B0, k) * held
        ct.append(c)
        dt.append(d)
        transfer.append(x * share(B0, k) / B0)
        memory.append(mem / 1e9)
        fits.append(k <= B0 and (resource.get("memory_gb") is None or mem <= resource["memory_gb"] * 1e9 * (1 + 1e-9)))
        stage_thr.append(B0 / max(c, d))
        k_t[t] += k
    thr = min(stage_thr)
    time_s = plan["epochs"] * plan["samples"] / thr
    cost = time_s / 3600 * sum(cluster["resources"][t]["price"] * k for t, k in k_t.items())
    return {
        "compute_s": ct,
        "comm_s": dt,
        "stage_throughput": stage_thr,
        "throughput": thr,
        "resources": k_t,
        "time_s": time_s,
        "cost_usd": cost,
        "transfer_s": transfer,
        "memory_gb": memory,
        "memory_fits": all(fits),
    }


def _tied(
    profile: dict, cluster: dict, t: str, ls: list[int], d: int, pipelined: bool = True
) -> tuple[float, float, bool]:
    """Section 1j for one stage on ``t`` over layers ``ls`` at degree ``d``: the seconds per step it spends
    keeping tensors it shares with other stages one (a parameter's gradient all-reduced, twice its bytes;
    a buffer broadcast, its bytes; over the type's link, with its all-reduce latency each), the bytes of
    tied parameters it holds that its layers' weight_size leaves out (a copy, where it holds a holder but
    not the first), and whether it may run them (a holder only at tp 1)."""
    names = [layer["name"] for layer in profile["layers"]]
    res = cluster["resources"][t]
    bw = res["bandwidth_gbps"] * 1e9 / 8 if res.get("bandwidth_gbps") else None
    latency = profile.get("fixed", {}).get(t, {}).get("all_reduce_latency", 0.0) if pipelined else 0.0
    seconds, copies, ok = 0.0, 0.0, True
    for tie in profile.get("ties", []):
        holders = [names.index(name) for name in tie["layers"]]
        mine = [h for h in holders if h in ls]
        if not mine:
            continue
        ok &= d == 1
        kind = tie.get("kind", "parameter")
        if kind == "parameter" and holders[0] not in ls:
            copies += tie["bytes"]
        if len(mine) < len(holders):
            moved = (2 if kind == "parameter" else 1) * tie["bytes"]
            seconds += (moved / bw if bw else 0.0) + latency
    return seconds, copies, ok


def stages_of(schedule) -> list:
    """The stages of a schedule (a type per layer), as docs/spec.md section 1 defines them: maximal
    runs of layers on one type, each ``(type, [layers])``."""
    stages: list = []
    for layer, t in enumerate(schedule):
        if stages and stages[-1][0] == t:
            stages[-1][1].append(layer)
        else:
            stages.append((t, [layer]))
    return stages


def partitions_of(schedule, maximal: bool = False) -> list:
    """Every way docs/spec.md section 1 cuts a schedule into stages, each as :func:`stages_of` gives
    them: at every change of type, and anywhere inside a run of one type (each cut or not); with
    ``maximal`` (the papers' space) only the maximal runs."""
    n = len(schedule)
    changes = [i for i in range(1, n) if schedule[i] != schedule[i - 1]]
    inside = [] if maximal else [i for i in range(1, n) if schedule[i] == schedule[i - 1]]
    out = []
    for chosen in itertools.product([False, True], repeat=len(inside)):
        cuts = sorted(changes + [i for i, c in zip(inside, chosen) if c]) + [n]
        start, stages = 0, []
        for cut in cuts:
            stages.append((schedule[start], list(range(start, cut))))
            start = cut
        out.append(stages)
    return out


def feasible_plans(
    oct_,
    odt,
    alpha,
    beta,
    runnable,
    prices,
    limits,
    B0,
    work,
    min_throughput=0.0,
    max_cost=None,
    schedules=None,
    hardware=None,
    rate_of=None,
    maximal=False,
):
    """(cost, throughput) arrays of every feasible plan, by enumerating every schedule (or only
    ``schedules``), every cut of it into stages (:func:`partitions_of`; only maximal runs with
    ``maximal``) and every replica vector within the limits (and, with ``hardware``, docs/spec.md
    section 1b: transfer and memory). ``rate_of(used[M, T])``: USD an hour of the units each plan
    uses, instead of ``prices`` per unit (section 1e: :func:`cheapest_rental`)."""
    n, T = oct_.shape
    costs, thrs = [np.zeros(0)], [np.zeros(0)]
    for sched in schedules if schedules is not None else itertools.product(range(T), repeat=n):
        if not all(runnable[layer, t] for layer, t in enumerate(sched)):
            continue
        for stages in partitions_of(sched, maximal):
            _plans_of(stages, oct_, odt, alpha, beta, prices, limits, B0, work, min_throughput, max_cost, hardware,
                      rate_of, costs, thrs)  # fmt: skip
    return np.concatenate(costs), np.concatenate(thrs)


def _plans_of(stages, oct_, odt, alpha, beta, prices, limits, B0, work, min_throughput, max_cost, hardware, rate_of,
              costs, thrs):  # fmt: skip
    """:func:`feasible_plans` for one cut into stages: appends the feasible plans' costs and throughputs."""
    n, T = oct_.shape
    ranges = [range(1, min(limits[t], B0) + 1) for t, _ in stages]  # section 1: k <= B0
    ks = np.array(list(itertools.product(*ranges)), dtype=float)  # [M, S]
    if len(ks) == 0:  # a type with no units (section 1e: a rental without it)
        return
    types = np.array([t for t, _ in stages])
    used = np.stack([ks[:, types == t].sum(axis=1) for t in range(T)], axis=1)
    ks = ks[(used <= limits).all(axis=1)]
    if len(ks) == 0:
        return
    et = []
    fits = np.ones(len(ks), dtype=bool)
    for s, (t, ls) in enumerate(stages):
        k = ks[:, s]
        c = sum(oct_[layer, t] * (1 - alpha[layer, t] + alpha[layer, t] * share(B0, k) / B0) for layer in ls)
        d = sum(odt[layer, t] * (1 - beta[layer, t] + beta[layer, t] * share(B0, k) / B0) for layer in ls)
        if hardware is not None:
            c, d, fit = _section_1b(hardware, B0, n, t, ls, k, c, d)
            fits &= fit
        et.append(np.maximum(c, d))
    thr = B0 / np.max(np.stack(et, axis=1), axis=1)
    rate = (ks * prices[types][None, :]).sum(axis=1) if rate_of is None else rate_of(used[(used <= limits).all(axis=1)])
    cost = work / thr / 3600 * rate
    ok = (thr >= min_throughput * (1 - 1e-12)) & fits
    if max_cost is not None:
        ok &= cost <= max_cost * (1 + 1e-12)
    costs.append(cost[ok])
    thrs.append(thr[ok])


def brute_force(*arrays, objective="cost", **kwargs):
    """The optimum among :func:`feasible_plans` (same arguments): (cost, throughput) of the best
    plan, or None when no plan is feasible."""
    best = None
    for c, x in zip(*feasible_plans(*arrays, **kwargs)):
        if best is None or _better(objective, c, x, *best):
            best = (float(c), float(x))
    return best


def pareto(cost, thr):
    """The (throughput, cost) pairs no other plan matches, by rising throughput.

    A plan at least as fast as another is one whose throughput is at least the other's times
    (1 - 1e-12), as ``--min-throughput`` reads it: so of plans whose throughputs are that close,
    only the cheapest can be on the frontier. From the fastest down, each kept plan is cheaper (by
    more than 1e-12, relative) than every plan at least as fast as it."""
    up = np.argsort(thr, kind="stable")
    cheapest_from = np.minimum.accumulate(cost[up][::-1])[::-1]  # least cost among the j-th slowest and faster
    as_fast = np.searchsorted(thr[up], thr * (1 - 1e-12), side="left")
    beaten = cheapest_from[as_fast] < cost * (1 - 1e-12)
    kept: list[tuple[float, float]] = []
    for i in np.lexsort((cost, -thr)):
        if beaten[i] or (kept and math.isclose(kept[-1][0], thr[i], rel_tol=1e-12)):
            continue  # beaten, or as fast as a plan kept and no cheaper (it would be beaten otherwise)
        if not kept or cost[i] < kept[-1][1] * (1 - 1e-12):
            kept.append((float(thr[i]), float(cost[i])))
    return kept[::-1]


def _section_1b(hw, B0, n, t, ls, k, c, d):
    """A stage's compute and communication with its boundary transfer, and whether each replica's
    memory fits, written from docs/spec.md section 1b's formulas."""
    first, last = ls[0], ls[-1]
    if hw["bandwidth_gbps"][t] is not None:
        moved = (hw["input_size"][first] if first > 0 else 0.0) + (hw["input_size"][last + 1] if last < n - 1 else 0.0)
        d = d + 2 * share(B0, k) * moved / (hw["bandwidth_gbps"][t] * 1e9 / 8)
    fit = np.ones_like(k, dtype=bool)
    if hw["memory_gb"][t] is not None:
        sf = hw["state_factor"]
        casts = hw["cast_size"] if hw.get("cast_size") is not None else [0.0] * n
        # a weight's half-precision copy is whole on every replica, sharded or not (spec 1b's C_s)
        unsharded = sum(sf * hw["weight_size"][i] for i in ls if not hw["sharded"][i]) + sum(casts[i] for i in ls)
        sharded = sum(sf * hw["weight_size"][i] for i in ls if hw["sharded"][i])
        shared = hw.get("input_saved")
        activations = sum(hw["activation_size"][i] for i in ls) - (
            sum(shared[i] for i in ls[1:]) if shared is not None else 0.0
        )
        mem = unsharded + sharded / k + share(B0, k) * activations
        fit = mem <= hw["memory_gb"][t] * 1e9 * (1 + 1e-12)
    return c, d, fit


def _better(objective, cost, thr, best_cost, best_thr):
    if objective == "time":
        if not math.isclose(thr, best_thr, rel_tol=1e-12):
            return thr > best_thr
        return cost < best_cost
    return cost < best_cost


def optimum_by_bottleneck(profile: dict, cluster: dict, min_throughput: float, work: float):
    """Cheapest plan over every schedule, for limits too large to enumerate replica vectors.

    Uses only the spec's own remark that an optimal bottleneck throughput is some
    stage's ``thr_s(k)``: for every schedule, every stage and every ``k`` up to its
    limit, give each other stage the fewest replicas reaching that throughput
    (a search in its tabulated, monotone throughput curve). Returns (cost, thr, schedule).
    """
    types = list(cluster["resources"])
    layers = profile["layers"]
    B0 = profile["batch_size"]
    best = None
    for sched in itertools.product(types, repeat=len(layers)):
        if not all(t in layer["times"] for t, layer in zip(sched, layers)):
            continue
        stages = []
        for layer, t in enumerate(sched):
            if stages and stages[-1][0] == t:
                stages[-1][1].append(layer)
            else:
                stages.append((t, [layer]))
        curves = []
        for t, ls in stages:
            k = np.arange(1, min(cluster["resources"][t]["limit"], B0) + 1, dtype=float)
            c = d = 0.0
            for layer in ls:
                e = layers[layer]["times"][t]
                a = e.get("alpha", layers[layer].get("alpha"))
                b = e.get("beta", layers[layer].get("beta"))
                c = c + e["oct"] * (1 - a + a * share(B0, k) / B0)
                d = d + e["odt"] * (1 - b + b * share(B0, k) / B0)
            curves.append(B0 / np.maximum(c, d))
        candidates = np.unique(np.concatenate(curves))
        candidates = candidates[candidates >= min_throughput * (1 - 1e-12)]
        if candidates.size == 0:
            continue
        reps = np.stack([np.searchsorted(curve, candidates, side="left") + 1 for curve in curves])  # [S, C]
        reachable = np.stack([candidates <= curve[-1] for curve in curves]).all(axis=0)
        used_ok = np.ones(candidates.size, dtype=bool)
        rate = np.zeros(candidates.size)
        for t in types:
            rows = [s for s, (tt, _) in enumerate(stages) if tt == t]
            if rows:
                used_ok &= reps[rows].sum(axis=0) <= cluster["resources"][t]["limit"]
                rate += cluster["resources"][t]["price"] * reps[rows].sum(axis=0)
        ok = reachable & used_ok
        if not ok.any():
            continue
        cost = work / candidates[ok] / 3600 * rate[ok]
        i = int(np.argmin(cost))
        if best is None or cost[i] < best[0]:
            best = (float(cost[i]), float(candidates[ok][i]), sched)
    return best
