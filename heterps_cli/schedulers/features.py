"""What the policy-gradient schedulers (rl, tapp) read about each layer: a fixed-width feature row.

The width does not depend on the number of layers, so a saved policy
warm-starts a changed model. The layer's index is a sinusoidal encoding of its
relative position, not a one-hot: a one-hot is as wide as the model is deep,
which would tie a policy to one model. Then the layer kind (one-hot over
:data:`KINDS` and "other"), log input size, log weight size, and per resource
type the log OCT, the log ODT (the paper's "data communication time"), the log
of price x OCT and a can-run flag. The paper's five features say nothing about
what a layer costs on each type, and without that a policy must learn it from
rewards alone. Logs are standardised over the model.
"""

from __future__ import annotations

import numpy as np

from heterps_cli.problem import Problem

KINDS = ("embedding", "fc", "conv", "pool", "activation", "norm", "attention", "dropout", "loss")
POSITION_FREQUENCIES = 4  # sin/cos pairs of the relative position

# The columns of the kind one-hot (tapp replaces them with a learned word vector).
KIND_COLUMNS = slice(2 * POSITION_FREQUENCIES + 2, 2 * POSITION_FREQUENCIES + 2 + len(KINDS) + 1)


def n_features(n_types: int) -> int:
    return 2 * POSITION_FREQUENCIES + 2 + len(KINDS) + 1 + 2 + 4 * n_types


def kind_index(kind: str) -> int:
    """The layer kind's index in :data:`KINDS`; ``len(KINDS)`` for any other kind."""
    return KINDS.index(kind) if kind in KINDS else len(KINDS)


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
    position = np.concatenate(
        [
            np.sin(pos[:, None] * freqs),
            np.cos(pos[:, None] * freqs),
            (np.arange(n) == 0)[:, None],
            (np.arange(n) == n - 1)[:, None],
        ],
        axis=1,
    )
    kind = np.zeros((n, len(KINDS) + 1))
    kind[np.arange(n), [kind_index(k) for k in problem.layer_kinds]] = 1.0
    sizes = _standardise(np.log1p(np.stack([problem.input_size, problem.weight_size], axis=1)))
    can = problem.usable
    tiny = 1e-12
    per_type = [
        _standardise(np.log(np.maximum(problem.oct, tiny)), can),
        _standardise(np.log(np.maximum(problem.odt, tiny)), can),
        _standardise(np.log(np.maximum(problem.oct * problem.prices[None, :], tiny)), can),
        can.astype(float),
    ]
    return np.concatenate([position, kind, sizes, *per_type], axis=1).astype(np.float32)
