"""Sharding planner: which rank holds which embedding table, or which column slice of it.

Facts matched from distributed-embeddings (reference §2.14, anchors §1):
- a table with more elements than `column_slice_threshold` is cut into a power-of-two number of
  column slices, capped at the world size and the width;
- when there are fewer pieces than ranks, the largest tables are sliced further automatically;
- strategies: `basic` deals pieces round robin in table order, `memory_balanced` sorts pieces
  by size and deals them in snake order, `memory_optimized` gives the largest piece to the
  least-loaded rank;
- slices of one table that land on the same rank with adjacent columns are merged;
- tables with at most `data_parallel_threshold` elements are replicated on every rank; of the
  others, those with at least `row_slice_threshold` elements are row-sliced: cut into one
  contiguous block of rows per rank (rank r holds rows // W rows, one more when r < rows % W),
  and only with several ranks.
The plan also carries each table's hotness (ids per sample, the most for ragged features) and
pooling ('sum' or 'mean') from the FeatureSpec: the embedding layers pool by it, and the memory
plan and the exchange's byte count use the hotness (a multi-hot table's sparse update holds up to
batch x hotness gradient rows; data-parallel input exchanges batch x hotness ids).
The plan also decides the memory tier of everything a rank holds (`MemoryBudget`): the smallest
pieces fill the rank's device budget, counting their optimizer slots and the update's transient;
the rest live in host memory. The plan is a pure function of its arguments, so every rank computes
the same one.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, FrozenSet, List, Optional, Sequence, Tuple

from recsys.data.batch import TableReads
from recsys.data.feature_spec import POOLINGS

STRATEGIES = ("basic", "memory_balanced", "memory_optimized")
HOST_VALUE_BYTES = 4  # tables offloaded to host memory are kept in float32
MIN_DEVICE_RESERVE_BYTES = 4 << 30


def table_budget_from_device(total_device_bytes: int) -> int:
    """The share of a device's memory for embedding state when the user sets no limit: all of it
    but a reserve for the MLPs, activations and the communication buffers (10%, at least 4 GiB),
    so an 80 GB GPU keeps about 72 GiB of tables, as the reference's 70-75 GiB thresholds did."""
    return max(0, total_device_bytes - max(MIN_DEVICE_RESERVE_BYTES, total_device_bytes // 10))


@dataclass(frozen=True)
class MemoryBudget:
    """How much embedding state a rank's device may hold, and what a table costs there.

    A table of `rows` x `width` costs its values, its optimizer slots (Adam: m and v, so 3x the
    table in all) and the transient of one sparse update: the gradient rows, their merged copy and
    one gathered row block per slot, for at most `update_rows` x hotness rows (the global batch's ids).
    `device_bytes` None means no limit (everything on the device); 0 puts everything in host memory.
    """
    device_bytes: Optional[int]
    value_bytes: int = 4
    optimizer_slots: int = 0
    update_rows: int = 0

    def state_bytes(self, rows: int, width: int, value_bytes: Optional[int] = None) -> int:
        """The table and its slots, resident for the whole run."""
        return rows * width * (value_bytes or self.value_bytes) * (1 + self.optimizer_slots)

    def footprint(self, rows: int, width: int, hotness: int = 1) -> int:
        """Device bytes the table needs: its state plus the transient of one update."""
        transient = min(rows, self.update_rows * hotness) * width * 4 * (2 + self.optimizer_slots)
        return self.state_bytes(rows, width) + transient


class ShardingError(ValueError):
    """The tables cannot be spread over the ranks as asked."""


def check_table_widths(dims: Sequence[int], num_tables: int) -> None:
    """Refuse widths that are not one positive integer per table (--embedding_dim's rules that the
    planner relies on; model_config.table_widths applies them, with the model's, before any plan)."""
    if len(dims) != num_tables:
        raise ShardingError(f"--embedding_dim lists {len(dims)} widths for {num_tables} tables")
    if any(d < 1 for d in dims):
        raise ShardingError(f"--embedding_dim must be >= 1, got {describe_dims(dims)}")


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
    dims: List[int]  # the width of every table
    strategy: str
    replicated: List[int] = field(default_factory=list)
    row_sliced: List[int] = field(default_factory=list)
    pieces: List[Piece] = field(default_factory=list)
    budget: MemoryBudget = MemoryBudget(device_bytes=None)
    host_items: FrozenSet[Tuple[int, int, int]] = frozenset()  # (rank, table, first column) in host memory
    hotness: List[int] = field(default_factory=list)  # ids per sample of every table (1: one-hot)
    poolings: List[str] = field(default_factory=list)  # 'sum' or 'mean' for every table

    def item_footprint(self, item: Piece) -> int:
        """Device bytes of a piece, row block or replicated table (`MemoryBudget.footprint`)."""
        return self.budget.footprint(item.rows, item.width, self.hotness[item.table])

    def pieces_on(self, rank: int) -> List[Piece]:
        """This rank's model-parallel pieces, ordered by (table, first column)."""
        return sorted((p for p in self.pieces if p.rank == rank), key=lambda p: (p.table, p.col_start))

    def pieces_of(self, table: int) -> List[Piece]:
        return sorted((p for p in self.pieces if p.table == table), key=lambda p: p.col_start)

    def model_parallel_tables_on(self, rank: int) -> List[int]:
        return sorted({p.table for p in self.pieces if p.rank == rank})

    def row_starts(self, table: int) -> List[int]:
        """[world_size + 1] first rows of every rank's block of a row-sliced table (the last: its end)."""
        return row_block_starts(self.cardinalities[table], self.world_size)

    def row_blocks_on(self, rank: int) -> List[Piece]:
        """This rank's block of every row-sliced table (full width, `rows` of the block), by table."""
        blocks = []
        for table in self.row_sliced:
            starts = self.row_starts(table)
            blocks.append(Piece(table, 0, self.dims[table], rank, starts[rank + 1] - starts[rank]))
        return blocks

    def reads(self, rank: int, data_parallel_input: bool = False) -> TableReads:
        """The one decision of which ids `rank` reads, handed to its loader and its embedding layer.

        Model-parallel input (several ranks, the default): the global batch of the tables it holds
        a piece of, of the replicated ones and of the row-sliced ones (of which the layer keeps
        the local rows). Data-parallel input, or a single process: the local rows of every table.
        """
        if data_parallel_input or self.world_size == 1:
            return TableReads.every_table(len(self.cardinalities))
        read = set(self.model_parallel_tables_on(rank)) | set(self.replicated) | set(self.row_sliced)
        return TableReads(tuple(sorted(read)), global_batch=True)

    def width_on(self, rank: int) -> int:
        return sum(p.width for p in self.pieces_on(rank))

    def items_on(self, rank: int) -> List[Piece]:
        """Everything `rank` holds: its model-parallel pieces, its blocks of the row-sliced tables,
        then the replicated tables whole."""
        return (self.pieces_on(rank) + self.row_blocks_on(rank)
                + [Piece(t, 0, self.dims[t], rank, self.cardinalities[t]) for t in self.replicated])

    def on_host(self, rank: int, table: int, col_start: int = 0) -> bool:
        """Whether the piece of `table` starting at `col_start` on `rank` lives in host memory."""
        return (rank, table, col_start) in self.host_items

    def host_tables(self, rank: int) -> List[int]:
        """Tables of which `rank` keeps a piece in host memory."""
        return sorted({table for r, table, _ in self.host_items if r == rank})

    def memory_per_rank(self) -> List[Tuple[int, int]]:
        """(device bytes, host bytes) of every rank: tables, optimizer slots and device-side update
        transients."""
        usage = []
        for rank in range(self.world_size):
            device = host = 0
            for item in self.items_on(rank):
                if self.on_host(rank, item.table, item.col_start):
                    host += self.budget.state_bytes(item.rows, item.width, HOST_VALUE_BYTES)
                else:
                    device += self.item_footprint(item)
            usage.append((device, host))
        return usage

    def describe(self) -> str:
        """Human-readable plan: every rank's tables and slices, their memory tier, and its bytes."""
        budget = ("no device limit" if self.budget.device_bytes is None
                  else f"device budget {self.budget.device_bytes / 2**30:.2f} GiB per rank")
        lines = [f"sharding plan: strategy {self.strategy}, {self.world_size} rank(s), "
                 f"{len(self.cardinalities)} tables of dim {describe_dims(self.dims)}, {budget}, "
                 f"{self.budget.optimizer_slots} optimizer slot(s) per table"]
        if self.replicated:
            lines.append(f"  replicated on every rank: tables {self.replicated}")
        if self.row_sliced:
            lines.append(f"  row-sliced over every rank: tables {self.row_sliced}")
        multi_hot = [t for t, hotness in enumerate(self.hotness) if hotness > 1]
        if multi_hot:
            lines.append("  multi-hot: " + ", ".join(f"table {t} ({self.hotness[t]} ids, {self.poolings[t]})"
                                                     for t in multi_hot))
        for rank, (device, host) in enumerate(self.memory_per_rank()):
            items = ", ".join(
                f"table {p.table}{self._part(p)}"
                + f" ({p.rows} rows{', host' if self.on_host(rank, p.table, p.col_start) else ''})"
                for p in self.items_on(rank))
            lines.append(f"  rank {rank}: device {device / 2**20:.1f} MiB, host {host / 2**20:.1f} MiB: "
                         f"{items or 'no tables'}")
        return "\n".join(lines)

    def _part(self, item: Piece) -> str:
        """Which part of its table an item is, as `describe` prints it ('' for the whole table)."""
        if item.table in self.row_sliced:
            starts = self.row_starts(item.table)
            return f"[rows {starts[item.rank]}:{starts[item.rank + 1]}]"
        return "" if item.width == self.dims[item.table] else f"[cols {item.col_start}:{item.col_end}]"


def row_block_starts(rows: int, world_size: int) -> List[int]:
    """First row of every rank's block of a table of `rows` rows cut by rows over `world_size`
    ranks (distributed-embeddings' split: `rows // W` each, one more for the first `rows % W`
    ranks), and the end of the table."""
    per_rank, remainder = divmod(rows, world_size)
    return [rank * per_rank + min(rank, remainder) for rank in range(world_size + 1)]


def _largest_power_of_two_at_most(value: int) -> int:
    power = 1
    while power * 2 <= value:
        power *= 2
    return power


def describe_dims(dims: Sequence[int]) -> str:
    """The widths as a user writes them: one number when all are equal, else a comma list."""
    return str(dims[0]) if len(set(dims)) == 1 else ",".join(map(str, dims))


def _slice_counts(cardinalities: Sequence[int], dims: Sequence[int], tables: Sequence[int], world_size: int,
                  column_slice_threshold: Optional[int]) -> Dict[int, int]:
    caps = {t: _largest_power_of_two_at_most(min(world_size, dims[t])) for t in tables}
    counts = {}
    for t in tables:
        elements = cardinalities[t] * dims[t]
        slices = 1
        if column_slice_threshold is not None:
            while slices < caps[t] and elements / slices > column_slice_threshold:
                slices *= 2
        counts[t] = slices
    while sum(counts.values()) < world_size:
        growable = [t for t in tables if counts[t] * 2 <= caps[t]]
        if not growable:
            raise ShardingError(
                f"{world_size} ranks but the {len(tables)} model-parallel table(s) can be cut into at most "
                f"{sum(counts.values())} slices (a table splits into at most min(ranks, its dim) "
                f"power-of-two column slices); use fewer ranks or lower --data_parallel_threshold")
        largest = max(growable, key=lambda t: (cardinalities[t] * dims[t] / counts[t], -t))
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


def _host_items(plan: ShardingPlan) -> FrozenSet[Tuple[int, int, int]]:
    """Per rank, the smallest items fill the device budget; from the first that does not fit on,
    that item and every larger one go to host memory."""
    if plan.budget.device_bytes is None:
        return frozenset()
    host = set()
    for rank in range(plan.world_size):
        items = sorted(plan.items_on(rank), key=lambda p: (plan.item_footprint(p), p.table))
        used = 0
        for position, item in enumerate(items):
            used += plan.item_footprint(item)
            if used > plan.budget.device_bytes:
                host.update((rank, p.table, p.col_start) for p in items[position:])
                break
    return frozenset(host)


def plan_sharding(cardinalities: Sequence[int], dims: Sequence[int], world_size: int,
                  strategy: str = "memory_balanced",
                  column_slice_threshold: Optional[int] = None,
                  data_parallel_threshold: Optional[int] = None,
                  budget: Optional[MemoryBudget] = None,
                  row_slice_threshold: Optional[int] = None,
                  hotness: Optional[Sequence[int]] = None,
                  poolings: Optional[Sequence[str]] = None) -> ShardingPlan:
    """Place every table (or column slice, or row block) on a rank and in a memory tier; see the
    module docstring. `dims` holds one width per table (model_config.table_widths resolves them);
    `hotness` and `poolings` (FeatureSpec `hotness`, `poolings`) default to one-hot sum pooling."""
    if strategy not in STRATEGIES:
        raise ShardingError(f"--dist_strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    if world_size < 1:
        raise ShardingError(f"world size must be positive, got {world_size}")
    if row_slice_threshold is not None and row_slice_threshold < 1:
        raise ShardingError(f"--row_slice_threshold must be >= 1 (elements), got {row_slice_threshold}")
    cardinalities = [int(c) for c in cardinalities]
    check_table_widths(dims, len(cardinalities))
    dims = [int(d) for d in dims]
    hotness = [int(h) for h in hotness] if hotness is not None else [1] * len(cardinalities)
    poolings = list(poolings) if poolings is not None else [POOLINGS[0]] * len(cardinalities)
    if len(hotness) != len(cardinalities) or min(hotness, default=1) < 1:
        raise ShardingError(f"need one hotness >= 1 per table ({len(cardinalities)}), got {hotness}")
    if len(poolings) != len(cardinalities) or any(p not in POOLINGS for p in poolings):
        raise ShardingError(f"need one pooling of {POOLINGS} per table ({len(cardinalities)}), got {poolings}")
    replicated = []
    if world_size > 1 and data_parallel_threshold is not None:
        replicated = [t for t, rows in enumerate(cardinalities) if rows * dims[t] <= data_parallel_threshold]
    row_sliced = []
    if world_size > 1 and row_slice_threshold is not None:
        row_sliced = [t for t, rows in enumerate(cardinalities)
                      if t not in replicated and rows * dims[t] >= row_slice_threshold]
    model_parallel = [t for t in range(len(cardinalities)) if t not in replicated and t not in row_sliced]
    if not model_parallel and not row_sliced and world_size > 1:
        raise ShardingError(f"every table is replicated (--data_parallel_threshold {data_parallel_threshold}); "
                            f"no table is left to place on the {world_size} ranks")
    counts = (_slice_counts(cardinalities, dims, model_parallel, world_size, column_slice_threshold)
              if model_parallel else {})
    unplaced = []
    for t in model_parallel:
        bounds = [i * dims[t] // counts[t] for i in range(counts[t] + 1)]
        unplaced.extend((t, bounds[i], bounds[i + 1]) for i in range(counts[t]))
    ranks = _assign([cardinalities[t] * (end - start) for t, start, end in unplaced], world_size, strategy)
    pieces = [Piece(t, start, end, rank, cardinalities[t]) for (t, start, end), rank in zip(unplaced, ranks)]
    plan = ShardingPlan(world_size=world_size, cardinalities=cardinalities, dims=dims, strategy=strategy,
                        replicated=replicated, row_sliced=row_sliced, pieces=_merge(pieces),
                        budget=budget or MemoryBudget(None), hotness=hotness, poolings=poolings)
    plan.host_items = _host_items(plan)
    return plan
