"""The cost model's terms for every contiguous stage, as the exact solver's DP reads them: index
``[i, j, t]`` is layers ``j..i-1`` on type ``t``. Section 1's table (:func:`stage_table`), and under a
pipeline schedule (section 1d, :mod:`.pipeline`) each stage count's grid (:func:`stage_grid`: a type
paired with the stage's place and the way it runs, sections 1g and 1h) and the relaxation that bounds
every larger count (:func:`at_least_grid`). A new term of the model is added here; the DPs of
:mod:`.kernel` and the questions of :mod:`.step` read whatever these tables hold."""

from __future__ import annotations

import functools
import hashlib
import weakref
from dataclasses import dataclass, field

import numpy as np

from heterps_cli.errors import TooLarge
from heterps_cli.formulas import activations_held, copies_held, pipeline_step
from heterps_cli.problem import Problem
from heterps_cli.replica_counts import min_memory_replicas, share_floor_spans
from heterps_cli.schedulers.exact.kernel import Chain
from heterps_cli.stages import stage_label


@dataclass
class Table:
    """Cost terms of every contiguous stage: index ``[i, j, t]`` = layers ``j..i-1`` on type ``t``.

    End first: the DP reads all the stages that end at one boundary at a time, and
    in this order they are contiguous (twice as fast at 1,000 layers)."""

    sc: np.ndarray
    pc: np.ndarray
    sd: np.ndarray
    pd: np.ndarray  # with the stage-boundary transfer (section 1b), which depends on j, i and t only
    ok: np.ndarray  # j < i and every layer of the stage can run on t
    min_k: np.ndarray  # the fewest replicas whose memory fits (section 1b; 1 without a limit, inf: none)
    ps: np.ndarray  # the part of pc that is per sample (section 1's whole samples): pc but under section 1d
    # Grids filled on this table before any type's limit applies (:mod:`.grid`), by target, where solvers
    # that differ only in their limits share it (the rentals of whole nodes, which ask the same targets);
    # None: not kept.
    fills: dict | None = field(default=None, repr=False, compare=False)


# Cells of the stage grid ((layers + 1)^2 x types) the solver may hold: each costs about 90 bytes
# over the table and the grid's arrays (2,000 x 3 layers: 12 M cells, 1.1 GB measured), so this
# keeps it under 2 GB.
MAX_GRID_CELLS = 20_000_000


def most_stages(problem: Problem) -> int:
    """No plan has more stages than layers, nor than units (each stage takes one at least)."""
    return int(min(problem.n_layers, problem.limits.sum()))


def grid_cells(problem: Problem) -> int:
    """Stage cells the solver's largest grid holds: its one grid, or under a pipeline schedule
    (section 1d, :mod:`.pipeline`, whose walks hold one stage count's grid at a time) the grid of
    the most stages, on that many times the types."""
    cells = (problem.n_layers + 1) ** 2 * problem.n_types
    if problem.pipelined:  # each way a stage may run: sections 1g and 1h
        cells *= most_stages(problem) * len(problem.stage_ways)
    return cells


def too_large(problem: Problem) -> bool:
    """Whether the model is too long for the exact solver's stage grid (:data:`MAX_GRID_CELLS`)."""
    return grid_cells(problem) > MAX_GRID_CELLS


def activation_spans(problem: Problem) -> np.ndarray:
    """``[i, j, 1]``: the activation bytes of one (micro-)batch that stage ``j..i-1`` holds, a tensor two
    of its layers keep counted once, its first layer's own copy of its input included (section 1b)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return spans(problem.held_once[:, None]) + problem.shared_entry[None, :, None]


def spans(per_layer: np.ndarray) -> np.ndarray:
    """``[i, j]``: the sum over layers ``j..i-1``, added up from ``j`` as a plan's own figures are.
    A difference of prefix sums loses a stage's small times beside a huge one earlier in the
    chain (9.2e18 + 0.002 - 9.2e18 = 0), and then a plan that breaks a constraint looks fine.
    Read-only: the same figures give the same array (a node search asks them once per rental)."""
    per_layer = np.ascontiguousarray(per_layer, dtype=float)
    if (per_layer.shape[0] + 1) ** 2 * per_layer.shape[1] > SPANS_CACHED:
        return _spans_of(per_layer)
    return _spans(per_layer.shape, per_layer.tobytes())


SPANS_CACHED = 250_000  # cells (2 MB) up to which spans are kept: 64 of them hold 128 MB at most


@functools.lru_cache(maxsize=64)
def _spans(shape: tuple[int, ...], data: bytes) -> np.ndarray:
    return _spans_of(np.frombuffer(data).reshape(shape))


def _spans_of(per_layer: np.ndarray) -> np.ndarray:
    n1 = per_layer.shape[0] + 1
    out = np.zeros((n1, n1, per_layer.shape[1]))
    with np.errstate(over="ignore"):  # inf where sizes overflow: ruled out below
        for j in range(n1 - 1):
            out[j + 1 :, j] = np.cumsum(per_layer[j:], axis=0)
    out.flags.writeable = False
    return out


def boundary_transfer(problem: Problem) -> np.ndarray:
    """``[i, j, t]``: section 1b's ``X_s`` of stage ``j..i-1`` on ``t`` at the view's degree (section 1h;
    0 without bandwidths)."""
    n1 = problem.n_layers + 1
    if not np.isfinite(problem.bandwidth).any():
        return np.zeros((n1, n1, problem.n_types))
    bytes_ = problem.boundary_bytes  # into the stage before layer j, out of it before layer i (a sum: symmetric)
    return (bytes_[:, None, None] + bytes_[None, :, None]) * problem.boundary_rate[None, None, :]


def tie_spans(problem: Problem) -> tuple[np.ndarray, np.ndarray]:
    """Section 1j, ``[i, j, 1]`` and ``[i, j, t]``: the training state stage ``j..i-1`` holds for copies of
    tied parameters, and the seconds per step it spends keeping the tensors it shares with other stages
    one (zeros without ties)."""
    n1, T = problem.n_layers + 1, problem.n_types
    if not problem.ties:
        return np.zeros((n1, n1, 1)), np.zeros((n1, n1, T))
    first, last = np.arange(n1)[None, :, None], np.arange(n1)[:, None, None] - 1
    return problem.tie_state(first, last), problem.tie_seconds(first, last, np.arange(T)[None, None, :])


def runnable_spans(problem: Problem) -> np.ndarray:
    """``[i, j, t]``: ``j < i``, and every layer of stage ``j..i-1`` can run on ``t``."""
    n1 = problem.n_layers + 1
    below = np.tril(np.ones((n1, n1), dtype=bool), k=-1)[:, :, None]  # j < i
    return below & (spans((~problem.runnable).astype(float)) == 0)


def stage_table(problem: Problem) -> Table:
    n, T = problem.n_layers, problem.n_types
    if too_large(problem):
        cells = (n + 1) ** 2 * T
        raise TooLarge(
            "exact scheduler",
            f"the exact solver would hold {cells:,} stage cells for {n:,} layers x {T} types (about "
            f"{cells * 90 / 1e9:.1f} GB), more than it may use ({MAX_GRID_CELLS:,}); use --scheduler greedy or rl, "
            "or profile the model at a coarser granularity (fewer, larger layers)",
        )
    ok = runnable_spans(problem)
    sc, pc, sd, pd = (spans(part) for part in problem.parts)
    ps = pc
    if np.isfinite(problem.bandwidth).any():
        pd = pd + boundary_transfer(problem)
    tied_state, tied_seconds = tie_spans(problem)
    sd = sd + tied_seconds
    min_k = np.ones((n + 1, n + 1, T))
    if np.isfinite(problem.memory).any():
        fixed, state_split = (spans(part[:, None]) for part in problem.state_parts)
        fixed = fixed + tied_state + spans(problem.cast_bytes[:, None])  # one batch's weight copies
        activations = activation_spans(problem)
        with np.errstate(over="ignore", invalid="ignore"):
            split = state_split + activations
        if problem.reserved is not None:
            fixed = fixed + problem.reserved_bytes[None, None, :]
        with np.errstate(invalid="ignore"):
            min_k = min_memory_replicas(fixed, split, problem.memory[None, None, :], activations, problem.batch_size)
    if (floor := share_floor_spans(problem)) is not None:  # section 1f: each replica's share was measured
        min_k = np.maximum(min_k, floor)
    return Table(sc, pc, sd, pd, ok, min_k, ps)


# The fewest replicas, by problem and then by a digest of the bytes they are computed from: every stage
# count's grid, and every rental of whole nodes (a problem of its own), asks the same few, and their
# whole-sample bisection was a sixth of the exact solver's time at 64 nodes (issue 64). Bounded in bytes:
# a grid of 256 layers and 4 types is 2 MB. By problem too, the stages' terms that no stage count changes.
_BY_PROBLEM: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _step_terms(problem: Problem, stages: int, again: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``[i, j, t]``: the serial and parallel parts of stage ``j..i-1``'s step on ``t`` in a plan of
    ``stages`` stages (``T_s(k) = serial + parallel / k``), and the per-sample part of ``parallel``;
    ``again``: the stage recomputes its activations (section 1g)."""
    return pipeline_step(problem.micro_batches, stages, *_micro_terms(problem, again))


def _micro_terms(problem: Problem, again: bool) -> tuple[np.ndarray, ...]:
    """``[i, j, t]`` each: a stage's serial and parallel time a micro-batch, its all-reduce between two
    replicas and its optimiser step, whatever the stage count (kept per problem: every grid asks)."""

    def make() -> tuple[np.ndarray, ...]:
        serial, parallel = problem.recompute_parts if again else problem.parts[:2]
        micro_parallel = spans(parallel) + boundary_transfer(problem)
        start, latency, message = problem.fixed_costs
        messages = problem.boundary_messages[:, None, None] + problem.boundary_messages[None, :, None]  # out i, in j
        sync, update = spans(problem.odt) + latency, spans(problem.update_times) + tie_spans(problem)[1]
        return spans(serial) + start + message * messages, micro_parallel, sync, update

    return _kept(problem, ("micro", again), make)


def _kept(problem: Problem, key, make):
    """``make()``, once per problem and ``key``: its arrays read-only, as every later grid reads them."""
    memo = _BY_PROBLEM.setdefault(problem, {})
    if key not in memo:
        found = make()
        for array in found if isinstance(found, tuple) else () if found is None else (found,):
            array.flags.writeable = False
        memo[key] = found
    return memo[key]


MOST_KEPT_BYTES = 256_000_000


class _Kept:
    """Arrays by key, the oldest dropped first past :data:`MOST_KEPT_BYTES`."""

    def __init__(self) -> None:
        self.arrays: dict[bytes, np.ndarray] = {}
        self.nbytes = 0

    def get(self, key: bytes) -> np.ndarray | None:
        return self.arrays.get(key)

    def keep(self, key: bytes, found: np.ndarray) -> None:
        while self.arrays and self.nbytes + found.nbytes > MOST_KEPT_BYTES:
            self.nbytes -= self.arrays.pop(next(iter(self.arrays))).nbytes
        self.arrays[key] = found
        self.nbytes += found.nbytes


_BY_DIGEST = _Kept()


def _memory_replicas(problem: Problem, held: np.ndarray, again: bool = False) -> np.ndarray:
    """``[i, j, p, t]``: the fewest replicas of stage ``j..i-1`` on ``t`` that hold ``held[p]``
    micro-batches of activations each within the type's memory (1 without a limit, inf: none); with
    ``again`` (section 1g), the inputs of ``held[p]`` micro-batches and one micro-batch's activations."""
    n1, T = problem.n_layers + 1, problem.n_types
    if not np.isfinite(problem.memory).any():
        return np.ones((n1, n1, len(held), T))
    memo = _BY_PROBLEM.setdefault(problem, {})
    missing = [h for h in dict.fromkeys(float(h) for h in held) if (again, h) not in memo]
    if missing:  # the terms that do not depend on the micro-batches held, once
        state_fixed, state_split = (spans(part[:, None]) for part in problem.state_parts)
        state_fixed = state_fixed + tie_spans(problem)[0]
        fixed = state_fixed + problem.reserved_bytes[None, None, :] if problem.reserved is not None else state_fixed
        terms = (fixed, state_split, activation_spans(problem), spans(problem.cast_bytes[:, None]))
        for h in missing:
            memo[again, h] = _fewest(problem, terms, h, again)
    return np.stack([memo[again, float(h)] for h in held], axis=2)


def _fewest(problem: Problem, terms: tuple, held: float, again: bool) -> np.ndarray:
    """``[i, j, t]``: :func:`_memory_replicas` at one count of micro-batches held (``terms``: the stages'
    fixed and split training state, their activations and their weight copies, ``[i, j, t]`` each)."""
    fixed, state_split, activations, casts = terms
    with np.errstate(over="ignore", invalid="ignore"):
        if again:  # by the stage's first layer j
            inputs = np.append(problem.stage_inputs, 0.0)[None, :, None]
            held_bytes = activations_held(held, activations, inputs)
        else:
            held_bytes = activations_held(held, activations)
        fixed = fixed + copies_held(held, casts, again)
        split = state_split + held_bytes
    fixed, split, held_bytes = np.broadcast_arrays(fixed, split, held_bytes)
    digest = hashlib.blake2b(str((problem.batch_size, fixed.shape)).encode())
    for part in (fixed, split, held_bytes, problem.memory):
        digest.update(np.ascontiguousarray(part, dtype=float).tobytes())
    key = digest.digest()
    if (found := _BY_DIGEST.get(key)) is None:
        with np.errstate(over="ignore", invalid="ignore"):
            found = min_memory_replicas(fixed, split, problem.memory[None, None, :], held_bytes, problem.batch_size)
        _BY_DIGEST.keep(key, found)
    return found


def _ok(problem: Problem, again: bool) -> np.ndarray:
    """``[i, j, t]``: stage ``j..i-1`` may run on ``t`` (section 1g: and recompute there); kept per problem."""

    def make() -> np.ndarray:
        return runnable_spans(problem.replace(runnable=problem.recomputable) if again else problem)

    return _kept(problem, ("ok", again), make)


def _labels(problem: Problem) -> np.ndarray:
    """The stage label of each type in each variant (:attr:`Problem.stage_ways`), variant-major."""
    T = problem.n_types
    return np.concatenate([stage_label(T, np.arange(T), again, j) for j, again in problem.stage_ways])


def _widths(problem: Problem) -> np.ndarray:
    """A replica's units of each type in each variant (:attr:`Problem.stage_ways`), variant-major
    (section 1h)."""
    return np.repeat(problem.widths[[j for j, _ in problem.stage_ways]], problem.n_types)


def _variant_terms(problem: Problem, stages: int, held: np.ndarray) -> list[tuple[np.ndarray, ...]]:
    """Per variant: the serial, parallel and per-sample step terms, where a stage may run, and the
    fewest replicas holding ``held[p]`` micro-batches (``[i, j, p, t]``), on the variant's degree."""
    out: list[tuple[np.ndarray, ...]] = []
    for j, again in problem.stage_ways:
        view = problem.views[j]
        fewest = _memory_replicas(view, held, again)
        floor = _kept(view, "floor", lambda view=view: share_floor_spans(view))
        if floor is not None:  # section 1f: each replica's share was measured
            fewest = np.maximum(fewest, floor[:, :, None, :])
        out.append(_step_terms(view, stages, again) + (_ok(view, again), fewest))
    return out


def stage_grid(problem: Problem, stages: int) -> tuple[Table, Chain]:
    """The stage table and chain for plans of at most ``stages`` stages: DP type ``((r - 1) V + v) T + t``
    is a stage on ``t`` with ``r`` stages from it to the last, run the ``v``-th way
    (:attr:`Problem.stage_ways`: a tensor-parallel degree, recomputing its activations or not)."""
    n1, T = problem.n_layers + 1, problem.n_types
    V = len(problem.stage_ways)
    places = np.arange(1, stages + 1)  # r
    held = np.minimum(places, problem.micro_batches)
    terms = _variant_terms(problem, stages, held)
    min_k = np.stack([t[4] for t in terms], axis=3)  # [i, j, r, v, t]
    sc, pc, ps, ok = (np.tile(np.concatenate(a, axis=2), (1, 1, stages)) for a in zip(*(t[:4] for t in terms)))
    zeros = np.zeros((n1, n1, T * V * stages))
    table = Table(sc, pc, zeros, zeros, ok, min_k.reshape(n1, n1, stages * V * T), ps)
    base = np.tile(np.arange(T), stages * V)
    place = np.repeat(places, V * T)
    follows = place[None, :] == place[:, None] - 1
    if problem.maximal_stages:  # the papers' space: never one type twice in a row
        follows &= base[:, None] != base[None, :]
    label, width = np.tile(_labels(problem), stages), np.tile(_widths(problem), stages)
    allowed = _shape_allows(problem, base, stages - place)
    starts = allowed if problem.fixed.stages is None else allowed & (place == stages)  # section 1k: exactly S
    return table, Chain(
        base, follows & allowed[:, None] & allowed[None, :], starts, allowed & (place == 1), label, width
    )


def _shape_allows(problem: Problem, base: np.ndarray, stage: np.ndarray) -> np.ndarray:
    """Section 1k: which DP types the shape's type of each stage allows (``stage``: its index from the
    first, where the plan has the grid's stage count)."""
    if problem.fixed.stage_types is None:
        return np.ones(len(base), dtype=bool)
    wanted = np.array(problem.fixed.stage_types)[np.minimum(stage, len(problem.fixed.stage_types) - 1)]
    return (wanted < 0) | (wanted == base)


def at_least_grid(problem: Problem, stages: int) -> tuple[Table, Chain]:
    """A relaxation of every plan of ``stages`` stages or more, on the resource types themselves (and
    each way a stage may run, sections 1g and 1h): each stage charged ``M + stages - 1`` slots and one
    micro-batch in flight. A plan of ``S >= stages`` stages needs no fewer replicas in its own grid
    than here (its slots and micro-batches in flight are no fewer), so what no plan reaches here, or a
    bound on cost here, holds for all of them."""
    n1, T = problem.n_layers + 1, problem.n_types
    V = len(problem.stage_ways)
    terms = [t[:4] + (t[4][:, :, 0, :],) for t in _variant_terms(problem, stages, np.ones(1))]
    sc, pc, ps, ok, min_k = (np.concatenate(a, axis=2) for a in zip(*terms))
    zeros = np.zeros((n1, n1, T * V))
    table = Table(sc, pc, zeros, zeros, ok, min_k, ps)
    plain = Chain.of_types(T, problem.maximal_stages)
    base = np.tile(np.arange(T), V)
    follows = np.tile(plain.follows, (V, V))
    every = np.ones(len(base), dtype=bool)
    return table, Chain(base, follows, every, every, _labels(problem), _widths(problem))
