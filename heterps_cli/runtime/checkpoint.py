"""Checkpoints of a run (``heterps run --checkpoint-dir DIR --checkpoint-every N``, docs/guide/training.md).

A checkpoint after ``k`` steps is the folder ``DIR/step-0000k``: one file per stage (per shard at tp > 1:
that shard's part of each sharded weight and of its optimiser state, as plain tensors),
written by the stage's first replica, holding its weights and its optimiser's state (every replica
holds the same: they take the same step on the same summed gradient); one file per process with its
random-number generators' state (dropout draws differently in each); and, last, ``complete.json``,
which rank 0 writes once every process has written its files. Each file goes to a temporary name
and is renamed into place, so a file is whole or absent, and a folder without ``complete.json`` (a
job killed while saving) is never read: ``--resume`` takes the newest complete one. The two newest
complete checkpoints are kept.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import torch
from torch import nn

from heterps_cli.errors import InputError
from heterps_cli.runtime.sharding import local_of

KEEP = 2
_STEP = re.compile(r"^step-(\d+)$")
MARK = "complete.json"


def folder(root: str, steps_done: int) -> Path:
    return Path(root) / f"step-{steps_done:06d}"


def stage_file(step_dir: Path, stage: int, tp: int, tp_rank: int) -> Path:
    return step_dir / (f"stage-{stage}.pt" if tp == 1 else f"stage-{stage}-shard-{tp_rank}.pt")


def rng_file(step_dir: Path, rank: int) -> Path:
    return step_dir / f"rng-{rank}.pt"


def save_atomically(obj, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(partial, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, path)


def stage_state(module: nn.Module, optimiser: torch.optim.Optimizer) -> dict:
    """What a stage's file holds: its weights and its optimiser's state, each DTensor as this process's own
    shard, a plain tensor (a DTensor pickles its device mesh, which names this run's process group)."""
    return _local({"model": module.state_dict(), "optimizer": optimiser.state_dict()})


def _local(state):
    if isinstance(state, dict):
        return {key: _local(value) for key, value in state.items()}
    if isinstance(state, list | tuple):
        return type(state)(_local(value) for value in state)
    return local_of(state) if isinstance(state, torch.Tensor) else state


def load_stage_state(module: nn.Module, optimiser: torch.optim.Optimizer, state: dict) -> None:
    """:func:`stage_state`'s file into a stage: a sharded weight takes its shard in place, and the optimiser's
    state of a sharded weight becomes a DTensor laid out as the weight is, so that the next step sees
    what an uninterrupted run's does."""
    from torch.distributed.tensor import DTensor

    if not any(isinstance(p, DTensor) for p in module.parameters()):
        module.load_state_dict(state["model"])
    else:
        with torch.no_grad():
            for name, tensor in module.state_dict().items():
                local_of(tensor).copy_(state["model"][name])
    optimiser.load_state_dict(state["optimizer"])
    for group in optimiser.param_groups:
        for p in group["params"]:
            kept = optimiser.state.get(p, {}) if isinstance(p, DTensor) else {}
            for key, value in kept.items():
                plain = isinstance(value, torch.Tensor) and not isinstance(value, DTensor)
                if plain and value.shape == p.to_local().shape:  # Adam's moments; not its step count
                    kept[key] = DTensor.from_local(value, p.device_mesh, p.placements, run_check=False)


def read(path: Path, device: torch.device) -> dict:
    """A file of a complete checkpoint, tensors only (``weights_only``); a file that is missing or is not
    one heterps wrote stops the run with the file's name (a process's error becomes the run's exit 2)."""
    try:
        state = torch.load(path, map_location=device, weights_only=True)
    except Exception as exc:
        raise RuntimeError(
            f"{path}: not a checkpoint file this run can read ({type(exc).__name__}); remove the folder "
            f"{path.parent.name} to resume from the checkpoint before it"
        ) from None
    if not isinstance(state, dict):
        raise RuntimeError(f"{path}: not a checkpoint file this run can read (a {type(state).__name__})")
    return state


def mark_complete(step_dir: Path, meta: dict) -> None:
    """Rank 0, once every process has written its files: the checkpoint exists from now on."""
    partial = step_dir / f".{MARK}.tmp"
    partial.write_text(json.dumps(meta, indent=2) + "\n")
    with open(partial, "rb") as f:
        os.fsync(f.fileno())
    os.replace(partial, step_dir / MARK)
    _prune(step_dir.parent, int(_STEP.match(step_dir.name).group(1)))  # type: ignore[union-attr]


def _prune(root: Path, newest: int) -> None:
    complete = sorted(steps for steps, _ in _complete(root))
    keep = set(complete[-KEEP:])
    for path in root.iterdir():
        match = _STEP.match(path.name)
        if match and path.is_dir() and int(match.group(1)) < newest and int(match.group(1)) not in keep:
            shutil.rmtree(path, ignore_errors=True)


def _complete(root: Path) -> list[tuple[int, dict]]:
    out: list[tuple[int, dict]] = []
    if not root.is_dir():
        return out
    for path in root.iterdir():
        match = _STEP.match(path.name)
        if not match or not (path / MARK).is_file():
            continue
        try:
            meta = json.loads((path / MARK).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(meta, dict) and meta.get("steps_done") == int(match.group(1)):
            out.append((int(match.group(1)), meta))
    return out


def latest(root: str, expected: dict) -> tuple[int, Path] | None:
    """The newest complete checkpoint under ``root`` as (steps done, its folder), or None; exit 2 where
    it was written by another run (``expected``: the plan's stages and their tensor-parallel degrees, batch,
    micro-batches, task, seed)."""
    found = _complete(Path(root))
    if not found:
        return None
    steps, meta = max(found, key=lambda item: item[0])
    meta = {"tp": [1] * len(meta.get("stages", [])), **meta}  # written before degrees were kept: all at tp 1
    step_dir = folder(root, steps)
    for key, value in expected.items():
        there = meta.get(key)
        if there != value:
            raise InputError(
                str(step_dir / MARK),
                None,
                key,
                f"the checkpoint was written by another run ({key} {there!r} there, {value!r} now): "
                "resume with the plan, task, micro-batches and seed that wrote it, or give another --checkpoint-dir",
            )
    return steps, step_dir
