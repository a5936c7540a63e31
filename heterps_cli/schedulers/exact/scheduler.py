"""The exact optimum over all schedules and replica counts (``--scheduler exact``, docs/exact.md).

:func:`solve` runs :mod:`.walks` over :mod:`.step`'s solver (under a pipeline schedule, :mod:`.pipeline`'s) for
the objective, and says how far from proven it stopped; :func:`diagnose` and
:func:`infeasible_error` explain a problem that has no plan, with the best figure reachable.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np

import heterps_cli.schedulers.exact.walks as walks
from heterps_cli.bounds import within
from heterps_cli.costmodel import meets_targets, throughput_floor
from heterps_cli.errors import InfeasibleError, SearchGaveUp, TooLarge, Unexplained
from heterps_cli.figures import count, number, usd
from heterps_cli.objective import Objective
from heterps_cli.plan import Plan, make_plan
from heterps_cli.problem import Problem
from heterps_cli.schedulers.base import Clock, ExactOptions, Progress, SolveOptions
from heterps_cli.schedulers.exact.kernel import MAX_STATE_CELLS, Candidate
from heterps_cli.schedulers.exact.pipeline import solver_for
from heterps_cli.schedulers.exact.reach import more_units
from heterps_cli.schedulers.exact.rented import solve as solve_rented
from heterps_cli.schedulers.exact.step import StepSolver, schedule_of
from heterps_cli.schedulers.exact.terms import too_large


def infeasible_error(problem: Problem, solver: StepSolver) -> InfeasibleError:
    """Explain why no plan meets the constraints, with the best figure that can be reached."""
    fastest, _ = walks.max_throughput(solver)
    if fastest is None:
        blocked = _memory_blocked(problem)
        if blocked is not None:
            return InfeasibleError(blocked)
        return InfeasibleError(_nothing_fits(problem))
    if fastest.throughput < throughput_floor(problem):
        cap, why = serial_cap(problem)
        if cap < throughput_floor(problem):
            fix = f"{why}. No number of units changes that: lower the required throughput (--min-throughput)"
        else:
            fix = more_units(problem)
        return InfeasibleError(
            f"no plan reaches the required {count(problem.min_throughput, 1)} samples/s within the limits "
            f"({_limits(problem)}); the fastest possible plan reaches {count(fastest.throughput, 1)} samples/s "
            f"(costing {usd(fastest.cost)}). {fix}."
        )
    cheapest, _ = walks.min_cost(solver_for(problem.replace(objective=Objective.COST, max_cost=None), None))
    assert cheapest is not None, "the fastest plan meets the throughput, so a cheapest one exists"
    assert problem.max_cost is not None, "within the limits and the throughput, only the budget can rule a plan out"
    return InfeasibleError(
        f"no plan costs at most {usd(problem.max_cost)}: the cheapest plan that reaches "
        f"{count(problem.min_throughput, 1)} samples/s costs {usd(cheapest.cost)} "
        f"({count(cheapest.throughput, 1)} samples/s). Raise the budget (--max-cost)."
    )


def _nothing_fits(problem: Problem) -> str:
    """Why no plan fits within the limits at all: memory (every plan the limits allow has a replica over
    its unit's memory, which the same problem without memory would not), or the limits themselves."""
    limits = f"the limits ({_limits(problem)})"

    def fits(p: Problem) -> bool:
        loose = p.replace(objective=Objective.TIME, min_throughput=0.0, max_cost=None)
        return solver_for(loose, None).reachable(0.0)  # any plan at all: the first stage count with one

    if np.isfinite(problem.memory).any() and fits(
        problem.replace(memory=np.full(problem.n_types, np.inf), reserved=None)
    ):
        lift = "more units, more memory per unit, or a smaller batch_size (fewer activations per replica)"
        if problem.maximal_stages and fits(problem.replace(maximal_stages=False)):
            lift = "drop --maximal-stages (a plan exists when neighbouring stages may share a type), " + lift
        return (
            f"memory: within {limits} every plan has a replica that holds more than its unit's memory_gb "
            f"(training state and activations, docs/spec.md section 1b). Lift it with {lift}"
        )
    return f"no plan fits the cluster's limits even with one replica per stage: {limits} are too small for this model"


def serial_cap(problem: Problem) -> tuple[float, str]:
    """The throughput no plan passes on any number of units, and why: the layer whose serial part
    (compute ``oct (1 - alpha)`` or gradient synchronisation ``odt (1 - beta)``, which replicas do
    not divide) is the largest even on its best type, alone in a stage. Sections 1 and 1b only (inf
    under section 1d, whose all-reduce grows with replicas)."""
    if problem.pipelined:
        return math.inf, ""
    serial_c, _, serial_d, _ = problem.parts
    serial = np.where(problem.usable, np.maximum(serial_c, serial_d), np.inf)
    best_t = np.argmin(serial, axis=1)
    per_layer = serial[np.arange(problem.n_layers), best_t]
    layer = int(np.argmax(per_layer))
    t = int(best_t[layer])
    if not per_layer[layer] > 0:
        return math.inf, ""
    sync = serial_d[layer, t] >= serial_c[layer, t]
    term = (
        f"gradient synchronisation, odt x (1 - beta) = {serial_d[layer, t]:.3g} s"
        if sync
        else f"serial compute, oct x (1 - alpha) = {serial_c[layer, t]:.3g} s"
    )
    cap = problem.batch_size / float(per_layer[layer])
    return cap, (
        f"Layer {problem.layer_names[layer]} caps every plan at {count(cap, 1)} samples/s: its {term} per batch "
        f"of {problem.batch_size:,} on {problem.types[t]}, its fastest type, does not shrink with replicas"
    )


def _memory_blocked(problem: Problem) -> str | None:
    """Why memory alone rules a plan out: the first layer no type can hold even alone on all its
    units (section 1b), with what it needs per replica where it comes closest; None if every layer fits."""
    if not np.isfinite(problem.memory).any():
        return None
    fixed, split = problem.memory_parts
    limits = problem.limits.astype(float)
    for layer in np.flatnonzero(~problem.fits_alone.any(axis=1)):
        # per replica on every unit of each type, and no more replicas than samples (section 1f)
        need = fixed[layer] + split[layer] / np.minimum(limits, problem.batch_size)
        ratio = np.where(problem.runnable[layer], need / problem.memory, np.inf)
        t = int(np.argmin(ratio))
        largest = float(np.max(np.where(np.isfinite(problem.memory), problem.memory, 0.0)))
        name = problem.layer_names[layer]
        if not np.isfinite(need[t]):
            return (
                f"layer {name} needs more memory than a float can count (state_factor x weight_size and "
                "batch_size x activation_size overflow): give its real sizes"
            )
        shard = "" if problem.sharded[layer] else "mark it `sharded: true`, "
        return (
            f"layer {name} needs {need[t] / 1e9:,.3g} GB per replica on {problem.types[t]} "
            f"(memory {number(problem.memory[t] / 1e9)} GB) even on all {int(limits[t]):,} units; the largest memory "
            f"on offer is {number(largest / 1e9)} GB: {shard}add memory, or allow more replicas"
        )
    return None


def diagnose(problem: Problem, failure: str, hint: str, time_limit: float | None = None) -> InfeasibleError:
    """The error for a heuristic that found no feasible plan: the true reason if there is none,
    else the heuristic's failure, the optimum it missed and ``hint`` (what to try in it; where the
    exact solver can run, the message points to it too). The exact
    search gets ``time_limit`` seconds (None: all it needs; 0 or less: none, and the error says so)."""
    out_of_time = time_limit is not None and time_limit <= 0
    if too_large(problem):  # only the heuristic's own words
        return SearchGaveUp(f"{failure}{' within the time limit' if out_of_time else ''}: {hint}")
    if out_of_time:
        return SearchGaveUp(
            f"{failure} within the time limit: {hint}; --scheduler exact says whether a feasible plan exists"
        )
    try:
        found = solve(problem, options=SolveOptions(time_limit=time_limit))
    except InfeasibleError as exc:
        return exc
    except TooLarge:  # the binding limits need more states than the solver may hold
        return SearchGaveUp(f"{failure}: {hint}")
    return SearchGaveUp(
        f"{failure}, but a feasible plan exists (the exact solver finds one costing {usd(found.cost_usd)} "
        f"at {count(found.throughput, 1)} samples/s): {hint}, or use --scheduler exact"
    )


def _limits(problem: Problem) -> str:
    return ", ".join(f"{t} <= {n}" for t, n in zip(problem.types, problem.limits))


def solve(
    problem: Problem, *, seed: int = 0, progress: Progress | None = None, options: SolveOptions | None = None
) -> Plan:
    """The provably cheapest (``cost``) or fastest (``time``) plan; raises InfeasibleError if none.

    With ``options.time_limit``, a search that has not finished by then returns its best plan
    with ``optimal: false`` and the proven ``gap`` to the optimum (cost / lower bound - 1, or
    1 - throughput / upper bound) instead of running on.
    """
    if problem.nodes is not None:
        return solve_rented(problem, seed=seed, progress=progress, options=options)
    start = time.perf_counter()
    clock = Clock.of(options, start)
    out_of_time = _Stopping(clock.paced())
    solver = solver_for(problem, progress)
    if problem.objective is Objective.COST:
        best, bound = walks.min_cost(solver, out_of_time)
        if best is not None and not meets_targets(problem, best.throughput, best.cost):
            best = None
    elif isinstance(options, ExactOptions) and options.at_least > 0 and problem.max_cost is None:
        best, bound = walks.max_throughput(solver, out_of_time, at_least=options.at_least)
        if best is None:
            raise InfeasibleError(f"no plan reaches {count(options.at_least, 1)} samples/s")
        if best.throughput < throughput_floor(problem):
            best = None
    else:
        search = walks.max_throughput if problem.max_cost is None else walks.max_throughput_within_budget
        best, bound = search(solver, out_of_time)
        if best is not None and best.throughput < throughput_floor(problem):
            best = None
    if best is None and (out_of_time.said or clock.out_of_time()):  # no proof that none exists: nor why
        raise SearchGaveUp(_none_in_time(clock))
    if best is None and options is not None and not options.explain:
        raise Unexplained(f"no plan at micro-batch {problem.batch_size:,} meets the job (the exact search)")
    if best is None:
        raise infeasible_error(problem, solver)
    shared = clock.whole is not None  # the user's limit shared out over the micro-batches
    share = f" ({clock.limit or 0:.3g} s of it at micro-batch {problem.batch_size:,})" if shared else ""
    why = f"exact stopped at the --time-limit of {clock.named:g} s{share} before proving this plan optimal"
    if (refused := getattr(solver, "refused", None)) is not None:  # a stage count's grid did not fit
        why = f"exact searched every plan of fewer stages, but {refused.split(';')[0]}"
    if not best.within:
        best, why = _within_every_limit(problem, solver)
    gap, words = within(problem.objective, best.cost, best.throughput, bound)
    proved = bool(gap <= 1e-12)
    notes: tuple[str, ...] = () if proved else (f"{why}: {words}",)
    plan = make_plan(
        problem,
        schedule_of(problem, best.stages),
        best.replicas,
        scheduler="exact",
        seed=seed,
        solve_s=time.perf_counter() - start,
        optimal=proved,
        notes=notes,
    )
    assert plan.feasible, "the exact solver produced a plan that breaks a constraint"
    return plan if proved else plan.but(gap=gap)


class _Stopping:
    """A search's ``out_of_time`` that remembers whether it ever said so: a search it stopped short of finding
    a plan proves nothing, even where the limit itself has not yet passed (the clock is paced)."""

    def __init__(self, paced: Callable[[], bool]) -> None:
        self.paced, self.said = paced, False

    def __call__(self) -> bool:
        now = self.paced()
        self.said = self.said or now
        return now


def _none_in_time(clock: Clock) -> str:
    """Why exact answers nothing: its time ran out before it found a plan (none is proven not to exist)."""
    return (
        f"exact found no plan before the --time-limit of {clock.named:g} s ran out: give "
        "it more time to find one or to prove that none exists, or use --scheduler greedy or rl"
    )


def _within_every_limit(problem: Problem, solver: StepSolver) -> tuple[Candidate, str]:
    """When the search ran on relaxed limits its best is a bound: the plan is then the best found
    within every limit, and the note says why it is not proven optimal."""
    best = solver.cheapest_found if problem.objective is Objective.COST else solver.fastest_found
    names = ", ".join(problem.types[t] for t in sorted(solver.relaxed))
    if best is None:
        raise TooLarge(
            "exact scheduler",
            f"honouring the limits of {names} needs more than {MAX_STATE_CELLS:,} states, and no plan "
            "within every limit was found without them; use --scheduler rl or genetic, or lower the limits",
        )
    why = (
        f"exact relaxed the limits of {names} (honouring them needs more than {MAX_STATE_CELLS:,} states), "
        "so it could not prove this plan optimal"
    )
    return best, why


def what_if(problem: Problem, plan: Plan, search: Callable[[Problem], Plan] | None = None) -> list[dict]:
    """``plan --explain`` on a cluster priced per unit: for each type, the optimum (the problem's
    objective, by this solver) with its limit one higher and one lower: ``{"kind", "change", "limit",
    "throughput", "cost_usd", "meets"}``, throughput and cost None where no plan meets the job then.
    ``search``: the plan's own search there, in place of this solver's (section 1i mixes types)."""
    out = []
    for t, name in enumerate(problem.types):
        for change in (1, -1):
            limits = problem.limits.copy()
            limits[t] += change
            if limits[t] < 1:
                continue
            there = problem.replace(limits=limits)
            try:
                best = (search or solve)(there)
            except (InfeasibleError, TooLarge):
                best = None
            out.append(
                {
                    "kind": name,
                    "change": change,
                    "limit": int(limits[t]),
                    "throughput": None if best is None else best.throughput,
                    "cost_usd": None if best is None else best.cost_usd,
                    "meets": best is not None and bool(best.feasible),
                }
            )
    return out
