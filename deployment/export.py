"""`python -m deployment.export`: a checkpoint of any world size as an ONNX model for serving, checked.

    python -m deployment.export --checkpoint CKPT --dataset_path DATA --output EXPORT [--int8_tables]

CKPT is a checkpoint folder (or a folder of them: the newest) written by main.py / dlrm.py / dcnv2.py
(`--save_checkpoint_path`) or by wide_and_deep/main.py (`--model_dir`); checkpoints hold every table
whole, so one trained on N ranks exports on one process. DATA is the dataset it was trained on:
its feature spec gives the features' names, hotness and pooling, and its test split (W&D: its eval
split) checks the export. The model is rebuilt the way `main.py --mode deploy` and
`wide_and_deep/main.py --evaluate` rebuild it (factory.single_process_model, WideAndDeep) and
restored by `checkpoint.restore`; its weights become the ONNX graph of `deployment/onnx_graph.py`.

The export checks itself before anything is written: on up to --check_samples samples of the test
split, ONNX Runtime's probabilities must equal TensorFlow's within TOLERANCE (float32 tables), else
one error line, exit 1 and nothing written. It prints both AUCs with log loss, normalized entropy
and calibration (recsys.runtime.metrics), and records them in serving.json's `checks`. With
--int8_tables the tables become 8-bit rows (deployment/quantize.py): the float32 graph is still
checked against TensorFlow, and the export reports the tables' bytes and the AUC change.

EXPORT receives `model.onnx`, `serving.json` (the serving contract: inputs, features, pad id,
table dtype, the checkpoint and its step) and `check_samples.npz` (the check's inputs, labels and
TensorFlow's probabilities, which `python -m deployment.score` sends to a server), built beside it
and renamed into place whole. It may
be new, empty or an earlier export (serving.json of EXPORT_FORMAT and nothing else): any other
folder is refused. Bad input is one `error: ...` line and exit 2 (recsys/runtime/cli.py).
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from deployment import onnx_graph
from deployment.contract import PROBABILITY_TOLERANCE
from deployment.quantize import quantize_rows, worth_quantizing
from recsys.runtime import cli
from recsys.runtime.metrics import serving_scores as scores
from recsys.runtime.safe_io import OutputPathError, atomic_directory, check_replaceable, refuse_overlap

EXPORT_FORMAT = "dlrm-tf2-serving"
EXPORT_VERSION = 1
SERVING_FILE = "serving.json"
ONNX_FILE = "model.onnx"
EXTERNAL_DATA = "model.onnx.data"  # the weights of a model over PROTOBUF_LIMIT, beside model.onnx
# The check's samples: the two inputs, the labels and TensorFlow's probabilities, for deployment.score
CHECK_SAMPLES_FILE = "check_samples.npz"
EXPORT_ENTRIES = frozenset({SERVING_FILE, ONNX_FILE, EXTERNAL_DATA, CHECK_SAMPLES_FILE})
PROTOBUF_LIMIT = 2**31 - 2**26  # a protobuf message holds at most 2 GiB; leave room for the graph
TOLERANCE = PROBABILITY_TOLERANCE  # max |ONNX Runtime - TensorFlow| of a probability, float32 tables
DEFAULT_DATASET_TYPES = {"dlrm": "tf_raw", "wide_and_deep": "tfrecords"}


class ExportCheckError(RuntimeError):
    """ONNX Runtime's predictions differ from TensorFlow's: nothing is written (exit 1)."""


def build_parser() -> cli.ArgumentParser:
    parser = cli.ArgumentParser(prog="python -m deployment.export", allow_abbrev=False,
                                description="Export a checkpoint as an ONNX model and serving.json, checked "
                                            "against TensorFlow on the test split")
    parser.add_argument("--checkpoint", required=True,
                        help="A checkpoint folder (step_*), or a folder of them (the newest is exported)")
    parser.add_argument("--dataset_path", required=True,
                        help="The dataset the model was trained on: its feature spec (W&D: metadata.json or "
                             "feature_spec.yaml) and test split (W&D: eval split)")
    parser.add_argument("--output", required=True, help="The export folder: new, empty, or an earlier export")
    parser.add_argument("--dataset_type", default=None,
                        help="The dataset's format (default: tf_raw for DLRM/DCNv2, tfrecords for Wide & Deep)")
    parser.add_argument("--feature_spec", default="feature_spec.yaml",
                        help="DLRM: the feature spec's file name inside --dataset_path")
    parser.add_argument("--int8_tables", action="store_true",
                        help="Embedding tables as 8-bit rows with a float32 scale and bias per row (default: float32)")
    parser.add_argument("--check_samples", type=int, default=65536,
                        help="Test samples the export is checked on (at most; the test split may hold fewer)")
    parser.add_argument("--batch_size", type=int, default=4096, help="Samples per batch of the check")
    return parser


@dataclass
class Restored:
    """A restored model's ONNX weights, its serving description and the check's samples with
    TensorFlow's probabilities."""
    kind: str  # dlrm, dcnv2 or wide_and_deep
    weights: Any  # onnx_graph.DlrmWeights or WideDeepWeights
    numerical_names: List[str]
    categorical: List[Dict[str, Any]]  # name, cardinality, hotness; in column order
    numerical: np.ndarray = field(repr=False)  # float32 [n, n_num]
    categorical_ids: np.ndarray = field(repr=False)  # int32 [n, sum of hotness]
    labels: np.ndarray = field(repr=False)
    tf_probabilities: np.ndarray = field(repr=False)


def check_output(output: str, inputs: Dict[str, str]) -> None:
    """The export folder may be written: not onto an input, and new, empty or an earlier export (a
    serving.json of EXPORT_FORMAT and only what an export writes). Raises OutputPathError naming --output."""
    refuse_overlap(output, "--output", inputs)
    if os.path.isdir(output) and os.listdir(output):
        try:
            with open(os.path.join(output, SERVING_FILE)) as f:
                ours = json.load(f).get("format") == EXPORT_FORMAT
        except (OSError, ValueError, AttributeError):
            ours = False
        if not ours:
            raise OutputPathError(f"--output {output} is a non-empty folder that is not an export of this project "
                                  f"(no {SERVING_FILE} of format {EXPORT_FORMAT}); refusing to replace it")
    check_replaceable(output, "--output", EXPORT_ENTRIES, replace=True)


def _take(batches, limit: int) -> List[Any]:
    """The first batches holding `limit` samples (the last one cut)."""
    taken, count = [], 0
    for batch in batches:
        taken.append(batch)
        count += len(batch[-1])
        if count >= limit:
            break
    return taken


def _joined(parts: Sequence[np.ndarray], limit: int, dtype) -> np.ndarray:
    return np.concatenate(parts)[:limit].astype(dtype)


def dlrm_weights(model) -> onnx_graph.DlrmWeights:
    """The ONNX graph's weights of a one-process DLRM / DCNv2 (`model.Dlrm`), as numpy arrays."""
    config = model.config
    dense = {name: variable.numpy() for name, variable in model.dense_weight_map().items()}

    def stack(prefix: str, count: int) -> List[onnx_graph.Dense]:
        return [onnx_graph.Dense(dense[f"{prefix}_layer_{i}_kernel"], dense[f"{prefix}_layer_{i}_bias"])
                for i in range(count)]
    cross = None
    if config.cross:
        low_rank = bool(config.cross_layer_projection_dim)
        cross = [onnx_graph.CrossLayer(dense[f"cross_layer_{i}_u_kernel"] if low_rank else None,
                                       dense[f"cross_layer_{i}_{'v' if low_rank else 'w'}_kernel"],
                                       dense[f"cross_layer_{i}_bias"]) for i in range(config.num_cross_layers)]
    return onnx_graph.DlrmWeights(
        num_numerical=config.num_numerical_features,
        tables=[np.asarray(view.read_rows(0, view.rows), np.float32) for view in model.table_views()],
        hotness=config.feature_hotness, poolings=config.feature_poolings,
        bottom=stack("bottom_mlp", len(config.bottom_mlp_dims)), top=stack("top_mlp", len(config.top_mlp_dims)),
        cross=cross)


def restore_dlrm(manifest, args) -> Restored:
    """A DLRM / DCNv2 checkpoint restored into the one-process model of the dataset's features, and
    its predictions on the test split."""
    import tensorflow as tf

    import saved_model
    from datasets import load_feature_spec
    from factory import single_process_model
    from recsys.data import data_formats
    from recsys.data.batch import CATEGORICAL_KEY, NUMERICAL_KEY
    from recsys.data.feature_spec import TEST_MAPPING
    from recsys.data.pipeline_errors import surface_data_errors
    from recsys.training import checkpoint
    from recsys.training.model_config import DlrmConfig, DlrmSettings

    dataset_type = args.dataset_type or DEFAULT_DATASET_TYPES["dlrm"]
    spec = load_feature_spec(dataset_type=dataset_type, dataset_path=args.dataset_path,
                             feature_spec_name=args.feature_spec)
    saved, defaults = manifest.model_config, DlrmSettings()
    try:
        widths = saved["embedding_dim"]
        config = DlrmConfig(
            bottom_mlp_dims=[int(d) for d in saved["bottom_mlp_dims"]], top_mlp_dims=[int(d) for d in saved["top_mlp_dims"]],
            interaction="cross" if saved.get("interaction") == "cross" else "tensorflow",
            num_cross_layers=saved.get("num_cross_layers", defaults.num_cross_layers),
            cross_layer_projection_dim=saved.get("cross_layer_projection_dim", defaults.cross_layer_projection_dim),
            num_numerical_features=len(spec.numerical_names), cardinalities=list(spec.cardinalities),
            embedding_dim=(widths,) * len(spec.cardinalities) if isinstance(widths, int) else tuple(widths),
            hotness=list(spec.hotness), poolings=list(spec.poolings))
        model = single_process_model(config)
    except (KeyError, TypeError) as error:
        raise checkpoint.CheckpointError(f"{manifest.path}: its model_config is not a DLRM's ({error!r} "
                                         f"missing or malformed)") from None
    model.build_weights()
    tables = model.table_views()
    optimizer = {key: saved[key] for key in ("optimizer",) if key in saved}
    checkpoint.restore(manifest, checkpoint.TrainingState(
        config.shape_fields() | optimizer, list(spec.categorical_names), tables, [{} for _ in tables],
        model.dense_weight_map(), {}, {}))

    data_format = data_formats.get(dataset_type, "training")

    def test_reader(batch: int):
        return data_format.reader(spec, TEST_MAPPING, batch, rank=0, world_size=1, reads=None, drop_remainder=False,
                                  numerical_dtype=tf.float32, check_values=True)
    available = test_reader(1).num_samples
    if available == 0:
        raise ValueError(f"--dataset_path {args.dataset_path}: the test split holds no samples to check the export on")
    limit = min(args.check_samples, available)
    predict = tf.function(lambda features: tf.sigmoid(model(features, training=False)))
    numerical, ids, labels, probabilities = [], [], [], []
    with surface_data_errors():
        for features, batch_labels in _take(test_reader(min(args.batch_size, limit)).dataset(), limit):
            numerical.append(tf.cast(features[NUMERICAL_KEY], tf.float32).numpy())
            ids.append(saved_model.padded_serving_ids(features[CATEGORICAL_KEY], config.feature_hotness).numpy())
            labels.append(np.asarray(batch_labels).reshape(-1))
            probabilities.append(predict(features).numpy().reshape(-1))
    weights = dlrm_weights(model)
    categorical = [{"name": name, "cardinality": int(cardinality), "hotness": int(hotness)} for name, cardinality, hotness
                   in zip(spec.categorical_names, spec.cardinalities, config.feature_hotness)]
    return Restored("dcnv2" if config.cross else "dlrm", weights, list(spec.numerical_names), categorical,
                    _joined(numerical, limit, np.float32), _joined(ids, limit, np.int32),
                    _joined(labels, limit, np.float32), _joined(probabilities, limit, np.float32))


def wide_and_deep_weights(model) -> onnx_graph.WideDeepWeights:
    """The ONNX graph's weights of a `wd_model.WideAndDeep`, as numpy arrays: its stacked tables cut
    into one table per feature, in feature-contract order."""
    from wide_and_deep import features as F
    from wide_and_deep import wd_model

    buckets = model.config.buckets
    named = {name: variable.numpy() for name, variable in model.named_variables().items()}

    def per_feature(stacked: np.ndarray, names: Sequence[str]) -> Dict[str, np.ndarray]:
        ends = np.cumsum([buckets[name] for name in names])
        return dict(zip(names, np.split(stacked, ends[:-1])))
    wide = per_feature(named["wide_table"], F.CATEGORICAL_NAMES)
    deep: Dict[str, np.ndarray] = {}
    for width in wd_model.DEEP_WIDTHS:
        deep |= per_feature(named[f"deep_table_{width}"], [n for n in F.CATEGORICAL_NAMES if F.EMBEDDING_DIMS[n] == width])
    order = [("categorical", F.CATEGORICAL_NAMES.index(name)) if name in F.BUCKETS
             else ("numerical", F.NUMERIC_FEATURES.index(name)) for name in F.deep_input_order()]
    return onnx_graph.WideDeepWeights(
        num_numerical=len(F.NUMERIC_FEATURES), wide_tables=[wide[name] for name in F.CATEGORICAL_NAMES],
        wide=onnx_graph.Dense(named["wide_kernel"], named["wide_bias"]),
        deep_tables=[deep[name] for name in F.CATEGORICAL_NAMES], deep_order=order,
        hidden=[onnx_graph.Dense(named[f"deep_dense_{i}_kernel"], named[f"deep_dense_{i}_bias"])
                for i in range(len(model.hidden))],
        head=onnx_graph.Dense(named["deep_head_kernel"], named["deep_head_bias"]))


def restore_wide_and_deep(manifest, args) -> Restored:
    """A Wide & Deep checkpoint restored into the model of the dataset's buckets, and its predictions
    on the eval split."""
    from recsys.training import checkpoint
    from wide_and_deep import features as F
    from wide_and_deep import wd_data, wd_model

    dataset_type = args.dataset_type or DEFAULT_DATASET_TYPES["wide_and_deep"]
    options = ({"train_data_pattern": [os.path.join(args.dataset_path, "train", "part*")],
                "eval_data_pattern": [os.path.join(args.dataset_path, "eval", "part*")]}
               if dataset_type == "tfrecords" else {})
    _, evaluation = wd_data.open_splits(dataset_type, args.dataset_path, options)
    try:
        config = wd_model.WideDeepConfig(hidden_units=tuple(int(u) for u in manifest.model_config["hidden_units"]),
                                         buckets=dict(evaluation.buckets))
    except (KeyError, TypeError, ValueError) as error:
        raise checkpoint.CheckpointError(f"{manifest.path}: its model_config is not a Wide & Deep one ({error!r} "
                                         f"missing or malformed)") from None
    model = wd_model.WideAndDeep(config, use_kernel=False)
    model.build_all()
    checkpoint.restore(manifest, checkpoint.TrainingState(config.describe(), F.deep_input_order(), [], [],
                                                          model.named_variables(), {}, {}))
    if len(evaluation) == 0:
        raise ValueError(f"--dataset_path {args.dataset_path}: the eval split holds no records to check the export on")
    predict = wd_model.predict_fn(model)
    limit, numerical, ids, labels, probabilities, count = args.check_samples, [], [], [], [], 0
    with wd_data.surface_record_errors():
        for batch in evaluation.dataset(wd_data.eval_record_groups(len(evaluation), 1, 0, 1), config.buckets):
            numerical.append(batch["numeric"].numpy())
            ids.append(batch["categorical"].numpy())
            labels.append(batch["label"].numpy())
            probabilities.append(predict(batch["categorical"], batch["numeric"]).numpy())
            count += len(labels[-1])
            if count >= limit:
                break
    weights = wide_and_deep_weights(model)
    categorical = [{"name": name, "cardinality": int(config.buckets[name]), "hotness": 1} for name in F.CATEGORICAL_NAMES]
    return Restored("wide_and_deep", weights, list(F.NUMERIC_FEATURES), categorical,
                    _joined(numerical, limit, np.float32), _joined(ids, limit, np.int32),
                    _joined(labels, limit, np.float32), _joined(probabilities, limit, np.float32))


def with_int8_tables(weights: Any) -> Any:
    """`weights` with every table that is smaller so (quantize.worth_quantizing) as 8-bit rows."""
    def quantized(tables: Sequence[np.ndarray]) -> list:
        return [quantize_rows(t) if worth_quantizing(t.shape[1]) else t for t in tables]
    if isinstance(weights, onnx_graph.WideDeepWeights):
        return replace(weights, deep_tables=quantized(weights.deep_tables))
    return replace(weights, tables=quantized(weights.tables))


def all_tables(weights: Any) -> list:
    """Every embedding table of `weights` (W&D: the wide ones, then the deep ones)."""
    if isinstance(weights, onnx_graph.WideDeepWeights):
        return [*weights.wide_tables, *weights.deep_tables]
    return list(weights.tables)


def graph(weights: Any):
    return (onnx_graph.wide_and_deep_graph(weights) if isinstance(weights, onnx_graph.WideDeepWeights)
            else onnx_graph.dlrm_graph(weights))


def save_onnx(model, folder: str, name: str) -> str:
    """`model` as `folder/name`, its weights in `name`.data beside it when the model is over PROTOBUF_LIMIT."""
    import onnx

    path = os.path.join(folder, name)
    large = model.ByteSize() > PROTOBUF_LIMIT
    onnx.save_model(model, path, save_as_external_data=large, all_tensors_to_one_file=True,
                    location=f"{name}.data", size_threshold=1024)
    return path


def onnx_probabilities(path: str, restored: Restored, batch_size: int) -> np.ndarray:
    """ONNX Runtime's probabilities of the model at `path` on the check's samples, batch by batch."""
    import onnxruntime

    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    parts = []
    for start in range(0, len(restored.labels), batch_size):
        parts.append(session.run([onnx_graph.PROBABILITIES], {
            onnx_graph.NUMERICAL: restored.numerical[start:start + batch_size],
            onnx_graph.CATEGORICAL: restored.categorical_ids[start:start + batch_size]})[0].reshape(-1))
    return np.concatenate(parts)


def describe(name: str, values: Dict[str, float]) -> str:
    return f"  {name:<11} " + ", ".join(f"{key} {value:.6f}" for key, value in values.items())


def export(args) -> Dict[str, Any]:
    """Restore, build, check and write the export folder (whole or not at all); returns serving.json."""
    from recsys.training import checkpoint

    manifest = checkpoint.open_checkpoint(args.checkpoint)
    is_wide_and_deep = manifest.model_config.get("model") == "wide_and_deep"
    restored = (restore_wide_and_deep if is_wide_and_deep else restore_dlrm)(manifest, args)
    samples, labels = len(restored.labels), restored.labels
    tensorflow = scores(labels, restored.tf_probabilities)
    checks: Dict[str, Any] = {"samples": samples, "tolerance": TOLERANCE}
    with atomic_directory(args.output, replace=os.path.isdir(args.output)) as staging:
        float32_model = graph(restored.weights)
        if args.int8_tables:  # the float32 graph, checked first, is not kept
            float32_path = save_onnx(float32_model, staging, ".float32.onnx")
        else:
            float32_path = save_onnx(float32_model, staging, ONNX_FILE)
        float32_probabilities = onnx_probabilities(float32_path, restored, args.batch_size)
        difference = float(np.max(np.abs(float32_probabilities - restored.tf_probabilities)))
        print(f"export check on {samples} test samples: max |ONNX Runtime - TensorFlow| of the probabilities "
              f"= {difference:.3g} (limit {TOLERANCE:g})", flush=True)
        if not difference <= TOLERANCE:
            raise ExportCheckError(f"the ONNX model's probabilities differ from TensorFlow's by up to {difference:.3g} "
                                   f"(limit {TOLERANCE:g}) on {samples} test samples of {args.dataset_path}; "
                                   f"nothing was written to {args.output}")
        onnx_scores = scores(labels, float32_probabilities)
        print(describe("tensorflow", tensorflow), flush=True)
        print(describe("onnx", onnx_scores), flush=True)
        checks |= {"max_abs_diff": difference, "auc_tensorflow": tensorflow["auc"], "auc_onnx": onnx_scores["auc"],
                   "tensorflow": tensorflow, "onnx": onnx_scores}
        if args.int8_tables:
            for leftover in os.listdir(staging):
                os.remove(os.path.join(staging, leftover))
            weights = with_int8_tables(restored.weights)
            int8_probabilities = onnx_probabilities(save_onnx(graph(weights), staging, ONNX_FILE), restored,
                                                    args.batch_size)
            int8_scores = scores(labels, int8_probabilities)
            before, after = onnx_graph.table_bytes(all_tables(restored.weights)), onnx_graph.table_bytes(all_tables(weights))
            change = int8_scores["auc"] - onnx_scores["auc"]
            print(describe("onnx int8", int8_scores), flush=True)
            print(f"int8 tables: {before:,} -> {after:,} bytes ({before / after:.2f}x smaller); AUC "
                  f"{onnx_scores['auc']:.6f} -> {int8_scores['auc']:.6f} (change {change:+.6f}); max |int8 - float32| "
                  f"of the probabilities {float(np.max(np.abs(int8_probabilities - float32_probabilities))):.3g}",
                  flush=True)
            checks |= {"auc_onnx": int8_scores["auc"], "onnx": int8_scores, "onnx_float32": onnx_scores,
                       "int8": {"table_bytes_float32": before, "table_bytes_int8": after, "reduction": before / after,
                                "auc_change": change}}
        serving = {
            "format": EXPORT_FORMAT, "version": EXPORT_VERSION, "model": restored.kind, "onnx": ONNX_FILE,
            "inputs": [{"name": onnx_graph.NUMERICAL, "dtype": "float32", "shape": [-1, len(restored.numerical_names)]},
                       {"name": onnx_graph.CATEGORICAL, "dtype": "int32",
                        "shape": [-1, sum(c["hotness"] for c in restored.categorical)]}],
            "outputs": [{"name": onnx_graph.PROBABILITIES, "dtype": "float32", "shape": [-1, 1]}],
            "numerical_names": restored.numerical_names, "categorical": restored.categorical,
            "pad_id": onnx_graph.PAD_ID, "table_dtype": "int8" if args.int8_tables else "float32",
            "checkpoint": os.path.abspath(manifest.path), "step": manifest.step, "checks": checks,
            "check_samples": CHECK_SAMPLES_FILE}
        np.savez(os.path.join(staging, CHECK_SAMPLES_FILE), **{
            onnx_graph.NUMERICAL: restored.numerical, onnx_graph.CATEGORICAL: restored.categorical_ids,
            "labels": labels, "probabilities": restored.tf_probabilities})
        with open(os.path.join(staging, SERVING_FILE), "w") as f:
            json.dump(serving, f, indent=1)
    return serving


def user_errors() -> tuple:
    """Exceptions caused by bad input (a flag, the checkpoint, the dataset, the output folder)."""
    from recsys.data.data_errors import DataError
    from recsys.data.feature_spec import FeatureSpecError
    from recsys.training.checkpoint import CheckpointError

    return CheckpointError, FeatureSpecError, DataError, OutputPathError, ValueError, FileNotFoundError


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Parse, check the flags and the output folder, export; returns the exit code (recsys/runtime/cli.py)."""
    args = build_parser().parse_args(argv)
    for flag in ("check_samples", "batch_size"):
        if getattr(args, flag) < 1:
            return cli.bad_input(f"--{flag} must be >= 1, got {getattr(args, flag)}")
    for flag in ("checkpoint", "dataset_path"):
        if not os.path.isdir(getattr(args, flag)):
            return cli.bad_input(f"--{flag} {getattr(args, flag)} is not a folder")
    try:
        check_output(args.output, {"--checkpoint": args.checkpoint, "--dataset_path": args.dataset_path})
        serving = export(args)
    except ExportCheckError as error:
        return cli.failure(error)
    except user_errors() as error:
        return cli.bad_input(error)
    print(f"exported {serving['model']} (step {serving['step']}, {serving['table_dtype']} tables) to: {args.output}",
          flush=True)
    return 0


if __name__ == "__main__":
    from recsys.runtime.stop_signals import run_stopping_at_once

    # SIGINT/SIGTERM unwind the staging folder (atomic_directory) and end as one line, exit 128 + N
    sys.exit(run_stopping_at_once(main))
