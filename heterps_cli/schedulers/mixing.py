"""Section 1i's search: replicas of other types join a plan's stages (mixed stages, offered by default).

From any scheduler's plan of one-type stages, a hill climb. Objective time: at each step, every way to give
the slowest stage ``e`` more replicas of another type (``e`` a power of two, or all there are), taken from
the units the plan leaves idle or from another stage of that type (and as many of its own type's idle
units), each with the split of the micro-batch that makes its slowest part fastest
(:func:`~heterps_cli.mixed.balanced`); the best that makes the plan faster within every constraint is
kept, until none does. Objective cost: every way to give any stage idle replicas of another type while it
gives up some of its own, kept where the plan gets cheaper and still meets its throughput.
"""

from __future__ import annotations

import time

import numpy as np

from heterps_cli.costmodel import score
from heterps_cli.figures import usd
from heterps_cli.mixed import Joined, Splits, balanced, mixed_scores, mixed_stage, with_own
from heterps_cli.objective import Objective
from heterps_cli.plan import Plan, make_plan
from heterps_cli.problem import Problem
from heterps_cli.schedulers.base import Clock
from heterps_cli.stages import schedule_of_stages, split_stages

MOST_STEPS = 64  # joins of the slowest stage; each step tries every type, count and source


def can_mix(problem: Problem) -> str | None:
    """Why ``problem``'s plans cannot mix types in a stage (None: they can)."""
    if problem.n_types < 2:
        return "the cluster has one type"
    if not problem.pipelined:
        return "mixed stages need a pipeline schedule (a global batch)"
    if problem.ties:
        return "the model has tied tensors (section 1j), whose holders heterps run keeps in stages of one type"
    return None


def offered(problem: Problem) -> tuple[bool, str | None]:
    """Whether plan and compare offer mixed stages by default (section 1i), and, where the problem could mix
    but they are not offered, why: where neither the exact DP over them runs nor the units bound proves a
    plan over them (objective time, no budget), the certificate over mixed plans is the linear bound's,
    which would turn a proven one-type optimum into a gap of tens of percent (vgg16 on three-type at global
    batch 256: 26.8%)."""
    from heterps_cli.schedulers.mixed_optimum import why_not

    if can_mix(problem) is not None:
        return False, None
    if (problem.objective is Objective.TIME and problem.max_cost is None) or why_not(problem) is None:
        return True, None
    what = "under a budget (--max-cost)" if problem.objective is Objective.TIME else "under objective cost"
    return False, f"{what}, on a problem past the exact DP over them, no bound proves a plan over them within 1%"


def proven_over_mixed(problem: Problem) -> bool:
    """Whether the problem's plans may mix types in a stage and the exact DP over them runs (frontier's default:
    every point over mixed stages then proven)."""
    from heterps_cli.schedulers.mixed_optimum import why_not

    return can_mix(problem) is None and why_not(problem) is None


def mix(problem: Problem, plan: Plan, clock: Clock | None = None) -> tuple[Plan, str]:
    """``plan`` with replicas of other types joining its stages where that makes it better by the
    objective, and what was done, in words."""
    if (why := can_mix(problem)) is not None or not plan.feasible:
        return plan, why or "the plan breaks a constraint"
    problem = problem.at_micro_batch(plan.batch_size)
    schedule = schedule_of_stages(problem, plan.stages)
    stages = split_stages(problem, schedule[None, :])
    splits = Splits(problem, schedule)
    k = np.array([float(s.replicas) for s in plan.stages])
    joined: dict[int, tuple[Joined, ...]] = {}
    best = _score(splits, stages, k, joined)
    start = best
    for _ in range(MOST_STEPS):
        if (clock is not None and clock.out_of_time()) or best is None:
            break
        moves = _moves(splits, stages, k, joined)
        scored = ((_score(splits, stages, kk, jj), kk, jj) for kk, jj in moves)
        found = max(scored, key=lambda c: _key(problem, c[0]), default=None)
        if found is None or found[0] is None or not _better(problem, found[0], best):
            break
        best, k, joined = found
    if not joined or best is None or start is None:
        return plan, "no stage is better with replicas of another type"
    mixed = make_plan(problem, schedule, k, scheduler=plan.scheduler, seed=plan.seed, joined=joined, notes=plan.notes)
    said = "; ".join(joined_words(problem, stage) for stage in mixed.stages if stage.joined)
    if problem.objective is Objective.TIME:
        said += f" (section 1i): {start[0]:,.1f} -> {best[0]:,.1f} samples/s"
    else:
        said += f" (section 1i): {usd(start[1])} -> {usd(best[1])}"
    return mixed.but(solve_s=plan.solve_s, evaluations=plan.evaluations), said


def _key(problem: Problem, figures: tuple[float, float] | None) -> tuple[float, float]:
    """What the climb maximises: the throughput then the lower cost (time), or the lower cost (cost)."""
    if figures is None:
        return (-np.inf, -np.inf)
    thr, cost = figures
    return (thr, -cost) if problem.objective is Objective.TIME else (-cost, thr)


def _better(problem: Problem, new: tuple[float, float], old: tuple[float, float] | None) -> bool:
    if old is None:
        return True
    if problem.objective is Objective.TIME:
        return new[0] > old[0] * (1 + 1e-9)
    return new[1] < old[1] * (1 - 1e-9)


def joined_words(problem: Problem, stage) -> str:
    """Who joins a plan's mixed ``stage``, and what each part trains, in words."""
    B = problem.batch_size
    others = ", ".join(f"{p.replicas} {p.resource}{p.way} replica(s) train {p.samples}" for p in stage.joined)
    return (
        f"layers {stage.first}-{stage.last}: {others} of each micro-batch of {B} beside {stage.replicas} "
        f"{stage.resource}{stage.way} replica(s), which train {stage.samples}, each type's share as large as keeps "
        "it no slower than the stage's slowest part"
    )


def _scores(splits: Splits, stages, k: np.ndarray, joined: dict):
    """The plan's scores with its mixed stages (:func:`~heterps_cli.mixed.mixed_scores`)."""
    problem, schedule = splits.problem, splits.schedule
    kk = np.zeros(stages.valid.shape)
    kk[0, : len(k)] = k
    sc = score(problem, stages, kk)
    if joined:
        parts = {
            s: mixed_stage(problem, schedule, s, with_own(problem, stages, k, s, j), splits) for s, j in joined.items()
        }
        sc = mixed_scores(problem, stages, sc, parts)
    return sc


def _score(splits: Splits, stages, k: np.ndarray, joined: dict) -> tuple[float, float] | None:
    """The plan's throughput and cost (None where it breaks a constraint)."""
    sc = _scores(splits, stages, k, joined)
    return (float(sc.throughput[0]), float(sc.cost[0])) if sc.feasible[0] else None


def _moves(splits: Splits, stages, k: np.ndarray, joined: dict):
    """Every move of the climb (this module's rule), as (replicas per stage, joined parts)."""
    problem = splits.problem
    sc = _scores(splits, stages, k, joined)
    free = problem.limits - sc.used[0]
    timed = problem.objective is Objective.TIME
    targets = [int(np.argmin(sc.stage_throughput[0, : len(k)]))] if timed else range(len(k))
    for b in targets:
        if stages.recompute[0, b]:
            continue
        own_type, width = int(stages.type[0, b]), int(stages.width[0, b])
        have = {p.type: p for p in joined.get(b, ())}
        # time: the stage grows by its own type's idle units too; cost: it gives up some of its own
        owns = (0, *_counts(int(free[own_type]) // width)) if timed else (0, *(-r for r in _counts(int(k[b]) - 1)))
        for u in range(problem.n_types):
            if u == own_type:
                continue
            # (donor stage or None, the units it can give, in lots of) the donor's replica's units
            sources: list[tuple[int | None, int, int]] = [(None, int(free[u]), 1)]
            if timed:
                sources += [
                    (s, (int(k[s]) - 1) * int(stages.width[0, s]), int(stages.width[0, s]))
                    for s in range(len(k))
                    if s != b and stages.type[0, s] == u and s not in joined
                ]
            for d in problem.degrees if u not in have else (have[u].tp,):
                for donor, most, lot in sources:
                    for e in _counts(most // d):
                        if (e * d) % lot:
                            continue
                        for grow in owns:
                            move = (b, u, e, d, donor, grow)
                            yield from _joined_move(splits, stages, k, joined, move, have)


def _joined_move(splits: Splits, stages, k: np.ndarray, joined: dict, move: tuple, have: dict):
    """The plan with ``move`` = (stage, type, replicas of it, their degree, donor stage or None, own replicas
    added) made, its stage's micro-batch split :func:`~heterps_cli.mixed.balanced` (nothing where it
    cannot be)."""
    b, u, e, d, donor, grow = move
    other = [(p.type, p.replicas, p.tp) for p in joined.get(b, ()) if p.type != u]
    count = e + (have[u].replicas if u in have else 0)
    parts = [(int(stages.type[0, b]), int(k[b]) + grow, int(stages.width[0, b])), *other, (u, count, d)]
    samples = balanced(splits.problem, splits.schedule, b, parts, splits)
    if samples is None:
        return
    new_k = k.copy()
    new_k[b] += grow
    if donor is not None:
        new_k[donor] -= e * d // int(stages.width[0, donor])
    new_joined = dict(joined)
    new_joined[b] = tuple(Joined(t, r, n, w) for (t, r, w), n in zip(parts[1:], samples[1:]))
    yield new_k, new_joined


def _powers(most: int) -> list[int]:
    """1, 2, 4, ... up to ``most``."""
    out, e = [], 1
    while e <= most:
        out.append(e)
        e *= 2
    return out


def _counts(most: int) -> list[int]:
    """1, 2, 4, ... up to ``most``, and ``most`` itself."""
    return [*(e for e in _powers(most) if e < most), most] if most >= 1 else []


def what_if(problem: Problem, plan: Plan) -> list[dict]:
    """``plan --explain`` for a plan with mixed stages: with each type's limit one higher and one lower,
    the best plan :func:`_mixed_there` finds (at the plan's micro-batch)."""
    from heterps_cli.schedulers.exact.scheduler import what_if as exact_what_if

    return exact_what_if(problem, plan, search=lambda there: _mixed_there(there, plan))


def nodes_what_if(problem: Problem, plan: Plan) -> list[dict]:
    """``plan --explain`` for a plan with mixed stages on whole nodes: the rental one node larger or
    smaller (:func:`~heterps_cli.schedulers.exact.rented.what_if`), its fastest plan by
    :func:`_mixed_there` on each of the rental's questions."""
    from heterps_cli.errors import InfeasibleError, TooLarge
    from heterps_cli.schedulers.exact.rented import what_if as rented_what_if

    def fastest(question: Problem) -> float | None:
        try:
            return _mixed_there(question, plan).throughput
        except (InfeasibleError, TooLarge):
            return None

    return rented_what_if(problem, plan, fastest)


def _mixed_there(there: Problem, plan: Plan) -> Plan:
    """The best plan on ``there`` by the exact DP over mixed stages where it runs (so that one unit more
    never reads as slower), else the exact solver's one-type optimum climbed as :func:`mix` climbs;
    named for ``plan``'s scheduler and seed. InfeasibleError where no plan meets the job."""
    from heterps_cli.errors import InfeasibleError
    from heterps_cli.schedulers.exact import solve as exact
    from heterps_cli.schedulers.mixed_optimum import optimum, why_not

    if why_not(there) is not None:
        return mix(there, exact(there).but(scheduler=plan.scheduler, seed=plan.seed))[0]
    best = optimum(there, Clock(time.perf_counter()), plan.scheduler, plan.seed)
    if best is None:
        raise InfeasibleError("no plan of mixed or one-type stages meets the job")
    return best


def from_reserved(problem: Problem, plan: Plan, clock: Clock | None = None) -> Plan:
    """The best of ``plan`` and, for each type and each power of two ``e`` below its limit, the exact
    solver's one-type plan with ``e`` of that type's units held back, then :func:`mix`\\ ed on the whole
    cluster (those units free to join): a plan whose best mixed neighbour cuts the stages otherwise than
    the one-type optimum is often reached from one of these (``plan`` at its micro-batch, already mixed).
    Without nodes only. The optimum with ``e`` held back is also the optimum with more held back while it
    fits within that limit (a plan of a smaller space that was the best of a larger one), so it is then
    neither solved for again nor climbed from again."""
    from heterps_cli.errors import InfeasibleError, TooLarge
    from heterps_cli.schedulers.exact import solve as exact

    if problem.nodes is not None:  # limits are the nodes' there: holding units back is renting fewer nodes
        return plan
    if can_mix(problem) is not None:  # no start would mix: each would be an exact solve for nothing
        return plan
    problem = problem.at_micro_batch(plan.batch_size)
    best, said = plan, ""
    # Each start is a whole exact solve of these layers under the command's clock; it builds its stage
    # tables before it can look at the clock, so one is begun only where what is left covers the last
    # solve's time (the first: the plan's own).
    options = None if clock is None else clock.options()
    took = plan.solve_s or 0.0
    for t, name in enumerate(problem.types):
        start: Plan | None = None
        for e in _powers(int(problem.limits[t]) - 1):  # section 1i: a power of two, never all the units
            if clock is not None and clock.out_of_time(ahead=took):
                return best if not said else best.but(notes=[*best.notes, said])
            limits = problem.limits.copy()
            limits[t] -= e
            if start is not None and start.units_of(name) <= limits[t]:
                continue
            began = time.perf_counter()
            try:
                start = exact(problem.replace(limits=limits), options=options)
            except InfeasibleError:  # none with e held back: none with more (or none found in time)
                break
            except TooLarge:
                start = None
                continue
            finally:
                took = time.perf_counter() - began
            mixed, words = mix(problem, start.but(scheduler=plan.scheduler, seed=plan.seed), clock)
            if mixed.feasible and _better(
                problem, (mixed.throughput, mixed.cost_usd), (best.throughput, best.cost_usd)
            ):
                best = mixed.but(notes=[n for n in plan.notes if "(section 1i)" not in n], solve_s=plan.solve_s)
                said = f"{words}, from the one-type optimum with {e} {name} unit(s) held back"
    return best if not said else best.but(notes=[*best.notes, said])
