"""`python -m deployment.export` (issue 41): checkpoints of main.py on 2 ranks (horovodrun), of dcnv2.py on
multi-hot data and of wide_and_deep/main.py as ONNX models that ONNX Runtime runs as TensorFlow does;
--int8_tables (that export also served by Triton and scored by deployment.score); the graph's padding and
pooling against the model's own TensorFlow; bad input as one line with nothing written; the serving metrics (metrics.quality_metrics) on a hand-computed example.
The exports run in this process (`export.main`, its exit code and stderr): the training runs that
make their checkpoints are the entry points themselves."""
import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import onnxruntime
import pytest
import tensorflow as tf

from deployment import export, onnx_graph
from deployment.quantize import QuantizedTable, quantize_rows
from multiproc import (REPO_ROOT, assert_ok, assert_one_error, launch_env, require, run_horovod, run_python,
                       snapshot)
from recsys.data import synthetic_data
from recsys.data.batch import CATEGORICAL_KEY, NUMERICAL_KEY
from recsys.data.feature_spec import get_default_feature_spec
from recsys.runtime import metrics
from test_main import final_record

CARDINALITIES = [50, 400, 7, 30]
MODEL = ["--bottom_mlp_dims", "16,8", "--top_mlp_dims", "16,1", "--batch_size", "64", "--valid_batch_size", "100",
         "--learning_rate", "0.1", "--warmup_steps", "2", "--seed", "7", "--print_freq", "1000"]


def dataset(folder, hotness):
    """A split-binary dataset of 768 train and 300 test samples; a multi-hot one mean-pools feature 3."""
    spec = get_default_feature_spec(3, CARDINALITIES, str(folder), hotness=hotness)
    if max(hotness) > 1:
        spec.feature_spec[spec.categorical_names[3]]["pooling"] = "mean"
    synthetic_data.write_synthetic_dataset(spec, 768, 300, seed=5)
    return str(folder)


def exported(argv, capsys):
    """`python -m deployment.export argv` in this process, as a CompletedProcess (exit code, output)."""
    try:
        code = export.main([str(a) for a in argv])
    except SystemExit as stop:  # argparse's usage errors
        code = stop.code
    out, err = capsys.readouterr()
    sys.stdout.write(out)
    return subprocess.CompletedProcess(argv, code, out, err)


def serving(folder):
    with open(os.path.join(folder, "serving.json")) as f:
        return json.load(f)


def test_quality_metrics_on_a_hand_computed_example():
    labels = np.array([1, 0, 0, 1, 0])
    probabilities = np.array([0.8, 0.3, 0.1, 0.6, 0.2])
    loss = -(math.log(0.8) + math.log(0.7) + math.log(0.9) + math.log(0.6) + math.log(0.8)) / 5
    entropy = -(0.4 * math.log(0.4) + 0.6 * math.log(0.6))  # base CTR 2/5
    expected = {"log_loss": loss, "normalized_entropy": loss / entropy, "calibration": 2.0 / 2}
    assert metrics.quality_metrics(labels, probabilities) == pytest.approx(expected, rel=1e-12)
    logits = np.log(probabilities / (1 - probabilities))
    assert metrics.quality_metrics(labels, logits=logits) == pytest.approx(expected, rel=1e-9)
    assert metrics.quality_metrics(labels, probabilities * 1.5)["calibration"] == pytest.approx(1.5)
    one_class = metrics.quality_metrics(np.zeros(3), np.full(3, 0.5))
    assert math.isnan(one_class["normalized_entropy"]) and math.isnan(one_class["calibration"])


@pytest.mark.parametrize("cross", [False, True], ids=["dot", "cross-full-rank"])
def test_the_graph_pools_padded_ids_as_the_model_pools_ragged_ones(cross):
    """A multi-hot model with random weights: ONNX Runtime on the serving layout (padded with -1, a row
    of padding only among them) equals the model on ragged ids; the 8-bit graph equals the float32
    graph of its dequantized tables."""
    from factory import single_process_model
    from recsys.training.model_config import DlrmConfig
    from saved_model import padded_serving_ids

    tf.keras.utils.set_random_seed(3)
    hotness, cardinalities = [3, 1, 4], [20, 10, 15]
    config = DlrmConfig(num_numerical_features=3, cardinalities=cardinalities, embedding_dim=(4, 4, 4),
                        bottom_mlp_dims=[8, 4], top_mlp_dims=[8, 1], hotness=hotness, poolings=["sum", "sum", "mean"],
                        interaction="cross" if cross else "tensorflow", num_cross_layers=2, cross_layer_projection_dim=0)
    model = single_process_model(config)
    model.build_weights()
    rng = np.random.default_rng(0)
    rows = 9
    ragged = []
    for cardinality, width in zip(cardinalities, hotness):
        lengths = [width] if width == 1 else rng.integers(0, width + 1, rows).tolist()
        lengths = lengths * rows if width == 1 else [0, width, *lengths[2:]]  # an empty row and a full one
        ragged.append(tf.RaggedTensor.from_row_lengths(rng.integers(0, cardinality, sum(lengths)).astype(np.int32),
                                                       lengths))
    ids = [r.values if h == 1 else r for r, h in zip(ragged, hotness)]
    numerical = rng.standard_normal((rows, 3)).astype(np.float32)
    expected = tf.sigmoid(model({NUMERICAL_KEY: numerical, CATEGORICAL_KEY: tuple(ids)})).numpy()
    padded = padded_serving_ids(ids, hotness).numpy()
    assert (padded == -1).any()
    weights = export.dlrm_weights(model)
    session = onnxruntime.InferenceSession(onnx_graph.dlrm_graph(weights).SerializeToString())
    inputs = {"numerical_features": numerical, "categorical_features": padded}
    np.testing.assert_allclose(session.run(None, inputs)[0], expected, atol=1e-6)
    int8 = export.with_int8_tables(weights)
    assert all(isinstance(t, QuantizedTable) for t in int8.tables)
    dequantized = onnx_graph.dlrm_graph(export.replace(weights, tables=[t.dequantized() for t in int8.tables]))
    np.testing.assert_allclose(onnxruntime.InferenceSession(onnx_graph.dlrm_graph(int8).SerializeToString()).run(
        None, inputs)[0], onnxruntime.InferenceSession(dequantized.SerializeToString()).run(None, inputs)[0], atol=1e-6)


def test_per_row_quantization_is_within_half_a_step():
    table = np.random.default_rng(1).standard_normal((50, 8)).astype(np.float32)
    table[3] = 0.25  # a constant row comes back exactly
    quantized = quantize_rows(table, chunk_rows=16)
    assert quantized.values.dtype == np.uint8 and quantized.nbytes == 50 * 8 + 50 * 8
    error = np.abs(quantized.dequantized() - table)
    assert (error <= quantized.scale / 2 + 1e-7).all() and (error[3] == 0).all()


def test_a_two_rank_checkpoint_exports_and_onnx_runtime_predicts_as_tensorflow(tmp_path, capsys):
    """Trained on 2 ranks (horovodrun, tables sliced over both), exported on one process: ONNX Runtime
    equals TensorFlow within 1e-5 on the whole test split, the AUCs equal `main.py --mode eval`'s on the
    same checkpoint, whose final record has the normalized entropy and calibration the export prints."""
    data = dataset(tmp_path / "data", [1, 1, 1, 1])
    flags = [*MODEL, "--embedding_dim", "8", "--dot_interaction", "tensorflow", "--dataset_path", data]
    assert_ok(run_horovod(["main.py", *flags, "--max_steps", "6", "--column_slice_threshold", "200",
                           "--save_checkpoint_path", str(tmp_path / "ckpt"), "--log_path", str(tmp_path / "t.json")],
                          np=2))
    assert_ok(run_python(["main.py", *flags, "--mode", "eval", "--restore_checkpoint_path", str(tmp_path / "ckpt"),
                          "--log_path", str(tmp_path / "e.json")]))
    result = exported(["--checkpoint", tmp_path / "ckpt", "--dataset_path", data, "--output", tmp_path / "export"],
                      capsys)
    assert_ok(result)
    written = serving(tmp_path / "export")
    assert sorted(os.listdir(tmp_path / "export")) == ["check_samples.npz", "model.onnx", "serving.json"]
    checks, evaluation = written["checks"], final_record(tmp_path / "e.json")
    assert checks["samples"] == 300 and checks["max_abs_diff"] <= 1e-5
    assert checks["auc_onnx"] == pytest.approx(evaluation["auc"], abs=1e-6)
    assert checks["auc_tensorflow"] == pytest.approx(evaluation["auc"], abs=1e-6)
    for key, logged in (("log_loss", "test_loss"), ("normalized_entropy", "normalized_entropy"),
                        ("calibration", "calibration")):
        assert checks["onnx"][key] == pytest.approx(evaluation[logged], rel=1e-5), key
    assert f"tensorflow  auc {evaluation['auc']:.6f}" in result.stdout
    assert {key: written[key] for key in ("format", "version", "model", "onnx", "pad_id", "table_dtype", "step")} == {
        "format": "dlrm-tf2-serving", "version": 1, "model": "dlrm", "onnx": "model.onnx", "pad_id": -1,
        "table_dtype": "float32", "step": 6}
    assert written["inputs"] == [{"name": "numerical_features", "dtype": "float32", "shape": [-1, 3]},
                                 {"name": "categorical_features", "dtype": "int32", "shape": [-1, 4]}]
    assert [c["cardinality"] for c in written["categorical"]] == CARDINALITIES

    # an earlier export is replaced; a folder the export did not write, a corrupt checkpoint and a bad
    # flag are one line each, with nothing written
    assert_ok(exported(["--checkpoint", tmp_path / "ckpt", "--dataset_path", data, "--output", tmp_path / "export",
                        "--check_samples", "100"], capsys))
    assert serving(tmp_path / "export")["checks"]["samples"] == 100
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "plan.txt").write_text("mine")
    corrupt = tmp_path / "corrupt"
    shutil.copytree(tmp_path / "ckpt", corrupt)
    table = next(corrupt.glob("step_*/embeddings/feature_1.npy"))
    table.write_bytes(table.read_bytes()[:-4] + b"\0\0\0\0")
    before = snapshot(tmp_path)
    assert_one_error(exported(["--checkpoint", tmp_path / "ckpt", "--dataset_path", data, "--output",
                               tmp_path / "notes"], capsys), "--output", "not an export of this project", code=2)
    assert_one_error(exported(["--checkpoint", corrupt, "--dataset_path", data, "--output", tmp_path / "new"], capsys),
                     "feature_1.npy", "checksum mismatch", code=2)
    assert_one_error(exported(["--checkpoint", tmp_path / "ckpt", "--dataset_path", data, "--output",
                               tmp_path / "new", "--check_samples", "0"], capsys), "--check_samples", code=2)
    assert_one_error(exported(["--checkpoint", tmp_path / "ckpt", "--dataset_path", data, "--output",
                               tmp_path / "new", "--int8"], capsys), "--int8", code=2)
    assert snapshot(tmp_path) == before


def test_a_multi_hot_dcnv2_checkpoint_exports_with_int8_tables(tmp_path, capsys):
    """dcnv2.py on multi-hot data (feature 3 mean-pooled, tables of widths 8, 4, 4, 16): the float32 graph
    is checked against TensorFlow, the 8-bit one written with its size reduction and AUC change."""
    data = dataset(tmp_path / "data", [3, 1, 2, 5])
    assert_ok(run_python(["dcnv2.py", *MODEL, "--embedding_dim", "8,4,4,16", "--num_cross_layers", "2",
                          "--cross_layer_projection_dim", "4", "--dataset_path", data, "--max_steps", "8",
                          "--save_checkpoint_path", str(tmp_path / "ckpt"), "--log_path", str(tmp_path / "t.json")]))
    result = exported(["--checkpoint", tmp_path / "ckpt", "--dataset_path", data, "--output", tmp_path / "export",
                       "--int8_tables"], capsys)
    assert_ok(result)
    written = serving(tmp_path / "export")
    checks = written["checks"]
    assert written["model"] == "dcnv2" and written["table_dtype"] == "int8" and checks["max_abs_diff"] <= 1e-5
    assert [c["hotness"] for c in written["categorical"]] == [3, 1, 2, 5]
    int8 = checks["int8"]
    # 4-wide rows: 4 bytes + 8 of scale and bias instead of 16, the 8- and 16-wide ones far less
    assert int8["table_bytes_float32"] == 4 * (50 * 8 + 400 * 4 + 7 * 4 + 30 * 16)
    assert int8["table_bytes_int8"] == 50 * 16 + 400 * 12 + 7 * 12 + 30 * 24
    assert int8["auc_change"] == pytest.approx(checks["onnx"]["auc"] - checks["onnx_float32"]["auc"])
    assert abs(int8["auc_change"]) < 0.01
    assert "x smaller); AUC" in result.stdout
    assert sorted(os.listdir(tmp_path / "export")) == ["check_samples.npz", "model.onnx", "serving.json"]

    # served by Triton (.venv-serving), the padded multi-hot ids and 8-bit tables over gRPC: the served
    # predictions are the in-process ONNX Runtime's, their AUC the export's int8 AUC
    from test_serving import SERVING_PYTHON, run_serving

    require(SERVING_PYTHON.exists(), "no .venv-serving (scripts/setup.sh makes it)")
    scored = run_serving("-m", "deployment.score", str(tmp_path / "export"), "--protocol", "grpc", "--batch_size", "64",
                         "--record", str(tmp_path / "score.json"))
    assert scored.returncode == 0, scored.stdout[-2000:] + scored.stderr[-3000:]
    record = json.loads((tmp_path / "score.json").read_text())
    assert record["samples"] == 300 and record["max_abs_diff"] <= 1e-5
    assert record["served"]["auc"] == pytest.approx(checks["auc_onnx"], abs=1e-6)
    assert record["tensorflow"]["auc"] == pytest.approx(checks["tensorflow"]["auc"], abs=1e-9)


def test_a_wide_and_deep_checkpoint_exports(tmp_path, capsys):
    """One training step of wide_and_deep/main.py, exported: the wide and deep parts in ONNX equal
    TensorFlow's on the eval split, and the AUC, normalized entropy and calibration of the export's
    check are those of the training run's evaluation of the same weights."""
    from test_wd_train import SMALL_BUCKETS, data_flags, final, write_dataset

    data = str(tmp_path / "data")
    write_dataset(data, 4096, 4096, files=1)
    wd_main = [sys.executable, "main.py", *data_flags(data), "--deep_hidden_units", "32", "32",
               "--global_batch_size", "4096", "--eval_batch_size", "4096", "--num_epochs", "1",
               "--deep_warmup_epochs", "0", "--model_dir", str(tmp_path / "ckpt"), "--results_dir", str(tmp_path / "r")]
    assert_ok(subprocess.run(wd_main, cwd=os.path.join(REPO_ROOT, "wide_and_deep"), env=launch_env(),
                             capture_output=True, text=True, timeout=300))
    assert_ok(exported(["--checkpoint", tmp_path / "ckpt", "--dataset_path", data, "--output", tmp_path / "export"],
                       capsys))
    written, evaluation = serving(tmp_path / "export"), final(str(tmp_path / "r"))
    checks = written["checks"]
    assert written["model"] == "wide_and_deep" and checks["max_abs_diff"] <= 1e-5 and checks["samples"] == 4096
    assert {c["cardinality"] for c in written["categorical"]} == {SMALL_BUCKETS}
    assert checks["auc_onnx"] == pytest.approx(evaluation["auc_val"], abs=1e-6)
    for key in ("normalized_entropy", "calibration"):
        assert checks["onnx"][key] == pytest.approx(evaluation[f"{key}_val"], rel=1e-5), key
