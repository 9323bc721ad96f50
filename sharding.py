"""Sharding planner: which rank holds which embedding table, or which column slice of it.

Facts matched from distributed-embeddings (reference §2.14, anchors §1):
- a table with more elements than `column_slice_threshold` is cut into a power-of-two number of
  column slices, capped at the world size and the width;
- when there are fewer pieces than ranks, the largest tables are sliced further automatically;
- strategies: `basic` deals pieces round robin in table order, `memory_balanced` sorts pieces
  by size and deals them in snake order, `memory_optimized` gives the largest piece to the
  least-loaded rank;
- slices of one table that land on the same rank with adjacent columns are merged;
- tables with at most `data_parallel_threshold` elements are replicated on every rank.
The plan is a pure function of its arguments, so every rank computes the same one.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

STRATEGIES = ("basic", "memory_balanced", "memory_optimized")


class ShardingError(ValueError):
    """The tables cannot be spread over the ranks as asked."""


@dataclass(frozen=True)
class Piece:
    """Columns [col_start, col_end) of every row of table `table`, held by `rank`."""
    table: int
    col_start: int
    col_end: int
    rank: int
    rows: int

    @property
    def width(self) -> int:
        return self.col_end - self.col_start

    @property
    def elements(self) -> int:
        return self.rows * self.width


@dataclass
class ShardingPlan:
    world_size: int
    cardinalities: List[int]
    dim: int
    strategy: str
    replicated: List[int] = field(default_factory=list)
    pieces: List[Piece] = field(default_factory=list)

    def pieces_on(self, rank: int) -> List[Piece]:
        """This rank's model-parallel pieces, ordered by (table, first column)."""
        return sorted((p for p in self.pieces if p.rank == rank), key=lambda p: (p.table, p.col_start))

    def pieces_of(self, table: int) -> List[Piece]:
        return sorted((p for p in self.pieces if p.table == table), key=lambda p: p.col_start)

    def model_parallel_tables_on(self, rank: int) -> List[int]:
        return sorted({p.table for p in self.pieces if p.rank == rank})

    def input_tables(self, rank: int) -> List[int]:
        """Tables whose ids this rank reads with model-parallel input: its own and the replicated."""
        return sorted(set(self.model_parallel_tables_on(rank)) | set(self.replicated))

    def width_on(self, rank: int) -> int:
        return sum(p.width for p in self.pieces_on(rank))

    def bytes_per_rank(self, dtype_size: int) -> List[int]:
        replicated = sum(self.cardinalities[t] * self.dim for t in self.replicated)
        return [(replicated + sum(p.elements for p in self.pieces_on(r))) * dtype_size
                for r in range(self.world_size)]

    def describe(self, dtype_size: int = 4) -> str:
        """Human-readable plan: every rank's tables and slices, and its bytes."""
        lines = [f"sharding plan: strategy {self.strategy}, {self.world_size} rank(s), "
                 f"{len(self.cardinalities)} tables of dim {self.dim}"]
        if self.replicated:
            lines.append(f"  replicated on every rank: tables {self.replicated}")
        for rank, size in enumerate(self.bytes_per_rank(dtype_size)):
            pieces = ", ".join(f"table {p.table}" + ("" if p.width == self.dim else f"[cols {p.col_start}:{p.col_end}]")
                               + f" ({p.rows} rows)" for p in self.pieces_on(rank))
            lines.append(f"  rank {rank}: {size / 2**20:.1f} MiB: {pieces or 'no model-parallel pieces'}")
        return "\n".join(lines)


def _largest_power_of_two_at_most(value: int) -> int:
    power = 1
    while power * 2 <= value:
        power *= 2
    return power


def _slice_counts(cardinalities: Sequence[int], dim: int, tables: Sequence[int], world_size: int,
                  column_slice_threshold: Optional[int]) -> Dict[int, int]:
    cap = _largest_power_of_two_at_most(min(world_size, dim))
    counts = {}
    for t in tables:
        elements = cardinalities[t] * dim
        slices = 1
        if column_slice_threshold is not None:
            while slices < cap and elements / slices > column_slice_threshold:
                slices *= 2
        counts[t] = slices
    while sum(counts.values()) < world_size:
        growable = [t for t in tables if counts[t] * 2 <= cap]
        if not growable:
            raise ShardingError(
                f"{world_size} ranks but the {len(tables)} model-parallel table(s) can be cut into at most "
                f"{sum(counts.values())} slices (a table splits into at most min(ranks, dim={dim}) "
                f"power-of-two column slices); use fewer ranks or lower --data_parallel_threshold")
        largest = max(growable, key=lambda t: (cardinalities[t] * dim / counts[t], -t))
        counts[largest] *= 2
    return counts


def _assign(sizes: Sequence[int], world_size: int, strategy: str) -> List[int]:
    """Rank of every piece (given in table order) under the strategy."""
    ranks = [0] * len(sizes)
    if strategy == "basic":
        return [i % world_size for i in range(len(sizes))]
    order = sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))
    if strategy == "memory_balanced":
        for position, i in enumerate(order):
            lap, offset = divmod(position, world_size)
            ranks[i] = offset if lap % 2 == 0 else world_size - 1 - offset
        return ranks
    load = [0] * world_size
    for i in order:
        target = min(range(world_size), key=lambda r: (load[r], r))
        ranks[i] = target
        load[target] += sizes[i]
    return ranks


def _merge(pieces: List[Piece]) -> List[Piece]:
    merged: List[Piece] = []
    for piece in sorted(pieces, key=lambda p: (p.table, p.rank, p.col_start)):
        last = merged[-1] if merged else None
        if last and last.table == piece.table and last.rank == piece.rank and last.col_end == piece.col_start:
            merged[-1] = Piece(last.table, last.col_start, piece.col_end, last.rank, last.rows)
        else:
            merged.append(piece)
    return merged


def plan_sharding(cardinalities: Sequence[int], dim: int, world_size: int, strategy: str = "memory_balanced",
                  column_slice_threshold: Optional[int] = None,
                  data_parallel_threshold: Optional[int] = None) -> ShardingPlan:
    """Place every table (or column slice) on a rank; see the module docstring for the rules."""
    if strategy not in STRATEGIES:
        raise ShardingError(f"--dist_strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    if world_size < 1:
        raise ShardingError(f"world size must be positive, got {world_size}")
    cardinalities = [int(c) for c in cardinalities]
    replicated = []
    if world_size > 1 and data_parallel_threshold is not None:
        replicated = [t for t, rows in enumerate(cardinalities) if rows * dim <= data_parallel_threshold]
    model_parallel = [t for t in range(len(cardinalities)) if t not in replicated]
    if not model_parallel and world_size > 1:
        raise ShardingError(f"every table is replicated (--data_parallel_threshold {data_parallel_threshold}); "
                            f"no table is left to place on the {world_size} ranks")
    counts = _slice_counts(cardinalities, dim, model_parallel, world_size, column_slice_threshold)
    unplaced = []
    for t in model_parallel:
        bounds = [i * dim // counts[t] for i in range(counts[t] + 1)]
        unplaced.extend((t, bounds[i], bounds[i + 1]) for i in range(counts[t]))
    ranks = _assign([cardinalities[t] * (end - start) for t, start, end in unplaced], world_size, strategy)
    pieces = [Piece(t, start, end, rank, cardinalities[t]) for (t, start, end), rank in zip(unplaced, ranks)]
    return ShardingPlan(world_size=world_size, cardinalities=cardinalities, dim=dim, strategy=strategy,
                        replicated=replicated, pieces=_merge(pieces))
