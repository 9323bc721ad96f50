"""SavedModel export for serving, and loading one back for eval and inference (reference §6.2).

The exported signature `serving_default` takes `numerical_features` float32 `[B, n_num]` and
`categorical_features` int32 `[B, sum of the features' hotness]` and returns `probabilities`
and `logits`, both float32 `[B, 1]`. The categorical columns are the features in feature-spec
order, each `hotness` columns wide (FeatureSpec `hotness`; one-hot models: `[B, n_cat]`, one id
per feature). Multi-hot features are padded: a sample's ids fill the feature's columns in any
order and the padding id PAD_ID (-1, no id) fills the rest; sum and mean pooling count only the
real ids (mean divides by their number; a row of padding pools to zeros). One-hot features take
no padding. The export marker records the hotness, so `load_predict_fn` pads the pipeline's `[B]`,
`[B, h]` or ragged ids the same way. The export always uses the TF-ops interaction, which has the
same layout as the custom op, so the SavedModel runs without the compiled op library.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Callable, Dict, List, Optional, Sequence

import tensorflow as tf

from datasets import SERVING_INPUT_ERROR
from embedding import copy_table
from batch import CATEGORICAL_KEY, NUMERICAL_KEY
from model import Dlrm
from safe_io import OutputPathError, atomic_directory, check_replaceable

SIGNATURE = "serving_default"
# Written into every export; an existing folder is replaced only when it holds this marker.
EXPORT_MARKER = "dlrm_export.json"
EXPORT_FORMAT = "dlrm-tf2-savedmodel"
EXPORT_VERSION = 1
# Everything tf.saved_model.save and `export` put into the folder.
EXPORT_ENTRIES = frozenset({"saved_model.pb", "variables", "assets", "fingerprint.pb", "keras_metadata.pb",
                            EXPORT_MARKER})
PAD_ID = -1  # fills a multi-hot feature's unused serving columns: no id


def _checked(tensor: tf.Tensor, bad: tf.Tensor, template: str,
             values: Callable[[tf.Tensor, tf.Tensor], list]) -> tf.Tensor:
    """`tensor`, once no element of `bad` [B, n] is True; else fail with `template` formatted for
    the first bad (row, column, *values). The message is built only on that failure path."""
    def fail() -> tf.Tensor:
        row, column = tf.unstack(tf.where(bad)[0])
        message = tf.strings.format(template, [row, column, *values(row, column)])
        with tf.control_dependencies([tf.debugging.Assert(False, [message])]):
            return tf.identity(tensor)

    return tf.cond(tf.reduce_any(bad), fail, lambda: tf.identity(tensor))


class _Serving(tf.Module):
    """The serving signature. It refuses ids outside [0, cardinality) of their column (PAD_ID is
    also allowed in a multi-hot feature's columns; other ids would read a neighbouring table's rows
    in the fused layout) and non-finite numericals, with an InvalidArgumentError starting
    `datasets.SERVING_INPUT_ERROR` and naming the row and column."""

    def __init__(self, model: Dlrm) -> None:
        super().__init__(name="dlrm_serving")
        self.model = model
        config = model.config
        self.hotness = config.feature_hotness
        self.serve = tf.function(self._serve, input_signature=[
            tf.TensorSpec([None, config.num_numerical_features], tf.float32, name=NUMERICAL_KEY),
            tf.TensorSpec([None, sum(self.hotness)], tf.int32, name=CATEGORICAL_KEY)])

    def _serve(self, numerical_features: tf.Tensor, categorical_features: tf.Tensor) -> Dict[str, tf.Tensor]:
        column_cardinalities = tf.constant([c for c, h in zip(self.model.config.cardinalities, self.hotness)
                                            for _ in range(h)], tf.int32)
        lowest = tf.constant([0 if h == 1 else PAD_ID for h in self.hotness for _ in range(h)], tf.int32)
        numerical_features = _checked(
            numerical_features, ~tf.math.is_finite(numerical_features),
            f"{SERVING_INPUT_ERROR} {NUMERICAL_KEY} row {{}}, column {{}} is {{}}; numerical features "
            f"must be finite", lambda row, column: [numerical_features[row, column]])
        categorical_features = _checked(
            categorical_features, (categorical_features < lowest) | (categorical_features >= column_cardinalities),
            f"{SERVING_INPUT_ERROR} {CATEGORICAL_KEY} row {{}}, column {{}} has id {{}}, outside "
            f"[{{}}, {{}}) given by the cardinality of that column",
            lambda row, column: [categorical_features[row, column], lowest[column], column_cardinalities[column]])
        ids = []
        for columns, hotness in zip(tf.split(categorical_features, self.hotness, axis=1), self.hotness):
            ids.append(columns[:, 0] if hotness == 1 else tf.ragged.boolean_mask(columns, columns != PAD_ID))
        logits = self.model({NUMERICAL_KEY: numerical_features, CATEGORICAL_KEY: tuple(ids)}, training=False)
        return {"probabilities": tf.sigmoid(logits), "logits": logits}


def padded_serving_ids(ids: Sequence, hotness: Sequence[int]) -> tf.Tensor:
    """The pipeline's ids of every feature (`[B]`, `[B, h]` or ragged) as the signature's int32
    `[B, sum of hotness]`, multi-hot features padded with PAD_ID."""
    columns = []
    for feature, (x, width) in enumerate(zip(ids, hotness)):
        if isinstance(x, tf.RaggedTensor):
            longest = tf.reduce_max(x.row_lengths())
            with tf.control_dependencies([tf.debugging.assert_less_equal(
                    longest, tf.cast(width, longest.dtype),
                    message=f"categorical feature {feature} has more ids in a sample than its hotness {width}")]):
                columns.append(tf.cast(x.to_tensor(default_value=PAD_ID, shape=[None, width]), tf.int32))
        elif x.shape.rank == 1:
            columns.append(tf.cast(x, tf.int32)[:, None])
        else:
            x = tf.cast(x, tf.int32)
            columns.append(tf.pad(x, [[0, 0], [0, width - int(x.shape[1])]], constant_values=PAD_ID))
    return tf.concat(columns, axis=1)


def _marker(path: str) -> Optional[dict]:
    """The export marker's contents, or None when `path` holds no readable marker of this project."""
    try:
        with open(os.path.join(path, EXPORT_MARKER)) as f:
            marker = json.load(f)
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) and marker.get("format") == EXPORT_FORMAT else None


def _is_export(path: str) -> bool:
    """`path` holds this project's export marker."""
    return _marker(path) is not None


def _export_hotness(path: str) -> Optional[List[int]]:
    """The features' hotness an export recorded (None: an export from before multi-hot, one-hot)."""
    return (_marker(path) or {}).get("hotness")


def check_export_target(path: str, name: str) -> None:
    """An export may replace only an empty folder or an earlier export of this project: one with
    the marker file and nothing an export does not write. Raises OutputPathError naming `name`."""
    if os.path.isdir(path) and os.listdir(path) and not _is_export(path):
        raise OutputPathError(f"{name} {path} is a non-empty directory without this project's export marker "
                              f"{EXPORT_MARKER}; refusing to replace it (give a new or empty folder)")
    check_replaceable(path, name, EXPORT_ENTRIES, replace=True)


def export(model: Dlrm, output_path: str, fp16: bool = False) -> str:
    """Write a SavedModel of `model`'s current weights, with the export marker, to `output_path`.

    The folder is written next to `output_path` and renamed into place, so a failed export leaves
    the previous one intact; only what `check_export_target` accepts is ever replaced.
    """
    check_export_target(output_path, "export path")
    portable = model.config.interaction if model.config.cross else "tensorflow"  # runs on any device
    config = dataclasses.replace(model.config, interaction=portable,
                                 table_dtype="float16" if fp16 else model.config.table_dtype,
                                 host_tables=[])
    serving_model = Dlrm(config)
    serving_model.build_weights()
    for source, target in zip(model.table_views(), serving_model.table_views()):
        copy_table(source, target)
    targets = serving_model.dense_weight_map()
    for name, variable in model.dense_weight_map().items():
        targets[name].assign(tf.cast(variable, targets[name].dtype))
    module = _Serving(serving_model)
    try:
        with atomic_directory(output_path, replace=True) as tmp:
            tf.saved_model.save(module, tmp, signatures={SIGNATURE: module.serve})
            with open(os.path.join(tmp, EXPORT_MARKER), "w") as f:
                json.dump({"format": EXPORT_FORMAT, "version": EXPORT_VERSION, "hotness": module.hotness}, f)
    except (OSError, tf.errors.OpError) as error:  # a full disk, a lost mount: nothing was replaced
        raise OutputPathError(f"{output_path}: cannot write the SavedModel: {' '.join(str(error).split())}") from None
    return output_path


def load_predict_fn(path: str) -> Callable[[Dict[str, tf.Tensor]], tf.Tensor]:
    """A function from pipeline features to logits, backed by an exported SavedModel."""
    if not os.path.isfile(os.path.join(path, "saved_model.pb")):
        raise FileNotFoundError(f"{path}: not a SavedModel directory (no saved_model.pb)")
    signatures = tf.saved_model.load(path).signatures
    if SIGNATURE not in signatures:
        raise ValueError(f"{path}: the SavedModel has no '{SIGNATURE}' signature (it has {sorted(signatures)}); "
                         f"export one with --mode deploy")
    serve = signatures[SIGNATURE]
    hotness = _export_hotness(path)

    def predict(features: Dict[str, tf.Tensor]) -> tf.Tensor:
        ids = features[CATEGORICAL_KEY]
        outputs = serve(numerical_features=tf.cast(features[NUMERICAL_KEY], tf.float32),
                        categorical_features=padded_serving_ids(ids, hotness or [1] * len(ids)))
        return outputs["logits"]

    return predict

