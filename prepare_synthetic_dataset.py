"""Write a teacher-labelled synthetic split-binary dataset and its feature spec (reference §4.9).

The dimensions come from --num_numerical_features and --synthetic_dataset_table_sizes, from a
--variant with the real Criteo cardinalities, or from an existing --feature_spec (whose file
layout is kept). Labels are drawn from a fixed random teacher model (datasets.SyntheticTeacher);
the teacher's AUC on the test split is printed and stored in the spec as metadata.teacher_auc.

Example:
  python prepare_synthetic_dataset.py --synthetic_dataset_dir /tmp/synthetic \\
      --synthetic_dataset_num_entries 524288 --synthetic_dataset_table_sizes 100,100,100,100
"""
from __future__ import annotations

import os
import sys
from typing import List, Optional

from absl import app, flags

from datasets import DataError, write_synthetic_dataset
from feature_spec import FeatureSpec, FeatureSpecError

# Cardinalities of the Criteo 1TB dataset preprocessed with frequency thresholds 15, 3 and 0
# (reference §4.12 and §13.2).
CRITEO_VARIANTS = {
    "criteo_t15_synthetic": [7912889, 33823, 17139, 7339, 20046, 4, 7105, 1382, 63, 5554114, 582469,
                             245828, 11, 2209, 10667, 104, 4, 968, 15, 8165896, 2675940, 7156453,
                             302516, 12022, 97, 35],
    "criteo_t3_synthetic": [45833188, 36747, 1572176, 345139, 11, 2209, 11268, 128, 4, 975, 15,
                            48937457, 17246, 11316796, 40094537, 452104, 12607, 105, 36, 7414, 20244,
                            4, 7115, 1442, 63, 29275261],
    "criteo_t0_synthetic": [227605432, 39061, 3067956, 405283, 11, 2209, 11939, 155, 4, 977, 15,
                            292775614, 17296, 40790948, 187188510, 590152, 12974, 109, 37, 7425,
                            20266, 4, 7123, 1544, 64, 130229467],
}
CRITEO_NUMERICAL_FEATURES = 13

FLAGS = flags.FLAGS


def parse_cardinalities(values: List[str]) -> List[int]:
    """Positive integer cardinalities from a list of strings, or ValueError."""
    try:
        cardinalities = [int(v) for v in values]
    except ValueError:
        raise ValueError(f"--synthetic_dataset_table_sizes must be integers, got {values}") from None
    if any(c < 1 for c in cardinalities):
        raise ValueError(f"--synthetic_dataset_table_sizes must be positive, got {cardinalities}")
    return cardinalities


def output_spec(output_dir: str, feature_spec_path: Optional[str], variant: Optional[str],
                num_numerical: int, table_sizes: List[str]) -> FeatureSpec:
    """The spec to write: a given one re-rooted at `output_dir`, or a default Criteo-style one."""
    if feature_spec_path:
        spec = FeatureSpec.from_yaml(feature_spec_path)
        spec.check_feature_spec()
        spec.base_directory, spec.path = os.path.abspath(output_dir), None
        return spec
    if variant:
        return FeatureSpec.get_default_feature_spec(CRITEO_NUMERICAL_FEATURES,
                                                    CRITEO_VARIANTS[variant], output_dir)
    return FeatureSpec.get_default_feature_spec(num_numerical, parse_cardinalities(table_sizes),
                                                output_dir)



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
    flags.DEFINE_boolean("overwrite", False, "replace existing output files instead of refusing")


def main(argv: List[str]) -> None:
    del argv
    if FLAGS.feature_spec and FLAGS.variant:
        sys.exit("error: --feature_spec and --variant are mutually exclusive")
    batch = FLAGS.synthetic_dataset_batch_size
    if batch < 1:
        sys.exit(f"error: --synthetic_dataset_batch_size must be positive, got {batch}")
    test_entries = (FLAGS.synthetic_dataset_num_test_entries
                    if FLAGS.synthetic_dataset_num_test_entries is not None
                    else FLAGS.synthetic_dataset_num_entries)
    num_train = FLAGS.synthetic_dataset_num_entries // batch * batch
    num_test = test_entries // batch * batch
    if num_train < 1 or num_test < 1:
        sys.exit(f"error: need at least one batch of {batch} samples for train and test, got "
                 f"{FLAGS.synthetic_dataset_num_entries} and {test_entries} entries")
    try:
        spec = output_spec(FLAGS.synthetic_dataset_dir, FLAGS.feature_spec, FLAGS.variant,
                           FLAGS.num_numerical_features, FLAGS.synthetic_dataset_table_sizes)
        teacher_auc = write_synthetic_dataset(spec, num_train, num_test, seed=FLAGS.seed,
                                              overwrite=FLAGS.overwrite)
    except (FeatureSpecError, DataError, FileExistsError, ValueError) as error:
        sys.exit(f"error: {error}")
    print(f"wrote {num_train} train and {num_test} test samples to {spec.base_directory}")
    print(f"teacher_auc {teacher_auc:.6f} (AUC of the teacher's probabilities on the test split)")


if __name__ == "__main__":
    define_flags()
    app.run(main)
