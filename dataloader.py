"""Builds the per-rank train and eval input pipelines (reference §4.6-4.8), from plain values.

Every element is `(features, labels)`:
  features = {'numerical_features': [local_b, n_num] compute dtype,
              'categorical_features': tuple of int32 [global_b] (model-parallel input) or
                                      [local_b] (data-parallel input), one per requested feature
                                      in ascending categorical index order},
  labels   = float32 [local_b, 1].
A rank's local slice of a global batch is the one of `batch.local_slice`.
Training drops the last partial batch; evaluation covers every test sample. Every value read is
checked (see `datasets`); consume the datasets inside `datasets.surface_data_errors` so that bad
data arrives as one DataError rather than a TensorFlow error.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf

import datasets
import synthetic_data
from feature_spec import DEFAULT_SPEC_NAME, TEST_MAPPING, TRAIN_MAPPING, FeatureSpec

DATASET_TYPES = ("tf_raw", "synthetic")


@dataclass
class InputPipelines:
    """What the training loop consumes: one-epoch datasets, their lengths and the spec."""
    train: tf.data.Dataset
    test: tf.data.Dataset
    feature_spec: FeatureSpec
    train_steps: int
    eval_steps: int
    teacher_auc: Optional[float] = None


def _check_partitioning(train_batch_size: int, eval_batch_size: int, rank: int,
                        world_size: int, local_categorical_ids: Optional[Sequence[int]],
                        num_categorical: int) -> None:
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
    for flag, batch in (("train batch size (--batch_size)", train_batch_size),
                        ("eval batch size (--valid_batch_size)", eval_batch_size)):
        if batch < 1:
            raise ValueError(f"{flag} must be positive, got {batch}")
        if batch % world_size:
            raise ValueError(f"{flag} {batch} is a global batch and must be divisible by the "
                             f"number of ranks {world_size}")
    if local_categorical_ids is not None:
        ids = list(local_categorical_ids)
        if ids != sorted(set(ids)) or any(not 0 <= i < num_categorical for i in ids):
            raise ValueError(f"local_categorical_ids {ids} must be strictly increasing indices in "
                             f"[0, {num_categorical})")


def _check_batch_fits(batch_size: int, num_samples: int, what: str, where: str) -> None:
    if batch_size > num_samples:
        raise datasets.DataError(f"{where}: the {what} batch size {batch_size} is larger than the "
                                 f"{num_samples} samples of the {what} data")


def load_feature_spec(*, dataset_type: str = "tf_raw", dataset_path: Optional[str] = None,
                      feature_spec_name: str = DEFAULT_SPEC_NAME, use_feature_spec: bool = False,
                      num_numerical_features: int = 13,
                      cardinalities: Sequence[int] = (1000,) * 26,
                      allow_external_paths: bool = False) -> FeatureSpec:
    """The validated spec of the dataset, or the default spec of the synthetic dimensions.

    Its files must lie inside `dataset_path` unless `allow_external_paths`."""
    if dataset_type not in DATASET_TYPES:
        raise ValueError(f"dataset_type must be one of {DATASET_TYPES}, got {dataset_type!r}")
    if dataset_type == "tf_raw" or use_feature_spec:
        if not dataset_path:
            raise ValueError("dataset_path is required for dataset_type 'tf_raw' and for "
                             "synthetic data from a feature spec")
        spec = FeatureSpec.from_yaml(os.path.join(dataset_path, feature_spec_name))
        spec.check_feature_spec(allow_external_paths=allow_external_paths)
        return spec
    return FeatureSpec.get_default_feature_spec(num_numerical_features, list(cardinalities))


def create_input_pipelines(*, dataset_type: str = "tf_raw", dataset_path: Optional[str] = None,
                           feature_spec_name: str = DEFAULT_SPEC_NAME,
                           train_batch_size: int = 65536, eval_batch_size: int = 65536,
                           rank: int = 0, world_size: int = 1,
                           local_categorical_ids: Optional[Sequence[int]] = None,
                           data_parallel_input: bool = False, shuffle_batch_order: bool = False,
                           seed: int = 12345, compute_dtype: tf.DType = tf.float32,
                           num_train_batches: int = 64008, num_eval_batches: int = 1350,
                           cardinalities: Sequence[int] = (1000,) * 26,
                           num_numerical_features: int = 13, use_feature_spec: bool = False,
                           validate_data: bool = False, check_values: bool = True,
                           allow_external_paths: bool = False,
                           feature_spec: Optional[FeatureSpec] = None) -> InputPipelines:
    """The train and eval pipelines of this rank; every bad input raises before any batch is read.

    `local_categorical_ids` are indices into `feature_spec.categorical_names` that this rank
    owns (None: all). With `data_parallel_input` the rank reads its local slice of those features,
    otherwise their whole global batch. Batch sizes are global. A `feature_spec` already loaded with
    `load_feature_spec` is used as is instead of being read again. `validate_data` reads every
    file once up front to check its values (tf_raw only); `check_values` checks each batch as it is
    read (on by default; off only to measure its cost). Synthetic data is drawn in memory from the
    teacher of `synthetic_data.SyntheticTeacher` (batch order fixed).
    """
    spec = feature_spec or load_feature_spec(dataset_type=dataset_type, dataset_path=dataset_path,
                                             feature_spec_name=feature_spec_name,
                                             use_feature_spec=use_feature_spec,
                                             num_numerical_features=num_numerical_features,
                                             cardinalities=cardinalities,
                                             allow_external_paths=allow_external_paths)
    _check_partitioning(train_batch_size, eval_batch_size, rank, world_size,
                        local_categorical_ids, len(spec.categorical_names))
    categorical_ids = (range(len(spec.categorical_names)) if local_categorical_ids is None
                       else local_categorical_ids)
    if dataset_type == "synthetic":
        return _synthetic_pipelines(spec, train_batch_size, eval_batch_size, num_train_batches,
                                    num_eval_batches, list(categorical_ids), rank, world_size,
                                    data_parallel_input, seed, compute_dtype)

    counts = spec.check_files()
    where = spec.path or dataset_path
    _check_batch_fits(train_batch_size, counts[TRAIN_MAPPING], "train", where)
    _check_batch_fits(eval_batch_size, counts[TEST_MAPPING], "test", where)
    if validate_data:
        datasets.validate_data(spec, (TRAIN_MAPPING, TEST_MAPPING))
    readers = {
        mapping: datasets.SplitBinaryReader(
            spec, mapping, batch, rank=rank, world_size=world_size,
            categorical_ids=categorical_ids, data_parallel_categoricals=data_parallel_input,
            drop_remainder=(mapping == TRAIN_MAPPING), numerical_dtype=compute_dtype,
            num_samples=counts[mapping], check_values=check_values)
        for mapping, batch in ((TRAIN_MAPPING, train_batch_size), (TEST_MAPPING, eval_batch_size))}
    return InputPipelines(
        train=readers[TRAIN_MAPPING].dataset(shuffle_batch_order, seed),
        test=readers[TEST_MAPPING].dataset(),
        feature_spec=spec, train_steps=len(readers[TRAIN_MAPPING]),
        eval_steps=len(readers[TEST_MAPPING]),
        teacher_auc=spec.metadata.get("teacher_auc"))


def _synthetic_pipelines(spec: FeatureSpec, train_batch_size: int, eval_batch_size: int,
                         num_train_batches: int, num_eval_batches: int,
                         categorical_ids: Sequence[int], rank: int, world_size: int,
                         data_parallel_input: bool, seed: int,
                         compute_dtype: tf.DType) -> InputPipelines:
    """In-memory teacher-labelled data; every rank draws the same global batches from `seed`."""
    if num_train_batches < 1 or num_eval_batches < 1:
        raise ValueError(f"synthetic data needs at least one train and one eval batch, got "
                         f"{num_train_batches} and {num_eval_batches}")
    teacher = synthetic_data.SyntheticTeacher(len(spec.numerical_names), spec.cardinalities, seed)
    rng = np.random.default_rng(seed)
    splits = [synthetic_data.make_synthetic_split(teacher, batch, count, rng)
              for batch, count in ((train_batch_size, num_train_batches),
                                   (eval_batch_size, num_eval_batches))]
    train, test = (synthetic_data.synthetic_dataset(split, categorical_ids, rank, world_size,
                                              data_parallel_input, compute_dtype)
                   for split in splits)
    return InputPipelines(train=train, test=test, feature_spec=spec,
                          train_steps=num_train_batches, eval_steps=num_eval_batches,
                          teacher_auc=splits[1].teacher_auc)
