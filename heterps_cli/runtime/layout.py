"""Who runs what, and which samples go where: a plan laid out on processes (pure, no torch).

Ranks are assigned stage by stage (stage 0's replicas first), as ``torchrun``
launches them. A step trains on ``micro_batches`` batches of the plan's
``batch_size`` samples each (micro-batches, so that the stages work on different
batches at once and each runs at the batch size its profile was measured at);
each micro-batch is cut into ``k`` contiguous shards, one per replica of a
stage. Replica counts differ between stages, so shard boundaries do too: a
replica sends each neighbour-stage replica the part of its shard that overlaps
the neighbour's (:func:`overlaps`).
"""

from __future__ import annotations

from dataclasses import dataclass


def split(start: int, stop: int, parts: int) -> list[tuple[int, int]]:
    """``[start, stop)`` cut into ``parts`` contiguous intervals whose sizes differ by at most one
    (the first ones get the extra samples), as ``torch.tensor_split`` cuts."""
    size, extra = divmod(stop - start, parts)
    bounds = [start]
    for i in range(parts):
        bounds.append(bounds[-1] + size + (1 if i < extra else 0))
    return list(zip(bounds[:-1], bounds[1:]))


@dataclass(frozen=True)
class StageLayout:
    index: int
    resource: str
    replicas: int
    layers: tuple[str, ...]
    first_rank: int
    tp: int = 1  # docs/spec.md section 1h: processes per replica, which shard its layers
    # section 1i, a stage of several types: each replica's type, its samples of every micro-batch, its degree
    kinds: tuple[str, ...] = ()
    shares: tuple[int, ...] = ()
    widths: tuple[int, ...] = ()

    def kind(self, replica: int) -> str:
        """The type replica ``replica`` runs on."""
        return self.kinds[replica] if self.kinds else self.resource

    def width(self, replica: int) -> int:
        """The processes of replica ``replica`` (its tensor-parallel degree)."""
        return self.widths[replica] if self.widths else self.tp

    @property
    def processes(self) -> int:
        return sum(self.widths) if self.widths else self.replicas * self.tp

    @property
    def blocks(self) -> int:
        """Into how many blocks each sharded weight's gradient is summed: its largest degree (a replica at
        ``d`` holds ``blocks / d`` of them on each process; the degrees divide each other, section 1h)."""
        return max(self.widths) if self.widths else self.tp

    @property
    def uneven(self) -> bool:
        """Whether its replicas run at different degrees (section 1i)."""
        return len(set(self.widths)) > 1

    @property
    def degrees(self) -> tuple[int, ...]:
        """Its replicas' degrees, each once, in replica order."""
        return tuple(dict.fromkeys(self.widths)) if self.widths else (self.tp,)

    def first_at(self, width: int) -> int:
        """The first replica at degree ``width``."""
        return self.widths.index(width) if self.widths else 0

    def first_of(self, replica: int) -> int:
        """The rank of replica ``replica``'s first process."""
        return self.first_rank + (sum(self.widths[:replica]) if self.widths else replica * self.tp)

    def members(self, replica: int) -> list[int]:
        """The ranks of one replica: its processes (one without tensor parallelism)."""
        first = self.first_of(replica)
        return list(range(first, first + self.width(replica)))

    def held_blocks(self, replica: int, tp_rank: int) -> range:
        """The blocks (:attr:`blocks`) process ``tp_rank`` of ``replica`` holds."""
        each = self.blocks // self.width(replica)
        return range(tp_rank * each, (tp_rank + 1) * each)

    def data_parallel(self, block: int) -> list[int]:
        """The ranks that hold block ``block`` of the sharded weights, one in every replica: they sum its
        gradients (at one degree, the same shard of every replica)."""
        return [self.first_of(r) + block // (self.blocks // self.width(r)) for r in range(self.replicas)]


@dataclass(frozen=True)
class Layout:
    stages: tuple[StageLayout, ...]
    batch_size: int
    micro_batches: int

    @property
    def world_size(self) -> int:
        return sum(s.processes for s in self.stages)

    def place(self, rank: int) -> tuple[StageLayout, int]:
        """The stage ``rank`` runs and its replica index within it."""
        for stage in self.stages:
            if rank < stage.first_rank + stage.processes:
                return stage, next(r for r in range(stage.replicas) if rank < stage.first_of(r) + stage.width(r))
        raise ValueError(f"rank {rank} is outside a world of {self.world_size}")

    def tp_rank(self, rank: int) -> int:
        """The shard ``rank`` holds within its replica (0 without tensor parallelism)."""
        stage, replica = self.place(rank)
        return rank - stage.first_of(replica)

    @property
    def samples(self) -> int:
        """Samples per step."""
        return self.batch_size * self.micro_batches

    def micro(self, j: int) -> tuple[int, int]:
        return j * self.batch_size, (j + 1) * self.batch_size

    def shard(self, stage: StageLayout, replica: int, j: int) -> tuple[int, int]:
        """The samples of micro-batch ``j`` that ``replica`` of ``stage`` runs (batch indices): an even
        split, or each replica's planned share (section 1i)."""
        start, stop = self.micro(j)
        if not stage.shares:
            return split(start, stop, stage.replicas)[replica]
        first = start + sum(stage.shares[:replica])
        return first, first + stage.shares[replica]

    def overlapping(self, stage: StageLayout, replica: int, other: StageLayout, j: int) -> list[tuple[int, int, int]]:
        """``(r, start, stop)`` for each replica ``r`` of ``other`` whose shard of micro-batch ``j`` overlaps
        this replica's, in order; ``start, stop`` are batch indices. Its first process (its tp rank 0) is at
        ``other.first_of(r)``."""
        a, b = self.shard(stage, replica, j)
        out = []
        for r in range(other.replicas):
            c, d = self.shard(other, r, j)
            lo, hi = max(a, c), min(b, d)
            if lo < hi:
                out.append((r, lo, hi))
        return out


def layout(
    stages: list[tuple[str, int, list[str]]],
    batch_size: int,
    micro_batches: int,
    tp: tuple[int, ...] = (),
    parts: tuple[tuple[tuple[str, int, int, int], ...], ...] = (),
) -> Layout:
    """The layout of stages given as ``(resource, replicas, layer names)``, each replica ``tp[s]``
    processes (1 where not given); every stage must have at most ``batch_size`` replicas, so that
    each gets a sample of every micro-batch. ``parts[s]`` (section 1i): a mixed stage's ``(type,
    replicas, samples, degree)``, its own first; its replicas are every part's, each with its share
    and its degree's processes."""
    out, rank = [], 0
    for i, (resource, replicas, layers) in enumerate(stages):
        width = tp[i] if i < len(tp) else 1
        mixed = parts[i] if i < len(parts) else ()
        kinds = tuple(t for t, k, _, _ in mixed for _ in range(k))
        shares = tuple(b - a for _, k, n, _ in mixed for a, b in split(0, n, k))
        widths = tuple(d for _, k, _, d in mixed for _ in range(k))
        if mixed and sum(shares) != batch_size:
            raise ValueError(f"stage {i}'s parts train {sum(shares)} samples, not the batch of {batch_size}")
        stage = StageLayout(i, resource, len(kinds) or replicas, tuple(layers), rank, width, kinds, shares, widths)
        out.append(stage)
        rank += stage.processes
    if max(s.replicas for s in out) > batch_size or micro_batches < 1:
        raise ValueError("a stage has more replicas than a batch has samples, or no micro-batches")
    return Layout(tuple(out), batch_size, micro_batches)
