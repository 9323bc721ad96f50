"""Write random headerless CSV files for a CSV feature spec (reference §4.11).

For every mapping and chunk: labels 0 or 1 (both occur; the reference's were always 0),
numerical values uniform in [0, 1), categorical ids uniform in [0, cardinality). A copy of the
spec is written as <output>/feature_spec.yaml, so `transcode.py --input <output>` finds it. Each file is
written to a temporary name and renamed; existing files are refused unless --overwrite.

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

from feature_spec import (CARDINALITY_SELECTOR, CSV, DEFAULT_SPEC_NAME, FEATURES_SELECTOR,
                          FILES_SELECTOR, FeatureSpec, FeatureSpecError)

FLAGS = flags.FLAGS

ROWS_PER_WRITE = 65536


def generate_csv(spec_path: str, output_dir: str, size: int, seed: int = 0,
                 overwrite: bool = False) -> List[str]:
    """Write the CSV files of the spec under `output_dir` (plus the spec); return their paths."""
    if size < 1:
        raise ValueError(f"--size must be positive, got {size}")
    spec = FeatureSpec.from_yaml(spec_path)
    spec.check_feature_spec(chunk_type=CSV)
    for name in spec.categorical_names:
        if not isinstance(spec.feature_spec[name].get(CARDINALITY_SELECTOR), int):
            raise FeatureSpecError(f"{spec_path}: feature '{name}' needs an integer cardinality to "
                                   f"generate ids, got {spec.feature_spec[name].get(CARDINALITY_SELECTOR)!r}")
    spec_copy = os.path.join(output_dir, DEFAULT_SPEC_NAME)
    targets = [os.path.join(output_dir, chunk[FILES_SELECTOR][0])
               for chunks in spec.source_spec.values() for chunk in chunks]
    existing = [p for p in targets + [spec_copy] if os.path.exists(p)
                and not os.path.samefile(p, spec_path)]
    if existing and not overwrite:
        raise FileExistsError(f"{existing[0]} exists ({len(existing)} output files do); refusing to "
                              f"overwrite (pass --overwrite to replace them)")
    rng = np.random.default_rng(seed)
    cardinality = dict(zip(spec.categorical_names, spec.cardinalities))
    chunks = [chunk for mapping_chunks in spec.source_spec.values() for chunk in mapping_chunks]
    for chunk, target in zip(chunks, targets):
        _write_chunk(target, chunk[FEATURES_SELECTOR], spec, cardinality, size, rng)
    if not os.path.exists(spec_copy) or not os.path.samefile(spec_copy, spec_path):
        shutil.copyfile(spec_path, spec_copy + ".tmp")
        os.replace(spec_copy + ".tmp", spec_copy)
    return targets


def _write_chunk(target: str, features: List[str], spec: FeatureSpec, cardinality: dict, size: int,
                 rng: np.random.Generator) -> None:
    """One CSV file of `size` rows, written in slices to a temporary name, then renamed."""
    os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
    temporary = target + ".tmp"
    with open(temporary, "w") as handle:
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
    os.replace(temporary, target)



def define_flags() -> None:
    """The command-line flags; defined only when run as a script, so the module imports cleanly."""
    flags.DEFINE_string("feature_spec_in", DEFAULT_SPEC_NAME, "CSV feature spec YAML")
    flags.DEFINE_string("output", "/data", "directory the spec's file paths are relative to")
    flags.DEFINE_integer("size", 1000, "rows per mapping")
    flags.DEFINE_integer("seed", 0, "random seed")
    flags.DEFINE_boolean("overwrite", False, "replace existing files instead of refusing")


def main(argv: List[str]) -> None:
    del argv
    try:
        paths = generate_csv(FLAGS.feature_spec_in, FLAGS.output, FLAGS.size, FLAGS.seed,
                             FLAGS.overwrite)
    except (FeatureSpecError, FileExistsError, ValueError) as error:
        sys.exit(f"error: {error}")
    print(f"wrote {len(paths)} CSV files of {FLAGS.size} rows under {FLAGS.output}")


if __name__ == "__main__":
    define_flags()
    app.run(main)
