"""Starting a run's processes, here or under ``torchrun``, and never leaving one behind.

Locally, :func:`launch_local` starts one process per replica (spawned, so each
is a fresh interpreter with its own thread count) and watches them all. The
first to fail (an exception, or killed outright) ends the run: every other
process is stopped (SIGTERM, then SIGKILL after a grace period) and the worker's
own error is raised as an exit-2 error. Ctrl-C or SIGTERM to ``heterps run`` stops
them the same way as it unwinds. Each worker also exits by itself if the
launcher disappears (killed with SIGKILL), so no process is orphaned.

Under ``torchrun`` (:func:`torchrun_env`), each process ``torchrun`` starts is
one rank: ``heterps run`` joins the group through torchrun's environment and
rank 0 reports.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import tempfile
import threading
import time
from multiprocessing.connection import wait
from pathlib import Path

from heterps_cli.errors import InputError, WorkerLost
from heterps_cli.figures import plural
from heterps_cli.profiling.links import free_port
from heterps_cli.progress import Progress, quiet
from heterps_cli.runtime.worker import RunConfig, run_rank, spawned

GRACE_S = 3.0  # between SIGTERM and SIGKILL when stopping workers


def torchrun_env() -> tuple[int, int, int] | None:
    """(rank, world size, local rank) when this process was started by torchrun, else None."""
    if "TORCHELASTIC_RUN_ID" not in os.environ and "LOCAL_RANK" not in os.environ:
        return None
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0))


def run_torchrun(cfg: RunConfig, placed: list | None = None, progress: Progress | None = None) -> dict | None:
    """This process's rank of a torchrun job; rank 0 returns every rank's measurements. ``placed``
    (:func:`.placement.processes`, ``heterps run --placed``): torchrun rank ``g`` is ``placed[g]``'s
    plan rank, on its GPU by its place among its node's replicas of its type."""
    env = torchrun_env()
    assert env is not None
    rank, world, local = env
    if placed is not None and len(placed) == world:
        rank, local = placed[rank].rank, placed[rank].device_index
    need = cfg.layout().world_size
    if world != need:
        raise InputError(
            None,
            None,
            "torchrun",
            f"the plan runs as {need} processes (one per replica, or per shard of a tensor-parallel replica); "
            f"torchrun started {world} (give --nnodes/--nproc-per-node that add up to that)",
        )
    if rank == 0:
        (progress or quiet)(_starting(cfg, world))
    result = run_rank(rank, world, "env://", cfg, local)
    return result if rank == 0 else None


def _describe(rank: int, cfg: RunConfig) -> str:
    lay = cfg.layout()
    stage, replica = lay.place(rank)
    shard = f", shard {lay.tp_rank(rank) + 1} of {stage.width(replica)}" if stage.width(replica) > 1 else ""
    return (
        f"worker rank {rank} (stage {stage.index}, replica {replica + 1} of {stage.replicas}{shard}, "
        f"{stage.kind(replica)} on {cfg.devices[stage.kind(replica)]})"
    )


def _failure(process, rank: int, cfg: RunConfig, out: Path) -> tuple[int, str]:
    """How ``process`` failed, and a sort key that puts a root cause before its echoes."""
    err = out / f"rank{rank}.err"
    if err.exists():
        first = err.read_text().split("\n\n", 1)[0].strip()
        # A worker whose neighbour died fails on the closed connection: the neighbour is the story.
        echo = any(w in first.lower() for w in ("connection closed", "connection reset", "broken pipe", "timed out"))
        return (1 if echo else 0), f"{_describe(rank, cfg)} failed: {first}"
    code = process.exitcode
    if code is not None and code < 0:
        name = signal.Signals(-code).name
        why = " (as the kernel does a process when memory runs out)" if name == "SIGKILL" else ""
        return 0, f"{_describe(rank, cfg)} was killed by {name}{why}"
    return 0, f"{_describe(rank, cfg)} exited with code {code}"


def _lost(cause: str, cfg: RunConfig, out: Path, rank: int) -> Exception:
    """The run's error for a worker's failure: the worker's own message (exit 2) where it left one, else
    :class:`WorkerLost` (exit 6) with how to continue: the ``--resume`` command where a checkpoint is
    complete, else the same command again."""
    if (out / f"rank{rank}.err").exists():
        return InputError(None, None, None, cause)
    import shlex
    import sys

    from heterps_cli.runtime.checkpoint import latest

    again = ["heterps", *sys.argv[1:]]
    if cfg.checkpoint_dir is None:
        how = f"no --checkpoint-dir was given, so nothing was kept: run it again ({shlex.join(again)})"
    else:
        try:
            found = latest(cfg.checkpoint_dir, {})
        except InputError:
            found = None
        if found is None:
            how = f"no checkpoint was complete yet: run it again as it was ({shlex.join(again)})"
        else:
            resume = again if "--resume" in again else [*again, "--resume"]
            how = f"the checkpoint after step {found[0]} is complete: continue with {shlex.join(resume)}"
    return WorkerLost(f"{cause}; {how}")


def _still_running(pending: dict) -> tuple[bool, dict]:
    """Whether any of ``pending`` failed, and those still running, from one reading of each exit code.

    Read twice, a worker that ended between the readings was dropped as if it had succeeded (its
    sentinel fires as its pipes close, a moment before it can be reaped), and when every rank went
    that way the launcher looked for a result that was never written: an internal error instead of
    the failing worker's message (seen once in CI, with both cores busy)."""
    codes = {r: p.exitcode for r, p in pending.items()}
    failed = any(code not in (None, 0) for code in codes.values())
    return failed, {r: p for r, p in pending.items() if codes[r] is None}


def _starting(cfg: RunConfig, world: int) -> str:
    processes = plural(world, "process", "processes")
    if cfg.task is None:
        return f"running {processes}: {cfg.warmup} warm-up and {cfg.steps} measured steps"
    start = f", resuming after step {cfg.start_step}" if cfg.start_step else ""
    return f"training {cfg.task} on {processes}: steps {cfg.start_step + 1} to {cfg.last_step}{start}"


def _tell_new(path: Path, offset: int, report: Progress) -> int:
    """Each whole line the reporting rank wrote since byte ``offset`` (one per step), passed on in turn
    (a progress bar shows the newest; a log gets them all); the offset read up to. Only what was appended
    is read: the file grows by a line a step, a long run's to megabytes."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            new = f.read()
    except OSError:
        return offset
    whole = new[: new.rfind(b"\n") + 1]  # a line still being written waits for the next look
    for line in whole.decode("utf-8", "replace").splitlines():
        report(line)
    return offset + len(whole)


def _stop(processes: list) -> None:
    for p in processes:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + GRACE_S
    for p in processes:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in processes:
        if p.is_alive():
            p.kill()
            p.join()


def launch_local(cfg: RunConfig, progress: Progress | None = None) -> dict:
    """Run ``cfg`` as one local process per replica; every rank's measurements (from rank 0)."""
    import multiprocessing

    report = progress or quiet
    world = cfg.layout().world_size
    ctx = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="heterps-run-") as tmp:
        out = Path(tmp)
        port = free_port()
        told = out / "progress"
        cfg = dataclasses.replace(cfg, progress_file=str(told) if cfg.task is not None else None)
        # Not daemonic: a daemonic process may start none of its own, and a task's DataLoader with workers
        # starts some. _stop below and each worker's watch on this process end them all the same.
        processes = [
            ctx.Process(target=spawned, args=(r, world, port, cfg, tmp, os.getpid()), name=f"heterps-rank{r}")
            for r in range(world)
        ]
        try:
            # Ctrl-C reaches the whole terminal group: a worker still importing torch would print its
            # KeyboardInterrupt. An ignored SIGINT survives exec and a fresh Python then keeps ignoring
            # it, so the workers start ignoring it; this process takes it back at once and ends them all.
            main = threading.current_thread() is threading.main_thread()  # only it may set handlers
            handler = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
            try:
                for p in processes:
                    p.start()
            finally:
                if main:
                    signal.signal(signal.SIGINT, handler)
            report(_starting(cfg, world))
            pending = dict(enumerate(processes))
            told_up_to = 0
            while pending:
                wait([p.sentinel for p in pending.values()], timeout=1.0)
                told_up_to = _tell_new(told, told_up_to, report)
                any_failed, pending = _still_running(pending)
                if any_failed:
                    time.sleep(0.2)  # let the echoes of a failure land, so the root cause can be told apart
                    failed = [(r, p) for r, p in enumerate(processes) if p.exitcode not in (None, 0)]
                    causes = sorted((*_failure(p, r, cfg, out), r) for r, p in failed)
                    raise _lost(causes[0][1], cfg, out, causes[0][2])
            _tell_new(told, told_up_to, report)  # the last steps, written since the last look
            return json.loads((out / "result.json").read_text())
        finally:
            _stop(processes)
