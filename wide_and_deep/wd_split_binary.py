"""Wide & Deep split-binary data (`--dataset_type split_binary`): DLRM's split-binary convention described
by a feature spec, and its converter from the W&D TFRecords.

The layout (feature_spec.py's conventions; mapping `test` is W&D's eval split):

    <folder>/feature_spec.yaml
    <folder>/<mapping>/label.bin       bool, one byte per row, 0 or 1
    <folder>/<mapping>/numerical.bin   float32 [rows, 13], features.NUMERIC_FEATURES order (float32, not
                                       DLRM's float16, so that the rows equal the TFRecords' bit for bit)
    <folder>/<mapping>/cat_<i>.bin     categorical i of features.CATEGORICAL_NAMES, the narrowest int type
                                       of its buckets (the spec's cardinality)
    <folder>/<mapping>/display_id.bin  int64; no model input, so in no channel: the spec's metadata entry
                                       `wide_and_deep_display_id` names the file of each mapping

The spec's feature names, order and cardinalities must be W&D's (features.py). Rows are stored in the
TFRecords' record order (file order, then row order), so record i, rows [4096 i, 4096 (i + 1)), is the
same rows in both formats: the same record shares (wd_data) read the same batches and train the same
weights. A rank reads its records' row ranges from every file with positioned reads and checks their
values (data_errors: labels 0 or 1, finite numericals, ids inside the buckets), naming file, feature and row.

The converter, `convert` (the command: `python -m wide_and_deep.to_split_binary --transformed_metadata_path
SRC --output_path DST`), reads the TFRecords (metadata.json, `SRC/train/part*` and `SRC/eval/part*` unless the patterns are given)
through their reader and writes the whole folder or nothing; an existing DST is refused.
"""
from __future__ import annotations

import os
from typing import Any, Dict, Iterator, List, Mapping, Sequence

import numpy as np
import tensorflow as tf

from recsys.data import data_errors
from recsys.data import data_formats
from recsys.data import feature_spec as fs
from recsys.data.data_errors import DataError
from recsys.data.pipeline_errors import file_pipeline_error, pipeline_error_check
from wide_and_deep import features as F
from wide_and_deep import wd_data

DISPLAY_ID_ENTRY = "wide_and_deep_display_id"
NUMERICAL_DTYPE = "float32"
MAPPINGS = {"train": fs.TRAIN_MAPPING, "eval": fs.TEST_MAPPING}  # W&D split -> spec mapping


def layout_spec(folder: str, buckets: Dict[str, int]) -> fs.FeatureSpec:
    """The spec of a W&D split-binary dataset in `folder` (the files' names and dtypes above) whose
    categoricals have `buckets` (their cardinalities)."""
    features: Dict[str, Dict[str, Any]] = {
        name: {fs.DTYPE_SELECTOR: fs.get_categorical_feature_type(buckets[name]), fs.CARDINALITY_SELECTOR: buckets[name]}
        for name in F.CATEGORICAL_NAMES}
    features.update({name: {fs.DTYPE_SELECTOR: NUMERICAL_DTYPE} for name in F.NUMERIC_FEATURES})
    features[F.LABEL_KEY] = {fs.DTYPE_SELECTOR: fs.LABEL_DTYPE}
    sources = {}
    for mapping in fs.MAPPINGS:
        chunks = [{fs.TYPE_SELECTOR: fs.SPLIT_BINARY, fs.FEATURES_SELECTOR: list(F.NUMERIC_FEATURES),
                   fs.FILES_SELECTOR: [f"{mapping}/numerical.bin"]},
                  {fs.TYPE_SELECTOR: fs.SPLIT_BINARY, fs.FEATURES_SELECTOR: [F.LABEL_KEY],
                   fs.FILES_SELECTOR: [f"{mapping}/label.bin"]}]
        chunks += [{fs.TYPE_SELECTOR: fs.SPLIT_BINARY, fs.FEATURES_SELECTOR: [name],
                    fs.FILES_SELECTOR: [f"{mapping}/cat_{i}.bin"]} for i, name in enumerate(F.CATEGORICAL_NAMES)]
        sources[mapping] = chunks
    channels = {fs.CATEGORICAL_CHANNEL: list(F.CATEGORICAL_NAMES), fs.NUMERICAL_CHANNEL: list(F.NUMERIC_FEATURES),
                fs.LABEL_CHANNEL: [F.LABEL_KEY]}
    metadata = {DISPLAY_ID_ENTRY: {mapping: f"{mapping}/display_id.bin" for mapping in fs.MAPPINGS}}
    return fs.FeatureSpec(features, sources, channels, metadata, base_directory=folder)


def load_spec(folder: str, spec_file_name: str, options: Mapping[str, Any]) -> fs.FeatureSpec:
    """The format's load_spec: `<folder>/<spec_file_name>`, checked as split-binary with float32
    numericals, holding W&D's features (their cardinalities size the tables) and a display-id file per
    mapping inside the folder."""
    spec = fs.FeatureSpec.from_yaml(os.path.join(folder, spec_file_name))
    spec.check_feature_spec(allowed_by=None, numerical_dtype=NUMERICAL_DTYPE)
    where = spec.path
    expected = layout_spec(folder, dict(zip(spec.categorical_names, spec.cardinalities)))  # the tables' buckets
    for channel in fs.CHANNELS:
        if spec.channel_spec[channel] != expected.channel_spec[channel]:
            raise fs.FeatureSpecError(f"{where}: channel '{channel}' must list Wide & Deep's features "
                                      f"{expected.channel_spec[channel]}, got {spec.channel_spec[channel]}")
    files = spec.metadata.get(DISPLAY_ID_ENTRY)
    if not isinstance(files, dict) or set(files) != set(fs.MAPPINGS) or not all(
            isinstance(path, str) and not fs.is_external_path(path) for path in files.values()):
        raise fs.FeatureSpecError(f"{where}: metadata '{DISPLAY_ID_ENTRY}' must map each of {list(fs.MAPPINGS)} "
                                  f"to its display_id file inside {spec.base_directory}, got {files!r}")
    return spec


class BinarySplit:
    """One split of a W&D split-binary dataset, a `wd_data.Split`: records of 4096 rows read from
    every file with positioned reads, checked, as the batch dict."""

    def __init__(self, spec: fs.FeatureSpec, split: str) -> None:
        self.mapping = MAPPINGS[split]
        self.buckets = dict(zip(spec.categorical_names, spec.cardinalities))
        self.rows = spec.check_files([self.mapping])[self.mapping]
        self.paths = {name: spec.file_of(self.mapping, name) for name in
                      (F.LABEL_KEY, F.NUMERIC_FEATURES[0], *F.CATEGORICAL_NAMES)}
        self.paths[F.DISPLAY_ID_KEY] = spec.resolve(spec.metadata[DISPLAY_ID_ENTRY][self.mapping])
        self.dtypes = {name: spec.dtype_of(name) for name in (F.LABEL_KEY, *F.CATEGORICAL_NAMES)}
        self.dtypes[F.NUMERIC_FEATURES[0]] = np.dtype((np.float32, len(F.NUMERIC_FEATURES)))
        self.dtypes[F.DISPLAY_ID_KEY] = np.dtype(np.int64)
        display_path = self.paths[F.DISPLAY_ID_KEY]
        problem = fs.file_kind_problem(display_path)
        if problem or os.path.getsize(display_path) != 8 * self.rows:
            raise DataError(f"{display_path}: the display_id file of mapping '{self.mapping}' "
                            f"{problem or f'must hold {self.rows} int64 values, one per row of label.bin'}")
        self.fds = {name: os.open(path, os.O_RDONLY) for name, path in self.paths.items()}

    def __len__(self) -> int:
        return -(-self.rows // F.PREBATCH_SIZE)

    def _read_record(self, name: str, record: int) -> np.ndarray:
        start = record * F.PREBATCH_SIZE
        count = min(F.PREBATCH_SIZE, self.rows - start)
        dtype = self.dtypes[name]
        raw = os.pread(self.fds[name], count * dtype.itemsize, start * dtype.itemsize)
        if len(raw) != count * dtype.itemsize:
            raise data_errors.truncated_error(self.paths[name], start * dtype.itemsize + len(raw))
        return np.frombuffer(raw, dtype)

    def _check(self, record: int, labels: np.ndarray, numeric: np.ndarray, ids: np.ndarray,
               cardinalities: np.ndarray) -> None:
        first = record * F.PREBATCH_SIZE
        data_errors.check_labels(labels, self.paths[F.LABEL_KEY], F.LABEL_KEY, self.mapping, first)
        if not np.isfinite(numeric).all():
            row, column = (int(i) for i in np.argwhere(~np.isfinite(numeric))[0])
            raise data_errors.numerical_error(self.paths[F.NUMERIC_FEATURES[0]], F.NUMERIC_FEATURES[column],
                                              self.mapping, first + row, numeric[row, column])
        data_errors.check_ids(ids, cardinalities, [self.paths[n] for n in F.CATEGORICAL_NAMES],
                              F.CATEGORICAL_NAMES, self.mapping, first)

    def read(self, records: np.ndarray, buckets: Dict[str, int]):
        """The rows of `records`, in order: (categorical, numeric, label, display_id, row, error number)."""
        cardinalities = data_errors.unsigned_cardinalities([buckets[n] for n in F.CATEGORICAL_NAMES], np.int64)
        parts: List[List[np.ndarray]] = [[], [], [], [], []]
        try:
            for record in records:
                labels = self._read_record(F.LABEL_KEY, record)
                numeric = self._read_record(F.NUMERIC_FEATURES[0], record)
                ids = np.stack([self._read_record(n, record).astype(np.int64) for n in F.CATEGORICAL_NAMES])
                self._check(record, labels, numeric, ids, cardinalities)
                for part, values in zip(parts, (ids.T, numeric, labels.astype(np.float32),
                                                self._read_record(F.DISPLAY_ID_KEY, record),
                                                wd_data.row_ids(record, len(labels)))):
                    part.append(values)
        except DataError as error:
            empty = (np.zeros((0, len(F.CATEGORICAL_NAMES)), np.int64),
                     np.zeros((0, len(F.NUMERIC_FEATURES)), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int64), np.zeros(0, np.int64))
            return (*empty, file_pipeline_error(error))
        return (*(np.concatenate(part) for part in parts), file_pipeline_error(None))

    def dataset(self, groups: Iterator[np.ndarray], buckets: Dict[str, int]) -> tf.data.Dataset:
        """One batch per record group; bad data fails the batch (pipeline_errors.surface_data_errors)."""
        signature = (tf.TensorSpec([None, len(F.CATEGORICAL_NAMES)], tf.int64),
                     tf.TensorSpec([None, len(F.NUMERIC_FEATURES)], tf.float32), tf.TensorSpec([None], tf.float32),
                     tf.TensorSpec([None], tf.int64), tf.TensorSpec([None], tf.int64), tf.TensorSpec([], tf.int64))
        batches = tf.data.Dataset.from_generator(lambda: (self.read(g, buckets) for g in groups),
                                                 output_signature=signature)

        def to_dict(categorical, numeric, label, display_id, row, error):
            with tf.control_dependencies([pipeline_error_check(error)]):
                return {"categorical": tf.identity(categorical), "numeric": tf.identity(numeric),
                        "label": tf.identity(label), "display_id": tf.identity(display_id), "row": tf.identity(row)}
        return batches.map(to_dict).prefetch(2)


def open_split(spec: fs.FeatureSpec, split: str, options: Mapping[str, Any]) -> BinarySplit:
    """The format's reader: split "train" or "eval" of the dataset `spec` describes."""
    return BinarySplit(spec, split)


data_formats.register_format("split_binary", training=True, model="wide_and_deep", load_spec=load_spec,
                             reader=open_split, metadata_key=DISPLAY_ID_ENTRY)


def convert(source: str, destination: str, train_pattern: Sequence[str], eval_pattern: Sequence[str]) -> Dict[str, int]:
    """Write the W&D TFRecords of `source` (metadata.json, the files the patterns match) as a split-binary
    dataset in the new folder `destination`, whole or not at all; returns the rows per split."""
    from recsys.runtime.safe_io import atomic_directory, refuse_overlap

    refuse_overlap(destination, "--output_path", {"--transformed_metadata_path": source})
    options = {"train_data_pattern": list(train_pattern), "eval_data_pattern": list(eval_pattern)}
    splits = wd_data.open_splits("tfrecords", source, options)
    rows = {}
    with atomic_directory(destination) as staged:
        spec = layout_spec(staged, splits[0].buckets)
        for split, records in zip(wd_data.SPLITS, splits):
            rows[split] = _write_split(spec, MAPPINGS[split], records)
        spec.base_directory = destination
        spec.to_yaml(os.path.join(staged, fs.DEFAULT_SPEC_NAME))
    return rows


def _write_split(spec: fs.FeatureSpec, mapping: str, records: wd_data.Split) -> int:
    """Every record of `records` in order, appended to the mapping's files; returns the rows written."""
    os.makedirs(os.path.join(spec.base_directory, mapping))
    names = (F.LABEL_KEY, F.NUMERIC_FEATURES[0], *F.CATEGORICAL_NAMES)
    files = {name: open(spec.file_of(mapping, name), "wb") for name in names}
    files[F.DISPLAY_ID_KEY] = open(spec.resolve(spec.metadata[DISPLAY_ID_ENTRY][mapping]), "wb")
    written = 0
    try:
        for batch in records.dataset(iter(np.array_split(np.arange(len(records)), max(1, len(records) // 16))),
                                     records.buckets):
            files[F.LABEL_KEY].write(batch["label"].numpy().astype(np.bool_).tobytes())
            files[F.NUMERIC_FEATURES[0]].write(batch["numeric"].numpy().astype(np.float32).tobytes())
            for i, name in enumerate(F.CATEGORICAL_NAMES):
                files[name].write(batch["categorical"].numpy()[:, i].astype(spec.dtype_of(name)).tobytes())
            files[F.DISPLAY_ID_KEY].write(batch["display_id"].numpy().astype(np.int64).tobytes())
            written += len(batch["label"])
    finally:
        for f in files.values():
            f.close()
    return written

