"""The plan's precision in a run (docs/spec.md section 4b), as the profile measured it
(:mod:`heterps_cli.profiling.precision`).

``bf16`` and ``fp16`` run each stage's forward pass and the loss under autocast, the backward in the types
those forwards chose; the weights, their gradients and the optimiser's state stay fp32, as the spec's
memory terms assume. ``fp16`` scales the loss, as ``torch.amp.GradScaler`` does by default (2^16 at first,
halved on a step whose gradients hold an inf or NaN anywhere in the pipeline, which is then skipped,
doubled after 2,000 clean steps): every process agrees on the step through one all-reduce, so every stage
skips the same ones. ``tf32`` lets a GPU's products and convolutions use TF32. ``fp32`` and no precision
run as PyTorch does by default.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.distributed as dist

from heterps_cli.errors import InputError
from heterps_cli.profiling.precision import HALF, lacks

INITIAL_SCALE, BACKOFF, GROWTH, GROWTH_INTERVAL = 2.0**16, 0.5, 2.0, 2000  # GradScaler's defaults


def check_devices(precision: str | None, devices: dict[str, str], plan_path: str) -> None:
    """Exit 2, before any process starts, where a stage's device cannot train at the plan's ``precision``
    (TF32 on a CPU, bf16 on a GPU without it), naming the type."""
    for kind, device in devices.items():
        missing = lacks(precision, "cuda" if device.startswith("cuda") else "cpu")
        if missing is None:
            continue
        if missing == "TF32":
            why = f"type {kind} runs on {device}, which has no TF32 (an NVIDIA GPU's tensor-core format)"
        else:
            why = f"type {kind} runs on {torch.cuda.get_device_name()}, which has no bf16"
        raise InputError(
            plan_path,
            None,
            "precision",
            f"the plan trains at {precision}, but {why}: plan at a precision the device has (profile "
            "--precision fp32, fp16 or bf16), or map the type onto a device that has it (--map)",
        )


class Precision:
    """One process's precision: its autocast, its loss scale (fp16) and its update."""

    def __init__(self, name: str | None, device: torch.device):
        self.name, self.device = name or "fp32", device
        self.scale = INITIAL_SCALE if self.name == "fp16" else 1.0
        self.clean = 0  # fp16: steps since the scale last changed
        self.skipped = 0
        if device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = self.name == "tf32"
            torch.backends.cudnn.allow_tf32 = True  # PyTorch's default: fp32 convolutions with TF32

    def autocast(self):
        """The context a forward pass (and the loss) runs in."""
        if self.name not in HALF:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=HALF[self.name])

    def scaled(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss the backward pass starts from."""
        return loss * self.scale if self.name == "fp16" else loss

    def step(self, optimiser: torch.optim.Optimizer) -> None:
        """The optimiser's step on the summed gradients, unscaled; under fp16 skipped by every process where
        any process's gradients are not finite."""
        if self.name != "fp16":
            optimiser.step()
            return
        grads = [p.grad for group in optimiser.param_groups for p in group["params"] if p.grad is not None]
        local = [g.to_local() if hasattr(g, "to_local") else g for g in grads]
        bad = torch.tensor([0.0 if all(bool(torch.isfinite(g).all()) for g in local) else 1.0])
        dist.all_reduce(bad, op=dist.ReduceOp.MAX)
        if bad.item() > 0:
            self.scale, self.clean, self.skipped = self.scale * BACKOFF, 0, self.skipped + 1
            return
        for g in local:
            g.div_(self.scale)
        optimiser.step()
        self.clean += 1
        if self.clean == GROWTH_INTERVAL and math.isfinite(self.scale * GROWTH):
            self.scale, self.clean = self.scale * GROWTH, 0
