"""The all-reduce latency as replicas pay it (``heterps profile --concurrent K``, cpu).

The link probe times each all-reduce right after a barrier, on an idle machine. A
training step's all-reduce follows its backward pass instead: both processes
have been computing, neither waits at a barrier, and the later one to arrive
times the all-reduce itself (``heterps run``'s ``sync``, runtime.report.split_sync).
On this 2-core machine that all-reduce of the guide's classifier (294 KiB) took
a mean of 1.8–2.1 ms in a run, where the probe's line put it at 1.1–1.5
(docs/fidelity.md).

So the processes of a concurrent wave, which are busy as a plan's units are,
pair up (0 with 1, 2 with 3, ...) and each pair times it so: a whole-model step
in each, then an all-reduce of the model's gradient bytes (at most
:data:`MOST_BYTES`), over :data:`STEPS_AT_LEAST` steps or more. The latency is
the mean of both processes' times in the all-reduce, less the bytes over the
link's bandwidth: what each replica's step spends there beyond its compute, its
wait for its partner included. Not the later one's time alone: the two leave an
all-reduce at different moments, so the one that leaves first arrives first at
the next and waits there, which the step pays as surely as the all-reduce (the
classifier's pairs: 1.95–2.2 ms the later one's, 0.33–0.47 more waiting,
where their steps' compute differed by 0.06–0.09 ms).
"""

from __future__ import annotations

import statistics
import time
from datetime import timedelta

import torch

from heterps_cli.profiling.measure import weight_bytes
from heterps_cli.profiling.models import Model
from heterps_cli.profiling.timing import Loss, step_times

MOST_BYTES = 1 << 20  # a larger model's all-reduce is mostly bytes, which the bandwidth already charges
STEPS_AT_LEAST, STEPS_AT_MOST = 20, 200
SECONDS = 1.0  # steps are added, up to STEPS_AT_MOST, until they last about this long
JOIN_TIMEOUT_S = 120.0


def paired_latency(
    model: Model,
    device: str,
    loss: Loss | None,
    bandwidth: float,
    *,
    port: int,
    index: int,
    together: int,
) -> float | None:
    """This process's pair's all-reduce latency beyond its bytes (s), or None where it has no partner
    (the last of an odd wave) or the pair could not meet. Every process of the wave calls it; process 0
    hosts the store the pairs meet at."""
    import torch.distributed as dist

    paired = together - together % 2
    if index >= paired:
        return None
    try:
        store = dist.TCPStore(
            "127.0.0.1",
            port,
            is_master=index == 0,
            timeout=timedelta(seconds=JOIN_TIMEOUT_S),
            wait_for_workers=False,
        )
    except (RuntimeError, ValueError, OSError):
        return None
    try:
        # each pair its own group on one store: no mesh over the whole wave, no group the odd one must join
        dist.init_process_group(
            "gloo",
            store=dist.PrefixStore(f"pair-{index // 2}", store),
            rank=index % 2,
            world_size=2,
            timeout=timedelta(seconds=JOIN_TIMEOUT_S),
        )
        try:
            return _timed(model, device, loss, bandwidth)
        finally:
            dist.destroy_process_group()
    except (RuntimeError, ValueError, OSError):  # the pair could not meet, or the partner died
        return None
    finally:
        _leave(store, index, paired)


def _leave(store, index: int, paired: int) -> None:
    """Process 0 hosts the store every pair meets at: it stays until every pair is done with it."""
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    try:
        store.add("left", 1)
        while index == 0 and store.add("left", 0) < paired and time.monotonic() < deadline:
            time.sleep(0.01)
    except (RuntimeError, OSError):  # the host is gone: nothing to wait for
        pass


def _timed(model: Model, device: str, loss: Loss | None, bandwidth: float) -> float:
    import torch.distributed as dist

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one unit, as the layers were timed
    try:
        size = min(int(weight_bytes(model.module)), MOST_BYTES)  # odt's bytes: the all-reduce is as big
        bucket = torch.ones(max(size // 4, 1))
        step = statistics.median(step_times(model, device, 2, warmup=1, loss=loss))
        wanted = torch.tensor([min(max(int(SECONDS / max(step, 1e-6)), STEPS_AT_LEAST), STEPS_AT_MOST)])
        dist.all_reduce(wanted, op=dist.ReduceOp.MIN)  # as many in both, the slower one's
        times = []
        for i in range(int(wanted) + 1):
            step_times(model, device, 1, warmup=0, loss=loss)
            start = time.perf_counter()
            dist.all_reduce(bucket)
            if i:  # the first meets a partner still finishing its profile
                times.append(time.perf_counter() - start)
        mine = torch.tensor(times, dtype=torch.float64)
        both = [torch.zeros_like(mine) for _ in range(2)]
        dist.all_gather(both, mine)
    finally:
        torch.set_num_threads(threads)
    spent = (both[0].mean() + both[1].mean()) / 2
    return max(float(spent) - bucket.numel() * 4 / bandwidth, 0.0)
