"""Hybrid-parallel embeddings on Horovod: model-parallel tables, data-parallel everything else.

The role of NVIDIA's distributed-embeddings `DistributedEmbedding` (not installable), built on
`distributed.alltoall`. A `ShardingPlan` gives every rank some tables or column slices; small
tables may be replicated. Forward:
  1. with data-parallel input, one all-to-all of ids sends each rank the global batch of the
     tables it holds (with model-parallel input the loader already read exactly that);
  2. local lookups on the rank's pieces, for the global batch;
  3. one all-to-all of the outputs, cast to the compute dtype first: rank d receives the rows of
     its local batch from every holder (the rows of a local batch are contiguous, so the send
     buffer needs no reordering and the bytes sent are the minimum: local batch x width);
  4. reassembly in feature order, column slices concatenated, replicated tables looked up locally;
     the tables' vectors side by side, `[local_batch, sum of widths]` (tables may differ in width).
Row-sliced tables (every rank holds a block of rows) take the ids of the local batch and route
them (`routed_lookup`): one all-to-all sends each id to the rank owning its row, the owner looks
it up, and a second all-to-all returns the vectors in the order they were asked for. It moves the
minimum for any list of ids (pooled multi-hot lookups can route their flat ids the same way):
per id not owned locally, 4 bytes out and one vector back.
The backward pass is the reverse exchange (Horovod's alltoall gradient). The layer also routes
its own gradients (`reduce_gradients`): those of model-parallel pieces and row blocks stay local
and sparse, scaled by 1/world_size because every rank's local-mean loss reaches them through the
exchange; those of replicated tables are averaged over the ranks like dense weights.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

import distributed as dist
from batch import TableReads, local_sizes, rank_start
from embedding import (TableSlice, TableView, VariableSelector, assign_rows, fill_uniform, read_variable_rows,
                       tier_device)
from sharding import Piece, ShardingPlan


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


def routed_lookup(block: tf.Variable, ids: tf.Tensor, starts: Sequence[int], rank: int, world_size: int,
                  output_dtype: tf.DType, name: str) -> tf.Tensor:
    """Rows `ids` (any number, global row numbers) of a table of which rank r holds the block
    [starts[r], starts[r+1]) (`block` is this rank's): `[len(ids), width]` in `output_dtype`.

    The ids are sorted by owner (stable), sent to their owners by one all-to-all, looked up there,
    and the vectors come back by a second all-to-all and are put back in the asked order. A
    collective: every rank calls it for the same tables in the same order.
    """
    ids = tf.cast(ids, tf.int32)
    owners = tf.searchsorted(tf.constant(starts[1:-1], tf.int32), ids, side="right", out_type=tf.int32)
    order = tf.argsort(owners, stable=True)
    counts = tf.math.bincount(owners, minlength=world_size, maxlength=world_size, dtype=tf.int32)
    asked, asked_counts = dist.alltoall(tf.gather(ids, order), splits=counts, name=f"{name}_ids")
    vectors = tf.cast(tf.gather(block, asked - starts[rank]), output_dtype)
    returned, _ = dist.alltoall(vectors, splits=asked_counts, name=f"{name}_vectors")
    return tf.gather(returned, tf.math.invert_permutation(order))


class HybridEmbedding(tf.keras.layers.Layer):
    """Lookups of all tables for this rank's local batch, with tables spread by a ShardingPlan.

    Input: a tuple of int id tensors, one per table of `reads` (`ShardingPlan.reads`, the same
    object the rank's loader was given): with model-parallel input the global batch of the tables
    this rank holds, of the replicated ones and of the row-sliced ones, with data-parallel input
    the local batch of every table. Output: `[local_batch, sum of the table widths]`, the tables'
    vectors side by side in feature order, in `output_dtype` (the embedding layers' common output
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
    def _exchange_ids(self, ids: Dict[int, tf.Tensor]) -> Tuple[Dict[int, tf.Tensor], tf.Tensor]:
        """Data-parallel input -> global-batch ids of this rank's tables, and every rank's local batch."""
        local_batch = tf.shape(next(iter(ids.values())), out_type=tf.int32)[0]
        send, splits = [], []
        for destination in range(self.world_size):
            tables = self.plan.model_parallel_tables_on(destination)
            send.extend(tf.cast(ids[t], tf.int32) for t in tables)
            splits.append(local_batch * len(tables))
        received, received_splits = dist.alltoall(tf.concat(send, axis=0), splits=tf.stack(splits), name="ids")
        n_local = len(self.local_tables)
        batches = received_splits // n_local
        per_source = tf.split(received, received_splits, num=self.world_size)
        blocks = [tf.reshape(block, [n_local, -1]) for block in per_source]
        global_ids = tf.concat(blocks, axis=1)
        return {t: global_ids[i] for i, t in enumerate(self.local_tables)}, batches

    def call(self, ids: Sequence[tf.Tensor]) -> tf.Tensor:
        if len(ids) != len(self.reads.tables):
            raise ValueError(f"{self.name} on rank {self.rank} expects ids of tables {list(self.reads.tables)}, "
                             f"got {len(ids)} id tensors")
        by_table = {t: tf.cast(x, tf.int32) for t, x in zip(self.reads.tables, ids)}
        local_tables = self.plan.replicated + self.plan.row_sliced  # looked up for the local batch only
        if self.data_parallel_input:
            local_ids = {t: by_table[t] for t in local_tables}
            global_ids, batches = (self._exchange_ids(by_table) if self.world_size > 1 and self.plan.pieces
                                   else (by_table, tf.shape(ids[0], out_type=tf.int32)[:1]))
        else:
            global_batch = tf.shape(ids[0], out_type=tf.int32)[0]
            bounds = local_batch_bounds(global_batch, self.world_size)
            batches = bounds[1:] - bounds[:-1]
            mine = (bounds[self.rank], bounds[self.rank + 1])
            local_ids = {t: by_table[t][mine[0]:mine[1]] for t in local_tables}
            global_ids = by_table
        received = self._exchange_outputs(global_ids, batches) if self.plan.pieces else {}
        vectors = []
        for table in range(len(self.plan.cardinalities)):
            if table in self.replicated_tables:
                vectors.append(tf.cast(tf.gather(self.replicated_tables[table], local_ids[table]),
                                       self.output_dtype))
            elif table in self.row_blocks:
                vectors.append(routed_lookup(self.row_blocks[table], local_ids[table], self.plan.row_starts(table),
                                             self.rank, self.world_size, self.output_dtype,
                                             f"row_sliced_table_{table}"))
            else:
                vectors.append(tf.concat([received[(p.rank, p.table, p.col_start)]
                                          for p in self.plan.pieces_of(table)], axis=1))
        return tf.concat(vectors, axis=1)

    def _exchange_outputs(self, global_ids: Dict[int, tf.Tensor],
                          batches: tf.Tensor) -> Dict[Tuple[int, int, int], tf.Tensor]:
        """Look up local pieces for the global batch; return every piece's rows of my local batch."""
        outputs = [tf.cast(tf.gather(variable, global_ids[piece.table]), self.output_dtype)
                   for piece, variable in zip(self.local_pieces, self.piece_variables)]
        width_mine = self.plan.width_on(self.rank)
        if self.world_size == 1:
            received = [tf.concat(outputs, axis=1)]
        else:
            send = tf.reshape(tf.concat(outputs, axis=1), [-1])
            exchanged, received_splits = dist.alltoall(send, splits=batches * width_mine, name="embeddings")
            received = [tf.reshape(block, [-1, self.plan.width_on(source)]) for source, block in
                        enumerate(tf.split(exchanged, received_splits, num=self.world_size))]
        by_piece = {}
        for source in range(self.world_size):
            offset = 0
            for piece in self.plan.pieces_on(source):
                by_piece[(source, piece.table, piece.col_start)] = received[source][:, offset:offset + piece.width]
                offset += piece.width
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


def exchange_bytes_per_step(plan: ShardingPlan, global_batch: int, dtype_size: int) -> int:
    """Bytes the output all-to-all moves between different ranks in one forward pass."""
    rows = local_sizes(global_batch, plan.world_size)
    return sum(rows[destination] * plan.width_on(source) * dtype_size
               for source in range(plan.world_size) for destination in range(plan.world_size)
               if destination != source)

