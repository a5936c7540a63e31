"""The policy-gradient loop the rl and tapp schedulers share: a scheduler brings an :class:`Agent`
(its networks, features and sampling), :func:`train` trains it against the cost model in named
phases (pre-train on a pool, REINFORCE on its own samples, polish), and :func:`finish` returns the
best plan ever scored. The phases and their measurements: docs/schedulers/rl.md.

Ctrl-C or the time limit ends a phase early and keeps the best plan; the run's notes say so.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import numpy as np
import torch
from torch import nn

from heterps_cli.objective import Objective, meets
from heterps_cli.plan import Plan, make_plan
from heterps_cli.problem import Problem
from heterps_cli.schedulers.base import Clock, Progress, SolveOptions, TrainingOptions, quiet
from heterps_cli.schedulers.cuts import RunCutter, cut_exactly, cut_scored
from heterps_cli.schedulers.local import budget_note, polish, polish_starts
from heterps_cli.schedulers.names import DEFAULT_STEPS, default_batch
from heterps_cli.schedulers.optimiser import Adam
from heterps_cli.schedulers.scoring import (
    Best,
    Evaluator,
    Provisioned,
    Reference,
    heuristic_schedules,
    random_schedules,
    rank_advantage,
    result,
    rewards,
    rewards_to_go,
)
from heterps_cli.stages import label_parts

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
    stop_at: float | None = None  # TrainingOptions.stop_at: a proven optimum's key, where training may stop
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
    # Score each sample by its runs cut into stages exactly (cuts.RunCutter), not by its maximal runs
    # only, where that exact step is cheap: the agent then learns type orders whose best cut wins.
    cut_runs: bool = True


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
    out_of_time: Callable[..., bool]  # out_of_time(ahead=0.0): see base.Clock.out_of_time
    notes: list[str] = field(default_factory=list)
    interrupted: bool = False


def configured(cfg, options: SolveOptions | None):
    """``cfg`` (a scheduler's Config) with the steps, batch and time limit the options give."""
    if options is None:
        return cfg
    steps, batch = (options.steps, options.batch) if isinstance(options, TrainingOptions) else (None, None)
    return dataclasses.replace(
        cfg,
        steps=steps if steps is not None else cfg.steps,
        batch=batch if batch is not None else cfg.batch,
        time_limit=options.time_limit,
        started=options.started,
        stop_at=options.stop_at if isinstance(options, TrainingOptions) else None,
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
    report = progress or quiet
    training = _Training(problem, cfg, make_agent, name, seed, start, pretrain, report, on_step)
    training.learn()
    if not training.met:  # a plan at the proven optimum has nothing to polish
        _polish(problem, cfg, training.agent, training.run, training.cutter, report, name)
    return training.agent, training.run


class _Training:
    """One run of :func:`train`'s training, phase by phase: pre-training on a pool (phase 1), then
    REINFORCE on the agent's own samples (phase 2); :func:`_polish` follows."""

    def __init__(self, problem, cfg, make_agent, name, seed, start, pretrain, report, on_step):
        self.problem, self.cfg, self.make_agent, self.name = problem, cfg, make_agent, name
        self.pretrain, self.report, self.on_step = pretrain, report, on_step
        self.rng = np.random.default_rng(seed)
        torch.manual_seed(seed)
        self.generator = torch.Generator().manual_seed(seed)
        self.agent = make_agent()
        self.optimiser = Adam(self.agent.parameters(), lr=cfg.lr)
        self.best, self.evaluate = Best(problem.objective), Evaluator(problem)
        self.cutter = RunCutter.of(problem) if cfg.cut_runs else None
        self.learned = Best(problem.objective)  # the agent's own samples only: the learning curve
        # The pool's cost grows with its schedules times their layers (docs/schedulers/rl.md).
        self.pool_size = min(cfg.pool, max(64, POOL_LAYERS // problem.n_layers))
        self.pool, self.scores = self.draw_pool()
        self.reference = Reference.of(self.scores)
        self.pool_reward = rewards(problem, self.scores, self.reference)
        clock = Clock(start if cfg.started is None else cfg.started, cfg.time_limit).out_of_time
        self.run = Run(self.best, self.evaluate, self.reference, self.rng, self.generator, start, clock)
        self.batch = cfg.batch if cfg.batch is not None else default_batch(problem.n_layers)
        self.met, self.cut_key = False, math.inf  # the proven optimum met; the best plan last cut exactly

    def step_on(self, loss: torch.Tensor) -> None:
        self.optimiser.zero_grad()
        (loss / self.problem.n_layers).backward()
        nn.utils.clip_grad_norm_(self.agent.parameters(), self.cfg.grad_clip)
        self.optimiser.step()

    # -- phase 1: pre-train on the best of a pool of random and heuristic schedules ------------------

    def draw_pool(self) -> tuple[np.ndarray, Provisioned]:
        pool = np.concatenate(
            [heuristic_schedules(self.problem), random_schedules(self.problem, self.pool_size, self.rng)]
        )
        pool, scores = self.score(pool)
        self.best.offer(self.problem, pool, scores)
        return pool, scores

    def score(self, schedules: np.ndarray, reference: Reference | None = None) -> tuple[np.ndarray, Provisioned]:
        """:func:`~.cuts.cut_scored` with this run's cutter and best plan."""
        return cut_scored(self.evaluate, self.cutter, schedules, self.best, reference)

    def pretrain_on_pool(self, completed: int = 0) -> float:
        """Fit the agent to the pool's elite; the seconds a training step may take, by the last one's."""
        cfg, pool = self.cfg, self.pool
        elite = pool[np.argsort(-self.pool_reward, kind="stable")[: max(8, len(pool) // 20)]]
        elite = torch.from_numpy(label_parts(self.problem.n_types, elite)[0])  # the type order, not the cuts
        took = 0.0
        for step in range(cfg.pretrain_steps if self.pretrain else 0):
            if self.run.out_of_time(took):
                self.run.notes.append(
                    f"pre-training stopped at the time limit after {step} of {cfg.pretrain_steps} steps"
                )
                break
            began = time.perf_counter()
            self.step_on(-self.agent.log_prob(elite).mean())
            took = time.perf_counter() - began
            self.report(
                f"{self.name}: pre-training {step + 1}/{cfg.pretrain_steps}", completed=completed, total=cfg.steps
            )
        return took * self.batch / len(elite)

    # -- phase 2: REINFORCE on the agent's own samples, imitating the best found so far ----------

    def begin(self, step: int = 0) -> None:
        """Lead with the pool's best-rewarded schedule, and count the agent's own best from its pool on:
        what it imitates, and what a restart waits on."""
        self.own = Best(self.problem.objective)
        self.own.offer(self.problem, self.pool, self.scores)
        self.leader, self.leader_reward = self.pool[int(np.argmax(self.pool_reward))], float(np.max(self.pool_reward))
        self.own_key, self.improved = self.own.key, step

    def restart(self, step: int) -> None:
        """A new agent from a new pool: an agent settles on one stage structure, and a new one often finds
        another (docs/schedulers/rl.md)."""
        self.report(f"{self.name}: no better sample in {self.cfg.restart_after} steps, starting a new agent")
        self.agent = self.make_agent()
        self.optimiser = Adam(self.agent.parameters(), lr=self.cfg.lr)
        self.pool, self.scores = self.draw_pool()
        self.pool_reward = rewards(self.problem, self.scores, self.reference)
        self.pretrain_on_pool(completed=step)
        self.begin(step)

    def learn(self) -> None:
        """Phases 1 and 2, until their steps are done, the time limit or Ctrl-C. On thousands of layers
        one step takes seconds: a step that the last one's duration says would end past the time limit
        is not started (before the first, the last pre-training step scaled to the batch stands in)."""
        cfg = self.cfg
        try:
            took = self.pretrain_on_pool()
            self.begin()
            for step in range(cfg.steps):
                if (why := _meets_optimum(self)) is not None:
                    self.met = True
                    self.run.notes.append(f"training stopped after {step} of {cfg.steps} steps (and the pre-training "
                                          f"pool): {why} the optimum the exact solver proves")  # fmt: skip
                    break
                if self.run.out_of_time(took):
                    self.run.notes.append(f"training stopped at the time limit after {step} of {cfg.steps} steps")
                    break
                if (
                    cfg.restart_after
                    and step - self.improved >= cfg.restart_after
                    and cfg.steps - step >= cfg.restart_after
                ):
                    self.restart(step)
                began = time.perf_counter()
                self.reinforce(step)
                took = time.perf_counter() - began
        except KeyboardInterrupt:
            self.run.interrupted = True
            self.run.notes.append("training interrupted (Ctrl-C): the best plan found so far")

    def reinforce(self, step: int) -> None:
        """One REINFORCE step on a batch of the agent's samples."""
        problem, cfg = self.problem, self.cfg
        actions, logp, entropy = self.agent.sample(self.batch, self.generator)
        schedules, scores = self.score(actions.numpy(), self.reference)
        self.best.offer(problem, schedules, scores)
        self.own.offer(problem, schedules, scores)
        if self.own.key < self.own_key:
            self.own_key, self.improved = self.own.key, step
        if self.on_step is not None:
            self.learned.offer(problem, schedules, scores)
        reward = rewards(problem, scores, self.reference)
        loss = _policy_loss(problem, cfg, step, logp, entropy, schedules, scores, self.reference, reward)
        if reward.max() > self.leader_reward:
            self.leader, self.leader_reward = schedules[int(reward.argmax())].copy(), float(reward.max())
        model = self.own.schedule if self.own.schedule is not None or not cfg.imitate_leader else self.leader
        if model is not None and cfg.imitation > 0:  # the type order: the cut is not the agent's to choose
            types = torch.from_numpy(label_parts(problem.n_types, model)[0])[None]
            loss = loss - cfg.imitation * self.agent.log_prob(types).mean()
        self.step_on(loss)
        feasible = f"{scores.feasible.mean():.0%} feasible"
        self.report(
            f"{self.name}: step {step + 1}/{cfg.steps} · best {self.best.shown} · {feasible}",
            completed=step + 1,
            total=cfg.steps,
        )
        if self.on_step is not None:
            self.on_step(step + 1, self.learned.key)


def _polish(problem: Problem, cfg: Config, agent, run: Run, cutter, report: Progress, name: str) -> None:
    """After training: the agent's greedy decode, then a local search from the most promising schedules
    (:func:`~.local.polish`), more of it where nothing feasible was sampled."""
    sampled_feasible = run.best.schedule is not None  # before the polish: the pool or the agent found one
    greedy, scores = cut_scored(run.evaluate, cutter, agent.greedy(), run.best, run.reference)
    run.best.offer(problem, greedy, scores)
    report(f"{name}: polishing the best schedules", completed=cfg.steps, total=cfg.steps)
    try:
        stopped = polish(
            problem,
            run.evaluate,
            run.best,
            run.reference,
            run.rng,
            starts=polish_starts(problem, run.evaluate, run.reference, cfg.polish_starts),
            kicks=cfg.kicks,
            extra_kicks=0 if sampled_feasible else cfg.extra_kicks,
            windows=True,
            repair_again=True,
            out_of_time=run.out_of_time,
            progress=report,
            name=name,
            cutter=cutter,
        )
        if stopped and not run.out_of_time():
            run.notes.append(budget_note(problem))
    except KeyboardInterrupt:
        run.interrupted = True
        run.notes.append("polish interrupted (Ctrl-C): the best plan found so far")


def _policy_loss(
    problem: Problem,
    cfg: Config,
    step: int,
    logp: torch.Tensor,
    entropy: torch.Tensor,
    schedules: np.ndarray,
    scores: Provisioned,
    reference: Reference,
    reward: np.ndarray,
) -> torch.Tensor:
    """REINFORCE's loss on one batch of samples: rank-normalised advantages (under the cost objective,
    each layer's choice credited with the reward to go: :func:`rewards_to_go`), less this step's share
    of the decaying entropy bonus."""
    if logp.dim() == 2 and cfg.credit_to_go and problem.objective is Objective.COST:
        advantage = rank_advantage(rewards_to_go(problem, schedules, scores, reference, reward))
        loss = -(torch.from_numpy(advantage).float() * logp).sum(dim=1).mean()
    else:
        logp = logp.sum(dim=1) if logp.dim() == 2 else logp
        loss = -(torch.from_numpy(rank_advantage(reward)).float() * logp).mean()
    beta = cfg.entropy_start + (cfg.entropy_end - cfg.entropy_start) * step / max(cfg.steps - 1, 1)
    return loss - beta * entropy.mean()


def _meets_optimum(training: _Training) -> str | None:
    """Where training has a proven optimum to stop at: whether its best plan meets it, or the exact cut
    of that plan's runs into stages does (:func:`~.cuts.cut_exactly`, the step the search's plan takes
    after training; 18 ms on 16 layers, asked once each time the best plan changes); None where not."""
    target, best = training.cfg.stop_at, training.best
    if target is None or best.schedule is None:
        return None
    if meets(best.key, target):
        return "its plan meets"
    if best.key == training.cut_key:
        return None
    training.cut_key = best.key
    plan = make_plan(training.problem, best.schedule, best.replicas, scheduler=training.name)
    cut = cut_exactly(training.problem, plan, None)
    if cut.feasible and meets(training.problem.objective.key_of(cut), target):
        return "the exact cut of its plan's runs meets"
    return None


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
