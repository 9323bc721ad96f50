"""The datasets DLRM trains on (reference: `datasets.py`, the dataset side of the loader): the
`--dataset_type` formats, read from the registry of data formats (`recsys.data.data_formats`:
split-binary `tf_raw`, split-TFRecords, HugeCTR raw and SOK folders, TorchRec and MLPerf days,
synthetic data), and a dataset's checked FeatureSpec, found or derived by its format. `dataloader`
builds a rank's input pipelines from that spec. TensorFlow-free until a format's module is loaded.
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

from recsys.data import data_formats
from recsys.data.feature_spec import DEFAULT_SPEC_NAME, FeatureSpec


def dataset_types() -> Tuple[str, ...]:
    """The formats a model trains on (`--dataset_type`), from the registry."""
    return data_formats.names("training")


def load_feature_spec(*, dataset_type: str = "tf_raw", dataset_path: Optional[str] = None,
                      feature_spec_name: str = DEFAULT_SPEC_NAME, **options: Any) -> FeatureSpec:
    """The validated spec of the dataset, as its format finds or derives it (`data_formats`).

    `options` is the one mapping of everything a format may read: allow_external_paths (a tf_raw
    or split_tfrecords spec's files must lie inside `dataset_path` unless given), the synthetic
    spec's use_feature_spec, num_numerical_features, cardinalities and hotness, and the options one
    format owns (hugectr_cardinalities, hugectr_dense_log, num_embeddings_per_feature), refused for
    another format when given."""
    data_format = data_formats.get(dataset_type, "training")
    data_formats.check_options(dataset_type, options)
    return data_format.load_spec(dataset_path, feature_spec_name, options)
