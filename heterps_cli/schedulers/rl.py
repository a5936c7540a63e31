"""The HeterPS scheduler (Liu et al., FGCS 2023; ``--scheduler rl``): an LSTM policy picks a resource
type per layer, trained by REINFORCE in :mod:`~heterps_cli.schedulers.policy_gradient`'s loop, with
replicas provisioned exactly. How it works and how well: docs/schedulers/rl.md.

Read top to bottom: the policy, saved policies, generalising a saved policy (the warm start), solve.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import numpy as np
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from heterps_cli.errors import InputError
from heterps_cli.outfiles import write_atomic
from heterps_cli.plan import Plan
from heterps_cli.problem import Problem
from heterps_cli.schedulers import policy_gradient
from heterps_cli.schedulers.base import Progress, RLOptions, SolveOptions, quiet
from heterps_cli.schedulers.features import layer_features, n_features
from heterps_cli.schedulers.headroom import Headroom, masks
from heterps_cli.schedulers.local import improve, search_budget
from heterps_cli.schedulers.names import POLICY_VARIANTS
from heterps_cli.schedulers.optimiser import Adam
from heterps_cli.schedulers.scoring import (
    Evaluator,
    Reference,
    heuristic_schedules,
    rewards,
)

POLICY_FORMAT = "heterps-policy/1"
# The limit mask (schedulers/headroom.py) up to this many layers. It costs about 50 us a layer of every
# sampling step: at 1,000 layers under a 30 s limit it still paid (1,000 x 4 tight: a plan where there
# was none; 1,000 x 3 memory: $5,736 instead of $12,464), at 2,000 x 3 under 20 s it left 18-20 training
# steps instead of 25-26 and plans 40-120% dearer on three seeds.
HEADROOM_LAYERS = 1000
SEGMENT_SAMPLES = 65_536  # schedules x layers whose decoder activations a training pass holds at once


@dataclass(frozen=True)
class Config(policy_gradient.Config):
    # Measured on the benchmark instances over seeds 0-3 (benchmarks/bench_rl.py; docs/schedulers/rl.md): with these
    # three, the policy's own samples came within 2% of the optimum on 69 of 120 runs instead of 57.
    credit_to_go: bool = True
    imitate_leader: bool = True
    imitation: float = 0.5
    restart_after: int = 20  # measured: 10, 15, 20 and 30 (docs/schedulers/rl.md)
    variants: int = POLICY_VARIANTS  # --policy-out: nearby models whose locally optimised plans the saved policy learns
    variant_spread: float = 0.1  # their per-layer times differ by up to this factor (log-uniform)
    generalise_epochs: int = 150
    headroom: bool = True  # mask the types no completion could fit in the limits (up to HEADROOM_LAYERS)


# -- policy ---------------------------------------------------------------------


class Policy(nn.Module):
    """Bidirectional LSTM encoder over layer features; autoregressive LSTM decoder over types."""

    def __init__(self, features: int, n_types: int, hidden: int = 64):
        super().__init__()
        self.n_types = n_types
        self.encoder = nn.LSTM(features, hidden, batch_first=True, bidirectional=True)
        self.decoder = nn.LSTM(2 * hidden + n_types + 1, hidden, batch_first=True)
        self.head = nn.Linear(hidden, n_types)
        # Optimal plans have few stages: start out preferring to stay on the previous layer's type.
        self.stay = nn.Parameter(torch.tensor(2.0))

    def _previous(self, actions: torch.Tensor) -> torch.Tensor:
        """One-hot of the previous layer's type, with a start symbol before the first layer."""
        B, n = actions.shape
        prev = torch.zeros(B, n, self.n_types + 1)
        prev[:, 0, self.n_types] = 1.0
        if n > 1:
            prev[:, 1:, : self.n_types] = nn.functional.one_hot(actions[:, :-1], self.n_types).float()
        return prev

    def log_prob(self, feats: torch.Tensor, mask: torch.Tensor, actions: torch.Tensor, per_layer: bool = False):
        """Log-probability and entropy (summed over layers) of given schedules, teacher-forced.

        ``feats`` ``[n, F]`` and ``mask`` ``[n, T]`` are one model's; ``[B, n, F]`` and
        ``[B, n, T]`` give each schedule its own model (of the same depth). Past
        :data:`SEGMENT_SAMPLES` schedules x layers, the decoder runs a segment of layers at
        a time and keeps only each segment's input for the backward pass, recomputing the
        rest (activation checkpointing): a 10,000-layer batch of 64 held 4.3 GB at once.
        """
        B, n = actions.shape
        if feats.dim() == 2:
            enc = self.encoder(feats[None])[0].expand(B, n, -1)
            mask = mask[None] if mask.dim() == 2 else mask
        else:
            enc = self.encoder(feats)[0]
        prev = self._previous(actions)
        if B * n <= SEGMENT_SAMPLES or not torch.is_grad_enabled():
            chosen, entropy, _ = self._decode(enc, prev, mask, actions)
            return (chosen if per_layer else chosen.sum(dim=1)), entropy
        span = max(1, SEGMENT_SAMPLES // B)
        parts, entropy = [], torch.zeros(B)
        state = (torch.zeros(1, B, self.decoder.hidden_size), torch.zeros(1, B, self.decoder.hidden_size))
        for lo in range(0, n, span):
            part = slice(lo, lo + span)
            c, e, state = checkpoint(
                self._decode, enc[:, part], prev[:, part], mask[:, part], actions[:, part], state, use_reentrant=False
            )
            parts.append(c)
            entropy = entropy + e
        chosen = torch.cat(parts, dim=1)
        return (chosen if per_layer else chosen.sum(dim=1)), entropy

    def _decode(self, enc, prev, mask, actions, state=None):
        """The decoder over a run of layers from ``state``: each layer's log-probability, the summed entropy,
        the last state."""
        out, state = self.decoder(torch.cat([enc, prev], dim=2), state)
        logits = (self.head(out) + self.stay * prev[:, :, : self.n_types]).masked_fill(~mask, -1e9)
        logp = torch.log_softmax(logits, dim=2)
        chosen = logp.gather(2, actions[:, :, None])[:, :, 0]
        entropy = -(logp.exp() * logp).masked_fill(~mask, 0.0).sum(dim=(1, 2))
        return chosen, entropy, state

    @torch.no_grad()
    def sample(
        self,
        feats: torch.Tensor,
        mask: torch.Tensor,
        batch: int,
        generator: torch.Generator,
        greedy: bool = False,
        room: Headroom | None = None,
    ) -> torch.Tensor:
        """Sample ``batch`` schedules layer by layer.

        The decoder step is written out (the four LSTM gates, on the decoder's own
        weights) because one ``nn.LSTM`` call per layer costs more in overhead than
        in arithmetic; the encoder's share of the input projection is computed once,
        and each step makes as few calls as it can (84 to 53 µs a layer at 2,000 layers).
        """
        n, T = feats.shape[0], self.n_types
        enc = self.encoder(feats[None])[0][0]
        d = self.decoder
        w_ih, w_hh = cast(torch.Tensor, d.weight_ih_l0), cast(torch.Tensor, d.weight_hh_l0)
        w_enc, w_prev = w_ih[:, : enc.shape[1]], w_ih[:, enc.shape[1] :]
        from_enc = enc @ w_enc.T + d.bias_ih_l0 + d.bias_hh_l0  # [n, 4H]
        from_prev, recurrent = w_prev.T.contiguous(), w_hh.T.contiguous()
        head, head_bias = self.head.weight.T.contiguous(), self.head.bias
        stay = self.stay * torch.eye(T + 1)[:, :T]  # row `prev`: the bonus for staying on it
        blocked = ~mask
        h = torch.zeros(batch, d.hidden_size)
        c = torch.zeros(batch, d.hidden_size)
        prev = torch.full((batch,), T, dtype=torch.long)  # the start symbol
        actions = torch.zeros(n, batch, dtype=torch.long)
        for layer in range(n):
            gates = torch.addmm(from_enc[layer] + from_prev[prev], h, recurrent)
            i, f, g, o = gates.chunk(4, dim=1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            shut = blocked[layer] if room is None else torch.from_numpy(~room.allowed(layer))
            logits = torch.addmm(head_bias + stay[prev], h, head).masked_fill(shut, -1e9)
            if greedy:
                prev = logits.argmax(dim=1)
            else:
                prev = torch.multinomial(torch.softmax(logits, dim=1), 1, generator=generator)[:, 0]
            actions[layer] = prev
            if room is not None:
                room.take(layer, prev.numpy())
        actions = actions.T.contiguous()
        return actions


def save_policy(policy: Policy, problem: Problem, path: Path) -> None:
    buffer = io.BytesIO()
    torch.save(
        {
            "format": POLICY_FORMAT,
            "types": list(problem.types),
            "hidden": policy.head.in_features,
            "features": policy.encoder.input_size,
            "state": policy.state_dict(),
        },
        buffer,
    )
    write_atomic(path, buffer.getvalue())


MAX_POLICY_BYTES = 64 << 20
MAX_HIDDEN = 1024


def _policy_problem(saved) -> str | None:
    """What makes ``saved`` not a policy this version wrote, checked before any network is built."""
    keys = {"format", "types", "hidden", "features", "state"}
    if not isinstance(saved, dict) or saved.get("format") != POLICY_FORMAT:
        return f"expected format {POLICY_FORMAT}"
    if set(saved) != keys:
        return f"expected the keys {sorted(keys)}, found {sorted(map(str, saved))}"
    types, hidden, features, state = saved["types"], saved["hidden"], saved["features"], saved["state"]
    if not (isinstance(types, list) and 0 < len(types) <= 1000 and all(isinstance(t, str) for t in types)):
        return "types must be a list of resource type names"
    if not (type(hidden) is int and 1 <= hidden <= MAX_HIDDEN):
        return f"hidden must be a whole number from 1 to {MAX_HIDDEN}"
    if features != n_features(len(types)):
        return f"features must be {n_features(len(types))} for {len(types)} types (got {features!r})"
    with torch.device("meta"):  # the shapes a policy of this size has, without allocating it
        expected = {k: v.shape for k, v in Policy(features, len(types), hidden).state_dict().items()}
    if not isinstance(state, dict) or set(state) != set(expected):
        return "the network's weights are not those of a heterps policy"
    for name, shape in expected.items():
        tensor = state[name]
        if not isinstance(tensor, torch.Tensor) or tensor.shape != shape or not tensor.is_floating_point():
            return f"weight {name} should be a float tensor of shape {tuple(shape)}"
        if not torch.isfinite(tensor).all():
            return f"weight {name} holds NaN or infinite values"
        if tensor.numel() and float(tensor.abs().max()) > MAX_WEIGHT:
            return (
                f"weight {name} reaches {float(tensor.abs().max()):.3g}, past {MAX_WEIGHT:g} where no trained "
                "policy goes (its probabilities would not be numbers)"
            )
    return None


MAX_WEIGHT = 1e4  # |weight| of a loaded policy; trained ones stay under 100


def load_policy(path: Path, problem: Problem) -> Policy:
    try:
        if Path(path).stat().st_size > MAX_POLICY_BYTES:
            raise InputError(str(path), None, None, f"over {MAX_POLICY_BYTES >> 20} MiB: not a heterps policy file")
        saved = torch.load(path, weights_only=True)
    except FileNotFoundError:
        raise InputError(str(path), None, None, "file not found") from None
    except InputError:
        raise
    except Exception as exc:  # torch raises many kinds for a file that is not a policy
        raise InputError(str(path), None, None, f"not a heterps policy file ({type(exc).__name__})") from None
    problem_text = _policy_problem(saved)
    if problem_text is not None:
        raise InputError(str(path), None, None, f"not a heterps policy file: {problem_text}")
    if saved["types"] != list(problem.types):
        raise InputError(
            str(path),
            None,
            "types",
            f"the policy was trained for resource types {saved['types']}, this plan uses {list(problem.types)}; "
            "a policy warm-starts only plans on the same cluster types",
        )
    policy = Policy(saved["features"], len(saved["types"]), saved["hidden"])
    policy.load_state_dict(saved["state"])
    return policy


# -- generalising a saved policy -----------------------------------------------


def nearby(problem: Problem, rng: np.random.Generator, spread: float) -> tuple[Problem, np.ndarray]:
    """The model as a team might change it before re-planning: every layer's times scaled by
    up to ``1 ± spread``, and one random layer duplicated or dropped; and which old layer each new one is."""
    n = problem.n_layers
    index = np.arange(n)
    at = int(rng.integers(n))
    if rng.random() < 0.5 or n < 3:
        index = np.insert(index, at, at)
    else:
        index = np.delete(index, at)
    scale = np.exp(rng.uniform(-np.log1p(spread), np.log1p(spread), size=(len(index), 1)))
    return problem.replace(
        layer_names=tuple(problem.layer_names[i] for i in index),
        layer_kinds=tuple(problem.layer_kinds[i] for i in index),
        input_size=problem.input_size[index],
        weight_size=problem.weight_size[index],
        oct=problem.oct[index] * scale,
        odt=problem.odt[index] * scale,
        alpha=problem.alpha[index],
        beta=problem.beta[index],
        runnable=problem.runnable[index],
        activation_size=problem.activation_size[index],
        sharded=problem.sharded[index],
    ), index


def generalise(
    policy: Policy,
    problem: Problem,
    schedule: np.ndarray,
    cfg: Config,
    rng: np.random.Generator,
    generator: torch.Generator,
    report: Progress,
) -> None:
    """Teach the policy to plan nearby models, not only this one (run before saving it).

    Trained on one model, the policy memorises that model's stage boundaries, and
    a warm start on a changed model reproduces them even where the optimum has
    moved (measured: 3-5 layers on a 32-layer model with one layer added). So,
    as in expert iteration, it is fitted to the plans a local search finds
    for :data:`Config.variants` nearby models (:func:`nearby`), each searched from
    this model's best plan carried over and from the policy's own greedy decode,
    and to this model's best plan; it then maps features to plans.
    """
    examples = [
        (torch.from_numpy(layer_features(problem)), torch.from_numpy(problem.usable), torch.from_numpy(schedule))
    ]
    for v in range(cfg.variants):
        report(f"rl: generalising the saved policy, nearby model {v + 1}/{cfg.variants}")
        variant, index = nearby(problem, rng, cfg.variant_spread)
        feats, mask = torch.from_numpy(layer_features(variant)), torch.from_numpy(variant.usable)
        evaluate = Evaluator(variant)
        starts = np.stack([schedule[index], policy.sample(feats, mask, 1, generator, greedy=True)[0].numpy()])
        reference = Reference.of(evaluate(np.concatenate([starts, heuristic_schedules(variant)])))

        def score(rows: np.ndarray, variant=variant, evaluate=evaluate, reference=reference) -> np.ndarray:
            return rewards(variant, evaluate(rows), reference)

        # The variants share one polish's budget: on thousands of layers an unbounded search runs for hours.
        budget = search_budget(variant.n_layers, cfg.variants)

        def spent(evaluate=evaluate, budget=budget) -> bool:
            return evaluate.evaluations > budget

        found = [improve(variant, start, score, out_of_time=spent) for start in starts]
        best_found = max(found, key=lambda f: f[1])[0] % variant.n_types  # stage labels to types
        examples.append((feats, mask, torch.from_numpy(best_found)))
    # One teacher-forced call per depth (the nearby models have n - 1, n or n + 1 layers).
    batches = [
        [torch.stack(part) for part in zip(*(e for e in examples if len(e[2]) == depth))]
        for depth in sorted({len(e[2]) for e in examples})
    ]
    optimiser = Adam(policy.parameters(), lr=cfg.lr)
    for _ in range(cfg.generalise_epochs):
        loss = sum(-policy.log_prob(f, m, a)[0].sum() / a.shape[1] for f, m, a in batches) / len(examples)
        optimiser.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(policy.parameters(), cfg.grad_clip)
        optimiser.step()


# -- solve ----------------------------------------------------------------------


@dataclass
class Agent:
    """The policy on one problem's features, as :func:`policy_gradient.train` drives it."""

    policy: Policy
    problem: Problem
    feats: torch.Tensor
    mask: torch.Tensor
    headroom: bool = True
    _masks: dict = field(default_factory=dict)  # imitation targets' masks, by schedule bytes

    def parameters(self) -> Iterator[nn.Parameter]:
        return self.policy.parameters()

    def sample(self, batch: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        room = Headroom(self.problem, batch) if self.headroom else None
        actions = self.policy.sample(self.feats, self.mask, batch, generator, room=room)
        mask = self.mask if room is None else torch.from_numpy(room.seen)  # the masks the samples were drawn under
        return (actions, *self.policy.log_prob(self.feats, mask, actions, per_layer=True))

    def log_prob(self, schedules: torch.Tensor) -> torch.Tensor:
        if not self.headroom:
            return self.policy.log_prob(self.feats, self.mask, schedules)[0]
        key = schedules.numpy().tobytes()
        if key not in self._masks:
            if len(self._masks) > 4:
                self._masks.clear()
            self._masks[key] = torch.from_numpy(masks(self.problem, schedules.numpy()))
        return self.policy.log_prob(self.feats, self._masks[key], schedules)[0]

    def greedy(self) -> np.ndarray:
        room = Headroom(self.problem, 1) if self.headroom else None
        return self.policy.sample(self.feats, self.mask, 1, torch.Generator(), greedy=True, room=room).numpy()


def solve(
    problem: Problem,
    *,
    seed: int = 0,
    progress: Progress | None = None,
    options: SolveOptions | None = None,
    on_step: Callable[[int, float], None] | None = None,
) -> Plan:
    """Train the policy on this problem and return the best feasible plan it found.

    ``on_step(step, best)``, if given, is called after every training step with
    the best objective key among the plans the policy itself has sampled (cost,
    or minus throughput; inf while none is feasible): the learning curve,
    without the pre-training pool and before the final polish.
    """
    start = time.perf_counter()
    cfg = policy_gradient.configured(Config(), options)
    feats, mask = torch.from_numpy(layer_features(problem)), torch.from_numpy(problem.usable)
    policy_in = options.policy_in if isinstance(options, RLOptions) else None
    policy_out = options.policy_out if isinstance(options, RLOptions) else None

    headroom = cfg.headroom and problem.n_layers <= HEADROOM_LAYERS

    def make_agent() -> Agent:
        if policy_in is not None:
            return Agent(load_policy(policy_in, problem), problem, feats, mask, headroom)
        return Agent(Policy(feats.shape[1], problem.n_types, cfg.hidden), problem, feats, mask, headroom)

    with policy_gradient.one_thread():
        # A warm-started policy skips pre-training: fitting the pool's elite would overwrite what the
        # saved policy learned about nearby models (measured in benchmarks/bench_warmstart.py).
        agent, run = policy_gradient.train(
            problem,
            cfg,
            make_agent,
            name="rl",
            seed=seed,
            start=start,
            pretrain=policy_in is None,
            progress=progress,
            on_step=on_step,
        )
        if policy_out is not None and run.best.schedule is not None and not run.interrupted:
            try:
                generalise(
                    agent.policy,
                    problem,
                    run.best.schedule % problem.n_types,
                    cfg,
                    run.rng,
                    run.generator,
                    progress or quiet,
                )
                save_policy(agent.policy, problem, policy_out)
            except KeyboardInterrupt:
                run.interrupted = True
                run.notes.append(f"interrupted (Ctrl-C) while generalising the policy: {policy_out} not written")
    return policy_gradient.finish(problem, run, name="rl", seed=seed)
