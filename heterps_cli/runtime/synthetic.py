"""The loss ``heterps run`` trains without a task (``--task``): the mean squared error between the
model's output and a fixed random target. ``heterps profile`` charges a loss to the model's last layer
(``--loss``: this one by default), as the run's last stage pays it each micro-batch (docs/spec.md
section 2)."""

from __future__ import annotations

from collections.abc import Callable

import torch

LOSSES = ("mse", "cross-entropy", "none")  # what ``heterps profile --loss`` takes


def per_sample_loss(output: torch.Tensor, target: torch.Tensor, batch_size: int) -> torch.Tensor:
    """A sample's loss is its mean squared error; the sum over the samples given, divided by the
    ``batch_size`` of the whole step, so that replicas' shares add up to the step's mean."""
    return ((output.float() - target) ** 2).reshape(output.shape[0], -1).mean(dim=1).sum() / batch_size


def target_for(shape: tuple[int, ...], batch_size: int, seed: int) -> torch.Tensor:
    return torch.randn((batch_size, *shape), generator=torch.Generator().manual_seed(seed + 1))


def output_loss(name: str, batch_size: int) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The loss ``name`` (:data:`LOSSES`) of a model's output, for timing or counting it: ``mse``,
    :func:`per_sample_loss` over ``batch_size`` samples; ``cross-entropy``, the output's last
    dimension as classes (a language model's logits); ``none``, None. The targets are zeros of the
    output's shape (class 0): the work is wanted, not the value."""
    if name == "none":
        return None
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}: one of {', '.join(LOSSES)}")
    targets: dict[tuple, torch.Tensor] = {}

    def target(output: torch.Tensor, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        key = (shape, dtype, output.device)
        if key not in targets:  # made once, outside the time of every call after the first
            targets[key] = torch.zeros(shape, dtype=dtype, device=output.device)
        return targets[key]

    def mse(output: torch.Tensor) -> torch.Tensor:
        return per_sample_loss(output, target(output, tuple(output.shape), torch.float32), batch_size)

    def cross_entropy(output: torch.Tensor) -> torch.Tensor:
        classes = output.shape[-1]
        labels = target(output, tuple(output.shape[:-1]), torch.long)
        return torch.nn.functional.cross_entropy(output.reshape(-1, classes), labels.reshape(-1))

    return mse if name == "mse" else cross_entropy
