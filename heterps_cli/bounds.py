"""A bound on the optimum that needs no search (docs/exact.md, "When the tables do not fit"): what a
plan answered without the exact solver is proven to be within.

Every replica computes its share of every micro-batch, and a replica's time at a share is never less,
per sample, than the layer's least time per sample at any size the profile measured (section 1f: a
share costs the measured size's serial part whole and its parallel part in proportion); at degree
``d`` its ``d`` units are busy the whole time. So whatever its stages, replicas, degrees or pipeline,
a plan that trains ``X`` samples a second keeps type ``t`` busy for at least
``X · Σ_l f[l,t] · ρ[l,t]`` unit-seconds a second, ``f[l,t]`` the part of layer ``l``'s samples
trained on ``t`` and ``ρ[l,t]`` that least work per sample, and no type can be busier than its
``N_t`` units. The linear programme over ``f`` (and ``X``) is a relaxation: it drops communication,
memory, the pipeline's bubble and whole samples, so its optimum bounds every plan's.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from heterps_cli.figures import count, usd
from heterps_cli.formulas import SECONDS_PER_HOUR
from heterps_cli.objective import Objective
from heterps_cli.pace import speed_bound
from heterps_cli.problem import Problem


def within(objective: Objective, cost: float, throughput: float, best: float) -> tuple[float, str]:
    """A plan's proven gap to ``best`` (a bound on the objective's figure) and the words saying so."""
    gap = max(0.0, float(objective.gap(objective.figure(cost, throughput), best)))
    cheaper = objective is Objective.COST
    what = f"no plan costs less than {usd(best)}" if cheaper else f"no plan is faster than {count(best, 1)} samples/s"
    return gap, f"{what}, so it is within {100 * gap:.2f}% of the optimum"


def least_work(problem: Problem) -> np.ndarray:
    """``[n, T]``: each layer's least unit-seconds per sample on each type, over every degree and every
    size measured there (inf where the layer cannot run on the type)."""
    out = np.full((problem.n_layers, problem.n_types), np.inf)
    for view in problem.views:
        table = view.measured
        if table is None:
            per = np.where(view.runnable, view.degree * view.oct / view.batch_size, np.inf)
            out = np.minimum(out, per)
            continue
        for s, size in enumerate(table.sizes):
            times = table.oct[s]
            per = np.where(np.isnan(times) | (times <= 0), np.inf, view.degree * times / size)
            out = np.minimum(out, per)
    return out


def _unit_prices(problem: Problem) -> np.ndarray:
    """``[T]``: a price per unit-hour no plan pays less than: the type's, or with whole nodes the least
    a node holding the type charges per unit it holds of any type (a node is paid whole)."""
    nodes = problem.nodes
    if nodes is None:
        return problem.prices.astype(float)
    held = nodes.units.sum(axis=1) + sum((u for u in (nodes.others or {}).values()), np.zeros(len(nodes.names)))
    per = np.where(nodes.units > 0, nodes.price[:, None] / np.maximum(held, 1)[:, None], np.inf)
    return per.min(axis=0)


def bound(problem: Problem) -> float | None:
    """The objective's bound: no plan is faster (time) or cheaper (cost) than it; None where the
    relaxation has no answer (then every plan breaks a constraint, or the programme failed)."""
    from scipy.optimize import linprog

    rho = least_work(problem)
    usable = np.isfinite(rho)
    n, T = rho.shape
    cells = np.flatnonzero(usable.ravel())  # one variable per (layer, type) that can run it
    layer_of, type_of = np.divmod(cells, T)
    work = rho.ravel()[cells]
    busy = np.zeros((T, len(cells)))  # unit-seconds a second of each type
    busy[type_of, np.arange(len(cells))] = work
    cover = np.zeros((n, len(cells)))
    cover[layer_of, np.arange(len(cells))] = 1.0
    price = _unit_prices(problem)[type_of] / SECONDS_PER_HOUR  # USD per unit-second
    limits = problem.limits.astype(float)
    floor = problem.min_throughput
    if problem.objective is Objective.TIME:
        # variables: g (samples a second of each layer on each type), then X; maximise X
        c = np.zeros(len(cells) + 1)
        c[-1] = -1.0
        a_ub = np.hstack([busy, np.zeros((T, 1))])
        b_ub = limits
        if problem.max_cost is not None and problem.nodes is None:  # work / X · rate ≤ max_cost
            row = np.append(price * work * problem.work, -problem.max_cost)
            a_ub, b_ub = np.vstack([a_ub, row]), np.append(b_ub, 0.0)
        a_eq = np.hstack([cover, -np.ones((n, 1))])
        found = linprog(c, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=np.zeros(n), bounds=(0, None), method="highs")
        return float(found.x[-1]) if found.status == 0 else None
    # cost: f (the part of each layer on each type) at a throughput of at least the floor
    found = linprog(
        price * work * problem.work,
        A_ub=busy * floor,
        b_ub=limits,
        A_eq=cover,
        b_eq=np.ones(n),
        bounds=(0, None),
        method="highs",
    )
    return float(found.fun) if found.status == 0 else None


def by_micro_batch(problem: Problem) -> bool:
    """Whether :func:`proven` also holds the bound to each micro-batch's pace and units: objective time
    under a pipeline."""
    return problem.objective is Objective.TIME and problem.pipelined


def proven(problem: Problem, plan, out_of_time: Callable[[], bool] = lambda: False) -> tuple[float, str] | None:
    """``plan``'s gap to :func:`bound` at its micro-batch, and the words saying so (:func:`within`); None
    where the bound has no answer. Under objective time and a pipeline, the bound is also held to each
    micro-batch's pace ceiling and the units its throughput needs (:func:`~heterps_cli.pace.speed_bound`; a
    looser bound once ``out_of_time()``)."""
    best = bound(problem.at_micro_batch(plan.batch_size))
    if best is None:
        return None
    if by_micro_batch(problem) and plan.throughput > 0:
        best = max(plan.throughput, min(best, speed_bound(problem, plan.throughput, best, out_of_time)))
    return within(problem.objective, plan.cost_usd, plan.throughput, best)
