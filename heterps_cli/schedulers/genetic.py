"""The genetic scheduler: a genetic algorithm over schedules (a resource type per layer).

* **Population** of :data:`POPULATION` schedules, started from the simple
  heuristics and random segment schedules; each generation is scored in one
  vectorised exact-provisioning call (each distinct schedule once per run) and
  ranked by the same reward as the rl scheduler (cheaper feasible > dearer
  feasible > infeasible, graded by the miss).
* **Selection**: tournaments of :data:`TOURNAMENT`; the :data:`ELITE` best
  schedules pass unchanged (elitism).
* **Crossover** respects the chain: two-point, the child takes one parent's
  layers outside ``[a, b)`` and the other's inside, so stages of both parents
  survive as contiguous runs.
* **Mutation** flips one layer to another type it can run on, or shifts a
  stage boundary by 1-3 layers (the neighbouring stage grows over it).
* **Budget**: cost-model evaluations (``SearchOptions.evaluations``; ``compare``
  gives it what rl used) and a time limit; it also stops when :data:`PATIENCE`
  generations in a row find no better plan (converged).
"""

from __future__ import annotations

import numpy as np

from heterps_cli.plan import Plan
from heterps_cli.problem import Problem
from heterps_cli.schedulers.base import Progress, SolveOptions
from heterps_cli.schedulers.scoring import (
    Evaluator,
    Reference,
    Search,
    alphabet,
    codes,
    evaluation_budget,
    heuristic_schedules,
    random_schedules,
    rewards,
)

POPULATION = 64
ELITE = 4
TOURNAMENT = 3
CROSSOVER = 0.9  # probability that a child is a crossover rather than a copy of one parent
PATIENCE = 50


def crossover(a: np.ndarray, b: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Two-point crossover of rows of ``a`` and ``b``: ``a`` outside a random window, ``b`` inside it."""
    n = a.shape[1]
    ends = np.sort(rng.integers(0, n + 1, size=(len(a), 2)), axis=1)
    layer = np.arange(n)[None, :]
    return np.where((layer >= ends[:, :1]) & (layer < ends[:, 1:]), b, a)


def mutate(problem: Problem, schedule: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Flip one layer's type (and tensor-parallel degree, section 1h), or shift one stage boundary by
    1-3 layers; stays runnable."""
    labels, usable = alphabet(problem, degrees=True)
    row = schedule.copy()
    bounds = np.flatnonzero(np.diff(row)) + 1
    if bounds.size and rng.random() < 0.5:
        m = int(rng.choice(bounds))
        shift = int(rng.integers(1, 4))
        if rng.random() < 0.5:  # the left stage grows rightwards
            span = slice(m, min(m + shift, len(row)))
            row[span] = row[m - 1]
        else:
            span = slice(max(m - shift, 0), m)
            row[span] = row[m]
        if usable[np.arange(len(row)), codes(problem, row)].all():
            return row
        row = schedule.copy()
    layer = int(rng.integers(0, len(row)))
    others = np.flatnonzero(usable[layer])
    others = others[labels[others] != row[layer]]
    if others.size:
        row[layer] = labels[rng.choice(others)]
    return row


def solve(
    problem: Problem, *, seed: int = 0, progress: Progress | None = None, options: SolveOptions | None = None
) -> Plan:
    search = Search.begin(problem, seed, progress, options)
    rng, evaluate, best = search.rng, search.evaluate, search.best
    budget = evaluation_budget(options)
    heuristics = heuristic_schedules(problem, degrees=True)
    drawn = random_schedules(problem, max(POPULATION - len(heuristics), 0), rng, degrees=True)
    population = np.concatenate([heuristics, drawn])
    population = population[:POPULATION] if budget >= POPULATION else population[: max(budget, 1)]
    scored = evaluate(population)
    reference = Reference.of(scored)
    notes, generation, stale, dry = [], 0, 0, 0
    while evaluate.evaluations < budget and stale < PATIENCE:
        if search.out_of_time():
            notes.append(f"stopped at the time limit after {generation} generations")
            break
        if dry >= PATIENCE:  # no new schedule for a while: a small (or memory-narrowed) space, used up
            notes.append(f"only {evaluate.evaluations:,} distinct schedules found in {generation} generations")
            break
        before = evaluate.evaluations
        key = best.key
        best.offer(problem, population, scored)
        stale = stale + 1 if best.schedule is not None and best.key >= key else 0
        fitness = rewards(problem, scored, reference)
        elite = population[np.argsort(-fitness, kind="stable")[:ELITE]]
        count = len(population) - len(elite)
        mothers, fathers = population[_tournament(fitness, count, rng)], population[_tournament(fitness, count, rng)]
        crossed = np.where((rng.random(count) < CROSSOVER)[:, None], crossover(mothers, fathers, rng), mothers)
        # a population no larger than its elite (a space of a few schedules) breeds no children
        children = np.stack([mutate(problem, row, rng) for row in crossed]) if count else population[:0]
        population = _within_budget(np.concatenate([elite, children]), evaluate, budget, len(elite))
        scored = evaluate(population)
        dry = dry + 1 if evaluate.evaluations == before else 0
        generation += 1
        search.report(
            f"genetic: generation {generation} · best {best.shown}",
            completed=min(evaluate.evaluations, budget),
            total=budget,
        )
    best.offer(problem, population, scored)
    if stale >= PATIENCE:
        notes.append(f"converged: no better plan in the last {PATIENCE} generations")
    return search.result("genetic", notes, hint="give it more --evaluations")


def _tournament(fitness: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """Indices of ``count`` tournament winners, each the fittest of TOURNAMENT random entrants."""
    entrants = rng.integers(0, len(fitness), size=(count, TOURNAMENT))
    return entrants[np.arange(count), np.argmax(fitness[entrants], axis=1)]


def _within_budget(children: np.ndarray, evaluate: Evaluator, budget: int, keep: int) -> np.ndarray:
    """Replace the new schedules past the budget by copies of the elite, so the count is exact."""
    left = budget - evaluate.evaluations
    seen: set[bytes] = set()
    for i in range(keep, len(children)):
        key = evaluate.key(children[i])
        if key in evaluate.cache or key in seen:
            continue
        if len(seen) >= left:
            children[i] = children[i % keep]
        else:
            seen.add(key)
    return children
