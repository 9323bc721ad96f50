"""HugeCTR's raw binary format and the SOK DLRM benchmark's split layout: their description, a
per-rank reader, and the writer of HugeCTR raw files.

HugeCTR raw (`hugectr_raw`): the dataset folder holds `train_data.bin` and `test_data.bin` (the names
HugeCTR's data generator and its MLPerf recipes use; link other names to them). Each is a run of
fixed records, little endian, no header: the label, 13 dense values, then one id per categorical
feature, 4 bytes each (160-byte records for Criteo's 26 features). The cardinalities (HugeCTR's
slot_size_array) come from the caller, or from a `metadata.json` in the folder with SOK's keys.

SOK split (`sok_split`, what the SOK benchmark's `split_bin.py` writes): `train/` and `test/` each hold
`label.bin` (one value per sample), `dense.bin` (13), `category.bin` (one id per feature) and
`metadata.json`: `vocab_sizes` (required), `label_raw_type` and `dense_raw_type` (`int32` or
`float32`), `category_raw_type` (`int32`), `dense_log` (whether the dense values still need the log);
missing keys take split_bin.py's defaults (int32, true). `train/metadata.json` is required and a
`test/metadata.json` must agree with it. In SOK's per-feature variant (its `parquet_to_binary.py
--split_category`) `category.bin` is replaced by `category_<i>.bin`; there label.bin is bool,
dense.bin float16 already transformed and each category file the smallest of int8/int16/int32 above
its vocab size: the project's split-binary encoding, so `split_binary_spec` describes those files
for `datasets.SplitBinaryReader`. SOK's reader takes only `vocab_sizes` from metadata.json for that
variant, and so does this one.

Dense values with `dense_log` become `numerical_rule.transform_numericals` of them, exactly what the
project's preprocessing writes for the same raw integers (ln(max(x, -2) + 3) as float16); without,
the values as float16. So a dataset converted by `dataloading.transcribe` serves the same batches.

`RecordReader` serves the same element as the split-binary reader: for batch k it `pread`s, at their
offsets, the records of the rank's local slice (labels and dense values) and of the rows whose ids
`reads` (`batch.TableReads`) asks for; a HugeCTR raw record carries all three, so a rank reads the
records of those rows and keeps the columns it needs. Decoding is vectorised numpy. Every batch is
checked as it is read: labels 0 or 1, dense values finite after the transform, ids in [0, vocab
size); a bad value, a size that is not a whole number of records or files that disagree are one
DataError naming the file.

Registers the `hugectr_raw` and `sok_split` formats (`data_formats`): training, transcribe source and
destination; --hugectr_cardinalities and --hugectr_dense_log are hugectr_raw's own options.
"""
from __future__ import annotations

import json
import os
import weakref
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from recsys.data.batch import TableReads
from recsys.data.batch_reader import VALIDATE_BATCH, BatchReader, pread_into
from recsys.data.data_formats import register_format
from recsys.data.data_errors import DataError, check_ids, check_numericals, label_values, unsigned_cardinalities
from recsys.data.feature_spec import (FEATURES_SELECTOR, FILES_SELECTOR, LABEL_DTYPE, MAPPINGS, MAX_CARDINALITY,
                          NUMERICAL_DTYPE, TEST_MAPPING, TRAIN_MAPPING, FeatureSpec, file_kind_problem)
from recsys.data.numerical_rule import transform_numericals
from recsys.data.split_binary import SplitBinaryReader, validate_data
from recsys.runtime.safe_io import check_replaceable
from recsys.data.staged_writer import StagedWriter

HUGECTR_RAW = "hugectr_raw"
SOK_SPLIT = "sok_split"
DATASET_TYPES = (HUGECTR_RAW, SOK_SPLIT)
NUM_DENSE = 13
METADATA_FILE = "metadata.json"
RAW_FILES = {TRAIN_MAPPING: "train_data.bin", TEST_MAPPING: "test_data.bin"}
LABEL_FILE, DENSE_FILE, CATEGORY_FILE = "label.bin", "dense.bin", "category.bin"
VALUE_TYPES = {"int32": np.dtype("<i4"), "float32": np.dtype("<f4")}
VALUE_BYTES = 4
TRANSPOSE_ROWS = 2048  # records transposed into [features, rows] at a time
FORMAT_KEY = "hugectr_format"  # FeatureSpec.metadata entry of a record layout: dataset type + RawFormat


def category_file(index: int) -> str:
    """The file of categorical feature `index` in SOK's per-feature variant."""
    return f"category_{index}.bin"


@dataclass(frozen=True)
class RawFormat:
    """How records store a sample: vocab sizes, the value types of label, dense values and ids
    (SOK's metadata.json keys), and whether the dense values still need the log."""
    vocab_sizes: Tuple[int, ...]
    label_raw_type: str = "int32"
    dense_raw_type: str = "int32"
    category_raw_type: str = "int32"
    dense_log: bool = True

    def to_json(self) -> Dict[str, Any]:
        return {"vocab_sizes": list(self.vocab_sizes), "label_raw_type": self.label_raw_type,
                "dense_raw_type": self.dense_raw_type, "category_raw_type": self.category_raw_type,
                "dense_log": self.dense_log}

    @classmethod
    def from_json(cls, data: Dict[str, Any], where: str) -> "RawFormat":
        """The format a metadata.json object describes; ValueError naming `where` for what this
        reader cannot read."""
        vocab_sizes = check_vocab_sizes(data.get("vocab_sizes"), f"{where}: vocab_sizes")
        types = {key: data.get(key, "int32") for key in ("label_raw_type", "dense_raw_type", "category_raw_type")}
        for key, value in types.items():
            readable = ["int32"] if key == "category_raw_type" else list(VALUE_TYPES)
            if value not in readable:
                raise DataError(f"{where}: {key} {value!r} cannot be read; it must be one of {readable}")
        dense_log = data.get("dense_log", True)
        if not isinstance(dense_log, bool):
            raise DataError(f"{where}: dense_log must be true or false, got {dense_log!r}")
        return cls(vocab_sizes, dense_log=dense_log, **types)


def check_vocab_sizes(values: Any, what: str) -> Tuple[int, ...]:
    """A non-empty list of cardinalities in [1, MAX_CARDINALITY]; else DataError naming `what`."""
    if (not isinstance(values, (list, tuple)) or not values
            or any(isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_CARDINALITY for v in values)):
        raise DataError(f"{what} must be a non-empty list of integers in [1, {MAX_CARDINALITY}], got {values!r}")
    return tuple(values)


def read_metadata(path: str) -> Dict[str, Any]:
    """The JSON object of a metadata.json; DataError naming the file otherwise."""
    problem = file_kind_problem(path)
    if problem:
        raise DataError(f"{path}: {METADATA_FILE} {problem}")
    try:
        with open(path) as f:
            data = json.load(f)
    except (ValueError, UnicodeDecodeError) as error:
        raise DataError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(data, dict):
        raise DataError(f"{path}: must hold a JSON object with vocab_sizes, got {data!r}")
    return data


# ----------------------------------------------------------------------------- specs
def load_spec(dataset_type: str, dataset_path: str, cardinalities: Optional[Sequence[int]] = None,
              dense_log: Optional[bool] = None) -> FeatureSpec:
    """The spec of a HugeCTR raw or SOK split folder. `cardinalities` and `dense_log` describe a
    HugeCTR raw folder (dense_log defaults to true); with a metadata.json there, they must agree
    with it. A record layout's spec has no files (`source_spec: null`) and carries its format in
    `metadata[FORMAT_KEY]`."""
    if dataset_type not in DATASET_TYPES:
        raise ValueError(f"dataset_type must be one of {DATASET_TYPES}, got {dataset_type!r}")
    if not os.path.isdir(dataset_path):
        raise DataError(f"{dataset_path}: the {dataset_type} dataset folder is not a directory")
    if dataset_type == HUGECTR_RAW:
        return _record_spec(HUGECTR_RAW, dataset_path, _hugectr_format(dataset_path, cardinalities, dense_log))
    train_path = os.path.join(dataset_path, TRAIN_MAPPING, METADATA_FILE)
    metadata = read_metadata(train_path)
    test_path = os.path.join(dataset_path, TEST_MAPPING, METADATA_FILE)
    if os.path.lexists(test_path) and read_metadata(test_path) != metadata:
        raise DataError(f"{test_path}: disagrees with {train_path}; train and test must share one format")
    folder = os.path.join(dataset_path, TRAIN_MAPPING)
    combined = os.path.lexists(os.path.join(folder, CATEGORY_FILE))
    per_feature = os.path.lexists(os.path.join(folder, category_file(0)))
    if combined == per_feature:
        raise DataError(f"{folder}: a SOK split folder holds either {CATEGORY_FILE} or {category_file(0)}, "
                        f"{category_file(1)}, ... (one per feature); found "
                        + ("both" if combined else "neither"))
    if per_feature:
        return split_binary_spec(dataset_path, check_vocab_sizes(metadata.get("vocab_sizes"),
                                                                 f"{train_path}: vocab_sizes"))
    return _record_spec(SOK_SPLIT, dataset_path, RawFormat.from_json(metadata, train_path))


def _hugectr_format(dataset_path: str, cardinalities: Optional[Sequence[int]],
                    dense_log: Optional[bool]) -> RawFormat:
    path = os.path.join(dataset_path, METADATA_FILE)
    if os.path.lexists(path):
        described = RawFormat.from_json(read_metadata(path), path)
        if cardinalities is not None and tuple(cardinalities) != described.vocab_sizes:
            raise DataError(f"{path}: vocab_sizes {list(described.vocab_sizes)} disagree with "
                            f"--hugectr_cardinalities {list(cardinalities)}")
        if dense_log is not None and dense_log != described.dense_log:
            raise DataError(f"{path}: dense_log {str(described.dense_log).lower()} disagrees with "
                            f"--{'' if dense_log else 'no'}hugectr_dense_log")
        return described
    if cardinalities is None:
        raise ValueError(f"{dataset_path}: a hugectr_raw folder needs its cardinalities (slot_size_array): "
                         f"--hugectr_cardinalities, or a {METADATA_FILE} with vocab_sizes")
    sizes = check_vocab_sizes(list(cardinalities), "--hugectr_cardinalities")
    return RawFormat(sizes, dense_log=True if dense_log is None else dense_log)


def _record_spec(dataset_type: str, dataset_path: str, raw_format: RawFormat) -> FeatureSpec:
    """The default spec's features over `dataset_path`, without files, with the layout in metadata."""
    spec = FeatureSpec.get_default_feature_spec(NUM_DENSE, raw_format.vocab_sizes, os.path.abspath(dataset_path))
    spec.source_spec = None
    spec.metadata = {FORMAT_KEY: {"dataset_type": dataset_type, **raw_format.to_json()}}
    return spec


def split_binary_spec(dataset_path: str, vocab_sizes: Sequence[int]) -> FeatureSpec:
    """A split-binary spec over SOK's per-feature files: label.bin bool, dense.bin float16,
    category_<i>.bin in the dtype SOK and this project both choose from the vocab size."""
    spec = FeatureSpec.get_default_feature_spec(NUM_DENSE, vocab_sizes, os.path.abspath(dataset_path))
    files = {spec.label_name: LABEL_FILE, spec.numerical_names[0]: DENSE_FILE,
             **{name: category_file(i) for i, name in enumerate(spec.categorical_names)}}
    for mapping in MAPPINGS:
        for chunk in spec.source_spec[mapping]:
            chunk[FILES_SELECTOR] = [f"{mapping}/{files[chunk[FEATURES_SELECTOR][0]]}"]
    return spec


def record_format(spec: FeatureSpec) -> Optional[Tuple[str, RawFormat]]:
    """(dataset type, format) of a record layout's spec (`load_spec`); None for any other spec."""
    entry = spec.metadata.get(FORMAT_KEY)
    if entry is None:
        return None
    fields = dict(entry)
    dataset_type = fields.pop("dataset_type")
    return dataset_type, RawFormat(**{**fields, "vocab_sizes": tuple(fields["vocab_sizes"])})


# ----------------------------------------------------------------------------- reading
@dataclass(frozen=True)
class _RecordFile:
    """A file of fixed records of `width` 4-byte values."""
    path: str
    width: int
    what: str


def _record_files(dataset_type: str, root: str, mapping: str,
                  num_ids: int) -> Tuple[List[_RecordFile], Dict[str, Tuple[int, int]]]:
    """The files of a mapping and where each field is: {field: (file index, first column)}."""
    if dataset_type == HUGECTR_RAW:
        record = _RecordFile(os.path.join(root, RAW_FILES[mapping]), 1 + NUM_DENSE + num_ids,
                             f"HugeCTR raw records (label, {NUM_DENSE} dense, {num_ids} ids)")
        return [record], {"label": (0, 0), "dense": (0, 1), "ids": (0, 1 + NUM_DENSE)}
    folder = os.path.join(root, mapping)
    files = [_RecordFile(os.path.join(folder, LABEL_FILE), 1, "labels"),
             _RecordFile(os.path.join(folder, DENSE_FILE), NUM_DENSE, f"{NUM_DENSE} dense values"),
             _RecordFile(os.path.join(folder, CATEGORY_FILE), num_ids,
                         f"{num_ids} ids, one per vocab size in {os.path.join(root, TRAIN_MAPPING, METADATA_FILE)}")]
    return files, {"label": (0, 0), "dense": (1, 0), "ids": (2, 0)}


def _count_records(files: Sequence[_RecordFile], mapping: str) -> int:
    """Samples in the files; DataError for a missing file, a partial record or counts that differ."""
    counts = {}
    for record in files:
        problem = file_kind_problem(record.path)
        if problem:
            raise DataError(f"{record.path}: the {mapping} data file {problem}")
        size = os.path.getsize(record.path)
        record_bytes = VALUE_BYTES * record.width
        if size % record_bytes:
            raise DataError(f"{record.path}: size {size} B is not a whole number of {record_bytes}-byte records "
                            f"({record.what}); the file is truncated or holds another layout")
        counts[record.path] = size // record_bytes
    if len(set(counts.values())) > 1:
        listing = ", ".join(f"{os.path.basename(path)}={count}" for path, count in counts.items())
        raise DataError(f"{files[0].path}: the {mapping} files hold different numbers of samples: {listing}")
    return next(iter(counts.values()))


class RecordReader(BatchReader):
    """Batches of one mapping of a HugeCTR raw or SOK split (`category.bin`) dataset, as a rank needs
    them: the same element, checks and `reads` semantics as `datasets.SplitBinaryReader`."""

    def __init__(self, spec: FeatureSpec, mapping: str, global_batch_size: int, *, rank: int = 0,
                 world_size: int = 1, reads: Optional[TableReads] = None, drop_remainder: bool = True,
                 numerical_dtype: tf.DType = tf.float32, check_values: bool = True):
        layout = record_format(spec)
        if layout is None:
            raise ValueError("RecordReader reads the spec of hugectr_data.load_spec (a record layout)")
        dataset_type, self.format = layout
        self.mapping = mapping
        self.check_values = check_values
        reads = reads or TableReads.every_table(len(spec.categorical_names))
        reads.check(len(spec.categorical_names))
        self._files, self._fields = _record_files(dataset_type, spec.base_directory, mapping,
                                                  len(spec.categorical_names))
        features = [spec.categorical_names[i] for i in reads.tables]
        int32 = np.dtype(np.int32)
        super().__init__(_count_records(self._files, mapping), global_batch_size, rank=rank, world_size=world_size,
                         reads=reads, drop_remainder=drop_remainder, numerical_dtype=numerical_dtype,
                         categorical_features=features, num_numerical=NUM_DENSE,
                         groups=[(int32, list(range(len(features))))] if features else [])
        self.numerical_features = spec.numerical_names
        self._cardinalities = unsigned_cardinalities([spec.cardinalities[i] for i in reads.tables], int32)
        self._id_columns = self._fields["ids"][1] + np.asarray(reads.tables, dtype=np.int64)
        self._fds = [os.open(record.path, os.O_RDONLY) for record in self._files]
        weakref.finalize(self, lambda fds: [os.close(fd) for fd in fds], list(self._fds))

    def _empty(self) -> List[np.ndarray]:
        ids = [np.zeros((len(self.categorical_features), 0), np.int32)] if self._groups else []
        return [np.zeros(0, LABEL_DTYPE), np.zeros((0, NUM_DENSE), NUMERICAL_DTYPE), *ids]

    def _read(self, batch_index: int) -> Tuple[List[np.ndarray], Optional[DataError]]:
        local_first, local_rows, id_first, id_rows = self.rank_rows(batch_index)
        ranges = {"label": (local_first, local_rows), "dense": (local_first, local_rows)}
        if self._groups:
            ranges["ids"] = (id_first, id_rows)
        try:
            values = self._values(ranges)
            arrays = [self._labels(*values["label"], local_first), self._dense(*values["dense"], local_first)]
            if self._groups:
                arrays.append(self._ids(*values["ids"], id_first))
        except DataError as error:
            return self._empty(), error
        return arrays, None

    def _values(self, ranges: Dict[str, Tuple[int, int]]) -> Dict[str, Tuple[str, np.ndarray]]:
        """{field: (file path, its records' values [rows, width] int32)}, each file read once for the
        rows its fields need."""
        spans: Dict[int, Tuple[int, int]] = {}
        for field, (first, count) in ranges.items():
            index = self._fields[field][0]
            lo, hi = spans.get(index, (first, first + count))
            spans[index] = (min(lo, first), max(hi, first + count))
        blocks = {}
        for index, (lo, hi) in spans.items():
            record = self._files[index]
            block = np.empty((hi - lo, record.width), np.dtype("<i4"))
            pread_into(self._fds[index], record.path, block, lo * VALUE_BYTES * record.width)
            blocks[index] = (lo, block)
        out = {}
        for field, (first, count) in ranges.items():
            index = self._fields[field][0]
            lo, block = blocks[index]
            out[field] = (self._files[index].path, block[first - lo:first - lo + count])
        return out

    def _labels(self, path: str, records: np.ndarray, first: int) -> np.ndarray:
        values = records[:, self._fields["label"][1]].view(VALUE_TYPES[self.format.label_raw_type])
        return label_values(values, path, self.mapping, first, self.check_values)

    def _dense(self, path: str, records: np.ndarray, first: int) -> np.ndarray:
        column = self._fields["dense"][1]
        raw = records[:, column:column + NUM_DENSE].view(VALUE_TYPES[self.format.dense_raw_type])
        dense = transform_numericals(raw, take_log=self.format.dense_log)
        if self.check_values:
            check_numericals(dense, path, self.numerical_features, self.mapping, first)
        return dense

    def _ids(self, path: str, records: np.ndarray, first: int) -> np.ndarray:
        block = np.empty((len(self._id_columns), len(records)), np.int32)
        for start in range(0, len(records), TRANSPOSE_ROWS):  # cache-sized pieces: ~3x a whole transpose
            block[:, start:start + TRANSPOSE_ROWS] = records[start:start + TRANSPOSE_ROWS, self._id_columns].T
        if self.check_values:
            check_ids(block, self._cardinalities, [path] * len(block), self.categorical_features,
                      self.mapping, first)
        return block


# ----------------------------------------------------------------------------- writing
def converted_format(vocab_sizes: Sequence[int]) -> RawFormat:
    """The format the writers here use for data that arrives transformed (split-binary float16 dense
    values, which int32 cannot hold): label and dense values float32, `dense_log` false."""
    return RawFormat(check_vocab_sizes(list(vocab_sizes), "vocab sizes"), label_raw_type="float32",
                     dense_raw_type="float32", dense_log=False)


class HugeCTRRawWriter(StagedWriter):
    """Writes a HugeCTR raw folder (`train_data.bin`, `test_data.bin`, `metadata.json`), all or nothing.

    The dense values arrive transformed (split-binary float16), which HugeCTR's int32 dense
    values cannot hold, so label and dense are written as float32 (HugeCTR's `float_label_dense`)
    and metadata.json says `dense_log: false`: reading the folder back serves the same batches.
    All or nothing (`staged_writer.StagedWriter`): a destination holding anything is refused unless
    `overwrite`, and even then when it holds entries this writer would not replace.
    """

    def __init__(self, destination: str, vocab_sizes: Sequence[int], overwrite: bool = False,
                 output_name: str = "output folder"):
        self.format = converted_format(vocab_sizes)
        self.destination = os.path.abspath(destination)
        super().__init__(self.destination, check_replaceable(self.destination, output_name,
                                                             {*RAW_FILES.values(), METADATA_FILE}, overwrite))
        self._files.update({mapping: open(os.path.join(self._staging, name), "wb")
                            for mapping, name in RAW_FILES.items()})

    def append(self, mapping: str, numerical: np.ndarray, labels: np.ndarray,
               categoricals: Sequence[np.ndarray]) -> None:
        """Append samples: numerical [n, 13] (float16 values), labels [n] (0/1), one id array per feature."""
        labels = np.asarray(labels)
        records = np.empty((len(labels), 1 + NUM_DENSE + len(self.format.vocab_sizes)), np.dtype("<i4"))
        records[:, 0] = labels.astype("<f4").view("<i4")
        records[:, 1:1 + NUM_DENSE] = np.asarray(numerical).astype("<f4").view("<i4")
        for column, ids in enumerate(categoricals, start=1 + NUM_DENSE):
            records[:, column] = ids
        records.tofile(self._files[mapping])

    def commit(self) -> str:
        """Write metadata.json, rename the folder into place; return its path."""
        with open(os.path.join(self._staging, METADATA_FILE), "w") as f:
            json.dump(self.format.to_json(), f)
        self._publish()
        return self.destination


class SokSplitWriter(StagedWriter):
    """Writes SOK split folders (`label.bin`, `dense.bin`, `category.bin`, `metadata.json`), all or nothing.

    `folders` maps each mapping to its folder inside `destination`: by default `train/` and `test/`
    (a `sok_split` dataset), or "" for one mapping written into `destination` itself, as SOK's
    `split_bin.py` writes one split. Values as `HugeCTRRawWriter` writes them (`converted_format`).
    A destination holding anything is refused unless `overwrite`, and even then when it holds
    entries this writer would not replace.
    """

    def __init__(self, destination: str, vocab_sizes: Sequence[int], overwrite: bool = False,
                 output_name: str = "output folder", folders: Optional[Dict[str, str]] = None):
        self.format = converted_format(vocab_sizes)
        self.destination = os.path.abspath(destination)
        self._folders = folders or {mapping: mapping for mapping in MAPPINGS}
        split_files = {LABEL_FILE, DENSE_FILE, CATEGORY_FILE, METADATA_FILE}
        entries = {name for folder in self._folders.values() for name in ({folder} if folder else split_files)}
        super().__init__(self.destination, check_replaceable(self.destination, output_name, entries, overwrite))
        for mapping, folder in self._folders.items():
            os.makedirs(os.path.join(self._staging, folder), exist_ok=True)
            for name in (LABEL_FILE, DENSE_FILE, CATEGORY_FILE):
                self._files[f"{mapping}/{name}"] = open(os.path.join(self._staging, folder, name), "wb")

    def append(self, mapping: str, numerical: np.ndarray, labels: np.ndarray,
               categoricals: Sequence[np.ndarray]) -> None:
        """Append samples: numerical [n, 13] (float16 values), labels [n] (0/1), one id array per feature."""
        np.asarray(labels).astype("<f4").tofile(self._files[f"{mapping}/{LABEL_FILE}"])
        np.asarray(numerical).astype("<f4").tofile(self._files[f"{mapping}/{DENSE_FILE}"])
        ids = np.empty((len(labels), len(self.format.vocab_sizes)), np.dtype("<i4"))
        for column, values in enumerate(categoricals):
            ids[:, column] = values
        ids.tofile(self._files[f"{mapping}/{CATEGORY_FILE}"])

    def commit(self) -> str:
        """Write each folder's metadata.json, rename the destination into place; return its path."""
        for folder in self._folders.values():
            with open(os.path.join(self._staging, folder, METADATA_FILE), "w") as f:
                json.dump(self.format.to_json(), f)
        self._publish()
        return self.destination


# ----------------------------------------------------------------------------- the formats
def _folder(dataset_type: str, dataset_path: Optional[str]) -> str:
    if not dataset_path:
        raise ValueError(f"dataset_path is required for dataset_type {dataset_type!r}")
    return dataset_path


def load_raw_spec(dataset_path: Optional[str], spec_file_name: str, options: Mapping[str, Any]) -> FeatureSpec:
    """`load_spec` of a hugectr_raw folder, described by options hugectr_cardinalities and
    hugectr_dense_log (None: not given); the folder has no spec file."""
    return load_spec(HUGECTR_RAW, _folder(HUGECTR_RAW, dataset_path), options.get("hugectr_cardinalities"),
                     options.get("hugectr_dense_log"))


def load_sok_spec(dataset_path: Optional[str], spec_file_name: str, options: Mapping[str, Any]) -> FeatureSpec:
    """`load_spec` of a SOK split folder (its format is in train/metadata.json)."""
    return load_spec(SOK_SPLIT, _folder(SOK_SPLIT, dataset_path))


def open_reader(spec: FeatureSpec, mapping: str, global_batch_size: int, **options: Any) -> BatchReader:
    """The reader of a `load_spec` spec: `RecordReader` for a record layout, the split-binary reader
    for SOK's per-feature files (`options`: the readers' keyword arguments)."""
    reader = RecordReader if record_format(spec) is not None else SplitBinaryReader
    return reader(spec, mapping, global_batch_size, **options)


def validate(spec: FeatureSpec, batches: Mapping[str, int]) -> None:
    """--validate_data: every record read and checked, VALIDATE_BATCH at a time (SOK's per-feature
    files: the split-binary scan)."""
    if record_format(spec) is None:
        validate_data(spec, tuple(batches))
        return
    for mapping in batches:
        RecordReader(spec, mapping, VALIDATE_BATCH, drop_remainder=False).check_every_batch()


def _writable(dataset_type: str, spec: FeatureSpec) -> None:
    """A source `spec` fits a record of 13 dense values and one id per feature; ValueError otherwise."""
    if len(spec.numerical_names) != NUM_DENSE:
        raise ValueError(f"{spec.path or spec.base_directory}: {dataset_type} holds {NUM_DENSE} dense "
                         f"values per sample; the source has {len(spec.numerical_names)} numerical features")
    spec.refuse_multi_hot(f"a {dataset_type} destination")


def raw_writer(spec: FeatureSpec, destination: str, prebatch_size: int, overwrite: bool,
               spec_file_name: str, output_name: str) -> HugeCTRRawWriter:
    """transcribe's hugectr_raw destination for the samples of `spec`."""
    _writable(HUGECTR_RAW, spec)
    return HugeCTRRawWriter(destination, spec.cardinalities, overwrite, output_name)


def sok_writer(spec: FeatureSpec, destination: str, prebatch_size: int, overwrite: bool,
               spec_file_name: str, output_name: str) -> SokSplitWriter:
    """transcribe's sok_split destination for the samples of `spec`."""
    _writable(SOK_SPLIT, spec)
    return SokSplitWriter(destination, spec.cardinalities, overwrite, output_name)


register_format("hugectr_raw", training=True, source=True, destination=True,
                own_options=("hugectr_cardinalities", "hugectr_dense_log"), load_spec=load_raw_spec,
                reader=open_reader, validate=validate, writer=raw_writer, metadata_key=FORMAT_KEY)
register_format("sok_split", training=True, source=True, destination=True, load_spec=load_sok_spec,
                reader=open_reader, validate=validate, writer=sok_writer, metadata_key=FORMAT_KEY)
