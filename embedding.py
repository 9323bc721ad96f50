"""Embedding tables on one process (reference §3): multitable, fused, and the split of the largest
tables to the CPU.

Every layer here takes a tuple of int32 id tensors, one per table in feature order, each in one of
the batch contract's forms (batch.py: `[B]` one-hot, `[B, h]` fixed multi-hot, or a
`tf.RaggedTensor`), and returns one pooled vector per sample and table side by side,
`[B, sum of the table widths]`, in the layer's compute dtype (the layout every embedding layer
shares; tables may differ in width). Every lookup goes through `pooled_lookup`, pooling by the
table's `pooling` ('sum' or 'mean', from the FeatureSpec through the sharding plan); one-hot ids
take a plain gather, nothing more. Each layer also exposes its tables
as `TableSlice`s (a variable and a row range), so checkpoints read and write every table, and the
optimizer slots that share its layout, in the global per-table layout whatever the
implementation.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from recsys.data.feature_spec import POOLINGS
from recsys.runtime import distributed as dist
from recsys.sparse.tables import (Ids, TableSlice, TableView, VariableSelector, Vectors, blocks_or_joined,
                                  fill_uniform, is_one_hot, join_blocks, micro_batch_rows, pooled_lookup, tier_device)

EMBEDDING_TYPES = ("multitable", "fused")

class _TableGroup(tf.keras.layers.Layer):
    """What both table layouts share: the table shapes, the table dtype and the output dtype."""

    def __init__(self, cardinalities: Sequence[int], dim: int, table_dtype: tf.DType,
                 trainable: bool, output_dtype: Optional[tf.DType], name: str,
                 table_ids: Optional[Sequence[int]], seed: Optional[int],
                 poolings: Optional[Sequence[str]]) -> None:
        super().__init__(name=name, dtype=table_dtype, trainable=trainable)
        self.cardinalities = [int(c) for c in cardinalities]
        self.dim = dim
        self.output_dtype = output_dtype or table_dtype
        self.table_ids = list(range(len(self.cardinalities)) if table_ids is None else table_ids)
        self.seed = seed
        self.poolings = list(poolings or [POOLINGS[0]] * len(self.cardinalities))


class MultiTableEmbedding(_TableGroup):
    """One variable per table; one gather per table."""

    def __init__(self, cardinalities: Sequence[int], dim: int, table_dtype: tf.DType = tf.float32,
                 trainable: bool = True, output_dtype: Optional[tf.DType] = None,
                 name: str = "multitable_embedding", table_ids: Optional[Sequence[int]] = None,
                 seed: Optional[int] = 0, poolings: Optional[Sequence[str]] = None) -> None:
        super().__init__(cardinalities, dim, table_dtype, trainable, output_dtype, name, table_ids, seed, poolings)
        self.tables: List[tf.Variable] = []

    def build(self, input_shape=None) -> None:
        for i, rows in enumerate(self.cardinalities):
            table = self.add_weight(name=f"table_{i}", shape=[rows, self.dim], dtype=self.dtype,
                                    initializer="zeros", trainable=self.trainable)
            fill_uniform(table, 0, rows, seed=self.seed, table=self.table_ids[i])
            self.tables.append(table)
        super().build(input_shape)

    def call(self, ids: Sequence[Ids], as_blocks: bool = False) -> Vectors:
        return blocks_or_joined([tf.cast(pooled_lookup(table, table_ids, pooling), self.output_dtype)
                                 for table, table_ids, pooling in zip(self.tables, ids, self.poolings)], as_blocks)

    def table_slices(self) -> List[TableSlice]:
        return [TableSlice(table, 0, rows) for table, rows in zip(self.tables, self.cardinalities)]


class FusedEmbedding(_TableGroup):
    """All tables concatenated in one variable; ids are offset by each table's first row."""

    def __init__(self, cardinalities: Sequence[int], dim: int, table_dtype: tf.DType = tf.float32,
                 trainable: bool = True, output_dtype: Optional[tf.DType] = None,
                 name: str = "fused_embedding", table_ids: Optional[Sequence[int]] = None,
                 seed: Optional[int] = 0, poolings: Optional[Sequence[str]] = None) -> None:
        super().__init__(cardinalities, dim, table_dtype, trainable, output_dtype, name, table_ids, seed, poolings)
        self.offsets = np.concatenate([[0], np.cumsum(self.cardinalities)]).astype(np.int64)
        self.table: Optional[tf.Variable] = None

    def build(self, input_shape=None) -> None:
        self.table = self.add_weight(name="fused_table", shape=[int(self.offsets[-1]), self.dim],
                                     dtype=self.dtype, initializer="zeros", trainable=self.trainable)
        for i, rows in enumerate(self.cardinalities):
            fill_uniform(self.table, int(self.offsets[i]), rows, seed=self.seed, table=self.table_ids[i])
        super().build(input_shape)

    def call(self, ids: Sequence[Ids], as_blocks: bool = False) -> Vectors:
        if all(is_one_hot(t) for t in ids):  # one gather for every table
            offsets = tf.constant(self.offsets[:-1], tf.int64)
            fused_ids = tf.stack([tf.cast(t, tf.int64) for t in ids], axis=1) + offsets
            vectors = tf.reshape(tf.gather(self.table, fused_ids), [-1, len(self.cardinalities) * self.dim])
            return blocks_or_joined([tf.cast(vectors, self.output_dtype)], as_blocks)
        return blocks_or_joined([tf.cast(pooled_lookup(self.table, tf.cast(t, tf.int64), pooling, int(offset)),
                                         self.output_dtype)
                                 for t, pooling, offset in zip(ids, self.poolings, self.offsets)], as_blocks)

    def table_slices(self) -> List[TableSlice]:
        return [TableSlice(self.table, int(self.offsets[i]), int(self.offsets[i + 1]))
                for i in range(len(self.cardinalities))]


def _make_group(embedding_type: str, cardinalities: Sequence[int], table_ids: Sequence[int], dim: int,
                table_dtype: tf.DType, trainable: bool, output_dtype: tf.DType, name: str,
                seed: Optional[int], poolings: Sequence[str]) -> tf.keras.layers.Layer:
    """A layer holding tables `table_ids` (indices into `cardinalities` and `poolings`) in one layout."""
    if embedding_type not in EMBEDDING_TYPES:
        raise ValueError(f"embedding type must be one of {EMBEDDING_TYPES}, got {embedding_type!r}")
    cls = MultiTableEmbedding if embedding_type == "multitable" else FusedEmbedding
    return cls([cardinalities[i] for i in table_ids], dim, table_dtype=table_dtype, trainable=trainable,
               output_dtype=output_dtype, name=name, table_ids=table_ids, seed=seed,
               poolings=[poolings[i] for i in table_ids])


class DualEmbeddingGroup(tf.keras.layers.Layer):
    """Tables on the accelerator, except `host_tables` (decided by the sharding plan's memory
    budget), which live in host memory in fp32. `dims` holds one width per table;
    `poolings` one per table ('sum' when not given); `seed` None starts every table at zero
    (`fill_uniform`).

    Tables are grouped by memory tier and width (a group holds tables of one width); every group is
    looked up and the vectors are put back in feature order, so the output is the same whatever the
    split; only placement changes.
    """

    def __init__(self, cardinalities: Sequence[int], dims: Sequence[int], *,
                 device_embedding_type: str = "fused", cpu_embedding_type: str = "multitable",
                 host_tables: Sequence[int] = (), table_dtype: tf.DType = tf.float32,
                 output_dtype: tf.DType = tf.float32, trainable: bool = True, seed: Optional[int] = 0,
                 poolings: Optional[Sequence[str]] = None, name: str = "embedding") -> None:
        super().__init__(name=name, trainable=trainable)
        self.cardinalities = [int(c) for c in cardinalities]
        self.dims = [int(d) for d in dims]
        self.poolings = list(poolings or [POOLINGS[0]] * len(self.cardinalities))
        self.host_tables = sorted(host_tables)
        self.output_dtype = output_dtype
        single_width = len(set(self.dims)) == 1
        self.groups: List[Tuple[List[int], bool, tf.keras.layers.Layer]] = []  # (tables, on host, layer)
        for on_host, tier, embedding_type, dtype in ((False, "device_tables", device_embedding_type, table_dtype),
                                                     (True, "cpu_tables", cpu_embedding_type, tf.float32)):
            tier_tables = [t for t in range(len(self.cardinalities)) if (t in self.host_tables) == on_host]
            for width in sorted({self.dims[t] for t in tier_tables}):
                tables = [t for t in tier_tables if self.dims[t] == width]
                with tier_device(on_host):
                    layer = _make_group(embedding_type, self.cardinalities, tables, width, dtype, trainable,
                                        output_dtype, tier if single_width else f"{tier}_dim_{width}", seed,
                                        self.poolings)
                self.groups.append((tables, on_host, layer))
        column_starts = np.cumsum([0] + self.dims)
        order = [t for tables, _, _ in self.groups for t in tables]
        columns = np.concatenate([np.arange(column_starts[t], column_starts[t + 1]) for t in order])
        self._feature_columns = (None if np.array_equal(columns, np.arange(column_starts[-1]))
                                 else np.argsort(columns).astype(np.int32))

    def build(self, input_shape=None) -> None:
        for _, on_host, layer in self.groups:
            with tier_device(on_host):
                layer.build(None)
        super().build(input_shape)

    exchanges_ids = False  # every table is whole here: no id leaves the process

    def micro_batch_ids(self, ids: Sequence[Ids], parts: int) -> List[Tuple[Ids, ...]]:
        """Micro-batch i's rows of every table's ids (`micro_batch_rows`)."""
        return [tuple(micro_batch_rows(x, part, parts) for x in ids) for part in range(parts)]

    def exchange_ids(self, ids: Sequence[Ids], tag: str = "") -> Tuple[Ids, ...]:
        """The ids as they are: nothing to exchange on one process."""
        return tuple(ids)

    def call(self, ids: Sequence[Ids], as_blocks: bool = False, exchanged: bool = False, tag: str = "") -> Vectors:
        """Every table's vectors of `ids` (`exchanged` and `tag` change nothing here)."""
        blocks = []
        for tables, on_host, layer in self.groups:
            with tier_device(on_host):
                blocks += layer([ids[t] for t in tables], as_blocks=True)
        if self._feature_columns is None:
            return blocks_or_joined(blocks, as_blocks)
        # Groups out of feature order: their vectors are joined and their columns put back in order.
        return blocks_or_joined([tf.gather(join_blocks(blocks), self._feature_columns, axis=1)], as_blocks)

    def table_slices(self) -> List[TableSlice]:
        """One slice per table, in feature order."""
        slices: List[Optional[TableSlice]] = [None] * len(self.cardinalities)
        for tables, _, layer in self.groups:
            for table, table_slice in zip(tables, layer.table_slices()):
                slices[table] = table_slice
        return slices  # type: ignore[return-value]

    def table_views(self, selector: Optional[VariableSelector] = None) -> List[TableView]:
        """Every table (or, with `selector`, its optimizer slot) in feature order."""
        return [t.select(selector) if selector else t for t in self.table_slices()]

    @property
    def model_parallel_variables(self) -> List[tf.Variable]:
        """None: every table of this layer is whole on every rank."""
        return []

    def reduce_gradients(self, gradients: Sequence) -> list:
        """The gradients of `trainable_variables`, averaged over the ranks (tables whole on each)."""
        return dist.average_gradients(gradients, "replicated_embedding_grad")

    def placement(self) -> List[str]:
        """'device' or 'cpu' for every table, in feature order (for start-up logging)."""
        return ["cpu" if i in self.host_tables else "device" for i in range(len(self.cardinalities))]
