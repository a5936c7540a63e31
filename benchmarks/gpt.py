"""GPT-shaped models for the GPU benchmarks, written as a user would write them in plain PyTorch.

``bench_gpu_layers.py`` times their layers on a GPU; ``bench_gpu_estimates.py`` estimates them
(``heterps profile estimate benchmarks/gpt.py:gpt_neo``) and holds the estimate against the measured
GPT-Neo-2.7B layers in ``benchmarks/data/sailor-gpt-neo``. The chain is Megatron-LM's GPT as it
runs without fused kernels: a word and a position embedding, pre-norm blocks whose attention is
unfused (scores, scale, causal mask, softmax, dropout, weighted sum) and whose MLP is a GELU between
two linear layers (a pair tensor parallelism splits), a final norm, and the logits; dropout 0.1 after
the embedding, on the attention's probabilities and on each block's two outputs (Megatron's
defaults). The loss is the estimate's (``--loss cross-entropy``), on the logits layer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class Shape:
    hidden: int = 2560
    heads: int = 20
    sequence: int = 2048
    vocab: int = 50257
    depth: int = 32


SHAPES = {
    "gpt-neo-2.7b": Shape(),
    "llama-7b-8k": Shape(hidden=4096, heads=32, sequence=8192, vocab=32000),  # issue 49's 7B at sequence 8,192
    # OPT's published sizes (issue 65's held-out shapes); OPT's MLP is ReLU, timed here with GELU's cost
    "opt-350m": Shape(hidden=1024, heads=16, sequence=2048, vocab=50272, depth=24),
    "opt-30b": Shape(hidden=7168, heads=56, sequence=2048, vocab=50272, depth=48),
}


class Embedding(nn.Module):
    def __init__(self, s: Shape, dropout: float = 0.0):
        super().__init__()
        self.words = nn.Embedding(s.vocab, s.hidden)
        self.positions = nn.Embedding(s.sequence, s.hidden)
        self.dropout = nn.Dropout(dropout)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        where = torch.arange(tokens.shape[1], device=tokens.device)
        return self.dropout(self.words(tokens) + self.positions(where))


class Block(nn.Module):
    def __init__(self, s: Shape, sdpa: bool = False, dropout: float = 0.0):
        super().__init__()
        self.heads, self.sdpa = s.heads, sdpa
        self.norm1, self.norm2 = nn.LayerNorm(s.hidden), nn.LayerNorm(s.hidden)
        self.qkv, self.out = nn.Linear(s.hidden, 3 * s.hidden), nn.Linear(s.hidden, s.hidden)
        self.mlp = nn.Sequential(nn.Linear(s.hidden, 4 * s.hidden), nn.GELU(), nn.Linear(4 * s.hidden, s.hidden))
        self.attention_dropout, self.hidden_dropout = nn.Dropout(dropout), nn.Dropout(dropout)
        mask = torch.ones(s.sequence, s.sequence, dtype=torch.bool).triu(1)
        self.register_buffer("mask", mask, persistent=False)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        if self.sdpa:
            mixed = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(h // self.heads)
            scores = scores.masked_fill(self.mask[:t, :t], float("-inf"))
            mixed = self.attention_dropout(scores.softmax(-1)) @ v
        return self.out(mixed.transpose(1, 2).reshape(b, t, h))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.hidden_dropout(self.attention(self.norm1(x)))
        return x + self.hidden_dropout(self.mlp(self.norm2(x)))


class Head(nn.Module):
    """The final norm, the logits and the loss in one module (``bench_gpu_layers``'s head)."""

    def __init__(self, s: Shape):
        super().__init__()
        self.norm, self.logits = nn.LayerNorm(s.hidden), nn.Linear(s.hidden, s.vocab, bias=False)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        logits = self.logits(self.norm(x))
        return F.cross_entropy(logits.flatten(0, 1).float(), target.flatten())


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Megatron's vocabulary-parallel cross-entropy on one GPU (tp 1), its kernels in its order: the
    row maximum subtracted, exponentiated and normalised in place into the softmax it keeps; the
    backward subtracts one at each target and scales that softmax in place. Its all-reduces over the
    tensor-parallel group are no-ops at tp 1 and left out."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        shifted = logits - logits.max(dim=-1)[0].unsqueeze(-1)
        rows = shifted.view(-1, shifted.shape[-1])
        at = torch.arange(rows.shape[0], device=rows.device)
        predicted = rows[at, target.reshape(-1)].clone().view_as(target)
        torch.exp(shifted, out=shifted)
        total = shifted.sum(dim=-1)
        shifted.div_(total.unsqueeze(-1))
        ctx.save_for_backward(shifted, target)
        return torch.log(total) - predicted

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        softmax, target = ctx.saved_tensors
        rows = softmax.view(-1, softmax.shape[-1])
        rows[torch.arange(rows.shape[0], device=rows.device), target.reshape(-1)] -= 1.0
        softmax.mul_(grad.unsqueeze(-1))
        return softmax, None


class SailorLast(nn.Module):
    """Sailor's GPT-Neo layer 33 (its Megatron-DeepSpeed fork's ``gpt_neo_model.py``): the last pipeline
    layer is the final norm alone, and the pipeline's loss, a vocabulary-parallel cross-entropy, is
    computed on the normed hidden states as they are (no logits layer), masked and averaged; its profile
    times them together (the layer's output is the hidden states and the loss)."""

    def __init__(self, s: Shape):
        super().__init__()
        self.norm = nn.LayerNorm(s.hidden)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        losses = _VocabParallelCrossEntropy.apply(self.norm(x), target)
        mask = torch.ones_like(losses)
        return (losses.reshape(-1) * mask.reshape(-1)).sum() / mask.sum()


class GPT(nn.Module):
    """The chain: embedding, ``depth`` blocks, final norm, logits."""

    def __init__(self, s: Shape, dropout: float = 0.1):
        super().__init__()
        self.embedding = Embedding(s, dropout)
        self.blocks = nn.Sequential(*(Block(s, dropout=dropout) for _ in range(s.depth)))
        self.norm = nn.LayerNorm(s.hidden)
        self.logits = nn.Linear(s.hidden, s.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.logits(self.norm(self.blocks(self.embedding(tokens))))

    def layers(self) -> list[nn.Module]:
        return [self.embedding, *self.blocks, self.norm, self.logits]


def _made(s: Shape, batch_size: int):
    model = GPT(s)
    tokens = torch.randint(0, s.vocab, (batch_size, s.sequence), generator=torch.Generator().manual_seed(0))
    return model, tokens, model.layers()


def gpt_neo(batch_size: int = 1, input_shape: tuple[int, ...] | None = None):
    """GPT-Neo-2.7B's shapes (hidden 2,560, 20 heads, 32 blocks, vocabulary 50,257) at sequence 2,048
    (``--input-shape`` another)."""
    return _made(Shape(sequence=input_shape[0] if input_shape else 2048), batch_size)


def gpt_7b(batch_size: int = 1, input_shape: tuple[int, ...] | None = None):
    """A 7B-parameter GPT: 32 blocks of hidden 4,096 and 32 heads, vocabulary 32,000, sequence 8,192."""
    return _made(SHAPES["llama-7b-8k"] if not input_shape else Shape(4096, 32, input_shape[0], 32000), batch_size)
