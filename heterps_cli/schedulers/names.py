"""The schedulers' names, modules and descriptions, and the default budgets: no imports, so that
the CLI can offer and describe them (``--help``) without loading numpy or torch."""

from __future__ import annotations

DEFAULT_EVALUATIONS = 6000  # genetic, random: cost-model evaluations at one micro-batch
DEFAULT_STEPS = 120  # rl, tapp: training steps at one micro-batch
DEFAULT_BATCH = 64  # rl, tapp: schedules sampled per step
# rl, tapp: the default batch's schedules times layers, at most. One step's time grows with both, and
# a 10,000-layer step at 64 schedules took 13.7 s (most of a 30 s limit) and 4.3 GB.
BATCH_LAYERS = 65_536
MIN_BATCH = 8
POLICY_VARIANTS = 16  # rl --policy-out: nearby models whose locally optimised plans the saved policy learns


def default_batch(n_layers: int) -> int:
    """rl and tapp's schedules per step without --batch: 64 up to 1,024 layers, then fewer (at least 8)."""
    return min(DEFAULT_BATCH, max(MIN_BATCH, BATCH_LAYERS // max(1, n_layers)))


# Without --steps, --evaluations or --time-limit a search's budget is a count, never seconds, so that
# its plan is the same on any machine: the schedules it samples or scores times their layers, over all
# the micro-batches the plan may take, within these cells (the full default where that fits). 11
# micro-batches of a 34-layer model keep rl's 120 steps of 64 schedules (docs/commands.md).
TRAINING_CELLS = 1 << 22
MIN_STEPS = 10
EVALUATION_CELLS = 1 << 24
MIN_EVALUATIONS = 200


def default_steps(n_layers: int, batch: int, micro_batches: int) -> int:
    """rl and tapp's training steps at each of ``micro_batches`` without --steps (see TRAINING_CELLS)."""
    return min(DEFAULT_STEPS, max(MIN_STEPS, TRAINING_CELLS // (max(1, micro_batches) * batch * max(1, n_layers))))


def default_evaluations(n_layers: int, micro_batches: int) -> int:
    """genetic and random's evaluations at each of ``micro_batches`` without --evaluations."""
    cells = EVALUATION_CELLS // (max(1, micro_batches) * max(1, n_layers))
    return min(DEFAULT_EVALUATIONS, max(MIN_EVALUATIONS, cells))


GREEDY_RULE = (
    "each layer on its cheapest type by price x OCT (fastest by OCT for --objective time), "
    "exact replicas, then a local search while the plan improves"
)

# name -> (module in heterps_cli.schedulers, description)
SCHEDULERS: dict[str, tuple[str, str]] = {
    "rl": (
        "rl",
        "the HeterPS method, an LSTM policy trained by REINFORCE that picks each layer's type "
        "(replicas exact, then a local search polishes)",
    ),
    "tapp": (
        "tapp",
        "the TAPP method, a partition network that groups contiguous layers and an attention "
        "network that puts each group on a type, trained jointly by policy gradient "
        "(objective time by default; replicas exact, then the local search polishes)",
    ),
    "genetic": (
        "genetic",
        "a genetic algorithm over schedules (tournament selection, two-point crossover, "
        "flip/shift mutation, elitism) for --evaluations cost-model evaluations",
    ),
    "greedy": ("greedy", GREEDY_RULE),
    "random": ("random_search", "the best of --evaluations random valid schedules"),
    "exact": ("exact", "the provable optimum (a DP over stage boundaries per bottleneck throughput, limit-aware)"),
}
