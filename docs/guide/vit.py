"""A model heterps has never seen, for docs/guide/own-model.md: a small Vision Transformer for 32×32
images, written from scratch, whose blocks have residual connections.

``model`` is what ``heterps profile docs/guide/vit.py:model`` measures; ``task`` is what ``heterps run
PLAN --task docs/guide/vit.py:task`` trains: 10 classes of seeded random images (2,048 of them, made in
memory the same way in every process), cross-entropy, AdamW.
"""

from __future__ import annotations

import torch
from torch import nn

from heterps_cli import Task

WIDTH, DEPTH, HEADS, PATCH = 64, 4, 4, 4
TOKENS = (32 // PATCH) ** 2


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.proj = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, HEADS, d // HEADS).permute(2, 0, 3, 1, 4)
        y = nn.functional.scaled_dot_product_attention(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(b, n, d))


class Block(nn.Module):
    """x + attention(norm(x)), then x + mlp(norm(x)): the additions are code between modules."""

    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(WIDTH), Attention()
        self.norm2 = nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Patches(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, WIDTH, PATCH, PATCH)
        self.position = nn.Parameter(torch.zeros(1, TOKENS, WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x).flatten(2).transpose(1, 2) + self.position


class Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.norm(x).mean(1))


class ViT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.patches = Patches()
        self.blocks = nn.Sequential(*(Block() for _ in range(DEPTH)))
        self.head = Head()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.patches(x)))


def model(batch_size: int = 32):
    return ViT(), torch.randn(batch_size, 3, 32, 32)


def task() -> Task:
    images = torch.randn(2048, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    labels = torch.arange(2048) % 10
    return Task(
        model=ViT(),
        data=torch.utils.data.TensorDataset(images, labels),
        loss=nn.CrossEntropyLoss(),
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3),
    )
