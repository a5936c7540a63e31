"""The schedulers' names, modules and descriptions, and the default budgets: no imports, so that
the CLI can offer and describe them (``--help``) without loading numpy or torch."""

from __future__ import annotations

DEFAULT_EVALUATIONS = 6000  # genetic, random: cost-model evaluations
DEFAULT_STEPS = 120  # rl, tapp: training steps
DEFAULT_BATCH = 64  # rl, tapp: schedules sampled per step
POLICY_VARIANTS = 16  # rl --policy-out: nearby models whose locally optimised plans the saved policy learns

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
