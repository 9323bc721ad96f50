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
holds whole prebatches only, and is read in stored order). The dataset types are the formats of
`data_formats` that can train: each brings its spec (`datasets.load_feature_spec`) and its reader,
from which `create_input_pipelines` builds the rank's pipelines. Every value read is checked (see
`data_errors`); consume the datasets inside `pipeline_errors.surface_data_errors` so that bad data
arrives as one DataError rather than a TensorFlow error.
"""
from __future__ import annotations

from typing import Mapping


from recsys.data import data_formats
from recsys.data.batch import TableReads
from recsys.data.batch_reader import VALIDATE_BATCH
from recsys.data.data_errors import check_batch_fits
from recsys.data.data_formats import InputPipelines
from recsys.data.feature_spec import TEST_MAPPING, TRAIN_MAPPING, FeatureSpec
from recsys.data.pipelines import PipelineConfig


def _check_partitioning(config: PipelineConfig, num_categorical: int) -> TableReads:
    """The rank, the batch sizes and the features read are consistent; returns what the rank reads."""
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


def create_input_pipelines(spec: FeatureSpec, config: PipelineConfig) -> InputPipelines:
    """The train and eval pipelines of this rank, from the spec `datasets.load_feature_spec` returned, built
    by the format's reader (or its own `pipelines`). Every bad input raises before any batch is read."""
    data_format = data_formats.get(config.dataset_type, "training")
    reads = _check_partitioning(config, len(spec.categorical_names))
    if data_format.pipelines is not None:
        return data_format.pipelines(spec, config, reads)
    where = spec.path or spec.base_directory
    batches = {TRAIN_MAPPING: config.train_batch_size, TEST_MAPPING: config.eval_batch_size}
    readers = {}
    for mapping, batch in batches.items():
        readers[mapping] = data_format.reader(
            spec, mapping, batch, rank=config.rank, world_size=config.world_size, reads=reads,
            drop_remainder=(mapping == TRAIN_MAPPING), numerical_dtype=config.compute_dtype,
            check_values=config.check_values)
        check_batch_fits(batch, readers[mapping].num_samples, mapping, where)
    train, test = readers[TRAIN_MAPPING].dataset(config.shuffle_batch_order, config.seed), readers[TEST_MAPPING].dataset()
    if config.validate_data:
        (data_format.validate or _scan_every_batch(data_format))(spec, batches)
    return InputPipelines(train=train, test=test, feature_spec=spec, train_steps=len(readers[TRAIN_MAPPING]),
                          eval_steps=len(readers[TEST_MAPPING]), teacher_auc=spec.metadata.get("teacher_auc"))


def _scan_every_batch(data_format: data_formats.DataFormat):
    """The default up-front scan (--validate_data): every batch of each mapping read and checked
    by the format's reader, VALIDATE_BATCH samples at a time."""
    def scan(spec: FeatureSpec, batches: Mapping[str, int]) -> None:
        for mapping in batches:
            data_format.reader(spec, mapping, VALIDATE_BATCH, drop_remainder=False).check_every_batch()
    return scan
