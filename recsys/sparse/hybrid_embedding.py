"""Hybrid-parallel embeddings on Horovod: model-parallel tables, data-parallel everything else.

The role of NVIDIA's distributed-embeddings `DistributedEmbedding` (not installable), built on
`distributed.alltoall`. A `ShardingPlan` gives every rank some tables or column slices; small
tables may be replicated. Forward:
  1. with data-parallel input, one all-to-all of ids sends each rank the global batch of the
     tables it holds (with model-parallel input the loader already read exactly that);
  2. local lookups on the rank's pieces, for the global batch;
  3. one all-to-all of the outputs, cast to the compute dtype first: rank d receives the rows of
     its local batch from every holder, piece after piece (the rows of a local batch are
     contiguous in every lookup, so the send buffer is whole row ranges, the receiver's pieces are
     row ranges of what arrives, and the bytes sent are the minimum: local batch x width);
  4. reassembly in feature order, column slices concatenated, replicated tables looked up locally;
     the tables' vectors side by side, `[local_batch, sum of widths]` (tables may differ in width).
Multi-hot features (`[B, h]` or ragged ids, batch.py) are pooled where their rows are: a
model-parallel piece pools the global batch's ids of its table (sum, or mean by the row length;
column slices each pool their columns), so the output all-to-all moves one pooled vector per
sample and table, the one-hot minimum, whatever the hotness. With data-parallel input the ids go
to the owner first (`[B, h]` flattened; ragged as row lengths, then the values).
Row-sliced tables (every rank holds a block of rows) take the ids of the local batch and route
them (`routed_lookup`): one all-to-all sends each id to the rank owning its row, the owner sums
the rows of each sample's ids it owns, and a second all-to-all returns one partial sum per sample
and owner, which the requester adds up (mean: divided by the sample's number of ids). Per id not
owned locally 4 bytes go out; per sample and remote owner one vector comes back (one-hot: per id).
The backward pass is the reverse exchange (Horovod's alltoall gradient). The layer also routes
its own gradients (`reduce_gradients`): those of model-parallel pieces and row blocks stay local
and sparse, scaled by 1/world_size because every rank's local-mean loss reaches them through the
exchange; those of replicated tables are averaged over the ranks like dense weights.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from recsys.runtime import distributed as dist
from recsys.data.batch import TableReads, rank_start
from recsys.sparse.tables import Ids, TableSlice, TableView, VariableSelector, Vectors, as_int32, assign_rows, batch_size_of, blocks_or_joined, divide_by_lengths, fill_uniform, is_one_hot, join_blocks, micro_batch_rows, pooled_lookup, read_variable_rows, row_lengths, tier_device
from recsys.sparse.sharding import Piece, ShardingPlan


def local_batch_bounds(global_batch: tf.Tensor, world_size: int) -> tf.Tensor:
    """[world_size + 1] row bounds of the ranks' local batches (`batch.rank_start`), in the graph."""
    return rank_start(tf.range(world_size + 1, dtype=tf.int32), tf.cast(global_batch, tf.int32), world_size)


class ShardedTableView(TableView):
    """A table whose column slices live on several ranks; reads gather, writes cut."""

    def __init__(self, plan: ShardingPlan, table: int, local: Sequence[Tuple[Piece, tf.Variable]]) -> None:
        self.plan = plan
        self.table = table
        self.rows = plan.cardinalities[table]
        self.dim = plan.dims[table]
        self.local = list(local)
        self.numpy_dtype = np.dtype(self.local[0][1].dtype.as_numpy_dtype) if self.local else np.dtype(np.float32)

    def read_rows(self, start: int, end: int) -> np.ndarray:
        """Collective: every rank contributes its columns and receives the full rows."""
        own = [read_variable_rows(variable, start, end).reshape(-1) for _, variable in self.local]
        flat = np.concatenate(own) if own else np.zeros([0], self.numpy_dtype)
        gathered = dist.allgather(tf.constant(flat)).numpy()
        rows = end - start
        full = np.empty((rows, self.dim), gathered.dtype)
        offset = 0
        for rank in range(self.plan.world_size):
            for piece in self.plan.pieces_on(rank):
                if piece.table == self.table:
                    size = rows * piece.width
                    full[:, piece.col_start:piece.col_end] = gathered[offset:offset + size].reshape(rows, piece.width)
                    offset += size
        return full

    def write_rows(self, start: int, end: int, values: np.ndarray) -> None:
        for piece, variable in self.local:
            assign_rows(variable, start, np.ascontiguousarray(values[:, piece.col_start:piece.col_end])
                        .astype(self.numpy_dtype, copy=False))


class RowSlicedTableView(TableView):
    """A table cut by rows over the ranks; reads gather the blocks in rank order, writes keep the own rows."""

    def __init__(self, plan: ShardingPlan, table: int, rank: int, block: tf.Variable) -> None:
        self.rows = plan.cardinalities[table]
        self.dim = plan.dims[table]
        self.starts = plan.row_starts(table)
        self.rank = rank
        self.block = block
        self.numpy_dtype = np.dtype(block.dtype.as_numpy_dtype)

    def _own(self, start: int, end: int) -> Tuple[int, int]:
        """The rows of [start, end) this rank holds (an empty range when none)."""
        low, high = max(start, self.starts[self.rank]), min(end, self.starts[self.rank + 1])
        return low, max(low, high)

    def read_rows(self, start: int, end: int) -> np.ndarray:
        """Collective: every rank contributes its rows of [start, end); the blocks are contiguous
        and in rank order, so the gathered rows are in table order."""
        low, high = self._own(start, end)
        first = self.starts[self.rank]
        own = read_variable_rows(self.block, low - first, high - first).reshape(-1)
        return dist.allgather(tf.constant(own)).numpy().reshape(end - start, self.dim)

    def write_rows(self, start: int, end: int, values: np.ndarray) -> None:
        low, high = self._own(start, end)
        if high > low:
            assign_rows(self.block, low - self.starts[self.rank],
                        np.ascontiguousarray(values[low - start:high - start]).astype(self.numpy_dtype, copy=False))


def _flat_ids(ids: Ids) -> Tuple[tf.Tensor, tf.Tensor]:
    """Every id of a `[B]`, `[B, h]` or ragged id tensor, flat, and the sample (row) each belongs to."""
    if isinstance(ids, tf.RaggedTensor):
        return ids.values, tf.cast(ids.value_rowids(), tf.int32)
    samples = tf.range(batch_size_of(ids))
    if ids.shape.rank == 1:
        return ids, samples
    width = tf.shape(ids, out_type=tf.int32)[1]
    return tf.reshape(ids, [-1]), tf.repeat(samples, width)


def routed_lookup(block: tf.Variable, ids: Ids, starts: Sequence[int], rank: int, world_size: int,
                  pooling: str, output_dtype: tf.DType, name: str) -> tf.Tensor:
    """Pooled vectors `[B, width]` in `output_dtype` of `ids` (`[B]`, `[B, h]` or ragged, global
    row numbers) of a table of which rank r holds the block [starts[r], starts[r+1]) (`block` is
    this rank's).

    The ids are sorted by (owner, sample), sent to their owners by one all-to-all; each owner sums
    the rows of each (sample, owner) group it received and returns one partial sum per group by a
    second all-to-all; the requester adds a sample's partial sums (and divides by the sample's
    number of ids for mean pooling). A group's first id is sent negated (-id - 1), which marks the
    groups without sending anything more. So per sample and remote owner of any of its ids one
    vector comes back, never one per id; one-hot ids are each their own group and skip the sums.
    A collective: every rank calls it for the same tables in the same order.
    """
    flat, samples = _flat_ids(as_int32(ids))
    batch = batch_size_of(ids)
    one_hot = is_one_hot(ids)
    owners = tf.searchsorted(tf.constant(starts[1:-1], tf.int32), flat, side="right", out_type=tf.int32)
    order = tf.argsort(owners if one_hot else owners * batch + samples, stable=True)
    sent = tf.gather(flat, order)
    if not one_hot:
        sorted_keys = tf.gather(owners * batch + samples, order)
        opens = tf.concat([tf.ones([1], tf.bool)[:tf.size(sorted_keys)],
                           sorted_keys[1:] != sorted_keys[:-1]], axis=0)
        sent = tf.where(opens, -sent - 1, sent)
    counts = tf.math.bincount(owners, minlength=world_size, maxlength=world_size, dtype=tf.int32)
    asked, asked_counts = dist.alltoall(sent, splits=counts, name=f"{name}_ids")
    if one_hot:
        partial, partial_counts = tf.gather(block, asked - starts[rank]), asked_counts
    else:
        asked_opens = asked < 0
        rows = tf.where(asked_opens, -asked - 1, asked) - starts[rank]
        groups = tf.cumsum(tf.cast(asked_opens, tf.int32)) - 1
        partial = tf.math.unsorted_segment_sum(tf.gather(block, rows), groups,
                                               tf.reduce_sum(tf.cast(asked_opens, tf.int32)))
        sources = tf.repeat(tf.range(world_size), asked_counts)
        partial_counts = tf.math.unsorted_segment_sum(tf.cast(asked_opens, tf.int32), sources, world_size)
    returned, _ = dist.alltoall(tf.cast(partial, output_dtype), splits=partial_counts, name=f"{name}_vectors")
    if one_hot:
        return tf.gather(returned, tf.math.invert_permutation(order))
    group_samples = tf.boolean_mask(tf.gather(samples, order), opens)
    pooled = tf.math.unsorted_segment_sum(returned, group_samples, batch)
    return divide_by_lengths(pooled, row_lengths(ids)) if pooling == "mean" else pooled


def _fixed_width(ids: Ids) -> int:
    """Values per sample of a feature's part in the fixed-size id exchange: its id (one-hot), its
    h ids (`[B, h]`), or its row length (ragged; the ids follow in a second exchange)."""
    if isinstance(ids, tf.RaggedTensor) or ids.shape.rank == 1:
        return 1
    if ids.shape[1] is None:
        raise ValueError(f"multi-hot ids of shape {ids.shape} need a static hotness (second dimension)")
    return int(ids.shape[1])


class HybridEmbedding(tf.keras.layers.Layer):
    """Lookups of all tables for this rank's local batch, with tables spread by a ShardingPlan.

    Input: a tuple of int id tensors (`[B]`, `[B, h]` or ragged, batch.py), one per table of
    `reads` (`ShardingPlan.reads`, the same object the rank's loader was given): with model-parallel input the global batch of the tables
    this rank holds, of the replicated ones and of the row-sliced ones, with data-parallel input
    the local batch of every table. Output: `[local_batch, sum of the table widths]`, the tables'
    pooled vectors (by `plan.poolings`) side by side in feature order, in `output_dtype` (the embedding layers' common output
    layout).
    """

    def __init__(self, plan: ShardingPlan, rank: int, reads: TableReads, *,
                 table_dtype: tf.DType = tf.float32, output_dtype: tf.DType = tf.float32,
                 trainable: bool = True, seed: Optional[int] = 0, name: str = "hybrid_embedding") -> None:
        super().__init__(name=name, dtype=table_dtype, trainable=trainable)
        if reads != plan.reads(rank, data_parallel_input=not reads.global_batch):
            raise ValueError(f"rank {rank} is given ids of tables {list(reads.tables)} "
                             f"({'global' if reads.global_batch else 'local'} batch), which is not what "
                             f"the sharding plan decided for it")
        self.plan = plan
        self.rank = rank
        self.reads = reads
        self.world_size = plan.world_size
        self.data_parallel_input = not reads.global_batch
        self.output_dtype = output_dtype
        self.seed = seed
        self.local_pieces = plan.pieces_on(rank)
        self.local_tables = plan.model_parallel_tables_on(rank)
        self.piece_variables: List[tf.Variable] = []
        self.row_blocks: Dict[int, tf.Variable] = {}  # row-sliced table -> this rank's block of rows
        self.replicated_tables: Dict[int, tf.Variable] = {}

    def _table_variable(self, name: str, piece: Piece) -> tf.Variable:
        """A piece's variable in the memory tier the plan chose, initialised (a row block with
        its rows of the table)."""
        on_host = self.plan.on_host(self.rank, piece.table, piece.col_start)
        with tier_device(on_host):
            variable = self.add_weight(name=name, shape=[piece.rows, piece.width],
                                       dtype=self.dtype,
                                       trainable=self.trainable, initializer="zeros")
        table_rows = None
        if piece.table in self.plan.row_sliced:
            starts = self.plan.row_starts(piece.table)
            table_rows = (starts[self.rank], starts[self.rank + 1])
        fill_uniform(variable, 0, self.plan.cardinalities[piece.table], seed=self.seed, table=piece.table,
                     columns=(piece.col_start, piece.col_end), full_dim=self.plan.dims[piece.table],
                     table_rows=table_rows)
        return variable

    def build(self, input_shape=None) -> None:
        for piece in self.local_pieces:
            self.piece_variables.append(self._table_variable(
                f"table_{piece.table}_cols_{piece.col_start}_{piece.col_end}", piece))
        for block in self.plan.row_blocks_on(self.rank):
            self.row_blocks[block.table] = self._table_variable(f"row_sliced_table_{block.table}", block)
        for table in self.plan.replicated:
            self.replicated_tables[table] = self._table_variable(
                f"replicated_table_{table}", Piece(table, 0, self.plan.dims[table], self.rank,
                                                        self.plan.cardinalities[table]))
        super().build(input_shape)

    # ------------------------------------------------------------------ forward
    def _exchange_ids(self, ids: Dict[int, Ids], tag: str) -> Tuple[Dict[int, Ids], tf.Tensor]:
        """Data-parallel input -> global-batch ids of this rank's tables, in the form they came, and
        every rank's local batch.

        One all-to-all: to each rank, the ids of the tables it holds (one-hot ids, `[B, h]` ids
        flattened, ragged ones as row lengths), then the values of its ragged ones. With a ragged
        table the size of a rank's part no longer tells its local batch, so the part then starts
        with it. Every rank reads the same dataset, so each table's form is the same on every rank.
        """
        local_batch = batch_size_of(next(iter(ids.values())))
        with_ragged = any(isinstance(x, tf.RaggedTensor) for x in ids.values())
        send, splits = [], []
        for destination in range(self.world_size):
            tables = self.plan.model_parallel_tables_on(destination)
            ragged_values = [ids[t].values for t in tables if isinstance(ids[t], tf.RaggedTensor)]
            send.extend([tf.reshape(local_batch, [1])] if with_ragged else [])
            send.extend(row_lengths(ids[t]) if isinstance(ids[t], tf.RaggedTensor) else tf.reshape(ids[t], [-1])
                        for t in tables)
            send.extend(ragged_values)
            splits.append(int(with_ragged) + local_batch * sum(_fixed_width(ids[t]) for t in tables)
                          + sum((tf.size(v) for v in ragged_values), tf.constant(0)))
        received, received_splits = dist.alltoall(tf.concat(send, axis=0), splits=tf.stack(splits), name=f"ids{tag}")
        widths = [_fixed_width(ids[t]) for t in self.local_tables]
        ragged = [i for i, t in enumerate(self.local_tables) if isinstance(ids[t], tf.RaggedTensor)]
        parts: List[List[tf.Tensor]] = [[] for _ in self.local_tables]  # fixed parts by table, then source
        ragged_parts: Dict[int, List[tf.Tensor]] = {i: [] for i in ragged}  # ragged values by table, then source
        batches = []
        for source, chunk in enumerate(tf.split(received, received_splits, num=self.world_size)):
            batch = chunk[0] if with_ragged else received_splits[source] // sum(widths)
            fixed_size = batch * sum(widths)
            fixed = chunk[int(with_ragged):int(with_ragged) + fixed_size]
            for i, part in enumerate(tf.split(fixed, tf.stack([batch * w for w in widths]), num=len(widths))):
                parts[i].append(part)
            if ragged:
                values = tf.split(chunk[int(with_ragged) + fixed_size:],
                                  tf.stack([tf.reduce_sum(parts[i][-1]) for i in ragged]), num=len(ragged))
                for i, part in zip(ragged, values):
                    ragged_parts[i].append(part)
            batches.append(batch)
        global_ids: Dict[int, Ids] = {}
        for i, t in enumerate(self.local_tables):
            flat = tf.concat(parts[i], axis=0)
            if i in ragged:
                global_ids[t] = tf.RaggedTensor.from_row_lengths(tf.concat(ragged_parts[i], axis=0),
                                                                 tf.cast(flat, tf.int64), validate=False)
            else:
                global_ids[t] = flat if widths[i] == 1 else tf.reshape(flat, [-1, widths[i]])
        return global_ids, tf.stack(batches)

    @property
    def exchanges_ids(self) -> bool:
        """Whether `exchange_ids` sends ids between ranks (data-parallel input with model-parallel
        pieces on several ranks): only then is there an exchange to run ahead of the step."""
        return self.data_parallel_input and self.world_size > 1 and bool(self.plan.pieces)

    def micro_batch_ids(self, ids: Sequence[Ids], parts: int) -> List[Tuple[Ids, ...]]:
        """The ids of each of `parts` micro-batches, in the form `call` takes: micro-batch i holds
        rows [rank_start(i, L, parts), rank_start(i + 1, L, parts)) of every rank's local batch of
        L rows. Data-parallel input: those rows of the local batch; model-parallel input (global
        batch): those rows of every rank's part of it, in rank order, so micro-batch i is again a
        global batch whose ranks' parts lie where `local_batch_bounds` puts them when the global
        batch is a multiple of world_size x parts (main.py checks --micro_batches so)."""
        if parts == 1:
            return [tuple(ids)]
        if self.data_parallel_input:
            return [tuple(micro_batch_rows(x, part, parts) for x in ids) for part in range(parts)]
        bounds = local_batch_bounds(batch_size_of(ids[0]), self.world_size)
        result = []
        for part in range(parts):
            rows = []
            for rank in range(self.world_size):
                local = bounds[rank + 1] - bounds[rank]
                rows.append(tf.range(bounds[rank] + rank_start(part, local, parts),
                                     bounds[rank] + rank_start(part + 1, local, parts)))
            selected = tf.concat(rows, axis=0)
            result.append(tuple(tf.gather(x, selected) for x in ids))
        return result

    def exchange_ids(self, ids: Sequence[Ids], tag: str = "") -> Tuple[Tuple[Ids, ...], Tuple[Ids, ...], tf.Tensor]:
        """Everything before the lookups, which depends on the ids alone: the global-batch ids of this
        rank's model-parallel tables (`local_tables` order; exchanged by one all-to-all with
        data-parallel input), the local-batch ids of the replicated and row-sliced tables, and every
        rank's local batch size. `call(..., exchanged=True)` takes the result, so a step can run it
        ahead for the next batch (trainer.Trainer, pipelined input). `tag` ends the collective's
        name, unique per micro-batch."""
        if len(ids) != len(self.reads.tables):
            raise ValueError(f"{self.name} on rank {self.rank} expects ids of tables {list(self.reads.tables)}, "
                             f"got {len(ids)} id tensors")
        by_table = {t: as_int32(x) for t, x in zip(self.reads.tables, ids)}
        local_tables = self.plan.replicated + self.plan.row_sliced  # looked up for the local batch only
        if self.data_parallel_input:
            local_ids = {t: by_table[t] for t in local_tables}
            global_ids, batches = (self._exchange_ids(by_table, tag) if self.exchanges_ids
                                   else (by_table, tf.reshape(batch_size_of(ids[0]), [1])))
        else:
            bounds = local_batch_bounds(batch_size_of(ids[0]), self.world_size)
            batches = bounds[1:] - bounds[:-1]
            mine = (bounds[self.rank], bounds[self.rank + 1])
            local_ids = {t: by_table[t][mine[0]:mine[1]] for t in local_tables}
            global_ids = by_table
        return (tuple(global_ids[t] for t in self.local_tables), tuple(local_ids[t] for t in local_tables),
                batches)

    def call(self, ids: Any, as_blocks: bool = False, exchanged: bool = False, tag: str = "") -> Vectors:
        """The vectors of `ids` (the tables of `reads`), or, with `exchanged`, of what `exchange_ids`
        made of them; `tag` ends every collective's name (micro-batches need their own)."""
        global_part, local_part, batches = ids if exchanged else self.exchange_ids(ids, tag)
        global_ids = dict(zip(self.local_tables, global_part))
        local_ids = dict(zip(self.plan.replicated + self.plan.row_sliced, local_part))
        received = self._exchange_outputs(global_ids, batches, tag) if self.plan.pieces else {}
        vectors = []
        for table in range(len(self.plan.cardinalities)):
            pooling = self.plan.poolings[table]
            if table in self.replicated_tables:
                vectors.append(tf.cast(pooled_lookup(self.replicated_tables[table], local_ids[table], pooling),
                                       self.output_dtype))
            elif table in self.row_blocks:
                vectors.append(routed_lookup(self.row_blocks[table], local_ids[table], self.plan.row_starts(table),
                                             self.rank, self.world_size, pooling, self.output_dtype,
                                             f"row_sliced_table_{table}{tag}"))
            else:
                vectors.append(join_blocks([received[(p.rank, p.table, p.col_start)]
                                            for p in self.plan.pieces_of(table)]))
        return blocks_or_joined(vectors, as_blocks)

    def _exchange_outputs(self, global_ids: Dict[int, Ids], batches: tf.Tensor,
                          tag: str) -> Dict[Tuple[int, int, int], tf.Tensor]:
        """Look up and pool local pieces for the global batch; return every piece's pooled rows of my
        local batch (one vector per sample, whatever the hotness).

        The send buffer is destination-major and, within a destination, piece-major: for rank d,
        each piece's rows of d's local batch in turn. A piece's rows for one destination are
        contiguous in its lookup (the global batch is in rank order), so the buffer is one
        concatenation of whole row ranges, and every piece arrives as a contiguous row range that
        the receiver splits off without a copy (a split along the first axis shares the buffer).
        The backward pass mirrors it: one concatenation of the pieces' gradients per source, and
        per piece one of its row ranges. Interleaving the pieces by sample instead (a sample's
        vectors side by side) costs a strided copy per piece each way (60% of those copies' time
        on 2 ranks)."""
        outputs = [tf.cast(pooled_lookup(variable, global_ids[piece.table], self.plan.poolings[piece.table]),
                           self.output_dtype)
                   for piece, variable in zip(self.local_pieces, self.piece_variables)]
        if self.world_size == 1:
            return {(self.rank, piece.table, piece.col_start): output
                    for piece, output in zip(self.local_pieces, outputs)}
        by_destination = [tf.split(output, batches, num=self.world_size) for output in outputs]
        send = tf.concat([tf.reshape(parts[destination], [-1]) for destination in range(self.world_size)
                          for parts in by_destination], axis=0)
        width_mine = self.plan.width_on(self.rank)
        exchanged, received_splits = dist.alltoall(send, splits=batches * width_mine, name=f"embeddings{tag}")
        local_batch = batches[self.rank]
        by_piece = {}
        for source, block in enumerate(tf.split(exchanged, received_splits, num=self.world_size)):
            pieces = self.plan.pieces_on(source)
            if not pieces:
                continue
            flats = tf.split(block, [local_batch * piece.width for piece in pieces], num=len(pieces))
            for piece, flat in zip(pieces, flats):
                by_piece[(source, piece.table, piece.col_start)] = tf.reshape(flat, [-1, piece.width])
        return by_piece

    # ----------------------------------------------------------- state access
    @property
    def model_parallel_variables(self) -> List[tf.Variable]:
        """Pieces and row blocks held by this rank only: never broadcast, and their gradients are
        never all-reduced."""
        return list(self.piece_variables) + list(self.row_blocks.values()) if self.world_size > 1 else []

    def reduce_gradients(self, gradients: Sequence) -> list:
        """The gradients of `trainable_variables` as their updates need them (see the module
        docstring); each replicated table's collective is named by its position among them."""
        if self.world_size == 1:
            return list(gradients)
        local = {id(v) for v in self.model_parallel_variables}
        pairs = list(zip(gradients, self.trainable_variables))
        averaged = iter(dist.average_gradients([g for g, v in pairs if id(v) not in local],
                                               "replicated_embedding_grad"))
        return [dist.scale_gradient(g, 1.0 / self.world_size) if id(v) in local else next(averaged)
                for g, v in pairs]

    def table_views(self, selector: Optional[VariableSelector] = None) -> List[TableView]:
        """Every table in feature order as a global-layout view (sliced ones gather/cut)."""
        select = selector or (lambda v: v)
        views: List[TableView] = []
        for table in range(len(self.plan.cardinalities)):
            if table in self.replicated_tables:
                variable = select(self.replicated_tables[table])
                views.append(TableSlice(variable, 0, self.plan.cardinalities[table]))
            elif table in self.row_blocks:
                views.append(RowSlicedTableView(self.plan, table, self.rank, select(self.row_blocks[table])))
            else:
                local = [(piece, select(variable)) for piece, variable in zip(self.local_pieces, self.piece_variables)
                         if piece.table == table]
                views.append(ShardedTableView(self.plan, table, local))
        return views

    def placement(self) -> List[str]:
        """'device', 'cpu', 'replicated' or 'remote' for every table, as seen from this rank (a
        row-sliced table: the tier of its block here)."""
        result = []
        for table in range(len(self.plan.cardinalities)):
            if table in self.replicated_tables:
                result.append("replicated")
                continue
            local = [p for p in self.local_pieces + self.plan.row_blocks_on(self.rank) if p.table == table]
            on_host = any(self.plan.on_host(self.rank, p.table, p.col_start) for p in local)
            result.append("remote" if not local else ("cpu" if on_host else "device"))
        return result

