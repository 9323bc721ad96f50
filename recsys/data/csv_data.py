"""CSV datasets (reference §4.10, §4.11): headerless CSV files described by a feature spec, read as a
`dataloading.transcribe` source (`csv`, what `transcode.py` converts) and written with random values
(`generate_csv`, what `gen_csv.py` writes).

The spec names chunk type `csv`, one file per chunk, one column per listed feature; a file may hold
several features, grouped differently per mapping. Every value is checked as it is read (labels 0/1;
categorical ids integral, non-negative and within int32; numericals finite and within float16's
range, the stored type; no empty file; the files of a mapping of equal length), the error naming
the file, line, feature and value. A categorical feature may declare `cardinality: auto`: `scan`
reads every file once, checks every value and sets each cardinality (max id + 1); a declared one
must cover the data. Registers `csv` as a transcribe source.
"""
from __future__ import annotations

import copy
import os
import shutil
from typing import Any, Dict, Iterator, List, Mapping, Optional

import numpy as np
import pandas as pd

from recsys.data.batch import Samples
from recsys.data.data_errors import DataError
from recsys.data.data_formats import register_format
from recsys.data.feature_spec import (AUTO_CARDINALITY, CARDINALITY_SELECTOR, CSV, DEFAULT_SPEC_NAME, FEATURES_SELECTOR,
                          FILES_SELECTOR, MAPPINGS, MAX_CARDINALITY, FeatureSpec, FeatureSpecError,
                          load_folder_spec)
from recsys.runtime.safe_io import atomic_directory, check_replaceable, refuse_overlap

# The largest id whose cardinality (id + 1) still fits the int32 ids of split-binary (§4.5).
MAX_ID = MAX_CARDINALITY - 1
FLOAT16_MAX = float(np.finfo(np.float16).max)
ROWS_PER_WRITE = 65536


def _read_chunks(spec: FeatureSpec, chunk: Dict, chunk_size: int) -> Iterator[pd.DataFrame]:
    """Row chunks of one CSV file, columns named by the chunk's features; checks the width."""
    path = spec.resolve(chunk[FILES_SELECTOR][0])
    features = chunk[FEATURES_SELECTOR]
    if not os.path.isfile(path):
        raise FeatureSpecError(f"{path}: CSV file of features {features} not found")
    try:
        for frame in pd.read_csv(path, header=None, chunksize=chunk_size):
            if frame.shape[1] != len(features):
                raise DataError(f"{path}: {frame.shape[1]} columns, but the spec lists "
                                f"{len(features)} features {features}")
            frame.columns = features
            yield frame
    except pd.errors.EmptyDataError:
        raise DataError(f"{path}: empty CSV file (features {features}); every file needs at least "
                        f"one row") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as error:
        raise DataError(f"{path}: unreadable CSV ({error})") from None


def _mapping_chunks(spec: FeatureSpec, mapping: str, chunk_size: int) -> Iterator[Dict[str, pd.Series]]:
    """Row chunks of a mapping: all its files read side by side, as {feature: column}."""
    chunks = spec.source_spec[mapping]
    readers = [_read_chunks(spec, chunk, chunk_size) for chunk in chunks]
    paths = [spec.resolve(chunk[FILES_SELECTOR][0]) for chunk in chunks]
    rows_so_far = 0
    while True:
        frames = [next(reader, None) for reader in readers]
        if all(frame is None for frame in frames):
            return
        lengths = {path: (0 if frame is None else len(frame)) for path, frame in zip(paths, frames)}
        if len(set(lengths.values())) > 1:
            counts = ", ".join(f"{path}: {rows_so_far + n}" for path, n in lengths.items())
            raise DataError(f"mapping '{mapping}': CSV files have different numbers of rows "
                            f"(at least {counts})")
        rows_so_far += len(frames[0])
        yield {name: frame[name] for frame in frames for name in frame.columns}


def _refuse_first(bad: np.ndarray, column: pd.Series, path: str, feature: str, problem: str) -> None:
    """DataError naming the file, line, feature and value of the first flagged row, if any."""
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise DataError(f"{path}: line {column.index[row] + 1}: feature '{feature}' value "
                        f"{column.iloc[row]!r} {problem}")


def _integers(column: pd.Series, path: str, feature: str, largest: int, what: str) -> np.ndarray:
    """The column as int64, or DataError for a value that is not an integer in [0, largest]."""
    values = pd.to_numeric(column, errors="coerce").to_numpy(dtype=np.float64)
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(values) | (values != np.floor(values)) | (values < 0) | (values > largest)
    _refuse_first(bad, column, path, feature, f"is not {what}")
    return values.astype(np.int64)


def _numbers(column: pd.Series, path: str, feature: str) -> np.ndarray:
    """The column as float64, or DataError for NaN, inf, text, or a value float16 cannot hold."""
    values = pd.to_numeric(column, errors="coerce").to_numpy(dtype=np.float64)
    _refuse_first(~np.isfinite(values), column, path, feature, "is not a finite number")
    with np.errstate(over="ignore"):
        overflow = np.isinf(values.astype(np.float16))
    _refuse_first(overflow, column, path, feature,
                  f"overflows float16, the stored numerical type (largest magnitude {FLOAT16_MAX:.0f})")
    return values


def checked_samples(spec: FeatureSpec, mapping: str, columns: Dict[str, pd.Series]) -> Samples:
    """One row chunk as (numericals [n, k] or None, labels, ids per categorical), every value checked."""
    def path(name: str) -> str:
        return spec.file_of(mapping, name)

    numerical = (np.stack([_numbers(columns[n], path(n), n) for n in spec.numerical_names], axis=1)
                 if spec.numerical_names else None)
    labels = _integers(columns[spec.label_name], path(spec.label_name), spec.label_name, 1,
                       "a label 0 or 1")
    ids = [_integers(columns[n], path(n), n, MAX_ID, f"an id in [0, {MAX_ID}]")
           for n in spec.categorical_names]
    return numerical, labels, ids


def load_spec(dataset_path: Optional[str], spec_file_name: str, options: Mapping[str, Any]) -> FeatureSpec:
    """The checked CSV spec of the folder (`cardinality: auto` kept until `scan`); `options` as
    `feature_spec.load_folder_spec` reads them (the spec itself may lie anywhere)."""
    return load_folder_spec(CSV, dataset_path, spec_file_name, CSV, dict(options), spec_inside=False)


def scan(spec: FeatureSpec, batch_size: int) -> FeatureSpec:
    """Read every file once in chunks of `batch_size` rows, check every value, and return a copy
    of `spec` whose categorical cardinalities are known: `auto` ones inferred (max id + 1), declared
    ones checked to cover the data and to fit int32 ids."""
    observed = {name: 0 for name in spec.categorical_names}
    for mapping in MAPPINGS:
        for columns in _mapping_chunks(spec, mapping, batch_size):
            _, _, ids = checked_samples(spec, mapping, columns)
            for name, feature_ids in zip(spec.categorical_names, ids):
                observed[name] = max(observed[name], int(feature_ids.max()) + 1)
    scanned = copy.deepcopy(spec)
    for name in spec.categorical_names:
        declared = spec.feature_spec[name].get(CARDINALITY_SELECTOR)
        if declared == AUTO_CARDINALITY:
            scanned.feature_spec[name][CARDINALITY_SELECTOR] = observed[name]
            continue
        if declared < observed[name]:
            raise DataError(f"{spec.path}: feature '{name}' declares cardinality {declared} but the "
                            f"data holds id {observed[name] - 1}")
        if declared > MAX_ID + 1:
            raise FeatureSpecError(f"{spec.path}: feature '{name}' declares cardinality {declared}; "
                                   f"split-binary ids are int32, so it must be at most {MAX_ID + 1}")
    return scanned


def read_batches(spec: FeatureSpec, mapping: str, batch_size: int, keep_remainder: bool) -> Iterator[Samples]:
    """The checked batches of `batch_size` rows of a mapping; with `keep_remainder`, the last partial one too."""
    for columns in _mapping_chunks(spec, mapping, batch_size):
        samples = checked_samples(spec, mapping, columns)
        if keep_remainder or len(samples[1]) == batch_size:
            yield samples


def generate_csv(spec_path: str, output_dir: str, size: int, seed: int = 0,
                 overwrite: bool = False) -> List[str]:
    """Write random CSV files for the spec under `output_dir`, plus a copy of the spec named
    feature_spec.yaml; return the files' paths. Labels 0 or 1, numericals uniform in [0, 1),
    ids uniform in [0, cardinality). Every check runs before anything is written; the folder
    appears complete or not at all."""
    if size < 1:
        raise ValueError(f"--size must be positive, got {size}")
    spec = FeatureSpec.from_yaml(spec_path)
    spec.check_feature_spec(chunk_type=CSV)  # also: file paths inside the folder, one per chunk
    for name in spec.categorical_names:
        if not isinstance(spec.feature_spec[name].get(CARDINALITY_SELECTOR), int):
            raise FeatureSpecError(f"{spec_path}: feature '{name}' needs an integer cardinality to "
                                   f"generate ids, got {spec.feature_spec[name].get(CARDINALITY_SELECTOR)!r}")
    chunks = [chunk for mapping_chunks in spec.source_spec.values() for chunk in mapping_chunks]
    relative_paths = [os.path.normpath(chunk[FILES_SELECTOR][0]) for chunk in chunks]
    if DEFAULT_SPEC_NAME in relative_paths:
        raise FeatureSpecError(f"{spec_path}: a chunk's file is named {DEFAULT_SPEC_NAME!r}, the copy of "
                               f"the spec written beside the CSV files; rename the chunk's file")
    refuse_overlap(output_dir, "--output", {"--feature_spec_in": spec_path})
    entries = {path.split(os.sep)[0] for path in relative_paths} | {DEFAULT_SPEC_NAME}
    replace = check_replaceable(output_dir, "--output", entries, overwrite)
    rng = np.random.default_rng(seed)
    cardinality = dict(zip(spec.categorical_names, spec.cardinalities))
    with atomic_directory(output_dir, replace=replace) as staging:
        for chunk, relative in zip(chunks, relative_paths):
            _write_chunk(os.path.join(staging, relative), chunk[FEATURES_SELECTOR], spec,
                         cardinality, size, rng)
        shutil.copyfile(spec_path, os.path.join(staging, DEFAULT_SPEC_NAME))
    return [os.path.join(os.path.abspath(output_dir), relative) for relative in relative_paths]


def _write_chunk(target: str, features: List[str], spec: FeatureSpec, cardinality: dict, size: int,
                 rng: np.random.Generator) -> None:
    """One CSV file of `size` rows, written in slices."""
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target, "w") as handle:
        for start in range(0, size, ROWS_PER_WRITE):
            rows = min(ROWS_PER_WRITE, size - start)
            columns = {}
            for name in features:
                if name == spec.label_name:
                    columns[name] = rng.integers(0, 2, rows)
                elif name in cardinality:
                    columns[name] = rng.integers(0, cardinality[name], rows)
                else:
                    columns[name] = rng.random(rows, dtype=np.float32)
            pd.DataFrame(columns).to_csv(handle, header=False, index=False)


register_format("csv", source=True, load_spec=load_spec, scan=scan, batches=read_batches)
