"""Schedulers: each maps a :class:`~heterps_cli.problem.Problem` to a :class:`~heterps_cli.plan.Plan`.

They share one signature (:class:`~heterps_cli.schedulers.base.Solver`), so a
command can run any of them, or all of them in a loop. A scheduler that finds
no feasible plan raises :class:`~heterps_cli.errors.InfeasibleError`; when a
search fails, :func:`solve` asks the exact solver whether a plan exists at all.
"""

from __future__ import annotations

import dataclasses
import importlib
import time
from typing import TYPE_CHECKING

from heterps_cli.errors import InfeasibleError, SearchFailed, SearchGaveUp
from heterps_cli.objective import Objective
from heterps_cli.schedulers.base import (
    Budget,
    Clock,
    Progress,
    RLOptions,
    SearchOptions,
    SolveOptions,
    Solver,
    TrainingOptions,
    options_for,
)
from heterps_cli.schedulers.names import SCHEDULERS

if TYPE_CHECKING:
    from collections.abc import Callable

    from heterps_cli.plan import Plan
    from heterps_cli.problem import Problem

__all__ = [
    "SCHEDULERS",
    "Budget",
    "Progress",
    "RLOptions",
    "SearchOptions",
    "SolveOptions",
    "Solver",
    "TrainingOptions",
    "options_for",
    "solve",
    "solver",
    "with_what_if",
]


def solver(name: str) -> Solver:
    """The ``solve`` of the scheduler called ``name`` (its module is imported now, not before)."""
    return importlib.import_module(f"heterps_cli.schedulers.{SCHEDULERS[name][0]}").solve


def solve(
    name: str, problem: Problem, *, seed: int = 0, progress: Progress | None = None, options: SolveOptions | None = None
) -> Plan:
    """The plan scheduler ``name`` finds; when a search finds none, the exact solver says why
    (no plan exists, or one does and the error names it). Where the plan chooses its micro-batch
    (docs/spec.md section 1f), the best of the plans it finds at each choice. Mixed stages (section 1i) as
    ``options.mixed_stages`` says: None offers them where :func:`~.mixing.offered` does, and says why not
    where the problem could mix (in the plan's notes, or in the error where no plan meets the job)."""
    options, unoffered = _mixing(problem, options or SolveOptions())
    if unoffered is None:
        return _solve(name, problem, seed, progress, options)
    said = f"mixed stages not offered: {unoffered} (--mixed-stages offers them, with the linear bound's gap)"
    try:
        plan = _solve(name, problem, seed, progress, options)
    except InfeasibleError as exc:  # SearchGaveUp too; not its subclasses that carry more than a message
        if type(exc) not in (SearchGaveUp, InfeasibleError) or not _mixing_may_meet(problem):
            raise
        raise type(exc)(f"{exc} Mixed stages were not offered ({unoffered}): --mixed-stages may meet it.") from None
    return plan.but(notes=[*plan.notes, said])


def _mixing_may_meet(problem: Problem) -> bool:
    """Whether a plan over mixed stages may meet the job's floor: the units bound, which holds for them too,
    does not rule it out at every micro-batch (a budget it cannot tell)."""
    from heterps_cli.units_bound import units_short

    floor = problem.min_throughput
    return not floor or any(units_short(problem.at_micro_batch(b), floor) is None for b in problem.micro_batch_choices)


def _solve(name: str, problem: Problem, seed: int, progress: Progress | None, options: SolveOptions) -> Plan:
    """:func:`solve`, mixed stages decided."""
    choices = problem.micro_batch_choices
    mixing, guard, optimum = bool(options.mixed_stages), None, None
    if name != "exact" and options.time_limit is None:  # exact refuses what it cannot finish
        if name in ("rl", "tapp") and getattr(options, "steps", None) is None:
            optimum = _proven_optimum(problem, seed, mixing)
        options, guard = _default_budget(name, problem, options)
        if optimum is not None and isinstance(options, TrainingOptions):  # it stops where its plan meets it
            options = dataclasses.replace(options, stop_at=problem.objective.key_of(optimum))
    if mixing and name == "exact" and (found := _exact_mixed(problem, options, seed)) is not None:
        return found

    def one(sub: Problem, opts: SolveOptions, report: Progress | None) -> Plan:
        try:
            plan = _solve_at(name, sub, seed, report, opts)
        except InfeasibleError:
            if not mixing or (rescued := _rescued(name, sub, seed, opts)) is None:
                raise
            return rescued
        return _joined(sub, plan, Clock.of(opts, time.perf_counter())) if mixing else plan

    if len(choices) == 1:
        plan = one(problem.at_micro_batch(choices[0]), options, progress)
    else:
        from heterps_cli.schedulers.micro_batch import best_micro_batch

        # with mixed stages a micro-batch whose one-type plans are slower may mix faster: every one is asked
        exact = name == "exact" and not mixing
        plan = best_micro_batch(problem, choices, one, progress, options, exact=exact, optimum=optimum)
    if mixing:  # the certificate's time is the solve's too
        began = time.perf_counter()
        clock = Clock.of(options, began)
        held = name == "exact"
        plan = _held_back(problem, plan, clock) if held else _mixed_certificate(problem, plan, clock.out_of_time)
        plan = plan.but(solve_s=plan.solve_s + time.perf_counter() - began)
    if optimum is not None:
        plan = _met(problem, plan, optimum)
    return _said_guard(plan, problem, guard)


def _mixing(problem: Problem, options: SolveOptions) -> tuple[SolveOptions, str | None]:
    """``options`` with ``mixed_stages`` decided: where it is None (the command line's default), offered
    where :func:`~.mixing.offered` says so; and why not, where the problem could mix but they are not."""
    if options.mixed_stages is not None:
        return options, None
    from heterps_cli.schedulers.mixing import offered

    offer, why = offered(problem)
    return dataclasses.replace(options, mixed_stages=offer), why


# The exact solver proves the optimum first for rl's and tapp's default training where its largest grid
# holds at most this many cells: a count, not seconds, so that the plan is the same on any machine. A
# 34-layer, 4-type chain at 4 micro-batches (166,600 cells) took 3.4 s to prove, its rl 23.6 s in all
# (docs/schedulers/rl.md).
PROVEN_CELLS = 2_000_000


def _proven_optimum(problem: Problem, seed: int, mixing: bool) -> Plan | None:
    """The exact solver's plan where that is cheap (:data:`PROVEN_CELLS`) and proven: optimal, or with mixed
    stages offered within its certificate's gap; None elsewhere."""
    from heterps_cli.errors import TooLarge
    from heterps_cli.schedulers.exact.terms import grid_cells

    if grid_cells(problem) > PROVEN_CELLS:
        return None
    try:
        found = solve("exact", problem, seed=seed, options=SolveOptions(mixed_stages=mixing))
    except (InfeasibleError, TooLarge):
        return None
    return found if found.feasible and (found.optimal or (mixing and found.gap is not None)) else None


def _met(problem: Problem, plan: Plan, optimum: Plan) -> Plan:
    """``plan`` proven as the exact solver's plan is (optimal, or within its gap) where it meets it; else
    said how far it is."""
    from heterps_cli.objective import meets
    from heterps_cli.schedulers.micro_batch import proven_words

    objective = problem.objective
    if plan.feasible and meets(objective.key_of(plan), objective.key_of(optimum)):
        said = f"it meets {proven_words(optimum)} (docs/schedulers/rl.md)"
        said = f"proven optimal: {said}" if optimum.optimal else said
        proof = {"optimal": True} if optimum.optimal else {"optimal": False, "gap": optimum.gap}
        return plan.but(**proof, notes=[*plan.notes, said], solve_s=plan.solve_s + optimum.solve_s)
    figure, best = (objective.figure(p.cost_usd, p.throughput) for p in (plan, optimum))
    shown = objective.shown(optimum.cost_usd, optimum.throughput)
    said = f"{100 * objective.gap(figure, best):.2f}% from {proven_words(optimum)} ({shown})"
    return plan.but(notes=[*plan.notes, said], solve_s=plan.solve_s + optimum.solve_s)


def _joined(problem: Problem, plan: Plan, clock: Clock) -> Plan:
    """Section 1i: ``plan`` with replicas of other types joining its stages where that is faster."""
    from heterps_cli.schedulers.mixing import mix

    mixed, said = mix(problem, plan, clock)
    return mixed.but(notes=[*mixed.notes, said]) if mixed is not plan else plan


def _rescued(name: str, problem: Problem, seed: int, options: SolveOptions) -> Plan | None:
    """Section 1i where no plan of one-type stages meets the job (the problem at one micro-batch): the
    scheduler's fastest one-type plan, with replicas of other types joined as the climb joins them, if
    that meets it (then, under objective cost, climbed cheaper); None where it does not."""
    from heterps_cli.mixed import joined_of
    from heterps_cli.plan import make_plan
    from heterps_cli.schedulers.mixing import can_mix, mix
    from heterps_cli.stages import schedule_of_stages

    if can_mix(problem) is not None:
        return None
    if problem.objective is Objective.TIME and not problem.min_throughput and problem.max_cost is None:
        return None  # the search that failed was this one: no one-type plan at all, none to join
    free = problem.replace(objective=Objective.TIME, min_throughput=0.0, max_cost=None)
    clock = Clock.of(options, time.perf_counter())
    try:
        fastest, _ = mix(free, _solve_at(name, free, seed, None, options), clock)
    except InfeasibleError:
        return None
    if not fastest.mixes:
        return None
    schedule = schedule_of_stages(problem, fastest.stages)
    k = [s.replicas for s in fastest.stages]
    plan = make_plan(
        problem, schedule, k, scheduler=fastest.scheduler, seed=seed, joined=joined_of(problem, fastest.stages)
    )
    if not plan.feasible:
        return None
    said = "no plan of one-type stages meets the job; the fastest, with replicas of other types joined, does"
    if problem.objective is Objective.COST:
        plan, _ = mix(problem, plan, clock)
    return plan.but(notes=[*plan.notes, f"mixed stages: {said} (section 1i)"], solve_s=fastest.solve_s)


def _exact_mixed(problem: Problem, options: SolveOptions, seed: int) -> Plan | None:
    """Section 1i's exact optimum (:mod:`~heterps_cli.schedulers.mixed_optimum`); None where its DP does not
    run, runs out of time, or finds no plan (the one-type search then answers, or says why none exists)."""
    from heterps_cli.schedulers.mixed_optimum import best_of, finals, why_none, why_not
    from heterps_cli.schedulers.mixing import can_mix, joined_words

    if can_mix(problem) is not None or why_not(problem) is not None:
        return None
    start = time.perf_counter()
    cells = finals(problem, Clock.of(options, start))
    if cells is None:
        return None
    found = best_of(problem, cells, "exact", seed)
    if found is None:  # the one-type search says why where no plan runs at all
        said = why_none(problem, cells)
        if said is None:
            return None
        raise InfeasibleError(said)
    at = problem.at_micro_batch(found.batch_size)
    notes = [joined_words(at, s) + " (section 1i)" for s in found.stages if s.joined]
    if len(choices := problem.micro_batch_choices) > 1:
        sizes = ", ".join(map(str, choices))
        notes.append(f"micro-batch {found.batch_size} chosen: the DP searched every size the plan may take ({sizes})")
    if not found.mixes:
        notes.append("mixed stages: no stage is better by the objective with replicas of another type joining it")
    else:
        notes.append(_against_one_type(problem, found, dataclasses.replace(options, mixed_stages=False), seed))
    notes.append("mixed stages: optimal over mixed and one-type stages (a DP over every type's units, docs/exact.md)")
    return found.but(solve_s=time.perf_counter() - start, notes=[*found.notes, *notes])


def _against_one_type(problem: Problem, plan: Plan, options: SolveOptions, seed: int) -> str:
    """Why the exact plan mixes: what the best plan of one-type stages reaches, beside it."""
    from heterps_cli.figures import count, usd

    try:
        one = solve("exact", problem, seed=seed, options=options)
    except InfeasibleError:
        return "mixed stages: no plan of one-type stages meets the job; mixing does"
    if problem.objective is Objective.TIME:
        return (
            f"mixed stages: mixing reaches {count(plan.throughput, 1)} samples/s, the best plan of one-type stages "
            f"{count(one.throughput, 1)}"
        )
    return f"mixed stages: mixing costs {usd(plan.cost_usd)}, the best plan of one-type stages {usd(one.cost_usd)}"


def _held_back(problem: Problem, plan: Plan, clock: Clock) -> Plan:
    """The exact plan with mixed stages offered, its certificate over them: first the climb's other starts
    (:func:`~heterps_cli.schedulers.mixing.from_reserved`, the optimum with some units of a type held back),
    except where the certificate leaves no room for a plan better by more than its bisection's precision."""
    from heterps_cli.bounds import proven
    from heterps_cli.pace import BISECTION
    from heterps_cli.schedulers.mixed_optimum import why_not
    from heterps_cli.schedulers.mixing import can_mix, from_reserved

    late = clock.out_of_time
    if can_mix(problem) is not None:
        return _mixed_certificate(problem, plan, late)
    found = proven(problem, plan, late)
    if found is not None and found[0] <= BISECTION * (1 + 1e-6):  # the bisection stops within it
        said = f"no other starts climbed: no plan is more than {100 * BISECTION:g}% better (the certificate below)"
        plan = plan.but(notes=[*plan.notes, f"mixed stages: {said}"])
    else:
        climbed = from_reserved(problem, plan, clock)
        found = found if climbed is plan else None
        plan = climbed
    if (why := why_not(problem)) is not None:  # else that note says why
        plan = plan.but(notes=[*plan.notes, f"mixed stages: no exact search over mixed stages: {why}"])
    return _mixed_certificate(problem, plan, late, found)


def _mixed_certificate(
    problem: Problem, plan: Plan, late: Callable[[], bool], found: tuple[float, str] | None = None
) -> Plan:
    """What is proven of a plan in the space of mixed stages: the exact solver's certificate covers stages
    of one type, so the plan's gap is :func:`~heterps_cli.bounds.bound`'s (``found``: already known; a looser
    one once ``late()``, past the time limit); and why no stage mixes, where the problem cannot."""
    from heterps_cli.bounds import proven
    from heterps_cli.schedulers.mixing import can_mix

    notes = list(plan.notes)
    if (why := can_mix(problem)) is not None:
        return plan.but(notes=[*notes, f"--mixed-stages: {why}"])
    if not plan.mixes:
        notes.append("mixed stages: no stage is better by the objective with replicas of another type joining it")
    if plan.scheduler != "exact":
        return plan.but(notes=notes)
    if found is None and (found := proven(problem, plan, late)) is None:
        return plan.but(optimal=None, notes=notes)
    gap, words = found
    said = f"the exact solver proves its plans over stages of one type; with mixed stages, {words}"
    return plan.but(optimal=gap <= 1e-12, gap=None if gap <= 1e-12 else gap, notes=[*notes, said])


def _solve_at(name: str, problem: Problem, seed: int, progress: Progress | None, options: SolveOptions) -> Plan:
    """:func:`solve` at the problem's own micro-batch."""
    start = time.perf_counter()
    if name != "exact" and (proof := _none_fits(problem)) is not None:
        raise proof
    try:
        plan = solver(name)(problem, seed=seed, progress=progress, options=options)
    except SearchFailed as exc:
        from heterps_cli.schedulers.exact import diagnose

        # The explanation runs within what is left of the time limit, if there is one.
        raise diagnose(problem, exc.failure, exc.hint, time_limit=Clock.of(options, start).left()) from None
    if name != "exact":  # the search chose each layer's type; its runs' cuts into stages are exact
        from heterps_cli.schedulers.cuts import cut_exactly

        plan = cut_exactly(problem, plan, Clock.of(options, start).left())
    return plan


# A throughput every plan that fits reaches (samples/s): whether any plan fits is whether one reaches it.
ANY_PLAN = 1e-9
# Stage cells (terms.grid_cells) up to which that is asked: four times GPT-Neo's on 64 + 64 nodes with every
# degree and recomputation. Past it the tables take seconds and a GB to build (2,000 layers x 3 types).
SCREEN_CELLS = 2_000_000


def _none_fits(problem: Problem) -> InfeasibleError | None:
    """The exact solver's proof that no plan fits the problem's limits and memory, whatever its targets;
    None where one fits, or where its tables are large (:data:`SCREEN_CELLS`). A search there would train
    (rl: 20-30 s at each of 4 of 12 micro-batches of GPT-Neo on 8 + 8 nodes) only to fail, and this proof
    would then explain why. One question, :data:`ANY_PLAN`, on every unit the cluster has (on whole nodes,
    on each rental as fast as any other)."""
    from heterps_cli.errors import TooLarge
    from heterps_cli.schedulers.exact import solve as exact
    from heterps_cli.schedulers.exact.pipeline import solver_for
    from heterps_cli.schedulers.exact.rented import widest_rentals
    from heterps_cli.schedulers.exact.terms import grid_cells

    if grid_cells(problem) > SCREEN_CELLS:
        return None
    loose = problem.replace(objective=Objective.TIME, min_throughput=0.0, max_cost=None)
    asked = [loose] if loose.nodes is None else [q for c in widest_rentals(loose.nodes) for q in loose.on_rental(c)]
    try:
        if any(solver_for(q).reachable(ANY_PLAN) for q in asked):
            return None
        exact(loose)  # raises, saying why
    except InfeasibleError as exc:
        return exc
    except TooLarge:
        return None
    return None


def _default_budget(name: str, problem: Problem, options: SolveOptions) -> tuple[SolveOptions, float]:
    """``options`` with the default budget a search without --time-limit takes, a count of steps or
    evaluations at each micro-batch (:func:`.names.default_steps`), and the guard: seconds after which
    a search gone far past that budget stops anyway (the whole search's, not shared out)."""
    from heterps_cli.schedulers.base import OPTIONS, SearchOptions, TrainingOptions
    from heterps_cli.schedulers.names import default_batch, default_evaluations, default_steps

    kind = OPTIONS[name]
    if not isinstance(options, kind):  # another scheduler's options: the fields both have
        shared = [f.name for f in dataclasses.fields(kind) if hasattr(options, f.name)]
        options = kind(**{field: getattr(options, field) for field in shared})
    layers, choices = problem.n_layers, len(problem.micro_batch_choices)
    if isinstance(options, TrainingOptions) and options.steps is None:
        batch = options.batch if options.batch is not None else default_batch(layers)
        options = dataclasses.replace(options, steps=default_steps(layers, batch, choices))
    if isinstance(options, SearchOptions) and options.evaluations is None:
        options = dataclasses.replace(options, evaluations=default_evaluations(layers, choices))
    guard = guard_time_limit(layers)
    started = options.started if options.started is not None else time.perf_counter()
    return dataclasses.replace(options, time_limit=guard, started=started, guard=True), guard


def _said_guard(plan: Plan, problem: Problem, guard: float | None) -> Plan:
    """Where the guard stopped a search without --time-limit, the plan's notes say so."""
    if guard is None or not any("time limit" in note for note in plan.notes):
        return plan
    note = (
        f"the time limit was the guard for {problem.n_layers:,} layers, {GUARD_S:g} s + "
        f"{1000 * GUARD_PER_LAYER_S:g} ms a layer = {guard:,.0f} s, which a search without --time-limit "
        "reaches only far past its default budget; this plan depends on the machine's speed "
        "(--time-limit sets another limit, --steps or --evaluations a smaller budget)"
    )
    return plan.but(notes=[*plan.notes, note])


# Without --time-limit a search (every scheduler but exact) has a budget of steps or evaluations
# (names.default_steps), and this guard: a 50,000-layer model's rl never ended without one.
GUARD_S = 600.0
GUARD_PER_LAYER_S = 0.05


def guard_time_limit(n_layers: int) -> float:
    """Seconds a search without --time-limit may take at most (see :data:`GUARD_S`)."""
    return GUARD_S + GUARD_PER_LAYER_S * n_layers


def with_what_if(problem: Problem, plan: Plan) -> Plan:
    """The plan with its what-if (``plan --explain``): with nodes, one node more or fewer of each kind
    on the plan's rental (:func:`.rented.what_if`); without, the optimum with each type's limit one
    higher or lower (:func:`.exact.what_if`). Both at the plan's micro-batch (docs/spec.md section 1f)."""
    if problem.choose_micro_batch:
        problem = problem.at_micro_batch(plan.batch_size)
    if problem.nodes is not None and plan.mixes:  # section 1i on whole nodes
        from heterps_cli.schedulers.mixing import nodes_what_if as what_if
    elif problem.nodes is not None:
        from heterps_cli.schedulers.exact.rented import what_if
    elif plan.mixes:  # section 1i: the optimum over one-type stages, then mixed
        from heterps_cli.schedulers.mixing import what_if
    else:
        from heterps_cli.schedulers.exact import what_if

    from heterps_cli.formats import WhatIf

    return plan.but(what_if=[WhatIf.model_construct(**w) for w in what_if(problem, plan)])
