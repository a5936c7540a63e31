"""Recurrent layers priced by their own formulas: ``nn.LSTM``, ``nn.GRU`` and ``nn.RNN`` (``--estimate``).

Torch's FLOP counter has no formula for the fused recurrent kernels (the CPU's ``mkldnn_rnn_layer``, CUDA's
``_cudnn_rnn``), so an LSTM counted operator by operator costs nothing; a GRU or an RNN on the CPU runs
cell by cell, hundreds of small operators where a GPU runs one fused kernel. So while ``--estimate``
counts a layer (:func:`priced_recurrent`), each recurrent module runs as a stand-in of the same shapes
whose forward and backward record, per layer and direction, the work of the kernels cuDNN runs:

* the input projection of every step at once, a product of ``(T N) x I`` by ``I x G H``
  (``G`` gates: 4 for an LSTM, 3 for a GRU, 1 for an RNN; ``T`` steps, ``N`` samples, ``I`` inputs,
  ``H`` hidden units), ``2 T N G H I`` FLOPs;
* the recurrence, ``T`` kernels one after another, each a product of ``N x H`` by ``H x G H``
  (``2 N G H H`` FLOPs, and an LSTM's projection ``proj_size``) with the gates' element-wise work
  (:data:`ELEMENTWISE` per hidden unit), reading the recurrent weights again: a small batch prices at
  a small product's efficiency, and a long sequence at a kernel per step;
* backward, each product twice (the input's gradient and the weights'), the element-wise work twice.

They run on cuDNN, as convolutions do: under fp32 at TF32 where the GPU has it, torch's default
(``torch.backends.cudnn.allow_tf32``). Bytes: the forward reads the inputs and the weights and writes
the outputs and, for the backward, the gates of every step; the backward reads those and the output's
gradient and writes the input's and the weights' gradients.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}
# Element-wise FLOPs per hidden unit and step, forward: an LSTM's four gates' two bias adds and the sum of
# the two products (12), three sigmoids and two tanh (5), the cell's f c + i g (3), h = o tanh(c) (1); a
# GRU's 9 adds, 3 activations, r (W h + b) (1) and h = (1 - z) n + z h (3); an RNN's 3 adds and 1 activation.
ELEMENTWISE = {"LSTM": 21, "GRU": 16, "RNN_TANH": 4, "RNN_RELU": 4}


def _layers(module: nn.RNNBase) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
    """Per layer and direction: its input weights, recurrent weights and projection (an LSTM's
    ``proj_size``), in the order cuDNN runs them."""
    out = []
    for layer in range(module.num_layers):
        for suffix in ("", "_reverse")[: 2 if module.bidirectional else 1]:
            w_ih = getattr(module, f"weight_ih_l{layer}{suffix}")
            w_hh = getattr(module, f"weight_hh_l{layer}{suffix}")
            w_hr = getattr(module, f"weight_hr_l{layer}{suffix}", None)
            out.append((w_ih, w_hh, w_hr))
    return out


def recurrent_ops(module: nn.RNNBase, steps: int, samples: int, dtype: str, backward: bool) -> list:
    """The kernels of ``module`` over ``steps`` steps of ``samples`` samples, forward or ``backward``: per
    layer and direction, the input projection of every step at once (backward: the inputs' gradient and
    the weights', two products), then one kernel per step, in order, each a product of the step's state
    by the recurrent weights (read again every step) with the gates' element-wise work."""
    from heterps_cli.profiling.counting import Op

    mode, times = module.mode, 2.0 if backward else 1.0
    element = 2 if dtype in ("bf16", "fp16") else 4
    suffix = "_backward" if backward else ""
    ops = []
    for w_ih, w_hh, w_hr in _layers(module):
        gates, inputs = w_ih.shape
        hidden = gates // GATES[mode]
        state = w_hh.shape[1]  # the recurrent input: the hidden state, or its projection
        tn = steps * samples
        projection = Op(
            f"{mode.lower()}_input{suffix}",
            2.0 * tn * gates * inputs,
            (tn * inputs + tn * gates + w_ih.numel()) * element,
            dtype,
            (1, tn, gates, inputs),
            conv=True,  # cuDNN's, as a convolution: TF32 under fp32 where the GPU has it (torch's default)
            kind="fc",  # a product as a linear layer's
        )
        ops += [projection, projection] if backward else [projection]
        flops = 2.0 * samples * gates * state + ELEMENTWISE[mode] * samples * hidden
        flops += 2.0 * samples * hidden * state if w_hr is not None else 0.0
        weights = sum(w.numel() for w in (w_hh, w_hr) if w is not None) * element
        per_step = (samples * (gates + hidden + 2 * state)) * element + weights
        step = Op(
            f"{mode.lower()}_step{suffix}",
            times * flops,
            times * per_step,
            dtype,
            (1, samples, gates, state),
            kind="fc",
        )
        ops += [step] * steps
    return ops


class _Priced(torch.autograd.Function):
    """A recurrent module's forward and backward as the shapes they give and the work they record."""

    @staticmethod
    def forward(ctx, module, shapes, steps, samples, dtype, x, *tensors):
        ctx.module, ctx.steps, ctx.samples, ctx.dtype = module, steps, samples, dtype
        ctx.shapes = [t.shape for t in (x, *tensors)]
        ctx.save_for_backward(x, *tensors)
        _record(recurrent_ops(module, steps, samples, dtype, backward=False))
        return tuple(x.new_empty(shape) for shape in shapes)

    @staticmethod
    def backward(ctx, *grads):
        _record(recurrent_ops(ctx.module, ctx.steps, ctx.samples, ctx.dtype, backward=True))
        saved = ctx.saved_tensors
        return (None, None, None, None, None, *(torch.empty_like(t) if t.requires_grad else None for t in saved))


def _record(ops: list) -> None:
    from heterps_cli.profiling.counting import Recorder

    if Recorder.active:
        Recorder.active[-1].ops.extend(ops)


def _stand_in(module: nn.RNNBase):
    """``module``'s forward as :class:`_Priced`: the same outputs' shapes, batched or not, batch first or
    not, with or without an initial state (a PackedSequence runs the module itself)."""
    original = module.forward

    def forward(input, hx=None):
        if not isinstance(input, torch.Tensor):
            return original(input, hx)
        batched = input.dim() == 3
        x = input if batched else input.unsqueeze(1)
        steps, samples = (x.shape[1], x.shape[0]) if module.batch_first and batched else (x.shape[0], x.shape[1])
        directions = 2 if module.bidirectional else 1
        out_size = module.proj_size or module.hidden_size
        shape = (samples, steps) if module.batch_first and batched else (steps, samples)
        states = [(directions * module.num_layers, samples, out_size)]
        if module.mode == "LSTM":
            states.append((directions * module.num_layers, samples, module.hidden_size))
        given = [] if hx is None else list(hx) if isinstance(hx, tuple) else [hx]
        weights = [w for w in module._flat_weights if w is not None]
        dtype = _dtype_of(x, weights)
        outs = _Priced.apply(
            module, [(*shape, directions * out_size), *states], steps, samples, dtype, x, *weights, *given
        )
        output, *final = outs
        if not batched:
            output, final = output.squeeze(1), [s.squeeze(1) for s in final]
        return output, (tuple(final) if module.mode == "LSTM" else final[0])

    return forward


def _dtype_of(x: torch.Tensor, weights: list[torch.Tensor]) -> str:
    """The precision the kernels run at: autocast's where it is on (products in half), else the tensors'."""
    from heterps_cli.profiling.counting import HALF

    if torch.is_autocast_enabled("cpu"):
        return HALF.get(torch.get_autocast_dtype("cpu"), "fp32")
    return HALF.get(x.dtype, HALF.get(weights[0].dtype, "fp32") if weights else "fp32")


@contextlib.contextmanager
def priced_recurrent(module: nn.Module) -> Iterator[list[str]]:
    """Every recurrent module inside ``module`` priced by :func:`recurrent_ops` while inside; yields
    their names (empty: the layer holds none)."""
    found = [(name, m) for name, m in module.named_modules() if isinstance(m, nn.RNNBase)]
    for _, m in found:
        m.forward = _stand_in(m)
    try:
        yield [name or type(m).__name__ for name, m in found]
    finally:
        for _, m in found:
            del m.forward  # the class's own forward again
