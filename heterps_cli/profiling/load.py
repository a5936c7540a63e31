"""How busy the machine was while ``heterps profile`` measured, and whether to measure again.

A layer's time on a machine that other work shares is the layer's and the other work's: a profile
taken so looks like a good one. So the profile measures its own conditions: the CPU time every other
process spent while it measured (``/proc/stat``'s busy time less this process's and its children's,
over the wall time: the cores other work kept busy), the load average before and after, the share
of noisy layers, and an all-reduce timed as replicas pay it against the idle link's figure. Where
one of them says the machine was not idle, :func:`advice` says to profile again and why.
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass

OTHERS_BUSY = 0.5  # cores other work kept busy, on average, above which a profile is not of an idle machine
NOISY_SHARE = 0.25  # share of noisy layers above which the machine, not a layer, was noisy
WAITED = 3.0  # an all-reduce timed by replicas this many times the idle link's latency: they waited


@dataclass(frozen=True)
class Snapshot:
    wall: float
    busy: float | None  # s of CPU time the whole machine spent busy since boot (None: no /proc/stat)
    ours: float  # s of CPU time this process and its waited-for children spent
    load: float | None  # 1-minute load average


@dataclass(frozen=True)
class Load:
    """The machine's conditions over a measurement (docs/guide/profiling.md, "Was the machine idle?")."""

    others: float | None  # cores other processes kept busy on average (None where not measurable)
    before: float | None  # 1-minute load average before and after
    after: float | None
    cores: int

    def describe(self) -> str:
        busy = f"other processes kept {self.others:.2f} of {self.cores} cores busy" if self.others is not None else ""
        loads = (
            f"load average {self.before:.2f} before, {self.after:.2f} after"
            if self.before is not None and self.after is not None
            else ""
        )
        return (
            "machine: " + "; ".join(x for x in (busy, loads) if x) if busy or loads else "machine: not measurable here"
        )


def snapshot() -> Snapshot:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    ours = own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
    try:
        load: float | None = os.getloadavg()[0]
    except OSError:
        load = None
    return Snapshot(time.monotonic(), _busy_seconds(), ours, load)


def _busy_seconds() -> float | None:
    """CPU seconds the machine spent busy since boot: every field of /proc/stat's cpu line but idle and iowait."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [float(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    if len(fields) < 5:
        return None
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    return (sum(fields[:8]) - fields[3] - fields[4]) / ticks  # user..steal, less idle and iowait


def between(start: Snapshot, end: Snapshot) -> Load:
    wall = end.wall - start.wall
    others = None
    if start.busy is not None and end.busy is not None and wall > 0:
        others = max(0.0, (end.busy - start.busy) - (end.ours - start.ours)) / wall
    return Load(others, start.load, end.load, os.cpu_count() or 1)


def advice(
    load: Load | None, noisy: int, layers: int, paired_latency: float | None, idle_latency: float | None
) -> list[str]:
    """Why to profile again, one line each; empty when every sign says the machine was idle."""
    out = []
    if load is not None and load.others is not None and load.others > OTHERS_BUSY:
        out.append(
            f"other processes kept {load.others:.2f} cores busy on average while it measured: the times are partly "
            "theirs; profile again when the machine is idle (top or ps shows what runs)"
        )
    if layers and noisy / layers > NOISY_SHARE:
        out.append(
            f"{noisy} of {layers} layers are noisy (spread over 10%): the machine, not a layer, varied; profile "
            "again when it is idle, or take the median over fresh processes (--processes 3)"
        )
    if paired_latency is not None and idle_latency and paired_latency > WAITED * idle_latency:
        out.append(
            f"the replicas' all-reduce took {paired_latency * 1e3:.3g} ms beyond its bytes against "
            f"{idle_latency * 1e3:.3g} ms on the idle link: the processes waited on each other (a busy machine), "
            "and a plan would charge every all-reduce so; profile again when the machine is idle"
        )
    return out
