"""The embedding machinery every embedding layer shares: the id forms of the batch contract, the one
pooled lookup, table views (a table in global layout whatever its storage, read and written in
row chunks by checkpoints and exports), seeded row initialisation, and `EmbeddingLayer`, the contract
the model asks of a layer whatever the world size (root `embedding.py`: the single-process tables;
`recsys.sparse.hybrid_embedding`: the hybrid-parallel layer).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator, List, Optional, Protocol, Sequence, Tuple, Union, runtime_checkable

import numpy as np
import tensorflow as tf

from recsys.data.batch import rank_start
from recsys.data.feature_spec import POOLINGS

Ids = Union[tf.Tensor, tf.RaggedTensor]


def is_one_hot(ids: Ids) -> bool:
    """A `[B]` id tensor (one id per sample), known when the graph is built."""
    return not isinstance(ids, tf.RaggedTensor) and ids.shape.rank == 1


def batch_size_of(ids: Ids) -> tf.Tensor:
    """The number of samples (rows) of an id tensor of any form, as an int32 scalar."""
    if isinstance(ids, tf.RaggedTensor):
        return tf.cast(ids.nrows(), tf.int32)
    return tf.shape(ids, out_type=tf.int32)[0]


def micro_batch_rows(ids: Ids, part: int, parts: int) -> Ids:
    """Micro-batch `part` of `parts` of an id tensor of any form: rows [rank_start(part, B, parts),
    rank_start(part + 1, B, parts)), the batch contract's one split formula."""
    batch = batch_size_of(ids)
    return ids[rank_start(part, batch, parts):rank_start(part + 1, batch, parts)]


def as_int32(ids: Ids) -> Ids:
    """The ids as int32, in the form they came."""
    return tf.cast(ids, tf.int32)


def row_lengths(ids: Ids) -> tf.Tensor:
    """Ids per sample, `[B]` int32, of a `[B, h]` or ragged id tensor."""
    if isinstance(ids, tf.RaggedTensor):
        return tf.cast(ids.row_lengths(), tf.int32)
    return tf.fill(tf.shape(ids, out_type=tf.int32)[:1], tf.shape(ids, out_type=tf.int32)[1])


def divide_by_lengths(summed: tf.Tensor, lengths: tf.Tensor) -> tf.Tensor:
    """Mean pooling from sums: each row divided by its number of ids (an empty row stays zero)."""
    return summed / tf.cast(tf.maximum(lengths, 1), summed.dtype)[:, None]


def pooled_lookup(table: tf.Variable, ids: Ids, pooling: str = "sum", row_offset: int = 0) -> tf.Tensor:
    """One vector per sample: the rows `ids` (+ `row_offset`, a table's first row in a fused
    variable) of `table`, pooled by `pooling`, `[B, width]` in the table's dtype.

    `[B]` ids: a plain gather. `[B, h]`: gather and sum (or mean) over h. Ragged: a gather of the
    flat values and a segment sum per row; mean divides by the row's length, an empty row pools to
    zeros. Repeated ids count once each. The gradient reaches the table as IndexedSlices of every
    id looked up (duplicates included); the optimizers merge them.
    """
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
    if isinstance(ids, tf.RaggedTensor):
        values = ids.values if not row_offset else ids.values + tf.cast(row_offset, ids.values.dtype)
        vectors = tf.gather(table, values)
        summed = tf.math.unsorted_segment_sum(vectors, ids.value_rowids(), ids.nrows())
        return divide_by_lengths(summed, row_lengths(ids)) if pooling == "mean" else summed
    if row_offset:
        ids = ids + tf.cast(row_offset, ids.dtype)
    vectors = tf.gather(table, ids)
    if ids.shape.rank == 1:
        return vectors
    if ids.shape.rank != 2:
        raise ValueError(f"ids must be [B], [B, h] or ragged, got shape {ids.shape}")
    return tf.reduce_mean(vectors, axis=1) if pooling == "mean" else tf.reduce_sum(vectors, axis=1)


VariableSelector = Callable[[tf.Variable], tf.Variable]


class TableView:
    """One whole table in global layout, whatever its storage (fused, sliced over ranks, ...).

    `read_rows` returns full-width rows (a collective when the table is spread over ranks: every
    rank must call it in the same order); `write_rows` stores full-width rows, each holder
    keeping its own part.
    """
    rows: int
    dim: int
    numpy_dtype: np.dtype

    def read_rows(self, start: int, end: int) -> np.ndarray:
        raise NotImplementedError

    def write_rows(self, start: int, end: int, values: np.ndarray) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class TableSlice(TableView):
    """Rows [row_start, row_end) of a local `variable` hold one whole table."""
    variable: tf.Variable
    row_start: int
    row_end: int

    @property
    def rows(self) -> int:
        return self.row_end - self.row_start

    @property
    def dim(self) -> int:
        return int(self.variable.shape[1])

    @property
    def numpy_dtype(self) -> np.dtype:
        return np.dtype(self.variable.dtype.as_numpy_dtype)

    def read_rows(self, start: int, end: int) -> np.ndarray:
        return read_variable_rows(self.variable, self.row_start + start, self.row_start + end)

    def write_rows(self, start: int, end: int, values: np.ndarray) -> None:
        assign_rows(self.variable, self.row_start + start, values.astype(self.numpy_dtype, copy=False))

    def select(self, selector: VariableSelector) -> "TableSlice":
        """The same rows of another variable of the same shape (an optimizer slot)."""
        return TableSlice(selector(self.variable), self.row_start, self.row_end)


CHUNK_BYTES = 8 << 20


def row_chunks(rows: int, dim: int, itemsize: int = 4) -> Iterator[Tuple[int, int]]:
    """[start, end) row ranges of about CHUNK_BYTES each, for filling, copying or checkpointing a
    table piecewise.

    Small, because the pages of every transient buffer stay resident in TensorFlow's allocator
    pool for the rest of the run: filling the cpu-bench tables in 8 MiB chunks instead of 32 MiB
    ones leaves about 130 MiB less RSS behind.
    The ranges depend only on the global table shape, so ranks reading a sharded table chunk by
    chunk (a collective) agree on them.
    """
    step = max(1, CHUNK_BYTES // max(1, dim * itemsize))
    for start in range(0, rows, step):
        yield start, min(rows, start + step)


def copy_table(source: TableView, target: TableView) -> None:
    """Copy one table between views (e.g. between embedding implementations), chunk by chunk."""
    for start, end in row_chunks(source.rows, source.dim, source.numpy_dtype.itemsize):
        target.write_rows(start, end, source.read_rows(start, end))


def read_variable_rows(variable: tf.Variable, start: int, end: int) -> np.ndarray:
    """Rows [start, end) of `variable`, gathered.

    Not a slice of the variable's value: once a sparse update has touched a table, TensorFlow
    reads its whole value as a copy (copy-on-read mode), so reading a huge table in chunks by
    slices would copy all of it once per chunk.
    """
    return tf.gather(variable, tf.range(start, end, dtype=tf.int64)).numpy()


def assign_rows(variable: tf.Variable, row_start: int, values) -> None:
    """Write rows [row_start, row_start + len(values)) of `variable` in place.

    A scatter, because a strided-slice assign copies the whole variable on its first write
    (copy-on-write), which doubles the memory of a huge table.
    """
    count = int(values.shape[0])
    rows = tf.range(row_start, row_start + count, dtype=tf.int64)
    variable.scatter_update(tf.IndexedSlices(tf.cast(values, variable.dtype), rows))


def fill_uniform(variable: tf.Variable, row_start: int, rows: int, *, seed: Optional[int], table: int,
                 columns: Optional[Tuple[int, int]] = None, full_dim: Optional[int] = None,
                 table_rows: Optional[Tuple[int, int]] = None) -> None:
    """Fill rows [row_start, row_start + rows) of `variable` with table `table` (of `rows` rows),
    or with its columns [c0, c1) when `columns` is given, or only with its rows [r0, r1) from
    `row_start` on when `table_rows` is given (a row slice): U(-sqrt(1/N), sqrt(1/N)), N = rows (§2.7).

    Every value is a pure function of (seed, table, row, column): rows are drawn in blocks fixed
    by the global table shape (`full_dim` wide), each from a stateless generator keyed by
    (seed, table, block), so a table starts the same whether it is whole, fused, offloaded, or
    column- or row-sliced over any number of ranks. Generated on the CPU one block at a time, so
    initialising a huge table never holds more than one block besides the table itself.
    `seed` None keeps the zeros the table was created with (V5 `--embedding_zeros_initializer`).
    """
    if seed is None:
        return
    limit = math.sqrt(1.0 / rows)
    dim = full_dim or int(variable.shape[1])
    first, last = columns or (0, dim)
    kept_start, kept_end = table_rows or (0, rows)
    for block, (start, end) in enumerate(row_chunks(rows, dim)):
        low, high = max(start, kept_start), min(end, kept_end)
        if low >= high:
            continue
        with tf.device("/CPU:0"):
            key = tf.constant([seed, (table << 32) + block], tf.int64)
            values = tf.random.stateless_uniform([end - start, dim], key, -limit, limit, dtype=tf.float32)
        assign_rows(variable, row_start + low - kept_start, values[low - start:high - start, first:last])


# An embedding layer's output: every sample's vectors in feature order, [B, sum of table widths];
# with `as_blocks=True` in `call`, as a list of blocks [B, k_i * width] whose concatenation
# along axis 1 is that tensor, so a caller can join them once with other vectors (the bottom-MLP
# output) or read them where they are (the blocks interaction) instead of copying them twice.
Vectors = Union[tf.Tensor, List[tf.Tensor]]


def join_blocks(blocks: Sequence[tf.Tensor]) -> tf.Tensor:
    """The [B, sum of widths] tensor a list of vector blocks holds (one block: itself, no copy)."""
    return tf.concat(list(blocks), axis=1)


def blocks_or_joined(blocks: List[tf.Tensor], as_blocks: bool) -> Vectors:
    """`blocks` as they are, or joined into one tensor: what `call(..., as_blocks)` returns."""
    return blocks if as_blocks else join_blocks(blocks)


def tier_device(on_host: bool):
    """The device scope of a memory tier: host memory (/CPU:0), or wherever the ops run."""
    return tf.device("/CPU:0" if on_host else None)


@runtime_checkable
class EmbeddingLayer(Protocol):
    """What the model asks of an embedding layer, whatever the world size: `DualEmbeddingGroup` on one
    process, `hybrid_embedding.HybridEmbedding` on several (`factory.embedding_layer` chooses). Both
    are Keras layers: called on the ids of the tables they read (a tuple in feature order), they return
    the pooled vectors `[B, sum of widths]`, or the blocks of them (`as_blocks`), in feature order."""

    trainable_variables: List[tf.Variable]
    exchanges_ids: bool  # whether exchange_ids sends ids between ranks (worth running ahead of a step)
    output_dtype: tf.DType  # the vectors' dtype (what the embedding all-to-all sends)

    def __call__(self, ids: Any, as_blocks: bool = False, exchanged: bool = False, tag: str = "") -> Vectors:
        """The vectors of `ids`, or with `exchanged` of `exchange_ids(ids)`; `tag` ends the names of
        the layer's collectives (each micro-batch of a step has its own)."""
        ...

    def micro_batch_ids(self, ids: Sequence[Ids], parts: int) -> List[Tuple[Ids, ...]]:
        """The ids of each of `parts` micro-batches of every rank's local batch (`micro_batch_rows`'
        rows), in the form the layer reads."""
        ...

    def exchange_ids(self, ids: Sequence[Ids], tag: str = "") -> Any:
        """What the lookups need of `ids` that depends on the ids alone (a nest of tensors): the
        ids after any exchange between ranks; the one-process layer's is the ids themselves."""
        ...

    def build(self, input_shape) -> None:
        ...

    @property
    def model_parallel_variables(self) -> List[tf.Variable]:
        """The variables this rank alone holds (never broadcast, never averaged)."""

    def reduce_gradients(self, gradients: Sequence) -> list:
        """The gradients of `trainable_variables` as the optimizers apply them (averaged where every
        rank holds the table, local where one rank does)."""

    def table_views(self, selector: Optional[VariableSelector] = None) -> List[TableView]:
        """Every table (or, with `selector`, its optimizer slot) in global layout, in feature order."""

    def placement(self) -> List[str]:
        """Where each table lives for this rank ('device', 'cpu', 'replicated', 'remote'), in feature order."""
