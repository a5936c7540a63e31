"""What a layer runs, operator by operator, without running it: the work ``--estimate`` prices.

Every operator a layer's forward and backward dispatch (views aside, as they
launch no kernel) is recorded with its FLOPs (``torch.utils.flop_counter``'s
formulas), the bytes it reads and writes (its tensor inputs and outputs, each
at most its storage: a broadcast bias is read once), the precision of its
floating inputs, and a product's dimensions (batch, m, n, k), on which the
efficiency a GPU reaches depends.

:func:`abstract` builds and runs the model on fake tensors
(``torch._subclasses.fake_tensor``): shapes, dtypes and autograd as real, no
storage and no arithmetic, so a 7B-parameter model is counted in seconds and
little memory.
"""

from __future__ import annotations

import contextlib
import math
import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map
from torch.utils.flop_counter import flop_registry

# Operators that only re-describe a tensor's memory: no kernel runs for them.
VIEWS = {
    "view",
    "_unsafe_view",
    "t",
    "transpose",
    "permute",
    "expand",
    "detach",
    "alias",
    "as_strided",
    "unsqueeze",
    "squeeze",
    "reshape",
    "slice",
    "select",
    "split",
    "split_with_sizes",
    "unbind",
    "_reshape_alias",
}
# Operators that only allocate: no kernel touches the memory until another operator writes it.
ALLOCATIONS = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"}
# Operators that compute (products, factorisations, fused recurrent or convolution kernels) but that
# torch.utils.flop_counter has no formula for: priced by their bytes alone, their arithmetic missing, so an
# estimate names them (recurrent modules have their own formulas: :mod:`.recurrent`).
COMPUTES = re.compile(
    r"rnn|lstm|gru|conv|fft|linalg|cholesky|svd|_qr|eig|solve|inverse|cudnn|mkldnn|miopen|_scaled_mm|cdist|"
    r"grid_sampler|ctc_loss|embedding_bag|einsum|tensordot"
)
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")  # docs/spec.md section 2's precision
HALF = {torch.bfloat16: "bf16", torch.float16: "fp16"}


@dataclass(frozen=True)
class Op:
    """One operator's work: FLOPs, bytes read and written, the dtype of its floating inputs ("fp32",
    "bf16", "fp16"; "int" for none), and a product's (batch, m, n, k) or a convolution's as a product."""

    name: str
    flops: float
    bytes: float
    dtype: str
    dims: tuple[int, int, int, int] | None = None
    conv: bool = False  # a cuDNN kernel (a convolution, a recurrent layer's): TF32 under fp32 (estimate.peak_of)
    kind: str | None = None  # the layer kind whose efficiency a product reaches, where not its layer's
    unpriced: bool = False  # it computes, but no formula counts its FLOPs (:data:`COMPUTES`)
    attention: bool = False  # fused attention: at fp32 a GPU with TF32 runs it as 3xTF32 (estimate.peak_of)


@dataclass(frozen=True)
class Work:
    """What one layer does on one batch: its operators, the forward's first."""

    ops: tuple[Op, ...]
    ahead: int  # how many of ops are the forward's

    @property
    def flops(self) -> float:
        return float(sum(op.flops for op in self.ops))

    @property
    def bytes(self) -> float:
        return float(sum(op.bytes for op in self.ops))

    @property
    def kernels(self) -> int:
        return len(self.ops)

    @property
    def unpriced(self) -> dict[str, int]:
        """The operators that compute but have no FLOP formula, by name, with how many times each runs."""
        out: dict[str, int] = {}
        for op in self.ops:
            if op.unpriced:
                out[op.name] = out.get(op.name, 0) + 1
        return out

    @property
    def forward(self) -> Work:
        """The forward pass's own share (docs/spec.md section 1g: what recomputation runs again)."""
        return Work(self.ops[: self.ahead], self.ahead)


def _bytes(t: torch.Tensor) -> float:
    whole = t.numel() * t.element_size()
    try:
        return float(min(whole, t.untyped_storage().nbytes()))
    except (RuntimeError, NotImplementedError):  # a tensor with no storage of its own
        return float(whole)


def _dtype(tensors: list[torch.Tensor]) -> str:
    floats = {t.dtype for t in tensors if t.is_floating_point()}
    for dtype, name in HALF.items():
        if dtype in floats:
            return name
    return "fp32" if floats else "int"


def _dims(name: str, args: tuple, out) -> tuple[tuple[int, int, int, int] | None, bool]:
    """A product's (batch, m, n, k); a convolution's as the product it is computed as (m the output
    positions, n the output channels, k what each sums over), and whether it is one."""
    shapes = [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]
    if name == "mm" and len(shapes) >= 2:
        (m, k), (_, n) = shapes[0][-2:], shapes[1][-2:]
        return (1, m, n, k), False
    if name == "addmm" and len(shapes) >= 3:
        (m, k), (_, n) = shapes[1][-2:], shapes[2][-2:]
        return (1, m, n, k), False
    if name in ("bmm", "baddbmm") and len(shapes) >= 2:
        a, b = shapes[-2], shapes[-1]
        return (a[0], a[1], b[2], a[2]), False
    if name.startswith("_scaled_dot_product") and len(shapes) >= 2:
        queries, keys = shapes[0], shapes[1]
        return (queries[0] * queries[1], queries[2], keys[2], queries[3]), False
    if name == "convolution" and len(shapes) >= 2:
        outputs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        x, w, y = shapes[0], shapes[1], tuple(outputs[0].shape) if outputs else shapes[0]
        return (1, x[0] * math.prod(y[2:]), w[0], math.prod(w[1:])), True
    if name == "convolution_backward" and len(shapes) >= 3:  # (output's gradient, input, weight, ...)
        y, x, w = shapes[0], shapes[1], shapes[2]
        return (1, x[0] * math.prod(y[2:]), w[0], math.prod(w[1:])), True
    return None, False


def _fused_attention_flops(name: str, args: tuple, kwargs: dict) -> float:
    """Fused attention as the fake tensors run it (the CPU's kernel, which flop_counter does not count):
    the products of its scores and of their weights, forward or backward, as flop_counter counts a GPU's
    flash attention; under a causal mask only the scores it keeps, as the kernels skip the masked tiles."""
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    shapes = [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]
    if name == "_scaled_dot_product_flash_attention_for_cpu" and len(shapes) >= 3:
        causal = args[4] if len(args) > 4 else kwargs.get("is_causal", False)
        flops, (queries, keys) = sdpa_flop_count(*shapes[:3]), shapes[:2]
    elif name == "_scaled_dot_product_flash_attention_for_cpu_backward" and len(shapes) >= 4:
        causal = args[7] if len(args) > 7 else kwargs.get("is_causal", False)
        flops, (queries, keys) = sdpa_backward_flop_count(*shapes[:4]), shapes[1:3]
    else:
        return 0.0
    return float(flops) * (kept_by_causal_mask(queries[-2], keys[-2]) if causal else 1.0)


def kept_by_causal_mask(queries: int, keys: int) -> float:
    """The share of the scores a causal mask keeps: query i sees keys 0..i (PyTorch's is_causal)."""
    if queries <= keys:
        return (queries + 1) / (2 * keys)
    return (keys * (keys + 1) / 2 + (queries - keys) * keys) / (queries * keys)


class Recorder(TorchDispatchMode):
    """Records each operator dispatched inside it (:class:`Op`); ``active`` holds the recorders entered,
    the innermost last, which a recurrent layer's stand-in records its kernels into (:mod:`.recurrent`)."""

    active: list[Recorder] = []

    def __init__(self):
        super().__init__()
        self.ops: list[Op] = []

    def __enter__(self):
        Recorder.active.append(self)
        return super().__enter__()

    def __exit__(self, *exc):
        Recorder.active.remove(self)
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        if name in VIEWS or name in ALLOCATIONS or func.namespace == "prim":  # prim: metadata (its device)
            return out
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        outputs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        counter = flop_registry.get(func.overloadpacket)
        fused = False
        if counter is not None:
            flops = float(counter(*args, **kwargs, out_val=out))
        else:
            flops = _fused_attention_flops(name, args, kwargs)
            fused = flops > 0
        dims, conv = _dims(name, args, out) if flops else (None, False)
        # a *_like operator reads its input's shape, not its values
        moved = (0.0 if name.endswith("_like") else sum(_bytes(t) for t in inputs)) + sum(_bytes(t) for t in outputs)
        unpriced = not flops and counter is None and bool(COMPUTES.search(name))
        self.ops.append(Op(name, flops, moved, _dtype(inputs), dims, conv, unpriced=unpriced, attention=fused))
        return out


# What CUDA's autocast runs in fp32 (PyTorch's autocast docs, "CUDA Ops that can autocast to float32")
# and the CPU's autocast leaves in half: softmax above all, whose fp32 copy of attention's scores is
# much of a half-precision block's memory traffic.
FP32_ON_GPU = {
    "softmax",
    "log_softmax",
    "layer_norm",
    "group_norm",
    "norm",
    "normalize",
    "cross_entropy",
    "nll_loss",
    "mse_loss",
    "l1_loss",
    "smooth_l1_loss",
    "kl_div",
    "binary_cross_entropy_with_logits",
    "exp",
    "log",
    "pow",
    "sum",
    "prod",
    "cumsum",
    "cumprod",
    "rsqrt",
    "reciprocal",
    "softplus",
}


class AsOnGPU(TorchFunctionMode):
    """Runs what a GPU runs where the CPU runs something else: dropout in training is one fused kernel
    on a GPU (``native_dropout``: the input read, the output and a one-byte mask written), three on the
    CPU (a float mask drawn, scaled, multiplied); under autocast, the operators CUDA's autocast runs in
    fp32 take their half inputs as fp32 copies."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.dropout:
            x, p, training = _dropout_args(*args, **kwargs)
            if training and 0 < p < 1 and not kwargs.get("inplace"):
                return torch.native_dropout(x, p, True)[0]
        if getattr(func, "__name__", None) in FP32_ON_GPU and torch.is_autocast_enabled("cpu"):
            args, kwargs = tree_map(_to_fp32, (args, kwargs))
        return func(*args, **kwargs)


def _to_fp32(x):
    return x.float() if isinstance(x, torch.Tensor) and x.dtype in HALF else x


def _dropout_args(input, p=0.5, training=True, inplace=False):
    return input, p, training


@contextlib.contextmanager
def abstract() -> Iterator[None]:
    """Tensors made inside are fake: shapes, dtypes and autograd without storage or arithmetic.
    (Copying a module of them reads a data pointer, which fake tensors warn of: nothing uses it.)"""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor")
        with FakeTensorMode(allow_non_fake_inputs=False):
            yield


def autocast(precision: str) -> contextlib.AbstractContextManager:
    """The half precisions run under autocast (products in half, what autocast keeps in fp32 in
    fp32), as a mixed-precision trainer runs them; fp32 and tf32 as the model is."""
    if precision in ("bf16", "fp16"):
        return torch.autocast("cpu", dtype=torch.bfloat16 if precision == "bf16" else torch.float16)
    return contextlib.nullcontext()
