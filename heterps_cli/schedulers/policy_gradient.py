"""The policy-gradient loop the rl and tapp schedulers share, read top to bottom.

A scheduler brings an :class:`Agent` (its networks, its features and how it
samples); this module trains it against the cost model and returns the best plan:

* **phase 1, pre-train** (the HeterPS paper's phase 1): score a pool of random
  schedules and the simple heuristics, and fit the agent to the best of them
  by likelihood. The pool also sets the reward reference.
* **phase 2, train**: REINFORCE on the agent's own samples, with rank-normalised
  advantages (the batch's own ranking is the baseline), an entropy bonus that
  decays linearly, self-imitation of the best schedule found so far (which keeps
  what was learned from being lost to noise), and gradient clipping. Each batch
  is scored in one vectorised call, each distinct schedule once. An agent with
  per-layer log-probabilities may take per-layer credit (``credit_to_go``) and
  imitate the least infeasible sample while none is feasible (``imitate_leader``),
  and be replaced by a new agent, pre-trained on a new pool, once its samples stop
  improving (``restart_after``): rl does all three, tapp none.
* **polish**: the agent's greedy decode is scored, then a local search runs from
  the most promising schedules seen (more kicks when no feasible plan was sampled),
  ending with a re-plan of every window of layers (:func:`~heterps_cli.schedulers.local.window_search`).

The best feasible plan ever scored is kept throughout. Ctrl-C or the time limit
ends a phase early and keeps that plan; the run's notes say so.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import numpy as np
import torch
from torch import nn

from heterps_cli.plan import Plan
from heterps_cli.problem import Problem
from heterps_cli.schedulers.base import Progress, SolveOptions, quiet
from heterps_cli.schedulers.local import budget_note, polish, polish_starts
from heterps_cli.schedulers.names import DEFAULT_STEPS, default_batch
from heterps_cli.schedulers.optimiser import Adam
from heterps_cli.schedulers.scoring import (
    Best,
    Evaluator,
    Provisioned,
    Reference,
    deadline,
    heuristic_schedules,
    random_schedules,
    rank_advantage,
    result,
    rewards,
    rewards_to_go,
)

HINT = "give it more --steps"


POOL_LAYERS = 250_000  # random pool schedules times layers, at most (but never fewer than 64 schedules)


@dataclass(frozen=True)
class Config:
    steps: int = DEFAULT_STEPS
    batch: int | None = None  # schedules sampled per step (None: names.default_batch for the model's depth)
    hidden: int = 64
    lr: float = 3e-3
    entropy_start: float = 0.1  # decays linearly to entropy_end over the steps
    entropy_end: float = 0.01
    grad_clip: float = 1.0
    imitation: float = 0.05  # weight of the self-imitation term in phase 2
    pool: int = 1024  # random schedules scored for pre-training (fewer on long models: POOL_LAYERS)
    pretrain_steps: int = 20
    time_limit: float | None = None
    started: float | None = None  # SolveOptions.started
    polish_starts: int = 5  # local searches at the end, one per distinct stage-type sequence
    kicks: int = 20  # then perturb-and-descend rounds from the best plan (iterated local search)
    extra_kicks: int = 60  # more of them when no feasible plan was sampled (learning failed)
    # Per-layer credit (scoring.rewards_to_go) for an agent whose log-probabilities are per layer:
    # each layer's choice is judged by the cost of the stages it can change, not by the whole plan's.
    credit_to_go: bool = False
    # While no plan is feasible, imitate the least infeasible schedule sampled so far.
    imitate_leader: bool = False
    # Start a new agent (a new pool, pre-trained again) once the agent's samples have not improved on
    # its own best for this many steps, while as many steps remain (0: never).
    restart_after: int = 0


class Agent(Protocol):
    """A policy over schedules of one problem, as the loop sees it."""

    def parameters(self) -> Iterator[nn.Parameter]: ...

    def sample(self, batch: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``batch`` schedules ``[B, n]`` with their log-probabilities (``[B]``, or ``[B, n]`` per layer)
        and entropies ``[B]``, differentiable."""
        ...

    def log_prob(self, schedules: torch.Tensor) -> torch.Tensor:
        """The log-probabilities ``[B]`` of given schedules ``[B, n]`` (teacher-forced, differentiable)."""
        ...

    def greedy(self) -> np.ndarray:
        """The most likely schedule, ``[1, n]``."""
        ...


A = TypeVar("A", bound=Agent)


@dataclass
class Run:
    """Where a training run stands: what it found and what a scheduler may go on with."""

    best: Best
    evaluate: Evaluator
    reference: Reference
    rng: np.random.Generator
    generator: torch.Generator
    start: float
    out_of_time: Callable[..., bool]  # out_of_time(ahead=0.0): see scoring.deadline
    notes: list[str] = field(default_factory=list)
    interrupted: bool = False


def configured(cfg, options: SolveOptions | None):
    """``cfg`` (a scheduler's Config) with the steps, batch and time limit the options give."""
    if options is None:
        return cfg
    return dataclasses.replace(
        cfg,
        steps=options.steps if options.steps is not None else cfg.steps,
        batch=options.batch if options.batch is not None else cfg.batch,
        time_limit=options.time_limit,
        started=options.started,
    )


@contextmanager
def one_thread() -> Iterator[None]:
    """Small nets: one thread is as fast, and the results do not depend on the core count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def train(
    problem: Problem,
    cfg: Config,
    make_agent: Callable[[], A],
    *,
    name: str,
    seed: int,
    start: float,
    pretrain: bool = True,
    progress: Progress | None = None,
    on_step: Callable[[int, float], None] | None = None,
) -> tuple[A, Run]:
    """Train the agent ``make_agent`` builds (after seeding) on ``problem``; the agent and the run.

    ``pretrain=False`` skips phase 1's fitting (a warm-started agent) but still
    scores the pool. ``on_step(step, best)`` is called after every training step
    with the best objective key among the agent's own samples (cost, or minus
    throughput; inf while none is feasible): the learning curve.
    """
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    agent = make_agent()
    optimiser = Adam(agent.parameters(), lr=cfg.lr)
    best, evaluate = Best(problem.objective), Evaluator(problem)
    learned = Best(problem.objective)  # the agent's own samples only: the learning curve
    report = progress or quiet

    def step_on(loss: torch.Tensor) -> None:
        optimiser.zero_grad()
        (loss / problem.n_layers).backward()
        nn.utils.clip_grad_norm_(agent.parameters(), cfg.grad_clip)
        optimiser.step()

    # -- phase 1: pre-train on the best of a pool of random and heuristic schedules ------------------
    # The pool's cost grows with its schedules times their layers: on 2,000 layers 1,024 random
    # schedules took 18 s to provision, and random ones that long are poor targets anyway. Up to
    # 244 layers (every benchmark instance) the pool is cfg.pool, as before.
    size = min(cfg.pool, max(64, POOL_LAYERS // problem.n_layers))

    def draw_pool() -> tuple[np.ndarray, Provisioned]:
        pool = np.concatenate([heuristic_schedules(problem), random_schedules(problem, size, rng)])
        scores = evaluate(pool)
        best.offer(problem, pool, scores)
        return pool, scores

    def pretrain_on(pool: np.ndarray, pool_reward: np.ndarray, completed: int = 0) -> float:
        """Fit the agent to the pool's elite; the seconds a training step may take, by the last one's."""
        elite = torch.from_numpy(pool[np.argsort(-pool_reward, kind="stable")[: max(8, len(pool) // 20)]])
        took = 0.0
        for step in range(cfg.pretrain_steps if pretrain else 0):
            if run.out_of_time(took):
                run.notes.append(f"pre-training stopped at the time limit after {step} of {cfg.pretrain_steps} steps")
                break
            began = time.perf_counter()
            step_on(-agent.log_prob(elite).mean())
            took = time.perf_counter() - began
            report(f"{name}: pre-training {step + 1}/{cfg.pretrain_steps}", completed=completed, total=cfg.steps)
        return took * batch / len(elite)

    pool, scores = draw_pool()
    reference = Reference.of(scores)
    pool_reward = rewards(problem, scores, reference)
    run = Run(best, evaluate, reference, rng, generator, start, deadline(start, cfg.time_limit, cfg.started))
    batch = cfg.batch if cfg.batch is not None else default_batch(problem.n_layers)
    # On thousands of layers one step takes seconds: a step that the last one's duration says
    # would end past the time limit is not started. Before the first training step, the last
    # pre-training step (a pass over the elite) scaled to the batch stands in for it.
    try:
        took = pretrain_on(pool, pool_reward)

        # -- phase 2: REINFORCE on the agent's own samples, imitating the best found so far ----------
        def begin(pool: np.ndarray, scores: Provisioned, pool_reward: np.ndarray) -> tuple[np.ndarray, float, Best]:
            """The pool's best-rewarded schedule, its reward, and the agent's own best since it
            started (with its pool): what it imitates, and what a restart waits on."""
            own = Best(problem.objective)
            own.offer(problem, pool, scores)
            return pool[int(np.argmax(pool_reward))], float(np.max(pool_reward)), own

        leader, leader_reward, own = begin(pool, scores, pool_reward)
        own_key, improved = own.key, 0
        for step in range(cfg.steps):
            if run.out_of_time(took):
                run.notes.append(f"training stopped at the time limit after {step} of {cfg.steps} steps")
                break
            if cfg.restart_after and step - improved >= cfg.restart_after and cfg.steps - step >= cfg.restart_after:
                # Measured: the agent's best comes by step 5-20 and then stays to step 120 (chain64x2,
                # chain64x3, chain32x2-tight); a new agent from a new pool often finds another stage structure.
                report(f"{name}: no better sample in {cfg.restart_after} steps, starting a new agent")
                agent = make_agent()
                optimiser = Adam(agent.parameters(), lr=cfg.lr)
                pool, scores = draw_pool()
                pool_reward = rewards(problem, scores, reference)
                pretrain_on(pool, pool_reward, completed=step)
                leader, leader_reward, own = begin(pool, scores, pool_reward)
                own_key, improved = own.key, step
            began = time.perf_counter()
            actions, logp, entropy = agent.sample(batch, generator)
            schedules = actions.numpy()
            scores = evaluate(schedules)
            best.offer(problem, schedules, scores)
            own.offer(problem, schedules, scores)
            if own.key < own_key:
                own_key, improved = own.key, step
            if on_step is not None:
                learned.offer(problem, schedules, scores)
            reward = rewards(problem, scores, reference)
            if logp.dim() == 2 and cfg.credit_to_go and problem.objective == "cost":
                advantage = rank_advantage(rewards_to_go(problem, schedules, scores, reference, reward))
                loss = -(torch.from_numpy(advantage).float() * logp).sum(dim=1).mean()
            else:
                logp = logp.sum(dim=1) if logp.dim() == 2 else logp
                loss = -(torch.from_numpy(rank_advantage(reward)).float() * logp).mean()
            beta = cfg.entropy_start + (cfg.entropy_end - cfg.entropy_start) * step / max(cfg.steps - 1, 1)
            loss = loss - beta * entropy.mean()
            if reward.max() > leader_reward:
                leader, leader_reward = schedules[int(reward.argmax())].copy(), float(reward.max())
            model = own.schedule if own.schedule is not None or not cfg.imitate_leader else leader
            if model is not None and cfg.imitation > 0:
                loss = loss - cfg.imitation * agent.log_prob(torch.from_numpy(model)[None]).mean()
            step_on(loss)
            report(
                f"{name}: step {step + 1}/{cfg.steps} · best {best.shown} · {scores.feasible.mean():.0%} feasible",
                completed=step + 1,
                total=cfg.steps,
            )
            if on_step is not None:
                on_step(step + 1, learned.key)
            took = time.perf_counter() - began
    except KeyboardInterrupt:
        run.interrupted = True
        run.notes.append("training interrupted (Ctrl-C): the best plan found so far")

    # -- polish: the greedy decode, then a local search from the most promising schedules -----------
    sampled_feasible = best.schedule is not None  # before the polish: the pool or the agent found one
    greedy = agent.greedy()
    best.offer(problem, greedy, evaluate(greedy))
    report(f"{name}: polishing the best schedules", completed=cfg.steps, total=cfg.steps)
    try:
        stopped = polish(
            problem,
            evaluate,
            best,
            reference,
            rng,
            starts=polish_starts(problem, evaluate, reference, cfg.polish_starts),
            kicks=cfg.kicks,
            extra_kicks=0 if sampled_feasible else cfg.extra_kicks,
            windows=True,
            repair_again=True,
            out_of_time=run.out_of_time,
            progress=report,
            name=name,
        )
        if stopped and not run.out_of_time():
            run.notes.append(budget_note(problem))
    except KeyboardInterrupt:
        run.interrupted = True
        run.notes.append("polish interrupted (Ctrl-C): the best plan found so far")
    return agent, run


def finish(problem: Problem, run: Run, *, name: str, seed: int) -> Plan:
    """The run's best plan (or why there is none)."""
    return result(
        problem,
        run.best,
        run.evaluate,
        scheduler=name,
        seed=seed,
        start=run.start,
        notes=run.notes,
        hint=HINT,
        interrupted=run.interrupted,
    )
