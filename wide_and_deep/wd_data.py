"""Wide & Deep data: the reader contract of its dataset formats, the per-rank record shares, and the
reference's pre-batched TFRecords (reference §6, this project's layout in docs/architecture.md).

Every W&D format registers itself in `data_formats` with `model="wide_and_deep"` (wide_and_deep/main.py's
`--dataset_type` lists them; DLRM's lists do not), with two hooks:

- `load_spec(folder, spec_file_name, options)`: the format's checked description of the dataset in
  `folder` (--transformed_metadata_path): here metadata.json, for `split_binary` its feature spec.
- `reader(spec, split, options)` for split "train" or "eval": a `Split`, the split's rows as records
  of PREBATCH_SIZE rows (record i holds rows [4096 i, 4096 (i + 1)); only the last may be short),
  read by record number. `options` holds the flags a format may read (its `own_options`).

`open_splits` picks the format through the registry. This module's format, `tfrecords`: each
tf.train.Example holds up to PREBATCH_SIZE rows, one list per key of features.record_keys();
`<folder>/metadata.json` records each split's row count; the files (--train_data_pattern,
--eval_data_pattern) are indexed once (record offsets, from the 12-byte TFRecord headers), so every
rank reads only its own records with positioned reads. Every record's CRCs are checked as TensorFlow's
reader checks them (the length's when indexing, the data's when read), so damage is found, not trained on.
Records whose lists differ in length, ids outside a feature's buckets, NaN or Inf numericals (the DLRM
readers' `check_numericals`) and a key stored in another dtype fail the batch, before any step uses it,
with one DataError naming the file, the record (its number in the file) and the key or feature.

Record shares, the same for every format:

- train: each epoch's record order is a permutation drawn from (seed, epoch), the same on every rank;
  step k takes the next `records_per_step` records of it and rank r reads those at positions r, r + W,
  ... (disjoint shares; their union is the step's global batch, whatever W is). An epoch is the whole
  steps the records fill. The reference instead let every rank shuffle the files on its own and keep
  every W-th record, so its ranks' data overlapped. Training reads its epochs one after the other from
  one endless dataset (`train_record_stream`), as the reference repeated one: a dataset built anew at
  each epoch stalled its first step for about a second.
- eval: record i goes to rank i mod W, in file order, so every row is read once over all ranks
  (`--evaluate --benchmark`: pass after pass, from one endless dataset).

A batch is a dict: `categorical` int64 [B, 13] (features.CATEGORICAL_NAMES order), `numeric` float32
[B, 13] (features.NUMERIC_FEATURES order), `label` float32 [B], `display_id` int64 [B], `row` int64 [B]
(each row's identity, `row_ids`: what its dropout mask is drawn from). Bad data is a
`data_errors.DataError` naming the file (and the key or feature).
"""
from __future__ import annotations

import contextlib
import functools
import glob
import json
import os
import re
import struct
from dataclasses import dataclass
from typing import Any, Dict, Iterator, Generator, List, Mapping, Protocol, Sequence, Tuple

import numpy as np
import tensorflow as tf

from recsys.data import data_formats
from recsys.data.data_errors import DataError, check_numericals, damaged_record_error
from recsys.data.feature_spec import DEFAULT_SPEC_NAME
from recsys.data.pipeline_errors import file_pipeline_error, pipeline_error_check, surface_data_errors
from recsys.runtime.tracing import traced
from wide_and_deep import features as F
from wide_and_deep.preprocessing.tfrecord import masked_crc32c

MODEL = "wide_and_deep"
SPLITS = ("train", "eval")
METADATA = "metadata.json"
FORMAT = "wide_and_deep-tfrecords"
_HEADER = 12  # uint64 length + uint32 masked crc; the data is followed by a uint32 masked crc
# parse_example's report of a key stored in another dtype; its Name is the record's (`_RecordSource.read`)
_DTYPE_MISMATCH = re.compile(r"Name: (.*?), Key: (\w+), Index: \d+\.\s+Data types don't match\. "
                             r"Expected type: (\w+), Actual type: (\w+)")


class Split(Protocol):
    """One split of a W&D dataset as its format's `reader` serves it (see the module docstring)."""
    rows: int
    buckets: Dict[str, int]  # each categorical's hash buckets: its ids lie in [0, buckets), its tables' rows

    def __len__(self) -> int:
        """Records of up to PREBATCH_SIZE rows (only the last may be short)."""

    def dataset(self, groups: Iterator[np.ndarray], buckets: Dict[str, int]) -> tf.data.Dataset:
        """One batch per group of record numbers `groups` yields, the records' rows in group order."""


def open_splits(dataset_type: str, folder: str, options: Mapping[str, Any]) -> Tuple[Split, Split]:
    """The train and eval splits of the W&D dataset of format `dataset_type` described in `folder`
    (the registry's W&D format of that name); `options`: every flag a format may read."""
    data_format = data_formats.get(dataset_type, "training", model=MODEL)
    spec = data_format.load_spec(folder, DEFAULT_SPEC_NAME, options)
    return data_format.reader(spec, "train", options), data_format.reader(spec, "eval", options)


@dataclass(frozen=True)
class Metadata:
    train_rows: int
    eval_rows: int
    prebatch_size: int
    buckets: Dict[str, int]  # each categorical's hash buckets: its ids lie in [0, buckets), its tables' rows


@contextlib.contextmanager
def surface_record_errors() -> Generator[None, None, None]:
    """Inside the block, bad data found while batches are read is raised as one DataError: the errors
    a format files (pipeline_errors), a key stored in another dtype than the reader's, and the TFRecord
    checks' failed assertions (their first line)."""
    try:
        with surface_data_errors():
            yield
    except tf.errors.InvalidArgumentError as error:
        mismatch = _DTYPE_MISMATCH.search(error.message)
        if mismatch is not None:
            record, key, expected, actual = mismatch.groups()
            raise DataError(f"{record}: key '{key}' is stored as {actual} values; the reader expects "
                            f"{expected}") from None
        failed = re.search(r"assertion failed: \[([^\]]*)\] \[([^\]]*)\]", error.message.replace("\\'", "'"))
        if failed is None:
            raise
        raise DataError(f"bad training or eval record: {failed.group(1)}: {failed.group(2)}") from None


def read_metadata(folder: str) -> Metadata:
    """`<folder>/metadata.json`, checked: format, version, non-negative row counts, prebatch size 4096, and
    the optional `buckets` (every categorical's hash buckets, positive; absent: the reference's)."""
    path = os.path.join(folder, METADATA)
    try:
        with open(path) as f:
            raw = json.load(f)
    except (OSError, ValueError) as error:
        raise DataError(f"{path}: cannot read the dataset metadata ({error})") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT or raw.get("version") != 1:
        raise DataError(f"{path}: not a {FORMAT} version 1 metadata file")
    for key in ("train_rows", "eval_rows", "prebatch_size"):
        if not isinstance(raw.get(key), int) or raw[key] < 0:
            raise DataError(f"{path}: '{key}' must be a non-negative integer, got {raw.get(key)!r}")
    if raw["prebatch_size"] != F.PREBATCH_SIZE:
        raise DataError(f"{path}: prebatch_size {raw['prebatch_size']}, the reader expects {F.PREBATCH_SIZE}")
    buckets = raw.get("buckets", F.BUCKETS)
    if not isinstance(buckets, dict) or sorted(buckets) != sorted(F.CATEGORICAL_NAMES) or not all(
            isinstance(v, int) and v > 0 for v in buckets.values()):
        raise DataError(f"{path}: 'buckets' must map each of the {len(F.CATEGORICAL_NAMES)} categorical features "
                        f"({', '.join(F.CATEGORICAL_NAMES)}) to a positive integer, got {buckets!r}")
    return Metadata(raw["train_rows"], raw["eval_rows"], raw["prebatch_size"], dict(buckets))


def expand_patterns(patterns: Sequence[str], flag: str) -> List[str]:
    """The files the glob patterns match, sorted; none is an error naming the flag."""
    files = sorted({path for pattern in patterns for path in glob.glob(pattern) if os.path.isfile(path)})
    if not files:
        raise DataError(f"{flag} {' '.join(patterns)} matches no file")
    return files


@dataclass(frozen=True)
class RecordIndex:
    """A TFRecords split (a `Split`): where every record lies (file number, data offset and length, in
    file order) and how many rows they hold."""
    files: List[str]
    file_ids: np.ndarray
    offsets: np.ndarray
    lengths: np.ndarray
    rows: int
    buckets: Dict[str, int]
    split: str = "train"

    def __len__(self) -> int:
        return len(self.offsets)

    def dataset(self, groups: Iterator[np.ndarray], buckets: Dict[str, int]) -> tf.data.Dataset:
        """The batches of the record groups `groups` yields (one group per batch), parsed and prefetched."""
        source = _RecordSource(self)
        records = tf.data.Dataset.from_generator(lambda: (source.read(g) for g in groups),
                                                 output_signature=(tf.TensorSpec([None], tf.string),
                                                                   tf.TensorSpec([], tf.string),
                                                                   tf.TensorSpec([None], tf.int64),
                                                                   tf.TensorSpec([None], tf.string),
                                                                   tf.TensorSpec([], tf.string),
                                                                   tf.TensorSpec([], tf.int64)))
        return records.map(_parser(tuple(sorted(buckets.items()))), num_parallel_calls=2,
                           deterministic=True).prefetch(2)


def index_records(files: Sequence[str], rows: int, split: str, buckets: Dict[str, int]) -> RecordIndex:
    """Scan the record headers of `files` (each length checked against its CRC); their count must be
    ceil(rows / 4096) (metadata.json); `buckets`: metadata.json's."""
    file_ids, offsets, lengths = [], [], []
    for number, path in enumerate(files):
        first = len(offsets)
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            position = 0
            while position < size:
                header = os.pread(f.fileno(), _HEADER, position)
                if len(header) < _HEADER:
                    raise DataError(f"{path}: truncated TFRecord header at byte {position}")
                (length,) = struct.unpack("<Q", header[:8])
                if struct.unpack("<I", header[8:])[0] != masked_crc32c(header[:8]):
                    raise damaged_record_error(path, len(offsets) - first,
                                               f"its length at byte {position} does not match its CRC")
                end = position + _HEADER + length + 4
                if end > size:
                    raise DataError(f"{path}: the record at byte {position} runs past the end of the file")
                file_ids.append(number)
                offsets.append(position + _HEADER)
                lengths.append(length)
                position = end
    expected = -(-rows // F.PREBATCH_SIZE)
    if len(offsets) != expected:
        raise DataError(f"{split} files ({files[0]} ...) hold {len(offsets)} records; metadata.json's {split}_rows "
                        f"{rows} need {expected} of {F.PREBATCH_SIZE} rows")
    return RecordIndex(list(files), np.array(file_ids, np.int64), np.array(offsets, np.int64),
                       np.array(lengths, np.int64), rows, dict(buckets), split)


class _RecordSource:
    """Positioned reads of records from the index's files (descriptors opened once), CRC-checked."""

    def __init__(self, index: RecordIndex) -> None:
        self.index = index
        self.fds = [os.open(path, os.O_RDONLY) for path in index.files]
        # each record's number within its file: the record number less its file's first
        self.in_file = np.arange(len(index)) - np.searchsorted(index.file_ids, index.file_ids)

    def name(self, record: int) -> str:
        """Where record `record` lies, as error messages name it (as DLRM's readers do): '<file>: record
        <number in the file>'."""
        return f"{self.index.files[self.index.file_ids[record]]}: record {self.in_file[record]}"

    def read(self, records: np.ndarray) -> Tuple[np.ndarray, str, np.ndarray, np.ndarray, str, np.int64]:
        """The serialized records, where they lie (their files), their numbers, their names, the split,
        and 0; a record whose data does not match its CRC gives no records and the number of its
        DataError instead (`pipeline_errors`), so the batch fails before any step uses it."""
        index, serialized = self.index, []
        for r in records:
            framed = os.pread(self.fds[index.file_ids[r]], int(index.lengths[r]) + 4, int(index.offsets[r]))
            data = framed[:-4]
            if len(framed) != index.lengths[r] + 4 or struct.unpack("<I", framed[-4:])[0] != masked_crc32c(data):
                error = damaged_record_error(self.index.files[index.file_ids[r]], int(self.in_file[r]),
                                             "its data does not match its CRC")
                return (np.array([], dtype=object), "", np.array([], np.int64), np.array([], dtype=object),
                        index.split, file_pipeline_error(error))
            serialized.append(data)
        files = sorted({index.files[index.file_ids[r]] for r in records})
        return (np.array(serialized, dtype=object), "records of " + ", ".join(files), np.asarray(records, np.int64),
                np.array([self.name(r) for r in records], dtype=object), index.split, np.int64(0))


def train_steps_per_epoch(num_records: int, records_per_step: int) -> int:
    """Whole global steps one pass over the records fills (the remainder waits for a later epoch's order)."""
    return num_records // records_per_step


def epoch_order(num_records: int, seed: int, epoch: int) -> np.ndarray:
    """The record order of one training epoch: the same on every rank, different each epoch."""
    return np.random.default_rng([seed, epoch]).permutation(num_records)


def train_record_groups(num_records: int, records_per_step: int, rank: int, world_size: int, seed: int,
                        epoch: int, first_step: int) -> Iterator[np.ndarray]:
    """This rank's records for each step of `epoch` from `first_step` on."""
    order = epoch_order(num_records, seed, epoch)
    for step in range(first_step, train_steps_per_epoch(num_records, records_per_step)):
        yield order[step * records_per_step:(step + 1) * records_per_step][rank::world_size]


def train_record_stream(num_records: int, records_per_step: int, rank: int, world_size: int, seed: int,
                        epoch: int, first_step: int) -> Iterator[np.ndarray]:
    """This rank's records for each step from `first_step` of `epoch` on, epoch after epoch without end:
    the groups of one endless training dataset (the reference's repeated one), so no epoch boundary
    builds a dataset anew."""
    while True:
        yield from train_record_groups(num_records, records_per_step, rank, world_size, seed, epoch, first_step)
        epoch, first_step = epoch + 1, 0


def row_ids(record: int, rows: int) -> np.ndarray:
    """The identities of a record's rows (the batch key "row"): record number x PREBATCH_SIZE + the
    row's place in the record. The model draws a row's dropout mask from it and the step, so a row is
    dropped alike whichever rank reads it and wherever it sits in a batch."""
    return record * np.int64(F.PREBATCH_SIZE) + np.arange(rows, dtype=np.int64)


def eval_record_groups(num_records: int, records_per_rank_batch: int, rank: int,
                       world_size: int) -> Iterator[np.ndarray]:
    """This rank's eval records (i mod W == rank, in order) in batches; the last may be short."""
    mine = np.arange(rank, num_records, world_size)
    for start in range(0, len(mine), records_per_rank_batch):
        yield mine[start:start + records_per_rank_batch]


def endless_eval_record_groups(num_records: int, records_per_rank_batch: int, rank: int,
                               world_size: int) -> Iterator[np.ndarray]:
    """eval_record_groups pass after pass without end: the groups of `--evaluate --benchmark`'s one
    endless dataset."""
    while True:
        yield from eval_record_groups(num_records, records_per_rank_batch, rank, world_size)


def _numerical_error(values: np.ndarray, lengths: np.ndarray, names: np.ndarray, split: bytes) -> np.int64:
    """0 when the batch's numericals [rows, features] are finite, else the number of the DataError
    (`check_numericals`, DLRM's check) naming the first bad value's record (`names`; `lengths`: each
    record's rows), feature and row."""
    if np.isfinite(values).all():
        return np.int64(0)
    ends = np.cumsum(lengths)
    record = int(np.searchsorted(ends, np.argwhere(~np.isfinite(values))[0][0], side="right"))
    try:
        check_numericals(values[ends[record] - lengths[record]:ends[record]], names[record].decode(),
                         F.NUMERIC_FEATURES, split.decode(), 0)
    except DataError as error:
        return file_pipeline_error(error)
    return np.int64(0)


def _parse(serialized: tf.Tensor, where: tf.Tensor, numbers: tf.Tensor, names: tf.Tensor, split: tf.Tensor,
           error: tf.Tensor, buckets: Dict[str, int]) -> Dict[str, tf.Tensor]:
    """Records [R] (record numbers `numbers`, named `names`) -> the batch dict, with the CRC error
    `error` of the read, and the length, id-range and finite-numerical checks (messages name `where`,
    the records' files, or the record)."""
    spec = {key: tf.io.RaggedFeature(tf.int64 if dtype == "int64" else tf.float32)
            for key, dtype in F.record_keys().items()}
    parsed = tf.io.parse_example(serialized, spec, example_names=names)
    lengths = tf.cast(parsed[F.LABEL_KEY].row_lengths(), tf.int64)
    numeric = tf.stack([parsed[n].flat_values for n in F.NUMERIC_FEATURES], axis=1)
    checks = [pipeline_error_check(error),
              pipeline_error_check(tf.numpy_function(_numerical_error, [numeric, lengths, names, split], tf.int64,
                                                     stateful=False))]
    for key, values in parsed.items():
        checks.append(tf.debugging.Assert(tf.reduce_all(tf.equal(tf.cast(values.row_lengths(), tf.int64), lengths)),
                                          [where, f"record key '{key}': list length differs from 'label'"]))
    checks.append(tf.debugging.Assert(tf.reduce_all(lengths <= F.PREBATCH_SIZE),
                                      [where, f"a record holds more than {F.PREBATCH_SIZE} rows"]))
    ids = tf.stack([parsed[n].flat_values for n in F.CATEGORICAL_NAMES], axis=1)
    limits = tf.constant([[buckets[n] for n in F.CATEGORICAL_NAMES]], tf.int64)
    for i, name in enumerate(F.CATEGORICAL_NAMES):
        checks.append(tf.debugging.Assert(tf.reduce_all(ids[:, i] >= 0), [where, f"feature '{name}': negative id"]))
        checks.append(tf.debugging.Assert(tf.reduce_all(ids[:, i] < limits[:, i]),
                                          [where, f"feature '{name}': id beyond its {buckets[name]} buckets"]))
    with tf.control_dependencies(checks):
        return {"categorical": tf.identity(ids),
                "numeric": tf.identity(numeric),
                "label": tf.cast(parsed[F.LABEL_KEY].flat_values, tf.float32),
                "display_id": tf.identity(parsed[F.DISPLAY_ID_KEY].flat_values),
                "row": (tf.repeat(numbers * F.PREBATCH_SIZE, lengths) + tf.ragged.range(lengths).flat_values)}



def load_metadata(folder: str, spec_file_name: str, options: Mapping[str, Any]) -> Metadata:
    """The `tfrecords` format's load_spec: `<folder>/metadata.json` (the spec file name is DLRM's)."""
    return read_metadata(folder)


def open_tfrecords(metadata: Metadata, split: str, options: Mapping[str, Any]) -> RecordIndex:
    """The `tfrecords` format's reader: the files of `options["<split>_data_pattern"]`, indexed."""
    flag = f"{split}_data_pattern"
    return index_records(expand_patterns(options[flag], f"--{flag}"), getattr(metadata, f"{split}_rows"), split,
                         metadata.buckets)


data_formats.register_format("tfrecords", training=True, model="wide_and_deep",
                             own_options=("train_data_pattern", "eval_data_pattern"),
                             load_spec=load_metadata, reader=open_tfrecords)


@functools.lru_cache(maxsize=None)
def _parser(buckets: Tuple[Tuple[str, int], ...]):
    """_parse for these buckets as one function, traced once: each epoch's and evaluation's dataset reuses it
    (tracing it anew took about a second a dataset)."""
    return traced(lambda *read: _parse(*read, dict(buckets)),
                  input_signature=[tf.TensorSpec([None], tf.string), tf.TensorSpec([], tf.string),
                                   tf.TensorSpec([None], tf.int64), tf.TensorSpec([None], tf.string),
                                   tf.TensorSpec([], tf.string), tf.TensorSpec([], tf.int64)])
