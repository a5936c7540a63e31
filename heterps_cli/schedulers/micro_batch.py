"""The micro-batch chosen (docs/spec.md section 1f): a scheduler's plan at each micro-batch a plan may
take, and the best of them. Each micro-batch is its own problem (its times, its replica cap ``k <= B``,
its ``M = G / B``), so the best of the exact optimum at each is the optimum over all of them, and its
certificate is the weakest of theirs."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable

import numpy as np

from heterps_cli.costmodel import throughput_floor
from heterps_cli.errors import InfeasibleError, SearchGaveUp, Unexplained
from heterps_cli.figures import count, usd
from heterps_cli.formats import Plan
from heterps_cli.objective import Objective, meets
from heterps_cli.pace import pace_ceiling
from heterps_cli.problem import Problem
from heterps_cli.schedulers.base import Clock, ExactOptions, Progress, SolveOptions
from heterps_cli.units_bound import EVERY_COUNT, units_short

SolveOne = Callable[[Problem, SolveOptions, Progress | None], Plan]


def best_micro_batch(
    problem: Problem,
    choices: tuple[int, ...],
    solve_one: SolveOne,
    progress: Progress | None,
    options: SolveOptions | None,
    exact: bool = False,
    optimum: Plan | None = None,
) -> Plan:
    """The best of ``solve_one``'s plans at each of ``choices`` (by the objective, a feasible one first);
    InfeasibleError, naming every choice, where there is none. Each choice gets an equal part of the time
    left. ``optimum``, a proven one: its micro-batch first, and none other once a plan meets it."""
    options = options or SolveOptions()
    start = time.perf_counter()
    clock = Clock.of(options, start)
    found: dict[int, Plan] = {}
    failed: dict[int, InfeasibleError] = {}
    beaten: set[int] = set()  # asked only for a plan faster than the best so far
    unasked = "interrupted"  # why the choices not asked were not
    unsearched: list[tuple[int, Problem, SolveOptions, Progress | None]] = []  # proven short of the job's floor
    order, left_out = _order(choices, optimum), []
    for i, batch in enumerate(order):
        left = clock.left()
        if left is not None and left <= 0 and (found or failed):  # the rest unasked: the limit holds
            unasked, left_out = "the time limit ran out", order[i:]
            break
        asked = _share(options, None if left is None else max(0.0, left) / (1 if options.guard else len(choices) - i))
        fastest = max((p.throughput for p in found.values() if p.feasible), default=0.0)
        if exact and problem.objective is Objective.TIME and problem.max_cost is None and fastest > 0:
            asked = ExactOptions(**{**vars(asked), "at_least": fastest})
            beaten.add(batch)
        report = _prefixed(progress, f"micro-batch {batch:,} ({i + 1} of {len(choices)})")
        sub = problem.at_micro_batch(batch)
        if (why := _out_of_reach(sub, fastest)) is not None:
            failed[batch] = InfeasibleError(why)
            if problem.objective is Objective.TIME and fastest > 0:  # else none meets the job's floor there
                beaten.add(batch)
            else:
                unsearched.append((batch, sub, asked, report))
            continue
        try:
            plan = solve_one(sub, asked, report)
        except InfeasibleError as exc:
            failed[batch] = exc
            if isinstance(exc, Unexplained):
                unsearched.append((batch, sub, asked, report))
            continue
        found[batch] = plan
        if plan.interrupted:  # Ctrl-C: the best so far, the other sizes unasked
            break
        if optimum is not None and plan.feasible and meets(*map(problem.objective.key_of, (plan, optimum))):
            unasked = f"the plan at micro-batch {batch:,} meets {proven_words(optimum)}"
            break
    if not found:
        _search_after_all(unsearched, solve_one, found, failed, clock)
    if not found:
        raise _none_found(problem, failed, left_out)
    best = _best(problem, found)
    return _chosen(problem, choices, found, failed, beaten, best, time.perf_counter() - start, unasked)


def _none_found(problem: Problem, failed: dict[int, InfeasibleError], left_out: list[int]) -> InfeasibleError:
    """The error where no choice has a plan: proven (exit 3) only where every choice was asked and none gave
    up; a search that gave up, or a choice the time limit left unasked, may hide a plan (exit 5)."""
    if left_out:
        sizes = ", ".join(f"{b:,}" for b in sorted(left_out))
        which = f"micro-batches {sizes} were" if len(left_out) > 1 else f"micro-batch {sizes} was"
        searched = f" (of those searched: {_reasons(failed)})" if failed else ""
        return SearchGaveUp(f"the time limit ran out before {which} searched{searched}")
    gave_up = any(isinstance(exc, SearchGaveUp) for exc in failed.values())
    return (SearchGaveUp if gave_up else InfeasibleError)(_none_at_any(problem, failed))


def proven_words(optimum: Plan) -> str:
    """What the exact solver proves of ``optimum``, the plan a search stops at: optimal, or within its gap
    (mixed stages offered: a bound over mixed plans)."""
    if optimum.optimal:
        return "the optimum the exact solver proves"
    if optimum.gap is None:
        return "the exact solver's plan"
    return f"the exact solver's plan, proven within {100 * optimum.gap:.2f}% of the optimum"


def _share(options: SolveOptions, share: float | None) -> SolveOptions:
    """One choice's options: its share of the time left, the user's limit named in notes, and a search finding
    no plan not saying why (said only where no choice has one, :func:`_search_after_all`)."""
    whole = options.whole_limit if options.whole_limit is not None else options.time_limit
    return dataclasses.replace(options, time_limit=share, started=time.perf_counter(), whole_limit=whole, explain=False)


def _order(choices: tuple[int, ...], optimum: Plan | None) -> list[int]:
    """Largest first: where the exact solver asks only for a plan faster than the best so far, the largest
    micro-batches, which run a sample fastest, leave the others least to search; a proven optimum's first."""
    order = sorted(choices, reverse=True)
    if optimum is not None and optimum.batch_size in order:
        order.remove(optimum.batch_size)
        order.insert(0, optimum.batch_size)
    return order


def _search_after_all(unsearched: list, solve_one: SolveOne, found: dict, failed: dict, clock: Clock) -> None:
    """Where no choice has a plan, the choices a bound proved short of the job's floor, and those the exact
    search found none at without saying why, are searched (again) after all, so that the error says what the
    fastest plan there reaches and what caps it, not only the bound: each in its share of the time left, none
    once it has run out (they keep the bound's words, or the search's)."""
    for i, (batch, sub, asked, report) in enumerate(unsearched):
        left = clock.left()
        if left is not None and left <= 0:
            return
        share = None if left is None else left / (len(unsearched) - i)
        try:  # the bound, or the search, says it raises
            again = dataclasses.replace(asked, time_limit=share, started=None, explain=True)
            found[batch] = solve_one(sub, again, report)
        except SearchGaveUp:  # out of time: what the bound or the search proved stands
            continue
        except InfeasibleError as exc:
            failed[batch] = exc


def _out_of_reach(problem: Problem, fastest: float) -> str | None:
    """Why no plan at this micro-batch can be chosen, where :mod:`~heterps_cli.pace` proves it without a
    search: none reaches the throughput the job needs or, under objective time, passes ``fastest`` (a plan
    already found); None where one may."""
    need = max(throughput_floor(problem), fastest if problem.objective is Objective.TIME else 0.0)
    B = f"{problem.batch_size:,}"
    if not need > 0:
        return _fits_nowhere(problem)
    if (ceiling := pace_ceiling(problem)) < need * (1 - 1e-9):
        return (
            f"no plan at micro-batch {B} passes {count(ceiling, 1)} samples/s (each replica trains at least one "
            f"sample of a micro-batch, at its slowest layer's pace), short of {count(need, 1)}"
        )
    if (short := units_short(problem, need * (1 - 1e-9), by_stages=False)) is None:  # the cheap DP: it prunes
        return None
    stages = "its stages need" if short.stages == EVERY_COUNT else f"a plan of {short.stage_words} stages needs"
    within = (
        f"no plan at micro-batch {B} reaches {count(need, 1)} samples/s: each replica trains at least one sample "
        f"and at most what it can and holds within a step of {count(problem.step_samples, 1)} / {count(need, 1)} s "
        "(its pipeline's slots, its stage's optimiser step and the all-reduce among as many replicas as it needs)"
    )
    return _shortfall_words(problem, short, within, stages, "that")


def _fits_nowhere(problem: Problem) -> str | None:
    """Why no plan at this micro-batch fits its units' memory, whatever its time (the units bound at
    throughput 0); None where one may."""
    if (short := units_short(problem, 0.0, by_stages=False, by_sets=False)) is None:
        return None
    within = (
        f"no plan at micro-batch {problem.batch_size:,} fits: a replica holds its training state and weight copies "
        "and, of each micro-batch in flight, the activations of the samples it trains"
    )
    return _shortfall_words(problem, short, within, "its stages need", "its units' memory")


def _shortfall_words(problem: Problem, short, within: str, stages: str, bound: str) -> str:
    """``within``, then what the units bound's :class:`~heterps_cli.units_bound.Shortfall` counts: the
    weighed units ``stages`` ("its stages need", ...), or that no cut has every stage within ``bound``."""
    if not math.isfinite(short.need):
        return f"{within}, and no cut into stages has every stage within {bound}"
    weights = ", ".join(f"{problem.types[t]} x{w:.3g}" for t, w in enumerate(short.weights))
    return (
        f"{within}, so {stages} at least {count(short.need, 1)} units, the cluster has {count(short.have, 1)} "
        f"(each type's units weighed: {weights})"
    )


def _best(problem: Problem, found: dict[int, Plan]) -> int:
    batches = list(found)
    feasible = np.array([found[b].feasible for b in batches])
    cost = np.array([found[b].cost_usd for b in batches])
    throughput = np.array([found[b].throughput for b in batches])
    order = problem.objective.ranked(np.where(feasible, cost, np.inf), np.where(feasible, throughput, -np.inf))
    return batches[int(order[0])]


def _chosen(
    problem: Problem,
    choices: tuple[int, ...],
    found: dict[int, Plan],
    failed: dict[int, InfeasibleError],
    beaten: set[int],
    batch: int,
    solve_s: float,
    unasked: str = "interrupted",
) -> Plan:
    """The plan at ``batch``, its notes saying what each other choice gave and its certificate the one
    over every choice."""
    plan = found[batch]
    figures = "; ".join(
        f"{b:,}: "
        + (
            f"{problem.objective.shown(found[b].cost_usd, found[b].throughput)}"
            + ("" if found[b].feasible else " (breaks a constraint)")
            if b in found
            else _no_plan(failed[b], b in beaten)
            if b in failed
            else f"not asked ({unasked})"
        )
        for b in choices
    )
    notes = [
        f"micro-batch {batch:,} chosen ({problem.step_samples // batch:,} per step of {problem.step_samples:,}) "
        f"of the sizes the profile measured, and the multiples of the largest, that divide the global batch; the "
        f"best plan at each: {figures}",
        *plan.notes,
    ]
    changes: dict = {
        "notes": notes,
        "solve_s": solve_s,
        "evaluations": sum(p.evaluations or 0 for p in found.values()) or plan.evaluations,
    }
    if plan.optimal is not None:
        changes.update(_certificate(problem, choices, found, failed, plan))
        if changes["gap"] is not None and not changes["optimal"]:
            changes["notes"] = [*notes, _gap_note(problem, changes["gap"], changes.pop("bound"))]
        changes.pop("bound", None)
    return plan.but(**changes).of_run(plan.units, plan.interrupted)


def _no_plan(failure: InfeasibleError, beaten: bool) -> str:
    return "none found in time" if isinstance(failure, SearchGaveUp) else "none as fast" if beaten else "no plan"


def _certificate(
    problem: Problem, choices: tuple[int, ...], found: dict[int, Plan], failed: dict[int, InfeasibleError], plan: Plan
) -> dict:
    """``optimal`` and ``gap`` over every choice: the bound on the optimum is the weakest of each
    choice's (its plan where proven optimal, its plan with its gap where cut short, none where it was
    neither); a choice with no plan is proven to have none by the exact solver, unless it ran out of time there
    (then nothing is proven over every choice)."""
    objective = problem.objective
    bounds = []
    for b in choices:
        if isinstance(failed.get(b), SearchGaveUp):  # out of time: nothing proven there
            return {"optimal": False, "gap": None, "bound": None}
        if b in failed:
            continue
        other = found.get(b)
        if other is None or (not other.optimal and other.gap is None):
            return {"optimal": False, "gap": None, "bound": None}
        figure = objective.figure(other.cost_usd, other.throughput)
        gap = other.gap or 0.0
        if objective is Objective.COST:
            bounds.append(figure / (1 + gap))
        else:
            bounds.append(figure / (1 - gap) if gap < 1 else float("inf"))
    bound = min(bounds) if objective is Objective.COST else max(bounds)
    gap = float(objective.gap(objective.figure(plan.cost_usd, plan.throughput), bound))
    proved = gap <= 1e-12
    return {"optimal": proved, "gap": None if proved else gap, "bound": bound}


def _gap_note(problem: Problem, gap: float, bound: float) -> str:
    what = (
        f"no plan costs less than {usd(bound)}"
        if problem.objective is Objective.COST
        else f"no plan is faster than {count(bound, 1)} samples/s"
    )
    return f"over every micro-batch: {what}, so the plan is within {100 * gap:.2f}% of the optimum"


def _none_at_any(problem: Problem, failed: dict[int, InfeasibleError]) -> str:
    """One message for a plan that no micro-batch has (of those asked): each reason once, with the choices it
    holds at."""
    return (
        f"no plan at any micro-batch the plan may choose (a measured size or a multiple of the largest) that "
        f"divides the global batch "
        f"{problem.step_samples:,} ({_reasons(failed)})"
    )


def _reasons(failed: dict[int, InfeasibleError]) -> str:
    reasons: dict[str, list[int]] = {}
    for b, exc in failed.items():
        reasons.setdefault(str(exc), []).append(b)
    return "; ".join(
        f"at micro-batch{'es' if len(bs) > 1 else ''} {', '.join(f'{b:,}' for b in sorted(bs))}: {why}"
        for why, bs in reasons.items()
    )


def _prefixed(progress: Progress | None, prefix: str) -> Progress | None:
    if progress is None:
        return None

    def report(description: str, completed: float | None = None, total: float | None = None) -> None:
        progress(f"{prefix}: {description}", completed, total)

    return report
