"""A small GPT whose output head shares the token embedding's weight, as GPT-2 and nanoGPT tie them
(docs/guide/training.md, "Tied weights"): ``model`` is what ``heterps profile`` measures, ``task`` what
``heterps run --task`` trains, on a fixed random token stream."""

from __future__ import annotations

import torch
from torch import nn

from heterps_cli import Task

VOCAB, WIDTH, CONTEXT, DEPTH = 64, 32, 16, 2


class Embed(nn.Module):
    """Tokens and positions to vectors."""

    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, WIDTH)
        nn.init.normal_(self.tok.weight, std=0.02)  # as GPT-2: the head's logits start small
        self.pos = nn.Parameter(torch.randn(CONTEXT, WIDTH) * 0.02)

    def forward(self, tokens):
        return self.tok(tokens) + self.pos[: tokens.shape[1]]


class Block(nn.Module):
    """A pre-norm transformer block, causal."""

    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.attn = nn.MultiheadAttention(WIDTH, 4, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))
        self.register_buffer("mask", torch.triu(torch.ones(CONTEXT, CONTEXT, dtype=torch.bool), 1), persistent=False)

    def forward(self, x):
        h = self.norm1(x)
        n = x.shape[1]
        x = x + self.attn(h, h, h, attn_mask=self.mask[:n, :n], need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class Head(nn.Module):
    """The last norm and the output projection, whose weight is the embedding's."""

    def __init__(self, embedding: nn.Embedding):
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.out = nn.Linear(WIDTH, VOCAB, bias=False)
        self.out.weight = embedding.weight  # the tie

    def forward(self, x):
        return self.out(self.norm(x))


def gpt() -> nn.Sequential:
    embed = Embed()
    return nn.Sequential(embed, *(Block() for _ in range(DEPTH)), Head(embed.tok))


def model(batch_size: int = 8):
    """The module, an example batch of token ids, and its blocks (the layers a plan cuts between)."""
    net = gpt()
    return net, torch.randint(0, VOCAB, (batch_size, CONTEXT)), list(net)


def _loss(logits, target):
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1))


def sequences(count: int = 512) -> torch.Tensor:
    """``count`` rows of ``CONTEXT + 1`` tokens, each the one before times 5 plus 3 (mod the vocabulary)
    from a random first one: a rule the model can learn, so that its loss falls."""
    g = torch.Generator().manual_seed(1234)
    rows = [torch.randint(0, VOCAB, (count,), generator=g)]
    for _ in range(CONTEXT):
        rows.append((rows[-1] * 5 + 3) % VOCAB)
    return torch.stack(rows, dim=1)


def task() -> Task:
    """Next-token prediction on :func:`sequences`, with Adam."""
    stream = sequences()
    data = torch.utils.data.TensorDataset(stream[:, :-1], stream[:, 1:])
    net = gpt()
    return Task(net, data, _loss, lambda p: torch.optim.Adam(p, lr=3e-3), blocks=list(net))
