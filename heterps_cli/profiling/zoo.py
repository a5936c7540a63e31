"""Built-in models for ``heterps profile``, written with ``torch.nn`` alone (no torchvision here).

Each factory takes ``batch_size`` and ``input_shape`` (per sample, or None for
the default) and returns the module and an example input batch, the same
contract a user's ``file.py:factory`` follows.
"""

from __future__ import annotations

import torch
from torch import nn


class CTR(nn.Module):
    """The HeterPS workload: sparse features through EmbeddingBag tables, dense ones through an MLP."""

    def __init__(self, tables: int = 8, rows: int = 100_000, dim: int = 16, dense: int = 13, hidden: int = 256):
        super().__init__()
        self.embeddings = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum") for _ in range(tables))
        for table in self.embeddings:
            # On parameter servers, split across them (spec section 1b sharded); a plain flag, not a tensor or module.
            table.heterps_sharded = True  # type: ignore[assignment]
        self.bottom = nn.Sequential(nn.Linear(dense, dim), nn.ReLU())
        self.top = nn.Sequential(
            nn.Linear(dim * (tables + 1), hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden // 2),
            nn.ReLU(),
            nn.Linear(hidden // 2, 1),
        )

    def forward(self, sparse: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        pooled = [emb(sparse[:, i]) for i, emb in enumerate(self.embeddings)]
        return self.top(torch.cat([*pooled, self.bottom(dense)], dim=1))


def ctr(batch_size: int, input_shape: tuple[int, ...] | None = None):
    """8 EmbeddingBag tables (100,000 x 16, bags of ``input_shape[0]`` ids, default 4) and a 3-layer MLP."""
    bag = input_shape[0] if input_shape else 4
    generator = torch.Generator().manual_seed(0)
    sparse = torch.randint(0, 100_000, (batch_size, 8, bag), generator=generator)
    dense = torch.randn(batch_size, 13, generator=generator)
    return CTR(), (sparse, dense)


VGG16 = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")


def vgg16(batch_size: int, input_shape: tuple[int, ...] | None = None):
    """VGG-16's 13 conv layers and 5 pools, then a 3-layer classifier; input 3x32x32 by default."""
    channels, height, width = input_shape or (3, 32, 32)
    layers: list[nn.Module] = []
    for v in VGG16:
        if isinstance(v, str):  # "M"
            layers.append(nn.MaxPool2d(2))
        else:
            layers += [nn.Conv2d(channels, v, 3, padding=1), nn.ReLU()]
            channels = v
    side = (height // 32) * (width // 32)
    layers += [
        nn.Flatten(),
        nn.Linear(512 * side, 512),
        nn.ReLU(),
        nn.Dropout(),
        nn.Linear(512, 512),
        nn.ReLU(),
        nn.Linear(512, 10),
    ]
    example = torch.randn(
        batch_size,
        3 if input_shape is None else input_shape[0],
        height,
        width,
        generator=torch.Generator().manual_seed(0),
    )
    return nn.Sequential(*layers), example


def mlp(batch_size: int, input_shape: tuple[int, ...] | None = None):
    """A plain nn.Sequential: 784 -> 1024 -> 1024 -> 1024 -> 10 with ReLUs."""
    features = input_shape[0] if input_shape else 784
    model = nn.Sequential(
        nn.Linear(features, 1024),
        nn.ReLU(),
        nn.Linear(1024, 1024),
        nn.ReLU(),
        nn.Linear(1024, 1024),
        nn.ReLU(),
        nn.Linear(1024, 10),
    )
    return model, torch.randn(batch_size, features, generator=torch.Generator().manual_seed(0))


class Block(nn.Module):
    """A pre-norm transformer block: attention and an MLP, each with a residual connection."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attention = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attention(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class Transformer(nn.Module):
    def __init__(self, vocab: int = 8000, dim: int = 256, heads: int = 4, depth: int = 2):
        super().__init__()
        self.embedding = nn.Embedding(vocab, dim)
        self.blocks = nn.Sequential(*(Block(dim, heads) for _ in range(depth)))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.blocks(self.embedding(tokens))))


def transformer(batch_size: int, input_shape: tuple[int, ...] | None = None):
    """A 2-block, 256-wide, 4-head language model over 8,000 tokens; sequences of 64 by default."""
    length = input_shape[0] if input_shape else 64
    tokens = torch.randint(0, 8000, (batch_size, length), generator=torch.Generator().manual_seed(0))
    return Transformer(), tokens


class BasicBlock(nn.Module):
    """ResNet's basic block: two 3x3 convolutions and a shortcut (a 1x1 convolution where the shape changes)."""

    def __init__(self, inputs: int, outputs: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(inputs, outputs, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(outputs)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(outputs, outputs, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(outputs)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or inputs != outputs:
            self.shortcut = nn.Sequential(
                nn.Conv2d(inputs, outputs, 1, stride=stride, bias=False), nn.BatchNorm2d(outputs)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


def resnet(batch_size: int, input_shape: tuple[int, ...] | None = None):
    """A small ResNet for 32x32 images (ResNet-18's layout at a quarter of its width): a 3x3 stem, four
    stages of two basic blocks (16, 32, 64, 128 channels), pooling and a classifier.
    Its residual blocks make it a chain of blocks, not of layers (``--granularity blocks``)."""
    channels, height, width = input_shape or (3, 32, 32)
    widths = (16, 32, 64, 128)
    stages, inputs = [], widths[0]
    for i, w in enumerate(widths):
        stages.append(nn.Sequential(BasicBlock(inputs, w, 1 if i == 0 else 2), BasicBlock(w, w)))
        inputs = w
    model = nn.Sequential(
        nn.Conv2d(channels, widths[0], 3, padding=1, bias=False),
        nn.BatchNorm2d(widths[0]),
        nn.ReLU(),
        *stages,
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(widths[-1], 10),
    )
    example = torch.randn(batch_size, channels, height, width, generator=torch.Generator().manual_seed(0))
    return model, example


MODELS = {"ctr": ctr, "vgg16": vgg16, "mlp": mlp, "transformer": transformer, "resnet": resnet}
