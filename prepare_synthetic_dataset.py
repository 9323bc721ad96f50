"""Write a teacher-labelled synthetic split-binary dataset and its feature spec (reference §4.9): the
reference's command, a thin one over `synthetic_data.prepare_synthetic_dataset`.

The dimensions come from --num_numerical_features and --synthetic_dataset_table_sizes, from a
--variant with the real Criteo cardinalities, or from an existing --feature_spec (whose file
layout is kept). Labels are drawn from a fixed random teacher model (synthetic_data.SyntheticTeacher);
the teacher's AUC on the test split is printed and stored in the spec as metadata.teacher_auc.
Everything main.py needs is checked before any sample is drawn (a numerical and a categorical
feature, a whole batch of train and of test samples, int32-sized tables); the folder is written
beside --synthetic_dataset_dir and renamed into place, so a failure leaves nothing behind.

Example:
  python prepare_synthetic_dataset.py --synthetic_dataset_dir /tmp/synthetic \\
      --synthetic_dataset_num_entries 524288 --synthetic_dataset_table_sizes 100,100,100,100
"""
from __future__ import annotations

import sys
from typing import List

from absl import app, flags

from recsys.runtime.cli import bad_input
from recsys.data.feature_spec import CRITEO_VARIANTS
from recsys.data.synthetic_data import SyntheticDatasetShape, prepare_synthetic_dataset

FLAGS = flags.FLAGS


def define_flags() -> None:
    """The command-line flags; defined only when run as a script, so the module imports cleanly."""
    flags.DEFINE_integer("synthetic_dataset_num_entries", 32768 * 1024,
                         "training samples (rounded down to whole batches)")
    flags.DEFINE_integer("synthetic_dataset_num_test_entries", None,
                         "test samples (rounded down to whole batches); default: as many as training")
    flags.DEFINE_integer("synthetic_dataset_batch_size", 32768, "samples are written in whole batches")
    flags.DEFINE_integer("num_numerical_features", 13, "numerical features (without --feature_spec)")
    flags.DEFINE_list("synthetic_dataset_table_sizes", ",".join(["100000"] * 26),
                      "comma-separated cardinalities (without --feature_spec or --variant)")
    flags.DEFINE_enum("variant", None, sorted(CRITEO_VARIANTS),
                      "Criteo-shaped dimensions: 13 numerical features and the real cardinalities")
    flags.DEFINE_string("feature_spec", None, "feature spec YAML whose dimensions and file layout to use")
    flags.DEFINE_string("synthetic_dataset_dir", "/tmp/dlrm_synthetic_data", "output directory")
    flags.DEFINE_integer("seed", 12345, "seed of the teacher and of the samples")
    flags.DEFINE_boolean("overwrite", False, "replace the dataset already in --synthetic_dataset_dir "
                         "(never --feature_spec; refused while the folder holds files the new "
                         "dataset would not replace)")


def main(argv: List[str]) -> None:
    del argv
    shape = SyntheticDatasetShape(FLAGS.synthetic_dataset_num_entries, FLAGS.synthetic_dataset_num_test_entries,
                                  FLAGS.synthetic_dataset_batch_size, FLAGS.feature_spec, FLAGS.variant,
                                  FLAGS.num_numerical_features, FLAGS.synthetic_dataset_table_sizes)
    try:
        spec, num_train, num_test, teacher_auc = prepare_synthetic_dataset(
            FLAGS.synthetic_dataset_dir, shape, FLAGS.seed, FLAGS.overwrite)
    except (ValueError, OSError) as error:  # FeatureSpecError, DataError, OutputPathError, I/O
        sys.exit(bad_input(error))
    print(f"wrote {num_train} train and {num_test} test samples to {spec.base_directory}")
    print(f"teacher_auc {teacher_auc:.6f} (AUC of the teacher's probabilities on the test split)")


if __name__ == "__main__":
    define_flags()
    app.run(main)
