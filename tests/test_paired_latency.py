"""The all-reduce latency as replicas pay it (heterps_cli.profiling.replicas): processes of a concurrent wave
pair up, take a whole-model step each and all-reduce, and the mean of the two's times there, the wait for
the partner included, is what a step pays."""

from __future__ import annotations

import multiprocessing
import queue
import time

import pytest
import torch

from heterps_cli.profiling.links import free_port
from heterps_cli.profiling.models import Model
from heterps_cli.profiling.replicas import paired_latency

LAG_S = 0.03


class _Lags(torch.nn.Module):
    def __init__(self, seconds: float):
        super().__init__()
        self.seconds = seconds

    def forward(self, x):
        time.sleep(self.seconds)
        return x


def _one(index: int, together: int, port: int, out) -> None:
    """Process 0's step is LAG_S slower than the others': they wait for it at every all-reduce."""
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(8, 8), _Lags(LAG_S if index == 0 else 0.0))
    model = Model("lagging", module, (torch.randn(4, 8),))
    out.put((index, paired_latency(model, "cpu", None, 1e9, port=port, index=index, together=together)))


def _latencies(together: int) -> dict[int, float | None]:
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_one, args=(i, together, port, out), daemon=True) for i in range(together)]
    try:
        for p in procs:
            p.start()
        got = {}
        for _ in procs:
            try:
                index, latency = out.get(timeout=120)
            except queue.Empty:
                raise AssertionError(f"got {got}; exit codes {[p.exitcode for p in procs]}") from None
            got[index] = latency
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()
    return got


@pytest.mark.slow  # over a second here: the slow suite, which CI runs too
def test_a_pair_charges_its_all_reduce_and_the_wait_for_the_partner_and_an_odd_one_out_has_none():
    """Process 1 reaches every all-reduce 30 ms before process 0 and waits there: a step of the pair then
    spends 30 ms more in the all-reduce on one of the two, 15 ms on the mean of both, beyond the
    all-reduce itself (milliseconds here). Both get the same figure; processes 2 and 3, neither lagging,
    pair apart from them and wait for nothing of theirs. The last of an odd wave has no partner and meets
    nobody."""
    got = _latencies(4)
    assert got[0] == got[1] and got[2] == got[3]
    assert got[0] is not None and LAG_S / 2 * 0.9 <= got[0] < LAG_S / 2 + 0.01, got
    assert got[2] is not None and got[2] < LAG_S / 4, got


def test_the_last_of_an_odd_wave_has_no_partner_and_meets_nobody():
    model = Model("lagging", torch.nn.Linear(8, 8), (torch.randn(4, 8),))
    assert paired_latency(model, "cpu", None, 1e9, port=free_port(), index=4, together=5) is None
