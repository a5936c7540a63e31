"""What no plan at one micro-batch can pass, proven without a search (docs/spec.md section 1f): the pace
ceiling, and the units a throughput needs. Both rest on one fact: every replica trains at least one sample
of each micro-batch, and a replica training ``n`` of the ``B`` samples takes ``serial + parallel n / B`` of
its stage's terms, boundary transfers included, a micro-batch (sections 1, 1d, 1f). Everything else a plan
adds (fill and drain, the all-reduce, the optimiser step, recomputation, memory) only slows it, so the
bounds hold for every plan, mixed stages (section 1i) and whole nodes (section 1e) included."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from heterps_cli.problem import Problem

# A relaxation of every type's limit: its units weighed by these factors (a ratio to the others'), each
# tried for every type; the first, all types alike, is the plain count of units.
WEIGHTS = (1.0, *np.geomspace(1 / 16, 16, 17))
WINDOW_LAYERS = 2048  # the units bound runs where the model has at most this many layers (its work is n²)


def pace_ceiling(problem: Problem) -> float:
    """No plan at the problem's micro-batch ``B`` is faster than this: a replica of a stage holding layer
    ``l`` takes at least ``oct (1 - alpha) + oct alpha / B`` of each of its layers per micro-batch on its
    type and degree (section 1f), and a step of ``M`` micro-batches at least ``M`` times that (sections 1
    and 1d). Under a pipeline a replica also waits for its share of the stage's boundary transfers and
    their messages' latency, and pays its type's pass start (section 1d), so the stage holding ``l`` is no
    faster than the least of those over every run of layers ``a..b`` around ``l`` (each term at the least
    any type and degree gives)."""
    B = problem.batch_size
    pace = layer_pace(problem)
    if problem.pipelined and pace.size and np.isfinite(pace).all():
        pace = _around(problem, pace)
    slowest = float(pace.max()) if pace.size else 0.0
    return 0.0 if not np.isfinite(slowest) else (np.inf if slowest <= 0 else B / slowest)


def layer_pace(problem: Problem) -> np.ndarray:
    """``[n]``: each layer's least time per micro-batch on a replica training one sample, any type and
    degree (inf where none runs it)."""
    pace = np.full(problem.n_layers, np.inf)
    for view in problem.views:
        serial, parallel, _, _ = view.parts
        pace = np.minimum(pace, np.where(view.runnable, serial + parallel / problem.batch_size, np.inf).min(axis=1))
    return pace


def _around(problem: Problem, pace: np.ndarray) -> np.ndarray:
    """Per layer ``l``: the least time per micro-batch of a replica of any stage ``a..b`` holding it,
    ``Σ_{a..b} pace + edge[a] + edge[b + 1] + start``, where ``edge`` is a boundary's transfer at a share of
    one sample and its messages' latency. The sum splits into a term of ``a`` and one of ``b``, so the least
    over ``a ≤ l`` and over ``b ≥ l`` are a running minimum each."""
    start, _, message = problem.fixed_costs
    rate = min(float(view.boundary_rate.min()) for view in problem.views)
    edge = problem.boundary_bytes * rate / problem.batch_size + problem.boundary_messages * float(message.min())
    before = np.concatenate([[0.0], np.cumsum(pace)])  # time of layers 0..i-1
    left = np.minimum.accumulate(edge[:-1] - before[:-1])
    right = np.minimum.accumulate((before[1:] + edge[1:])[::-1])[::-1]
    return left + right + float(start.min())


@dataclass(frozen=True)
class Shortfall:
    """Units weighed by ``weights`` (one per type): every plan reaching the throughput needs at least
    ``need`` of them, the cluster has ``have``."""

    weights: np.ndarray
    need: float
    have: float


def units_short(problem: Problem, throughput: float) -> Shortfall | None:
    """Why no plan at the problem's micro-batch ``B`` reaches ``throughput`` ``X`` within its units (None
    where this bound cannot tell; pipelined problems of up to :data:`WINDOW_LAYERS` layers).

    A stage is no faster than ``B / c`` for its slowest replica's time ``c`` a micro-batch, so each of its
    replicas trains at most the ``m`` samples it can within ``B / X`` (at most ``B``, and at most what its
    type measured), and ``m ≥ 1``. A stage on layers ``a..b`` whose replicas, of any types and degrees,
    train the ``B`` samples between them, ``n_r ≤ m_r`` each, holds ``Σ d_r ≥ B min d / m`` units; weighed
    per type by ``w``, ``Σ w_r d_r ≥ B min w d / m``. The fewest weighed units over every cut into stages is
    a shortest path over the layer boundaries; where it exceeds the weighed units the cluster has, for any
    weights, no plan reaches ``X``."""
    n = problem.n_layers
    if not problem.pipelined or not n or n > WINDOW_LAYERS or not throughput > 0:
        return None
    kinds = _kinds(problem)
    weights = _weight_rows(problem.n_types)
    scaled = weights[:, kinds.type] * kinds.degree[None, :]  # [W, K]: a replica's weighed units
    B, tau = problem.batch_size, problem.batch_size / throughput
    reach = np.concatenate([[0.0], np.cumsum(layer_pace(problem))])
    fewest = np.full((len(weights), n + 1), np.inf)
    fewest[:, 0] = 0.0
    for a in range(n):
        if not np.isfinite(fewest[:, a]).any():
            continue
        # a stage a..b whose one-sample pace passes B / X fits no replica: b + 1 < end
        end = int(np.searchsorted(reach, reach[a] + tau * (1 + 1e-9), side="right"))
        b1 = np.arange(a + 1, min(end, n + 1))
        if b1.size:
            most = kinds.most_samples(problem, a, b1, tau)  # [K, nb], 0 where none fits
            per = np.where(most > 0, 1.0 / np.maximum(most, 1), np.inf)
            units = B * (scaled[:, :, None] * per[None]).min(axis=1)  # [W, nb]
            fewest[:, b1] = np.minimum(fewest[:, b1], fewest[:, a, None] + units)
    have = weights @ problem.limits.astype(float)
    excess = (fewest[:, n] - have) / weights.sum(axis=1)
    row = int(np.argmax(excess))
    if not fewest[row, n] > have[row] * (1 + 1e-9):
        return None
    return Shortfall(weights[row], float(fewest[row, n]), float(have[row]))


def _weight_rows(T: int) -> np.ndarray:
    """``[W, T]``: every type's units alike, then each type's weighed by each of :data:`WEIGHTS`."""
    rows = [np.ones(T)]
    for t in range(T if T > 1 else 0):
        for w in WEIGHTS[1:]:
            row = np.ones(T)
            row[t] = w
            rows.append(row)
    return np.array(rows)


@dataclass(frozen=True)
class _Kinds:
    """Every (type, degree) a replica may be, ``K`` of them: prefix sums of each's per-layer terms."""

    type: np.ndarray  # [K]
    degree: np.ndarray  # [K]
    serial: np.ndarray  # [K, n + 1] sums of oct (1 - alpha) over layers 0..i-1
    parallel: np.ndarray  # [K, n + 1] of oct alpha
    unrunnable: np.ndarray  # [K, n + 1] layers 0..i-1 it cannot run
    cap: np.ndarray  # [K, n] the most samples a replica may train of each layer (section 1f)
    start: np.ndarray  # [K] pass start
    message: np.ndarray  # [K] latency a message across a boundary
    rate: np.ndarray  # [K] seconds a byte across a boundary

    def most_samples(self, problem: Problem, a: int, b1: np.ndarray, tau: float) -> np.ndarray:
        """``[K, nb]``: the most samples a replica of each kind trains of a stage on layers ``a..b1-1``
        within ``tau`` a micro-batch (0 where it cannot run them, or not one sample in time)."""
        B = problem.batch_size
        messages, bytes_ = problem.boundary_messages, problem.boundary_bytes
        fixed = self.serial[:, b1] - self.serial[:, a, None] + self.start[:, None]
        fixed = fixed + self.message[:, None] * (messages[a] + messages[b1])[None, :]
        per = self.parallel[:, b1] - self.parallel[:, a, None] + self.rate[:, None] * (bytes_[a] + bytes_[b1])[None, :]
        room = tau * (1 + 1e-9) - fixed
        with np.errstate(divide="ignore", invalid="ignore"):
            m = np.where(per > 0, np.floor(room * B / per * (1 + 1e-9) + 1e-9), np.where(room >= 0, B, 0))
        m = np.minimum(np.minimum(m, B), np.minimum.accumulate(self.cap[:, a:], axis=1)[:, b1 - a - 1])
        runs = self.unrunnable[:, b1] == self.unrunnable[:, a, None]
        return np.where(runs & (room >= 0), np.maximum(m, 0), 0)


def _kinds(problem: Problem) -> _Kinds:
    start, _, message = problem.fixed_costs
    rows: dict[str, list] = {name: [] for name in ("type", "degree", "serial", "parallel", "unrunnable", "cap")}
    rows.update(start=[], message=[], rate=[])
    for view in problem.views:
        serial, parallel, _, _ = view.parts
        cap = view.share_cap if view.share_cap is not None else np.full(serial.shape, np.inf)
        for t in range(problem.n_types):
            runs = view.runnable[:, t]
            rows["type"].append(t)
            rows["degree"].append(view.degree)
            rows["serial"].append(np.concatenate([[0.0], np.cumsum(np.where(runs, serial[:, t], 0.0))]))
            rows["parallel"].append(np.concatenate([[0.0], np.cumsum(np.where(runs, parallel[:, t], 0.0))]))
            rows["unrunnable"].append(np.concatenate([[0], np.cumsum(~runs)]))
            rows["cap"].append(cap[:, t])
            rows["start"].append(float(start[t]))
            rows["message"].append(float(message[t]))
            rows["rate"].append(float(view.boundary_rate[t]))
    return _Kinds(**{name: np.array(values) for name, values in rows.items()})


BISECTION = 1e-3  # how close the units bound's least ruled-out throughput is found


def speed_bound(problem: Problem, reached: float, cap: float) -> float:
    """No plan at any micro-batch the problem may choose is faster than this: at each choice the least of
    ``cap`` (a bound known already), its pace ceiling and the least throughput its units bound rules out
    (found to within :data:`BISECTION`). ``reached``: a plan's throughput, where the search starts."""
    if not reached > 0:
        return cap
    proven, start = 0.0, reached * (1 + BISECTION)
    for batch in problem.micro_batch_choices:
        sub = problem.at_micro_batch(batch)
        top, lo = min(cap, pace_ceiling(sub)), max(proven, start)
        if not np.isfinite(top):  # nothing bounds this choice
            return np.inf
        if top <= lo or units_short(sub, lo) is not None:  # none at this choice passes top, or lo
            proven = max(proven, min(top, lo))
            continue
        while top > lo * (1 + BISECTION):  # top is ruled out (or the cap), lo is not
            mid = float(np.sqrt(lo * top))
            lo, top = (lo, mid) if units_short(sub, mid) is not None else (mid, top)
        proven = max(proven, top)
    return proven
