"""Two plans side by side: stages paired by the layers they share, resources, throughput, time and cost."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from heterps_cli.figures import setting
from heterps_cli.formats import Plan

# Stage pairs the alignment may score (it is quadratic in Python): 500 x 500 stages take about a
# second; past it stages pair by a linear sweep of their layer ranges (30,000 x 30,000 took hours).
MAX_ALIGNED = 250_000


@dataclass(frozen=True)
class Change:
    what: str
    old: float | str
    new: float | str

    @property
    def delta(self) -> float | None:
        if isinstance(self.old, (int, float)) and isinstance(self.new, (int, float)):
            return self.new - self.old
        return None

    @property
    def percent(self) -> float | None:
        d = self.delta
        return None if d is None or self.old == 0 else 100 * d / float(self.old)


def stage_label(stage) -> str:
    """'0-1 on cpu x34', with the memory per replica when the plan states it (section 1b)."""
    memory = f", {stage.memory_gb:.3g} GB" if getattr(stage, "memory_gb", None) else ""
    joined = "".join(
        f" + {j.resource}{j.way} x{j.replicas} ({j.samples})" for j in getattr(stage, "joined", None) or ()
    )
    own = f" ({stage.samples})" if joined else ""
    return f"{stage.first}-{stage.last} on {stage.resource}{stage.way} x{stage.replicas}{own}{joined}{memory}"


def pair_stages(old: list, new: list) -> list[tuple[int | None, int | None]]:
    """Old and new stages paired in chain order, most shared layers first (then the same type).

    An alignment, not pairing by index: with a stage inserted in the middle, the
    stages after it pair with themselves and only the new one shows as new.
    """

    n, m = len(old), len(new)
    if n * m > MAX_ALIGNED:
        return _sweep(old, new)
    old_layers, new_layers = [set(s.layers) for s in old], [set(s.layers) for s in new]

    def score(i: int, j: int) -> float:
        return len(old_layers[i] & new_layers[j]) + 0.5 * (old[i].resource == new[j].resource)

    best = np.zeros((n + 1, m + 1))
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            s = score(i - 1, j - 1)
            best[i, j] = max(best[i - 1, j], best[i, j - 1], best[i - 1, j - 1] + s if s > 0 else -1.0)
    pairs: list[tuple[int | None, int | None]] = []
    i, j = n, m
    while i or j:
        if i and j and score(i - 1, j - 1) > 0 and best[i, j] == best[i - 1, j - 1] + score(i - 1, j - 1):
            pairs.append((i - 1, j - 1))
            i, j = i - 1, j - 1
        elif i and (not j or best[i, j] == best[i - 1, j]):
            pairs.append((i - 1, None))
            i -= 1
        else:
            pairs.append((None, j - 1))
            j -= 1
    return pairs[::-1]


def _sweep(old: list, new: list) -> list[tuple[int | None, int | None]]:
    """Pairs by layer ranges in one pass, for plans too long to align (time and memory n x m): stages
    whose ranges overlap pair in order, each once; the rest are removed or new."""
    pairs: list[tuple[int | None, int | None]] = []
    i = j = 0
    while i < len(old) and j < len(new):
        if old[i].last < new[j].first:
            pairs.append((i, None))
            i += 1
        elif new[j].last < old[i].first:
            pairs.append((None, j))
            j += 1
        else:
            pairs.append((i, j))
            i, j = i + 1, j + 1
    pairs += [(k, None) for k in range(i, len(old))] + [(None, k) for k in range(j, len(new))]
    return pairs


JOB_FIELDS = ("model", "cluster", "objective", "global_batch", "samples", "epochs", "min_throughput", "max_cost")


def incomparable(old: Plan, new: Plan) -> list[str]:
    """Why two plans are not two answers to one question: each job setting that differs. Under a global
    batch the micro-batch (``batch_size``) is the plan's choice (docs/spec.md section 1f), not the job's."""
    out = []
    pipelined = old.global_batch is not None or new.global_batch is not None
    for field in JOB_FIELDS if pipelined else (*JOB_FIELDS, "batch_size"):
        a, b = getattr(old, field), getattr(new, field)
        if a != b:
            out.append(f"{field} {setting(a)} vs {setting(b)}")
    if not out:
        return []
    return [f"the plans are for different jobs ({', '.join(out)}): their figures do not compare like for like"]


def diff_plans(old: Plan, new: Plan) -> list[Change]:
    """Stages, resources, throughput, time and cost of two plans, side by side."""
    out = []
    for i, j in pair_stages(old.stages, new.stages):
        a = stage_label(old.stages[i]) if i is not None else "—"
        b = stage_label(new.stages[j]) if j is not None else "—"
        if i is not None and j is not None:
            what = f"stage {i}" if i == j else f"stage {i} → {j}"
        else:
            what = f"stage {i} (removed)" if i is not None else f"stage {j} (new)"
        out.append(Change(what, a, b))
    for t in dict.fromkeys([*old.resources, *new.resources]):
        out.append(Change(f"{t} units", old.resources.get(t, 0), new.resources.get(t, 0)))
    out += _rental_changes(old, new)
    out += [
        Change("throughput samples/s", old.throughput, new.throughput),
        Change("training time s", old.time_s, new.time_s),
        Change("cost USD", old.cost_usd, new.cost_usd),
    ]
    return out


def _rental_changes(old: Plan, new: Plan) -> list[Change]:
    """Section 1e: the nodes of each kind rented, the rate and the idle units, where either plan rents
    nodes (a plan priced per unit has none, and shows as 0 nodes)."""
    if old.rental is None and new.rental is None:
        return []
    out = []
    a, b = old.rental or {}, new.rental or {}
    for kind in dict.fromkeys([*a, *b]):
        out.append(Change(f"{kind} nodes", a.get(kind, 0), b.get(kind, 0)))
    if old.rate_usd_per_hour is not None or new.rate_usd_per_hour is not None:
        out.append(Change("rate USD/h", old.rate_usd_per_hour or 0.0, new.rate_usd_per_hour or 0.0))
    idle_a, idle_b = old.idle_units or {}, new.idle_units or {}
    for t in dict.fromkeys([*idle_a, *idle_b]):
        if idle_a.get(t, 0) or idle_b.get(t, 0):
            out.append(Change(f"{t} idle units", idle_a.get(t, 0), idle_b.get(t, 0)))
    return out
