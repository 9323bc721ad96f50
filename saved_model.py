"""SavedModel export for serving, and loading one back for eval and inference (reference §6.2).

The exported signature `serving_default` takes `numerical_features` float32 `[B, n_num]` and
`categorical_features` int32 `[B, sum of the features' hotness]` and returns `probabilities`
and `logits`, both float32 `[B, 1]`. The signature declares both inputs of any shape and its graph
checks them (rank 2, each width, the same B rows), so a caller in Python, saved_model_cli or a C++
server gets one InvalidArgumentError naming the input and both shapes, never TensorFlow's binding
or MatMul errors; the export marker records the expected widths (and, from main.py, the features'
names, which `load_predict_fn` compares with the dataset's before any batch is served). The
categorical columns are the features in feature-spec order, each `hotness` columns wide
(FeatureSpec `hotness`; one-hot models: `[B, n_cat]`, one id per feature). Multi-hot features
are padded: a sample's ids fill the feature's columns in any order and the padding id PAD_ID (-1,
no id) fills the rest; sum and mean pooling count only the real ids (mean divides by their number;
a row of padding pools to zeros). One-hot features take no padding. The export marker records
the hotness, so `load_predict_fn` pads the pipeline's `[B]`, `[B, h]` or ragged ids the same way.
The export always uses the TF-ops interaction, which has the same layout as the custom op, so the
SavedModel runs without the compiled op library.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Callable, Dict, Optional, Sequence, Tuple

import tensorflow as tf

from recsys.data.batch import CATEGORICAL_KEY, NUMERICAL_KEY
from recsys.sparse.tables import copy_table
from factory import single_process_model
from model import Dlrm
from recsys.data.pipeline_errors import SERVING_INPUT_ERROR
from recsys.runtime.safe_io import OutputPathError, atomic_directory, check_replaceable

SIGNATURE = "serving_default"
# Written into every export; an existing folder is replaced only when it holds this marker.
EXPORT_MARKER = "dlrm_export.json"
EXPORT_FORMAT = "dlrm-tf2-savedmodel"
# 2: the marker records the number of numerical features and may name the features, and the
# signature's shapes are unknown (checked in its graph). Version 1 exports (widths fixed in the
# signature, no names) still load; their widths are read from the signature.
EXPORT_VERSION = 2
# Everything tf.saved_model.save and `export` put into the folder.
EXPORT_ENTRIES = frozenset({"saved_model.pb", "variables", "assets", "fingerprint.pb", "keras_metadata.pb",
                            EXPORT_MARKER})
PAD_ID = -1  # fills a multi-hot feature's unused serving columns: no id


class ServingMismatchError(ValueError):
    """A SavedModel and a dataset (or batch) that do not have the same features."""


@dataclasses.dataclass(frozen=True)
class ServedFeatures:
    """The features behind the signature's columns, in column order: the numerical features'
    names, the categorical features' names and each one's hotness (its number of columns)."""
    numerical: Tuple[str, ...]
    categorical: Tuple[str, ...]
    hotness: Tuple[int, ...]

    def __post_init__(self) -> None:  # any sequences in, tuples kept: equal features compare equal
        for name in ("numerical", "categorical", "hotness"):
            object.__setattr__(self, name, tuple(getattr(self, name)))

    def describe(self) -> str:
        """Both name lists, as error messages quote them."""
        multihot = "" if set(self.hotness) <= {1} else f" of hotness {list(self.hotness)}"
        return (f"numerical features {list(self.numerical)} and categorical features "
                f"{list(self.categorical)}{multihot}")


def _passed(ok: tf.Tensor, message: Callable[[], tf.Tensor], tensor: tf.Tensor) -> tf.Tensor:
    """`tensor`, once the scalar `ok` holds; else fail with the string `message()` builds (only on
    that failure path)."""
    def fail() -> tf.Tensor:
        with tf.control_dependencies([tf.debugging.Assert(False, [message()])]):
            return tf.identity(tensor)

    return tf.cond(ok, lambda: tf.identity(tensor), fail)


def _checked(tensor: tf.Tensor, bad: tf.Tensor, template: str,
             values: Callable[[tf.Tensor, tf.Tensor], list]) -> tf.Tensor:
    """`tensor`, once no element of `bad` [B, n] is True; else fail with `template` formatted for
    the first bad (row, column, *values)."""
    def message() -> tf.Tensor:
        row, column = tf.unstack(tf.where(bad)[0])
        return tf.strings.format(template, [row, column, *values(row, column)])

    return _passed(~tf.reduce_any(bad), message, tensor)


def _shape_text(tensor: tf.Tensor) -> tf.Tensor:
    """`tensor`'s shape as Python writes a tuple: (4, 15), (2,), (). The serving errors use no
    square brackets: TensorFlow's assertion text closes the message with one."""
    dims = tf.strings.reduce_join(tf.strings.as_string(tf.shape(tensor)), separator=", ")
    return tf.strings.join(["(", dims, tf.where(tf.equal(tf.rank(tensor), 1), ",", ""), ")"])


def _with_width(tensor: tf.Tensor, name: str, width: int, what: str) -> tf.Tensor:
    """`tensor` as `[B, width]`, once it is of rank 2 and `width` columns wide; else fail naming
    `name`, its shape and the expected one (`what` says what the columns are)."""
    shape = tf.shape(tensor)
    ok = tf.equal(tf.rank(tensor), 2) & tf.equal(tf.reduce_prod(shape[1:]), width)
    checked = _passed(ok, lambda: tf.strings.join([
        f"{SERVING_INPUT_ERROR} {name} has shape ", _shape_text(tensor),
        f", the model expects (B, {width}): {what}"]), tensor)
    # A reshape, not ensure_shape or set_shape: a static shape put on the checked tensor lets Grappler
    # infer the input's rank from it and fold `ok` to true for a rank-3 input of the right width.
    return tf.reshape(checked, [-1, width])


class _Serving(tf.Module):
    """The serving signature. It refuses, with an InvalidArgumentError starting
    `pipeline_errors.SERVING_INPUT_ERROR`: an input that is not `[B, its width]` (naming the input and both
    shapes), inputs with different numbers of rows, ids outside [0, cardinality) of their column
    (PAD_ID is also allowed in a multi-hot feature's columns; other ids would read a neighbouring
    table's rows in the fused layout) and non-finite numericals (naming the row and column)."""

    def __init__(self, model: Dlrm) -> None:
        super().__init__(name="dlrm_serving")
        self.model = model
        config = model.config
        self.hotness = config.feature_hotness
        # Any shape: a fixed one would be refused by TensorFlow's own binding, before the graph's checks.
        self.serve = tf.function(self._serve, input_signature=[
            tf.TensorSpec(None, tf.float32, name=NUMERICAL_KEY), tf.TensorSpec(None, tf.int32, name=CATEGORICAL_KEY)])

    def _checked_shapes(self, numerical_features: tf.Tensor,
                        categorical_features: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
        """Both inputs as `[B, width]` of the same B, or the error naming what is wrong."""
        numerical = self.model.config.num_numerical_features
        numerical_features = _with_width(numerical_features, NUMERICAL_KEY, numerical,
                                         f"B samples of its {numerical} numerical features")
        ids = (f"one id of each of its {len(self.hotness)} categorical features" if set(self.hotness) == {1} else
               f"the ids of its {len(self.hotness)} categorical features, hotness "
               f"{', '.join(map(str, self.hotness))} columns each")
        categorical_features = _with_width(categorical_features, CATEGORICAL_KEY, sum(self.hotness),
                                           f"B samples of {ids}")
        rows = tf.shape(numerical_features)[0], tf.shape(categorical_features)[0]
        categorical_features = _passed(tf.equal(*rows), lambda: tf.strings.format(
            f"{SERVING_INPUT_ERROR} {NUMERICAL_KEY} has {{}} rows and {CATEGORICAL_KEY} {{}}: both must "
            f"have B rows, one per sample of the batch", rows), categorical_features)
        return numerical_features, categorical_features

    def _serve(self, numerical_features: tf.Tensor, categorical_features: tf.Tensor) -> Dict[str, tf.Tensor]:
        numerical_features, categorical_features = self._checked_shapes(numerical_features, categorical_features)
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
    `[B, sum of hotness]`, multi-hot features padded with PAD_ID. Ids of another number of
    features, of more than a feature's hotness or (where shapes are known) of different numbers of
    rows raise ServingMismatchError: concatenated, they would pass for other columns or fail in
    TensorFlow's words."""
    if len(ids) != len(hotness):
        raise ServingMismatchError(f"the batch has {len(ids)} categorical features, the SavedModel serves "
                                   f"{len(hotness)} (hotness {list(hotness)})")
    rows = [x.shape[0] for x in ids]
    if None not in rows and len(set(rows)) > 1:
        raise ServingMismatchError(f"the categorical features have {rows} rows: each must have the batch's B rows")
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
        elif x.shape.rank != 2 or x.shape[1] > width:
            raise ServingMismatchError(f"categorical feature {feature} has shape {tuple(x.shape)}, the SavedModel "
                                       f"expects (B,) or (B, h) of h <= its hotness {width}")
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


def check_export_target(path: str, name: str) -> None:
    """An export may replace only an empty folder or an earlier export of this project: one with
    the marker file and nothing an export does not write. Raises OutputPathError naming `name`."""
    if os.path.isdir(path) and os.listdir(path) and not _is_export(path):
        raise OutputPathError(f"{name} {path} is a non-empty directory without this project's export marker "
                              f"{EXPORT_MARKER}; refusing to replace it (give a new or empty folder)")
    check_replaceable(path, name, EXPORT_ENTRIES, replace=True)


def export(model: Dlrm, output_path: str, fp16: bool = False, features: Optional[ServedFeatures] = None) -> str:
    """Write a SavedModel of `model`'s current weights, with the export marker, to `output_path`.

    The marker records the hotness and the number of numerical features, and `features`' names
    when given (main.py gives the dataset's), so that `load_predict_fn` can refuse another dataset.
    The folder is written next to `output_path` and renamed into place, so a failed export leaves
    the previous one intact; only what `check_export_target` accepts is ever replaced.
    """
    if features is not None and (len(features.numerical) != model.config.num_numerical_features
                                 or list(features.hotness) != model.config.feature_hotness):
        raise ValueError(f"the model's {model.config.num_numerical_features} numerical features and hotness "
                         f"{model.config.feature_hotness} are not those of {features.describe()}")
    check_export_target(output_path, "export path")
    portable = model.config.interaction if model.config.cross else "tensorflow"  # runs on any device
    config = dataclasses.replace(model.config, interaction=portable,
                                 table_dtype="float16" if fp16 else model.config.table_dtype,
                                 host_tables=[], mlp_backward="tensorflow")
    serving_model = single_process_model(config)
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
                names = {} if features is None else {"numerical_names": list(features.numerical),
                                                     "categorical_names": list(features.categorical)}
                json.dump({"format": EXPORT_FORMAT, "version": EXPORT_VERSION, "hotness": module.hotness,
                           "num_numerical_features": config.num_numerical_features} | names, f)
    except (OSError, tf.errors.OpError) as error:  # a full disk, a lost mount: nothing was replaced
        raise OutputPathError(f"{output_path}: cannot write the SavedModel: {' '.join(str(error).split())}") from None
    return output_path


def _signature_width(spec: tf.TensorSpec) -> Optional[int]:
    """The width a version-1 signature fixed for an input (None where the signature leaves it open)."""
    return spec.shape[1] if spec.shape.rank == 2 else None


def _check_dataset(path: str, marker: dict, serve: Callable, dataset: ServedFeatures) -> None:
    """Refuse a dataset whose features are not the export's: by name where the marker names them,
    else by the number of numerical features and the categorical features' hotness, from the marker
    or (version 1, which fixed the widths in the signature; the oldest, one-hot, had no hotness)
    from the signature. Raises ServingMismatchError naming both."""
    specs = serve.structured_input_signature[1]
    numerical = marker.get("num_numerical_features") or _signature_width(specs[NUMERICAL_KEY])
    hotness = marker.get("hotness") or [1] * (_signature_width(specs[CATEGORICAL_KEY]) or 0)
    if "numerical_names" in marker:
        exported = ServedFeatures(marker["numerical_names"], marker["categorical_names"], hotness)
        if exported != dataset:
            only = [f"{name} only in the {where}" for ours, theirs, where in ((dataset, exported, "dataset"),
                                                                              (exported, dataset, "export"))
                    for name in ours.numerical + ours.categorical if name not in theirs.numerical + theirs.categorical]
            raise ServingMismatchError(f"the SavedModel {path} was exported for {exported.describe()}, but the dataset "
                                       f"has {dataset.describe()}" + (f" ({'; '.join(only)})" if only else ""))
    elif numerical and hotness and (numerical, tuple(hotness)) != (len(dataset.numerical), dataset.hotness):
        shape = "" if set(hotness) <= {1} else f" of hotness {hotness}"
        raise ServingMismatchError(f"the SavedModel {path} serves {numerical} numerical and {len(hotness)} categorical "
                                   f"features{shape} (its marker names none: an older export), but the dataset has "
                                   f"{dataset.describe()}")


def load_predict_fn(path: str, dataset: Optional[ServedFeatures] = None) -> Callable[[Dict[str, tf.Tensor]], tf.Tensor]:
    """A function from pipeline features to logits, backed by an exported SavedModel.

    With `dataset` (the features the pipeline will serve), an export made for other features is
    refused here, before any batch (ServingMismatchError naming both); the function itself refuses
    a batch of other categorical features (`padded_serving_ids`) and the signature any other bad
    shape."""
    if not os.path.isfile(os.path.join(path, "saved_model.pb")):
        raise FileNotFoundError(f"{path}: not a SavedModel directory (no saved_model.pb)")
    signatures = tf.saved_model.load(path).signatures
    if SIGNATURE not in signatures:
        raise ValueError(f"{path}: the SavedModel has no '{SIGNATURE}' signature (it has {sorted(signatures)}); "
                         f"export one with --mode deploy")
    serve = signatures[SIGNATURE]
    marker = _marker(path) or {}
    if dataset is not None:
        _check_dataset(path, marker, serve, dataset)
    hotness = marker.get("hotness")

    def predict(features: Dict[str, tf.Tensor]) -> tf.Tensor:
        ids = features[CATEGORICAL_KEY]
        outputs = serve(numerical_features=tf.cast(features[NUMERICAL_KEY], tf.float32),
                        categorical_features=padded_serving_ids(ids, hotness or [1] * len(ids)))
        return outputs["logits"]

    return predict
