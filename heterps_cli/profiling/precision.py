"""What a measured profile trains at (``heterps profile --precision``; docs/spec.md section 2).

``fp32`` is PyTorch's default on a GPU: products in fp32, convolutions with TF32.
``tf32`` lets the products use TF32 too (``torch.backends.cuda.matmul.allow_tf32``).
``bf16`` and ``fp16`` run every forward pass under autocast, as a mixed-precision
trainer does, and the backward passes in the types those forwards chose: the
weights, their gradients and the optimiser's step stay fp32. The estimate counts
the same things (:func:`heterps_cli.profiling.counting.autocast`).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Iterator

import torch
from torch import nn

from heterps_cli.errors import InputError

HALF = {"bf16": torch.bfloat16, "fp16": torch.float16}


def lacks(precision: str | None, device: str) -> str | None:
    """The format ``device`` (``cpu`` or ``cuda``, this machine's) has not for ``precision``: ``TF32`` off a GPU,
    ``bf16`` on a GPU without it (a V100, a T4); None where it can train at it."""
    if precision == "tf32" and device != "cuda":
        return "TF32"
    if precision == "bf16" and device == "cuda" and torch.cuda.is_available() and not torch.cuda.is_bf16_supported():
        return "bf16"
    return None


def check_precision(precision: str | None, device: str) -> None:
    """Exit 2 where this machine cannot measure at ``precision`` (:func:`lacks`)."""
    missing = lacks(precision, device)
    if missing == "TF32":
        raise InputError(
            None,
            None,
            "--precision",
            "tf32 is an NVIDIA GPU's tensor-core format: the cpu has none, so nothing would be measured at it "
            "(measure at fp32, bf16 or fp16 here, or on a GPU with --device cuda)",
        )
    if missing == "bf16":
        raise InputError(
            None,
            None,
            "--precision",
            f"{torch.cuda.get_device_name()} has no bf16: measure at fp16 (autocast) or fp32",
        )


@contextlib.contextmanager
def training_at(precision: str | None, device: str, modules: Iterable[nn.Module]) -> Iterator[None]:
    """Inside, ``modules``' forward passes run as training at ``precision`` runs them (None: as they are).
    Each module's own forward is wrapped, so a layer timed alone and the whole model's step both run
    under it, and backward passes outside it, as autocast wants."""
    if precision is None:
        yield
        return
    wrapped: list[tuple[nn.Module, Callable | None]] = []
    matmul = torch.backends.cuda.matmul.allow_tf32
    cudnn = torch.backends.cudnn.allow_tf32
    try:
        if device == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
            torch.backends.cudnn.allow_tf32 = True  # PyTorch's default: fp32 convolutions with TF32
        if precision in HALF:
            for module in {id(m): m for m in modules}.values():
                wrapped.append((module, module.__dict__.get("forward")))
                module.forward = _autocast(module.forward, device, HALF[precision])  # type: ignore[method-assign]
        yield
    finally:
        for module, own in wrapped:
            if own is None:
                del module.forward
            else:
                module.forward = own
        torch.backends.cuda.matmul.allow_tf32 = matmul
        torch.backends.cudnn.allow_tf32 = cudnn


def _autocast(forward: Callable, device: str, dtype: torch.dtype) -> Callable:
    """``forward`` under a fresh autocast context each call (one context object entered twice, as a nested
    layer's call does, restores the wrong state when it leaves)."""

    @functools.wraps(forward)
    def run(*args, **kwargs):
        with torch.autocast(device_type=device, dtype=dtype):
            return forward(*args, **kwargs)

    return run
