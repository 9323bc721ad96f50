"""Convert a CSV dataset to split-binary (reference §4.10).

The input spec describes headerless CSV files (chunk type `csv`, one file per chunk, one column
per listed feature; a file may hold several features, grouped differently per mapping).
The output folder is checked first: it must not overlap the input folder, its spec or any CSV
file, and existing output is refused unless --overwrite. Pass 1 reads every file in chunks,
checks the values (labels 0/1; categorical ids integral, non-negative and within int32;
numericals finite and within float16's range; no empty file; files of a mapping of equal length)
and infers each categorical cardinality (max id + 1) for `cardinality: auto`; a declared
cardinality must cover the data. Pass 2 writes the default split-binary layout (reference §4.3)
into a temporary folder beside the output and renames it into place (datasets.SplitBinaryWriter),
so a failure leaves nothing half-written.

Example:
  python transcode.py --input /data/csv --output /data/binary
"""
from __future__ import annotations

import os
import sys
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np
import pandas as pd
from absl import app, flags

from cli import bad_input
from data_errors import DataError
from datasets import SplitBinaryWriter
from feature_spec import (AUTO_CARDINALITY, CARDINALITY_SELECTOR, CSV, DEFAULT_SPEC_NAME,
                          FEATURES_SELECTOR, FILES_SELECTOR, MAPPINGS, MAX_CARDINALITY, FeatureSpec,
                          FeatureSpecError)
from safe_io import refuse_overlap

FLAGS = flags.FLAGS

# The largest id whose cardinality (id + 1) still fits the int32 ids of split-binary (§4.5).
MAX_ID = MAX_CARDINALITY - 1
FLOAT16_MAX = float(np.finfo(np.float16).max)


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


def checked_arrays(spec: FeatureSpec, mapping: str, columns: Dict[str, pd.Series]
                   ) -> Tuple[Optional[np.ndarray], np.ndarray, List[np.ndarray]]:
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


def infer_cardinalities(spec: FeatureSpec, chunk_size: int) -> List[int]:
    """Pass 1: check every value and return the cardinality of each categorical feature."""
    observed = {name: 0 for name in spec.categorical_names}
    for mapping in MAPPINGS:
        for columns in _mapping_chunks(spec, mapping, chunk_size):
            _, _, ids = checked_arrays(spec, mapping, columns)
            for name, feature_ids in zip(spec.categorical_names, ids):
                observed[name] = max(observed[name], int(feature_ids.max()) + 1)
    cardinalities = []
    for name in spec.categorical_names:
        declared = spec.feature_spec[name].get(CARDINALITY_SELECTOR)
        if declared == AUTO_CARDINALITY:
            cardinalities.append(observed[name])
            continue
        if declared < observed[name]:
            raise DataError(f"{spec.path}: feature '{name}' declares cardinality {declared} but the "
                            f"data holds id {observed[name] - 1}")
        if declared > MAX_ID + 1:
            raise FeatureSpecError(f"{spec.path}: feature '{name}' declares cardinality {declared}; "
                                   f"split-binary ids are int32, so it must be at most {MAX_ID + 1}")
        cardinalities.append(declared)
    return cardinalities


def _input_paths(spec: FeatureSpec, input_dir: str) -> Dict[str, str]:
    """Every input of the conversion, by a name for error messages."""
    inputs = {"--input": input_dir, "--feature_spec_in": spec.path}
    for mapping, chunks in spec.source_spec.items():
        for chunk in chunks:
            name = f"the CSV file of mapping '{mapping}', features {chunk[FEATURES_SELECTOR]},"
            inputs[name] = spec.resolve(chunk[FILES_SELECTOR][0])
    return inputs


def transcode(input_dir: str, output_dir: str, feature_spec_in: str = DEFAULT_SPEC_NAME,
              feature_spec_out: str = DEFAULT_SPEC_NAME, chunk_size: int = 65536,
              overwrite: bool = False, allow_external_paths: bool = False) -> FeatureSpec:
    """Convert the CSV dataset of `input_dir` into split-binary in `output_dir`; return its spec.

    The output is checked before the data is read: it must not overlap any input, even with
    `overwrite`, and anything already there is refused unless `overwrite`. The input spec's CSV
    files must lie inside `input_dir` unless `allow_external_paths`.
    """
    if not input_dir:
        raise ValueError("--input is required: the folder of the CSV dataset")
    if chunk_size < 1:
        raise ValueError(f"--chunk_size must be positive, got {chunk_size}")
    spec = FeatureSpec.from_yaml(os.path.join(input_dir, feature_spec_in))
    spec.check_feature_spec(chunk_type=CSV, allow_external_paths=allow_external_paths,
                            allowed_by="--allow_external_paths")
    refuse_overlap(output_dir, "--output", _input_paths(spec, input_dir))
    output_dir = os.path.abspath(output_dir)
    layout = FeatureSpec.get_default_feature_spec(  # the file layout only; cardinalities come later
        len(spec.numerical_names), [1] * len(spec.categorical_names), output_dir)
    SplitBinaryWriter.check_destination(layout, overwrite, feature_spec_out, "--output")
    cardinalities = infer_cardinalities(spec, chunk_size)
    out = FeatureSpec.get_default_feature_spec(len(spec.numerical_names), cardinalities, output_dir)
    out.metadata = dict(spec.metadata)
    with SplitBinaryWriter(out, overwrite, feature_spec_out, "--output") as writer:
        for mapping in MAPPINGS:
            for columns in _mapping_chunks(spec, mapping, chunk_size):
                writer.append(mapping, *checked_arrays(spec, mapping, columns))
        out.path = writer.commit()
    return out


def define_flags() -> None:
    """The command-line flags; defined only when run as a script, so the module imports cleanly."""
    flags.DEFINE_string("input", "", "directory of the CSV dataset")
    flags.DEFINE_string("feature_spec_in", DEFAULT_SPEC_NAME, "input spec, relative to --input")
    flags.DEFINE_string("output", "/data", "output directory for the split-binary dataset")
    flags.DEFINE_string("feature_spec_out", DEFAULT_SPEC_NAME, "output spec name, inside --output")
    flags.DEFINE_integer("chunk_size", 65536, "CSV rows per chunk held in memory")
    flags.DEFINE_boolean("overwrite", False, "replace the dataset already in --output (never an input; "
                         "refused while --output holds files the new dataset would not replace)")
    flags.DEFINE_boolean("allow_external_paths", False, "let the input spec name CSV files outside --input "
                         "(absolute or ../ paths)")


def main(argv: List[str]) -> None:
    del argv
    try:
        spec = transcode(FLAGS.input, FLAGS.output, FLAGS.feature_spec_in, FLAGS.feature_spec_out,
                         FLAGS.chunk_size, FLAGS.overwrite, FLAGS.allow_external_paths)
    except (ValueError, OSError) as error:  # FeatureSpecError, DataError, OutputPathError, I/O
        sys.exit(bad_input(error))
    counts = spec.check_files()
    print(f"wrote {counts['train']} train and {counts['test']} test samples to {spec.path}; "
          f"cardinalities {spec.cardinalities}")


if __name__ == "__main__":
    define_flags()
    app.run(main)
