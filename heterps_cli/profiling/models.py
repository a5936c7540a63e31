"""What heterps measures in a PyTorch model: loading it from a zoo name or a factory, and finding its
layers and the calls a forward pass makes to them (docs/guide/profiling.md)."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from heterps_cli.errors import SIGNALLED, InputError
from heterps_cli.formats import fitted_name
from heterps_cli.profiling.zoo import MODELS


@dataclass
class Model:
    name: str
    module: nn.Module
    inputs: tuple  # positional inputs of one batch
    blocks: list[nn.Module] | None = None  # the factory's own layers, if it gave them
    source: str | None = None  # the user's file the factory came from (errors name its lines)
    # docs/spec.md section 2's chain: whether heterps run can cut between any two of its layers (None:
    # not looked at yet), and what a profile of it should say about its layers
    chain: bool | None = None
    notes: list[str] = field(default_factory=list)


def model_from_spec(spec: str, batch_size: int, input_shape: tuple[int, ...] | None) -> Model:
    if spec in MODELS:
        try:
            module, example = MODELS[spec](batch_size, input_shape)
        except (RuntimeError, MemoryError) as exc:  # the allocator: a batch past this machine's memory
            raise InputError(
                None,
                None,
                "batch_size",
                f"building {spec}'s example batch of {batch_size:,} samples failed ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else 'out of memory'}): give a batch this machine can hold",
            ) from None
        return Model(spec, module, example if isinstance(example, tuple) else (example,))
    if ":" not in spec:
        raise InputError(
            None,
            None,
            "MODEL",
            f"{spec!r} is neither a built-in model ({', '.join(MODELS)}) nor FILE.py:FACTORY / package.module:FACTORY",
        )
    where, name = spec.rsplit(":", 1)
    factory = _factory(where, name)
    kwargs: dict[str, Any] = {}
    accepted = inspect.signature(factory).parameters
    if "batch_size" in accepted:
        kwargs["batch_size"] = batch_size
    if "input_shape" in accepted:
        kwargs["input_shape"] = input_shape
    try:
        made = factory(**kwargs)
    except SIGNALLED:
        raise
    except BaseException as exc:  # the user's code: sys.exit and its own BaseExceptions too
        raise _user_error(where, name, exc, "raised") from None
    model = _model_from(made, where, name, batch_size, input_shape)
    try:
        model.source = where if where.endswith(".py") else inspect.getsourcefile(factory)
    except TypeError:  # a factory written in C has no source file
        pass
    return model


def _factory(where: str, name: str) -> Callable:
    try:
        if where.endswith(".py"):
            path = Path(where)
            if not path.is_file():
                raise InputError(where, None, None, "file not found")
            spec = importlib.util.spec_from_file_location(f"heterps_user_{path.stem}", path)
            if spec is None or spec.loader is None:
                raise InputError(where, None, None, "cannot be imported as a Python module")
            module = importlib.util.module_from_spec(spec)
            # registered before it runs, as an import would: a dataclass in it looks its module up there
            sys.modules[spec.name] = module
            # its folder on the import path, as `python FILE.py` puts it: a module beside it imports
            folder = str(path.resolve().parent)
            if folder not in sys.path:
                sys.path.insert(0, folder)
            try:
                spec.loader.exec_module(module)
            except BaseException:
                sys.modules.pop(spec.name, None)
                raise
        else:
            try:
                module = importlib.import_module(where)
            except ModuleNotFoundError as exc:
                # A profile of FILE.py:FACTORY names its model STEM:FACTORY; the file is found again
                # where it was, the current directory, which a console script does not put on sys.path.
                beside = Path(*where.split(".")).with_suffix(".py")
                if exc.name != where.split(".")[0] or not beside.is_file():
                    raise
                return _factory(str(beside), name)
    except InputError:
        raise
    except SIGNALLED:
        raise
    except BaseException as exc:  # the user's code: sys.exit and its own BaseExceptions too
        raise _user_error(where, None, exc, "could not be loaded:") from None
    factory = getattr(module, name, None)
    if not callable(factory):
        raise InputError(where, None, name, "no such function in this module")
    return factory


def _user_line(source: str | None, exc: BaseException) -> int | None:
    """The line of ``source`` nearest to where ``exc`` was raised (its last frame in that file)."""
    line = None
    if source is None:
        return None
    for frame in traceback.extract_tb(exc.__traceback__):
        if Path(frame.filename).resolve() == Path(source).resolve():
            line = frame.lineno
    return line


def model_error(model: Model, exc: BaseException, what: str) -> InputError:
    """The model failed while we ran it: name the user's file and line when the failure passed through it."""
    line = _user_line(model.source, exc)
    where = model.source if line is not None else None
    return InputError(
        where,
        line,
        "MODEL" if where is None else None,
        f"{what}: {failure(exc)}" + ("" if where else f" (model {model.name})"),
    )


@contextlib.contextmanager
def layers_run_alone(model: Model, current: list) -> Iterator[None]:
    """While the model's layers run one by one: a failure of the user's code (sys.exit and its own
    BaseExceptions too) is an exit-2 error naming the layer running (``current[0]``) and the user's line;
    our own errors and signals pass as they are."""
    try:
        yield
    except (InputError, *SIGNALLED):
        raise
    except BaseException as exc:
        raise model_error(model, exc, f"layer {current[0].name if current else '?'} failed when run alone") from None


def failure(exc: BaseException) -> str:
    """How the user's code failed, in words: ``ValueError: ...``, or ``called sys.exit(0): ...``."""
    if isinstance(exc, SystemExit):
        return f"called sys.exit({exc.code!r}): it must return or raise, not exit"
    return f"{type(exc).__name__}: {exc}"


def _user_error(where: str, name: str | None, exc: BaseException, what: str) -> InputError:
    """The user's code failed: name their file and the line that raised."""
    line = _user_line(where, exc) if where.endswith(".py") else None
    subject = f"factory {name}()" if name else "the module"
    said = failure(exc) if isinstance(exc, SystemExit) else f"{what} {failure(exc)}"  # "raised" an exit reads wrong
    if isinstance(exc, ModuleNotFoundError):
        said += (
            f" (the folder of {where} is on the import path: a module elsewhere needs its folder in PYTHONPATH, "
            "on every node too, or the package installed)"
            if where.endswith(".py")
            else " (put its folder in PYTHONPATH, on every node too, or install the package)"
        )
    return InputError(where, line, name, f"{subject} {said}")


def _model_from(made, where: str, name: str, batch_size: int, input_shape) -> Model:
    blocks = None
    if isinstance(made, nn.Module):
        module, example = made, None
    elif isinstance(made, tuple) and len(made) in (2, 3) and isinstance(made[0], nn.Module):
        module, example = made[0], made[1]
        blocks = list(made[2]) if len(made) == 3 else None
        if blocks is not None and not all(isinstance(b, nn.Module) for b in blocks):
            raise InputError(where, None, name, "the third item the factory returns must be a list of modules")
    else:
        raise InputError(
            where,
            None,
            name,
            "the factory must return a torch.nn.Module, or (module, example "
            f"input batch[, list of blocks]); it returned {type(made).__name__}",
        )
    if example is None:
        if not input_shape:
            raise InputError(where, None, name, "the factory returned no example input: give --input-shape")
        example = torch.randn(batch_size, *input_shape, generator=torch.Generator().manual_seed(0))
    inputs = example if isinstance(example, tuple) else (example,)
    if not inputs or not all(isinstance(x, torch.Tensor) for x in inputs):
        raise InputError(where, None, name, "the example input must be a tensor or a tuple of tensors")
    # The example's first dimension is the batch: resize it to --batch-size by repeating rows.
    inputs = tuple(x[torch.arange(batch_size) % x.shape[0]] for x in inputs)
    return Model(f"{Path(where).stem}:{name}" if where.endswith(".py") else f"{where}:{name}", module, inputs, blocks)


KIND_OF = [  # (class-name test, kind), first match wins
    (lambda c: c == "Linear" or c.endswith("Linear"), "fc"),
    (lambda c: c.startswith("Conv"), "conv"),
    (lambda c: c.startswith("Embedding"), "embedding"),
    (lambda c: "Pool" in c, "pool"),
    (lambda c: "Norm" in c, "norm"),
    (lambda c: "Attention" in c, "attention"),
    (lambda c: c.startswith("Dropout") or c.endswith("Dropout"), "dropout"),
    (lambda c: c.endswith("Loss"), "loss"),
    (
        lambda c: (
            c
            in {
                "ReLU",
                "ReLU6",
                "GELU",
                "SiLU",
                "Sigmoid",
                "Tanh",
                "LeakyReLU",
                "ELU",
                "Softmax",
                "LogSoftmax",
                "Mish",
                "Hardswish",
                "PReLU",
                "Softplus",
                "GLU",
            }
        ),
        "activation",
    ),
]


def kind(module: nn.Module) -> str:
    """The profile's layer type of a module: Linear -> fc, Conv* -> conv, ..., else its class name, lower-cased."""
    name = type(module).__name__
    return next((k for test, k in KIND_OF if test(name)), name.lower())


@dataclass
class Call:
    name: str
    module: nn.Module
    args: tuple
    kwargs: dict
    # Per tensor of args and kwargs, nested alike: does training need its gradient? The traced forward
    # says: an activation does, the model's data does not. None: every float tensor does.
    grads: tuple | None = None

    def fresh(self, device, args=None, kwargs=None) -> tuple[tuple, dict]:
        """New copies of the recorded inputs (or of ``args`` and ``kwargs`` cut from them) on ``device``,
        the float ones requiring grad where training computes their gradient."""
        in_args, in_kwargs = self.grads if self.grads is not None else (None, None)
        return (
            fresh_inputs(self.args if args is None else args, device, in_args),
            fresh_inputs(self.kwargs if kwargs is None else kwargs, device, in_kwargs),
        )


def layers_of(model: Model) -> dict[nn.Module, str]:
    named = {m: n for n, m in model.module.named_modules()}
    if model.blocks is not None:
        return {
            b: named.get(b) or (model.name if b is model.module else f"block{i}") for i, b in enumerate(model.blocks)
        }
    out: dict[nn.Module, str] = {}
    inside: set[nn.Module] = set()
    for n, m in model.module.named_modules():
        if m in inside:
            continue
        if isinstance(m, nn.MultiheadAttention):
            inside.update(m.modules())
            out[m] = n
        elif not list(m.children()):
            out[m] = n
    return out


def trace(model: Model) -> list[Call]:
    """The layers in the order one forward pass calls them, each with a copy of its inputs."""
    layers, calls, handles = layers_of(model), [], []
    seen: dict[str, int] = {}

    def record(module, args, kwargs):
        name = fitted_name(layers[module] or type(module).__name__.lower(), room=8)  # room for "#N"
        seen[name] = seen.get(name, 0) + 1
        unique = name if seen[name] == 1 else f"{name}#{seen[name]}"
        calls.append(Call(unique, module, detached(args), detached(kwargs), (needs_grad(args), needs_grad(kwargs))))

    for module in layers:
        handles.append(module.register_forward_pre_hook(record, with_kwargs=True))
    try:
        with torch.enable_grad():  # so that each input says whether training needs its gradient
            model.module(*model.inputs)
    finally:
        for h in handles:
            h.remove()
    return calls


def detached(value, device=None):
    """A copy of recorded inputs, cut from autograd, on ``device`` (default: where they are)."""
    if isinstance(value, torch.Tensor):
        return value.detach().to(device or value.device, copy=True)
    if isinstance(value, tuple):
        return tuple(detached(v, device) for v in value)
    if isinstance(value, list):
        return [detached(v, device) for v in value]
    if isinstance(value, dict):
        return {k: detached(v, device) for k, v in value.items()}
    return value


def tensors_of(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in tensors_of(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors_of(v)]
    return []


def needs_grad(value):
    """``value``'s tensors replaced by whether they require grad (nested alike; None for the rest)."""
    if isinstance(value, torch.Tensor):
        return bool(value.requires_grad)
    if isinstance(value, tuple | list):
        return tuple(needs_grad(v) for v in value)
    if isinstance(value, dict):
        return {k: needs_grad(v) for k, v in value.items()}
    return None


def fresh_inputs(value, device, grads=None):
    """A new copy of recorded inputs on ``device``; float tensors require grad, as activations do, unless
    ``grads`` (from :func:`needs_grad`, nested alike) says training computes none for them."""
    if isinstance(value, torch.Tensor):
        copy = value.to(device, copy=True)
        return copy.requires_grad_(True) if copy.is_floating_point() and grads is not False else copy
    if isinstance(value, tuple | list):
        inner = grads if isinstance(grads, tuple) and len(grads) == len(value) else (None,) * len(value)
        copies = [fresh_inputs(v, device, g) for v, g in zip(value, inner)]
        return tuple(copies) if isinstance(value, tuple) else copies
    if isinstance(value, dict):
        inner = grads if isinstance(grads, dict) else {}
        return {k: fresh_inputs(v, device, inner.get(k)) for k, v in value.items()}
    return value


def bytes_of(tensors) -> float:
    return float(sum(t.numel() * t.element_size() for t in tensors_of(tensors)))
