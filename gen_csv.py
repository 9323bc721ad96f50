"""Write random headerless CSV files for a CSV feature spec (reference §4.11).

For every mapping and chunk: labels 0 or 1 (both occur; the reference's were always 0),
numerical values uniform in [0, 1), categorical ids uniform in [0, cardinality). A copy of the
spec is written as <output>/feature_spec.yaml, so `transcode.py --input <output>` finds it.
The spec's file paths must stay inside --output, and --output must not hold the spec. Everything
is written into a temporary folder beside --output and renamed into place, so a failure leaves
nothing behind; existing output is refused unless --overwrite.

Example:
  python gen_csv.py --feature_spec_in tests/transcoding/small_csv.yaml --output /tmp/csv --size 1000
"""
from __future__ import annotations

import os
import shutil
import sys
from typing import List

import numpy as np
import pandas as pd
from absl import app, flags

from cli import bad_input
from feature_spec import (CARDINALITY_SELECTOR, CSV, DEFAULT_SPEC_NAME, FEATURES_SELECTOR,
                          FILES_SELECTOR, FeatureSpec, FeatureSpecError)
from safe_io import atomic_directory, check_replaceable, refuse_overlap

FLAGS = flags.FLAGS

ROWS_PER_WRITE = 65536


def generate_csv(spec_path: str, output_dir: str, size: int, seed: int = 0,
                 overwrite: bool = False) -> List[str]:
    """Write the CSV files of the spec under `output_dir` (plus the spec); return their paths.

    Every check runs before anything is written; the folder appears complete or not at all.
    """
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


def define_flags() -> None:
    """The command-line flags; defined only when run as a script, so the module imports cleanly."""
    flags.DEFINE_string("feature_spec_in", DEFAULT_SPEC_NAME, "CSV feature spec YAML")
    flags.DEFINE_string("output", "/data", "directory the spec's file paths are relative to")
    flags.DEFINE_integer("size", 1000, "rows per mapping")
    flags.DEFINE_integer("seed", 0, "random seed")
    flags.DEFINE_boolean("overwrite", False, "replace the files already in --output (never the spec; "
                         "refused while --output holds files this run would not replace)")


def main(argv: List[str]) -> None:
    del argv
    try:
        paths = generate_csv(FLAGS.feature_spec_in, FLAGS.output, FLAGS.size, FLAGS.seed,
                             FLAGS.overwrite)
    except (ValueError, OSError) as error:  # FeatureSpecError, OutputPathError, I/O
        sys.exit(bad_input(error))
    print(f"wrote {len(paths)} CSV files of {FLAGS.size} rows under {FLAGS.output}")


if __name__ == "__main__":
    define_flags()
    app.run(main)
