"""The split-TFRecords dataset of V5 (reference §13.2): one folder of prebatched records per feature.

Registers the `split_tfrecords` format (`data_formats`): training, transcribe source and destination.

Layout of a dataset folder (what `SplitTFRecordsWriter` writes and `SplitTFRecordsReader` reads):

    feature_spec.yaml               features with their stored dtypes, `source_spec: null`
    <mapping>/length.json           a JSON integer: the number of batches of the mapping (train, test)
    <mapping>/numerical/            all numerical features together
    <mapping>/label/
    <mapping>/categorical_<i>/      i: the feature's position in channel_spec's categorical list

Each feature folder holds `format.json`, a JSON object
`{"format": "tfrecords", "dtype": D, "multihot": M, "feature_name": "data", "num_features": K,
"batches_per_file": N}`, and the files `data_0.tfrecords`, `data_1.tfrecords`, ... read in that
order (this writer makes one file per folder). Every record is one prebatch of B samples, a
serialized `tf.train.Example` whose bytes features hold serialized `TensorProto`s (what
`tf.io.serialize_tensor` makes), one value each:
  * `multihot: false` (numerical, label and one-hot categorical folders): the feature
    `feature_name` holds a [B, K] tensor of dtype D. Stored dtypes: numerical float16 [B, n_num],
    label int8 [B, 1] (0 or 1), categorical int32 [B, 1] (V5 writes int32 whatever the
    cardinality). The reader also takes V5's [B] labels (any shape of B*K values), a bool label,
    and int8/int16 ids.
  * `multihot: true` (a categorical feature of hotness h > 1, K = 1): the ragged ids of the B
    samples as two features, `<feature_name>_values`, a 1-D tensor of dtype D (int32 written;
    int8/int16 read) holding every sample's ids one sample after another, and
    `<feature_name>_row_lengths`, a [B] tensor (int32 written; int64 read too) of each sample's id
    count, each in [0, h] and summing to the number of values. Sample i's ids are
    values[sum(row_lengths[:i]) : sum(row_lengths[:i+1])]; an empty row is allowed.
A feature of hotness h > 1 in the spec must have a `multihot: true` folder and a one-hot feature a
`multihot: false` one. The reader serves a multi-hot feature as a `tf.RaggedTensor` [rows, (ids)]
of int32 values with int64 row splits (`batch.RaggedIds` from `batches`).

Records are read in order, so the global batch must equal the prebatch size B. Every batch is
checked as it is read with the split-binary reader's checks (`data_errors.check_labels`,
`check_numericals`, `check_ids`); a bad value, a corrupt or short file, or a record of the wrong
shape, or a row length outside [0, hotness] or not summing to the values stops the pipeline with
one DataError naming the file (see `pipeline_errors.surface_data_errors`).
"""
from __future__ import annotations

import copy
import json
import os
import re
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
from google.protobuf.message import DecodeError
from tensorflow.core.framework import tensor_pb2

from recsys.data.batch import CATEGORICAL_KEY, NUMERICAL_KEY, Ids, RaggedIds, Samples, TableReads, local_slice
from recsys.data.batch_reader import PREFETCH_BATCHES
from recsys.data.data_formats import register_format
from recsys.data.data_errors import (DataError, check_ids, check_labels, check_numericals, damaged_record_error,
                                     unsigned_cardinalities)
from recsys.data.feature_spec import (DEFAULT_SPEC_NAME, DTYPE_SELECTOR, MAPPINGS, NUMERICAL_DTYPE, FeatureSpec,
                          file_kind_problem, load_folder_spec)
from recsys.data.pipeline_errors import file_pipeline_error, pipeline_error_check
from recsys.runtime.safe_io import OutputPathError, StagedDirectory, check_replaceable

FORMAT_FILE = "format.json"
LENGTH_FILE = "length.json"
NUMERICAL_FOLDER = "numerical"
LABEL_FOLDER = "label"
RECORD_FEATURE = "data"
VALUES_SUFFIX, ROW_LENGTHS_SUFFIX = "_values", "_row_lengths"  # a multi-hot record's two features
STORED_ROW_LENGTHS_DTYPE = "int32"
_READABLE_ROW_LENGTHS_DTYPES = ("int32", "int64")
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
def _bytes_feature(array: np.ndarray) -> tf.train.Feature:
    """A bytes feature holding one serialized TensorProto of `array`."""
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[tf.io.serialize_tensor(array).numpy()]))


class _FolderWriter:
    """One feature folder being written: its records, counted. `hotness` > 1: a multi-hot
    (ragged) categorical folder."""

    def __init__(self, folder: str, dtype: str, num_features: int, hotness: int = 1):
        os.makedirs(folder)
        self.folder, self.dtype, self.num_features, self.hotness = folder, dtype, num_features, hotness
        self.batches = 0
        self._file = tf.io.TFRecordWriter(os.path.join(folder, "data_0.tfrecords"))

    def write(self, values: np.ndarray) -> None:
        """Append one prebatch [B, K] (or [B] when K is 1) as one record."""
        tensor = np.ascontiguousarray(values, dtype=self.dtype).reshape(len(values), self.num_features)
        self._write({RECORD_FEATURE: _bytes_feature(tensor)})

    def write_ragged(self, ids: RaggedIds) -> None:
        """Append one prebatch of a multi-hot feature's ids as one record (values, row lengths)."""
        self._write({RECORD_FEATURE + VALUES_SUFFIX: _bytes_feature(np.ascontiguousarray(ids.values, self.dtype)),
                     RECORD_FEATURE + ROW_LENGTHS_SUFFIX:
                         _bytes_feature(np.asarray(ids.row_lengths, STORED_ROW_LENGTHS_DTYPE))})

    def _write(self, features: Dict[str, tf.train.Feature]) -> None:
        example = tf.train.Example(features=tf.train.Features(feature=features))
        self._file.write(example.SerializeToString())
        self.batches += 1

    def close_file(self) -> None:
        """Close the data file (again is harmless)."""
        self._file.close()

    def finish(self) -> None:
        """Close the data file and write `format.json`."""
        self.close_file()
        description = {"format": "tfrecords", "dtype": self.dtype, "multihot": self.hotness > 1,
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
                *(_FolderWriter(os.path.join(root, categorical_folder(i)), STORED_CATEGORICAL_DTYPE, 1, hotness)
                  for i, hotness in enumerate(spec.hotness))]
        return self._folders[mapping]

    def append(self, mapping: str, numerical: Optional[np.ndarray], labels: np.ndarray,
               categoricals: Sequence[Ids]) -> None:
        """Append one prebatch: numerical [B, n_num], labels [B] (0/1), one id array per categorical:
        [B] one-hot; for a feature of hotness h, [B, h] or RaggedIds of at most h ids per sample."""
        if mapping not in MAPPINGS:
            raise ValueError(f"mapping must be one of {list(MAPPINGS)}, got {mapping!r}")
        labels = np.asarray(labels)
        if len(labels) != self.prebatch_size:
            raise ValueError(f"a split-TFRecords record holds one prebatch of {self.prebatch_size} "
                             f"samples, got {len(labels)}")
        if numerical is None:
            numerical = np.zeros((len(labels), 0), NUMERICAL_DTYPE)
        ragged = [self._ragged(name, hotness, ids) if hotness > 1 else None
                  for name, hotness, ids in zip(self.spec.categorical_names, self.spec.hotness, categoricals,
                                                strict=True)]
        numerical_writer, label_writer, *categorical_writers = self._writers(mapping)
        numerical_writer.write(numerical)
        label_writer.write(labels)
        for writer, ids, rows in zip(categorical_writers, categoricals, ragged):
            if rows is None:
                writer.write(np.asarray(ids))
            else:
                writer.write_ragged(rows)

    def _ragged(self, feature: str, hotness: int, ids: Ids) -> RaggedIds:
        """A multi-hot feature's prebatch as ragged rows; ValueError naming the feature for the
        wrong number of samples or a row of more than `hotness` ids."""
        rows = ids if isinstance(ids, RaggedIds) else RaggedIds.from_fixed(ids)
        if len(rows) != self.prebatch_size:
            raise ValueError(f"feature '{feature}': a record holds one prebatch of {self.prebatch_size} "
                             f"samples, got {len(rows)}")
        longest = int(rows.row_lengths.max(initial=0))
        if longest > hotness or int(rows.row_lengths.min(initial=0)) < 0:
            raise ValueError(f"feature '{feature}' has a sample of {longest} ids; its hotness {hotness} is the "
                             f"most ids a sample may hold")
        return rows

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
    """One feature folder: its `format.json` checked, its records read in order as [B, K] arrays,
    or as RaggedIds for the folder of a feature of `hotness` > 1 (named `feature` in errors)."""

    def __init__(self, folder: str, kind: str, num_features: int, num_batches: int, hotness: int = 1,
                 feature: str = ""):
        self.folder = folder
        self.hotness = hotness
        fmt_path = os.path.join(folder, FORMAT_FILE)
        if not os.path.isdir(folder):
            raise DataError(f"{folder}: feature folder not found (a split-TFRecords dataset has "
                            f"{NUMERICAL_FOLDER}/, {LABEL_FOLDER}/ and categorical_<i>/ per mapping)")
        fmt = _load_json(fmt_path, "format")
        if not isinstance(fmt, dict):
            raise DataError(f"{fmt_path}: must hold a JSON object, got {fmt!r}")
        if fmt.get("format") != "tfrecords":
            raise DataError(f"{fmt_path}: format {fmt.get('format')!r} is not supported (only 'tfrecords')")
        multihot = fmt.get("multihot", False)
        if not isinstance(multihot, bool):
            raise DataError(f"{fmt_path}: multihot must be true or false, got {multihot!r}")
        if multihot != (hotness > 1):
            raise DataError(f"{fmt_path}: " + (
                f"a multi-hot (ragged) folder, but feature '{feature}' has hotness 1 in the feature spec; "
                f"give its most ids per sample as its hotness" if multihot else
                f"one id per sample (multihot false), but feature '{feature}' has hotness {hotness} in the "
                f"feature spec"))
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

    def records(self, prebatch_size: Optional[int]) -> Iterator[Tuple[str, Ids]]:
        """(file, [B, K] array or RaggedIds) per record, exactly `num_batches` of them; B is checked
        against `prebatch_size` (None: the first record's; K must then be positive and the folder
        one-hot)."""
        count = 0
        for path in self.paths:
            for record in self._file_records(path):
                if count == self.num_batches:
                    raise DataError(f"{path}: the folder holds more than the {self.num_batches} batches "
                                    f"that {LENGTH_FILE} gives")
                if self.hotness > 1:
                    yield path, self._decode_ragged(path, count, record, prebatch_size)
                    count += 1
                    continue
                values = self._tensor(path, count, self._example(path, count, record), self.feature_name,
                                      (self.dtype,))
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
        """The records of one file; damage TensorFlow's reader finds (a CRC, a cut) is a DataError
        naming the file and the record."""
        done = 0
        try:
            for record in _tf_record_iterator(path):
                yield record
                done += 1
        except tf.errors.OpError as error:
            reason = _TF_NOISE.sub("", error.message.splitlines()[0]).strip()
            raise damaged_record_error(path, done, reason) from None

    @staticmethod
    def _example(path: str, index: int, record: bytes) -> Any:
        """The features of a record's tf.train.Example."""
        try:
            return tf.train.Example.FromString(record).features.feature
        except DecodeError as error:
            raise DataError(f"{path}: record {index} is not a serialized tf.train.Example ({error})") from None

    @staticmethod
    def _tensor(path: str, index: int, features: Any, key: str, dtypes: Sequence[np.dtype],
                rule: str = f"{FORMAT_FILE} says") -> np.ndarray:
        """The flat values of the serialized tensor in bytes feature `key`, of one of `dtypes`
        (`rule` says who wants them)."""
        values = features[key].bytes_list.value if key in features else []
        if len(values) != 1:
            raise DataError(f"{path}: record {index} has no single bytes value '{key}'")
        try:
            proto = tensor_pb2.TensorProto.FromString(values[0])
        except DecodeError as error:
            raise DataError(f"{path}: record {index} is not a serialized tensor in a tf.train.Example "
                            f"({error})") from None
        if proto.dtype not in [tf.as_dtype(dtype).as_datatype_enum for dtype in dtypes]:
            raise DataError(f"{path}: record {index} holds {tf.as_dtype(proto.dtype).name} values in '{key}', "
                            f"but {rule} {' or '.join(str(np.dtype(d)) for d in dtypes)}")
        try:
            return tf.make_ndarray(proto).reshape(-1)
        except (ValueError, TypeError) as error:
            raise DataError(f"{path}: record {index} is a malformed tensor ({error})") from None

    def _decode_ragged(self, path: str, index: int, record: bytes, prebatch_size: int) -> RaggedIds:
        """A multi-hot record's ids; its row lengths must be `prebatch_size` values in [0, hotness]
        that sum to the number of values."""
        features = self._example(path, index, record)
        values = self._tensor(path, index, features, self.feature_name + VALUES_SUFFIX, (self.dtype,))
        lengths = self._tensor(path, index, features, self.feature_name + ROW_LENGTHS_SUFFIX,
                               [np.dtype(d) for d in _READABLE_ROW_LENGTHS_DTYPES],
                               "row lengths must be").astype(np.int64)
        if len(lengths) != prebatch_size:
            raise DataError(f"{path}: batch {index} has {len(lengths)} row lengths, not a prebatch of "
                            f"{prebatch_size} samples")
        bad = np.flatnonzero((lengths < 0) | (lengths > self.hotness))
        if bad.size:
            raise DataError(f"{path}: batch {index} gives sample {int(bad[0])} {lengths[bad[0]]} ids; a sample "
                            f"holds 0 to the feature's hotness {self.hotness} ids")
        if int(lengths.sum()) != len(values):
            raise DataError(f"{path}: batch {index}'s row lengths sum to {int(lengths.sum())}, but it holds "
                            f"{len(values)} ids")
        return RaggedIds(values, lengths)


class SplitTFRecordsReader:
    """Batches of one mapping of a split-TFRecords dataset, as a rank needs them.

    The same element as `datasets.SplitBinaryReader`: labels and numericals of the rank's local
    slice, the categorical features of `reads` for the rows it says: [rows] int32 ids for a
    one-hot feature, a `tf.RaggedTensor` [rows, (ids)] (int32 values, int64 row splits) for a
    multi-hot one. Records are read in order
    (no batch shuffling); the global batch must be the prebatch size. Raises DataError up front for
    a missing or malformed folder, length or format file, or a batch size unequal to the prebatch.
    """

    def __init__(self, spec: FeatureSpec, mapping: str, global_batch_size: int, *, rank: int = 0,
                 world_size: int = 1, reads: Optional[TableReads] = None, drop_remainder: bool = True,
                 numerical_dtype: tf.DType = tf.float32, check_values: bool = True):
        # `drop_remainder` changes nothing: records hold whole batches (the common reader signature).
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
        self._features = [spec.categorical_names[i] for i in self.reads.tables]
        self._hotness = [spec.hotness[i] for i in self.reads.tables]
        self._categorical = [_FolderReader(os.path.join(root, categorical_folder(i)), "categorical", 1,
                                           self.num_batches, spec.hotness[i], spec.categorical_names[i])
                             for i in self.reads.tables]
        self._cardinalities = [spec.cardinalities[i] for i in self.reads.tables]
        if self.num_batches:
            path, first = next(self._label.records(None))
            if len(first) != global_batch_size:
                raise DataError(f"{path}: the data is prebatched by {len(first)} samples, so the global "
                                f"batch size must be {len(first)}, got {global_batch_size}")

    def __len__(self) -> int:
        return self.num_batches

    @property
    def num_samples(self) -> int:
        """The samples of the mapping: whole batches only."""
        return self.num_batches * self.global_batch_size

    def check_every_batch(self) -> None:
        """Read every batch once, each checked as read (--validate_data); DataError naming the first culprit."""
        for _ in self.batches():
            pass

    def batches(self) -> Iterator[Samples]:
        """Every global batch in order, whole (ids only of the features read: [B] arrays, RaggedIds
        for multi-hot features); values checked."""
        readers = [self._label, *([self._numerical] if self._numerical else []), *self._categorical]
        streams = [reader.records(self.global_batch_size) for reader in readers]
        for index in range(self.num_batches):
            (label_path, labels), *rest = [next(stream) for stream in streams]
            numerical_path, numerical = rest.pop(0) if self._numerical else (None, None)
            paths = [path for path, _ in rest]
            ids = [values if isinstance(values, RaggedIds) else values.reshape(-1) for _, values in rest]
            if self.check_values:
                first = index * self.global_batch_size
                check_labels(labels, label_path, self.spec.label_name, self.mapping, first)
                if numerical is not None:
                    check_numericals(numerical, numerical_path, self.spec.numerical_names, self.mapping, first)
                for path, values, name, card in zip(paths, ids, self._features, self._cardinalities):
                    ragged = isinstance(values, RaggedIds)
                    flat = values.values if ragged else values
                    check_ids(flat[None], unsigned_cardinalities([card], flat.dtype), [path], [name], self.mapping,
                              first, values.row_lengths if ragged else None)
            yield numerical, labels.reshape(-1), ids
        for stream in streams:  # each folder must end here (no records beyond length.json)
            next(stream, None)

    def _rank_batches(self) -> Iterator[Tuple[Any, ...]]:
        """This rank's rows of every batch, then 0; or, at bad data, empty arrays and the number
        its DataError is filed under (`pipeline_errors.file_pipeline_error`)."""
        lo, hi = local_slice(self.global_batch_size, self.rank, self.world_size)
        row_lo, row_hi = self.reads.rows(self.global_batch_size, self.rank, self.world_size)
        no_numericals = np.zeros((hi - lo, 0), NUMERICAL_DTYPE)
        try:
            for numerical, labels, ids in self.batches():
                numerical = no_numericals if numerical is None else numerical[lo:hi]
                yield (labels[lo:hi], numerical, *_flat_arrays(i.rows(row_lo, row_hi) if isinstance(i, RaggedIds)
                                                               else i[row_lo:row_hi] for i in ids), np.int64(0))
        except DataError as error:
            yield (*self._empty(), file_pipeline_error(error))

    def _empty(self) -> Tuple[np.ndarray, ...]:
        """No rows of the generator's arrays: labels, numericals, then per feature its ids (values
        and row lengths for a multi-hot one)."""
        return (np.zeros(0, self._label.dtype), np.zeros((0, len(self.spec.numerical_names)), NUMERICAL_DTYPE),
                *_flat_arrays(RaggedIds(np.zeros(0, reader.dtype), np.zeros(0, np.int64)) if reader.hotness > 1
                              else np.zeros(0, reader.dtype) for reader in self._categorical))

    def dataset(self, shuffle_batch_order: bool = False, seed: int = 0) -> tf.data.Dataset:
        """One epoch of (features, labels) batches; iterate it again for the next epoch. The records
        are read in stored order: `shuffle_batch_order` is refused (`seed` is the common signature's)."""
        if shuffle_batch_order:
            raise ValueError("shuffle_batch_order is not available for split_tfrecords data: its records "
                             "are read in stored order")
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
                stored = iter(arrays[2:])
                ids = []
                for hotness in self._hotness:
                    values = tf.cast(next(stored), tf.int32)
                    if hotness > 1:
                        row_lengths = next(stored)
                        row_lengths.set_shape([row_hi - row_lo])
                        values = tf.RaggedTensor.from_row_lengths(values, row_lengths, validate=False)
                    else:
                        values.set_shape([row_hi - row_lo])
                    ids.append(values)
            labels.set_shape([hi - lo, 1])
            numerical.set_shape([hi - lo, len(self.spec.numerical_names)])
            return {NUMERICAL_KEY: numerical, CATEGORICAL_KEY: tuple(ids)}, labels

        options = tf.data.Options()
        options.deterministic = True
        return (tf.data.Dataset.from_generator(self._rank_batches, output_signature=signature)
                .map(decode).prefetch(PREFETCH_BATCHES).with_options(options))


def _flat_arrays(ids: Iterator[Ids]) -> Iterator[np.ndarray]:
    """The arrays that carry features' ids through tf.data: a one-hot feature's [rows], a multi-hot
    feature's values and int64 row lengths."""
    for rows in ids:
        if isinstance(rows, RaggedIds):
            yield rows.values
            yield rows.row_lengths.astype(np.int64)
        else:
            yield rows


def load_spec(dataset_path: Optional[str], spec_file_name: str, options: Mapping[str, Any]) -> FeatureSpec:
    """The spec of a split-TFRecords folder (see `feature_spec.load_folder_spec` for `options`)."""
    return load_folder_spec("split_tfrecords", dataset_path, spec_file_name, None, options)


def validate(spec: FeatureSpec, batches: Mapping[str, int]) -> None:
    """--validate_data: every record of each mapping read and checked, at its (prebatch) batch size."""
    for mapping, batch in batches.items():
        SplitTFRecordsReader(spec, mapping, batch).check_every_batch()


register_format("split_tfrecords", training=True, source=True, destination=True, load_spec=load_spec,
                reader=SplitTFRecordsReader, validate=validate, writer=SplitTFRecordsWriter, prebatched=True)
