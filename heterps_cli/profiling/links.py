"""The link bandwidth a profile's odt is charged at: a loopback all-reduce between two processes on
cpu, a pinned host-to-device copy on cuda (docs/guide/profiling.md)."""

from __future__ import annotations

import contextlib
import signal
import socket
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from heterps_cli.progress import Progress

LATENCY_BYTES = 4096  # the all-reduce whose time is its latency (see loopback_allreduce)
PROBE_ROUNDS = 4  # the probe's kinds of timing take turns over this many rounds (a slow spell hits all)
BIG_PER_ROUND, SMALL_PER_ROUND = 3, 30  # timings per round: all-reduces of `size`; of 4 KiB and messages


def _allreduce_worker(rank: int, port: int, size: int, rounds: int, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    big, small = torch.ones(size // 4), torch.ones(LATENCY_BYTES // 4)

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
        all_reduce(big), all_reduce(small), message(small)
    times: list[list[float]] = [[], [], []]
    for _ in range(rounds):
        times[0] += [all_reduce(big) for _ in range(BIG_PER_ROUND)]
        times[1] += [all_reduce(small) for _ in range(SMALL_PER_ROUND)]
        times[2] += [message(small) for _ in range(SMALL_PER_ROUND)]
    dist.destroy_process_group()
    if rank == 0:
        Path(out).write_text(" ".join(str(statistics.fmean(t)) for t in times))


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
    """Bytes/s of an all-reduce of ``size`` bytes between two processes over loopback gloo, or None."""
    measured = loopback_allreduce(size, rounds, timeout)
    return measured[0] if measured is not None else None


def loopback_allreduce(
    size: int = 16 << 20, rounds: int = PROBE_ROUNDS, timeout: float = 60.0
) -> tuple[float, float, float] | None:
    """Two processes over loopback gloo: an all-reduce's bytes/s beyond its latency, from one of
    ``size`` bytes; that latency, the time of one of :data:`LATENCY_BYTES`; and a message's, half the
    time of :data:`LATENCY_BYTES` sent and sent back; or None. Each is the mean of its timings, which
    take turns over ``rounds`` rounds: a plan's throughput pays every all-reduce and message, the slow
    ones too, and here they are heavy-tailed (4 KiB: a median of 0.46–0.68 ms, a mean of 1.1–1.7, one
    in ten over 3.5 ms; docs/fidelity.md), so a median charges a run too little. Not one float:
    gloo reduces a single element by a path of its own, which took 0.38–0.41 ms here where 16 floats
    to 16 K floats took 0.6–0.9 ms, as every gradient bucket does (docs/fidelity.md); 4 KiB's bytes
    take microseconds."""
    import torch.multiprocessing as mp

    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "means")
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
        whole, latency, message = map(float, Path(out).read_text().split())
        moved = size - LATENCY_BYTES  # beyond the latency's own few bytes
        return moved / (whole - latency if whole > latency else whole), latency, message


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
        f"measured: loopback gloo all-reduce of 16 MiB between 2 processes, {bandwidth / 1e9:.2f} GB/s beyond "
        f"its latency of {latency * 1e3:.3f} ms (the mean all-reduce of {LATENCY_BYTES // 1024} KiB)"
    )
    return Link(bandwidth, how, latency, message)
