"""Write a teacher-labelled synthetic split-binary dataset and its feature spec (reference §4.9).

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

import os
import sys
from typing import List, Optional, Tuple

from absl import app, flags

from cli import bad_input
from synthetic_data import write_synthetic_dataset
from feature_spec import (CRITEO_NUMERICAL_FEATURES, CRITEO_VARIANTS, MAX_CARDINALITY, SPLIT_BINARY,
                          FeatureSpec, FeatureSpecError)
from safe_io import refuse_overlap


FLAGS = flags.FLAGS


def parse_cardinalities(values: List[str]) -> List[int]:
    """Cardinalities from --synthetic_dataset_table_sizes: at least one, each in [1, MAX_CARDINALITY]."""
    try:
        cardinalities = [int(v) for v in values]
    except ValueError:
        raise ValueError(f"--synthetic_dataset_table_sizes must be integers, got {values}") from None
    if not cardinalities:
        raise ValueError("--synthetic_dataset_table_sizes is empty; main.py needs at least one "
                         "categorical feature")
    bad = [c for c in cardinalities if not 1 <= c <= MAX_CARDINALITY]
    if bad:
        raise ValueError(f"--synthetic_dataset_table_sizes must lie in [1, {MAX_CARDINALITY}] (ids are "
                         f"int32), got {bad[0]}")
    return cardinalities


def sample_counts(num_entries: int, num_test_entries: Optional[int], batch_size: int) -> Tuple[int, int]:
    """Train and test samples, rounded down to whole batches; at least one batch of each."""
    if batch_size < 1:
        raise ValueError(f"--synthetic_dataset_batch_size must be at least 1, got {batch_size}")
    counts = []
    for flag, entries in (("--synthetic_dataset_num_entries", num_entries),
                          ("--synthetic_dataset_num_test_entries",
                           num_entries if num_test_entries is None else num_test_entries)):
        if entries < batch_size:
            raise ValueError(f"{flag} is {entries}, less than one batch of "
                             f"--synthetic_dataset_batch_size {batch_size}: samples are written in "
                             f"whole batches and training needs train and test samples")
        counts.append(entries // batch_size * batch_size)
    return counts[0], counts[1]


def output_spec(output_dir: str, feature_spec_path: Optional[str], variant: Optional[str],
                num_numerical: int, table_sizes: List[str]) -> FeatureSpec:
    """The spec to write: a given one re-rooted at `output_dir` (one without files, as V5's
    generate_feature_spec writes, gets the default file layout), or a default Criteo-style one.

    Refuses dimensions main.py cannot train: no numerical or no categorical feature.
    """
    if feature_spec_path:
        spec = FeatureSpec.from_yaml(feature_spec_path)
        spec.check_feature_spec(chunk_type=None if spec.source_spec is None else SPLIT_BINARY)
        for channel, names in (("numerical", spec.numerical_names),
                               ("categorical", spec.categorical_names)):
            if not names:
                raise FeatureSpecError(f"--feature_spec {feature_spec_path} has no {channel} features; "
                                       f"main.py needs at least one")
        if spec.source_spec is None:  # a spec without files (V5): the default layout of its dimensions
            return FeatureSpec.get_default_feature_spec(len(spec.numerical_names), spec.cardinalities,
                                                        output_dir).take_multi_hot_properties(spec)
        spec.base_directory, spec.path = os.path.abspath(output_dir), None
        return spec
    if variant:
        return FeatureSpec.get_default_feature_spec(CRITEO_NUMERICAL_FEATURES,
                                                    CRITEO_VARIANTS[variant], output_dir)
    if num_numerical < 1:
        raise ValueError(f"--num_numerical_features must be at least 1 (main.py's bottom MLP needs a "
                         f"numerical feature), got {num_numerical}")
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
    flags.DEFINE_boolean("overwrite", False, "replace the dataset already in --synthetic_dataset_dir "
                         "(never --feature_spec; refused while the folder holds files the new "
                         "dataset would not replace)")


def main(argv: List[str]) -> None:
    del argv
    output_dir = FLAGS.synthetic_dataset_dir
    try:
        if FLAGS.feature_spec and FLAGS.variant:
            raise ValueError("--feature_spec and --variant are mutually exclusive")
        num_train, num_test = sample_counts(FLAGS.synthetic_dataset_num_entries,
                                            FLAGS.synthetic_dataset_num_test_entries,
                                            FLAGS.synthetic_dataset_batch_size)
        refuse_overlap(output_dir, "--synthetic_dataset_dir", {"--feature_spec": FLAGS.feature_spec})
        spec = output_spec(output_dir, FLAGS.feature_spec, FLAGS.variant,
                           FLAGS.num_numerical_features, FLAGS.synthetic_dataset_table_sizes)
        teacher_auc = write_synthetic_dataset(spec, num_train, num_test, seed=FLAGS.seed,
                                              overwrite=FLAGS.overwrite,
                                              output_name="--synthetic_dataset_dir")
    except (ValueError, OSError) as error:  # FeatureSpecError, DataError, OutputPathError, I/O
        sys.exit(bad_input(error))
    print(f"wrote {num_train} train and {num_test} test samples to {spec.base_directory}")
    print(f"teacher_auc {teacher_auc:.6f} (AUC of the teacher's probabilities on the test split)")


if __name__ == "__main__":
    define_flags()
    app.run(main)
