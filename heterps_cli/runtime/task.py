"""A user's training task for ``heterps run --task FILE.py:FACTORY`` (docs/guide/training.md): their model,
data, loss and optimiser, and the samples each step trains on.

The factory returns a :class:`Task` (or a dict of its fields). Every process of a run calls it after
seeding torch with ``--seed``, so every replica starts from the same weights, and keeps its stage of
the model. The data are read as one endless stream of samples: a map-style dataset is walked epoch
after epoch, each epoch in its own order (a permutation drawn from the seed and the epoch, or the
dataset's order without ``shuffle``); an iterable of batches is read again from its start when it
ends. Step ``s`` trains on the stream's samples ``s N`` to ``(s + 1) N``, ``N`` the plan's batch times
its micro-batches, so any process finds any step's samples without the others, and a resumed run
trains on what the uninterrupted one would have.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, fields
from typing import Any, NoReturn

import torch
from torch import nn
from torch.utils.data import Dataset, IterableDataset, TensorDataset, default_collate

from heterps_cli.errors import SIGNALLED, InputError


def _sgd(params):
    return torch.optim.SGD(params, lr=0.01)


@dataclass
class Task:
    """What ``heterps run --task`` trains.

    ``model``: the chain the profile was measured from (its layers' names are the plan's).
    ``data``: a map-style ``torch.utils.data.Dataset`` of ``(input, target)`` samples, or an iterable
    of ``(inputs, targets)`` batches of any size.
    ``loss(output, target)``: the mean loss over the samples given (torch's default reduction), so
    that the replicas' shares add up to the step's mean.
    ``optimizer(params)``: builds the optimiser of one stage's parameters (SGD at 0.01 if not given).
    ``blocks``: the modules the chain is made of, where they are not its leaves (as a model
    factory's third item). ``shuffle``: draw each epoch's order of a map-style dataset."""

    model: nn.Module
    data: Any
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer] = _sgd
    blocks: list[nn.Module] | None = None
    shuffle: bool = True


def load_task(spec: str) -> Task:
    """Call ``FILE.py:FACTORY`` (or ``module:FACTORY``) and check what it returned; exit-2 errors name
    the file and the field."""
    from heterps_cli.profiling.models import _factory, _user_error

    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name:
        raise InputError(None, None, "--task", f"{spec!r} is not FILE.py:FACTORY or module:FACTORY")
    factory = _factory(where, name)
    try:
        made = factory()
    except SIGNALLED:
        raise
    except BaseException as exc:  # the user's code
        raise _user_error(where, name, exc, "raised") from None
    if isinstance(made, dict):
        known = {f.name for f in fields(Task)}
        unknown = sorted(set(made) - known)
        missing = sorted({"model", "data", "loss"} - set(made))
        if unknown or missing:
            said = [f"unknown key{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}"] if unknown else []
            said += [f"missing {', '.join(missing)}"] if missing else []
            raise InputError(where, None, name, f"the task's dict: {'; '.join(said)} (keys: {', '.join(known)})")
        made = Task(**made)
    if not isinstance(made, Task):
        raise InputError(
            where,
            None,
            name,
            f"a task factory returns a heterps_cli.Task or a dict of its fields, not {type(made).__name__}",
        )
    if not isinstance(made.model, nn.Module):
        raise InputError(where, None, f"{name}: model", f"must be a torch.nn.Module, not {type(made.model).__name__}")
    if not isinstance(made.data, Dataset | Iterable) or isinstance(made.data, str | bytes | torch.Tensor):
        raise InputError(
            where,
            None,
            f"{name}: data",
            f"must be a torch.utils.data.Dataset of (input, target) samples or an iterable of (inputs, targets) "
            f"batches, not {type(made.data).__name__}",
        )
    for field in ("loss", "optimizer"):
        if not callable(getattr(made, field)):
            raise InputError(where, None, f"{name}: {field}", "must be callable")
    blocks = made.blocks
    if blocks is not None and not (isinstance(blocks, list | tuple) and all(isinstance(b, nn.Module) for b in blocks)):
        raise InputError(where, None, f"{name}: blocks", "must be a list of the model's modules")
    return made


_END = object()
MAX_EMPTY_BATCHES = 10_000


class Samples:
    """The task's data as one stream of samples; :meth:`take` gives any step's slice of it. What the data
    raise or give that is not samples is the user's error (exit 2), naming the task (``name``) and the
    sample or batch."""

    def __init__(self, data, samples_per_step: int, seed: int, shuffle: bool = True, name: str = "the task"):
        self.data, self.N, self.seed, self.shuffle, self.name = data, samples_per_step, seed, shuffle, name
        self.mapped = isinstance(data, Dataset) and not isinstance(data, IterableDataset)
        if self.mapped:
            if not hasattr(data, "__len__"):
                self._refuse("the dataset has no __len__: give it one, or make it an iterable")
            self.size = self._users("the dataset's __len__", len, data)
            if self.size < 1:
                self._refuse("the dataset is empty")
            self.orders: dict[int, torch.Tensor] = {}
        else:
            self.iterator: Iterator | None = None
            self.buffer: list[tuple[torch.Tensor, torch.Tensor]] = []  # batches not yet taken, as (x, y)
            self.position = 0  # the stream's sample that buffer[0] starts at
            self.read_in_pass = 0  # samples the current pass over the data has given
            self.empty_in_a_row = 0  # batches of no sample read since the last that had one

    def _refuse(self, why: str) -> NoReturn:
        raise InputError(None, None, "--task", f"{self.name}: {why}")

    def _users(self, what: str, call, *args):
        """``call(*args)``, the user's code: what it raises is said as the task's error."""
        try:
            return call(*args)
        except (*SIGNALLED, InputError):
            raise
        except Exception as exc:
            self._refuse(f"{what} raised {type(exc).__name__}: {' '.join(str(exc).split())[:300]}")

    def _pair(self, item, where: str) -> tuple[torch.Tensor, torch.Tensor]:
        """``item`` as (inputs, targets), each a tensor."""
        if not (isinstance(item, tuple | list) and len(item) == 2):
            self._refuse(f"{where} must be (input, target), not {type(item).__name__}")
        x, y = item
        for part, value in (("input", x), ("target", y)):
            if not isinstance(value, torch.Tensor):
                self._refuse(f"{where}: its {part} is a {type(value).__name__}, not tensors or numbers")
        if x.dim() == 0 or y.dim() == 0:
            self._refuse(f"{where} is one number, not a batch: give each sample, or each batch, a first dimension")
        if len(x) != len(y):
            self._refuse(f"{where} holds {len(x)} inputs and {len(y)} targets")
        return x, y

    def take(self, step: int, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Samples ``lo`` to ``hi`` of step ``step``, collated: ``(inputs, targets)``."""
        return self.take_each(step, [(lo, hi)])[0]

    def take_each(self, step: int, ranges: list[tuple[int, int]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """:meth:`take` of each of ``ranges`` of step ``step``, from a dataset in one read: a process reads
        its samples of a whole step at once (8 micro-batches of 64 of the guide's task: 0.2 ms in one
        read, 0.44 ms in eight)."""
        start = step * self.N
        if not self.mapped:
            return [self._streamed(start + lo, start + hi) for lo, hi in ranges]
        x, y = self._indexed([i for lo, hi in ranges for i in self._indices(start + lo, start + hi)])
        sizes = [hi - lo for lo, hi in ranges]
        return list(zip(x.split(sizes), y.split(sizes), strict=True))

    def _indices(self, lo: int, hi: int) -> list[int]:
        """The dataset's indices at stream positions ``lo`` to ``hi``, epoch by epoch."""
        out: list[int] = []
        while lo < hi:
            epoch, at = divmod(lo, self.size)
            end = min(hi - lo, self.size - at) + at
            out += self._order(epoch)[at:end].tolist() if self.shuffle else list(range(at, end))
            lo += end - at
        return out

    def _order(self, epoch: int) -> torch.Tensor:
        order = self.orders.get(epoch)
        if order is None:
            order = torch.randperm(self.size, generator=torch.Generator().manual_seed(self.seed * 1_000_003 + epoch))
            self.orders = {epoch: order, **{e: o for e, o in self.orders.items() if e == epoch - 1}}
        return order

    def _indexed(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The samples at ``indices``: a TensorDataset's rows at once; a dataset's ``__getitems__`` where
        it has one (the samples, as torch's DataLoader takes them, or the batch ``(inputs, targets)``
        itself); else one ``__getitem__`` per sample; samples collated as the DataLoader does."""
        if isinstance(self.data, TensorDataset):
            return self._pair(tuple(t[indices] for t in self.data.tensors), "a TensorDataset (two tensors)")
        many = getattr(self.data, "__getitems__", None)
        if many is not None:
            items = self._users(f"the dataset's __getitems__ of samples {indices[0]}, …", many, indices)
        else:
            items = [self._users(f"the dataset's sample {i} (__getitem__)", self.data.__getitem__, i) for i in indices]
        if isinstance(items, tuple) and len(items) == 2 and all(isinstance(t, torch.Tensor) for t in items):
            # a batch already, which collating one sample at a time would cost
            x, y = self._pair(items, f"the dataset's __getitems__ of samples {indices[0]}, …")
            if len(x) != len(indices):
                self._refuse(f"the dataset's __getitems__ gave {len(x)} samples for {len(indices)} indices")
            return x, y
        items = self._users("the dataset's __getitems__ as a list of samples", list, items)
        if len(items) != len(indices):
            self._refuse(f"the dataset's __getitems__ gave {len(items)} samples for {len(indices)} indices")
        for i, item in zip(indices, items, strict=True):
            if not (isinstance(item, tuple | list) and len(item) == 2):
                self._refuse(f"the dataset's sample {i} must be (input, target), not {type(item).__name__}")
        batch = self._users(f"collating the dataset's samples {indices[0]}, …", default_collate, list(items))
        return self._pair(batch, f"the dataset's samples {indices[0]}, …")

    def _streamed(self, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        if lo < self.position:  # a step before the one buffered: read the stream again from its start
            self.iterator, self.buffer, self.position = None, [], 0
        while True:
            while self.buffer and self.position + len(self.buffer[0][0]) <= lo:
                self.position += len(self.buffer.pop(0)[0])
            if self.position + sum(len(x) for x, _ in self.buffer) >= hi:
                break
            self.buffer.append(self._next_batch())
        xs = torch.cat([x for x, _ in self.buffer])
        ys = torch.cat([y for _, y in self.buffer])
        return xs[lo - self.position : hi - self.position], ys[lo - self.position : hi - self.position]

    def _next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The data's next batch, read again from its start when a pass ends; a pass that gave no sample
        (no batch, or only empty ones) ends the run, which would otherwise wait forever for one."""
        while True:
            if self.iterator is None:
                self.iterator, self.read_in_pass = self._users("iter() of the data", iter, self.data), 0
            batch = self._users("reading the data's next batch", next, self.iterator, _END)
            if batch is _END:
                if self.read_in_pass == 0:
                    self._refuse("the data ran out: a pass over it, read again from its start, gave no sample")
                self.iterator = None
                continue
            if not (isinstance(batch, tuple | list) and len(batch) == 2):
                self._refuse(f"each batch of the data must be (inputs, targets), not {type(batch).__name__}")
            x, y = (self._users("a batch of the data as tensors", torch.as_tensor, part) for part in batch)
            x, y = self._pair((x, y), "a batch of the data")
            self.read_in_pass += len(x)
            self.empty_in_a_row = 0 if len(x) else self.empty_in_a_row + 1
            if self.empty_in_a_row >= MAX_EMPTY_BATCHES:  # an endless stream of them would never end a pass
                self._refuse(f"the data gave {MAX_EMPTY_BATCHES:,} empty batches in a row and no sample")
            return x, y


def load_task_model(spec: str, batch_size: int, samples_per_step: int, seed: int):
    """The task ``spec`` names, its model as a :class:`~heterps_cli.profiling.models.Model` (its example
    the data's first batch) and its samples (:class:`Samples`)."""
    from heterps_cli.profiling.models import Model

    task = load_task(spec)
    samples = Samples(task.data, samples_per_step, seed, task.shuffle, spec)
    example, _ = samples.take(0, 0, min(batch_size, samples_per_step))
    return task, Model(spec, task.model, (example,), task.blocks), samples
