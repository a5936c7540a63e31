"""Checkpoints of a run (``heterps run --checkpoint-dir DIR --checkpoint-every N``, docs/spec.md section 4b).

A checkpoint after ``k`` steps is the folder ``DIR/step-0000k``: one file per stage (per shard at tp > 1:
that shard's part of each sharded weight and of its optimiser state, as plain tensors), written by the
stage's first replica (in a stage of several degrees, section 1i, by the first at each degree), holding
its weights and its optimiser's state (every replica holds the same: they take the same step on the same
summed gradient); one file per process with its random-number
generators' state (dropout draws differently in each); and ``complete.json``, which names the run, the
files and their sizes.

A checkpoint is complete or absent. Every process writes its files into a staging folder
``DIR/.step-0000k.RUN.partial`` (``RUN`` the run's random id), each under an exclusive temporary name,
synced and renamed; once all have written, rank 0 writes ``complete.json`` there and renames the whole
folder to ``step-0000k``. Every file carries the run's id and its step, checked against
``complete.json`` when it is read. One run at a time writes into a folder: it holds a lock on
``DIR/.heterps-lock`` from before its first process starts until its last ends, and removes what a
killed run left staged. The two newest complete checkpoints are kept; nothing else in the folder is
ever removed.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
import socket
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, cast

import torch
from torch import nn

from heterps_cli.errors import InputError
from heterps_cli.outfiles import check_names, new_file, publish, read_regular, sync_folder
from heterps_cli.runtime.sharding import local_of

KEEP = 2
MARK = "complete.json"
LOCK = ".heterps-lock"
MAX_MARK_BYTES = 1 << 20  # a complete.json lists a file per process: far below this
_STEP = re.compile(r"step-([0-9]+)", re.ASCII)
_LEFTOVER = re.compile(r"\.step-[0-9]+\.[0-9a-f]{32}\.(partial|replaced)", re.ASCII)
FIELD = "--checkpoint-dir"


def folder(root: str | Path, steps_done: int) -> Path:
    return Path(root) / f"step-{steps_done:06d}"


def staging(root: str | Path, steps_done: int, run: str) -> Path:
    return Path(root) / f".step-{steps_done:06d}.{run}.partial"


def stage_file(step_dir: Path, stage, tp: int, tp_rank: int) -> Path:
    """Shard ``tp_rank``'s file of ``stage`` (a :class:`~.layout.StageLayout`) at degree ``tp``: a degree
    other than its own replicas' (section 1i: a joined part's) says its degree."""
    name = f"stage-{stage.index}" + (f"-tp{tp}" if tp != stage.degrees[0] else "")
    return step_dir / (f"{name}.pt" if tp == 1 else f"{name}-shard-{tp_rank}.pt")


def rng_file(step_dir: Path, rank: int) -> Path:
    return step_dir / f"rng-{rank}.pt"


def file_names(lay) -> list[str]:
    """Every file a checkpoint of the run laid out as ``lay`` (:class:`~.layout.Layout`) holds, but the mark."""
    here = Path()
    names = [stage_file(here, s, d, r).name for s in lay.stages for d in s.degrees for r in range(d)]
    return names + [rng_file(here, rank).name for rank in range(lay.world_size)]


# Before the run -------------------------------------------------------------------------------------


def check_folder(root: str) -> None:
    """Refuse a ``--checkpoint-dir`` no save could use, without making it (``launch`` writes for other
    machines): a name a file system does not take, a file, a link to nothing."""
    check_names(root, FIELD, root)
    path = Path(root)
    if path.is_symlink() and not path.exists():
        raise InputError(root, None, FIELD, f"is a link to {os.readlink(path)}, which does not exist")
    if path.exists() and not path.is_dir():
        raise InputError(root, None, FIELD, "exists and is not a directory: give a folder for the checkpoints")


def prepare(root: str) -> Path:
    """``--checkpoint-dir`` checked and made before any process starts, as the first save would need it:
    a folder (made here where missing) this user can write in."""
    check_folder(root)
    path = Path(root)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(root, None, FIELD, f"cannot create the folder: {exc.strerror or exc}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise InputError(root, None, FIELD, "is not writable by this user")
    return path


@contextmanager
def locked(root: Path) -> Iterator[None]:
    """Hold the folder's lock while the block runs; exit 2 where another run holds it. What a killed run
    left staged (never a checkpoint: its folder was not renamed into place) is removed once it is held."""
    path = root / LOCK
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        why = "it is a symbolic link" if exc.errno == errno.ELOOP else exc.strerror or str(exc)
        raise InputError(str(path), None, FIELD, f"cannot open the folder's lock: {why}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InputError(str(path), None, FIELD, "cannot open the folder's lock: it is not a regular file")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "another process"
            raise InputError(
                str(root),
                None,
                FIELD,
                f"another heterps run ({holder}) is writing checkpoints here: wait for it to end, or give "
                "another --checkpoint-dir",
            ) from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        except OSError as exc:  # a full or read-only file system: no checkpoint could be written either
            raise InputError(str(path), None, FIELD, f"cannot write the folder's lock: {exc.strerror or exc}") from None
        for entry in root.iterdir():
            if _LEFTOVER.fullmatch(entry.name):
                _remove(entry)
        yield
    finally:
        os.close(fd)


def refuse_fresh(root: Path) -> None:
    """A run without ``--resume`` into a folder that holds checkpoints would mix its own with them, and
    its pruning would delete theirs: refused (exit 2)."""
    found = _inventory(root)
    if found:
        steps, where, _ = found[-1]
        raise InputError(
            str(where),
            None,
            FIELD,
            f"the folder already holds checkpoints (the newest after {steps} steps): add --resume to go on from "
            "it, or give another --checkpoint-dir",
        )


# What a run under another plan must share with the checkpoint's: the job (its model or task, its seed, the
# samples a step trains). The rest of complete.json's run (stages, degrees, parts, micro-batch) is the plan.
JOB = ("model", "seed")


def latest(root: str | Path, expected: dict) -> tuple[int, Path, bool] | None:
    """The newest checkpoint under ``root`` as (steps done, its folder, whether it was written under another
    plan than ``expected`` says), or None where there is none. Exit 2 where its ``complete.json`` is
    damaged, where a file it lists is missing or of another size, or where another job wrote it
    (``expected``: the plan's stages and their tensor-parallel degrees, batch, micro-batches, task, seed);
    one of another plan of the same job is resumed from its :data:`~.whole.MODEL_FILE` (refused where it
    has none: written before checkpoints held the whole model)."""
    found = _inventory(Path(root))
    if not found:
        return None
    steps, step_dir, meta = found[-1]
    if isinstance(meta, InputError):
        raise InputError(
            meta.path,
            meta.line,
            meta.field,
            f"{meta.message}: remove the folder {step_dir.name} to resume from the checkpoint before it",
        )
    meta = {"tp": [1] * len(meta.get("stages", [])), **meta}  # written before degrees were kept: all at tp 1
    differs = {}
    for key, value in expected.items():
        there = meta.get(key)
        if there != value and not (key == "model" and isinstance(there, str) and same_spec(there, value)):
            differs[key] = (there, value)
    if differs:
        _of_the_job(step_dir, meta, expected, differs)
    for name in meta.get("files", {}):
        _listed(step_dir / name, meta)
    return steps, step_dir, bool(differs)


def _of_the_job(step_dir: Path, meta: dict, expected: dict, differs: dict) -> None:
    """A checkpoint whose run differs from ``expected`` in ``differs`` (key -> (there, now)) is resumed only
    where it is another plan of the same job, with the whole model: else exit 2, naming what differs."""
    from heterps_cli.runtime.whole import MODEL_FILE

    for key in JOB:
        if key in differs:
            there, value = differs[key]
            raise InputError(
                str(step_dir / MARK),
                None,
                key,
                f"the checkpoint was written by another job ({key} {there!r} there, {value!r} now): resume with the "
                "task and seed that wrote it (the plan may differ), or give another --checkpoint-dir",
            )
    if "batch_size" in expected:
        step_now = expected["batch_size"] * expected.get("micro_batches", 1)
        step_there = meta.get("batch_size", 0) * meta.get("micro_batches", 1)
        if step_there != step_now:
            raise InputError(
                str(step_dir / MARK),
                None,
                "global_batch",
                f"the checkpoint's run trained {step_there:,} samples a step ({meta.get('micro_batches')} x "
                f"{meta.get('batch_size')}), this plan {step_now:,} ({expected.get('micro_batches')} x "
                f"{expected['batch_size']}): a plan resumed in its place trains the same samples a step, so give "
                "--micro-batches to make them equal, or give another --checkpoint-dir",
            )
        if MODEL_FILE not in meta.get("files", {}):
            said = ", ".join(f"{key} {there!r} there, {value!r} now" for key, (there, value) in differs.items())
            raise InputError(
                str(step_dir / MARK),
                None,
                next(iter(differs)),
                f"the checkpoint was written under another plan ({said}) by a heterps whose checkpoints did not hold "
                f"the whole model ({MODEL_FILE}): resume it with the plan that wrote it",
            )


def spec_identity(spec: str) -> str:
    """A model or task as ``FILE.py:FACTORY`` with the file's real absolute path (``launch`` names it
    absolute, ``run`` as the user typed it: both the same task); a zoo name or a module as given."""
    where, sep, name = spec.rpartition(":")
    return f"{os.path.realpath(where)}:{name}" if sep and where.endswith(".py") else spec


def same_spec(a: str, b: str) -> bool:
    return spec_identity(a) == spec_identity(b)


def _inventory(root: Path) -> list[tuple[int, Path, dict | InputError]]:
    """Every ``step-K`` folder of ``root`` that has a ``complete.json``, oldest first: (K, folder, what it
    says, or why it cannot be read). A folder without one is not a checkpoint, and not listed."""
    out: list[tuple[int, Path, dict | InputError]] = []
    if not root.is_dir():
        return out
    for path in root.iterdir():
        match = _STEP.fullmatch(path.name)
        if not match or path.is_symlink() or not path.is_dir() or not os.path.lexists(path / MARK):
            continue
        steps = int(match.group(1))
        try:
            out.append((steps, path, read_mark(path, steps)))
        except InputError as exc:
            out.append((steps, path, exc))
    return sorted(out, key=lambda found: (found[0], found[1].name))  # oldest first


def read_mark(step_dir: Path, steps: int | None = None) -> dict:
    """What ``step_dir/complete.json`` says; exit 2, naming the file (and the line), where it is not a
    whole object with ``steps_done`` the folder's own."""
    path = step_dir / MARK
    try:
        text = read_regular(path, MAX_MARK_BYTES)
    except OSError as exc:
        raise InputError(str(path), None, None, f"cannot be read: {exc.strerror or exc}") from None
    if len(text) > MAX_MARK_BYTES:
        raise InputError(str(path), None, None, f"is over {MAX_MARK_BYTES:,} bytes: not one heterps wrote")
    try:
        meta = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            str(path), exc.lineno, None, f"is not whole JSON ({exc.msg}): the checkpoint is damaged"
        ) from None
    except (ValueError, RecursionError):
        raise InputError(str(path), None, None, "is not JSON heterps wrote: the checkpoint is damaged") from None
    steps = int(_STEP.fullmatch(step_dir.name).group(1)) if steps is None else steps  # type: ignore[union-attr]
    if not isinstance(meta, dict) or meta.get("steps_done") != steps:
        raise InputError(str(path), None, "steps_done", f"does not say {steps}, the folder's step: it is damaged")
    files = meta.get("files", {})
    if not isinstance(files, dict) or not all(isinstance(n, str) and type(s) is int for n, s in files.items()):
        raise InputError(str(path), None, "files", "is not a list of file names and sizes: it is damaged")
    return meta


def _listed(path: Path, meta: dict) -> None:
    """``path`` is the file ``meta`` lists, at its size (checked before torch reads it)."""
    size = meta.get("files", {}).get(path.name)
    if size is None:
        return  # a checkpoint written before files were listed
    try:
        there = os.lstat(path)
    except OSError:
        raise InputError(str(path), None, None, f"is missing: {MARK} lists it") from None
    if not stat.S_ISREG(there.st_mode) or there.st_size != size:
        raise InputError(str(path), None, None, f"is not the file {MARK} lists ({size:,} bytes): it is damaged")


# While the run saves -------------------------------------------------------------------------------


class _Recorded:
    """A file object that keeps the first OSError of a write, which torch's writer turns into a message of
    its own ("enforce fail at inline_container.cc ... unexpected pos")."""

    def __init__(self, fh):
        self.fh, self.error = fh, None

    def write(self, data) -> int:
        try:
            return self.fh.write(data)
        except OSError as exc:
            self.error = self.error or exc
            raise

    def flush(self) -> None:
        self.fh.flush()


def save(obj: dict, path: Path, run: str, steps_done: int, stamped: bool = True) -> None:
    """``obj`` with the run's id and step (``stamped``; a file the user loads as it is, not) as ``path``, in
    a staging folder (:func:`staging`): written under an exclusive temporary name, synced, renamed. A
    failure raises naming the file, leaving nothing."""
    folder_ = path.parent
    try:
        folder_.mkdir(exist_ok=True)
        if not stat.S_ISDIR(os.lstat(folder_).st_mode):
            raise OSError(errno.ENOTDIR, "the staging folder was replaced by something else")
        with new_file(folder_, f".{path.name}.") as (fh, tmp):
            recorded = _Recorded(fh)
            try:
                torch.save({**obj, "run": run, "steps_done": steps_done} if stamped else obj, cast(BinaryIO, recorded))
            except RuntimeError:
                if recorded.error is None:
                    raise
                raise recorded.error from None
        publish(tmp, path)
    except OSError as exc:
        raise RuntimeError(f"{path}: cannot write the checkpoint file: {exc.strerror or exc}") from None


def complete(root: str, steps_done: int, run: str, names: list[str], meta: dict) -> None:
    """Rank 0, once every process has saved its files: ``complete.json`` written into the staging folder,
    and the folder renamed to ``step-K``, so the checkpoint exists from now on, whole; then the ones
    before the two newest are removed."""
    staged = staging(root, steps_done, run)
    try:
        files = {name: os.lstat(staged / name).st_size for name in names}
        with new_file(staged, f".{MARK}.") as (fh, tmp):
            mark = {**meta, "steps_done": steps_done, "run": run, "files": files}
            fh.write((json.dumps(mark, indent=2) + "\n").encode())
        publish(tmp, staged / MARK)
        target = folder(root, steps_done)
        aside = Path(root) / f".step-{steps_done:06d}.{run}.replaced"
        if os.path.lexists(target):  # not a checkpoint (it would have been refused or resumed): no complete.json
            os.rename(target, aside)
        os.rename(staged, target)
        sync_folder(Path(root))
    except OSError as exc:
        raise RuntimeError(f"{staged}: cannot complete the checkpoint: {exc.strerror or exc}") from None
    _remove(aside)
    _prune(Path(root))


def _prune(root: Path) -> None:
    """Complete checkpoints before the :data:`KEEP` newest removed; a damaged or incomplete one is kept
    for its owner to look at."""
    found = [(steps, path) for steps, path, meta in _inventory(root) if isinstance(meta, dict)]
    for _, path in found[:-KEEP]:
        _remove(path)


def _remove(path: Path) -> None:
    """A folder of ours, or what someone put where one goes: a link (the link only, never what it points
    to) or a file."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


# When a run resumes --------------------------------------------------------------------------------


def stage_state(module: nn.Module, optimiser: torch.optim.Optimizer) -> dict:
    """What a stage's file holds: its weights and its optimiser's state, each DTensor as this process's own
    shard, a plain tensor (a DTensor pickles its device mesh, which names this run's process group)."""
    order = [name for name, _ in module.named_parameters()]  # the optimiser's indices, by name (section 1j)
    return _local({"model": module.state_dict(), "optimizer": optimiser.state_dict(), "parameter_order": order})


def _local(state):
    if isinstance(state, dict):
        return {key: _local(value) for key, value in state.items()}
    if isinstance(state, list | tuple):
        return type(state)(_local(value) for value in state)
    return local_of(state) if isinstance(state, torch.Tensor) else state


def load_stage_state(module: nn.Module, optimiser: torch.optim.Optimizer, state: dict, path: Path) -> None:
    """:func:`stage_state`'s file into a stage: a sharded weight takes its shard in place, and the optimiser's
    state of a sharded weight becomes a DTensor laid out as the weight is, so that the next step sees
    what an uninterrupted run's does. A file for another stage (keys, shapes) stops the run, naming it."""
    try:
        _load_stage_state(module, optimiser, state)
    except (KeyError, ValueError, RuntimeError, TypeError, IndexError) as exc:
        said = " ".join(str(exc).split())[:200]  # one paragraph: torch's message spans lines
        raise RuntimeError(
            f"{path}: does not hold this stage's weights and optimiser state ({type(exc).__name__}: {said}); "
            f"remove the folder {path.parent.name} to resume from the checkpoint before it"
        ) from None


def _load_stage_state(module: nn.Module, optimiser: torch.optim.Optimizer, state: dict) -> None:
    from torch.distributed.tensor import DTensor

    if not any(isinstance(p, DTensor) for p in module.parameters()):
        module.load_state_dict(state["model"])
    else:
        with torch.no_grad():
            for name, tensor in module.state_dict().items():
                mine, saved = local_of(tensor), state["model"][name]
                if saved.shape != mine.shape:
                    raise ValueError(f"{name} is {tuple(saved.shape)}, this shard's {tuple(mine.shape)}")
                mine.copy_(saved)
    optimiser.load_state_dict(state["optimizer"])
    for group in optimiser.param_groups:
        for p in group["params"]:
            kept = optimiser.state.get(p, {}) if isinstance(p, DTensor) else {}
            for key, value in kept.items():
                plain = isinstance(value, torch.Tensor) and not isinstance(value, DTensor)
                if plain and value.shape == p.to_local().shape:  # Adam's moments; not its step count
                    kept[key] = DTensor.from_local(value, p.device_mesh, p.placements, run_check=False)


def set_generators(generators: dict, device: torch.device, path: Path) -> None:
    """A process's generators put back from its ``rng-R.pt``; one that does not hold them stops the run."""
    try:
        torch.set_rng_state(generators["cpu"])
        if device.type == "cuda" and generators.get("cuda") is not None:
            torch.cuda.set_rng_state(generators["cuda"], device)
    except (KeyError, TypeError, RuntimeError, ValueError) as exc:
        raise RuntimeError(
            f"{path}: does not hold a process's random generators ({type(exc).__name__}); remove the folder "
            f"{path.parent.name} to resume from the checkpoint before it"
        ) from None


def read(path: Path, mark: dict | None = None, stamped: bool = True) -> dict:
    """A file of a complete checkpoint, tensors only (``weights_only``), in host memory; a file that is
    missing, is not one heterps wrote, or was written by another run or step than ``mark`` (its
    ``complete.json``) says, stops the run with the file's name (a process's error becomes the run's exit 2).

    Host memory, not the stage's device: the optimiser moves its moments to its parameters' device itself
    and keeps Adam's step count on the host, where a run that never stopped keeps it (read onto an H100,
    the resumed run's count stayed on the GPU); the generators' states are taken from host memory only."""
    again = f"remove the folder {path.parent.name} to resume from the checkpoint before it"
    try:
        if mark is not None:
            _listed(path, mark)
        if not stat.S_ISREG(os.lstat(path).st_mode):  # a FIFO would hold torch.load forever
            raise InputError(str(path), None, None, "is not a regular file")
        state = torch.load(path, map_location="cpu", weights_only=True)
    except InputError as exc:
        raise RuntimeError(f"{path}: {exc.message}; {again}") from None
    except Exception as exc:
        raise RuntimeError(f"{path}: not a checkpoint file this run can read ({type(exc).__name__}); {again}") from None
    if not isinstance(state, dict):
        raise RuntimeError(f"{path}: not a checkpoint file this run can read (a {type(state).__name__})")
    if mark is not None and "run" in mark and stamped:
        said = (state.get("run"), state.get("steps_done"))
        if said != (mark["run"], mark["steps_done"]):
            raise RuntimeError(
                f"{path}: written by another run or step than its {MARK} says (run {said[0]!r}, step {said[1]!r}): "
                f"the checkpoint is mixed; {again}"
            )
    return state
