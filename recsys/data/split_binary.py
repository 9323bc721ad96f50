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
inside the pipeline into its own, `pipeline_errors.surface_data_errors` turns them back where batches
are consumed. It registers the `tf_raw` format (`data_formats`): training, transcribe source and
destination. Wide & Deep's split-binary files (`wide_and_deep/wd_split_binary.py`) are read and
written by the same classes: float32 numericals (Python reads) and its display ids as an
`ExtraColumn`. The shared data layer lives beside it: `data_errors` (DataError, the value checks),
`pipeline_errors`, `batch_reader.BatchReader`, `staged_writer.StagedWriter`, `batch.RaggedIds`.
"""
from __future__ import annotations

import os
import sys
import threading
import weakref
from dataclasses import dataclass
from typing import Any, BinaryIO, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from recsys.data.batch import CATEGORICAL_KEY, NUMERICAL_KEY, Ids, RaggedIds, TableReads, local_sizes, rank_start
from recsys.data.batch_reader import BatchReader, pread_into
from recsys.runtime.custom_ops import op_package
from recsys.data import data_formats
from recsys.data.data_errors import (DataError, check_ids, check_labels, check_numericals, id_error, label_error,
                         numerical_error, truncated_error, unsigned_cardinalities)
from recsys.data.feature_spec import (DEFAULT_SPEC_NAME, FEATURES_SELECTOR, FILES_SELECTOR, LABEL_DTYPE,
                          NUMERICAL_DTYPE, SPLIT_BINARY, FeatureSpec, file_kind_problem, load_folder_spec)
from recsys.data.pipeline_errors import file_read_tag
from recsys.runtime.safe_io import OutputPathError, check_replaceable
from recsys.data.staged_writer import StagedWriter

BUFFER_ALIGNMENT = 64  # TensorFlow adopts numpy buffers aligned to this without copying


@dataclass(frozen=True)
class ExtraColumn:
    """A per-row column that is no model input, stored beside a dataset's features: one file per
    mapping (relative to the spec's folder) of `dtype` values, one per row (Wide & Deep's display
    ids). The reader serves it unchecked after the numericals; the writer appends it."""
    name: str
    dtype: np.dtype
    files: Mapping[str, str]  # mapping -> file, relative to the spec's folder


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

    The numericals are read in the spec's dtype (float16; Wide & Deep's float32 only in Python, the
    op converts halves). `extra_columns` (Python reads only) adds one [rows] array per column of the
    local rows to `read_batch`'s arrays, after the numericals; the pipeline's element leaves them out.
    A file of one whose size is not one value per row is a DataError naming it.
    """

    def __init__(self, spec: FeatureSpec, mapping: str, global_batch_size: int, *,
                 rank: int = 0, world_size: int = 1,
                 reads: Optional[TableReads] = None, drop_remainder: bool = True,
                 numerical_dtype: tf.DType = tf.float32, num_samples: Optional[int] = None,
                 check_values: bool = True, read_op: Optional[bool] = None,
                 extra_columns: Sequence[ExtraColumn] = ()):
        self.mapping = mapping
        self.check_values = check_values
        self._numerical_stored = (spec.dtype_of(spec.numerical_names[0]) if spec.numerical_names
                                  else np.dtype(NUMERICAL_DTYPE))
        op_reads = self._numerical_stored == np.dtype(NUMERICAL_DTYPE) and not extra_columns
        if read_op and not op_reads:
            raise ValueError("the ReadFileRows op reads float16 numericals and no extra columns")
        self.read_op = op_reads and (op_package.is_built() if read_op is None else read_op)
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
        self._extra_columns = list(extra_columns)
        self._extra_dtypes = [np.dtype(column.dtype) for column in self._extra_columns]
        self._extra_paths = [spec.resolve(column.files[mapping]) for column in self._extra_columns]
        for column, path in zip(self._extra_columns, self._extra_paths):
            _check_column_file(column, path, mapping, spec.num_samples(mapping), self._label_path)
        self._fds = {path: os.open(path, os.O_RDONLY)
                     for path in [self._label_path, self._numerical_path, *self._categorical_paths,
                                  *self._extra_paths]
                     if path is not None}
        weakref.finalize(self, _close_all, list(self._fds.values()))

        largest_local = max(local_sizes(global_batch_size, world_size))
        largest_categorical = largest_local if not self.reads.global_batch else global_batch_size
        arena_bytes = (_round_up(largest_local)
                       + _round_up(largest_local * self.num_numerical * self._numerical_stored.itemsize)
                       + sum(_round_up(largest_local * dtype.itemsize) for dtype in self._extra_dtypes)
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
        numerical = (carve((local_rows, self.num_numerical), self._numerical_stored)
                     if self.num_numerical else None)
        extras = [carve((local_rows,), dtype) for dtype in self._extra_dtypes]
        blocks = [carve((len(members), categorical_rows) + self._id_shape(members), dtype)
                  for dtype, members in self._groups]
        arrays = [labels] + ([numerical] if numerical is not None else []) + extras + blocks
        try:
            self._pread(self._label_path, labels, local_first)
            if numerical is not None:
                self._pread(self._numerical_path, numerical, local_first)
            for path, extra in zip(self._extra_paths, extras):
                self._pread(path, extra, local_first)
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


def _check_column_file(column: ExtraColumn, path: str, mapping: str, rows: int, label_path: str) -> None:
    """DataError naming `path` unless it is a file of `rows` values of the column's dtype."""
    dtype = np.dtype(column.dtype)
    problem = file_kind_problem(path)
    if not problem and os.path.getsize(path) != dtype.itemsize * rows:
        problem = f"must hold {rows} {dtype} values, one per row of {os.path.basename(label_path)}"
    if problem:
        raise DataError(f"{path}: the {column.name} file of mapping '{mapping}' {problem}")


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


class SplitBinaryWriter(StagedWriter):
    """Writes one dataset folder (spec + train/test files), all or nothing.

    The files grow in a hidden temporary sibling of the destination (`safe_io.StagedDirectory`);
    `commit` writes the spec there and renames the folder into place. An exception in the `with`
    block (KeyboardInterrupt included), or leaving it without `commit`, deletes the temporary folder
    and leaves the destination as it was. A destination holding anything is refused unless
    `overwrite`, and even then when it holds entries the new dataset would not replace
    (`safe_io.check_replaceable`). `output_name` names the destination in errors (e.g. a flag).
    `numerical_dtype` is the numericals' stored dtype (float16; Wide & Deep's float32), and each of
    `extra_columns` gets one file per mapping, filled from `append`'s `extra`.
    """

    def __init__(self, spec: FeatureSpec, overwrite: bool = False,
                 spec_file_name: str = DEFAULT_SPEC_NAME, output_name: str = "output folder", *,
                 numerical_dtype: str = NUMERICAL_DTYPE, extra_columns: Sequence[ExtraColumn] = ()):
        self.spec = spec
        self.spec_file_name = spec_file_name
        self.numerical_dtype = np.dtype(numerical_dtype)
        self.extra_columns = list(extra_columns)
        self.destination = os.path.abspath(spec.base_directory)
        replace = self.check_destination(spec, overwrite, spec_file_name, output_name,
                                         numerical_dtype=numerical_dtype, extra_columns=extra_columns)
        self._relative_paths = _dataset_files(spec, extra_columns)
        super().__init__(self.destination, replace)

    @staticmethod
    def check_destination(spec: FeatureSpec, overwrite: bool = False,
                          spec_file_name: str = DEFAULT_SPEC_NAME,
                          output_name: str = "output folder", *, numerical_dtype: str = NUMERICAL_DTYPE,
                          extra_columns: Sequence[ExtraColumn] = ()) -> bool:
        """Raise unless the dataset of `spec` may be written to its folder; return whether that
        folder exists (it is then replaced). Callers may check before expensive work."""
        # among others: every file inside the folder, one file per chunk
        spec.check_feature_spec(numerical_dtype=numerical_dtype)
        entries = {relative.split(os.sep)[0] for relative in _dataset_files(spec, extra_columns)}
        if (spec_file_name in entries | {"", os.curdir, os.pardir}
                or os.path.basename(spec_file_name) != spec_file_name):
            raise OutputPathError(f"spec file name {spec_file_name!r} must be a plain file name that "
                                  f"no data file of the dataset uses")
        return check_replaceable(os.path.abspath(spec.base_directory), output_name,
                                 entries | {spec_file_name}, overwrite)

    def _file(self, mapping: str, feature: str) -> BinaryIO:
        return self._open(next(chunk[FILES_SELECTOR][0] for chunk in self.spec.source_spec[mapping]
                               if feature in chunk[FEATURES_SELECTOR]))

    def _open(self, relative: str) -> BinaryIO:
        """The staged file of `relative` (a path in the spec's folder), opened on first use."""
        relative = os.path.normpath(relative)
        if relative not in self._files:
            path = os.path.join(self._staging, relative)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            self._files[relative] = open(path, "wb")
        return self._files[relative]

    def append(self, mapping: str, numerical: np.ndarray, labels: np.ndarray,
               categoricals: Sequence[Ids], extra: Optional[Mapping[str, np.ndarray]] = None) -> None:
        """Append samples: numerical [n, n_num], labels [n] (0/1), one id array per categorical:
        [n] for a one-hot feature, [n, h] (or RaggedIds of exactly h ids per sample) for one of
        hotness h; another shape is a ValueError naming the feature. `extra`: each extra column's
        [n] values by its name."""
        spec = self.spec
        labels = np.asarray(labels)
        fixed = [fixed_ids(ids, spec.values_per_sample(name), name, len(labels))
                 for name, ids in zip(spec.categorical_names, categoricals, strict=True)]
        columns = [np.asarray((extra or {})[column.name], dtype=column.dtype) for column in self.extra_columns]
        for column, values in zip(self.extra_columns, columns):
            if values.shape != labels.shape:
                raise ValueError(f"column '{column.name}' needs values of shape {list(labels.shape)}, "
                                 f"got {list(values.shape)}")
        for column, values in zip(self.extra_columns, columns):
            values.tofile(self._open(column.files[mapping]))
        if spec.numerical_names:
            numerical = np.ascontiguousarray(numerical, dtype=self.numerical_dtype)
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


def _dataset_files(spec: FeatureSpec, extra_columns: Sequence[ExtraColumn] = ()) -> List[str]:
    """The spec's data files and those of `extra_columns`, relative to its folder."""
    return sorted({os.path.normpath(chunk[FILES_SELECTOR][0])
                   for chunks in spec.source_spec.values() for chunk in chunks}
                  | {os.path.normpath(path) for column in extra_columns for path in column.files.values()})


def load_spec(dataset_path: Optional[str], spec_file_name: str, options: Mapping[str, Any]) -> FeatureSpec:
    """The split-binary spec of the folder (see `feature_spec.load_folder_spec` for `options`)."""
    return load_folder_spec("tf_raw", dataset_path, spec_file_name, SPLIT_BINARY, options)


def validate(spec: FeatureSpec, batches: Mapping[str, int]) -> None:
    """--validate_data: `validate_data` over the mappings of `batches`."""
    validate_data(spec, tuple(batches))


def transcribed_writer(spec: FeatureSpec, destination: str, prebatch_size: int, overwrite: bool,
                       spec_file_name: str, output_name: str) -> SplitBinaryWriter:
    """A writer of the default Criteo file layout of `spec`'s features (hotness, alpha and pooling
    kept) in `destination`, the source's metadata kept but for its format's own entries."""
    out = FeatureSpec.get_default_feature_spec(len(spec.numerical_names), spec.cardinalities,
                                               os.path.abspath(destination)).take_multi_hot_properties(spec)
    out.metadata = {key: value for key, value in spec.metadata.items() if key not in data_formats.metadata_keys()}
    return SplitBinaryWriter(out, overwrite, spec_file_name, output_name)


data_formats.register_format("tf_raw", training=True, source=True, destination=True, load_spec=load_spec,
                             reader=SplitBinaryReader, validate=validate, writer=transcribed_writer)
