"""The HeterPS scheduler (Liu et al., FGCS 2023): an LSTM policy picks a resource type per layer.

Read top to bottom: features, policy, generalising a saved policy, the two training phases, solve.

* **Features** have a fixed width for any number of layers, so a saved policy
  warm-starts a changed model. The layer's index is a sinusoidal encoding of its
  relative position, not a one-hot: a one-hot is as wide as the model is deep,
  which would tie a policy to one model. Then the layer kind (one-hot over
  :data:`KINDS` and "other"), log input size, log weight size, and per resource
  type the log OCT, the log ODT (the paper's "data communication time"), the log
  of price x OCT and a can-run flag. The paper's five features say nothing about
  what a layer costs on each type, and without that the policy must learn it
  from rewards alone. Logs are standardised over the model.
* **Policy**: a bidirectional LSTM reads the features. An autoregressive LSTM
  decoder then emits, per layer, a softmax over the types it can run on, fed the
  previous layer's choice so that it can learn to keep a stage together.
* **Reward** (:mod:`heterps_cli.schedulers.scoring`, shared with genetic and
  random): every sampled schedule gets exact replica counts
  (:func:`~heterps_cli.costmodel.provision`) and a reward of ``-cost / reference``
  (``-reference / throughput`` for objective ``time``), capped below at
  ``-CAP``. An infeasible schedule gets less than any feasible one, graded by how
  far it misses (throughput shortfall, limit excess, budget excess), so the
  policy learns its way back.
* **Training**: REINFORCE with rank-normalised advantages (the batch's own
  ranking is the baseline), an entropy bonus that decays linearly, and gradient
  clipping; each batch is scored in one vectorised call, each distinct schedule
  once. Phase 1 (the paper's pre-training) fits the policy to the best of a
  pool of randomly generated schedules and simple heuristics, scored the same
  way. Phase 2 samples from the policy itself, and also imitates the best
  schedule found so far (self-imitation), which keeps what was learned from
  being lost to noise. The best feasible plan ever sampled is kept, and the
  greedy decode is tried at the end.
* **Warm start**: before ``--policy-out`` saves the policy, :func:`generalise`
  fits it to locally optimised plans of nearby models, so that it has learned
  to plan this model's neighbours rather than memorised this model's plan; a
  ``--policy-in`` run then skips pre-training and starts from it.
* **Polish**: a local search (:mod:`heterps_cli.schedulers.local`) from the best
  schedule of each of the few best stage-type sequences seen, and from the
  heuristics; then iterated local search, kicking the best plan out of its local
  optimum and descending again (more kicks when no feasible plan was sampled).
  On tight instances it does much of the work; the benchmark shows both the
  sampled and the polished gaps.
"""

from __future__ import annotations

import io
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from heterps_cli.errors import InputError
from heterps_cli.plan import Plan
from heterps_cli.problem import Problem
from heterps_cli.schedulers.local import improve
from heterps_cli.schedulers.policy_gradient import configured, one_thread, polish_best, pretraining_pool
from heterps_cli.schedulers.names import DEFAULT_BATCH, DEFAULT_STEPS, POLICY_VARIANTS
from heterps_cli.schedulers.scoring import (Best, Evaluator, Reference, deadline, heuristic_schedules,
                                            rank_advantage, result, rewards)
from heterps_cli.yamlio import write_atomic

KINDS = ("embedding", "fc", "conv", "pool", "activation", "norm", "attention", "dropout", "loss")
POSITION_FREQUENCIES = 4  # sin/cos pairs of the relative position
POLICY_FORMAT = "heterps-policy/1"


@dataclass(frozen=True)
class Config:
    steps: int = DEFAULT_STEPS
    batch: int = DEFAULT_BATCH
    hidden: int = 64
    lr: float = 3e-3
    entropy_start: float = 0.1  # decays linearly to entropy_end over the steps
    entropy_end: float = 0.01
    grad_clip: float = 1.0
    imitation: float = 0.05  # weight of the self-imitation term in phase 2
    pool: int = 1024  # random schedules scored for pre-training
    pretrain_steps: int = 20
    time_limit: float | None = None
    polish_starts: int = 5  # local searches at the end, one per distinct stage-type sequence
    kicks: int = 20  # then perturb-and-descend rounds from the best plan (iterated local search)
    extra_kicks: int = 60  # more of them when no feasible plan was sampled (learning failed)
    variants: int = POLICY_VARIANTS  # --policy-out: nearby models whose locally optimised plans the saved policy learns
    variant_spread: float = 0.1  # their per-layer times differ by up to this factor (log-uniform)
    generalise_epochs: int = 150


# -- features -------------------------------------------------------------------


KIND_COLUMNS = slice(2 * POSITION_FREQUENCIES + 2, 2 * POSITION_FREQUENCIES + 2 + len(KINDS) + 1)


def n_features(n_types: int) -> int:
    return 2 * POSITION_FREQUENCIES + 2 + len(KINDS) + 1 + 2 + 4 * n_types


def _standardise(x: np.ndarray, where: np.ndarray | None = None) -> np.ndarray:
    values = x[where] if where is not None else x.ravel()
    mean, std = (values.mean(), values.std()) if values.size else (0.0, 1.0)
    out = (x - mean) / (std if std > 1e-9 else 1.0)
    return np.where(where, out, 0.0) if where is not None else out


def layer_features(problem: Problem) -> np.ndarray:
    """``[n_layers, n_features(T)]`` float32 features of each layer (see the module docstring)."""
    n = problem.n_layers
    pos = np.arange(n) / max(n - 1, 1)
    freqs = np.pi * 2.0 ** np.arange(POSITION_FREQUENCIES)
    position = np.concatenate([np.sin(pos[:, None] * freqs), np.cos(pos[:, None] * freqs),
                               (np.arange(n) == 0)[:, None], (np.arange(n) == n - 1)[:, None]], axis=1)
    kind = np.zeros((n, len(KINDS) + 1))
    kind[np.arange(n), [KINDS.index(k) if k in KINDS else len(KINDS) for k in problem.layer_kinds]] = 1.0
    sizes = _standardise(np.log1p(np.stack([problem.input_size, problem.weight_size], axis=1)))
    can = problem.runnable
    tiny = 1e-12
    per_type = [
        _standardise(np.log(np.maximum(problem.oct, tiny)), can),
        _standardise(np.log(np.maximum(problem.odt, tiny)), can),
        _standardise(np.log(np.maximum(problem.oct * problem.prices[None, :], tiny)), can),
        can.astype(float),
    ]
    return np.concatenate([position, kind, sizes, *per_type], axis=1).astype(np.float32)


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

    def log_prob(self, feats: torch.Tensor, mask: torch.Tensor, actions: torch.Tensor):
        """Log-probability and entropy (summed over layers) of given schedules, teacher-forced.

        ``feats`` ``[n, F]`` and ``mask`` ``[n, T]`` are one model's; ``[B, n, F]`` and
        ``[B, n, T]`` give each schedule its own model (of the same depth).
        """
        B, n = actions.shape
        if feats.dim() == 2:
            enc = self.encoder(feats[None])[0].expand(B, n, -1)
            mask = mask[None]
        else:
            enc = self.encoder(feats)[0]
        prev = self._previous(actions)
        out, _ = self.decoder(torch.cat([enc, prev], dim=2))
        logits = (self.head(out) + self.stay * prev[:, :, : self.n_types]).masked_fill(~mask, -1e9)
        logp = torch.log_softmax(logits, dim=2)
        chosen = logp.gather(2, actions[:, :, None])[:, :, 0].sum(dim=1)
        entropy = -(logp.exp() * logp).masked_fill(~mask, 0.0).sum(dim=(1, 2))
        return chosen, entropy

    @torch.no_grad()
    def sample(self, feats: torch.Tensor, mask: torch.Tensor, batch: int, generator: torch.Generator,
               greedy: bool = False) -> torch.Tensor:
        """Sample ``batch`` schedules layer by layer.

        The decoder step is written out (the four LSTM gates, on the decoder's own
        weights) because one ``nn.LSTM`` call per layer costs more in overhead than
        in arithmetic; the encoder's share of the input projection is computed once.
        """
        n, T = feats.shape[0], self.n_types
        enc = self.encoder(feats[None])[0][0]
        d = self.decoder
        w_enc, w_prev = d.weight_ih_l0[:, : enc.shape[1]], d.weight_ih_l0[:, enc.shape[1]:]
        from_enc = enc @ w_enc.T + d.bias_ih_l0 + d.bias_hh_l0  # [n, 4H]
        h = torch.zeros(batch, d.hidden_size)
        c = torch.zeros(batch, d.hidden_size)
        prev = torch.full((batch,), T, dtype=torch.long)  # the start symbol
        actions = torch.zeros(batch, n, dtype=torch.long)
        for layer in range(n):
            gates = from_enc[layer] + w_prev.T[prev] + h @ d.weight_hh_l0.T
            i, f, g, o = gates.chunk(4, dim=1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            logits = self.head(h) + self.stay * nn.functional.one_hot(prev, T + 1)[:, :T]
            logits = logits.masked_fill(~mask[layer][None], -1e9)
            if greedy:
                prev = logits.argmax(dim=1)
            else:
                prev = torch.multinomial(torch.softmax(logits, dim=1), 1, generator=generator)[:, 0]
            actions[:, layer] = prev
        return actions


def save_policy(policy: Policy, problem: Problem, path: Path) -> None:
    buffer = io.BytesIO()
    torch.save({"format": POLICY_FORMAT, "types": list(problem.types), "hidden": policy.head.in_features,
                "features": policy.encoder.input_size, "state": policy.state_dict()}, buffer)
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
    return None


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
            str(path), None, "types",
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
        input_size=problem.input_size[index], weight_size=problem.weight_size[index],
        oct=problem.oct[index] * scale, odt=problem.odt[index] * scale,
        alpha=problem.alpha[index], beta=problem.beta[index], runnable=problem.runnable[index],
    ), index


def generalise(policy: Policy, problem: Problem, schedule: np.ndarray, cfg: Config, rng: np.random.Generator,
               generator: torch.Generator, report) -> None:
    """Teach the policy to plan nearby models, not only this one (run before saving it).

    Trained on one model, the policy memorises that model's stage boundaries, and
    a warm start on a changed model reproduces them even where the optimum has
    moved (measured: 3-5 layers on a 32-layer model with one layer added). So,
    as in expert iteration, it is fitted to the plans a local search finds
    for :data:`Config.variants` nearby models (:func:`nearby`), each searched from
    this model's best plan carried over and from the policy's own greedy decode,
    and to this model's best plan; it then maps features to plans.
    """
    examples = [(torch.from_numpy(layer_features(problem)), torch.from_numpy(problem.runnable),
                 torch.from_numpy(schedule))]
    for v in range(cfg.variants):
        report(f"rl: generalising the saved policy, nearby model {v + 1}/{cfg.variants}")
        variant, index = nearby(problem, rng, cfg.variant_spread)
        feats, mask = torch.from_numpy(layer_features(variant)), torch.from_numpy(variant.runnable)
        evaluate = Evaluator(variant)
        starts = np.stack([schedule[index], policy.sample(feats, mask, 1, generator, greedy=True)[0].numpy()])
        reference = Reference.of(evaluate(np.concatenate([starts, heuristic_schedules(variant)])))

        def score(rows: np.ndarray, variant=variant, evaluate=evaluate, reference=reference) -> np.ndarray:
            return rewards(variant, evaluate(rows), reference)

        found = [improve(variant, start, score) for start in starts]
        examples.append((feats, mask, torch.from_numpy(max(found, key=lambda f: f[1])[0])))
    # One teacher-forced call per depth (the nearby models have n - 1, n or n + 1 layers).
    batches = [[torch.stack(part) for part in zip(*(e for e in examples if len(e[2]) == depth))]
               for depth in sorted({len(e[2]) for e in examples})]
    optimiser = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
    for _ in range(cfg.generalise_epochs):
        loss = sum(-policy.log_prob(f, m, a)[0].sum() / a.shape[1] for f, m, a in batches) / len(examples)
        optimiser.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(policy.parameters(), cfg.grad_clip)
        optimiser.step()


# -- solve ----------------------------------------------------------------------


def solve(problem: Problem, *, seed: int = 0, progress=None, options=None, on_step=None) -> Plan:
    """Train the policy on this problem and return the best feasible plan it found.

    ``on_step(step, best)``, if given, is called after every training step with
    the best objective key among the plans the policy itself has sampled (cost,
    or minus throughput; inf while none is feasible): the learning curve,
    without the pre-training pool and before the final polish.
    """
    start = time.perf_counter()
    with one_thread():
        return _train(problem, configured(Config(), options), seed, progress, options, start, on_step)


def _train(problem: Problem, cfg: Config, seed: int, progress, options, start: float, on_step) -> Plan:
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    feats = torch.from_numpy(layer_features(problem))
    mask = torch.from_numpy(problem.runnable)
    warm = options is not None and options.policy_in is not None
    if warm:
        policy = load_policy(options.policy_in, problem)
    else:
        policy = Policy(feats.shape[1], problem.n_types, cfg.hidden)
    optimiser = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
    best, evaluate, notes = Best(problem.objective), Evaluator(problem), []
    learned = Best(problem.objective)  # the policy's own samples only: the learning curve
    out_of_time = deadline(start, cfg.time_limit)
    report = progress or (lambda *a, **k: None)

    # Phase 1: pre-train on random schedules and their costs (the best of them, by likelihood).
    reference, elite = pretraining_pool(problem, evaluate, best, rng, cfg.pool)
    interrupted = False
    try:
        # A warm-started policy skips it: fitting the pool's elite would overwrite what the saved
        # policy learned about nearby models (measured in benchmarks/bench_warmstart.py).
        for step in range(0 if warm else cfg.pretrain_steps):
            logp, _ = policy.log_prob(feats, mask, elite)
            loss = -logp.mean() / problem.n_layers
            optimiser.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(policy.parameters(), cfg.grad_clip)
            optimiser.step()
            report(f"rl: pre-training {step + 1}/{cfg.pretrain_steps}", completed=0, total=cfg.steps)

        # Phase 2: REINFORCE on the policy's own samples.
        for step in range(cfg.steps):
            if out_of_time():
                notes.append(f"training stopped at the time limit after {step} of {cfg.steps} steps")
                break
            actions = policy.sample(feats, mask, cfg.batch, generator)
            schedules = actions.numpy()
            scores = evaluate(schedules)
            best.offer(problem, schedules, scores)
            learned.offer(problem, schedules, scores)
            advantage = torch.from_numpy(rank_advantage(rewards(problem, scores, reference))).float()
            logp, entropy = policy.log_prob(feats, mask, actions)
            beta = cfg.entropy_start + (cfg.entropy_end - cfg.entropy_start) * step / max(cfg.steps - 1, 1)
            loss = -(advantage * logp).mean() - beta * entropy.mean()
            if best.schedule is not None and cfg.imitation > 0:
                imitate, _ = policy.log_prob(feats, mask, torch.from_numpy(best.schedule)[None])
                loss = loss - cfg.imitation * imitate.mean()
            optimiser.zero_grad()
            (loss / problem.n_layers).backward()
            nn.utils.clip_grad_norm_(policy.parameters(), cfg.grad_clip)
            optimiser.step()
            report(f"rl: step {step + 1}/{cfg.steps} · best {best.shown} · {scores.feasible.mean():.0%} feasible",
                   completed=step + 1, total=cfg.steps)
            if on_step is not None:
                on_step(step + 1, learned.key)
    except KeyboardInterrupt:
        interrupted = True
        notes.append("training interrupted (Ctrl-C): the best plan found so far")

    sampled_feasible = best.schedule is not None  # before the polish: the pool or the policy found one
    greedy = policy.sample(feats, mask, 1, generator, greedy=True).numpy()
    best.offer(problem, greedy, evaluate(greedy))
    report("rl: polishing the best schedules", completed=cfg.steps, total=cfg.steps)
    interrupted |= not polish_best(problem, evaluate, best, reference, rng, cfg, sampled_feasible=sampled_feasible,
                                   out_of_time=out_of_time, notes=notes)
    saving = options is not None and options.policy_out is not None
    if saving and best.schedule is not None and not interrupted:
        try:
            generalise(policy, problem, best.schedule, cfg, rng, generator, report)
            save_policy(policy, problem, options.policy_out)
        except KeyboardInterrupt:
            interrupted = True
            notes.append(f"interrupted (Ctrl-C) while generalising the policy: {options.policy_out} not written")
    return result(problem, best, evaluate, scheduler="rl", seed=seed, start=start, notes=notes,
                  hint="give it more --steps, or use --scheduler exact", interrupted=interrupted)
