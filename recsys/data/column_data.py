"""Datasets whose columns carry the feature spec's names: NVTabular's parquet output (`nvt`) and
TFRecords of one `tf.train.Example` per sample (`tfrecords_multihot`), the two other source types of
V5's `dataloading.transcribe` (V5 lists them but reads neither; reference §13.2).

Layout, for both: the dataset folder holds the feature spec (its features, cardinalities, hotness
and the split-binary dtypes a conversion writes; its source_spec is not read) and one folder per
mapping, `train/` and `test/` (link NVTabular's `valid/` as `test/`), holding the mapping's file
set: every `*.parquet` (nvt; NVTabular's `_metadata` and schema files are ignored) or every
`*.tfrecord`/`*.tfrecords` file (tfrecords_multihot), read in natural name order (part_2 before
part_10). Each sample has one value per feature, found by the spec's name:

- parquet: the label an integer, boolean or float column of 0/1; each numerical feature a number
  column (already transformed, as NVTabular's workflow writes it); each categorical feature an
  integer column (one id) or a list-of-integers column (multi-hot: 0 to hotness ids).
- TFRecords: the label an int64 list of one 0/1 value, each numerical feature a float list of one
  value, each categorical feature an int64 list of 0 to hotness ids.

`read_batches` serves `batch.Samples` of exactly the batch size (files are concatenated), every
value checked as it is read (labels 0 or 1, numericals finite in float16, ids in [0, cardinality),
at most hotness ids per sample); a bad value, a missing column or an unreadable file is one
DataError naming the file. One-hot features come as `[n]` int32, multi-hot ones as `RaggedIds`.
Both register as transcribe sources (`data_formats`).
"""
from __future__ import annotations

import functools
import glob
import os
import re
from typing import Any, Iterator, List, Mapping, Sequence, Tuple

import numpy as np

from recsys.data.batch import RaggedIds, Samples
from recsys.data.data_formats import register_format
from recsys.data.data_errors import DataError, check_numericals, id_error, label_values
from recsys.data.feature_spec import NUMERICAL_DTYPE, FeatureSpec

NVT = "nvt"
TFRECORDS_MULTIHOT = "tfrecords_multihot"
PATTERNS = {NVT: ("*.parquet",), TFRECORDS_MULTIHOT: ("*.tfrecord", "*.tfrecords")}
READ_ROWS = 65536  # samples decoded at a time from one file

# One file's samples: labels [n] bool, numericals [n, k] float16, one RaggedIds per categorical feature.
Columns = Tuple[np.ndarray, np.ndarray, List[RaggedIds]]


def load_spec(dataset_path: str, spec_name: str, options: Mapping[str, Any]) -> FeatureSpec:
    """The folder's spec, checked for its features (its files are not read: `mapping_files` finds
    them); no option is read."""
    spec = FeatureSpec.from_yaml(os.path.join(dataset_path, spec_name))
    spec.check_feature_spec(chunk_type=None)
    return spec


def _natural_key(path: str) -> List:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", os.path.basename(path))]


def mapping_files(dataset_type: str, root: str, mapping: str) -> List[str]:
    """The file set of one mapping in natural name order; DataError when there is none."""
    folder = os.path.join(root, mapping)
    files = sorted({path for pattern in PATTERNS[dataset_type] for path in glob.glob(os.path.join(folder, pattern))},
                   key=_natural_key)
    if not files:
        raise DataError(f"{folder}: a {dataset_type} dataset holds its '{mapping}' samples there as "
                        f"{' or '.join(PATTERNS[dataset_type])} files; found none")
    return files


def _check_ids(ids: RaggedIds, hotness: int, cardinality: int, path: str, feature: str, mapping: str,
               first: int) -> RaggedIds:
    """At most `hotness` ids per sample, each in [0, cardinality); the ids as int32."""
    long = np.flatnonzero(ids.row_lengths > hotness)
    if long.size:
        row = int(long[0])
        raise DataError(f"{path}: feature '{feature}' (mapping '{mapping}') has {ids.row_lengths[row]} ids at sample "
                        f"{first + row}; its hotness allows at most {hotness}")
    bad = np.flatnonzero((ids.values < 0) | (ids.values >= cardinality))
    if bad.size:
        position = int(bad[0])
        sample = int(np.searchsorted(np.cumsum(ids.row_lengths), position, side="right"))
        raise id_error(path, feature, mapping, first + sample, int(ids.values[position]), cardinality)
    return RaggedIds(ids.values.astype(np.int32), ids.row_lengths.astype(np.int64))


def _checked(spec: FeatureSpec, path: str, mapping: str, first: int, labels: np.ndarray,
             numericals: Sequence[np.ndarray], ids: Sequence[RaggedIds]) -> Columns:
    """One read's raw columns as checked Columns (errors name `path` and the sample)."""
    labels = label_values(np.asarray(labels), path, mapping, first)
    with np.errstate(over="ignore"):  # beyond float16's range is Inf, refused as not finite
        dense = np.stack([np.asarray(v, np.float64) for v in numericals], axis=1).astype(NUMERICAL_DTYPE) \
            if numericals else np.zeros((len(labels), 0), NUMERICAL_DTYPE)
    check_numericals(dense, path, spec.numerical_names, mapping, first)
    checked = [_check_ids(values, hotness, cardinality, path, name, mapping, first)
               for values, name, hotness, cardinality in zip(ids, spec.categorical_names, spec.hotness,
                                                             spec.cardinalities)]
    return labels, dense, checked


def _parquet_columns(spec: FeatureSpec, path: str, mapping: str) -> Iterator[Columns]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    names = [spec.label_name, *spec.numerical_names, *spec.categorical_names]
    try:
        handle = pq.ParquetFile(path)
        missing = [name for name in names if name not in handle.schema_arrow.names]
        if missing:
            raise DataError(f"{path}: the parquet file has no column for feature(s) {missing} of the feature spec")
        first = 0
        for batch in handle.iter_batches(batch_size=READ_ROWS, columns=names):
            columns = {name: batch.column(name) for name in names}
            for name, column in columns.items():
                if column.null_count:
                    raise DataError(f"{path}: column '{name}' (mapping '{mapping}') has missing values")
            ids = []
            for name in spec.categorical_names:
                column = columns[name]
                if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
                    lengths = np.diff(column.offsets.to_numpy())
                    values = column.flatten().to_numpy(zero_copy_only=False)
                else:
                    values, lengths = column.to_numpy(zero_copy_only=False), np.ones(len(column), np.int64)
                if values.size and not np.issubdtype(values.dtype, np.integer):
                    raise DataError(f"{path}: column '{name}' (mapping '{mapping}') holds {column.type}; "
                                    f"categorical ids must be integers")
                ids.append(RaggedIds(values.astype(np.int64), lengths.astype(np.int64)))
            yield _checked(spec, path, mapping, first, columns[spec.label_name].to_numpy(zero_copy_only=False),
                           [columns[name].to_numpy(zero_copy_only=False) for name in spec.numerical_names], ids)
            first += batch.num_rows
    except (pa.ArrowException, OSError) as error:
        raise DataError(f"{path}: cannot be read as parquet ({str(error).splitlines()[0]})") from None


def _tfrecord_columns(spec: FeatureSpec, path: str, mapping: str) -> Iterator[Columns]:
    import tensorflow as tf

    features = {spec.label_name: tf.io.FixedLenFeature([], tf.int64),
                **{name: tf.io.FixedLenFeature([], tf.float32) for name in spec.numerical_names},
                **{name: tf.io.RaggedFeature(tf.int64) for name in spec.categorical_names}}
    first = 0
    try:
        for records in tf.data.TFRecordDataset(path).batch(READ_ROWS):
            parsed = tf.io.parse_example(records, features)
            ids = [RaggedIds(parsed[name].flat_values.numpy(), parsed[name].row_lengths().numpy())
                   for name in spec.categorical_names]
            columns = _checked(spec, path, mapping, first, parsed[spec.label_name].numpy(),
                               [parsed[name].numpy() for name in spec.numerical_names], ids)
            yield columns
            first += len(columns[0])
    except (tf.errors.InvalidArgumentError, tf.errors.DataLossError) as error:
        reason = error.message.splitlines()[0]
        raise DataError(f"{path}: not TFRecords of one tf.train.Example per sample with the feature spec's "
                        f"features (label int64, numericals float, categoricals int64 lists): {reason}") from None


def _concatenate(parts: Sequence[Columns]) -> Columns:
    labels = np.concatenate([part[0] for part in parts])
    dense = np.concatenate([part[1] for part in parts])
    ids = [RaggedIds(np.concatenate([part[2][i].values for part in parts]),
                     np.concatenate([part[2][i].row_lengths for part in parts])) for i in range(len(parts[0][2]))]
    return labels, dense, ids


def _samples(spec: FeatureSpec, columns: Columns, lo: int, hi: int) -> Samples:
    """Samples [lo, hi) as the element transcribe writes: one-hot ids [n] int32, multi-hot RaggedIds."""
    labels, dense, ids = columns
    out = []
    for values, name, hotness in zip(ids, spec.categorical_names, spec.hotness):
        rows = values.rows(lo, hi)
        out.append(rows.to_fixed(1, name) if hotness == 1 else rows)
    return dense[lo:hi], labels[lo:hi], out


def read_batches(dataset_type: str, spec: FeatureSpec, mapping: str, batch_size: int,
                 keep_remainder: bool) -> Iterator[Samples]:
    """Batches of `batch_size` samples of one mapping, the files read one after another; with
    `keep_remainder` the last partial batch too. A mapping without a whole batch is a DataError."""
    reader = _parquet_columns if dataset_type == NVT else _tfrecord_columns
    pending: List[Columns] = []
    rows = served = 0
    for path in mapping_files(dataset_type, spec.base_directory, mapping):
        for columns in reader(spec, path, mapping):
            pending.append(columns)
            rows += len(columns[0])
            if rows >= batch_size:
                merged = _concatenate(pending)
                whole = rows - rows % batch_size
                for lo in range(0, whole, batch_size):
                    yield _samples(spec, merged, lo, lo + batch_size)
                    served += 1
                pending = [_samples_tail(merged, whole)] if rows > whole else []
                rows -= whole
    if not served and not keep_remainder:
        raise DataError(f"{os.path.join(spec.base_directory, mapping)}: mapping '{mapping}' holds no whole batch "
                        f"of --src_batch_size {batch_size} samples ({rows} samples)")
    if rows and keep_remainder:
        yield _samples(spec, _concatenate(pending), 0, rows)


def _samples_tail(columns: Columns, lo: int) -> Columns:
    """The Columns of samples [lo, end)."""
    labels, dense, ids = columns
    return labels[lo:], dense[lo:], [values.rows(lo, len(values)) for values in ids]


register_format("nvt", source=True, load_spec=load_spec, batches=functools.partial(read_batches, NVT))
register_format("tfrecords_multihot", source=True, load_spec=load_spec,
                batches=functools.partial(read_batches, TFRECORDS_MULTIHOT))
