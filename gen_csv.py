"""Write random headerless CSV files for a CSV feature spec (reference §4.11): the reference's
command, a thin one over `csv_data.generate_csv`.

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

import sys
from typing import List

from absl import app, flags

from recsys.runtime.cli import bad_input
from recsys.data.csv_data import generate_csv
from recsys.data.feature_spec import DEFAULT_SPEC_NAME

FLAGS = flags.FLAGS


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
