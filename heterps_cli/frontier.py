"""The exact cost–throughput frontier (``heterps frontier``): every plan no other plan beats on both.

A plan is on the frontier (Pareto-optimal) when every plan at least as fast
costs more. Each frontier plan is therefore the cheapest plan reaching its own
throughput, and every throughput between two frontier points costs at least the
higher one's cost.

**The walk.** Let ``rate(X)`` be the least price rate (USD per hour of all
units) of a plan whose every stage reaches ``X``: a non-decreasing step
function (:mod:`heterps_cli.schedulers.exact`). The exact solver's
``cheapest(X)`` returns a plan on the step that holds ``X``, with throughput
``y >= X``; the next step starts just above ``y``. Walking from the floor
(``--min-throughput``) to the fastest plan visits a plan of every step, and that
suffices: a frontier plan ``P`` of throughput ``y_P`` lies on some step
``[X_i, y_i]``, whose plan costs ``W rate(X_i) / y_i <= W rate(P) / y_P``, so it
is ``P`` or a plan as good. A last pass keeps the candidates no plan at least
as fast matches in cost, where throughputs within float noise are equal (a
repeated block puts one bottleneck at several places, and its sums there differ
in the last bits).

**Skipping dominated steps.** Most steps are dominated (a plan just after a
frontier point adds a replica and costs more than a plan further on). Probes
on a geometric grid of throughputs run ahead of the walk. After the walk's plan
(rate ``r``, throughput ``y``), any plan of throughput ``y'`` in ``(y, y_Q]``
has rate at least ``r``, so costs at least ``W r / y'``; a probe ``Q`` (cost
``c_Q``) is at least as fast and no dearer whenever ``y' <= min(y_Q, W r / c_Q)``.
The walk jumps there. Every plan it skips is matched by a probe, which is
itself a candidate, so the frontier stays exact.

**The knee.** Scale throughput and cost to [0, 1] between the cheapest and the
fastest plan; the knee is the plan farthest below the straight line joining
them (largest scaled throughput minus scaled cost, the "Kneedle" rule). Below
the knee each sample/s costs less than the curve's average, past it more. A
curve with fewer than three plans, or none below the line, has no knee.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

import numpy as np

from heterps_cli.costmodel import meets_targets, throughput_floor
from heterps_cli.errors import InfeasibleError, InputError
from heterps_cli.figures import count
from heterps_cli.formulas import SLACK, sample_hours
from heterps_cli.objective import Objective
from heterps_cli.plan import Plan, make_plan
from heterps_cli.problem import Problem
from heterps_cli.schedulers.base import Clock, Progress
from heterps_cli.schedulers.exact import infeasible_error
from heterps_cli.schedulers.exact.kernel import Candidate
from heterps_cli.schedulers.exact.pipeline import solver_for
from heterps_cli.schedulers.exact.step import StepSolver, schedule_of

if TYPE_CHECKING:
    from heterps_cli.schedulers.mixed_optimum import Finals
    from heterps_cli.shape import Shape

PROBE_STEP = 0.02  # probes every 2% of throughput (chosen by measurement: benchmarks/bench_frontier.py)
PROBE_AHEAD = 1.0  # ... up to twice the walk's throughput ahead of it
KNEE_RULE = (
    "the plan farthest below the straight line from the cheapest to the fastest plan, "
    "with throughput and cost each scaled to [0, 1]"
)


@dataclass(frozen=True)
class Frontier:
    """Pareto-optimal plans by rising throughput (and cost), or an even selection of them."""

    problem: Problem
    plans: tuple[Plan, ...]
    positions: tuple[int, ...]  # each plan's index on the whole frontier
    size: int  # plans on the whole frontier
    knee: int | None  # index on the whole frontier (see KNEE_RULE)
    steps: int  # exact-solver evaluations the walk took
    solve_s: float
    cut_at: float | None = None  # the time limit stopped the walk here: exact up to it, nothing faster
    resolution: float = 0.0  # > 0: every plan is matched by one here at most this much slower and dearer
    # --mixed-stages where its exact DP does not run: what the points are (the one-type frontier, climbed)
    climbed: str | None = None

    @property
    def knee_plan(self) -> int | None:
        """The knee's index into :attr:`plans`, when it is among them."""
        return self.positions.index(self.knee) if self.knee in self.positions else None

    def to_dict(self) -> dict:
        p = self.problem
        return {
            "model": p.model,
            "cluster": p.cluster,
            "min_throughput": p.min_throughput,
            "max_cost": p.max_cost,
            "size": self.size,
            "positions": list(self.positions),
            "knee": self.knee_plan,
            "knee_position": self.knee,  # on the whole frontier: there even when --points left it out
            "knee_rule": KNEE_RULE,
            "steps": self.steps,
            "solve_s": self.solve_s,
            "cut_at": self.cut_at,
            "resolution": self.resolution,
            "climbed": self.climbed,
            "plans": [plan.to_dict() for plan in self.plans],
        }


def pareto_frontier(
    problem: Problem,
    *,
    progress: Progress | None = None,
    time_limit: float | None = None,
    mixed_stages: bool = False,
    resolution: float = 0.0,
) -> Frontier:
    """Every Pareto-optimal plan from the cheapest reaching ``min_throughput`` to the fastest
    (within ``max_cost`` when given); raises InfeasibleError, as ``plan`` does, when there is none.
    Where the plan chooses its micro-batch (docs/spec.md section 1f), the frontier of the plans at
    every choice together.

    With ``time_limit`` (seconds), a walk still going then stops: the plans up to the throughput
    it reached are exactly the frontier's there (the walk rises), and :attr:`Frontier.cut_at` says
    where it stopped. ``mixed_stages``: over mixed and one-type stages together (docs/spec.md section 1i),
    from the DP of :mod:`~heterps_cli.schedulers.mixed_optimum`, where it runs (TooLarge where not).
    ``resolution`` > 0: not every Pareto-optimal plan, but for every plan one at most that fraction slower
    and dearer (:func:`_coarse_walk`); the walks over rentals of whole nodes and over mixed stages stay exact."""
    start = time.perf_counter()
    mixes = _mixes(problem) if mixed_stages else False
    if mixes is True:
        return _mixed_frontier(problem, Clock(start, time_limit))
    if isinstance(mixes, str):  # the DP does not run: the one-type frontier, each point climbed
        one_type = pareto_frontier(problem, progress=progress, time_limit=time_limit, resolution=resolution)
        return _climbed(one_type, mixes, Clock(start, time_limit))
    choices = problem.micro_batch_choices
    found: list[tuple[Candidate, Problem]] = []
    failed: list[InfeasibleError] = []
    steps, cut_at = 0, None
    for i, batch in enumerate(sorted(choices, reverse=True)):  # largest first: most often the fastest plans
        left = None if time_limit is None else max(0.0, time_limit - (time.perf_counter() - start)) / (len(choices) - i)
        sub = problem.at_micro_batch(batch)
        try:  # on nodes a later choice's walk skips what an earlier one already beats (not once a walk is cut)
            known = [c for c, _ in found] if cut_at is None else []
            candidates, evaluations, cut = _candidates(sub, progress, left, known, resolution)
        except InfeasibleError as exc:
            failed.append(exc)
            continue
        found += [(c, sub) for c in candidates]
        steps += evaluations
        cut_at = cut if cut_at is None or (cut is not None and cut < cut_at) else cut_at
    if not found:
        raise failed[0] if len(failed) == 1 else InfeasibleError("; ".join(map(str, failed)))
    found.sort(key=lambda pair: pair[1].batch_size)  # of equal plans, the smallest micro-batch's is kept
    if cut_at is not None:  # exact up to where the first walk stopped, for every micro-batch
        found = [(c, sub) for c, sub in found if c.throughput <= cut_at]
    where = {id(c): sub for c, sub in found}
    frontier = _pareto([c for c, _ in found])
    solve_s = time.perf_counter() - start
    coarse = resolution if problem.nodes is None else 0.0  # rentals are walked exactly
    plans = tuple(_plan(where[id(c)], c, i, len(frontier), solve_s, coarse) for i, c in enumerate(frontier))
    knee_at = knee([c.throughput for c in frontier], [c.cost for c in frontier])
    size = len(plans)
    return Frontier(problem, plans, tuple(range(size)), size, knee_at, steps, solve_s, cut_at, coarse)


def _candidates(
    problem: Problem, progress: Progress | None, time_limit: float | None, known: list[Candidate], resolution: float
) -> tuple[list[Candidate], int, float | None]:
    """The frontier's plans at the problem's own micro-batch (within ``max_cost``), the exact
    solver's evaluations, and where the time limit cut the walk (None: it finished). ``known``: plans
    already on the frontier (whole nodes: a plan one of them beats is not looked for); ``resolution``:
    see :func:`pareto_frontier`."""
    if problem.nodes is not None:
        return _rented_candidates(problem, progress, time_limit, known)
    deadline = math.inf if time_limit is None else time.perf_counter() + time_limit
    walker = solver_for(problem, None, relax=False)  # a frontier of relaxed plans would not be exact
    floor = throughput_floor(problem)
    first = walker.cheapest(floor)
    if first is None:
        raise infeasible_error(problem, walker)
    if resolution > 0:
        found, cut_at = _coarse_walk(walker, first, floor, resolution, progress, deadline)
        evaluations = walker.evaluations
    else:
        prober = solver_for(problem, None, relax=False, like=walker)
        found, cut_at = _walk(walker, prober, first, progress, deadline)
        evaluations = walker.evaluations + prober.evaluations
    if cut_at is not None:  # probes ran ahead of the walk: past it, a plan may be beaten by one unseen
        found = [c for c in found if c.throughput <= cut_at]
    frontier = _pareto(found)
    if problem.max_cost is not None:
        frontier = [c for c in frontier if c.cost <= problem.max_cost * (1 + SLACK)]
        if not frontier:
            raise infeasible_error(problem, walker)
    return frontier, evaluations, cut_at


def _rented_candidates(
    problem: Problem, progress: Progress | None, time_limit: float | None, known: list[Candidate]
) -> tuple[list[Candidate], int, float | None]:
    """Section 1e: :func:`_candidates` over rentals of whole nodes
    (:func:`.schedulers.exact.rented.frontier_candidates`)."""
    from heterps_cli.schedulers.exact.rented import frontier_candidates

    found, cut_at = frontier_candidates(problem, progress, Clock(time.perf_counter(), time_limit), known)
    frontier = _pareto(found)
    if problem.max_cost is not None:
        frontier = [c for c in frontier if c.cost <= problem.max_cost * (1 + SLACK)]
    if not frontier:
        raise InfeasibleError("no plan meets the job's targets on any rental of the cluster's nodes")
    return frontier, len(found), cut_at


def _walk(
    walker: StepSolver, prober: StepSolver, first: Candidate, progress: Progress | None, deadline: float = math.inf
) -> tuple[list[Candidate], float | None]:
    """From ``first`` up to the fastest plan: a plan of every step of ``rate`` that no probe shows
    dominated, and the probes; and the throughput the walk had reached if ``deadline`` stopped it."""
    p = walker.p
    hours = sample_hours(p.work)  # cost = hours * rate / throughput
    lo, bound = first.throughput, walker.speed_bound()
    unreachable = math.inf  # the least throughput a probe found no plan reaching (none reaches more)
    found = [first]
    probes: list[tuple[float, Candidate]] = []  # (target, plan), rising
    next_probe = 1  # the grid's next index: targets lo * (1 + PROBE_STEP) ** m
    current = first
    while True:
        y = current.throughput
        if time.perf_counter() > deadline:
            return found, y
        while (target := lo * (1 + PROBE_STEP) ** next_probe) <= y * (1 + PROBE_AHEAD) and target < unreachable:
            next_probe += 1
            if target <= y:
                continue
            probe = prober.cheapest(target)
            if probe is None:
                unreachable = target
                break
            probes.append((target, probe))
            found.append(probe)
        jump = y
        for _, q in probes:
            if q.throughput > y:  # a free probe matches every slower plan
                jump = max(jump, q.throughput if q.cost <= 0 else min(q.throughput, hours * current.rate / q.cost))
        target = float(np.nextafter(jump, np.inf))
        if target >= unreachable:
            return found, None
        # A probe whose step holds the target is that step's plan: no need to solve it again.
        held = next((q for x, q in probes if x <= target <= q.throughput), None)
        step = held or walker.cheapest(target)
        if step is None:
            return found, None
        found.append(step)
        current = step
        if progress is not None:
            top = min(bound, unreachable)
            progress(
                f"frontier: {count(current.throughput, 0)} samples/s, {len(found):,} candidate plans",
                completed=math.log(current.throughput / lo),
                total=max(math.log(top / lo), math.log(current.throughput / lo)),
            )


def _coarse_walk(
    walker: StepSolver, first: Candidate, floor: float, resolution: float, progress: Progress | None, deadline: float
) -> tuple[list[Candidate], float | None]:
    """The cheapest plan reaching each of rising targets ``x``, from ``first`` (the cheapest reaching
    ``floor``): each next target the larger of ``x (1 + resolution)`` and just above the last plan's
    throughput, until no plan reaches it. A plan ``P`` of throughput ``y`` lies between two targets
    ``x <= y < x'``; the plan ``Q`` found at ``x`` has no higher price rate than ``P`` (which reaches ``x``) and
    either reaches ``y`` (then it is as fast and no dearer) or ``x' = x (1 + resolution) > y``, so that
    ``Q`` is faster than ``y / (1 + resolution)`` and costs less than ``1 + resolution`` times ``P``
    (docs/spec.md section 1c). With the throughput the walk had reached if ``deadline`` stopped it."""
    found, current, target = [first], first, floor
    lo, bound = first.throughput, walker.speed_bound()
    while True:
        if time.perf_counter() > deadline:
            return found, current.throughput
        target = max(target * (1 + resolution), float(np.nextafter(current.throughput, np.inf)))
        step = walker.cheapest(target)
        if step is None:
            return found, None
        found.append(step)
        current = step
        if progress is not None:  # on a log scale of throughput, up to the bound no plan passes
            done = math.log(current.throughput / lo) if lo > 0 else None
            total = max(math.log(bound / lo), done) if done is not None and math.isfinite(bound) else None
            progress(f"frontier: {count(current.throughput, 0)} samples/s, {len(found):,} plans", done, total)


def _mixes(problem: Problem) -> bool | str:
    """Whether a stage may mix types here (False: the one-type frontier is the whole one), and where it may
    but the exact DP over mixed stages does not run, why not."""
    from heterps_cli.schedulers.mixed_optimum import why_not
    from heterps_cli.schedulers.mixing import can_mix

    if (why := can_mix(problem)) is not None:
        if problem.pipelined:  # one type: the one-type frontier is the whole one
            return False
        raise InputError(None, None, "--mixed-stages", f"{why}: give --global-batch, or leave --mixed-stages out")
    return why_not(problem) or True


@dataclass(frozen=True)
class _Climbed:
    """A plan of the climbed frontier, by the figures :func:`_pareto` reads."""

    throughput: float
    cost: float
    plan: Plan


def _climbed(one_type: Frontier, why: str, clock: Clock) -> Frontier:
    """Section 1i's frontier where its exact DP does not run (``why``): every point of the one-type
    frontier climbed as ``plan --mixed-stages`` climbs a plan (:func:`~.schedulers.mixing.mix`: cheaper at
    its throughput, and faster at its cost), and the Pareto set of them all. Not proven: a plan of mixed
    stages that no climb reaches may beat a point, so every point is ``optimal: false``."""
    from heterps_cli.schedulers.mixing import mix

    problem = one_type.problem
    found = [_Climbed(p.throughput, p.cost_usd, p) for p in one_type.plans]
    for point in one_type.plans:  # mix takes each at the point's own micro-batch
        at_least, at_most = point.throughput * (1 - SLACK), point.cost_usd * (1 + SLACK)
        cheaper = problem.replace(objective=Objective.COST, min_throughput=at_least, max_cost=None)
        faster = problem.replace(objective=Objective.TIME, min_throughput=0.0, max_cost=at_most)
        for asked in (cheaper, faster):
            plan, _ = mix(asked, point, clock)
            if plan.mixes and meets_targets(problem, plan.throughput, plan.cost_usd):
                found.append(_Climbed(plan.throughput, plan.cost_usd, plan))
    frontier = _pareto(found)
    mixed = sum(c.plan.mixes for c in frontier)
    said = (
        f"--mixed-stages: the exact DP over mixed stages does not run here ({why}), so these are the points of "
        f"the frontier of one-type stages, each climbed as plan --mixed-stages climbs a plan (replicas of other "
        f"types joining its stages, cheaper at its throughput or faster at its cost): {mixed} of "
        f"{len(frontier)} mix; not proven, a plan of mixed stages no climb reaches may beat one"
    )
    within = f" at a resolution of {100 * one_type.resolution:g}%" if one_type.resolution > 0 else ""
    solve_s = time.perf_counter() - clock.started
    plans = []
    for i, c in enumerate(frontier):
        own = [n for n in c.plan.notes if not n.startswith("point ")]
        where = f"point {i + 1} of {len(frontier)} on the one-type frontier{within} and its points climbed"
        # the question each point answers, as every frontier's: the cheapest reaching its own throughput
        figures = {"objective": Objective.COST, "min_throughput": c.plan.throughput, "max_cost": problem.max_cost}
        figures |= {"solve_s": solve_s, "optimal": False, "gap": None}
        plans.append(c.plan.but(**figures, notes=[*own, where, said]))
    knee_at = knee([c.throughput for c in frontier], [c.cost for c in frontier])
    return replace(
        one_type,
        plans=tuple(plans),
        positions=tuple(range(len(plans))),
        size=len(plans),
        knee=knee_at,
        solve_s=solve_s,
        climbed=said,
    )


@dataclass(frozen=True)
class _Point:
    """A final cell of the mixed DP (:class:`~heterps_cli.schedulers.mixed_optimum.Finals`)."""

    throughput: float
    cost: float
    finals: Finals
    u: int


def _mixed_frontier(problem: Problem, clock: Clock) -> Frontier:
    """Section 1i's frontier: the Pareto set of the DP's last cells. A cell holds the fastest plan of its
    units, so every plan is matched by a cell at least as fast and no dearer, and the cells' Pareto set
    is the frontier's."""
    from heterps_cli.schedulers.mixed_optimum import finals

    start = time.perf_counter()
    found = finals(problem, clock)
    if found is None:  # no throughput below which the cells found so far are known to be the frontier
        raise InputError(
            None,
            None,
            "--time-limit",
            f"{clock.limit:g} s ran out before the exact DP over mixed stages was done: raise --time-limit, or "
            "leave --mixed-stages out",
        )
    points = [_Point(float(f.throughput[u]), float(f.cost[u]), f, int(u)) for f in found for u in np.flatnonzero(f.ok)]
    if not points:
        fastest = max((float(np.nanmax(f.throughput)) for f in found), default=0.0)
        said = f"the fastest reaches {count(fastest, 1)} samples/s" if fastest > 0 else "none runs within the limits"
        raise InfeasibleError(f"no plan of mixed or one-type stages meets the job's floor and budget: {said}")
    frontier = _pareto(points)
    plans = []
    for i, c in enumerate(frontier):
        own = c.finals.problem.replace(objective=Objective.COST, min_throughput=c.throughput * (1 - SLACK))
        plan = c.finals.plan(c.u, "exact", 0, problem=own)
        plans.append(_as_point(plan, i, len(frontier), c.throughput, " over mixed and one-type stages"))
    solve_s = time.perf_counter() - start
    plans = [p.but(solve_s=solve_s) for p in plans]
    knee_at = knee([c.throughput for c in frontier], [c.cost for c in frontier])
    steps = sum(len(f.value) for f in found)
    return Frontier(problem, tuple(plans), tuple(range(len(plans))), len(plans), knee_at, steps, solve_s)


class _Figures(Protocol):
    @property
    def throughput(self) -> float: ...

    @property
    def cost(self) -> float: ...


F = TypeVar("F", bound=_Figures)


def _pareto(found: list[F]) -> list[F]:
    """The candidates no other matches, by rising throughput.

    Two throughputs within :data:`SLACK` (relative) are equal, as ``--min-throughput`` reads them:
    the same bottleneck stage summed over other stage boundaries differs in the last bits, and
    the dearer of two such plans is beaten by the cheaper. Of each class of equal throughputs only
    the cheapest stays (the fastest of those); then, from the fastest class down, each must cost
    less than every faster one (by more than float noise)."""
    order = sorted(found, key=lambda c: (-c.throughput, c.cost))
    classes: list[F] = []
    head = math.inf
    for c in order:
        if c.throughput >= head * (1 - SLACK):
            if c.cost < classes[-1].cost * (1 - SLACK):
                classes[-1] = c
        else:
            head = c.throughput
            classes.append(c)
    kept: list[F] = []
    for c in classes:
        if not kept or c.cost < kept[-1].cost * (1 - SLACK):
            kept.append(c)
    return kept[::-1]


def _plan(problem: Problem, c: Candidate, position: int, size: int, solve_s: float, resolution: float) -> Plan:
    """A frontier point as a plan file: the answer to ``plan --scheduler exact --min-throughput`` its
    throughput (with a ``resolution``, a point of a frontier within it, not proven the cheapest there)."""
    own = problem.replace(objective=Objective.COST, min_throughput=c.throughput)
    plan = make_plan(
        own,
        schedule_of(problem, c.stages),
        c.replicas,
        scheduler="exact",
        seed=0,
        solve_s=solve_s,
        optimal=resolution == 0,
        rental=c.rental,
    )
    return _as_point(plan, position, size, c.throughput, resolution=resolution)


def _as_point(plan: Plan, position: int, size: int, throughput: float, over: str = "", resolution: float = 0.0) -> Plan:
    """``plan`` as point ``position`` of ``size`` on the frontier (``over``: which stages it is over)."""
    assert plan.feasible, "the frontier holds a plan that breaks a constraint"
    if resolution > 0:
        within = f"{100 * resolution:g}%"
        note = (
            f"point {position + 1} of {size} on the cost-throughput frontier at a resolution of {within}: "
            f"every plan is matched by a point at most {within} slower and {within} dearer"
        )
    else:
        note = (
            f"point {position + 1} of {size} on the cost-throughput frontier{over}: the cheapest plan reaching "
            f"{count(throughput, 1)} samples/s"
        )
    # The plan's own figure, which may differ from the solver's sum in the last bit.
    return plan.but(min_throughput=plan.throughput, notes=[*plan.notes, note])


def knee(throughput: list[float], cost: list[float]) -> int | None:
    """The knee by :data:`KNEE_RULE`; None for fewer than three plans or a curve with none below the line."""
    if len(throughput) < 3:
        return None
    x = np.asarray(throughput, dtype=float)
    y = np.asarray(cost, dtype=float)
    span_x, span_y = x[-1] - x[0], y[-1] - y[0]
    if span_x <= 0 or span_y <= 0:
        return None
    below = (x - x[0]) / span_x - (y - y[0]) / span_y
    best = int(np.argmax(below))
    return best if below[best] > 1e-9 else None


def thin(frontier: Frontier, n: int) -> Frontier:
    """``n`` of the frontier's plans spread evenly over throughput: both ends always, the knee when
    ``n >= 3``; ``n = 1`` is the knee (the cheapest plan when there is no knee)."""
    size = len(frontier.plans)
    if n >= size:
        return frontier
    if n == 1:
        chosen = [frontier.knee_plan if frontier.knee_plan is not None else 0]
    else:
        thr = np.array([plan.throughput for plan in frontier.plans])
        chosen = []
        for target in np.linspace(thr[0], thr[-1], n):
            order = np.argsort(np.abs(thr - target), kind="stable")
            chosen.append(int(next(i for i in order if i not in chosen)))
        knee_at = frontier.knee_plan
        if knee_at is not None and knee_at not in chosen and n >= 3:
            inner = [i for i in chosen if i not in (0, size - 1)]
            chosen.remove(min(inner, key=lambda i: abs(thr[i] - thr[knee_at])))
            chosen.append(knee_at)
    chosen.sort()
    return replace(
        frontier,
        plans=tuple(frontier.plans[i] for i in chosen),
        positions=tuple(frontier.positions[i] for i in chosen),
    )


def layout(plan: Plan, most: int | None = None) -> str:
    """The stages in short form: ``cpu×34 | v100×1 | cpu×1``; with more than ``most`` stages, the
    first ``most - 1``, an ellipsis, the last and the count: ``cpu×34 | v100×1 | … | cpu×6 (27 stages)``;
    a mixed stage's parts joined by ``+`` (``v100×6+a100×2``)."""
    parts = [
        "+".join([f"{s.resource}{s.way}×{s.replicas}", *(f"{j.resource}{j.way}×{j.replicas}" for j in s.joined or ())])
        for s in plan.stages
    ]
    if most is not None and len(parts) > most:
        parts = [*parts[: most - 1], "…", f"{parts[-1]} ({len(parts)} stages)"]
    return " | ".join(parts)


def write_plans(frontier: Frontier, directory: str | Path) -> list[Path]:
    """Each plan as ``plan-NNN.yaml`` (its position on the whole frontier, from 1), as one set
    (:func:`heterps_cli.outfiles.write_set`): the plans a previous frontier wrote there and this one
    does not are removed, nothing else, and a failure leaves the folder as it was."""
    from heterps_cli.outfiles import OutFile, write_set
    from heterps_cli.yamlio import dump_yaml

    width = max(3, len(str(frontier.size)))
    names = [f"plan-{position + 1:0{width}d}.yaml" for position in frontier.positions]
    files = {name: OutFile(dump_yaml(plan.to_dict())) for name, plan in zip(names, frontier.plans)}
    return write_set(directory, files, "--out", "frontier")


@dataclass(frozen=True)
class _Held:
    plan: Plan

    @property
    def throughput(self) -> float:
        return self.plan.throughput

    @property
    def cost(self) -> float:
        return self.plan.cost_usd


def engine_frontier(
    problem: Problem,
    engine: str,
    shape: Shape | None = None,
    *,
    progress: Progress | None = None,
    time_limit: float | None = None,
    resolution: float = 0.0,
) -> Frontier:
    """Section 1k: the frontier of the plans ``engine`` runs (within ``shape``): the Pareto set of the
    frontiers of every shape its rules leave open, together (each exact, so their union's is too)."""
    from heterps_cli.engines import ENGINES, shapes
    from heterps_cli.shape import Shape, constrained

    start = time.perf_counter()
    tried = shapes(problem, ENGINES[engine], shape or Shape())
    points: list[_Held] = []
    steps, cut_at, failed = 0, None, None
    for i, each in enumerate(tried):
        left = None if time_limit is None else max(0.0, time_limit - (time.perf_counter() - start)) / (len(tried) - i)
        try:
            part = pareto_frontier(
                constrained(problem, each), progress=progress, time_limit=left, resolution=resolution
            )
        except InputError:
            continue  # a shape the profile cannot run
        except InfeasibleError as exc:
            failed = failed or exc
            continue
        points += [_Held(p) for p in part.plans]
        steps += part.steps
        if part.cut_at is not None:
            cut_at = part.cut_at if cut_at is None else min(cut_at, part.cut_at)
    if not points:
        raise failed or InfeasibleError(f"{ENGINES[engine].title} runs no plan that meets the job within its rules")
    if cut_at is not None:  # exact up to where the first walk stopped, for every shape
        points = [p for p in points if p.throughput <= cut_at]
    kept = [p.plan for p in _pareto(points)]
    said = f"--engine {engine}: a plan {ENGINES[engine].title} runs ({len(tried)} shapes' frontiers together)"
    plans = tuple(
        _as_point(p.but(notes=[*(n for n in p.notes if not n.startswith("point ")), said]), i, len(kept), p.throughput)
        for i, p in enumerate(kept)
    )
    knee_at = knee([p.throughput for p in plans], [p.cost_usd for p in plans])
    solve_s = time.perf_counter() - start
    return Frontier(problem, plans, tuple(range(len(plans))), len(plans), knee_at, steps, solve_s, cut_at, resolution)
