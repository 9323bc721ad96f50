"""TorchRec's binary Criteo layout and MLPerf's multi-hot variant (`torchrec_npy`), read in place.

The folder holds, for every day i of 0 .. N-1 (TorchRec's Criteo 1TB: N = 24), NumPy files as
TorchRec's `BinaryCriteoUtils` and its DLRM example write them:
  day_<i>_labels.npy  int32   [samples, 1]  0 or 1
  day_<i>_dense.npy   float32 [samples, 13] the dense values, already ln(x + 3)
  day_<i>_sparse.npy  int32   [samples, 26] one id per feature (the one-hot layout), or
  day_<i>_sparse_multi_hot.npz  MLPerf DLRM-DCNv2's multi-hot ids (the DLRM example's
      `materialize_synthetic_multihot_dataset.py`): an uncompressed `np.savez` archive whose member
      `<j>.npy` is feature j's ids, int32 [samples, hotness_j].
Days 0 .. N-2 are the training data, in day order; the evaluation data is the first ceil(n / 2)
samples of the last day (TorchRec's `val` stage; the rest, its `test` stage, is not read).

The cardinalities come from `num_embeddings_per_feature` (TorchRec's flag): ids are then reduced
modulo them as TorchRec does (numpy's remainder, so in [0, size) for any int32 id). Or they come
from a feature spec in the folder (`feature_spec.yaml`, e.g. from `dataloading.generate_feature_spec`;
its hotness must match the files): the ids are then stored ones and must lie below the cardinality,
like every other format's. Hotness comes from the files; the dense width and feature count too.

Nothing is loaded whole: every array is a memory map (a `.npz` member is mapped at its offset in the
archive, which `np.savez` stores uncompressed), and `DayReader` copies, for batch k, the rows of the
rank's local slice (labels, dense) and of the rows and features `batch.TableReads` asks for (ids),
checking them as read: labels 0 or 1, dense values finite as float16 (the project's numerical
dtype), ids in range. Every file's header is checked when the spec is loaded: a wrong dtype or
shape, a truncated file, a compressed or incomplete archive, or days whose files disagree on the
sample count is one DataError naming the file.

Registers the `torchrec_npy` format (training and transcribe source) and `binary_multihot` (V5's
transcribe source name for the multi-hot layout) in `data_formats`; --num_embeddings_per_feature is
their own option.
"""
from __future__ import annotations

import math
import os
import re
import struct
import zipfile
from dataclasses import dataclass
from typing import Any, BinaryIO, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from recsys.data.batch import TableReads
from recsys.data.batch_reader import BatchReader
from recsys.data.data_formats import register_format
from recsys.data.data_errors import DataError, check_ids, check_numericals, label_values, unsigned_cardinalities
from recsys.data.feature_spec import (DEFAULT_SPEC_NAME, NUMERICAL_DTYPE, TEST_MAPPING, TRAIN_MAPPING, FeatureSpec,
                          file_kind_problem)
from recsys.data.hugectr_data import check_vocab_sizes

TORCHREC_NPY = "torchrec_npy"
BINARY_MULTIHOT = "binary_multihot"  # V5's transcribe name for the multi-hot layout; it insists on the .npz files
SOURCE_TYPES = (TORCHREC_NPY, BINARY_MULTIHOT)
FORMAT_KEY = "torchrec_format"  # FeatureSpec.metadata entry: the layout of the spec's folder
LABELS, DENSE, SPARSE, MULTI_HOT = "labels.npy", "dense.npy", "sparse.npy", "sparse_multi_hot.npz"
STORED_DTYPES = {LABELS: np.dtype("<i4"), DENSE: np.dtype("<f4"), SPARSE: np.dtype("<i4"), MULTI_HOT: np.dtype("<i4")}
_HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
_ZIP_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, then the name and extra-field lengths at byte 26
_ZIP_LOCAL_SIGNATURE = b"PK\x03\x04"


def day_file(root: str, day: int, part: str) -> str:
    """The path of one of a day's files (`part`: LABELS, DENSE, SPARSE or MULTI_HOT)."""
    return os.path.join(root, f"day_{day}_{part}")


# ----------------------------------------------------------------------------- memory maps
@dataclass(frozen=True)
class Mapped:
    """A 2-D array viewing a memory-mapped file, and what errors call it (the file, or an archive's member)."""
    where: str
    array: np.ndarray


def _read_header(f: BinaryIO, start: int, size: int, where: str, dtype: np.dtype) -> Tuple[Tuple[int, ...], bool, int]:
    """(shape, Fortran order, data offset) of the .npy image at bytes [start, start + size) of the
    open file `f`; DataError naming `where` for a header that is not .npy, a dtype other than
    `dtype`, an array that is not 2-D, or missing bytes."""
    f.seek(start)
    try:
        version = np.lib.format.read_magic(f)
        if version not in _HEADER_READERS:
            raise ValueError(f"format version {version[0]}.{version[1]} is not read here (1.0 and 2.0 are)")
        shape, fortran_order, stored = _HEADER_READERS[version](f)
    except ValueError as error:
        raise DataError(f"{where}: not a NumPy .npy array ({error})") from None
    if stored != dtype:
        raise DataError(f"{where}: dtype {stored.str} ({stored}); TorchRec's layout stores {dtype} ({dtype.str}) here")
    if len(shape) != 2:
        raise DataError(f"{where}: shape {list(shape)}; TorchRec's layout stores 2-D arrays [samples, values]")
    needed = f.tell() - start + math.prod(shape) * dtype.itemsize
    if needed > size:
        raise DataError(f"{where}: holds {size} B, but its header describes {list(shape)} {dtype} needing "
                        f"{needed} B; the file is truncated")
    return shape, fortran_order, f.tell()


def _array_at(whole: np.ndarray, header: Tuple[Tuple[int, ...], bool, int], dtype: np.dtype) -> np.ndarray:
    """The array a `_read_header` header describes, as a view of its file mapped whole (bytes):
    nothing is read until rows are sliced out, and one mapping (one descriptor) serves every
    member of an archive."""
    shape, fortran_order, offset = header
    values = whole[offset:offset + math.prod(shape) * dtype.itemsize].view(dtype)
    return values.reshape(shape[::-1]).T if fortran_order else values.reshape(shape)


def _map_file(path: str, part: str) -> Mapped:
    problem = file_kind_problem(path)
    if problem:
        raise DataError(f"{path}: the {part[:-len('.npy')]} file {problem}")
    with open(path, "rb") as f:
        header = _read_header(f, 0, os.path.getsize(path), path, STORED_DTYPES[part])
    return Mapped(path, _array_at(np.memmap(path, np.uint8, mode="r"), header, STORED_DTYPES[part]))


def _map_members(path: str, count: Optional[int]) -> List[Mapped]:
    """Members 0.npy, 1.npy, ... of an `np.savez` archive, each a view of the archive mapped whole;
    `count` None: as many as the archive holds. DataError naming the archive for a bad or
    compressed archive, or a member missing or unexpected."""
    problem = file_kind_problem(path)
    if problem:
        raise DataError(f"{path}: the multi-hot ids file {problem}")
    try:
        with zipfile.ZipFile(path) as archive:
            infos = {info.filename: info for info in archive.infolist()}
    except (zipfile.BadZipFile, OSError) as error:
        raise DataError(f"{path}: not a readable .npz archive ({error}); is it truncated?") from None
    count = len(infos) if count is None else count
    expected = [f"{j}.npy" for j in range(count)]
    if not expected or sorted(infos) != sorted(expected):
        missing = [name for name in expected if name not in infos]
        extra = sorted(set(infos) - set(expected))
        raise DataError(f"{path}: the archive must hold members 0.npy, 1.npy, ... (one per feature, np.savez keys "
                        f"'0', '1', ...); " + (f"missing {missing}" if missing else f"unexpected {extra}"))
    headers = []
    with open(path, "rb") as f:
        for name in expected:
            info = infos[name]
            where = f"{path} (member {name})"
            if info.compress_type != zipfile.ZIP_STORED:
                raise DataError(f"{where}: compressed (np.savez_compressed); only uncompressed members (np.savez) "
                                f"can be read in place")
            f.seek(info.header_offset)
            signature, name_length, extra_length = _ZIP_LOCAL_HEADER.unpack(f.read(_ZIP_LOCAL_HEADER.size))
            if signature != _ZIP_LOCAL_SIGNATURE:
                raise DataError(f"{where}: no zip entry at byte {info.header_offset}; the archive is damaged")
            start = info.header_offset + _ZIP_LOCAL_HEADER.size + name_length + extra_length
            headers.append((where, _read_header(f, start, info.file_size, where, STORED_DTYPES[MULTI_HOT])))
    whole = np.memmap(path, np.uint8, mode="r")
    return [Mapped(where, _array_at(whole, header, STORED_DTYPES[MULTI_HOT])) for where, header in headers]


# ----------------------------------------------------------------------------- days
@dataclass(frozen=True)
class Day:
    """One day's arrays, mapped: labels [n, 1], dense [n, k], and the ids: `sparse` [n, F] (one-hot
    layout) or `members`, one [n, h_j] per feature (multi-hot layout)."""
    labels: Mapped
    dense: Mapped
    sparse: Optional[Mapped]
    members: Tuple[Mapped, ...]

    @property
    def samples(self) -> int:
        return len(self.labels.array)

    @property
    def hotness(self) -> List[int]:
        if self.sparse is not None:
            return [1] * self.sparse.array.shape[1]
        return [member.array.shape[1] for member in self.members]

    def id_source(self, feature: int) -> str:
        """What errors call the file (or member) of `feature`'s ids."""
        return self.sparse.where if self.sparse is not None else self.members[feature].where

    def ids(self, features: Sequence[int], hotness: int, lo: int, hi: int) -> np.ndarray:
        """Ids of rows [lo, hi) of `features` (all of `hotness`): [features, rows] one-hot,
        [features, rows, hotness] multi-hot."""
        if self.sparse is not None:
            return np.ascontiguousarray(self.sparse.array[lo:hi, list(features)].T)
        block = np.stack([self.members[j].array[lo:hi] for j in features])
        return block[..., 0] if hotness == 1 else block


def open_day(root: str, day: int, multi_hot: bool, num_dense: Optional[int] = None,
             hotness: Optional[Sequence[int]] = None) -> Day:
    """Day `day`'s files, mapped and checked: 2-D arrays of TorchRec's dtypes, one label per sample,
    the same number of samples in every file, and (when given) `num_dense` dense values and
    `hotness` ids per feature, as on the other days. DataError naming the file otherwise."""
    labels, dense = _map_file(day_file(root, day, LABELS), LABELS), _map_file(day_file(root, day, DENSE), DENSE)
    if multi_hot:
        members = tuple(_map_members(day_file(root, day, MULTI_HOT), None if hotness is None else len(hotness)))
        loaded = Day(labels, dense, None, members)
    else:
        loaded = Day(labels, dense, _map_file(day_file(root, day, SPARSE), SPARSE), ())
    if labels.array.shape[1] != 1:
        raise DataError(f"{labels.where}: shape {list(labels.array.shape)}; labels are [samples, 1]")
    for mapped in (dense, loaded.sparse, *loaded.members):
        if mapped is not None and len(mapped.array) != loaded.samples:
            raise DataError(f"{mapped.where}: {len(mapped.array)} samples, but {labels.where} holds "
                            f"{loaded.samples}; a day's files hold the same samples")
    if num_dense is not None and dense.array.shape[1] != num_dense:
        raise DataError(f"{dense.where}: {dense.array.shape[1]} dense values per sample, but day 0 has {num_dense}")
    if hotness is not None and len(loaded.hotness) != len(hotness):
        raise DataError(f"{loaded.id_source(0)}: {len(loaded.hotness)} features, but day 0 has {len(hotness)}")
    for feature, (stored, expected) in enumerate(zip(loaded.hotness, hotness or ())):
        if stored != expected:
            raise DataError(f"{loaded.id_source(feature)}: {stored} ids per sample of feature {feature}, "
                            f"but day 0 has {expected}")
    return loaded


def count_days(root: str) -> int:
    """N, the days 0 .. N-1 of the folder (by their labels files); DataError for none, one, or a gap."""
    found = sorted(int(match.group(1)) for match in
                   (re.fullmatch(r"day_(\d+)_labels\.npy", name) for name in os.listdir(root)) if match)
    if not found:
        raise DataError(f"{root}: no {os.path.basename(day_file(root, 0, LABELS))}; a {TORCHREC_NPY} folder holds "
                        f"day_<i>_{LABELS}, day_<i>_{DENSE} and day_<i>_{SPARSE} (or day_<i>_{MULTI_HOT}) for "
                        f"days 0 to N-1 (TorchRec's Criteo 1TB: N = 24)")
    gap = next((day for day in range(found[-1] + 1) if day not in found), None)
    if gap is not None:
        raise DataError(f"{day_file(root, gap, LABELS)}: not found, but day {found[-1]} is there; the days must be "
                        f"0 to N-1 without gaps")
    if len(found) < 2:
        raise DataError(f"{root}: holds day 0 only; the last day is the evaluation data, so training needs "
                        f"at least 2 days")
    return len(found)


def _is_multi_hot(root: str, dataset_type: str) -> bool:
    one_hot, multi_hot = (os.path.lexists(day_file(root, 0, part)) for part in (SPARSE, MULTI_HOT))
    if one_hot == multi_hot:
        raise DataError(f"{root}: day 0 needs either {os.path.basename(day_file(root, 0, SPARSE))} (one-hot) or "
                        f"{os.path.basename(day_file(root, 0, MULTI_HOT))} (multi-hot); found "
                        + ("both" if one_hot else "neither"))
    if dataset_type == BINARY_MULTIHOT and not multi_hot:
        raise DataError(f"{root}: a {BINARY_MULTIHOT} folder holds day_<i>_{MULTI_HOT} (MLPerf's multi-hot ids); "
                        f"this one holds the one-hot day_<i>_{SPARSE}: use --src_dataset_type {TORCHREC_NPY}")
    return multi_hot


# ----------------------------------------------------------------------------- specs
@dataclass(frozen=True)
class Layout:
    """What a torchrec_npy spec's metadata records of its folder: days, sparse layout, whether ids
    are reduced modulo the cardinalities."""
    days: int
    multi_hot: bool
    modulo: bool


def load_spec(dataset_path: str, num_embeddings_per_feature: Optional[Sequence[int]] = None,
              feature_spec_name: str = DEFAULT_SPEC_NAME, dataset_type: str = TORCHREC_NPY) -> FeatureSpec:
    """The spec of a TorchRec folder: numerical features and hotness from day 0's files (every day
    checked to agree), cardinalities from `num_embeddings_per_feature` (ids then taken modulo them)
    or the folder's feature spec (ids then checked against them); both given, they must agree.
    The spec has no files (`source_spec: null`) and its Layout in `metadata[FORMAT_KEY]`."""
    if dataset_type not in SOURCE_TYPES:
        raise ValueError(f"dataset_type must be one of {SOURCE_TYPES}, got {dataset_type!r}")
    if not os.path.isdir(dataset_path):
        raise DataError(f"{dataset_path}: the {dataset_type} dataset folder is not a directory")
    days, multi_hot = count_days(dataset_path), _is_multi_hot(dataset_path, dataset_type)
    first = open_day(dataset_path, 0, multi_hot)
    num_dense, hotness = first.dense.array.shape[1], first.hotness
    for day in range(1, days):
        open_day(dataset_path, day, multi_hot, num_dense, hotness)
    spec_path = os.path.join(dataset_path, feature_spec_name)
    given = FeatureSpec.from_yaml(spec_path) if os.path.lexists(spec_path) else None
    if given is not None:
        given.check_feature_spec(chunk_type=None)
        _check_spec_matches(given, spec_path, num_dense, hotness, first)
    if num_embeddings_per_feature is not None:
        sizes = check_vocab_sizes(list(num_embeddings_per_feature), "--num_embeddings_per_feature")
        if len(sizes) != len(hotness):
            raise DataError(f"{first.id_source(0)}: holds {len(hotness)} features, but --num_embeddings_per_feature "
                            f"gives {len(sizes)} sizes")
        if given is not None and list(sizes) != given.cardinalities:
            raise DataError(f"{spec_path}: cardinalities {given.cardinalities} disagree with "
                            f"--num_embeddings_per_feature {list(sizes)}")
    elif given is not None:
        sizes = tuple(given.cardinalities)
    else:
        raise ValueError(f"{dataset_path}: a {dataset_type} folder needs its table sizes: --num_embeddings_per_feature "
                         f"(TorchRec's flag; ids are taken modulo them) or a {feature_spec_name} in the folder")
    spec = FeatureSpec.get_default_feature_spec(num_dense, sizes, os.path.abspath(dataset_path), hotness)
    if given is not None:
        spec.take_multi_hot_properties(given)
    spec.source_spec = None
    spec.metadata = {FORMAT_KEY: {"days": days, "multi_hot": multi_hot,
                                  "modulo": num_embeddings_per_feature is not None}}
    return spec


def _check_spec_matches(given: FeatureSpec, spec_path: str, num_dense: int, hotness: Sequence[int],
                        first: Day) -> None:
    if len(given.numerical_names) != num_dense:
        raise DataError(f"{spec_path}: {len(given.numerical_names)} numerical features, but {first.dense.where} "
                        f"holds {num_dense} dense values per sample")
    if len(given.categorical_names) != len(hotness):
        raise DataError(f"{spec_path}: {len(given.categorical_names)} categorical features, but "
                        f"{first.id_source(0)} holds {len(hotness)}")
    for j, (name, stated, stored) in enumerate(zip(given.categorical_names, given.hotness, hotness)):
        if stated != stored:
            raise DataError(f"{spec_path}: feature '{name}' has hotness {stated}, but {first.id_source(j)} "
                            f"holds {stored} ids per sample")


def layout(spec: FeatureSpec) -> Optional[Layout]:
    """The Layout of a torchrec_npy spec (`load_spec`); None for any other spec."""
    entry = spec.metadata.get(FORMAT_KEY)
    return None if entry is None else Layout(**entry)


def mapping_rows(mapping: str, day_samples: Sequence[int]) -> List[Tuple[int, int]]:
    """The (day, samples) a mapping takes, in order, from the start of each day: every day but the
    last for training; the first ceil(n / 2) of the last day's n for evaluation (TorchRec's `val`)."""
    if mapping == TRAIN_MAPPING:
        return [(day, n) for day, n in enumerate(day_samples[:-1])]
    if mapping == TEST_MAPPING:
        return [(len(day_samples) - 1, math.ceil(day_samples[-1] / 2))]
    raise ValueError(f"mapping must be {TRAIN_MAPPING!r} or {TEST_MAPPING!r}, got {mapping!r}")


# ----------------------------------------------------------------------------- reading
class DayReader(BatchReader):
    """Batches of one mapping of a torchrec_npy folder, as a rank needs them: the same element,
    checks and `reads` semantics as `datasets.SplitBinaryReader`. A global batch may span two days."""

    def __init__(self, spec: FeatureSpec, mapping: str, global_batch_size: int, *, rank: int = 0,
                 world_size: int = 1, reads: Optional[TableReads] = None, drop_remainder: bool = True,
                 numerical_dtype: tf.DType = tf.float32, check_values: bool = True):
        self.layout = layout(spec)
        if self.layout is None:
            raise ValueError("DayReader reads the spec of torchrec_data.load_spec")
        self.mapping = mapping
        self.check_values = check_values
        reads = reads or TableReads.every_table(len(spec.categorical_names))
        reads.check(len(spec.categorical_names))
        root = spec.base_directory
        num_dense = len(spec.numerical_names)
        days = {day: open_day(root, day, self.layout.multi_hot, num_dense, spec.hotness)
                for day, _ in mapping_rows(mapping, [0] * self.layout.days)}
        samples = [days[day].samples if day in days else 0 for day in range(self.layout.days)]
        # (day, first sample of the mapping it holds) per piece of the mapping, in order
        self._pieces: List[Tuple[Day, int, int]] = []
        start = 0
        for day, count in mapping_rows(mapping, samples):
            self._pieces.append((days[day], start, count))
            start += count
        hotness = [spec.hotness[t] for t in reads.tables]
        grouped: Dict[int, List[int]] = {}
        for position, h in enumerate(hotness):
            grouped.setdefault(h, []).append(position)
        super().__init__(start, global_batch_size, rank=rank, world_size=world_size, reads=reads,
                         drop_remainder=drop_remainder, numerical_dtype=numerical_dtype,
                         categorical_features=[spec.categorical_names[t] for t in reads.tables],
                         num_numerical=num_dense, groups=[(np.dtype(np.int32), members) for members in grouped.values()],
                         hotness=hotness)
        self.numerical_features = spec.numerical_names
        self._group_tables = [[reads.tables[p] for p in members] for _, members in self._groups]
        cardinalities = [spec.cardinalities[t] for t in reads.tables]
        self._group_bounds = [np.asarray([cardinalities[p] for p in members], np.int32).reshape(
            (-1, 1) + ((1,) if self.hotness[members[0]] != 1 else ())) for _, members in self._groups]

    def _spans(self, first: int, count: int):
        """(day, first row in the day, rows, offset in the output) of mapping rows [first, first + count)."""
        for day, start, size in self._pieces:
            lo, hi = max(first, start), min(first + count, start + size)
            if lo < hi:
                yield day, lo - start, hi - lo, lo - first

    def _read(self, batch_index: int) -> Tuple[List[np.ndarray], Optional[DataError]]:
        local_first, local_rows, id_first, id_rows = self.rank_rows(batch_index)
        labels = np.zeros(local_rows, bool)
        dense = np.zeros((local_rows, self.num_numerical), NUMERICAL_DTYPE)
        blocks = [np.zeros((len(members), id_rows) + self._id_shape(members), np.int32) for _, members in self._groups]
        arrays = [labels] + ([dense] if self.num_numerical else []) + blocks
        try:
            for day, lo, rows, out in self._spans(local_first, local_rows):
                labels[out:out + rows] = label_values(day.labels.array[lo:lo + rows, 0], day.labels.where,
                                                      self.mapping, lo, self.check_values)
                values = np.asarray(day.dense.array[lo:lo + rows]).astype(NUMERICAL_DTYPE)
                if self.check_values:
                    check_numericals(values, day.dense.where, self.numerical_features, self.mapping, lo)
                dense[out:out + rows] = values
            for day, lo, rows, out in self._spans(id_first, id_rows):
                for (_, members), tables, bounds, block in zip(self._groups, self._group_tables,
                                                                self._group_bounds, blocks):
                    ids = day.ids(tables, self.hotness[members[0]], lo, lo + rows)
                    if self.layout.modulo:
                        ids = np.remainder(ids, bounds)
                    elif self.check_values:
                        check_ids(ids, unsigned_cardinalities(bounds.reshape(-1), np.int32),
                                  [day.id_source(t) for t in tables],
                                  [self.categorical_features[p] for p in members], self.mapping, lo)
                    block[:, out:out + rows] = ids
        except DataError as error:
            return arrays, error
        return arrays, None



# ----------------------------------------------------------------------------- the formats
def _spec_loader(dataset_type: str):
    """The `load_spec` of `dataset_type`'s registration: the folder's spec from option num_embeddings_per_feature."""
    def load(dataset_path: Optional[str], spec_file_name: str, options: Mapping[str, Any]) -> FeatureSpec:
        if not dataset_path:
            raise ValueError(f"dataset_path is required for dataset_type {dataset_type!r}")
        return load_spec(dataset_path, options.get("num_embeddings_per_feature"), spec_file_name, dataset_type)
    return load


register_format("torchrec_npy", training=True, source=True, own_options=("num_embeddings_per_feature",),
                load_spec=_spec_loader(TORCHREC_NPY), reader=DayReader, metadata_key=FORMAT_KEY)
register_format("binary_multihot", source=True, own_options=("num_embeddings_per_feature",),
                load_spec=_spec_loader(BINARY_MULTIHOT), reader=DayReader, metadata_key=FORMAT_KEY)
