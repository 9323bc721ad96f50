"""Split-binary reading and writing (reference §4.4-4.9); synthetic data lives in `synthetic_data`.

The reader serves one mapping (`train` or `test`) of a split-binary dataset as a tf.data
pipeline of prebatched reads: for batch k it `pread`s, from every file the rank needs, exactly
the bytes of that batch (the global batch of the categorical features it owns, its local slice
of the numerical features and labels), and converts them (float16 -> compute dtype, bool ->
float32, int8/int16 -> int32). The pipeline does this in the compiled `ReadFileRows` op, straight
into the batch's tensors; without the op library, and for `read_batch`, Python preads into a
recycled aligned arena and the graph converts.

Every batch's values are checked where they are read, at a cost of a few vectorised reductions:
label bytes are 0 or 1, numericals are finite, ids lie in [0, cardinality). A bad value stops the
pipeline with a DataError naming the file, feature, sample and value; since TensorFlow turns errors
inside the pipeline into its own, `surface_data_errors` turns them back where batches are consumed.
"""
from __future__ import annotations

import contextlib
import itertools
import math
import os
import re
import sys
import threading
import weakref
from dataclasses import dataclass
from typing import BinaryIO, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import tensorflow as tf

from batch import CATEGORICAL_KEY, NUMERICAL_KEY, TableReads, local_sizes, local_slice, rank_start
from custom_ops import op_package
from feature_spec import (DEFAULT_SPEC_NAME, FEATURES_SELECTOR, FILES_SELECTOR, LABEL_DTYPE,
                          NUMERICAL_DTYPE, FeatureSpec)
from safe_io import OutputPathError, StagedDirectory, check_replaceable

BUFFER_ALIGNMENT = 64  # TensorFlow adopts numpy buffers aligned to this without copying
PREFETCH_BATCHES = 2


class DataError(ValueError):
    """The data (not the spec) is unusable: bad stored values, a batch larger than the data, ..."""


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


# ------------------------------------------------------------------------------ value checks
# One contract for stored values, applied per batch by the reader and by the up-front scan.

def label_error(path: str, feature: str, mapping: str, sample: int, byte: int) -> DataError:
    return DataError(f"{path}: label '{feature}' (mapping '{mapping}') has byte {byte} at "
                     f"sample {sample}; a label must be stored as 0 or 1")


def numerical_error(path: str, feature: str, mapping: str, sample: int, value: np.float16) -> DataError:
    return DataError(f"{path}: numerical feature '{feature}' (mapping '{mapping}') is "
                     f"{value} at sample {sample}; numerical features must be finite")


def id_error(path: str, feature: str, mapping: str, sample: int, value: int, cardinality: int,
             position: int = 0, ids_in_sample: Optional[int] = None) -> DataError:
    """An id outside its table; for a multi-hot sample (`ids_in_sample` given), which of its ids
    (0-based `position`)."""
    which = f" (id {position + 1} of {ids_in_sample})" if ids_in_sample is not None else ""
    return DataError(f"{path}: feature '{feature}' (mapping '{mapping}') has id {value} at sample "
                     f"{sample}{which}, outside [0, {cardinality}) given by its cardinality")


def truncated_error(path: str, byte: int) -> DataError:
    return DataError(f"{path}: unexpected end of file at byte {byte}; the file was truncated while reading")


def check_labels(raw: np.ndarray, path: str, feature: str, mapping: str, first_sample: int) -> None:
    """Label bytes (bool or int8) are 0 or 1; any other byte (TensorFlow reads it as true) is a DataError."""
    raw = raw.reshape(-1).view(np.uint8)
    if raw.size and raw.max() > 1:
        index = int(np.flatnonzero(raw > 1)[0])
        raise label_error(path, feature, mapping, first_sample + index, raw[index])


def label_values(values: np.ndarray, path: str, mapping: str, first_sample: int, check: bool = True) -> np.ndarray:
    """Labels stored as numbers (int32 or float32 formats) as bool; with `check`, a value other
    than 0 or 1 is a DataError naming the file and sample."""
    labels = values == 1
    if check and not (labels | (values == 0)).all():
        row = int(np.flatnonzero(~(labels | (values == 0)))[0])
        raise DataError(f"{path}: label (mapping '{mapping}') is {values[row]} at sample {first_sample + row}; "
                        f"a label must be 0 or 1")
    return labels


_FLOAT16_MAGNITUDE = 0x7FFF
_FLOAT16_INF = 0x7C00  # magnitude bits at or above it: Inf or NaN


def check_numericals(values: np.ndarray, path: str, features: Sequence[str], mapping: str,
                     first_sample: int) -> None:
    """Numericals [samples, features] float16 are finite; NaN or Inf is a DataError."""
    bits = values.view(np.uint16)
    if bits.size and (bits & _FLOAT16_MAGNITUDE).max() >= _FLOAT16_INF:
        row, column = (int(i) for i in np.argwhere(~np.isfinite(values))[0])
        raise numerical_error(path, features[column], mapping, first_sample + row, values[row, column])


def unsigned_cardinalities(cardinalities: Sequence[int], dtype: np.dtype) -> np.ndarray:
    """Cardinalities in the unsigned type of `dtype`'s width, as `check_ids` compares them."""
    return np.asarray(cardinalities, dtype=f"u{np.dtype(dtype).itemsize}")


def check_ids(block: np.ndarray, cardinalities: np.ndarray, paths: Sequence[str],
              features: Sequence[str], mapping: str, first_sample: int,
              row_lengths: Optional[np.ndarray] = None) -> None:
    """Ids [features, samples] (or [features, samples, hotness]: every id of a multi-hot feature)
    lie in [0, cardinality) of their feature, else a DataError. Ragged ids are one feature's
    values [1, total ids] with their `row_lengths`, which place a bad id's sample.

    Read as unsigned, a negative id is huge, so one maximum per feature checks both bounds.
    """
    if not block.size:
        return
    per_sample = int(np.prod(block.shape[2:], dtype=np.int64))
    flat = block.reshape(len(block), -1)
    unsigned = flat.view(cardinalities.dtype)
    bad_features = np.flatnonzero(unsigned.max(axis=1) >= cardinalities)
    if bad_features.size:
        row = int(bad_features[0])
        index = int(np.flatnonzero(unsigned[row] >= cardinalities[row])[0])
        sample, position = divmod(index, per_sample)
        of = per_sample if per_sample != 1 else None
        if row_lengths is not None:
            ends = np.cumsum(row_lengths)
            sample = int(np.searchsorted(ends, index, side="right"))
            position, of = index - int(ends[sample] - row_lengths[sample]), int(row_lengths[sample])
        raise id_error(paths[row], features[row], mapping, first_sample + sample, flat[row, index],
                       cardinalities[row], position, of)


# Errors raised inside a tf.data pipeline reach the consumer as a TensorFlow error carrying a
# traceback (and TensorFlow logs it). So the reader files its DataError here under a number, makes
# the pipeline fail with an assertion naming that number, and `surface_data_errors` raises it again.
_PIPELINE_ERROR_TAG = "DLRM input data error #"
_PIPELINE_ERROR_PATTERN = re.compile(re.escape(_PIPELINE_ERROR_TAG) + r"\] \[(\d+)\]")
SERVING_INPUT_ERROR = "invalid serving input:"
_SERVING_ERROR_PATTERN = re.compile(re.escape(SERVING_INPUT_ERROR) + r"[^\n\]]*")
_pipeline_errors: Dict[int, DataError] = {}
_pipeline_error_numbers = itertools.count(1)
_pipeline_errors_lock = threading.Lock()
# The batch-read op (`ReadFileRows`) reports a bad value as numbers; the reader that made the op
# words the DataError, found by the number in the op's error tag.
_FILE_READ_TAG = "DLRM file read #"
_FILE_READ_PATTERN = re.compile(re.escape(_FILE_READ_TAG)
                                + r"(\d+)\] \[(\d+)\] \[(\w+)\] \[(-?\d+)\] \[(\d+)\] \[(-?\d+)\]")
# (read, what: label|finite|ids|eof, sample, column, value) -> the DataError it stands for
FileReadExplainer = Callable[[int, str, int, int, int], DataError]
_file_read_explainers: Dict[int, "weakref.WeakMethod[FileReadExplainer]"] = {}
_file_read_numbers = itertools.count(1)


def file_pipeline_error(error: Optional[DataError]) -> np.int64:
    """0 for no error, else the number under which `error` waits for `surface_data_errors`."""
    if error is None:
        return np.int64(0)
    with _pipeline_errors_lock:
        number = next(_pipeline_error_numbers)
        _pipeline_errors[number] = error
    return np.int64(number)


def pipeline_error_check(error_number: tf.Tensor) -> tf.Operation:
    """The graph-side half of `file_pipeline_error`: fails the pipeline (for `surface_data_errors`)
    when `error_number` is not 0."""
    return tf.debugging.Assert(tf.equal(error_number, 0), [_PIPELINE_ERROR_TAG, error_number])


def file_read_tag(explain: FileReadExplainer) -> str:
    """The `error_tag` of a `ReadFileRows` op whose failures `explain` (a bound method, held weakly) words."""
    with _pipeline_errors_lock:
        number = next(_file_read_numbers)
        _file_read_explainers[number] = weakref.WeakMethod(explain)
    return f"{_FILE_READ_TAG}{number}"


def _data_error_in(message: str) -> Optional[DataError]:
    """The DataError a TensorFlow error message stands for, if it stands for one."""
    read = _FILE_READ_PATTERN.search(message)
    if read:
        with _pipeline_errors_lock:
            explain = _file_read_explainers.get(int(read.group(1)), lambda: None)()
        if explain is not None:
            number, what, *values = read.groups()[1:]
            return explain(int(number), what, *(int(v) for v in values))
    filed = _PIPELINE_ERROR_PATTERN.search(message)
    if filed:
        with _pipeline_errors_lock:
            error = _pipeline_errors.pop(int(filed.group(1)), None)
        if error is not None:
            return error
    serving = _SERVING_ERROR_PATTERN.search(message)
    return DataError(serving.group(0)) if serving else None


@contextlib.contextmanager
def surface_data_errors() -> Iterator[None]:
    """Inside the block (or the decorated function), bad data found in a TensorFlow graph (the
    reader's value checks, a SavedModel's input asserts) is raised as the DataError it is, one
    line without TensorFlow's dump; other errors pass unchanged."""
    try:
        yield
    except tf.errors.InvalidArgumentError as error:
        data_error = _data_error_in(error.message)
        if data_error is None:
            raise
        raise data_error from None



class _ArenaPool:
    """Reusable aligned byte arenas, one per batch in flight.

    Fresh memory for every batch costs more (page faults and zeroing) than reading the batch
    from the page cache, so batches are read into recycled arenas. An arena is recycled only once
    no array viewing it is alive any more (TensorFlow holds the numpy arrays it adopted until it
    drops the tensors), which its reference count tells.
    """

    MAX_POOLED = 8

    def __init__(self, arena_bytes: int):
        self.arena_bytes = arena_bytes
        self._arenas: List[np.ndarray] = []
        self._lock = threading.Lock()

    def acquire(self) -> np.ndarray:
        with self._lock:
            for arena in self._arenas:
                # References: the pool's list, this loop variable and getrefcount's argument.
                if sys.getrefcount(arena) == 3:
                    return arena
            arena = np.empty(self.arena_bytes, dtype=np.uint8)
            if len(self._arenas) < self.MAX_POOLED:
                self._arenas.append(arena)
            return arena


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

    def __init__(self, num_samples: int, global_batch_size: int, *, rank: int, world_size: int,
                 reads: TableReads, drop_remainder: bool, numerical_dtype: tf.DType,
                 categorical_features: Sequence[str], num_numerical: int,
                 groups: Sequence[Tuple[np.dtype, List[int]]], hotness: Optional[Sequence[int]] = None):
        self.num_samples = num_samples
        self.global_batch_size = global_batch_size
        self.rank = rank
        self.world_size = world_size
        self.reads = reads
        self.drop_remainder = drop_remainder
        self.numerical_dtype = numerical_dtype
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
        """Raw arrays of one batch: labels [n], numericals [n, n_num] (if any), then one
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
        ids: List[np.ndarray] = [np.empty(0)] * len(self.categorical_features)
        for (_, members), block in zip(self._groups, arrays[len(arrays) - len(self._groups):]):
            for position, row in zip(members, block):
                ids[position] = row
        return numerical, labels, ids

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

    def _load_batch(self, batch_index: tf.Tensor):
        """The (features, labels) element of global batch `batch_index`, read by `_read` in Python."""
        raw_types = [tf.bool] + ([tf.float16] if self.num_numerical else [])
        raw_types += [tf.as_dtype(dtype) for dtype, _ in self._groups]
        *raw, error_number = tf.numpy_function(self._read_and_file_error, [batch_index],
                                               raw_types + [tf.int64], stateful=False)
        with tf.control_dependencies([pipeline_error_check(error_number)]):
            return self._decode([tf.identity(array) for array in raw])


class SplitBinaryReader(BatchReader):
    """Batches of one mapping of a split-binary dataset, as a rank needs them.

    The categorical features and rows of `reads` (`ShardingPlan.reads`; default: every feature,
    local rows) are read; numerical features and labels always for the rank's local slice.

    A feature of hotness h is stored as [samples, h] ids row-major and served as [b, h].
    The pipeline (`dataset`) reads each batch with the compiled `ReadFileRows` op when the op
    library is built (`read_op` None; True insists, False never): one op preads every file's rows
    straight into the batch's tensors, checking and converting each chunk while it is in cache.
    Otherwise, and for `read_batch`/`read_samples`, Python preads into one aligned arena: the
    labels, the numericals, and one block per categorical dtype and hotness ([features, rows]
    one-hot, [features, rows, h] multi-hot). With `check_values` (the default) every value read is
    checked, with the same rules and messages either way (`check_labels`, `check_numericals`,
    `check_ids`); turning it off only serves to measure what it costs.
    """

    def __init__(self, spec: FeatureSpec, mapping: str, global_batch_size: int, *,
                 rank: int = 0, world_size: int = 1,
                 reads: Optional[TableReads] = None, drop_remainder: bool = True,
                 numerical_dtype: tf.DType = tf.float32, num_samples: Optional[int] = None,
                 check_values: bool = True, read_op: Optional[bool] = None):
        self.mapping = mapping
        self.check_values = check_values
        self.read_op = op_package.is_built() if read_op is None else read_op
        reads = reads or TableReads.every_table(len(spec.categorical_names))
        reads.check(len(spec.categorical_names))
        names = spec.categorical_names
        categorical_features = [names[i] for i in reads.tables]
        hotness = [spec.values_per_sample(name) for name in categorical_features]
        # Categorical features grouped by dtype and hotness: {(dtype, h): [positions in categorical_features]}.
        grouped: Dict[Tuple[np.dtype, int], List[int]] = {}
        for position, name in enumerate(categorical_features):
            grouped.setdefault((spec.dtype_of(name), hotness[position]), []).append(position)
        super().__init__(num_samples if num_samples is not None else spec.check_files([mapping])[mapping],
                         global_batch_size, rank=rank, world_size=world_size, reads=reads,
                         drop_remainder=drop_remainder, numerical_dtype=numerical_dtype,
                         categorical_features=categorical_features, num_numerical=len(spec.numerical_names),
                         groups=[(dtype, members) for (dtype, _), members in grouped.items()], hotness=hotness)
        self.numerical_features = spec.numerical_names
        self.label_feature = spec.label_name

        self._label_path = spec.file_of(mapping, spec.label_name)
        self._numerical_path = (spec.file_of(mapping, spec.numerical_names[0])
                                if self.num_numerical else None)
        self._categorical_paths = [spec.file_of(mapping, name) for name in self.categorical_features]
        cardinalities = dict(zip(names, spec.cardinalities))
        self._categorical_cardinalities = [cardinalities[name] for name in self.categorical_features]
        self._categorical_dtypes = [tf.as_dtype(spec.dtype_of(name)) for name in self.categorical_features]
        self._group_cardinalities = [
            unsigned_cardinalities([cardinalities[self.categorical_features[p]] for p in members], dtype)
            for dtype, members in self._groups]
        self._fds = {path: os.open(path, os.O_RDONLY)
                     for path in [self._label_path, self._numerical_path, *self._categorical_paths]
                     if path is not None}
        weakref.finalize(self, _close_all, list(self._fds.values()))

        largest_local = max(local_sizes(global_batch_size, world_size))
        largest_categorical = largest_local if not self.reads.global_batch else global_batch_size
        arena_bytes = (_round_up(largest_local) + _round_up(largest_local * self.num_numerical * 2)
                       + sum(_round_up(len(members) * largest_categorical * self.hotness[members[0]] * dtype.itemsize)
                             for dtype, members in self._groups))
        self._pool = _ArenaPool(arena_bytes + BUFFER_ALIGNMENT)

    def _read(self, batch_index: int) -> Tuple[List[np.ndarray], Optional[DataError]]:
        local_first, local_rows, categorical_first, categorical_rows = self.rank_rows(batch_index)
        arena = self._pool.acquire()
        cursor = (-arena.ctypes.data) % BUFFER_ALIGNMENT  # the arena has that much slack

        def carve(shape: Tuple[int, ...], dtype: np.dtype) -> np.ndarray:
            nonlocal cursor
            nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
            view = arena[cursor:cursor + nbytes].view(dtype).reshape(shape)
            cursor += _round_up(nbytes)
            return view

        labels = carve((local_rows,), np.dtype(LABEL_DTYPE))
        numerical = (carve((local_rows, self.num_numerical), np.dtype(NUMERICAL_DTYPE))
                     if self.num_numerical else None)
        blocks = [carve((len(members), categorical_rows) + self._id_shape(members), dtype)
                  for dtype, members in self._groups]
        arrays = [labels] + ([numerical] if numerical is not None else []) + blocks
        try:
            self._pread(self._label_path, labels, local_first)
            if numerical is not None:
                self._pread(self._numerical_path, numerical, local_first)
            for (_, members), block in zip(self._groups, blocks):
                for row, position in zip(block, members):
                    self._pread(self._categorical_paths[position], row, categorical_first)
            if self.check_values:
                self._check(labels, numerical, blocks, local_first, categorical_first)
        except DataError as error:
            return arrays, error
        return arrays, None

    def _check(self, labels: np.ndarray, numerical: Optional[np.ndarray], blocks: List[np.ndarray],
               local_first: int, categorical_first: int) -> None:
        check_labels(labels, self._label_path, self.label_feature, self.mapping, local_first)
        if numerical is not None:
            check_numericals(numerical, self._numerical_path, self.numerical_features, self.mapping,
                             local_first)
        for (_, members), block, cardinalities in zip(self._groups, blocks, self._group_cardinalities):
            check_ids(block, cardinalities, [self._categorical_paths[p] for p in members],
                      [self.categorical_features[p] for p in members], self.mapping, categorical_first)

    def _pread(self, path: str, buffer: np.ndarray, first_sample: int) -> None:
        sample_bytes = buffer.nbytes // max(len(buffer), 1)
        pread_into(self._fds[path], path, buffer, first_sample * sample_bytes)

    def _load_batch(self, batch_index: tf.Tensor):
        """The element of global batch `batch_index`, read by the `ReadFileRows` op (if `read_op`)."""
        if not self.read_op:
            return super()._load_batch(batch_index)
        start = batch_index * self.global_batch_size
        size = tf.minimum(tf.cast(self.global_batch_size, tf.int64), self.num_samples - start)
        lo, hi = rank_start(self.rank, size, self.world_size), rank_start(self.rank + 1, size, self.world_size)
        categorical_lo, categorical_hi = (tf.constant(0, tf.int64), size) if self.reads.global_batch else (lo, hi)
        numbered = 1 + bool(self.num_numerical)
        first_rows = tf.stack([start + lo] * numbered + [start + categorical_lo] * len(self.categorical_features))
        num_rows = tf.stack([hi - lo] * numbered + [categorical_hi - categorical_lo] * len(self.categorical_features))
        values = op_package.read_file_rows(first_rows, num_rows, **self._read_op_attributes())
        local_size, categorical_size = self._static_sizes()
        labels = values[0]
        labels.set_shape([local_size, 1])
        if self.num_numerical:
            numerical = values[1]
        else:
            numerical = tf.zeros([tf.shape(labels)[0], 0], self.numerical_dtype)
        numerical.set_shape([local_size, self.num_numerical])
        categorical = []
        for ids, hotness in zip(values[numbered:], self.hotness):
            ids = tf.reshape(ids, [-1]) if hotness == 1 else ids
            ids.set_shape([categorical_size] + ([] if hotness == 1 else [hotness]))
            categorical.append(ids)
        return {NUMERICAL_KEY: numerical, CATEGORICAL_KEY: tuple(categorical)}, labels

    @property
    def _op_read_paths(self) -> List[str]:
        """The files of `ReadFileRows`' reads, in order: the labels, the numericals (if any), each feature's ids."""
        return [self._label_path] + ([self._numerical_path] if self.num_numerical else []) + self._categorical_paths

    def _read_op_attributes(self) -> dict:
        """What `ReadFileRows` reads from each of `_op_read_paths`: (width, stored, check, bound, output type)."""
        reads = [(1, tf.as_dtype(LABEL_DTYPE), "label", 0, tf.float32)]
        if self.num_numerical:
            reads.append((self.num_numerical, tf.float16, "finite", 0, self.numerical_dtype))
        for hotness, dtype, cardinality in zip(self.hotness, self._categorical_dtypes,
                                               self._categorical_cardinalities):
            reads.append((hotness, dtype, "ids", cardinality, tf.int32))
        widths, stored, checks, bounds, out = zip(*reads)
        if not self.check_values:
            checks = ["none"] * len(reads)
        return dict(paths=self._op_read_paths, row_widths=widths, stored_types=stored, checks=checks,
                    bounds=bounds, out_types=out, error_tag=file_read_tag(self._explain_read_error))

    def _explain_read_error(self, read: int, what: str, sample: int, column: int, value: int) -> DataError:
        """The DataError of a `ReadFileRows` failure of read `read` (an index into `_op_read_paths`)."""
        paths = self._op_read_paths
        if what == "eof":
            return truncated_error(paths[read], value)
        if what == "label":
            return label_error(paths[read], self.label_feature, self.mapping, sample, value)
        if what == "finite":
            return numerical_error(paths[read], self.numerical_features[column], self.mapping, sample,
                                   np.uint16(value).view(np.float16))
        feature = read - 1 - bool(self.num_numerical)
        return id_error(paths[read], self.categorical_features[feature], self.mapping, sample, value,
                        self._categorical_cardinalities[feature], column,
                        self.hotness[feature] if self.hotness[feature] != 1 else None)


def _round_up(nbytes: int) -> int:
    return -(-nbytes // BUFFER_ALIGNMENT) * BUFFER_ALIGNMENT


def _close_all(fds: Sequence[int]) -> None:
    for fd in fds:
        os.close(fd)


def _file_chunks(path: str, dtype: np.dtype, width: int,
                 chunk_bytes: int) -> Iterator[Tuple[int, np.ndarray]]:
    """(first sample, values [samples, width]) of a whole file, about `chunk_bytes` at a time."""
    sample_bytes = dtype.itemsize * width
    total = os.path.getsize(path) // sample_bytes
    step = max(1, chunk_bytes // sample_bytes)
    for start in range(0, total, step):
        count = min(step, total - start)
        values = np.fromfile(path, dtype=dtype, count=count * width, offset=start * sample_bytes)
        yield start, values.reshape(count, width)


def validate_data(spec: FeatureSpec, mappings: Sequence[str], chunk_bytes: int = 1 << 24) -> None:
    """Every stored value of `mappings` passes the reader's checks, read once before any training
    (labels, numericals, then ids); raise DataError naming the first culprit."""
    for mapping in mappings:
        path = spec.file_of(mapping, spec.label_name)
        for start, labels in _file_chunks(path, np.dtype(LABEL_DTYPE), 1, chunk_bytes):
            check_labels(labels, path, spec.label_name, mapping, start)
        if spec.numerical_names:
            path = spec.file_of(mapping, spec.numerical_names[0])
            for start, values in _file_chunks(path, np.dtype(NUMERICAL_DTYPE),
                                              len(spec.numerical_names), chunk_bytes):
                check_numericals(values, path, spec.numerical_names, mapping, start)
    validate_categorical_ids(spec, mappings, chunk_bytes)


def validate_categorical_ids(spec: FeatureSpec, mappings: Sequence[str],
                             chunk_bytes: int = 1 << 24) -> None:
    """Check every categorical id lies in [0, cardinality); raise DataError naming the culprit."""
    for mapping in mappings:
        for name, cardinality in zip(spec.categorical_names, spec.cardinalities):
            path = spec.file_of(mapping, name)
            dtype = spec.dtype_of(name)
            for start, ids in _file_chunks(path, dtype, spec.values_per_sample(name), chunk_bytes):
                check_ids(ids[None], unsigned_cardinalities([cardinality], dtype), [path],
                          [name], mapping, start)


# --------------------------------------------------------------------------- writing
class StagedWriter:
    """The all-or-nothing life of a writer whose files grow in a hidden temporary sibling of
    `destination` (`safe_io.StagedDirectory`): a subclass opens them in `_files` and its `commit`
    ends with `_publish` (rename into place); `abort`, also on leaving the `with` block without
    `commit` (an exception included), deletes the temporary folder."""

    def __init__(self, destination: str, replace: bool):
        self._files: Dict[str, BinaryIO] = {}
        self._staged: Optional[StagedDirectory] = StagedDirectory(destination, replace=replace)
        self._staging = self._staged.path

    def _publish(self) -> None:
        self._close_files()
        staged, self._staged = self._staged, None
        staged.publish()

    def abort(self) -> None:
        """Drop everything written so far (nothing once committed); the destination stays as it was."""
        self._close_files()
        if self._staged is not None:
            staged, self._staged = self._staged, None
            staged.discard()

    def _close_files(self) -> None:
        for handle in self._files.values():
            handle.close()

    def __enter__(self) -> "StagedWriter":
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        self.abort()


class SplitBinaryWriter(StagedWriter):
    """Writes one dataset folder (spec + train/test files), all or nothing.

    The files grow in a hidden temporary sibling of the destination (`safe_io.StagedDirectory`);
    `commit` writes the spec there and renames the folder into place. An exception in the `with`
    block (KeyboardInterrupt included), or leaving it without `commit`, deletes the temporary folder
    and leaves the destination as it was. A destination holding anything is refused unless
    `overwrite`, and even then when it holds entries the new dataset would not replace
    (`safe_io.check_replaceable`). `output_name` names the destination in errors (e.g. a flag).
    """

    def __init__(self, spec: FeatureSpec, overwrite: bool = False,
                 spec_file_name: str = DEFAULT_SPEC_NAME, output_name: str = "output folder"):
        self.spec = spec
        self.spec_file_name = spec_file_name
        self.destination = os.path.abspath(spec.base_directory)
        replace = self.check_destination(spec, overwrite, spec_file_name, output_name)
        self._relative_paths = _dataset_files(spec)
        super().__init__(self.destination, replace)

    @staticmethod
    def check_destination(spec: FeatureSpec, overwrite: bool = False,
                          spec_file_name: str = DEFAULT_SPEC_NAME,
                          output_name: str = "output folder") -> bool:
        """Raise unless the dataset of `spec` may be written to its folder; return whether that
        folder exists (it is then replaced). Callers may check before expensive work."""
        spec.check_feature_spec()  # among others: every file inside the folder, one file per chunk
        entries = {relative.split(os.sep)[0] for relative in _dataset_files(spec)}
        if (spec_file_name in entries | {"", os.curdir, os.pardir}
                or os.path.basename(spec_file_name) != spec_file_name):
            raise OutputPathError(f"spec file name {spec_file_name!r} must be a plain file name that "
                                  f"no data file of the dataset uses")
        return check_replaceable(os.path.abspath(spec.base_directory), output_name,
                                 entries | {spec_file_name}, overwrite)

    def _file(self, mapping: str, feature: str) -> BinaryIO:
        relative = os.path.normpath(next(chunk[FILES_SELECTOR][0]
                                         for chunk in self.spec.source_spec[mapping]
                                         if feature in chunk[FEATURES_SELECTOR]))
        if relative not in self._files:
            path = os.path.join(self._staging, relative)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            self._files[relative] = open(path, "wb")
        return self._files[relative]

    def append(self, mapping: str, numerical: np.ndarray, labels: np.ndarray,
               categoricals: Sequence[Ids]) -> None:
        """Append samples: numerical [n, n_num], labels [n] (0/1), one id array per categorical:
        [n] for a one-hot feature, [n, h] (or RaggedIds of exactly h ids per sample) for one of
        hotness h; another shape is a ValueError naming the feature."""
        spec = self.spec
        labels = np.asarray(labels)
        fixed = [fixed_ids(ids, spec.values_per_sample(name), name, len(labels))
                 for name, ids in zip(spec.categorical_names, categoricals, strict=True)]
        if spec.numerical_names:
            numerical = np.ascontiguousarray(numerical, dtype=NUMERICAL_DTYPE)
            numerical.tofile(self._file(mapping, spec.numerical_names[0]))
        labels.astype(LABEL_DTYPE).tofile(self._file(mapping, spec.label_name))
        for name, ids in zip(spec.categorical_names, fixed):
            ids.astype(spec.dtype_of(name)).tofile(self._file(mapping, name))

    def commit(self) -> str:
        """Complete the folder (empty files for mappings without samples, the spec), rename it
        into place; return the spec's final path."""
        self._close_files()
        for relative in self._relative_paths:
            staged = os.path.join(self._staging, relative)
            if not os.path.exists(staged):  # a mapping that received no samples
                os.makedirs(os.path.dirname(staged), exist_ok=True)
                open(staged, "wb").close()
        self.spec.to_yaml(os.path.join(self._staging, self.spec_file_name))
        self._publish()
        return os.path.join(self.destination, self.spec_file_name)


def fixed_ids(ids: Ids, hotness: int, feature: str, num_samples: int) -> np.ndarray:
    """`ids` of `num_samples` samples as [n] (hotness 1) or [n, hotness] for a fixed-hotness
    format; ValueError (DataError for ragged rows of another length) naming `feature` otherwise."""
    if isinstance(ids, RaggedIds):
        ids = ids.to_fixed(hotness, feature)
    ids = np.asarray(ids)
    expected = (num_samples,) + ((hotness,) if hotness != 1 else ())
    if ids.shape != expected:
        raise ValueError(f"feature '{feature}' (hotness {hotness}) needs ids of shape {list(expected)}, "
                         f"got {list(ids.shape)}")
    return ids


def _dataset_files(spec: FeatureSpec) -> List[str]:
    """The spec's data files, relative to its folder."""
    return sorted({os.path.normpath(chunk[FILES_SELECTOR][0])
                   for chunks in spec.source_spec.values() for chunk in chunks})
