"""SavedModel export for serving, and loading one back for eval and inference (reference §6.2).

The exported signature `serving_default` takes `numerical_features` float32 `[B, n_num]` and
`categorical_features` int32 `[B, n_cat]` (feature-spec order) and returns `probabilities`
and `logits`, both float32 `[B, 1]`. The export always uses the TF-ops interaction, which has the
same layout as the custom op, so the SavedModel runs without the compiled op library.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
from typing import Callable, Dict

import tensorflow as tf

from datasets import SERVING_INPUT_ERROR
from embedding import copy_table
from model import CATEGORICAL_KEY, NUMERICAL_KEY, Dlrm

SIGNATURE = "serving_default"


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
    """The serving signature. It refuses ids outside [0, cardinality) of their column (they would
    read a neighbouring table's rows in the fused layout) and non-finite numericals, with an
    InvalidArgumentError starting `datasets.SERVING_INPUT_ERROR` and naming the row and column."""

    def __init__(self, model: Dlrm) -> None:
        super().__init__(name="dlrm_serving")
        self.model = model
        config = model.config
        self.serve = tf.function(self._serve, input_signature=[
            tf.TensorSpec([None, config.num_numerical_features], tf.float32, name=NUMERICAL_KEY),
            tf.TensorSpec([None, len(config.cardinalities)], tf.int32, name=CATEGORICAL_KEY)])

    def _serve(self, numerical_features: tf.Tensor, categorical_features: tf.Tensor) -> Dict[str, tf.Tensor]:
        cardinalities = tf.constant(self.model.config.cardinalities, tf.int32)
        numerical_features = _checked(
            numerical_features, ~tf.math.is_finite(numerical_features),
            f"{SERVING_INPUT_ERROR} {NUMERICAL_KEY} row {{}}, column {{}} is {{}}; numerical features "
            f"must be finite", lambda row, column: [numerical_features[row, column]])
        categorical_features = _checked(
            categorical_features, (categorical_features < 0) | (categorical_features >= cardinalities),
            f"{SERVING_INPUT_ERROR} {CATEGORICAL_KEY} row {{}}, column {{}} has id {{}}, outside "
            f"[0, {{}}) given by the cardinality of that column",
            lambda row, column: [categorical_features[row, column], cardinalities[column]])
        ids = tuple(tf.unstack(categorical_features, num=len(self.model.config.cardinalities), axis=1))
        logits = self.model({NUMERICAL_KEY: numerical_features, CATEGORICAL_KEY: ids}, training=False)
        return {"probabilities": tf.sigmoid(logits), "logits": logits}


def export(model: Dlrm, output_path: str, fp16: bool = False) -> str:
    """Write a SavedModel of `model`'s current weights to `output_path` (replaced atomically)."""
    config = dataclasses.replace(model.config, interaction="tensorflow",
                                 table_dtype="float16" if fp16 else model.config.table_dtype,
                                 embedding_device_budget_bytes=None)
    serving_model = Dlrm(config)
    serving_model.build_weights()
    for source, target in zip(model.table_views(), serving_model.table_views()):
        copy_table(source, target)
    targets = serving_model.dense_weight_map()
    for name, variable in model.dense_weight_map().items():
        targets[name].assign(tf.cast(variable, targets[name].dtype))
    module = _Serving(serving_model)
    tmp = output_path.rstrip("/") + f".tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tf.saved_model.save(module, tmp, signatures={SIGNATURE: module.serve})
    if os.path.exists(output_path):
        shutil.rmtree(output_path)
    os.rename(tmp, output_path)
    return output_path


def load_predict_fn(path: str) -> Callable[[Dict[str, tf.Tensor]], tf.Tensor]:
    """A function from pipeline features to logits, backed by an exported SavedModel."""
    if not os.path.isfile(os.path.join(path, "saved_model.pb")):
        raise FileNotFoundError(f"{path}: not a SavedModel directory (no saved_model.pb)")
    serve = tf.saved_model.load(path).signatures[SIGNATURE]

    def predict(features: Dict[str, tf.Tensor]) -> tf.Tensor:
        categorical = tf.stack([tf.cast(t, tf.int32) for t in features[CATEGORICAL_KEY]], axis=1)
        outputs = serve(numerical_features=tf.cast(features[NUMERICAL_KEY], tf.float32),
                        categorical_features=categorical)
        return outputs["logits"]

    return predict

