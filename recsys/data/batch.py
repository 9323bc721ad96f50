"""The batch contract every layer shares: the element's keys and which rows of a global batch a rank owns.

An input element is `(features, labels)` with `features = {NUMERICAL_KEY: [local_b, n_num],
CATEGORICAL_KEY: tuple of int32 id tensors, one per feature read}`. A feature's ids take one of
three forms, by its FeatureSpec `hotness` and its source:
  * hotness 1 (one-hot): a `[b]` tensor;
  * hotness h > 1, fixed (split-binary `[samples, h]` files, synthetic data): a `[b, h]` tensor;
  * hotness h > 1, variable (split-TFRecords): a `tf.RaggedTensor` `[b, (ids)]`, each row holding
    at most h ids (possibly none).
Every embedding layer takes all three and returns one pooled vector per sample and feature
(FeatureSpec `pooling`: the sum of the ids' rows, or their mean; an empty row pools to zeros);
repeated ids within a row count once each. Rank r of W owns rows
[(r*B)//W, ((r+1)*B)//W) of a global batch of B samples: the loaders cut numericals and labels
by it, the hybrid embedding layer cuts looked-up rows by it, and the benchmarks size batches by it.
Which categorical features a rank's batches carry is a `TableReads`.

On the numpy side (readers to writers, `dataloading.transcribe`), one batch is `Samples`: numericals
[n, n_num] float16 (None without numerical features), labels [n] of 0/1, and one `Ids` per feature:
[n] one-hot, [n, h] fixed hotness h, or `RaggedIds` (a variable number per sample).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Tuple, Union

import numpy as np

from recsys.data.data_errors import DataError

NUMERICAL_KEY = "numerical_features"
CATEGORICAL_KEY = "categorical_features"


def rank_start(rank: Any, global_batch: Any, world_size: int) -> Any:
    """First row of `rank`'s local batch (`rank == world_size`: the end of the batch).

    The one formula; `global_batch` (and `rank`) may be Python ints or int32 tensors.
    """
    return (rank * global_batch) // world_size


def local_slice(global_batch: int, rank: int, world_size: int) -> Tuple[int, int]:
    """Rows [lo, hi) of a global batch that `rank` owns."""
    return rank_start(rank, global_batch, world_size), rank_start(rank + 1, global_batch, world_size)


def local_sizes(global_batch: int, world_size: int) -> List[int]:
    """The local batch size of every rank."""
    return [hi - lo for lo, hi in (local_slice(global_batch, r, world_size) for r in range(world_size))]


@dataclass(frozen=True)
class TableReads:
    """Which categorical features a rank's batches hold, and for which rows.

    Decided once, by `ShardingPlan.reads`, and handed to both the loader (what it reads) and the
    embedding layer (what it receives), so the two cannot disagree: `tables` are feature indices in
    increasing order, one id tensor each; `global_batch` means every row of the global batch
    (model-parallel input), otherwise only the rank's local slice.
    """
    tables: Tuple[int, ...]
    global_batch: bool = False

    @classmethod
    def every_table(cls, num_tables: int) -> "TableReads":
        """All features for the local rows: a single process, or data-parallel input."""
        return cls(tuple(range(num_tables)), global_batch=False)

    def rows(self, global_batch: int, rank: int, world_size: int) -> Tuple[int, int]:
        """Rows [lo, hi) of a global batch whose ids this rank reads."""
        return (0, global_batch) if self.global_batch else local_slice(global_batch, rank, world_size)

    def check(self, num_tables: int) -> None:
        """Raise ValueError unless `tables` are strictly increasing indices in [0, num_tables)."""
        if list(self.tables) != sorted(set(self.tables)) or any(not 0 <= t < num_tables for t in self.tables):
            raise ValueError(f"the tables a rank reads, {list(self.tables)}, must be strictly increasing "
                             f"indices in [0, {num_tables})")


@dataclass(frozen=True)
class RaggedIds:
    """A variable number of ids per sample (split-TFRecords multi-hot): sample i holds
    `values[offsets[i]:offsets[i + 1]]`, offsets being the running sum of `row_lengths`."""
    values: np.ndarray
    row_lengths: np.ndarray

    def __len__(self) -> int:
        return len(self.row_lengths)

    @classmethod
    def from_fixed(cls, ids: np.ndarray) -> "RaggedIds":
        """Rows of `ids` [n, h] (or [n]: one id each), every one of its h ids."""
        ids = np.asarray(ids)
        ids = ids.reshape(len(ids), -1)
        return cls(ids.reshape(-1), np.full(len(ids), ids.shape[1], np.int64))

    def rows(self, lo: int, hi: int) -> "RaggedIds":
        """Samples [lo, hi)."""
        start = int(self.row_lengths[:lo].sum())
        lengths = self.row_lengths[lo:hi]
        return RaggedIds(self.values[start:start + int(lengths.sum())], lengths)

    def to_fixed(self, hotness: int, feature: str) -> np.ndarray:
        """The ids as [n, hotness] (or [n] for hotness 1); a DataError naming `feature` unless every
        sample has exactly `hotness` ids (a fixed-hotness format pads nothing)."""
        wrong = np.flatnonzero(self.row_lengths != hotness)
        if wrong.size:
            sample = int(wrong[0])
            raise DataError(f"feature '{feature}' has {self.row_lengths[sample]} ids at sample {sample} (of "
                            f"{len(self)}); split-binary stores exactly its hotness {hotness} ids per sample "
                            f"and pads nothing")
        return self.values.reshape(len(self), hotness) if hotness != 1 else self.values


# One batch as the dataset writers take it: numericals [n, n_num] float16 (None without numerical
# features), labels [n] of bytes 0/1, one id array per categorical feature: [n] (one-hot), [n, h]
# (fixed hotness h) or RaggedIds (split-TFRecords multi-hot).
Ids = Union[np.ndarray, RaggedIds]
Samples = Tuple[Optional[np.ndarray], np.ndarray, List[Ids]]
