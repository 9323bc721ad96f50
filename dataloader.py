"""Builds the per-rank train and eval input pipelines (reference §4.6-4.8), from plain values.

Every element is `(features, labels)`:
  features = {'numerical_features': [local_b, n_num] compute dtype,
              'categorical_features': tuple of int32 ids, one per feature of the rank's
                                      `batch.TableReads`, for [global_b] or [local_b] rows as it
                                      says: [rows] one-hot, [rows, h] for a feature of hotness h
                                      (split-binary, synthetic), tf.RaggedTensor [rows, (ids)]
                                      (split-TFRecords multi-hot; see batch.py)},
  labels   = float32 [local_b, 1].
A rank's local slice of a global batch is the one of `batch.local_slice`.
Training drops the last partial batch; evaluation covers every test sample (split-TFRecords data
holds whole prebatches only, and is read in stored order). HugeCTR raw and SOK split folders are
read by `hugectr_data` (SOK's per-feature variant is split-binary, read by `datasets`), TorchRec's
day files (`day_<i>_*.npy`, MLPerf's `.npz` multi-hot ids) by `torchrec_data`. Every value read is
checked (see `data_errors`); consume the datasets inside `pipeline_errors.surface_data_errors` so that bad
data arrives as one DataError rather than a TensorFlow error.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, Optional, Sequence

import numpy as np
import tensorflow as tf

import datasets
import hugectr_data
import split_tfrecords
import synthetic_data
import torchrec_data
from batch import TableReads
from batch_reader import BatchReader
from data_errors import DataError
from feature_spec import DEFAULT_SPEC_NAME, SPLIT_BINARY, TEST_MAPPING, TRAIN_MAPPING, FeatureSpec

DATASET_TYPES = ("tf_raw", "synthetic", "split_tfrecords", *hugectr_data.DATASET_TYPES, *torchrec_data.DATASET_TYPES)
VALIDATE_BATCH = 1 << 18  # samples per read of a file layout's up-front scan (--validate_data)


@dataclass
class InputPipelines:
    """What the training loop consumes: one-epoch datasets, their lengths and the spec."""
    train: tf.data.Dataset
    test: tf.data.Dataset
    feature_spec: FeatureSpec
    train_steps: int
    eval_steps: int
    teacher_auc: Optional[float] = None


@dataclass(frozen=True)
class PipelineConfig:
    """How one rank reads its batches: plain values (main.py fills them from its flags).

    Batch sizes are global. `reads` says which categorical features this rank reads and for which
    rows (`ShardingPlan.reads`; None: every feature, local rows). `validate_data` reads every file
    once up front to check its values (not for synthetic data); `check_values` checks each batch as it is read
    (on by default; off only to measure its cost). The synthetic lengths are in batches.
    """
    dataset_type: str = "tf_raw"
    train_batch_size: int = 65536
    eval_batch_size: int = 65536
    rank: int = 0
    world_size: int = 1
    reads: Optional[TableReads] = None
    shuffle_batch_order: bool = False
    seed: int = 12345
    compute_dtype: tf.DType = tf.float32
    synthetic_train_batches: int = 64008
    synthetic_eval_batches: int = 1350
    validate_data: bool = False
    check_values: bool = True


def _check_partitioning(config: PipelineConfig, num_categorical: int) -> TableReads:
    """The rank, the batch sizes and the features read are consistent; returns what the rank reads."""
    if config.dataset_type not in DATASET_TYPES:
        raise ValueError(f"dataset_type must be one of {DATASET_TYPES}, got {config.dataset_type!r}")
    if config.world_size < 1 or not 0 <= config.rank < config.world_size:
        raise ValueError(f"rank {config.rank} is not in [0, world_size={config.world_size})")
    for flag, batch in (("train batch size (--batch_size)", config.train_batch_size),
                        ("eval batch size (--valid_batch_size)", config.eval_batch_size)):
        if batch < 1:
            raise ValueError(f"{flag} must be positive, got {batch}")
        if batch % config.world_size:
            raise ValueError(f"{flag} {batch} is a global batch and must be divisible by the "
                             f"number of ranks {config.world_size}")
    reads = config.reads or TableReads.every_table(num_categorical)
    reads.check(num_categorical)
    return reads


def _check_batch_fits(batch_size: int, num_samples: int, what: str, where: str) -> None:
    if batch_size > num_samples:
        raise DataError(f"{where}: the {what} batch size {batch_size} is larger than the "
                                 f"{num_samples} samples of the {what} data")


def load_feature_spec(*, dataset_type: str = "tf_raw", dataset_path: Optional[str] = None,
                      feature_spec_name: str = DEFAULT_SPEC_NAME, use_feature_spec: bool = False,
                      num_numerical_features: int = 13,
                      cardinalities: Sequence[int] = (1000,) * 26,
                      allow_external_paths: bool = False,
                      hugectr_cardinalities: Optional[Sequence[int]] = None,
                      hugectr_dense_log: Optional[bool] = None,
                      hotness: Optional[Sequence[int]] = None,
                      num_embeddings_per_feature: Optional[Sequence[int]] = None) -> FeatureSpec:
    """The validated spec of the dataset, or the default spec of the synthetic dimensions.

    A tf_raw spec's files must lie inside `dataset_path` unless `allow_external_paths`; the files
    of a split-TFRecords dataset, and of a spec shaping synthetic data, are not the spec's business.
    HugeCTR raw and SOK split folders have no spec file: `hugectr_data.load_spec` derives it (the
    hugectr_ arguments describe a HugeCTR raw folder without metadata.json). `hotness` (one per
    table, default 1) shapes the default synthetic spec's ids per sample. A torchrec_npy folder's
    spec is `torchrec_data.load_spec`'s (`num_embeddings_per_feature`: TorchRec's table sizes)."""
    if dataset_type not in DATASET_TYPES:
        raise ValueError(f"dataset_type must be one of {DATASET_TYPES}, got {dataset_type!r}")
    hugectr_data.check_raw_options(dataset_type, hugectr_cardinalities, hugectr_dense_log)
    torchrec_data.check_options(dataset_type, num_embeddings_per_feature)
    if dataset_type in torchrec_data.DATASET_TYPES:
        if not dataset_path:
            raise ValueError(f"dataset_path is required for dataset_type {dataset_type!r}")
        return torchrec_data.load_spec(dataset_path, num_embeddings_per_feature, feature_spec_name)
    if dataset_type in hugectr_data.DATASET_TYPES:
        if not dataset_path:
            raise ValueError(f"dataset_path is required for dataset_type {dataset_type!r}")
        return hugectr_data.load_spec(dataset_type, dataset_path, hugectr_cardinalities, hugectr_dense_log)
    if dataset_type != "synthetic" or use_feature_spec:
        if not dataset_path:
            raise ValueError(f"dataset_path is required for dataset_type {dataset_type!r}"
                             + (" from a feature spec" if dataset_type == "synthetic" else ""))
        spec_path = os.path.join(dataset_path, feature_spec_name)
        if dataset_type != "synthetic" and not allow_external_paths:
            _check_spec_inside(spec_path, dataset_path)
        spec = FeatureSpec.from_yaml(spec_path)
        spec.check_feature_spec(chunk_type=SPLIT_BINARY if dataset_type == "tf_raw" else None,
                                allow_external_paths=allow_external_paths, allowed_by="--allow_external_data_paths")
        return spec
    if hotness is not None and len(hotness) != len(cardinalities):
        raise ValueError(f"--synthetic_dataset_hotness gives {len(hotness)} values, but "
                         f"--synthetic_dataset_cardinalities {len(cardinalities)} tables; give one per table")
    return FeatureSpec.get_default_feature_spec(num_numerical_features, list(cardinalities), hotness=hotness)


def _check_spec_inside(spec_path: str, dataset_path: str) -> None:
    """A spec's files are read relative to the spec's own folder, so a spec outside the dataset
    folder (an absolute or ../ --feature_spec) would silently train on another folder's files."""
    spec_dir, data_dir = os.path.realpath(os.path.dirname(spec_path)), os.path.realpath(dataset_path)
    if spec_dir != data_dir and not spec_dir.startswith(data_dir.rstrip(os.sep) + os.sep):
        raise ValueError(f"--feature_spec {spec_path} lies outside --dataset_path {dataset_path}, and its data files "
                         f"would be read relative to {spec_dir}: give --dataset_path {spec_dir}, or pass "
                         f"--allow_external_data_paths to read them there")


def create_input_pipelines(spec: FeatureSpec, config: PipelineConfig) -> InputPipelines:
    """The train and eval pipelines of this rank, from the spec `load_feature_spec` returned.

    Every bad input raises before any batch is read. Synthetic data is drawn in memory from the
    teacher of `synthetic_data.SyntheticTeacher` (batch order fixed).
    """
    reads = _check_partitioning(config, len(spec.categorical_names))
    if config.dataset_type == "synthetic":
        return _synthetic_pipelines(spec, config, reads)
    if config.dataset_type == "split_tfrecords":
        return _split_tfrecords_pipelines(spec, config, reads)
    reader_class = _file_reader(config.dataset_type, spec)
    counts = None if reader_class else spec.check_files()
    where = spec.path or spec.base_directory
    readers: Dict[str, BatchReader] = {}
    for mapping, batch in ((TRAIN_MAPPING, config.train_batch_size), (TEST_MAPPING, config.eval_batch_size)):
        options = dict(rank=config.rank, world_size=config.world_size, reads=reads,
                       drop_remainder=(mapping == TRAIN_MAPPING), numerical_dtype=config.compute_dtype,
                       check_values=config.check_values)
        readers[mapping] = (reader_class(spec, mapping, batch, **options) if reader_class else
                            datasets.SplitBinaryReader(spec, mapping, batch, num_samples=counts[mapping], **options))
        _check_batch_fits(batch, readers[mapping].num_samples, mapping, where)
    if config.validate_data and reader_class:
        for mapping in (TRAIN_MAPPING, TEST_MAPPING):
            reader_class(spec, mapping, VALIDATE_BATCH, drop_remainder=False).check_every_batch()
    elif config.validate_data:
        datasets.validate_data(spec, (TRAIN_MAPPING, TEST_MAPPING))
    return InputPipelines(
        train=readers[TRAIN_MAPPING].dataset(config.shuffle_batch_order, config.seed),
        test=readers[TEST_MAPPING].dataset(),
        feature_spec=spec, train_steps=len(readers[TRAIN_MAPPING]),
        eval_steps=len(readers[TEST_MAPPING]),
        teacher_auc=spec.metadata.get("teacher_auc"))


def _file_reader(dataset_type: str, spec: FeatureSpec) -> Optional[type]:
    """The reader class of a spec without files (HugeCTR/SOK records, TorchRec days); None: the
    spec's split-binary files."""
    if dataset_type in hugectr_data.DATASET_TYPES and hugectr_data.record_format(spec) is not None:
        return hugectr_data.RecordReader
    if dataset_type in torchrec_data.DATASET_TYPES:
        return torchrec_data.DayReader
    return None


def _synthetic_pipelines(spec: FeatureSpec, config: PipelineConfig, reads: TableReads) -> InputPipelines:
    """In-memory teacher-labelled data; every rank draws the same global batches from the seed."""
    if config.synthetic_train_batches < 1 or config.synthetic_eval_batches < 1:
        raise ValueError(f"synthetic data needs at least one train and one eval batch, got "
                         f"{config.synthetic_train_batches} and {config.synthetic_eval_batches}")
    teacher = synthetic_data.SyntheticTeacher.for_spec(spec, config.seed)
    rng = np.random.default_rng(config.seed)
    splits = [synthetic_data.make_synthetic_split(teacher, batch, count, rng)
              for batch, count in ((config.train_batch_size, config.synthetic_train_batches),
                                   (config.eval_batch_size, config.synthetic_eval_batches))]
    train, test = (synthetic_data.synthetic_dataset(split, reads, config.rank, config.world_size,
                                                    config.compute_dtype)
                   for split in splits)
    return InputPipelines(train=train, test=test, feature_spec=spec,
                          train_steps=config.synthetic_train_batches, eval_steps=config.synthetic_eval_batches,
                          teacher_auc=splits[1].teacher_auc)


def _split_tfrecords_pipelines(spec: FeatureSpec, config: PipelineConfig, reads: TableReads) -> InputPipelines:
    """Prebatched records read in order; both batch sizes must be the prebatch size."""
    if config.shuffle_batch_order:
        raise ValueError("shuffle_batch_order is not available for split_tfrecords data: its records "
                         "are read in stored order")
    where = spec.path or spec.base_directory
    readers = {}
    for mapping, batch in ((TRAIN_MAPPING, config.train_batch_size), (TEST_MAPPING, config.eval_batch_size)):
        readers[mapping] = split_tfrecords.SplitTFRecordsReader(
            spec, mapping, batch, rank=config.rank, world_size=config.world_size, reads=reads,
            numerical_dtype=config.compute_dtype, check_values=config.check_values)
        _check_batch_fits(batch, len(readers[mapping]) * batch, mapping, where)
        if config.validate_data:
            for _ in split_tfrecords.SplitTFRecordsReader(spec, mapping, batch).read_samples():
                pass
    return InputPipelines(
        train=readers[TRAIN_MAPPING].dataset(), test=readers[TEST_MAPPING].dataset(), feature_spec=spec,
        train_steps=len(readers[TRAIN_MAPPING]), eval_steps=len(readers[TEST_MAPPING]),
        teacher_auc=spec.metadata.get("teacher_auc"))
