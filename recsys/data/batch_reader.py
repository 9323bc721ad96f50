"""The tf.data side every pread-based reader shares (`BatchReader`), and `pread_into`.

A reader serves global batch k of one mapping as numpy arrays (`_read`); `BatchReader` turns them
into the (features, labels) element of `batch.py`, files a bad batch's DataError for
`pipeline_errors.surface_data_errors`, and serves the arrays to `dataloading.transcribe` as
`batch.Samples` (`read_samples`).
"""
from __future__ import annotations

import math
import os
from typing import Iterator, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from recsys.data.batch import CATEGORICAL_KEY, NUMERICAL_KEY, Samples, TableReads, local_slice
from recsys.data.data_errors import DataError, truncated_error
from recsys.data.pipeline_errors import file_pipeline_error, pipeline_error_check

PREFETCH_BATCHES = 2
VALIDATE_BATCH = 1 << 18  # samples per read of a reader's up-front scan (--validate_data)


def pread_into(fd: int, path: str, buffer: np.ndarray, offset: int) -> None:
    """Fill `buffer` with the bytes of the file at `offset`; a short file is a DataError."""
    view = memoryview(buffer.reshape(-1).view(np.uint8))
    done = 0
    while done < len(view):
        count = os.preadv(fd, [view[done:]], offset + done)
        if count == 0:
            raise truncated_error(path, offset + done)
        done += count


class BatchReader:
    """The tf.data side of a reader that serves global batch k of one mapping as numpy arrays.

    A subclass reads (`_read`) one batch as: labels [local rows] bool, numericals [local rows,
    n_num] float16 (only with numerical features), then one block per categorical group of
    `groups` ((dtype, [positions in categorical_features]), members of one dtype and one hotness
    h): [features, rows] for one-hot features, [features, rows, h] for multi-hot ones, rows being
    those `reads.rows` gives; this class turns those arrays into the (features, labels) element,
    graph side: ids [rows] or [rows, h] int32. `hotness` gives each feature's h (default all 1).
    With `drop_remainder` the last partial batch is dropped (training); otherwise it is served with
    fewer rows (evaluation covers every sample).
    """

    _numerical_stored = np.dtype(np.float16)  # the numericals' dtype in `_read`'s arrays
    _extra_dtypes: Sequence[np.dtype] = ()  # a subclass's per-row columns after the numericals

    def __init__(self, num_samples: int, global_batch_size: int, *, rank: int, world_size: int,
                 reads: TableReads, drop_remainder: bool, numerical_dtype: tf.DType,
                 categorical_features: Sequence[str], num_numerical: int,
                 groups: Sequence[Tuple[np.dtype, List[int]]], hotness: Optional[Sequence[int]] = None):
        self.num_samples, self.global_batch_size = num_samples, global_batch_size
        self.rank, self.world_size, self.reads = rank, world_size, reads
        self.drop_remainder, self.numerical_dtype = drop_remainder, numerical_dtype
        self.categorical_features = list(categorical_features)
        self.num_numerical = num_numerical
        self._groups = list(groups)
        self.hotness = list(hotness) if hotness is not None else [1] * len(self.categorical_features)
        if drop_remainder:
            self.num_batches = num_samples // global_batch_size
        else:
            self.num_batches = math.ceil(num_samples / global_batch_size)

    def __len__(self) -> int:
        return self.num_batches

    def batch_rows(self, batch_index: int) -> Tuple[int, int]:
        """First sample and number of samples of global batch `batch_index`."""
        start = batch_index * self.global_batch_size
        return start, min(self.global_batch_size, self.num_samples - start)

    def rank_rows(self, batch_index: int) -> Tuple[int, int, int, int]:
        """(first sample, count) of this rank's local slice of batch `batch_index` (labels and
        numericals), then (first sample, count) of the rows whose ids it reads."""
        start, size = self.batch_rows(int(batch_index))
        lo, hi = local_slice(size, self.rank, self.world_size)
        categorical_lo, categorical_hi = self.reads.rows(size, self.rank, self.world_size)
        return start + lo, hi - lo, start + categorical_lo, categorical_hi - categorical_lo

    def _read(self, batch_index: int) -> Tuple[List[np.ndarray], Optional[DataError]]:
        """The batch's arrays (whole even when the data is bad) and the DataError found, if any."""
        raise NotImplementedError

    def _id_shape(self, members: Sequence[int]) -> Tuple[int, ...]:
        """The per-sample shape of a group's ids: () one-hot, (h,) multi-hot."""
        hotness = self.hotness[members[0]]
        return (hotness,) if hotness != 1 else ()

    def read_batch(self, batch_index: int) -> List[np.ndarray]:
        """Raw arrays of one batch: labels [n], numericals [n, n_num] (if any), a subclass's extra
        columns [n] (`_extra_dtypes`), then one
        [features, rows] (or [features, rows, h]) block per categorical group. Bad data raises
        DataError."""
        arrays, error = self._read(batch_index)
        if error is not None:
            raise error
        return arrays

    def check_every_batch(self) -> None:
        """Read every batch once, each checked as read: the up-front scan of a whole mapping
        (`--validate_data`); DataError naming the first culprit."""
        for index in range(len(self)):
            self.read_batch(index)

    def read_samples(self, batch_index: int) -> Samples:
        """One batch as `SplitBinaryWriter.append` takes it: numericals [n, n_num] float16 (None
        without numerical features), labels [n] bool, one id array per feature read ([rows], or
        [rows, h] for a multi-hot feature). Bad data raises DataError."""
        arrays = self.read_batch(batch_index)
        labels, numerical = arrays[0], (arrays[1] if self.num_numerical else None)
        return numerical, labels, self.feature_ids(arrays)

    def feature_ids(self, arrays: Sequence[np.ndarray]) -> List[np.ndarray]:
        """The ids of `read_batch`'s `arrays` per feature read, in `categorical_features` order
        ([rows], or [rows, h] for a multi-hot feature): the groups' blocks are its last arrays."""
        ids: List[np.ndarray] = [np.empty(0)] * len(self.categorical_features)
        for (_, members), block in zip(self._groups, arrays[len(arrays) - len(self._groups):]):
            for position, row in zip(members, block):
                ids[position] = row
        return ids

    def batches(self) -> Iterator[Samples]:
        """Every batch in order, as `read_samples` gives it (what `dataloading.transcribe` copies)."""
        return (self.read_samples(index) for index in range(len(self)))

    def _read_and_file_error(self, batch_index: int) -> List[np.ndarray]:
        """`read_batch` for the pipeline: the arrays, then the number its DataError is filed
        under (0: none), so the pipeline fails with an assertion instead of a Python traceback."""
        arrays, error = self._read(batch_index)
        return [*arrays, file_pipeline_error(error)]

    def _static_sizes(self) -> Tuple[Optional[int], Optional[int]]:
        """Rows of the element's labels and of its ids, when every batch has them (else None)."""
        if not self.drop_remainder:
            return None, None
        lo, hi = local_slice(self.global_batch_size, self.rank, self.world_size)
        return hi - lo, (self.global_batch_size if self.reads.global_batch else hi - lo)

    def _decode(self, raw: Sequence[tf.Tensor]):
        """Graph-side decoding of `read_batch`'s arrays into the (features, labels) element."""
        local_size, categorical_size = self._static_sizes()
        labels = tf.reshape(tf.cast(raw[0], tf.float32), [-1, 1])
        labels.set_shape([local_size, 1])
        if self.num_numerical:
            numerical = tf.cast(raw[1], self.numerical_dtype)
        else:
            numerical = tf.zeros([tf.shape(labels)[0], 0], self.numerical_dtype)
        numerical.set_shape([local_size, self.num_numerical])
        categorical: List[Optional[tf.Tensor]] = [None] * len(self.categorical_features)
        blocks = raw[len(raw) - len(self._groups):]
        for (_, members), block in zip(self._groups, blocks):
            for position, ids in zip(members, tf.unstack(tf.cast(block, tf.int32), num=len(members))):
                hotness = self.hotness[position]
                ids.set_shape([categorical_size] + ([hotness] if hotness != 1 else []))
                categorical[position] = ids
        features = {NUMERICAL_KEY: numerical, CATEGORICAL_KEY: tuple(categorical)}
        return features, labels

    def dataset(self, shuffle_batch_order: bool = False, seed: int = 0) -> tf.data.Dataset:
        """One epoch of batches; iterate it again for the next epoch (reshuffled when enabled)."""
        order = tf.data.Dataset.range(self.num_batches)
        if shuffle_batch_order:
            order = order.shuffle(max(self.num_batches, 1), seed=seed, reshuffle_each_iteration=True)
        options = tf.data.Options()
        options.deterministic = True
        return (order.map(self._load_batch, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
                .prefetch(PREFETCH_BATCHES).with_options(options))

    def _raw_types(self) -> List[tf.DType]:
        """The dtypes of `_read`'s arrays: labels, numericals (if any), a subclass's extra columns
        (`_extra_dtypes`, before the blocks, which `_decode` leaves out), the groups' blocks."""
        return ([tf.bool] + ([tf.as_dtype(self._numerical_stored)] if self.num_numerical else [])
                + [tf.as_dtype(dtype) for dtype in self._extra_dtypes]
                + [tf.as_dtype(dtype) for dtype, _ in self._groups])

    def _load_batch(self, batch_index: tf.Tensor):
        """The (features, labels) element of global batch `batch_index`, read by `_read` in Python."""
        *raw, error_number = tf.numpy_function(self._read_and_file_error, [batch_index],
                                               self._raw_types() + [tf.int64], stateful=False)
        with tf.control_dependencies([pipeline_error_check(error_number)]):
            return self._decode([tf.identity(array) for array in raw])
