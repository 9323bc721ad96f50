"""The split-TFRecords dataset of V5 (reference §13.2): one folder of prebatched records per feature.

Layout of a dataset folder (what `SplitTFRecordsWriter` writes and `SplitTFRecordsReader` reads):

    feature_spec.yaml               features with their stored dtypes, `source_spec: null`
    <mapping>/length.json           a JSON integer: the number of batches of the mapping (train, test)
    <mapping>/numerical/            all numerical features together
    <mapping>/label/
    <mapping>/categorical_<i>/      i: the feature's position in channel_spec's categorical list

Each feature folder holds `format.json`, a JSON object
`{"format": "tfrecords", "dtype": D, "multihot": false, "feature_name": "data", "num_features": K,
"batches_per_file": N}`, and the files `data_0.tfrecords`, `data_1.tfrecords`, ... read in that
order (this writer makes one file per folder). Every record is one prebatch of B samples: a
serialized `tf.train.Example` whose bytes feature `feature_name` holds one value, a serialized
`TensorProto` (what `tf.io.serialize_tensor` makes) of a [B, K] tensor of dtype D. Stored dtypes:
numerical float16 [B, n_num], label int8 [B, 1] (0 or 1), categorical int32 [B, 1] (V5 writes int32
whatever the cardinality). The reader also takes V5's [B] labels (any shape of B*K values), a bool
label, and int8/int16 ids; multi-hot (ragged) folders are refused.

Records are read in order, so the global batch must equal the prebatch size B. Every batch is
checked as it is read with the split-binary reader's checks (`datasets.check_labels`,
`check_numericals`, `check_ids`); a bad value, a corrupt or short file, or a record of the wrong
shape stops the pipeline with one DataError naming the file (see `datasets.surface_data_errors`).
"""
from __future__ import annotations

import copy
import json
import os
import re
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
from google.protobuf.message import DecodeError
from tensorflow.core.framework import tensor_pb2

from batch import CATEGORICAL_KEY, NUMERICAL_KEY, TableReads, local_slice
from datasets import (PREFETCH_BATCHES, DataError, Samples, check_ids, check_labels, check_numericals,
                      file_pipeline_error, pipeline_error_check, unsigned_cardinalities)
from feature_spec import (DEFAULT_SPEC_NAME, DTYPE_SELECTOR, MAPPINGS, NUMERICAL_DTYPE, FeatureSpec,
                          file_kind_problem)
from safe_io import OutputPathError, StagedDirectory, check_replaceable

FORMAT_FILE = "format.json"
LENGTH_FILE = "length.json"
NUMERICAL_FOLDER = "numerical"
LABEL_FOLDER = "label"
RECORD_FEATURE = "data"
STORED_LABEL_DTYPE = "int8"
STORED_CATEGORICAL_DTYPE = "int32"
_DATA_FILE = re.compile(r"data_(\d+)\.tfrecords")
# TensorFlow's record iterator (CRC-checked, ~25x faster per record than iterating a TFRecordDataset
# eagerly), unwrapped from its deprecation notice, which would print on the first call.
_tf_record_iterator = tf.compat.v1.io.tf_record_iterator.__wrapped__
_TF_NOISE = re.compile(r"\{\{.*?\}\}|\[Op:.*$")  # TensorFlow's function and op names around the reason
_READABLE_DTYPES = {NUMERICAL_FOLDER: ("float16",), LABEL_FOLDER: ("int8", "bool"),
                    "categorical": ("int8", "int16", "int32")}


def categorical_folder(index: int) -> str:
    """The folder of the categorical feature at position `index` of the channel."""
    return f"categorical_{index}"


def stored_spec(spec: FeatureSpec, destination: str) -> FeatureSpec:
    """The spec of `spec`'s data written as split-TFRecords in `destination`: the same features
    (other keys such as hotness kept) with the stored dtypes, no files (`source_spec: null`)."""
    features = copy.deepcopy(spec.feature_spec)
    for name in spec.categorical_names:
        features[name][DTYPE_SELECTOR] = STORED_CATEGORICAL_DTYPE
    for name in spec.numerical_names:
        features[name][DTYPE_SELECTOR] = NUMERICAL_DTYPE
    features[spec.label_name][DTYPE_SELECTOR] = STORED_LABEL_DTYPE
    return FeatureSpec(feature_spec=features, source_spec=None, channel_spec=copy.deepcopy(spec.channel_spec),
                       metadata=dict(spec.metadata), base_directory=os.path.abspath(destination))


# --------------------------------------------------------------------------- writing
class _FolderWriter:
    """One feature folder being written: its records, counted."""

    def __init__(self, folder: str, dtype: str, num_features: int):
        os.makedirs(folder)
        self.folder, self.dtype, self.num_features = folder, dtype, num_features
        self.batches = 0
        self._file = tf.io.TFRecordWriter(os.path.join(folder, "data_0.tfrecords"))

    def write(self, values: np.ndarray) -> None:
        """Append one prebatch [B, K] (or [B] when K is 1) as one record."""
        tensor = np.ascontiguousarray(values, dtype=self.dtype).reshape(len(values), self.num_features)
        value = tf.train.BytesList(value=[tf.io.serialize_tensor(tensor).numpy()])
        example = tf.train.Example(features=tf.train.Features(
            feature={RECORD_FEATURE: tf.train.Feature(bytes_list=value)}))
        self._file.write(example.SerializeToString())
        self.batches += 1

    def close_file(self) -> None:
        """Close the data file (again is harmless)."""
        self._file.close()

    def finish(self) -> None:
        """Close the data file and write `format.json`."""
        self.close_file()
        description = {"format": "tfrecords", "dtype": self.dtype, "multihot": False,
                       "feature_name": RECORD_FEATURE, "num_features": self.num_features,
                       "batches_per_file": self.batches}
        with open(os.path.join(self.folder, FORMAT_FILE), "w") as f:
            json.dump(description, f)


class SplitTFRecordsWriter:
    """Writes one split-TFRecords dataset folder, all or nothing (like `datasets.SplitBinaryWriter`).

    `append` takes exactly one prebatch of `prebatch_size` samples. The folder grows in a hidden
    sibling of `destination` and `commit` writes the lengths and the spec and renames it into
    place; leaving the `with` block without `commit` (an exception included) leaves the
    destination as it was. A destination holding anything is refused unless `overwrite`, and even
    then when it holds entries this dataset would not replace.
    """

    def __init__(self, spec: FeatureSpec, destination: str, prebatch_size: int, overwrite: bool = False,
                 spec_file_name: str = DEFAULT_SPEC_NAME, output_name: str = "output folder"):
        if prebatch_size < 1:
            raise ValueError(f"the prebatch size must be positive, got {prebatch_size}")
        if os.path.basename(spec_file_name) != spec_file_name or spec_file_name in (*MAPPINGS, "", ".", ".."):
            raise OutputPathError(f"spec file name {spec_file_name!r} must be a plain file name that no "
                                  f"data folder of the dataset uses")
        self.spec = stored_spec(spec, destination)
        self.spec.check_feature_spec(chunk_type=None)
        self.prebatch_size = prebatch_size
        self.spec_file_name = spec_file_name
        replace = check_replaceable(self.spec.base_directory, output_name, {*MAPPINGS, spec_file_name},
                                    overwrite)
        self._staged: Optional[StagedDirectory] = StagedDirectory(self.spec.base_directory, replace=replace)
        self._folders: Dict[str, List[_FolderWriter]] = {}

    def _writers(self, mapping: str) -> List[_FolderWriter]:
        """numerical, label, then one writer per categorical feature, created on first use."""
        if mapping not in self._folders:
            root = os.path.join(self._staged.path, mapping)
            spec = self.spec
            self._folders[mapping] = [
                _FolderWriter(os.path.join(root, NUMERICAL_FOLDER), NUMERICAL_DTYPE, len(spec.numerical_names)),
                _FolderWriter(os.path.join(root, LABEL_FOLDER), STORED_LABEL_DTYPE, 1),
                *(_FolderWriter(os.path.join(root, categorical_folder(i)), STORED_CATEGORICAL_DTYPE, 1)
                  for i in range(len(spec.categorical_names)))]
        return self._folders[mapping]

    def append(self, mapping: str, numerical: Optional[np.ndarray], labels: np.ndarray,
               categoricals: Sequence[np.ndarray]) -> None:
        """Append one prebatch: numerical [B, n_num], labels [B] (0/1), one id array [B] per categorical."""
        if mapping not in MAPPINGS:
            raise ValueError(f"mapping must be one of {list(MAPPINGS)}, got {mapping!r}")
        labels = np.asarray(labels)
        if len(labels) != self.prebatch_size:
            raise ValueError(f"a split-TFRecords record holds one prebatch of {self.prebatch_size} "
                             f"samples, got {len(labels)}")
        if numerical is None:
            numerical = np.zeros((len(labels), 0), NUMERICAL_DTYPE)
        numerical_writer, label_writer, *categorical_writers = self._writers(mapping)
        numerical_writer.write(numerical)
        label_writer.write(labels)
        for writer, ids in zip(categorical_writers, categoricals, strict=True):
            writer.write(np.asarray(ids))

    def commit(self) -> str:
        """Complete the folder (empty mappings included), write the spec, rename it into place;
        return the spec's final path."""
        for mapping in MAPPINGS:
            writers = self._writers(mapping)
            for writer in writers:
                writer.finish()
            with open(os.path.join(self._staged.path, mapping, LENGTH_FILE), "w") as f:
                json.dump(writers[0].batches, f)
        self.spec.to_yaml(os.path.join(self._staged.path, self.spec_file_name))
        staged, self._staged = self._staged, None
        staged.publish()
        return os.path.join(self.spec.base_directory, self.spec_file_name)

    def abort(self) -> None:
        """Drop everything written so far (nothing once committed)."""
        if self._staged is not None:
            for writers in self._folders.values():
                for writer in writers:
                    writer.close_file()
            staged, self._staged = self._staged, None
            staged.discard()

    def __enter__(self) -> "SplitTFRecordsWriter":
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        self.abort()


# --------------------------------------------------------------------------- reading
def _load_json(path: str, what: str) -> Any:
    problem = file_kind_problem(path)
    if problem:
        raise DataError(f"{path}: the {what} file {problem}")
    try:
        with open(path) as f:
            return json.load(f)
    except (ValueError, UnicodeDecodeError) as error:
        raise DataError(f"{path}: the {what} file is not valid JSON ({error})") from None


def read_length(mapping_dir: str) -> int:
    """The number of batches of a mapping, from its `length.json`."""
    path = os.path.join(mapping_dir, LENGTH_FILE)
    length = _load_json(path, "length")
    if isinstance(length, bool) or not isinstance(length, int) or length < 0:
        raise DataError(f"{path}: must hold a non-negative integer (the number of batches), got {length!r}")
    return length


class _FolderReader:
    """One feature folder: its `format.json` checked, its records read in order as [B, K] arrays."""

    def __init__(self, folder: str, kind: str, num_features: int, num_batches: int):
        self.folder = folder
        fmt_path = os.path.join(folder, FORMAT_FILE)
        if not os.path.isdir(folder):
            raise DataError(f"{folder}: feature folder not found (a split-TFRecords dataset has "
                            f"{NUMERICAL_FOLDER}/, {LABEL_FOLDER}/ and categorical_<i>/ per mapping)")
        fmt = _load_json(fmt_path, "format")
        if not isinstance(fmt, dict):
            raise DataError(f"{fmt_path}: must hold a JSON object, got {fmt!r}")
        if fmt.get("format") != "tfrecords":
            raise DataError(f"{fmt_path}: format {fmt.get('format')!r} is not supported (only 'tfrecords')")
        if fmt.get("multihot"):
            raise DataError(f"{fmt_path}: multi-hot (ragged) features are not supported yet")
        if fmt.get("dtype") not in _READABLE_DTYPES[kind]:
            raise DataError(f"{fmt_path}: dtype {fmt.get('dtype')!r} is not one of "
                            f"{list(_READABLE_DTYPES[kind])} for {kind} data")
        if fmt.get("num_features") != num_features:
            raise DataError(f"{fmt_path}: num_features {fmt.get('num_features')!r}, but the feature spec "
                            f"has {num_features}")
        self.feature_name = fmt.get("feature_name")
        if not isinstance(self.feature_name, str):
            raise DataError(f"{fmt_path}: feature_name must be a string, got {self.feature_name!r}")
        self.dtype = np.dtype(fmt["dtype"])
        self.num_features = num_features
        self.num_batches = num_batches
        numbered = sorted((int(m.group(1)), name) for name in os.listdir(folder)
                          if (m := _DATA_FILE.fullmatch(name)))
        if [k for k, _ in numbered] != list(range(len(numbered))):
            raise DataError(f"{folder}: data files must be data_0.tfrecords, data_1.tfrecords, ... without "
                            f"gaps, found {[name for _, name in numbered]}")
        self.paths = [os.path.join(folder, name) for _, name in numbered]
        for path in self.paths:
            problem = file_kind_problem(path)
            if problem:
                raise DataError(f"{path}: data file {problem}")

    def records(self, prebatch_size: Optional[int]) -> Iterator[Tuple[str, np.ndarray]]:
        """(file, [B, K] array) per record, exactly `num_batches` of them; B is checked against
        `prebatch_size` (None: the first record's; K must then be positive)."""
        count = 0
        for path in self.paths:
            for record in self._file_records(path):
                if count == self.num_batches:
                    raise DataError(f"{path}: the folder holds more than the {self.num_batches} batches "
                                    f"that {LENGTH_FILE} gives")
                values = self._decode(path, count, record)
                if prebatch_size is None:
                    prebatch_size = values.size // self.num_features
                if values.size != prebatch_size * self.num_features:
                    raise DataError(f"{path}: batch {count} holds {values.size} values, not a prebatch of "
                                    f"{prebatch_size} samples x {self.num_features} features")
                count += 1
                yield path, values.reshape(prebatch_size, self.num_features)
        if count < self.num_batches:
            raise DataError(f"{self.paths[-1] if self.paths else self.folder}: the folder holds {count} "
                            f"batches, but {LENGTH_FILE} gives {self.num_batches}; a file is missing or "
                            f"truncated")

    @staticmethod
    def _file_records(path: str) -> Iterator[bytes]:
        try:
            yield from _tf_record_iterator(path)
        except tf.errors.OpError as error:
            reason = _TF_NOISE.sub("", error.message.splitlines()[0]).strip()
            raise DataError(f"{path}: corrupt or truncated TFRecord file ({reason})") from None

    def _decode(self, path: str, index: int, record: bytes) -> np.ndarray:
        try:
            feature = tf.train.Example.FromString(record).features.feature
            values = feature[self.feature_name].bytes_list.value if self.feature_name in feature else []
            if len(values) != 1:
                raise DataError(f"{path}: record {index} has no single bytes value '{self.feature_name}'")
            proto = tensor_pb2.TensorProto.FromString(values[0])
        except DecodeError as error:
            raise DataError(f"{path}: record {index} is not a serialized tensor in a tf.train.Example "
                            f"({error})") from None
        if proto.dtype != tf.as_dtype(self.dtype).as_datatype_enum:
            raise DataError(f"{path}: record {index} holds {tf.as_dtype(proto.dtype).name} values, but "
                            f"{FORMAT_FILE} says {self.dtype}")
        try:
            return tf.make_ndarray(proto).reshape(-1)
        except (ValueError, TypeError) as error:
            raise DataError(f"{path}: record {index} is a malformed tensor ({error})") from None


class SplitTFRecordsReader:
    """Batches of one mapping of a split-TFRecords dataset, as a rank needs them.

    The same element as `datasets.SplitBinaryReader`: labels and numericals of the rank's local
    slice, the categorical features of `reads` for the rows it says. Records are read in order
    (no batch shuffling); the global batch must be the prebatch size. Raises DataError up front for
    a missing or malformed folder, length or format file, or a batch size unequal to the prebatch.
    """

    def __init__(self, spec: FeatureSpec, mapping: str, global_batch_size: int, *, rank: int = 0,
                 world_size: int = 1, reads: Optional[TableReads] = None,
                 numerical_dtype: tf.DType = tf.float32, check_values: bool = True):
        self.spec, self.mapping = spec, mapping
        self.global_batch_size = global_batch_size
        self.rank, self.world_size = rank, world_size
        self.numerical_dtype = numerical_dtype
        self.check_values = check_values
        self.reads = reads or TableReads.every_table(len(spec.categorical_names))
        self.reads.check(len(spec.categorical_names))
        root = os.path.join(spec.base_directory, mapping)
        self.num_batches = read_length(root)
        num_numerical = len(spec.numerical_names)
        self._label = _FolderReader(os.path.join(root, LABEL_FOLDER), LABEL_FOLDER, 1, self.num_batches)
        self._numerical = (_FolderReader(os.path.join(root, NUMERICAL_FOLDER), NUMERICAL_FOLDER, num_numerical,
                                         self.num_batches) if num_numerical else None)
        self._categorical = [_FolderReader(os.path.join(root, categorical_folder(i)), "categorical", 1,
                                           self.num_batches) for i in self.reads.tables]
        self._features = [spec.categorical_names[i] for i in self.reads.tables]
        self._cardinalities = [spec.cardinalities[i] for i in self.reads.tables]
        if self.num_batches:
            path, first = next(self._label.records(None))
            if len(first) != global_batch_size:
                raise DataError(f"{path}: the data is prebatched by {len(first)} samples, so the global "
                                f"batch size must be {len(first)}, got {global_batch_size}")

    def __len__(self) -> int:
        return self.num_batches

    def read_samples(self) -> Iterator[Samples]:
        """Every global batch in order, whole (ids only of the features read); values checked."""
        readers = [self._label, *([self._numerical] if self._numerical else []), *self._categorical]
        streams = [reader.records(self.global_batch_size) for reader in readers]
        for index in range(self.num_batches):
            (label_path, labels), *rest = [next(stream) for stream in streams]
            numerical_path, numerical = rest.pop(0) if self._numerical else (None, None)
            paths = [path for path, _ in rest]
            ids = [values.reshape(-1) for _, values in rest]
            if self.check_values:
                first = index * self.global_batch_size
                check_labels(labels, label_path, self.spec.label_name, self.mapping, first)
                if numerical is not None:
                    check_numericals(numerical, numerical_path, self.spec.numerical_names, self.mapping, first)
                for path, values, name, card in zip(paths, ids, self._features, self._cardinalities):
                    check_ids(values.reshape(1, -1), unsigned_cardinalities([card], values.dtype), [path],
                              [name], self.mapping, first)
            yield numerical, labels.reshape(-1), ids
        for stream in streams:  # each folder must end here (no records beyond length.json)
            next(stream, None)

    def _rank_batches(self) -> Iterator[Tuple[Any, ...]]:
        """This rank's rows of every batch, then 0; or, at bad data, empty arrays and the number
        its DataError is filed under (`datasets.file_pipeline_error`)."""
        lo, hi = local_slice(self.global_batch_size, self.rank, self.world_size)
        row_lo, row_hi = self.reads.rows(self.global_batch_size, self.rank, self.world_size)
        no_numericals = np.zeros((hi - lo, 0), NUMERICAL_DTYPE)
        try:
            for numerical, labels, ids in self.read_samples():
                numerical = no_numericals if numerical is None else numerical[lo:hi]
                yield (labels[lo:hi], numerical, *(i[row_lo:row_hi] for i in ids), np.int64(0))
        except DataError as error:
            yield (*self._empty(), file_pipeline_error(error))

    def _empty(self) -> Tuple[np.ndarray, ...]:
        return (np.zeros(0, self._label.dtype), np.zeros((0, len(self.spec.numerical_names)), NUMERICAL_DTYPE),
                *(np.zeros(0, reader.dtype) for reader in self._categorical))

    def dataset(self) -> tf.data.Dataset:
        """One epoch of (features, labels) batches; iterate it again for the next epoch."""
        lo, hi = local_slice(self.global_batch_size, self.rank, self.world_size)
        row_lo, row_hi = self.reads.rows(self.global_batch_size, self.rank, self.world_size)
        signature = tuple(tf.TensorSpec((None,) + array.shape[1:], tf.as_dtype(array.dtype))
                          for array in self._empty())
        signature += (tf.TensorSpec((), tf.int64),)

        def decode(*raw):
            *arrays, error_number = raw
            with tf.control_dependencies([pipeline_error_check(error_number)]):
                labels = tf.reshape(tf.cast(arrays[0], tf.float32), [-1, 1])
                numerical = tf.cast(arrays[1], self.numerical_dtype)
                ids = tuple(tf.cast(i, tf.int32) for i in arrays[2:])
            labels.set_shape([hi - lo, 1])
            numerical.set_shape([hi - lo, len(self.spec.numerical_names)])
            for i in ids:
                i.set_shape([row_hi - row_lo])
            return {NUMERICAL_KEY: numerical, CATEGORICAL_KEY: ids}, labels

        options = tf.data.Options()
        options.deterministic = True
        return (tf.data.Dataset.from_generator(self._rank_batches, output_signature=signature)
                .map(decode).prefetch(PREFETCH_BATCHES).with_options(options))
