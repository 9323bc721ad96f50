"""Convert a CSV dataset to split-binary (reference §4.10).

The input spec describes headerless CSV files (chunk type `csv`, one file per chunk, one column
per listed feature; a file may hold several features, grouped differently per mapping).
Pass 1 reads every file in chunks, checks the values (labels 0/1, categorical ids integral and
non-negative, numbers numeric, files of a mapping of equal length) and infers each categorical
cardinality (max id + 1) for `cardinality: auto`; a declared cardinality must cover the data.
Pass 2 writes the default split-binary layout (reference §4.3) into a staging directory and
moves it into place, so a failure leaves nothing half-written. Existing output is refused unless
--overwrite.

Example:
  python transcode.py --input /data/csv --output /data/binary
"""
from __future__ import annotations

import os
import sys
from typing import Dict, Iterator, List

import numpy as np
import pandas as pd
from absl import app, flags

from datasets import DataError, SplitBinaryWriter
from feature_spec import (AUTO_CARDINALITY, CARDINALITY_SELECTOR, CSV, DEFAULT_SPEC_NAME,
                          FEATURES_SELECTOR, FILES_SELECTOR, MAPPINGS, FeatureSpec,
                          FeatureSpecError)

FLAGS = flags.FLAGS


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
        return
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


def _integral_column(column: pd.Series, feature: str, mapping: str) -> np.ndarray:
    """The column as int64, or DataError for missing, non-integral or negative values."""
    values = pd.to_numeric(column, errors="coerce").to_numpy(dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(values) | (values != np.floor(values)) | (values < 0))
    if bad.size:
        raise DataError(f"mapping '{mapping}', feature '{feature}': value {column.iloc[bad[0]]!r} at "
                        f"row {column.index[bad[0]]} is not a non-negative integer")
    return values.astype(np.int64)


def infer_cardinalities(spec: FeatureSpec, chunk_size: int) -> List[int]:
    """Pass 1: check every value and return the cardinality of each categorical feature."""
    observed = {name: 0 for name in spec.categorical_names}
    for mapping in MAPPINGS:
        for columns in _mapping_chunks(spec, mapping, chunk_size):
            labels = _integral_column(columns[spec.label_name], spec.label_name, mapping)
            if labels.size and labels.max() > 1:
                raise DataError(f"mapping '{mapping}', label '{spec.label_name}': labels must be 0 "
                                f"or 1, found {labels.max()}")
            for name in spec.numerical_names:
                values = pd.to_numeric(columns[name], errors="coerce")
                if values.isna().any():
                    row = int(np.flatnonzero(values.isna().to_numpy())[0])
                    raise DataError(f"mapping '{mapping}', feature '{name}': value "
                                    f"{columns[name].iloc[row]!r} at row {columns[name].index[row]} "
                                    f"is not a number")
            for name in spec.categorical_names:
                ids = _integral_column(columns[name], name, mapping)
                if ids.size:
                    observed[name] = max(observed[name], int(ids.max()) + 1)
    cardinalities = []
    for name in spec.categorical_names:
        declared = spec.feature_spec[name].get(CARDINALITY_SELECTOR)
        if declared == AUTO_CARDINALITY:
            cardinalities.append(max(observed[name], 1))
            continue
        if declared < observed[name]:
            raise DataError(f"{spec.path}: feature '{name}' declares cardinality {declared} but the "
                            f"data holds id {observed[name] - 1}")
        cardinalities.append(declared)
    return cardinalities


def transcode(input_dir: str, output_dir: str, feature_spec_in: str = DEFAULT_SPEC_NAME,
              feature_spec_out: str = DEFAULT_SPEC_NAME, chunk_size: int = 65536,
              overwrite: bool = False) -> FeatureSpec:
    """Convert the CSV dataset of `input_dir` into split-binary in `output_dir`; return its spec."""
    if chunk_size < 1:
        raise ValueError(f"--chunk_size must be positive, got {chunk_size}")
    spec = FeatureSpec.from_yaml(os.path.join(input_dir, feature_spec_in))
    spec.check_feature_spec(chunk_type=CSV)
    cardinalities = infer_cardinalities(spec, chunk_size)
    out = FeatureSpec.get_default_feature_spec(len(spec.numerical_names), cardinalities,
                                               os.path.abspath(output_dir))
    out.metadata = dict(spec.metadata)
    with SplitBinaryWriter(out, overwrite=overwrite, spec_file_name=feature_spec_out) as writer:
        for mapping in MAPPINGS:
            for columns in _mapping_chunks(spec, mapping, chunk_size):
                numerical = np.stack([columns[n].to_numpy(np.float64) for n in spec.numerical_names],
                                     axis=1) if spec.numerical_names else None
                writer.append(mapping, numerical, columns[spec.label_name].to_numpy(np.int64),
                              [columns[n].to_numpy(np.int64) for n in spec.categorical_names])
        out.path = writer.commit()
    return out



def define_flags() -> None:
    """The command-line flags; defined only when run as a script, so the module imports cleanly."""
    flags.DEFINE_string("input", "", "directory of the CSV dataset")
    flags.DEFINE_string("feature_spec_in", DEFAULT_SPEC_NAME, "input spec, relative to --input")
    flags.DEFINE_string("output", "/data", "output directory for the split-binary dataset")
    flags.DEFINE_string("feature_spec_out", DEFAULT_SPEC_NAME, "output spec name, inside --output")
    flags.DEFINE_integer("chunk_size", 65536, "CSV rows per chunk held in memory")
    flags.DEFINE_boolean("overwrite", False, "replace existing output files instead of refusing")


def main(argv: List[str]) -> None:
    del argv
    try:
        spec = transcode(FLAGS.input, FLAGS.output, FLAGS.feature_spec_in, FLAGS.feature_spec_out,
                         FLAGS.chunk_size, FLAGS.overwrite)
    except (FeatureSpecError, DataError, FileExistsError, ValueError) as error:
        sys.exit(f"error: {error}")
    counts = spec.check_files()
    print(f"wrote {counts['train']} train and {counts['test']} test samples to {spec.path}; "
          f"cardinalities {spec.cardinalities}")


if __name__ == "__main__":
    define_flags()
    app.run(main)
