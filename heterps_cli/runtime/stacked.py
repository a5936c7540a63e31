"""A multi-layer recurrent module as one module per layer, so that a plan can cut between its layers.

``nn.LSTM(num_layers=2)`` is one module: a profile lists it as one layer and no plan can put its two
layers on two stages. :func:`one_layer_each` gives the same computation as a list of one-layer modules,
each returning its output sequence (the next one's input), which a model's ``nn.Sequential`` (or the
factory's blocks) holds in its place; ``heterps profile`` then lists them as layers, and ``heterps run``
cuts between them. The weights are the stacked module's, layer by layer; nn.LSTM's ``dropout`` between
layers is each but the last one's output dropout.
"""

from __future__ import annotations

import torch
from torch import nn


class OneLayer(nn.Module):
    """One layer of a stacked recurrent module: its output sequence alone (the states are dropped, as a
    chain's next layer takes one tensor), then the dropout the stack applies between layers."""

    def __init__(self, rnn: nn.RNNBase, dropout: float = 0.0):
        super().__init__()
        self.rnn = rnn
        self.dropout = nn.Dropout(dropout) if dropout else nn.Identity()

    def forward(self, x):
        return self.dropout(self.rnn(x)[0])


def one_layer_each(rnn: nn.RNNBase) -> list[OneLayer]:
    """``rnn``'s layers as :class:`OneLayer` modules holding copies of its weights (so a trained stack
    converts too): applied in turn to one input, they give ``rnn(input)[0]``."""
    out = []
    directions = 2 if rnn.bidirectional else 1
    for k in range(rnn.num_layers):
        inputs = rnn.input_size if k == 0 else (rnn.proj_size or rnn.hidden_size) * directions
        options: dict[str, object] = {"bias": rnn.bias, "batch_first": rnn.batch_first}
        options["bidirectional"] = rnn.bidirectional
        if isinstance(rnn, nn.LSTM):
            options["proj_size"] = rnn.proj_size
        if isinstance(rnn, nn.RNN):
            options["nonlinearity"] = rnn.nonlinearity
        layer = type(rnn)(inputs, rnn.hidden_size, num_layers=1, **options)  # type: ignore[arg-type]
        first = rnn.weight_ih_l0
        assert isinstance(first, torch.Tensor)
        layer.to(device=first.device, dtype=first.dtype)
        for name, p in layer.named_parameters():
            source = getattr(rnn, name.replace("_l0", f"_l{k}"))
            p.data.copy_(source.data)
        out.append(OneLayer(layer, rnn.dropout if k < rnn.num_layers - 1 else 0.0))
    return out
