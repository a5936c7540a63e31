"""The link bandwidth a profile's odt is charged at: a loopback all-reduce between two processes on
cpu, a pinned host-to-device copy on cuda (docs/guide/profiling.md)."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from heterps_cli.progress import Progress

LATENCY_BYTES = 4096  # the smallest all-reduce the line is fitted to, and the messages' size
PROBE_ROUNDS = 4  # the probe's timings take turns over this many rounds (a slow spell hits them all)
PROBE_SIZES = ((LATENCY_BYTES, 30), (64 << 10, 30), (256 << 10, 30), (1 << 20, 30), (4 << 20, 8))
BIG_PER_ROUND = 3  # all-reduces of the probe's largest size (16 MiB) per round


def _allreduce_worker(rank: int, port: int, size: int, rounds: int, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    sizes = [(n, per) for n, per in PROBE_SIZES if n < size] + [(size, BIG_PER_ROUND)]
    tensors = [torch.ones(n // 4) for n, _ in sizes]
    small = tensors[0]

    def all_reduce(tensor: torch.Tensor) -> float:
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(tensor)
        return time.perf_counter() - start

    def message(tensor: torch.Tensor) -> float:  # there and back, as a boundary's activations and gradient go
        dist.barrier()
        start = time.perf_counter()
        if rank == 0:
            dist.send(tensor, 1)
            dist.recv(tensor, 1)
        else:
            dist.recv(tensor, 0)
            dist.send(tensor, 0)
        return (time.perf_counter() - start) / 2

    for _ in range(2):  # gloo's connections and buffers, untimed
        for tensor in tensors:
            all_reduce(tensor)
        message(small)
    times: list[list[float]] = [[] for _ in sizes]
    messages: list[float] = []
    for _ in range(rounds):
        for (_, per), tensor, got in zip(sizes, tensors, times):
            got += [all_reduce(tensor) for _ in range(per)]
        messages += [message(small) for _ in range(PROBE_SIZES[0][1])]
    dist.destroy_process_group()
    if rank == 0:
        means = [(n, statistics.fmean(t)) for (n, _), t in zip(sizes, times)]
        Path(out).write_text(json.dumps({"all_reduce": means, "message": statistics.fmean(messages)}))


def fit_link(means: list[tuple[int, float]]) -> tuple[float, float]:
    """(latency s, bandwidth bytes/s) of the line t = latency + bytes / bandwidth through the mean
    all-reduce times of several sizes, each point's error relative to its time (so that 4 KiB counts
    as much as 16 MiB). A fit that comes out negative falls back to the smallest size's time as the
    latency and the largest's bytes beyond it as the bandwidth."""
    x = np.array([n for n, _ in means], dtype=float)
    t = np.array([m for _, m in means])
    design = np.stack([np.ones_like(x), x], axis=1) / t[:, None]
    (latency, per_byte), *_ = np.linalg.lstsq(design, np.ones_like(x), rcond=None)
    if latency < 0 or per_byte <= 0:
        latency = t[0]
        per_byte = (t[-1] - t[0]) / (x[-1] - x[0]) if t[-1] > t[0] else t[-1] / x[-1]
    return float(latency), float(1.0 / per_byte)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, for a local process group to meet at."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class Link:
    """What odt and section 1d's fixed costs are charged at: bytes/s, how they were found, and where
    the link was measured, its all-reduce's and its messages' latency beyond their bytes (s)."""

    bandwidth: float
    how: str
    all_reduce_latency: float | None = None
    transfer_latency: float | None = None


def loopback_allreduce_bandwidth(
    size: int = 16 << 20, rounds: int = PROBE_ROUNDS, timeout: float = 60.0
) -> float | None:
    """Bytes/s of the loopback gloo all-reduce between two processes (:func:`loopback_allreduce`), or None."""
    measured = loopback_allreduce(size, rounds, timeout)
    return measured[0] if measured is not None else None


def loopback_allreduce(
    size: int = 16 << 20, rounds: int = PROBE_ROUNDS, timeout: float = 60.0
) -> tuple[float, float, float] | None:
    """Two processes over loopback gloo: the bandwidth (bytes/s) and latency (s) of the line fitted to
    the mean all-reduces of :data:`PROBE_SIZES` and ``size`` bytes (:func:`fit_link`), and a message's
    latency, half the mean time of :data:`LATENCY_BYTES` sent and sent back; or None. The timings
    take turns over ``rounds`` rounds. Means, not medians: a plan's throughput pays every all-reduce
    and message, the slow ones too, and here they are heavy-tailed (4 KiB: a median of 0.35–0.68 ms,
    a mean of 1.1–1.9, one in ten over 3.5 ms; docs/fidelity.md). A line over sizes, not 4 KiB and
    16 MiB alone: a stage's gradients are usually between, and the mean of one size's heavy tail
    varies from probe to probe. Not one float: gloo reduces a single element by a path of its own."""
    import torch.multiprocessing as mp

    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "means.json")
        ctx = mp.get_context("spawn")
        procs = [
            ctx.Process(target=_allreduce_worker, args=(r, port, size, rounds, out), daemon=True) for r in range(2)
        ]
        try:
            with sigint_ignored():
                for p in procs:
                    p.start()
            deadline = time.monotonic() + timeout
            for p in procs:
                p.join(max(0.0, deadline - time.monotonic()))
        finally:  # on Ctrl-C too: heterps exits with os._exit, which runs no atexit clean-up of daemons
            for p in procs:
                if p.is_alive():
                    p.kill()
                    p.join()
        if not Path(out).exists():
            return None
        measured = json.loads(Path(out).read_text())
        latency, bandwidth = fit_link([(int(n), float(t)) for n, t in measured["all_reduce"]])
        return bandwidth, latency, float(measured["message"])


@contextlib.contextmanager
def sigint_ignored():
    """Children started inside ignore SIGINT (a spawned interpreter keeps an ignored SIGINT ignored):
    Ctrl-C reaches the whole foreground process group, and only this process should answer it,
    by ending them, rather than each child printing its own KeyboardInterrupt traceback."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def host_to_device_bandwidth(size: int = 64 << 20, rounds: int = 10) -> float:
    """Bytes/s of a pinned host-to-device copy of ``size`` bytes (median of ``rounds``)."""
    host = torch.empty(size, dtype=torch.uint8).pin_memory()
    device = torch.empty(size, dtype=torch.uint8, device="cuda")
    times = []
    for i in range(rounds + 2):
        torch.cuda.synchronize()
        start = time.perf_counter()
        device.copy_(host, non_blocking=True)
        torch.cuda.synchronize()
        if i >= 2:
            times.append(time.perf_counter() - start)
    return size / statistics.median(times)


def link_bandwidth(device: str, link_gbps: float | None, report: Progress, notes: list[str]) -> Link:
    """The link odt is charged at: given, host-to-device (cuda) or a loopback all-reduce (cpu), which
    also measures the latencies of docs/spec.md section 1d."""
    if link_gbps is not None:
        return Link(link_gbps * 1e9 / 8, f"given: --link-gbps {link_gbps:g}")
    if device == "cuda":
        report("measuring host-to-device bandwidth")
        bandwidth = host_to_device_bandwidth()
        return Link(bandwidth, f"measured: pinned host-to-device copy, {bandwidth / 1e9:.2f} GB/s")
    report("measuring loopback all-reduce bandwidth and latencies (gloo, 2 processes)")
    measured = loopback_allreduce()
    if measured is None:
        how = "estimated: the loopback all-reduce failed, so 10 Gbit/s is assumed"
        notes.append(how)
        return Link(1.25e9, how)
    bandwidth, latency, message = measured
    how = (
        f"measured: loopback gloo all-reduces of {LATENCY_BYTES // 1024} KiB to 16 MiB between 2 processes, "
        f"{bandwidth / 1e9:.2f} GB/s beyond a latency of {latency * 1e3:.3f} ms (a line through their means)"
    )
    return Link(bandwidth, how, latency, message)
