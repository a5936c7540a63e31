"""The exact solver's outer loop over bottleneck throughputs (docs/exact.md section 4): the walks that
ask a solver (:class:`~.step.StepSolver`, or :class:`~.pipeline.PipelineSolver` over stage counts) for
the cheapest plan at rising targets. Objective ``cost`` walks the right ends of the price-rate steps
upwards from ``min_throughput`` and stops at the first target no plan reaches or where a lower bound
exceeds the best cost; ``time`` bisects for the largest reachable target (reachability only shrinks as
it grows), then finishes by exact jumps; with ``max_cost`` every step is walked, since the budget is
not monotone in the throughput."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from heterps_cli.costmodel import throughput_floor
from heterps_cli.errors import TooLarge
from heterps_cli.formulas import SLACK
from heterps_cli.schedulers.exact.kernel import Candidate
from heterps_cli.schedulers.exact.pipeline import CountsLeft, PipelineSolver, scored, true_candidate, walking
from heterps_cli.schedulers.exact.step import StepSolver


def min_cost(
    solver: StepSolver, out_of_time: Callable[[], bool] = lambda: False, incumbent: Candidate | None = None
) -> tuple[Candidate | None, float]:
    """The cheapest plan within the limits and a proven lower bound on the optimum's cost; a pipelined
    solver's one stage count at a time (:func:`min_cost_by_stages`)."""
    if isinstance(solver, PipelineSolver):
        return min_cost_by_stages(solver, out_of_time, incumbent)
    return _min_cost(solver, out_of_time, incumbent)


def max_throughput(
    solver: StepSolver, out_of_time: Callable[[], bool] = lambda: False, at_least: float = 0.0
) -> tuple[Candidate | None, float]:
    """The fastest plan within the limits and a proven upper bound on its throughput; a pipelined
    solver's one stage count at a time (:func:`max_throughput_by_stages`)."""
    if isinstance(solver, PipelineSolver):
        return max_throughput_by_stages(solver, out_of_time, at_least)
    return _max_throughput(solver, out_of_time, at_least)


def _min_cost(
    solver: StepSolver, out_of_time: Callable[[], bool] = lambda: False, incumbent: Candidate | None = None
) -> tuple[Candidate | None, float]:
    """The cheapest plan, and a proven lower bound on the optimum's cost: the plan's own cost
    when the walk finished, less when ``out_of_time()`` stopped it first.

    A coarse scan first (targets at least 2% apart) finds a plan close to the best, so that the
    walk's skip rule, which grows with how far a step's plan is from the best, takes long jumps.
    With an ``incumbent`` (a plan found elsewhere), only plans that beat it are looked for, and
    it is returned itself when none does.
    """
    floor = throughput_floor(solver.p)
    best, end, late = _walk(solver, floor, math.inf, incumbent, 1.02, 4, out_of_time)
    if best is None:
        return None, math.inf
    if late:  # the scan jumped: only what lies above the floor is bounded
        return best, min(best.cost, solver.lower_bound(floor))
    if best.cost <= 0:
        return best, 0.0  # free: nothing is cheaper
    best, stop, late = _walk(solver, floor, end, best, 1.0, 8, out_of_time)
    assert best is not None, "the walk starts from the scan's plan and only replaces it"
    if late:  # every step below where it stopped was walked (or skipped as unable to win)
        return best, min(best.cost, solver.lower_bound(stop))
    return best, best.cost


def _walk(
    solver: StepSolver,
    target: float,
    end: float,
    best: Candidate | None,
    stride: float,
    far: int,
    out_of_time: Callable[[], bool],
) -> tuple[Candidate | None, float, bool]:
    """Walk the right ends of the price-rate steps from ``target`` while below ``end``, each
    next target at least ``stride`` times the last; (best plan, the last target, out of time).

    It stops early where nothing from the target on can beat the best: no plan reaches the
    target, or the lower bound there reaches the best cost. The bound only rises with the
    target, so checking it less often only delays the stop: once in ``far`` steps while it is
    below 90% of the best cost (on 1,000 layers that halves the walk's DPs).
    """
    since, every = 0, 1  # cheapest-plan steps since the bound was last checked; check every `every`
    while target < end:
        cand = solver.cheapest(target)
        if cand is None:
            return best, target, False
        if best is None or cand.cost < best.cost or (cand.cost == best.cost and cand.throughput > best.throughput):
            best = cand
        if out_of_time():
            return best, target, True
        if best.cost <= 0:
            return best, target, False
        since += 1
        if since >= every:
            since, bound = 0, solver.lower_bound(target)
            if bound >= best.cost * (1 - SLACK):
                return best, target, False
            every = 1 if bound >= 0.9 * best.cost else far
        # cand's price rate is the least any plan this fast can have, so a plan with
        # throughput X costs at least W * rate / X: below the skip point none can win.
        skip = cand.cost * cand.throughput / best.cost * (1 - SLACK)
        target = max(float(np.nextafter(cand.throughput, np.inf)), target * stride, skip)
    return best, target, False


def _max_throughput(
    solver: StepSolver, out_of_time: Callable[[], bool] = lambda: False, at_least: float = 0.0
) -> tuple[Candidate | None, float]:
    """Fastest plan within the limits (cheapest among the fastest), ignoring max_cost, and a
    proven upper bound on the fastest throughput: the plan's own when the search finished.
    ``at_least``: only a plan at least that fast is wanted (None when there is none)."""
    lo = solver.reaching(at_least) if at_least > 0 else solver.cheapest(0.0)
    if lo is None:
        return None, 0.0
    return bisect(solver, lo, out_of_time)


def bisect(
    solver: StepSolver, lo: Candidate, out_of_time: Callable[[], bool], hi: float | None = None
) -> tuple[Candidate, float]:
    """From ``lo``, a plan within the limits: bisect for the largest reachable throughput, then the
    cheapest of the fastest plans, and the proven upper bound (``hi``: one known already)."""
    hi = solver.speed_bound() if hi is None else hi
    floor = lo.throughput
    # After a "no", the first throughput above the floor is asked once: when no plan reaches it,
    # the floor is the fastest, and the bisection need not close in on it from above.
    ceiling, probed, said_no = math.inf, None, False
    while hi > floor * (1 + 1e-7):
        if out_of_time():  # the best plan known to exist, at least as fast as required
            return solver.cheapest(max(floor, throughput_floor(solver.p))) or lo, hi
        if said_no and probed != floor:
            probed = floor
            found = solver.reaching(float(np.nextafter(floor, np.inf)))
            if found is None:
                ceiling = floor
                break
            floor, said_no = min(found.throughput, hi), False
            continue
        mid = float(np.sqrt(floor * hi))
        found = solver.reaching(mid)
        if found is None:
            hi, said_no = mid, True
        else:  # the plan that proves it may reach beyond mid
            floor, said_no = max(mid, min(found.throughput, hi)), False
    # Exact finish: the cheapest plan at the bracket's floor, then jump past each
    # plan's own throughput while some plan still reaches it.
    best = solver.cheapest(floor) or lo
    while best.throughput < ceiling and (cand := solver.cheapest(float(np.nextafter(best.throughput, np.inf)))):
        best = cand
        if out_of_time():
            return best, hi
    return best, best.throughput


def max_throughput_within_budget(
    solver: StepSolver, out_of_time: Callable[[], bool] = lambda: False
) -> tuple[Candidate | None, float]:
    """The fastest plan within max_cost, and an upper bound on the fastest throughput."""
    best, target, budget = None, 0.0, solver.p.max_cost
    if isinstance(solver, PipelineSolver):  # its targets only rise: the units bound may skip stage counts
        solver.left = CountsLeft(solver.p)
    assert budget is not None, "a budget search needs max_cost"
    while (cand := solver.cheapest(target)) is not None:
        if cand.cost <= budget * (1 + SLACK):
            if best is None or cand.throughput > best.throughput:
                best = cand
        target = float(np.nextafter(cand.throughput, np.inf))
        if best is not None and out_of_time():
            return best, solver.speed_bound()
    return best, best.throughput if best is not None else 0.0


def min_cost_by_stages(
    solver: PipelineSolver, out_of_time: Callable[[], bool] = lambda: False, incumbent: Candidate | None = None
) -> tuple[Candidate | None, float]:
    """:func:`min_cost` one stage count at a time (the docstring of :mod:`.pipeline`).

    For each ``S``, the cheapest plan of the relaxation :meth:`PipelineSolver.at_least` comes first: no plan of
    ``S`` stages or more costs less. When that plan is itself within every limit and memory and
    no dearer in its real figures, it beats every plan of ``S`` stages or more, and the search
    ends; when it does not beat the best plan so far, neither does any of them. Otherwise grid
    ``S`` is walked exactly, pruned by the best plan so far."""
    floor = throughput_floor(solver.p)
    best = incumbent

    def keep(found: Candidate) -> None:
        nonlocal best
        if best is None or (found.cost, -found.throughput) < (best.cost, -best.throughput):
            best = found

    bound = 0.0  # on every plan of S stages or more: nothing yet
    left = CountsLeft(solver.p)
    for n, S in enumerate(solver.stage_counts(floor)):
        if n and out_of_time():  # before grid S's tables, which take seconds to build on thousands of layers
            return best, (min(best.cost, bound) if best is not None else math.inf)
        if not left.may(S, floor):
            continue  # the units bound: no plan of S stages reaches the floor (or fits)
        relaxed = solver.at_least(S)
        least, bound = _min_cost(relaxed, out_of_time, incumbent=best)
        if least is None or least is best:
            break  # none of S stages or more reaches the floor, or beats the best
        witness, real = scored(solver.p, relaxed, least)
        if bound < least.cost * (1 - SLACK):  # out of time: the relaxation's plan, where it is one, unproven
            if real and witness.throughput >= floor:
                keep(witness)
            return best, (min(best.cost, bound) if best is not None else math.inf)
        if real and witness.cost <= least.cost and witness.throughput >= least.throughput:
            keep(witness)
            break
        try:
            sub = walking(solver, S)
        except TooLarge as exc:  # grid S does not fit: the best of fewer stages, its gap by the relaxation's
            if best is None:
                raise
            solver.refused = exc.message
            return best, min(best.cost, bound)
        found, proven = _min_cost(sub, out_of_time, incumbent=best)
        if found is not None and found is not best:
            keep(true_candidate(solver.p, sub, found))
        solver.drop(S)
        # Out of time inside grid S (the plan's real figures may differ from the grid's in the last bit).
        if best is not None and proven < best.cost * (1 - SLACK):
            rest = solver.at_least(S + 1).lower_bound(floor) if S < solver.most else math.inf
            return best, min(best.cost, proven, rest)
    return best, (best.cost if best is not None else math.inf)


def max_throughput_by_stages(
    solver: PipelineSolver, out_of_time: Callable[[], bool] = lambda: False, at_least: float = 0.0
) -> tuple[Candidate | None, float]:
    """:func:`max_throughput` one stage count at a time (the docstring of :mod:`.pipeline`): grid
    ``S`` is only searched for plans at least as fast as the best of the grids before it (and
    as ``at_least``); a finished search's answer is kept (an infeasible throughput asks it again
    for its message)."""
    if solver.fastest is not None:
        found = solver.fastest[0]
        return solver.fastest if found is None or found.throughput >= at_least else (None, 0.0)
    best: Candidate | None = None
    left = CountsLeft(solver.p)
    for n, S in enumerate(solver.of_shape(range(1, solver.most + 1))):
        target = at_least if best is None else best.throughput
        if not solver.at_least(S).reachable(target):
            break  # none of S stages or more is as fast
        if n and out_of_time():  # before grid S's tables (None: no plan found in time)
            return best, (max(best.throughput, solver.slot_bound(S)) if best is not None else 0.0)
        if not left.may(S, target):
            continue  # the units bound: no plan of S stages is as fast
        try:
            sub = walking(solver, S)
        except TooLarge as exc:  # grid S does not fit: the best of fewer stages, none of S or more faster than
            if best is None:  # its slots allow
                raise
            solver.refused = exc.message
            return best, max(best.throughput, solver.slot_bound(S))
        lo = sub.reaching(target)  # the bisection's exact finish finds the cheapest of a tie
        if lo is not None:
            found, hi = bisect(sub, lo, out_of_time, solver.slot_bound(S))
            found = true_candidate(solver.p, sub, found)
            if best is None or (-found.throughput, found.cost) < (-best.throughput, best.cost):
                best = found
            if out_of_time():
                solver.drop(S)
                return best, max(best.throughput, hi, solver.slot_bound(S + 1))
        solver.drop(S)
    if at_least > 0:  # not the fastest of all when none reaches at_least: not kept
        return best, (best.throughput if best is not None else 0.0)
    solver.fastest = best, (best.throughput if best is not None else 0.0)
    return solver.fastest
