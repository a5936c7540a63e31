"""The TAPP scheduler (Mao et al., Appl. Sci. 2021): a partition network groups layers, an
attention network allocates groups to resource types; both trained jointly by policy gradient.

Read top to bottom: encoding, the two networks, sampling, training, solve.

* **Encoding** of a layer: its kind as a learned word vector (a dictionary of the
  known kinds, :data:`~heterps_cli.schedulers.features.KINDS`, and "unknown"); the
  numbers the rl scheduler reads (relative position, log input and weight
  sizes, per type log OCT, log ODT, log price x OCT, can-run: the paper's
  "parameter metrics", with OCT standing in for GFLOPs); and the relative index
  of the next connected layer (in a chain, the next one; none after the last).
* **Partition network** (feed-forward): per layer, the probability that a new
  group *starts* at that layer. A layer's group is the number of starts up to
  it, so the group sequence is non-decreasing and every group is contiguous by
  construction, as a pipeline needs. Layer 0 always starts group 0. Two rules
  keep every sample valid and are applied while sampling (a forced choice
  carries no log-probability): a layer that shares no resource type with its
  group so far starts a new group, and once :attr:`Config.groups` groups are
  open no unforced new one starts.
* **Allocation network**: each group's vector is the mean of its layers'
  encodings plus a one-hot of the group it feeds (the next; the last feeds
  none). One multi-head self-attention layer over all groups of the sample,
  then a softmax over the types every layer of the group can run on.
  Consecutive groups on the same type form one stage (docs/spec.md section 1);
  replicas come from exact provisioning.
* **Training** is the loop rl uses (:mod:`heterps_cli.schedulers.policy_gradient`): rank-normalised
  REINFORCE on the *sum* of both networks' log-probabilities, a decaying
  entropy bonus, gradient clipping, pre-training on the best of a random pool,
  self-imitation of the best plan found, the best feasible plan ever sampled
  kept, and the same local-search polish at the end. TAPP's own objective is
  the time of one batch, so ``--objective time`` is this scheduler's default.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import cast

import numpy as np
import torch
from torch import nn

from heterps_cli.plan import Plan
from heterps_cli.problem import Problem
from heterps_cli.schedulers import policy_gradient
from heterps_cli.schedulers.base import Progress, SolveOptions
from heterps_cli.schedulers.features import (
    KIND_COLUMNS,
    KINDS,
    kind_index,
    layer_features,
)


@dataclass(frozen=True)
class Config(policy_gradient.Config):
    groups: int = 12  # G: the most groups the partition network opens by choice
    word: int = 8  # width of the learned kind vectors
    heads: int = 2


# -- encoding -------------------------------------------------------------------


def encoding(problem: Problem) -> tuple[torch.Tensor, torch.Tensor]:
    """(kind index per layer ``[n]``, numbers per layer ``[n, F]``); see the module docstring."""
    kinds = torch.tensor([kind_index(k) for k in problem.layer_kinds])
    n = problem.n_layers
    numbers = np.delete(layer_features(problem), np.r_[KIND_COLUMNS], axis=1)  # the word vector replaces it
    following = np.where(np.arange(n) + 1 < n, (np.arange(n) + 1) / max(n - 1, 1), -1.0)[:, None]
    return kinds, torch.from_numpy(np.concatenate([numbers, following], axis=1).astype(np.float32))


# -- the two networks -------------------------------------------------------------


class Networks(nn.Module):
    def __init__(self, numbers: int, n_types: int, cfg: Config):
        super().__init__()
        self.groups = cfg.groups
        self.words = nn.Embedding(len(KINDS) + 1, cfg.word)
        width = cfg.word + numbers
        self.partition = nn.Sequential(
            nn.Linear(width, cfg.hidden),
            nn.Tanh(),
            nn.Linear(cfg.hidden, cfg.hidden),
            nn.Tanh(),
            nn.Linear(cfg.hidden, 1),
        )
        # Optimal plans have few stages: start out rarely opening a new group.
        nn.init.constant_(cast(nn.Linear, self.partition[-1]).bias, -2.0)
        self.embed = nn.Linear(width + cfg.groups, cfg.hidden)
        self.attention = nn.MultiheadAttention(cfg.hidden, cfg.heads, batch_first=True)
        self.norm = nn.LayerNorm(cfg.hidden)
        self.allocate = nn.Linear(cfg.hidden, n_types)

    def layers(self, kinds: torch.Tensor, numbers: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.words(kinds), numbers], dim=1)

    def start_logits(self, encoded: torch.Tensor) -> torch.Tensor:
        return self.partition(encoded)[:, 0]

    def type_logits(self, encoded: torch.Tensor, group: torch.Tensor, runnable: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, G', T]`` over types for the groups ``group`` ``[B, n]`` defines (padded to G'),
        masked to the types every layer of the group can run on."""
        width = int(group.max()) + 1
        member = nn.functional.one_hot(group, width).float().transpose(1, 2)  # [B, G', n]
        vectors = member @ encoded / member.sum(dim=2).clamp(min=1)[:, :, None]
        allowed = member @ (~runnable).float()[None] == 0  # padding groups have no layer: all allowed
        count = group[:, -1] + 1  # groups in each sample
        index = torch.arange(width)
        feeds = torch.where(index[None, :] + 1 < count[:, None], index[None, :] + 1, -1).clamp(max=self.groups - 1)
        feeds_one_hot = nn.functional.one_hot(feeds.clamp(min=0), self.groups).float() * (feeds >= 0)[:, :, None]
        x = torch.tanh(self.embed(torch.cat([vectors, feeds_one_hot], dim=2)))
        padding = index[None, :] >= count[:, None]
        attended, _ = self.attention(x, x, x, key_padding_mask=padding, need_weights=False)
        logits = self.allocate(self.norm(x + attended))
        return logits.masked_fill(~allowed, -1e9)


# -- sampling and scoring schedules ------------------------------------------------


def _partition(
    p_start: torch.Tensor,
    runnable: torch.Tensor,
    groups: int,
    batch: int,
    generator: torch.Generator | None,
    given: torch.Tensor | None = None,
    greedy: bool = False,
):
    """Group starts ``[B, n]`` and whether each was the network's choice (not forced), by walking the chain.

    Samples the starts, or follows ``given`` ones (to score a known schedule);
    either way the two rules of the module docstring decide the forced layers.
    """
    n, T = runnable.shape
    B = batch if given is None else given.shape[0]
    starts = torch.zeros(B, n, dtype=torch.bool)
    free = torch.zeros(B, n, dtype=torch.bool)
    common = torch.ones(B, T, dtype=torch.bool)
    opened = torch.zeros(B, dtype=torch.long)
    uniform = None if given is not None or greedy else torch.rand(B, n, generator=generator)
    for i in range(n):
        forced = ~(common & runnable[i][None]).any(dim=1) | (i == 0)
        capped = opened >= groups
        if given is not None:
            choice = given[:, i]
        elif greedy:
            choice = (p_start[i] > 0.5).expand(B)
        else:
            assert uniform is not None
            choice = uniform[:, i] < p_start[i]
        starts[:, i] = forced | (choice & ~capped)
        free[:, i] = ~forced & ~capped
        common = torch.where(starts[:, i, None], runnable[i][None], common & runnable[i][None])
        opened += starts[:, i].long()
    return starts, free


def _groups_of(starts: torch.Tensor) -> torch.Tensor:
    return starts.long().cumsum(dim=1) - 1


def _log_prob(
    nets: Networks,
    kinds,
    numbers,
    runnable,
    cfg: Config,
    *,
    generator=None,
    batch: int = 0,
    schedules: torch.Tensor | None = None,
    greedy: bool = False,
):
    """Sample ``batch`` schedules (or score the given ``schedules``): (schedules, log-prob, entropy).

    Log-probability and entropy are the sums over both networks' choices, so one
    policy-gradient step trains the two jointly.
    """
    encoded = nets.layers(kinds, numbers)
    start_logit = nets.start_logits(encoded)
    p_start = torch.sigmoid(start_logit)
    given = None
    if schedules is not None:
        given = torch.ones_like(schedules, dtype=torch.bool)
        given[:, 1:] = schedules[:, 1:] != schedules[:, :-1]
    with torch.no_grad():
        starts, free = _partition(p_start, runnable, cfg.groups, batch, generator, given, greedy)
    log_p = nn.functional.logsigmoid(start_logit)[None]
    log_q = nn.functional.logsigmoid(-start_logit)[None]
    part_logp = torch.where(starts, log_p, log_q).masked_fill(~free, 0.0).sum(dim=1)
    part_entropy = -(p_start * log_p[0] + (1 - p_start) * log_q[0])[None].masked_fill(~free, 0.0).sum(dim=1)

    group = _groups_of(starts)
    logits = nets.type_logits(encoded, group, runnable)
    logp = torch.log_softmax(logits, dim=2)
    valid = torch.arange(logits.shape[1])[None, :] <= group[:, -1:]  # [B, G']
    if schedules is not None:
        types = torch.zeros_like(logits[:, :, 0], dtype=torch.long)  # each group's type: its first layer's
        b, i = torch.nonzero(starts, as_tuple=True)
        types[b, group[b, i]] = schedules[b, i]
    elif greedy:
        types = logits.argmax(dim=2)
    else:
        types = torch.multinomial(logp.detach().exp().flatten(0, 1), 1, generator=generator).view(logits.shape[:2])
    alloc_logp = logp.gather(2, types[:, :, None])[:, :, 0].masked_fill(~valid, 0.0).sum(dim=1)
    alloc_entropy = -(logp.exp() * logp).masked_fill(logits < -1e8, 0.0).sum(dim=2).masked_fill(~valid, 0.0).sum(1)
    chosen = types.gather(1, group)
    return chosen, part_logp + alloc_logp, part_entropy + alloc_entropy


# -- solve ----------------------------------------------------------------------


@dataclass
class Agent:
    """Both networks on one problem's encoding, as :func:`policy_gradient.train` drives them."""

    nets: Networks
    kinds: torch.Tensor
    numbers: torch.Tensor
    runnable: torch.Tensor
    cfg: Config

    def parameters(self) -> Iterator[nn.Parameter]:
        return self.nets.parameters()

    def sample(self, batch: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return _log_prob(self.nets, self.kinds, self.numbers, self.runnable, self.cfg, generator=generator, batch=batch)

    def log_prob(self, schedules: torch.Tensor) -> torch.Tensor:
        return _log_prob(self.nets, self.kinds, self.numbers, self.runnable, self.cfg, schedules=schedules)[1]

    def greedy(self) -> np.ndarray:
        with torch.no_grad():
            return _log_prob(self.nets, self.kinds, self.numbers, self.runnable, self.cfg, batch=1, greedy=True)[
                0
            ].numpy()


def solve(
    problem: Problem, *, seed: int = 0, progress: Progress | None = None, options: SolveOptions | None = None
) -> Plan:
    """Train both networks on this problem and return the best feasible plan found."""
    start = time.perf_counter()
    cfg = policy_gradient.configured(Config(), options)
    kinds, numbers = encoding(problem)
    runnable = torch.from_numpy(problem.usable)

    def make_agent() -> Agent:
        return Agent(Networks(numbers.shape[1], problem.n_types, cfg), kinds, numbers, runnable, cfg)

    with policy_gradient.one_thread():
        _, run = policy_gradient.train(problem, cfg, make_agent, name="tapp", seed=seed, start=start, progress=progress)
    return policy_gradient.finish(problem, run, name="tapp", seed=seed)
