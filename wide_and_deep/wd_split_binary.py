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
weights. Reading and writing are DLRM's (recsys/data/split_binary.py): record i is batch i of a
`SplitBinaryReader` with batches of 4096 rows (positioned reads of every file, values checked as DLRM's:
labels 0 or 1, finite numericals, ids inside the spec's cardinalities, naming file, feature and row), the
display ids its `ExtraColumn`; the converter appends through a `SplitBinaryWriter`. What stays here is W&D's:
the spec's layout, the display-id entry, the `wd_data.Split` contract, the converter's orchestration.

The converter, `convert` (the command: `python -m wide_and_deep.to_split_binary --transformed_metadata_path
SRC --output_path DST`), reads the TFRecords (metadata.json, `SRC/train/part*` and `SRC/eval/part*` unless the patterns are given)
through their reader and writes the whole folder or nothing; an existing DST is refused.
"""
from __future__ import annotations

import os
from typing import Any, Dict, Iterator, List, Mapping, Sequence

import numpy as np
import tensorflow as tf

from recsys.data import data_formats
from recsys.data import feature_spec as fs
from recsys.data.data_errors import DataError
from recsys.data.pipeline_errors import file_pipeline_error, pipeline_error_check
from recsys.data.split_binary import ExtraColumn, SplitBinaryReader, SplitBinaryWriter
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


def display_id_column(spec: fs.FeatureSpec) -> ExtraColumn:
    """The display ids as the shared reader and writer's extra column: int64, the files the spec's
    metadata entry names."""
    return ExtraColumn(F.DISPLAY_ID_KEY, np.dtype(np.int64), spec.metadata[DISPLAY_ID_ENTRY])


class BinarySplit:
    """One split of a W&D split-binary dataset, a `wd_data.Split`: record i is batch i of the shared
    `SplitBinaryReader` with batches of 4096 rows (positioned reads of every file, checked, the
    display ids as its extra column), served as the batch dict."""

    def __init__(self, spec: fs.FeatureSpec, split: str) -> None:
        self.mapping = MAPPINGS[split]
        self.buckets = dict(zip(spec.categorical_names, spec.cardinalities))
        self.reader = SplitBinaryReader(spec, self.mapping, F.PREBATCH_SIZE, drop_remainder=False, read_op=False,
                                        extra_columns=[display_id_column(spec)])
        self.rows = self.reader.num_samples

    def __len__(self) -> int:
        return len(self.reader)

    def read(self, records: np.ndarray, buckets: Dict[str, int]):
        """The rows of `records`, in order: (categorical, numeric, label, display_id, row, error number).
        The ids are checked against the spec's cardinalities, the buckets its tables are built with."""
        parts: List[List[np.ndarray]] = [[], [], [], [], []]
        try:
            for record in records:
                arrays = self.reader.read_batch(int(record))
                labels, numeric, display_ids = arrays[:3]
                ids = np.stack(self.reader.feature_ids(arrays), axis=1).astype(np.int64)
                for part, values in zip(parts, (ids, numeric, labels.astype(np.float32), display_ids,
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
    dataset in the new folder `destination` with the shared `SplitBinaryWriter`, whole or not at all;
    returns the rows per split."""
    from recsys.runtime.safe_io import OutputPathError, refuse_overlap

    refuse_overlap(destination, "--output_path", {"--transformed_metadata_path": source})
    if os.path.lexists(destination):  # the converter never replaces a folder, not even an empty one
        raise OutputPathError(f"{os.path.abspath(destination)} already exists; refusing to overwrite it")
    options = {"train_data_pattern": list(train_pattern), "eval_data_pattern": list(eval_pattern)}
    splits = wd_data.open_splits("tfrecords", source, options)
    spec = layout_spec(destination, splits[0].buckets)
    rows = {}
    with SplitBinaryWriter(spec, output_name="--output_path", numerical_dtype=NUMERICAL_DTYPE,
                           extra_columns=[display_id_column(spec)]) as writer:
        for split, records in zip(wd_data.SPLITS, splits):
            rows[split] = _write_split(writer, MAPPINGS[split], records)
        writer.commit()
    return rows


def _write_split(writer: SplitBinaryWriter, mapping: str, records: wd_data.Split) -> int:
    """Every record of `records` in order, appended to the mapping's files; returns the rows written."""
    written = 0
    for batch in records.dataset(iter(np.array_split(np.arange(len(records)), max(1, len(records) // 16))),
                                 records.buckets):
        labels = batch["label"].numpy()
        writer.append(mapping, batch["numeric"].numpy(), labels, list(batch["categorical"].numpy().T),
                      extra={F.DISPLAY_ID_KEY: batch["display_id"].numpy()})
        written += len(labels)
    return written
