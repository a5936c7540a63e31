"""What no plan at one micro-batch can pass, proven without a search (docs/spec.md section 1f): the pace
ceiling, and the units a throughput needs. Both rest on one fact: every replica trains at least one sample
of each micro-batch, and a replica training ``n`` of the ``B`` samples takes ``serial + parallel n / B`` of
its stage's terms, boundary transfers included, a micro-batch (sections 1, 1d, 1f). Everything else a plan
adds (fill and drain, the all-reduce, the optimiser step, recomputation, memory) only slows it, so the
bounds hold for every plan, mixed stages (section 1i) and whole nodes (section 1e) included."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from heterps_cli.problem import Problem
from heterps_cli.units_bound import layer_pace, several_sets, units_short


def pace_ceiling(problem: Problem) -> float:
    """No plan at the problem's micro-batch ``B`` is faster than this: a replica of a stage holding layer
    ``l`` takes at least ``oct (1 - alpha) + oct alpha / B`` of each of its layers per micro-batch on its
    type and degree (section 1f), and a step of ``M`` micro-batches at least ``M`` times that (sections 1
    and 1d). Under a pipeline a replica also waits for its share of the stage's boundary transfers and
    their messages' latency, and pays its type's pass start (section 1d), so the stage holding ``l`` is no
    faster than the least of those over every run of layers ``a..b`` around ``l`` (each term at the least
    any type and degree gives)."""
    B = problem.batch_size
    pace = layer_pace(problem)
    if problem.pipelined and pace.size and np.isfinite(pace).all():
        pace = _around(problem, pace)
    slowest = float(pace.max()) if pace.size else 0.0
    return 0.0 if not np.isfinite(slowest) else (np.inf if slowest <= 0 else B / slowest)


def _around(problem: Problem, pace: np.ndarray) -> np.ndarray:
    """Per layer ``l``: the least time per micro-batch of a replica of any stage ``a..b`` holding it,
    ``Σ_{a..b} pace + edge[a] + edge[b + 1] + start``, where ``edge`` is a boundary's transfer at a share of
    one sample and its messages' latency. The sum splits into a term of ``a`` and one of ``b``, so the least
    over ``a ≤ l`` and over ``b ≥ l`` are a running minimum each."""
    start, _, message = problem.fixed_costs
    rate = min(float(view.boundary_rate.min()) for view in problem.views)
    edge = problem.boundary_bytes * rate / problem.batch_size + problem.boundary_messages * float(message.min())
    before = np.concatenate([[0.0], np.cumsum(pace)])  # time of layers 0..i-1
    left = np.minimum.accumulate(edge[:-1] - before[:-1])
    right = np.minimum.accumulate((before[1:] + edge[1:])[::-1])[::-1]
    return left + right + float(start.min())


BISECTION = 1e-3  # how close the units bound's least ruled-out throughput is found
# The units bound's forms (by_stages, by_sets) the certificate bisects in turn, cheapest and loosest first, each
# but the last to within BRACKET: it only narrows the next one's range
FORMS = ((False, False), (True, False), (True, True))
BRACKET = 1e-2


def speed_bound(problem: Problem, reached: float, cap: float, out_of_time: Callable[[], bool] = lambda: False) -> float:
    """No plan at any micro-batch the problem may choose is faster than this: at each choice the least of
    ``cap`` (a bound known already), its pace ceiling and the least throughput its units bound rules out
    (found to within :data:`BISECTION`; once ``out_of_time()``, the least ruled out so far, still a bound).
    ``reached``: a plan's throughput, where the search starts."""
    if not reached > 0:
        return cap
    proven, start = 0.0, reached * (1 + BISECTION)
    for batch in problem.micro_batch_choices:
        sub = problem.at_micro_batch(batch)
        top, lo = min(cap, pace_ceiling(sub)), max(proven, start)
        if not np.isfinite(top):  # nothing bounds this choice
            return np.inf
        if top <= lo or units_short(sub, lo) is not None:  # none at this choice passes top, or lo
            proven = max(proven, min(top, lo))
            continue
        # the cheaper forms first, each narrowing the next one's range: what they rule out the full bound does too
        forms = FORMS if several_sets(sub) else FORMS[:2]
        for i, form in enumerate(forms):
            top = _least_ruled_out(sub, (lo, top), form, BISECTION if i == len(forms) - 1 else BRACKET, out_of_time)
        proven = max(proven, top)
    return proven


def _least_ruled_out(problem: Problem, between, form, within: float, out_of_time: Callable[[], bool]) -> float:
    """Between ``lo``, which the units bound does not rule out, and ``top``, which it does (or a cap), the
    least throughput it rules out (its ``form``: by_stages, by_sets), to within ``within`` (a ratio), or
    the least so far once ``out_of_time()``."""
    (lo, top), (by_stages, by_sets) = between, form
    while top > lo * (1 + within) and not out_of_time():
        mid = float(np.sqrt(lo * top))
        lo, top = (lo, mid) if units_short(problem, mid, by_stages, by_sets) is not None else (mid, top)
    return top
