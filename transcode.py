"""Convert a CSV dataset to split-binary (reference §4.10): the reference's command, a thin one over
`python -m dataloading.transcribe --src_dataset_type csv --dst_dataset_type tf_raw`.

The input spec describes headerless CSV files (chunk type `csv`, see `csv_data`: every value
checked, `cardinality: auto` inferred by a first pass). The output folder is checked first: it must
not overlap the input folder, its spec or any CSV file, and existing output is refused unless
--overwrite. The default split-binary layout (reference §4.3) is written into a temporary folder
beside the output and renamed into place, so a failure leaves nothing half-written.

Example:
  python transcode.py --input /data/csv --output /data/binary
"""
from __future__ import annotations

import os
import sys
from typing import List

from absl import app, flags

from recsys.runtime.cli import bad_input
from dataloading.transcribe import FlagNames, transcribe
from recsys.data.feature_spec import DEFAULT_SPEC_NAME, FeatureSpec

FLAGS = flags.FLAGS
TRANSCODE_FLAGS = FlagNames(src_path="--input", src_spec="--feature_spec_in", dst_path="--output",
                            batch_size="--chunk_size", external_paths="--allow_external_paths")


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
        if not FLAGS.input:
            raise ValueError("--input is required: the folder of the CSV dataset")
        transcribe("csv", FLAGS.input, FLAGS.output, "tf_raw", src_feature_spec=FLAGS.feature_spec_in,
                   dst_feature_spec=FLAGS.feature_spec_out, src_batch_size=FLAGS.chunk_size,
                   overwrite=FLAGS.overwrite, names=TRANSCODE_FLAGS,
                   allow_external_paths=FLAGS.allow_external_paths)
    except (ValueError, OSError) as error:  # FeatureSpecError, DataError, OutputPathError, I/O
        sys.exit(bad_input(error))
    spec = FeatureSpec.from_yaml(os.path.join(os.path.abspath(FLAGS.output), FLAGS.feature_spec_out))
    counts = spec.check_files()
    print(f"wrote {counts['train']} train and {counts['test']} test samples to {spec.path}; "
          f"cardinalities {spec.cardinalities}")


if __name__ == "__main__":
    define_flags()
    app.run(main)
