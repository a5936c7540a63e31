"""What the two policy-gradient schedulers, rl and tapp, share around their own networks.

Both read their budget from the same options, train small networks on one
thread, pre-train on the best of a pool of random schedules (the HeterPS
paper's phase 1), and end with the same local-search polish.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import torch

from heterps_cli.problem import Problem
from heterps_cli.schedulers.local import polish, polish_starts
from heterps_cli.schedulers.scoring import Best, Evaluator, Reference, heuristic_schedules, random_schedules, rewards


def configured(cfg, options):
    """``cfg`` (a scheduler's Config) with the steps, batch and time limit the options give."""
    if options is None:
        return cfg
    return dataclasses.replace(cfg, steps=options.steps if options.steps is not None else cfg.steps,
                               batch=options.batch if options.batch is not None else cfg.batch,
                               time_limit=options.time_limit)


@contextmanager
def one_thread() -> Iterator[None]:
    """Small nets: one thread is as fast, and the results do not depend on the core count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def pretraining_pool(problem: Problem, evaluate: Evaluator, best: Best, rng: np.random.Generator,
                     size: int) -> tuple[Reference, torch.Tensor]:
    """The heuristics and ``size`` random schedules, scored (``best`` sees them): the reward
    reference they set, and the best twentieth of them (at least 8) to pre-train on."""
    pool = np.concatenate([heuristic_schedules(problem), random_schedules(problem, size, rng)])
    scores = evaluate(pool)
    best.offer(problem, pool, scores)
    reference = Reference.of(scores)
    elite = pool[np.argsort(-rewards(problem, scores, reference), kind="stable")[: max(8, len(pool) // 20)]]
    return reference, torch.from_numpy(elite)


def polish_best(problem: Problem, evaluate: Evaluator, best: Best, reference: Reference, rng: np.random.Generator,
                cfg, *, sampled_feasible: bool, out_of_time: Callable[[], bool], notes: list[str]) -> bool:
    """The local search from the most promising schedules scored; more kicks when training sampled
    no feasible plan. Ctrl-C stops it and keeps the best plan so far (and returns False)."""
    try:
        polish(problem, evaluate, best, reference, rng,
               starts=polish_starts(problem, evaluate, reference, cfg.polish_starts),
               kicks=cfg.kicks, extra_kicks=0 if sampled_feasible else cfg.extra_kicks, out_of_time=out_of_time)
    except KeyboardInterrupt:
        notes.append("polish interrupted (Ctrl-C): the best plan found so far")
        return False
    return True
