"""main.py end to end: every mode, checkpoints, learning, 2-process data parallel (flag errors: test_flags.py)."""
import glob
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from recsys.training import checkpoint
from factory import single_process_model
from multiproc import REPO_ROOT, assert_ok, launch_env, run_horovod, run_python
from recsys.runtime.cpu_affinity import choose_cpus, describe, read_topology, resolve_auto
from recsys.runtime.precision import choose_precision, host_cpu_bf16_support
from recsys.runtime.logger import read_dllogger_file

SMALL_MODEL = ["--embedding_dim", "8", "--bottom_mlp_dims", "16,8", "--top_mlp_dims", "16,1",
               "--dot_interaction", "tensorflow", "--print_freq", "1000"]
SMALL_DATA = ["--dataset_type", "synthetic", "--synthetic_dataset_cardinalities", "50,20,7,30",
              "--synthetic_dataset_num_numerical_features", "5", "--synthetic_dataset_train_batches", "12",
              "--synthetic_dataset_valid_batches", "3", "--batch_size", "64", "--valid_batch_size", "100"]
SMALL = SMALL_MODEL + SMALL_DATA + ["--learning_rate", "0.1", "--warmup_steps", "2", "--seed", "7"]


def main_py(args, **kwargs):
    return run_python(["main.py", *args], **kwargs)


def final_record(log_path):
    records = [r for r in read_dllogger_file(str(log_path)) if r["type"] == "LOG" and r["step"] == []]
    assert records, f"no end-of-run record in {log_path}"
    return records[-1]["data"]


def checkpoint_arrays(path):
    path = checkpoint.resolve(str(path))
    return {os.path.relpath(f, path): np.load(f) for f in sorted(glob.glob(f"{path}/*/*.npy"))}


def test_training_approaches_the_teacher_auc(tmp_path):
    log = tmp_path / "log.json"
    result = main_py(["--dataset_type", "synthetic", "--synthetic_dataset_cardinalities", "100,100,80,80,60,60,50,50",
                      "--synthetic_dataset_train_batches", "300", "--synthetic_dataset_valid_batches", "20",
                      "--batch_size", "1024", "--valid_batch_size", "4096", "--epochs", "4",
                      "--embedding_dim", "16", "--bottom_mlp_dims", "64,16", "--top_mlp_dims", "128,64,1",
                      "--optimizer", "adam", "--learning_rate", "0.01", "--warmup_steps", "50",
                      "--print_freq", "100", "--log_path", str(log)], timeout=600)
    assert_ok(result)
    data = final_record(log)
    assert data["teacher_auc"] - data["auc"] < 0.02, data
    assert data["throughput"] > 0 and data["mean_step_time_ms"] > 0
    assert {"validation_loss", "train_loss"} <= set(data)
    assert "step=300/1200, epoch=1/4, throughput=" in result.stdout and "learning_rate=" in result.stdout


def test_a_short_run_reports_its_throughput_and_says_when_evaluations_cannot_all_run(tmp_path):
    """12 steps, shorter than the timer's warm-up (2 x --print_freq): the final record still has a
    throughput; 20 evaluations per epoch of 12 steps cannot all run, and the run says how many do."""
    result = main_py(SMALL + ["--evals_per_epoch", "20", "--log_path", str(tmp_path / "t.json")])
    assert_ok(result)
    assert "--evals_per_epoch 20: an epoch has only 12 steps, so 11 evaluation(s) run per epoch" in result.stdout
    record = final_record(tmp_path / "t.json")
    assert record["throughput"] > 0 and record["evaluations"] == 11, record


def test_modes_eval_inference_deploy_and_saved_model_predictions(tmp_path):
    ckpt = tmp_path / "ckpt"
    assert_ok(main_py(SMALL + ["--save_checkpoint_path", str(ckpt), "--log_path", str(tmp_path / "t.json")]))
    assert_ok(main_py(SMALL + ["--mode", "eval", "--restore_checkpoint_path", str(ckpt),
                               "--log_path", str(tmp_path / "e.json")]))
    evaluation = final_record(tmp_path / "e.json")
    assert 0.0 <= evaluation["auc"] <= 1.0 and evaluation["test_loss"] > 0
    assert_ok(main_py(SMALL + ["--mode", "inference", "--restore_checkpoint_path", str(ckpt), "--max_steps", "14",
                               "--auc_thresholds", "8000",
                               "--synthetic_dataset_valid_batches", "14", "--log_path", str(tmp_path / "i.json")]))
    inference = final_record(tmp_path / "i.json")
    for key in ("mean_inference_throughput", "mean_inference_latency", "p50_inference_latency",
                "p90_inference_latency", "p95_inference_latency", "p99_inference_latency", "auc"):
        assert inference[key] > 0, key
    assert inference["measured_batches"] == 4  # 14 batches, 10 warm-up batches excluded

    exported = tmp_path / "saved_model"
    result = main_py(SMALL + ["--mode", "deploy", "--restore_checkpoint_path", str(ckpt),
                              "--saved_model_output_path", str(exported)])
    assert_ok(result)
    assert f"deployed to: {exported}" in result.stdout
    # Live model restored from the checkpoint vs the SavedModel, in this process and via saved_model_cli.
    import tensorflow as tf

    from recsys.data.batch import CATEGORICAL_KEY, NUMERICAL_KEY
    from recsys.training.model_config import DlrmConfig
    config = DlrmConfig(num_numerical_features=5, cardinalities=[50, 20, 7, 30], embedding_dim=(8,) * 4,
                        bottom_mlp_dims=[16, 8], top_mlp_dims=[16, 1], interaction="tensorflow")
    tf.keras.utils.set_random_seed(0)
    live = single_process_model(config)
    live.build_weights()
    for table, array in zip(live.table_views(), checkpoint.table_arrays(str(ckpt))):
        table.write_rows(0, table.rows, np.asarray(array))
    saved = checkpoint_arrays(ckpt)
    for name, variable in live.dense_weight_map().items():
        variable.assign(saved[f"dense/{name}.npy"])
    rng = np.random.default_rng(0)
    numerical = rng.random((6, 5)).astype(np.float32)
    categorical = np.stack([rng.integers(0, c, 6) for c in (50, 20, 7, 30)], axis=1).astype(np.int32)
    expected = tf.sigmoid(live({NUMERICAL_KEY: numerical,
                                CATEGORICAL_KEY: tuple(tf.constant(c) for c in categorical.T)})).numpy()
    served = tf.saved_model.load(str(exported)).signatures["serving_default"](
        numerical_features=tf.constant(numerical), categorical_features=tf.constant(categorical))
    np.testing.assert_allclose(served["probabilities"].numpy(), expected, rtol=1e-5)
    np.save(tmp_path / "num.npy", numerical)
    np.save(tmp_path / "cat.npy", categorical)
    cli = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
    out_dir = tmp_path / "cli_out"
    assert_ok(subprocess.run([cli, "run", "--dir", str(exported), "--tag_set", "serve", "--signature_def",
                              "serving_default", "--inputs",
                              f"numerical_features={tmp_path / 'num.npy'};categorical_features={tmp_path / 'cat.npy'}",
                              "--outdir", str(out_dir)], capture_output=True, text=True, env=launch_env(),
                             timeout=300))
    np.testing.assert_allclose(np.load(out_dir / "probabilities.npy"), expected, rtol=1e-5)

    assert_ok(main_py(SMALL + ["--mode", "eval", "--saved_model_input_path", str(exported),
                               "--log_path", str(tmp_path / "s.json")]))
    assert final_record(tmp_path / "s.json")["auc"] == pytest.approx(evaluation["auc"], abs=1e-6)


def test_a_saved_model_is_refused_on_a_dataset_with_other_features(tmp_path):
    data = ["--dataset_type", "synthetic", "--synthetic_dataset_train_batches", "2",
            "--synthetic_dataset_valid_batches", "12", "--batch_size", "64", "--valid_batch_size", "64"]
    exported = tmp_path / "saved_model"
    assert_ok(main_py(SMALL_MODEL + data + ["--synthetic_dataset_cardinalities", "50,20,7",
                                            "--synthetic_dataset_num_numerical_features", "3",
                                            "--saved_model_output_path", str(exported)]))
    exported_lists = "numerical features ['num_0', 'num_1', 'num_2'] and categorical features ['cat_0.bin', " \
                     "'cat_1.bin', 'cat_2.bin']"
    for mode, cardinalities, numerical, dataset_lists in [
            ("eval", "50,20,7,30", "3", "numerical features ['num_0', 'num_1', 'num_2'] and categorical features "
                                        "['cat_0.bin', 'cat_1.bin', 'cat_2.bin', 'cat_3.bin'] (cat_3.bin only in the "
                                        "dataset)"),
            ("inference", "50,20,7,30", "3", "(cat_3.bin only in the dataset)"),
            ("eval", "50,20,7", "4", "numerical features ['num_0', 'num_1', 'num_2', 'num_3'] and categorical "
                                     "features ['cat_0.bin', 'cat_1.bin', 'cat_2.bin'] (num_3 only in the dataset)")]:
        log = tmp_path / f"{mode}_{numerical}.json"
        result = main_py(SMALL_MODEL + data + ["--synthetic_dataset_cardinalities", cardinalities,
                                               "--synthetic_dataset_num_numerical_features", numerical,
                                               "--mode", mode, "--saved_model_input_path", str(exported),
                                               "--log_path", str(log)])
        assert result.returncode == 2, result.stderr[-3000:]
        errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
        assert errors == [errors[0]] and errors[0].startswith(
            f"error: the SavedModel {exported} was exported for {exported_lists}, but the dataset has "), errors
        assert dataset_lists in errors[0] and "Traceback" not in result.stderr
        assert not log.exists()  # refused before the log's first record, before any evaluation


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adagrad"])
def test_resumed_run_ends_with_the_same_weights(tmp_path, optimizer):
    common = SMALL + ["--optimizer", optimizer, "--deterministic", "--epochs", "2",
                      "--learning_rate", "0.05" if optimizer == "sgd" else "0.01"]
    assert_ok(main_py(common + ["--save_checkpoint_path", str(tmp_path / "full")]))
    assert_ok(main_py(common + ["--max_steps", "17", "--save_checkpoint_path", str(tmp_path / "part")]))
    assert checkpoint.resolve(str(tmp_path / "part")).endswith("step_000000017")
    assert_ok(main_py(common + ["--restore_checkpoint_path", str(tmp_path / "part"),
                                "--save_checkpoint_path", str(tmp_path / "resumed")]))
    full, resumed = checkpoint_arrays(tmp_path / "full"), checkpoint_arrays(tmp_path / "resumed")
    assert full.keys() == resumed.keys() and any(".m.npy" in k for k in full) == (optimizer == "adam")
    assert any(".accumulator.npy" in k for k in full) == (optimizer == "adagrad")
    for name in full:
        np.testing.assert_array_equal(full[name], resumed[name], err_msg=name)
    assert int(full["state/lr_schedule_step.npy"]) == 24


def test_restoring_a_different_model_lists_the_mismatch(tmp_path):
    assert_ok(main_py(SMALL + ["--max_steps", "2", "--run_eagerly", "--save_checkpoint_path", str(tmp_path / "c")]))
    result = main_py([a if a != "16,8" else "16,4" for a in SMALL]
                     + ["--embedding_dim", "4", "--mode", "eval", "--restore_checkpoint_path", str(tmp_path / "c")])
    assert result.returncode != 0
    assert "different model" in result.stderr and "embedding_dim: checkpoint 8, current 4" in result.stderr
    assert "Traceback" not in result.stderr


def test_keep_last_k_checkpoints(tmp_path):
    assert_ok(main_py(SMALL + ["--checkpoint_every_n_steps", "3", "--keep_checkpoints", "2", "--xla",
                               "--save_checkpoint_path", str(tmp_path / "c")]))
    names = [os.path.basename(p) for p in checkpoint.list_checkpoints(str(tmp_path / "c"))]
    assert names == ["step_000000009", "step_000000012"]


def test_nan_loss_stops_training_and_keeps_the_last_good_checkpoint(tmp_path):
    root = tmp_path / "c"
    result = main_py(SMALL + ["--learning_rate", "1e30", "--warmup_steps", "1000000", "--max_steps", "10",
                              "--checkpoint_every_n_steps", "1", "--save_checkpoint_path", str(root)])
    assert result.returncode != 0
    assert "error:" in result.stderr and ("NaN" in result.stderr or "nan" in result.stderr)
    found = checkpoint.list_checkpoints(str(root))
    assert found and not glob.glob(f"{root}/.step_*.tmp-*")
    for path in found:
        for name, array in checkpoint_arrays(path).items():
            assert np.isfinite(array).all(), name
    assert_ok(main_py(SMALL + ["--mode", "eval", "--restore_checkpoint_path", str(root)]))


def test_sigkill_during_save_leaves_the_previous_checkpoint_loadable(tmp_path):
    root = tmp_path / "c"
    big = ["--synthetic_dataset_cardinalities", "3000000,20", "--embedding_dim", "8",
           "--bottom_mlp_dims", "16,8", "--top_mlp_dims", "16,1", "--dot_interaction", "tensorflow",
           "--dataset_type", "synthetic", "--synthetic_dataset_num_numerical_features", "5",
           "--synthetic_dataset_train_batches", "50", "--synthetic_dataset_valid_batches", "1",
           "--batch_size", "64", "--valid_batch_size", "64", "--print_freq", "1000"]
    process = subprocess.Popen([sys.executable, "main.py", *big, "--checkpoint_every_n_steps", "1",
                                "--keep_checkpoints", "5", "--save_checkpoint_path", str(root)],
                               cwd=REPO_ROOT, env=launch_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 240
        while time.time() < deadline:
            if checkpoint.list_checkpoints(str(root)) and glob.glob(f"{root}/.step_*.tmp-*/embeddings/*"):
                break
            time.sleep(0.02)
        else:
            pytest.fail("no save in progress was observed")
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert glob.glob(f"{root}/.step_*.tmp-*"), "the kill should have interrupted a save"
    latest = checkpoint.resolve(str(root))
    assert all(os.path.isfile(os.path.join(p, checkpoint.MANIFEST)) for p in glob.glob(f"{root}/step_*"))
    assert_ok(main_py(big + ["--mode", "eval", "--restore_checkpoint_path", str(root)]))
    assert latest == checkpoint.resolve(str(root))


def test_two_process_training_matches_one_process_and_checkpoints_move_between_world_sizes(tmp_path):
    """Gloo here; MPI's transport gets the same check across hosts (test_cluster.py's 3-host equivalence)."""
    args = SMALL + ["--deterministic", "--cpu", "--column_slice_threshold", "200"]
    assert_ok(main_py(args + ["--max_steps", "0", "--save_checkpoint_path", str(tmp_path / "init")]))
    start = ["--restore_checkpoint_path", str(tmp_path / "init"), "--max_steps", "6"]
    assert_ok(main_py(args + start + ["--save_checkpoint_path", str(tmp_path / "one"),
                                      "--log_path", str(tmp_path / "1.json")]))
    two_ranks = run_horovod(["main.py", *args, *start, "--save_checkpoint_path", str(tmp_path / "two"),
                             "--log_path", str(tmp_path / "2.json"), "--cpu_embedding_type", "fused"],
                            np=2)
    assert_ok(two_ranks)
    # a one-process layout flag on several ranks is said, not silently dropped
    assert "--cpu_embedding_type fused: on 2 ranks each rank keeps its slices" in two_ranks.stdout + two_ranks.stderr
    # --affinity auto: where this host has a core for each, the 2 ranks run on their own CPUs
    topology = read_topology(sorted(os.sched_getaffinity(0)))
    mode, why = resolve_auto(2, topology, os.cpu_count())
    lines = dict(re.findall(r"--affinity auto \(.*?\): local rank (\d) of 2 (?:runs on|keeps) CPUs (\S+)", two_ranks.stdout))
    expected = {str(k): describe(choose_cpus(mode, k, 2, topology) or sorted(topology)) for k in range(2)}
    assert lines == expected and f"auto ({mode}: {why})" in two_ranks.stdout, two_ranks.stdout[-3000:]
    one, two = checkpoint_arrays(tmp_path / "one"), checkpoint_arrays(tmp_path / "two")
    assert one.keys() == two.keys()
    for name in one:
        np.testing.assert_allclose(two[name], one[name], rtol=1e-5, atol=1e-6, err_msg=name)
    one_record, two_record = final_record(tmp_path / "1.json"), final_record(tmp_path / "2.json")
    assert one_record["evaluations"] == two_record["evaluations"] == 0  # 6 steps end before the eval at step 12
    assert two_record["train_loss"] == pytest.approx(one_record["train_loss"], rel=1e-5)

    # Saved on 2 ranks, restored on 1 (and back): the tables come out bit-identical.
    again = ["--max_steps", "6", "--save_checkpoint_path"]
    assert_ok(main_py(args + ["--restore_checkpoint_path", str(tmp_path / "two")] + again + [str(tmp_path / "two_to_one")]))
    assert_ok(run_horovod(["main.py", *args, "--restore_checkpoint_path", str(tmp_path / "one"), *again,
                           str(tmp_path / "one_to_two")], np=2))
    for source, copy in (("two", "two_to_one"), ("one", "one_to_two")):
        original, moved = checkpoint_arrays(tmp_path / source), checkpoint_arrays(tmp_path / copy)
        for name in original:
            np.testing.assert_array_equal(moved[name], original[name], err_msg=f"{source}->{copy}: {name}")


def test_amp_training_then_fp16_inference_and_export(tmp_path):
    ckpt, exported = tmp_path / "ckpt", tmp_path / "fp16_model"
    trained = main_py(SMALL + ["--amp", "--loss_scale", "512", "--save_checkpoint_path", str(ckpt),
                               "--log_path", str(tmp_path / "t.json")])
    assert_ok(trained)
    # No GPU here: bfloat16 where this CPU has bf16 units, else float32, and the line says which.
    assert choose_precision(True, False, False, 512, host_cpu_bf16_support()).message in trained.stdout
    assert 0.0 < final_record(tmp_path / "t.json")["auc"] < 1.0
    assert_ok(main_py(SMALL + ["--fp16", "--mode", "eval", "--restore_checkpoint_path", str(ckpt),
                               "--log_path", str(tmp_path / "e.json")]))
    assert 0.0 < final_record(tmp_path / "e.json")["auc"] < 1.0
    assert_ok(main_py(SMALL + ["--fp16", "--mode", "deploy", "--restore_checkpoint_path", str(ckpt),
                               "--saved_model_output_path", str(exported)]))
    result = main_py(SMALL + ["--fp16", "--mode", "train"])
    assert result.returncode == 2 and "--fp16 is for inference and export only" in result.stderr
