"""The rules of the engines a plan exports to (``heterps export``, ``heterps plan --engine``; docs/spec.md
section 1k, docs/guide/engines.md).

Each engine runs a pipeline whose stages all take one tensor-parallel degree and one data-parallel
degree (the replicas, which split each micro-batch evenly), with recomputation set once for every stage
where it sets it so, and no stage mixing types. :func:`best_within` plans within an engine's rules: the
exact optimum under each shape its rules leave open (every degree the profile times, every replica count
that splits the micro-batch, recomputation on and off), the best of them by the objective; exact over
the engine's plans since every plan it runs has one of those shapes.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

import numpy as np

from heterps_cli.costmodel import better
from heterps_cli.errors import InfeasibleError, InputError
from heterps_cli.formats import Plan
from heterps_cli.formulas import SLACK, amdahl
from heterps_cli.objective import Objective
from heterps_cli.problem import Problem
from heterps_cli.schedulers.base import Progress, SolveOptions
from heterps_cli.shape import Shape, constrained


@dataclass(frozen=True)
class Rules:
    name: str
    title: str
    one_degree: bool = True  # every stage at one tensor-parallel degree
    one_replicas: bool = True  # every stage at one data-parallel degree
    one_recompute: bool = True  # recomputation on for every stage or for none
    tp: bool = True  # tensor parallelism at all (above 1)
    replicas: bool = True  # data parallelism at all (above 1)
    recompute: bool = True  # recomputation at all


ENGINES = {
    "megatron": Rules("megatron", "Megatron-LM"),
    "torchtitan": Rules("torchtitan", "torchtitan"),
    # DeepSpeed's PipelineModule has no tensor parallelism of its own (Megatron-DeepSpeed adds it)
    "deepspeed": Rules("deepspeed", "DeepSpeed", tp=False),
    # the export's script: a pipeline per replica, each stage its replicas' gradients averaged; no tp, no recompute
    "pipelining": Rules("pipelining", "torch.distributed.pipelining", tp=False, recompute=False),
}


def unfit(plan: Plan, rules: Rules) -> list[str]:
    """What in ``plan`` the engine cannot express, one phrase each."""
    out = []
    first = plan.stages[0]
    for i, s in enumerate(plan.stages):
        if s.joined:
            out.append(f"stage {i} mixes types")
        if not rules.tp and (s.tp or 1) > 1:
            out.append(f"stage {i} runs at tp {s.tp}")
        elif rules.one_degree and (s.tp or 1) != (first.tp or 1):
            out.append(f"stage {i} runs at tp {s.tp or 1}, stage 0 at {first.tp or 1} (one tensor-parallel degree)")
        if not rules.replicas and s.replicas > 1:
            out.append(f"stage {i} has {s.replicas} replicas (one process a stage)")
        elif rules.one_replicas and s.replicas != first.replicas:
            out.append(f"stage {i} has {s.replicas} replicas, stage 0 {first.replicas} (one data-parallel degree)")
        if not rules.recompute and s.recompute:
            out.append(f"stage {i} recomputes its activations")
        elif rules.one_recompute and bool(s.recompute) != bool(first.recompute):
            out.append(f"stage {i} {'recomputes' if s.recompute else 'does not recompute'} (one setting for all)")
    if rules.one_replicas and plan.batch_size % first.replicas:
        out.append(f"the micro-batch of {plan.batch_size} does not split evenly over {first.replicas} replicas")
    return out


def placement(plan: Plan) -> list[str]:
    """Which ranks run which stage on which type, where the stages' types differ: the engines' meshes put
    the pipeline outermost, so stage ``s`` holds ranks ``s * R`` to ``(s + 1) * R - 1``, ``R`` its replicas
    times its degree (docs/spec.md section 1k)."""
    if len({s.resource for s in plan.stages}) == 1:
        return []
    width = plan.stages[0].replicas * (plan.stages[0].tp or 1)
    return [f"stage {i}: ranks {i * width}-{(i + 1) * width - 1} on {s.resource}" for i, s in enumerate(plan.stages)]


def shapes(problem: Problem, rules: Rules, shape: Shape) -> list[Shape]:
    """Every shape within ``shape`` that the engine's rules leave open: one degree, one replica count
    (dividing a micro-batch the plan may take) and recomputation on or off for every stage."""
    degrees = [d for d in problem.degrees if (rules.tp or d == 1) and d <= (shape.max_tp or d)]
    if shape.tp is not None:
        degrees = [shape.tp]
    batches = problem.micro_batch_choices
    units = int(problem.limits.sum())
    if shape.replicas is not None:
        counts = [shape.replicas]
    elif rules.replicas:
        counts = [k for k in range(1, min(max(batches), units) + 1) if any(b % k == 0 for b in batches)]
    else:
        counts = [1]
    if shape.recompute is not None:
        again: list[bool | None] = [shape.recompute]
    elif not rules.recompute:
        again = [False]
    else:
        again = [False, True] if problem.can_recompute else [None]
    return [shape.but(tp=d, replicas=k, recompute=a) for d in degrees for k in counts if d * k <= units for a in again]


def speed_bound(problem: Problem, shape: Shape) -> float:
    """No plan of ``shape`` (its degree and replicas fixed) is faster than this, at any micro-batch it may
    take. Each layer's micro-batch takes at least its compute on the shape's replicas of its fastest type,
    ``c = serial + parallel / k`` (sections 1, 1d and 1h); a stage runs each of its layers, so no plan is
    faster than ``B / max c``; and the stages, at most ``S`` (each ``k x tp`` units of one type), share all
    of them, so the slowest takes at least ``sum c / S``: none is faster than ``B S / sum c`` either."""
    if shape.replicas is None or shape.tp is None:
        return math.inf
    best = 0.0
    for batch in problem.micro_batch_choices:
        try:
            view = problem.at_micro_batch(batch).view_at(shape.tp)
        except ValueError:
            continue
        serial, parallel, _, _ = view.parts
        stages = float((problem.limits // (shape.replicas * shape.tp)).sum())
        with np.errstate(divide="ignore", invalid="ignore"):
            least = np.where(view.runnable, amdahl(serial, parallel, float(shape.replicas)), np.inf).min(axis=1)
            best = max(best, float(np.float64(batch) * min(1.0 / least.max(), stages / least.sum())))
    return best


def best_within(
    problem: Problem,
    rules: Rules,
    shape: Shape,
    *,
    seed: int = 0,
    progress: Progress | None = None,
    options: SolveOptions | None = None,
) -> Plan:
    """The exact optimum among the plans the engine runs (within ``shape``), its notes saying which shape
    it has; InfeasibleError where the engine runs none."""
    from heterps_cli.schedulers import solve
    from heterps_cli.schedulers.base import Clock

    best: Plan | None = None
    tried = shapes(problem, rules, shape)
    bounds = {each: speed_bound(problem, each) for each in tried}
    tried.sort(key=lambda each: -bounds[each])  # the fastest shapes first: the rest are often passed over
    proven = True
    start = time.perf_counter()
    options = dataclasses.replace(options or SolveOptions(), mixed_stages=False)  # no engine mixes a stage
    clock = Clock.of(options, start)
    searched = 0
    for i, each in enumerate(tried):
        if progress:
            progress(f"{rules.title}: {each.said()}", i, len(tried))
        if bounds[each] < problem.min_throughput * (1 - SLACK):
            continue  # no plan of this shape reaches the job's throughput
        if best is not None and problem.objective is Objective.TIME and bounds[each] < best.throughput * (1 - SLACK):
            break  # none of this shape, nor of any after it, is as fast as the best found
        if best is not None and clock.out_of_time():
            proven = False  # the shapes left are not searched: the plan is the best of those that were
            break
        searched += 1
        try:
            found = solve("exact", constrained(problem, each), seed=seed, options=options)
        except InfeasibleError:
            proven = proven and not clock.out_of_time()  # none in time is not none at all
            continue
        except InputError:
            continue  # a shape the profile cannot run (no layer timed at that degree, or recomputing)
        proven = proven and bool(found.optimal)
        if best is None or better(problem, found.cost_usd, found.throughput, best.cost_usd, best.throughput):
            best = found
    if best is None:
        raise InfeasibleError(f"{rules.title} runs no plan that meets the job on this cluster within its rules "
                              f"(one tensor-parallel and one data-parallel degree for every stage; {len(tried)} "
                              "shapes tried): see docs/guide/engines.md")  # fmt: skip
    assert not unfit(best, rules), unfit(best, rules)
    said = f"--engine {rules.name}: the best plan {rules.title} runs (of its {len(tried)} shapes, {searched} searched "
    said += "exactly, no plan of the others as good by a bound)" if proven else (
        "within the time limit: not proven the best of its plans)")  # fmt: skip
    took = time.perf_counter() - start
    return best.but(optimal=proven, gap=best.gap if proven else None, notes=[*best.notes, said], solve_s=took)


def against_free(engine_plan: Plan, free: Plan | None, rules: Rules, objective: Objective, explain: bool) -> list[str]:
    """The notes that say how far the engine's best plan is from heterps's own best (``free``, None where
    heterps's runner has none either), and with ``explain`` which of the engine's rules bind: those
    heterps's best plan breaks."""
    from heterps_cli.figures import count, usd

    if free is None:
        return [f"--engine {rules.name}: heterps run's best plan was not found to set beside it (none meets the "
                "job, or none within the time limit)"]  # fmt: skip
    if objective is Objective.TIME:
        gap = free.throughput / engine_plan.throughput - 1 if engine_plan.throughput > 0 else float("inf")
        said = (f"{rules.title}'s best plan trains {count(engine_plan.throughput, 1)} samples/s, heterps run's best "
                f"{count(free.throughput, 1)} ({gap:+.1%} faster)")  # fmt: skip
    else:
        gap = engine_plan.cost_usd / free.cost_usd - 1 if free.cost_usd > 0 else 0.0
        said = (f"{rules.title}'s best plan costs {usd(engine_plan.cost_usd)}, heterps run's best "
                f"{usd(free.cost_usd)} (the engine's rules cost {gap:+.1%})")  # fmt: skip
    notes = [f"--engine {rules.name}: {said}"]
    if explain:
        bind = unfit(free, rules) if gap > SLACK else []
        what = "the rules that bind, as heterps run's best plan breaks them: " + "; ".join(bind)
        notes.append(f"--engine {rules.name}: " + (what if bind else "no rule binds: the engine runs a plan as good "
                                                   "as heterps run's best"))  # fmt: skip
    return notes


__all__ = ["ENGINES", "Rules", "against_free", "best_within", "placement", "shapes", "speed_bound", "unfit"]
