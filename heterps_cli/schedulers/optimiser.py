"""Adam for the schedulers' small policies, without ``torch.optim``.

Why not ``torch.optim.Adam``: in torch 2.13 the first optimiser a process builds
imports ``torch._dynamo`` (through ``torch._disable_dynamo`` on
``add_param_group``), 1.2 s on the 2-core benchmark machine, which is 15% of
planning 64 layers and more than all of training on 16. The update below is
``torch.optim.Adam``'s single-tensor path with its defaults (no weight decay,
no amsgrad), step for step: ``tests/test_rl.py`` checks that both give the same
parameters bit for bit, so plans did not change with it.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn


class Adam:
    def __init__(self, parameters: Iterable[nn.Parameter], lr: float, betas=(0.9, 0.999), eps: float = 1e-8):
        self.parameters = [p for p in parameters if p.requires_grad]
        self.lr, self.betas, self.eps = lr, betas, eps
        self.steps = [0] * len(self.parameters)  # per parameter, as torch counts them
        self.mean = [torch.zeros_like(p) for p in self.parameters]
        self.square = [torch.zeros_like(p) for p in self.parameters]

    def zero_grad(self) -> None:
        for p in self.parameters:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        beta1, beta2 = self.betas
        for i, (p, mean, square) in enumerate(zip(self.parameters, self.mean, self.square)):
            if p.grad is None:
                continue
            self.steps[i] += 1
            step_size = self.lr / (1 - beta1 ** self.steps[i])
            correction2 = (1 - beta2 ** self.steps[i]) ** 0.5
            mean.lerp_(p.grad, 1 - beta1)
            square.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
            p.addcdiv_(mean, (square.sqrt() / correction2).add_(self.eps), value=-step_size)
