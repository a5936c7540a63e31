"""The HeterPS cost model (docs/spec.md section 1), vectorised over batches of schedules.

A *schedule* is an int array ``[n_layers]`` of resource-type indices; a batch
is ``[B, n_layers]``. Stages are maximal runs of one type. For a stage,

    CT(k) = sc + pc / k      DT(k) = sd + pd / k      ET(k) = max(CT, DT)

where ``sc, pc, sd, pd`` are the summed serial/parallel halves of its layers'
OCT and ODT (``Problem.parts``); this is docs/spec.md section 1's per-layer Amdahl sum, regrouped.

Exact provisioning rests on one fact: an optimal plan's bottleneck throughput
``X`` equals ``thr_s(k)`` for some stage ``s`` and count ``k``, and once ``X`` is
fixed every stage's cheapest sufficient ``k`` is independent of the others
(:func:`min_replicas`, a closed form). Cost ``= W * rate(X) / X`` with ``rate`` a
non-decreasing step function of ``X``, so on each step the right end is best.
:func:`provision` walks those right ends upwards: evaluate at ``X``, jump to just
above the plan's actual throughput, stop when the limits break (feasibility only
shrinks as ``X`` grows) or when a lower bound on every later cost exceeds the
best found. Each jump adds at least one replica, so the walk is finite.

docs/spec.md section 1b (optional fields) fits in without changing any of this: a
stage's boundary transfer ``X_s`` joins its parallel communication ``pd`` (it is
divided by ``k``), and its memory need ``fixed + split / k`` gives a second
closed-form lower bound on ``k`` (:func:`min_memory_replicas`), so "the fewest
replicas reaching ``X``" becomes the larger of the two. Throughput and memory
both only improve as ``k`` grows, so every argument above still holds.

docs/spec.md section 1d (a pipeline schedule of ``M`` micro-batches per step) fits in
the same way: a stage's time per step ``(M + S - 1) c(k) + 2 Y (1 - 1/k) + U`` is
again ``serial + parallel / k``, with ``parallel`` negative when the gradient
all-reduce outgrows the compute replicas divide (then one replica is fastest,
and :func:`_need` says so). Its step time ``k T(k) = k serial + parallel`` still
never falls as ``k`` grows, which is all :func:`cost_lower_bound` needs. ``S`` and a
stage's place in the pipeline are known for a whole schedule; the exact solver,
which builds schedules stage by stage, carries them (:mod:`.schedulers.exact.pipeline`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from heterps_cli.formulas import SLACK, run_cost, sample_hours, stage_throughput, stretch
from heterps_cli.objective import Objective
from heterps_cli.problem import Problem
from heterps_cli.replica_counts import memory_need, min_replicas, next_whole
from heterps_cli.stages import Stages


@dataclass
class Scores:
    """Every figure of docs/spec.md section 1 for a batch of provisioned schedules."""

    replicas: np.ndarray  # [B, S] (0 in padding)
    stage_throughput: np.ndarray  # [B, S] (inf in padding)
    throughput: np.ndarray  # [B]
    bottleneck: np.ndarray  # [B] stage index
    used: np.ndarray  # [B, T] units of each type
    rate: np.ndarray  # [B] USD per hour
    time_s: np.ndarray  # [B]
    cost: np.ndarray  # [B] USD
    within_limits: np.ndarray  # [B] units within the limits, and every replica within its memory
    feasible: np.ndarray  # [B] every constraint of the problem holds
    memory_miss: np.ndarray  # [B] summed relative memory excess of the stages (0 when all fit)


def used_per_type(problem: Problem, stages: Stages, replicas) -> np.ndarray:
    """Units of each type per schedule: ``[B, T]``."""
    B, T = stages.type.shape[0], problem.n_types
    index = (np.arange(B)[:, None] * T + stages.type).ravel()
    weights = np.where(stages.valid, replicas * stages.width, 0.0).ravel()  # section 1h: a replica's units
    return np.bincount(index, weights=weights, minlength=B * T).reshape(B, T)


def most_replicas(problem: Problem, stages: Stages) -> np.ndarray:
    """``[B, S]``: the replicas each stage's type holds for it alone (section 1h: its units over its width)."""
    return (problem.limits[stages.type] // stages.width).astype(float)


def stage_throughputs(problem: Problem, stages: Stages, replicas) -> np.ndarray:
    """``[B, S]`` samples/s of every stage with the given replica counts (inf in padding)."""
    k = np.where(stages.valid, replicas, 1.0)
    thr = stage_throughput(
        stages.sc, stages.pc, stages.sd, stages.pd, problem.step_samples, k, stages.ps, problem.batch_size
    )
    return np.where(stages.valid, thr, np.inf)


def score(problem: Problem, stages: Stages, replicas, rate: np.ndarray | None = None) -> Scores:
    """Throughput, time, cost and feasibility of schedules with the given replica counts (``rate``:
    USD an hour of each schedule's rental, where it is not the cheapest holding its units)."""
    k = np.where(stages.valid, np.asarray(replicas, dtype=float), 0.0)
    each = replicas_keep_rules(problem, stages, k)
    miss = np.zeros(len(k))
    if np.isfinite(problem.memory).any():
        with np.errstate(divide="ignore", invalid="ignore"):
            need = memory_need(
                stages.mem_fixed, stages.mem_split, np.maximum(k, 1.0), stages.mem_act, problem.batch_size
            )
            over = np.where(stages.valid, np.maximum(need / problem.memory[stages.type] - 1.0, 0.0), 0.0)
        miss = np.nan_to_num(over, nan=0.0, posinf=1e300).sum(axis=1)
    thr_s = stage_throughputs(problem, stages, k)
    return scores_of(problem, stages, k, thr_s, used_per_type(problem, stages, k), each, rate, miss)


def replicas_keep_rules(problem: Problem, stages: Stages, k) -> np.ndarray:
    """``[B, S]``: each stage has the replicas its memory and measured sizes need (``min_k``), and no more
    than the batch has samples (section 1: whole samples)."""
    return (k >= np.maximum(stages.min_k, 1)) & (k <= problem.batch_size)


def scores_of(problem: Problem, stages: Stages, k, thr_s, used, each, rate, miss) -> Scores:
    """Section 1's plan figures from each stage's throughput (``thr_s``), the units of each type
    (``used``) and whether each stage's replicas keep its rules (``each``, ``[B, S]``; padding ignored):
    what :func:`score` and a plan with mixed stages (:func:`~heterps_cli.mixed.mixed_scores`) share."""
    bottleneck = np.argmin(thr_s, axis=1)
    thr = thr_s[np.arange(len(k)), bottleneck]
    if rate is None:
        rate = used @ problem.prices if problem.nodes is None else problem.nodes.cover(used)[0]
    with np.errstate(divide="ignore", invalid="ignore"):
        time_s = problem.work / thr
        cost = run_cost(problem.work, thr, rate)
    fits = (used <= problem.limits[None, :]).all(axis=1)
    within = np.asarray(fits & np.where(stages.valid, each, True).all(axis=1))
    feasible = stages.runnable & within & meets_targets(problem, thr, cost)
    return Scores(k, thr_s, thr, bottleneck, used, rate, time_s, cost, within, feasible, miss)


def throughput_floor(problem: Problem) -> float:
    """The least throughput that meets ``min_throughput``, with :data:`SLACK` slack.

    The slack matters when the target equals a plan's throughput in exact
    arithmetic (say, the throughput of one replica per stage) and the float sums
    land one ulp below it.
    """
    return problem.min_throughput * (1 - SLACK)


def meets_targets(problem: Problem, throughput, cost):
    ok = np.asarray(throughput) >= throughput_floor(problem)
    if problem.max_cost is not None:
        ok &= np.asarray(cost) <= problem.max_cost * (1 + SLACK)
    return ok


def cost_lower_bound(price, replicas, throughput, batch):
    """Per stage, a lower bound on ``price * k' / X'`` for every target ``X' >= X``.

    ``replicas`` are the fewest reaching ``X`` and ``throughput`` what they give.
    Any ``X' >= X`` needs ``k' >= replicas`` with ``thr(k') >= X'``, so
    ``k'/X' >= k'/thr(k') = k' ET(k') / B0 >= replicas / throughput`` because
    ``k ET(k) = max(k sc + pc, k sd + pd)`` never falls as ``k`` grows. Summed
    over a plan's stages this bounds the cost of every faster plan (times W/3600).

    Under whole samples (section 1) that holds of the times under real division, which are at least
    the whole-sample times over :func:`~heterps_cli.formulas.stretch` (its serial terms are never
    negative), hence the division by it: 1 where ``replicas`` divide ``batch``.
    """
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(price > 0, price * replicas / throughput / stretch(batch, replicas), 0.0)


def better(problem: Problem, cost, thr, best_cost, best_thr):
    """Is (cost, thr) a better plan than (best_cost, best_thr) under the problem's objective?"""
    if problem.objective is Objective.TIME:
        return (thr > best_thr) | ((thr == best_thr) & (cost < best_cost))
    return (cost < best_cost) | ((cost == best_cost) & (thr > best_thr))


def _replicas_at(problem: Problem, stages: Stages, target) -> tuple[np.ndarray, np.ndarray]:
    """Fewest replicas per stage reaching ``target`` (per row), 0 in padding; and whether they fit the limits."""
    limit = most_replicas(problem, stages)
    k = min_replicas(
        stages.sc,
        stages.pc,
        stages.sd,
        stages.pd,
        problem.step_samples,
        np.asarray(target)[:, None],
        stages.min_k,
        stages.ps,
        problem.batch_size,
    )
    k = np.where(stages.valid, np.where(k <= limit, k, np.inf), 0.0)
    ok = stages.runnable & np.isfinite(k).all(axis=1)
    k = np.where(np.isfinite(k), k, 0.0)
    ok &= (used_per_type(problem, stages, k) <= problem.limits).all(axis=1)
    return k, ok


def _step_past(problem: Problem, stages: Stages, k, thr_s, thr) -> tuple[np.ndarray, np.ndarray]:
    """The fewest replicas just above the plan ``k`` (stage throughputs ``thr_s``, throughput ``thr``),
    given that ``k`` are the fewest reaching something at most ``thr``: on each bottleneck stage the
    next count with a smaller share of the batch (:func:`next_whole`, one more unless that one shares
    it alike), the others as they are; and whether those fit the limits. Where one more gains a stage
    nothing, the plan is dearer and as fast (the closed form would say no count reaches past ``thr``).
    Two numpy calls where :func:`_replicas_at` makes forty."""
    ahead = np.where(stages.valid & (thr_s == thr[:, None]), next_whole(problem.batch_size, np.maximum(k, 1.0)), k)
    whole = np.isfinite(ahead).all(axis=1)  # a bottleneck whose replicas take one sample each cannot step
    ahead = np.where(np.isfinite(ahead), ahead, k)
    return ahead, whole & np.asarray((used_per_type(problem, stages, ahead) <= problem.limits).all(axis=1))


# fastest_replicas bisects to this relative width, then steps exactly to the fastest plan: the answer is the
# same at any width (checked on 2,000 random schedules of each benchmark instance, from 1e-13 to 1e-2), the
# time is not (1e-13: 1.14 s for those schedules; 1e-6: 0.59 s; 1e-2: 10 s, each step adds one replica to a
# bottleneck stage). With the steps made by adding those replicas instead of by the closed form: 1e-6 0.61 s,
# 1e-5 0.55 s, 1e-4 0.73 s; on the batches of a chain64x4-tight rl run 3.7 s (closed-form steps, 1e-6),
# 3.2 s (1e-5), 3.1 s (1e-4), 5.7 s (1e-3).
BRACKET = 1e-5


def fastest_replicas(problem: Problem, stages: Stages) -> np.ndarray:
    """Per schedule, the replicas of its fastest plan within the limits, cheapest among the fastest.

    Reaching a throughput only gets harder as it grows, so every row bisects
    (geometrically, all rows at once) between one replica per stage and every
    stage on all its type's units; then it takes the fewest replicas reaching the
    bracket's floor and steps past that plan's own throughput while it can (one
    more replica on each bottleneck stage). Rows where one replica per stage
    already breaks a limit keep one per stage.
    """
    B = stages.type.shape[0]
    ones = np.where(stages.valid, 1.0, 0.0)
    k, fits = _replicas_at(problem, stages, np.zeros(B))
    lo = stage_throughputs(problem, stages, np.maximum(k, 1.0)).min(axis=1)
    hi = stage_throughputs(problem, stages, most_replicas(problem, stages)).min(axis=1)
    hi = np.maximum(hi, lo)
    for _ in range(80):
        open_ = fits & (hi > lo * (1 + BRACKET))
        if not open_.any():
            break
        mid = np.sqrt(lo * hi)
        _, ok = _replicas_at(problem, stages, mid)
        lo = np.where(open_ & ok, mid, lo)
        hi = np.where(open_ & ~ok, mid, hi)
    k, ok = _replicas_at(problem, stages, lo)
    k = np.where((fits & ok)[:, None], k, ones)
    thr_s = stage_throughputs(problem, stages, np.maximum(k, 1.0))
    thr = thr_s.min(axis=1)
    for _ in range(int(problem.limits.sum()) + 1):  # exact finish: a handful of steps at most
        # A step that gains nothing, or breaks a limit, ends the row.
        ahead, within = _step_past(problem, stages, k, thr_s, thr)
        ahead_s = stage_throughputs(problem, stages, np.maximum(ahead, 1.0))
        ahead_thr = ahead_s.min(axis=1)
        ok = fits & (ahead_thr > thr) & within
        if not ok.any():
            break
        k = np.where(ok[:, None], ahead, k)
        thr_s = np.where(ok[:, None], ahead_s, thr_s)
        thr = np.where(ok, ahead_thr, thr)
    return k


# provision's walk (objective cost) seeds the rows still walking after SEED_AFTER plans with the cheapest
# of SEEDS plans spread over their range of throughputs. Most walks end at once where limits bind, so
# the seed waits for those to drop out; on a 64 x 3 rl run's batches the rest walked 39 plans on average,
# the best one found at the 32nd, and every plan before it was walked one at a time because the skip
# had nothing cheap to measure against. Measured on those batches: 2.5 s without, 2.1 s with (8 seeds: 2.0 s,
# but on chain64x4-tight 4.7 s against 4.4 s).
SEED_AFTER = 2
SEEDS = 4
# A walk steps by _step_past, with the closed form (which also takes the skip) every CLOSED_EVERY
# steps; in between it may visit plans the skip would have passed, none of which can win. Measured on
# a 64 x 3 rl run's batches: 2.1 s with the closed form at every step, 1.8 s every 2nd, 1.7 s every 3rd
# to 8th; the replicas are the same.
CLOSED_EVERY = 4


def _seed(problem: Problem, stages: Stages, price) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row, the replicas, cost and throughput of the cheapest of :data:`SEEDS` plans at throughputs
    spread geometrically from its slowest plan to its fastest (inf cost where none meets the targets)."""
    R = len(price)
    k, _ = _replicas_at(problem, stages, np.full(R, throughput_floor(problem)))
    lo = stage_throughputs(problem, stages, np.maximum(k, 1.0)).min(axis=1)
    hi = np.maximum(stage_throughputs(problem, stages, most_replicas(problem, stages)).min(axis=1), lo)
    with np.errstate(divide="ignore", invalid="ignore"):  # a model of no work: lo is inf, and no seed
        grid = lo[:, None] * (hi / lo)[:, None] ** (np.arange(1, SEEDS + 1) / SEEDS)
    each = np.repeat(np.arange(R), SEEDS)
    wide = stages.take(each)
    k, ok = _replicas_at(problem, wide, grid.ravel())
    thr = stage_throughputs(problem, wide, np.maximum(k, 1.0)).min(axis=1)
    cost = run_cost(problem.work, thr, (price[each] * k).sum(axis=1))
    cost = np.where(ok & meets_targets(problem, thr, cost), cost, np.inf).reshape(R, SEEDS)
    col = np.argmin(cost, axis=1)
    pick = np.arange(R) * SEEDS + col
    return k[pick], cost[np.arange(R), col], thr[pick]


def _next_targets(problem: Problem, thr, rate, best_cost):
    """Where each walk of :func:`provision` goes next: just past its plan's throughput, and under
    objective cost past every target that cannot win."""
    target = np.nextafter(thr, np.inf)
    if problem.objective is Objective.COST:
        # A plan with throughput X' costs at least W * rate / X' (faster plans need at least
        # this rate), so targets below W * rate / best_cost cannot win: skip them.
        with np.errstate(divide="ignore", invalid="ignore"):
            skip = sample_hours(problem.work) * rate / best_cost * (1 - SLACK)
        target = np.where(np.isfinite(skip), np.maximum(target, skip), target)
    return target


def provision(problem: Problem, stages: Stages) -> Scores:
    """Exact replica counts for each schedule of the batch, under the problem's objective.

    Infeasible schedules get the fastest replica counts the limits allow (so a
    caller can see how far they miss); their ``feasible`` flag is False.

    Two shortcuts change the work, not the answer: walks still going after
    :data:`SEED_AFTER` plans are seeded with a good plan (:func:`_seed`), and
    between closed forms a step adds one replica to each bottleneck stage
    (:data:`CLOSED_EVERY`).
    """
    if problem.objective is Objective.TIME and problem.max_cost is None:
        return score(problem, stages, fastest_replicas(problem, stages))
    B = stages.type.shape[0]
    best_k = np.where(stages.valid, 1.0, 0.0)
    best_cost = np.full(B, np.inf)
    best_thr = np.zeros(B)
    # The walk goes on only for the rows still active, gathered into a smaller batch as rows drop out:
    # the walks' lengths differ widely (a few steps to hundreds), and the long tail was most of the work.
    rows = np.flatnonzero(stages.runnable)
    live = stages.take(rows)
    price = np.where(live.valid, problem.prices[live.type], 0.0)
    target = np.full(len(rows), throughput_floor(problem))
    k = thr_s = thr = np.zeros(0)  # the first step takes the closed form
    for step in range(int(problem.limits.sum()) + 2):
        if len(rows) == 0:
            break
        if step == SEED_AFTER and problem.objective is Objective.COST:
            seed_k, seed_cost, seed_thr = _seed(problem, live, price)
            won = better(problem, seed_cost, seed_thr, best_cost[rows], best_thr[rows])
            at = rows[won]
            best_k[at], best_cost[at], best_thr[at] = seed_k[won], seed_cost[won], seed_thr[won]
        if step % CLOSED_EVERY == 0:
            k, active = _replicas_at(problem, live, target)
        else:
            k, active = _step_past(problem, live, k, thr_s, thr)  # a plan that gains nothing cannot win
        thr_s = stage_throughputs(problem, live, np.maximum(k, 1.0))
        rate = (price * k).sum(axis=1)
        if problem.objective is Objective.COST:
            # No plan at least as fast as the target can cost less than this bound.
            bound = sample_hours(problem.work) * cost_lower_bound(price, k, thr_s, problem.batch_size).sum(axis=1)
            active &= bound < best_cost[rows] * (1 - SLACK)
        thr = thr_s.min(axis=1)
        cost = run_cost(problem.work, thr, rate)
        take = active & meets_targets(problem, thr, cost) & better(problem, cost, thr, best_cost[rows], best_thr[rows])
        won = rows[take]
        best_k[won], best_cost[won], best_thr[won] = k[take], cost[take], thr[take]
        target = _next_targets(problem, thr, rate, best_cost[rows])
        if not active.all():
            rows, live, price, target = rows[active], live.take(active), price[active], target[active]
            k, thr_s, thr = k[active], thr_s[active], thr[active]
    missed = ~np.isfinite(best_cost)
    if missed.any():
        best_k[missed] = fastest_replicas(problem, stages.take(missed))
    return score(problem, stages, best_k)
