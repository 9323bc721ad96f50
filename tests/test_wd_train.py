"""Wide & Deep training (wide_and_deep/main.py): flags and their errors, learning, 2 ranks under real
horovodrun against 1 process, --evaluate --use_checkpoint, --benchmark, resume, bad input; MAP@12
against hand-computed cases. Data: small TFRecords in the preprocessing's layout, labelled by a
logistic teacher (one click per display, drawn from a softmax of the teacher's scores)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import checkpoint
from metrics import exact_auc
from multiproc import REPO_ROOT, assert_ok, horovod_command, launch_env, snapshot
from wide_and_deep import features as F
from wide_and_deep import wd_metrics

WD_DIR = os.path.join(REPO_ROOT, "wide_and_deep")
ID_RANGE = 40  # the test data uses the first ids of every table, so a few epochs learn them


def _teacher(seed):
    rng = np.random.default_rng(1000 + seed)
    return {"bias": {n: rng.normal(0, 1.0, ID_RANGE) for n in F.CATEGORICAL_NAMES[:4]},
            "weights": rng.normal(0, 2.0, len(F.NUMERIC_FEATURES))}


def _rows(count, first_display, rng, teacher):
    """`count` rows of displays of 2-6 ads, exactly one clicked per display; returns columns and scores."""
    sizes = []
    while sum(sizes) < count:
        sizes.append(int(rng.integers(2, 7)))
    sizes[-1] -= sum(sizes) - count
    if sizes[-1] < 1:
        sizes.pop()
        sizes[-1] += count - sum(sizes)
    display = np.repeat(np.arange(first_display, first_display + len(sizes)), sizes)
    columns = {n: rng.integers(0, min(ID_RANGE, F.BUCKETS[n]), count) for n in F.CATEGORICAL_NAMES}
    columns.update({n: rng.random(count).astype(np.float32) for n in F.NUMERIC_FEATURES})
    score = sum(teacher["bias"][n][columns[n]] for n in teacher["bias"])
    score = score + np.stack([columns[n] for n in F.NUMERIC_FEATURES], 1) @ teacher["weights"]
    label = np.zeros(count, np.int64)
    start = 0
    for size in sizes:
        p = np.exp(score[start:start + size] - score[start:start + size].max())
        label[start + rng.choice(size, p=p / p.sum())] = 1
        start += size
    columns.update({F.LABEL_KEY: label, F.DISPLAY_ID_KEY: display})
    return columns, score, len(sizes)


def _write_split(folder, columns, files):
    os.makedirs(folder)
    rows = len(columns[F.LABEL_KEY])
    records = [(s, min(s + F.PREBATCH_SIZE, rows)) for s in range(0, rows, F.PREBATCH_SIZE)]
    for number, chunk in enumerate(np.array_split(np.arange(len(records)), files)):
        with tf.io.TFRecordWriter(os.path.join(folder, f"part-r-{number:05d}")) as writer:
            for r in chunk:
                start, end = records[r]
                feature = {}
                for key, dtype in F.record_keys().items():
                    values = columns[key][start:end]
                    feature[key] = (tf.train.Feature(int64_list=tf.train.Int64List(value=values)) if dtype == "int64"
                                    else tf.train.Feature(float_list=tf.train.FloatList(value=values)))
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


def write_dataset(folder, train_rows, eval_rows, seed=0, files=2):
    """TFRecords + metadata.json as the preprocessing writes them; returns the teacher's eval MAP@12 and AUC."""
    rng, teacher = np.random.default_rng(seed), _teacher(seed)
    train, _, displays = _rows(train_rows, 0, rng, teacher)
    evaluation, score, _ = _rows(eval_rows, displays, rng, teacher)
    _write_split(os.path.join(folder, "train"), train, files)
    _write_split(os.path.join(folder, "eval"), evaluation, files)
    with open(os.path.join(folder, "metadata.json"), "w") as f:
        json.dump({"train_rows": train_rows, "eval_rows": eval_rows, "prebatch_size": F.PREBATCH_SIZE,
                   "format": "wide_and_deep-tfrecords", "version": 1}, f)
    labels, ids = evaluation[F.LABEL_KEY], evaluation[F.DISPLAY_ID_KEY]
    return wd_metrics.exact_map12(ids, labels, score), exact_auc(labels, score)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("wd_data")
    teacher = write_dataset(str(folder), train_rows=24 * 4096 + 1000, eval_rows=6 * 4096 - 1000)  # a short last record, as the preprocessing writes
    return str(folder), teacher


SMALL = ["--deep_hidden_units", "32", "32", "--deep_learning_rate", "0.01", "--deep_warmup_epochs", "0",
         "--linear_learning_rate", "0.5", "--global_batch_size", "8192", "--eval_batch_size", "8192"]


def data_flags(folder):
    return ["--train_data_pattern", f"{folder}/train/part*", "--eval_data_pattern", f"{folder}/eval/part*",
            "--transformed_metadata_path", folder]


def wd(args, np_=1, timeout=240):
    """`cd wide_and_deep && python main.py args` (np_ > 1: under horovodrun over Gloo)."""
    command = [sys.executable, "main.py", *args] if np_ == 1 else horovod_command(["main.py", *args], np=np_)
    return subprocess.run(command, cwd=WD_DIR, env=launch_env(), capture_output=True, text=True, timeout=timeout)


def run_flags(folder, tmp, *extra):
    return [*data_flags(folder), *SMALL, "--model_dir", str(tmp / "ckpt"), "--results_dir", str(tmp / "results"),
            *extra]


def log_records(results):
    from utils import read_dllogger_file

    return list(read_dllogger_file(os.path.join(results, "log.json")))


def final(results):
    return [r for r in log_records(results) if r.get("type") == "LOG" and r["step"] == []][-1]["data"]


def weights(model_dir):
    path = checkpoint.resolve(model_dir)
    return {f: np.load(os.path.join(path, f)) for f in sorted(checkpoint.read_manifest(path).files)}


# ---- MAP@12 ----

def test_map12_hand_computed_with_ties_and_cut_groups():
    ids = np.array([7, 7, 7, 3, 3, 5, 5])
    labels = np.array([0, 1, 0, 1, 0, 0, 0])
    preds = np.array([0.9, 0.5, 0.5, 0.2, 0.2, 0.3, 0.1])
    # display 3: target 0.2 ties with the later row -> position 0, AP 1; display 7: 0.9 ahead, the tie after -> AP 1/2;
    # display 5 has no click and is dropped
    assert wd_metrics.map12_sums(ids, labels, preds) == (1.5, 2)
    # the same display cut into two batches counts twice (the reference's grouping per batch)
    first = wd_metrics.map12_sums(ids[:2], labels[:2], preds[:2])
    second = wd_metrics.map12_sums(ids[2:], labels[2:], preds[2:])
    assert first == (0.5, 1) and second == (1.0, 1)
    # a target at position 12 or beyond scores 0; two clicks: the first in row order is the target
    ids = np.zeros(14, np.int64)
    preds = np.linspace(1, 0.1, 14)
    labels = np.zeros(14)
    labels[[12, 13]] = 1
    assert wd_metrics.map12_sums(ids, labels, preds) == (0.0, 1)
    labels[[11]] = 1
    assert wd_metrics.exact_map12(ids, labels, preds) == pytest.approx(1 / 12)


# ---- flags ----

@pytest.mark.parametrize("extra, fragment", [
    (["--global_batch_size", "5000"], "--global_batch_size 5000 must divide"),
    (["--eval_batch_size", "4097"], "--eval_batch_size 4097"),
    (["--benchmark", "--benchmark_warmup_steps", "10", "--benchmark_steps", "10"], "--benchmark_warmup_steps 10"),
    (["--deep_warmup_epochs", "30"], "--deep_warmup_epochs 30 exceeds --num_epochs 20"),
    (["--evaluate"], "--evaluate needs trained weights"),
    (["--deep_dropout", "1"], "--deep_dropout"),
    (["--affinity", "nowhere"], "--affinity"),
    (["--training_set_size", "5"], "--training_set_size 5 differs"),
])
def test_flag_errors(data, tmp_path, extra, fragment):
    folder, _ = data
    result = wd(run_flags(folder, tmp_path, *extra))
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and fragment in errors[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "ckpt").exists()


def test_defaults_are_the_reference_ones():
    sys.path.insert(0, WD_DIR)
    try:
        from wide_and_deep.main import build_parser
    finally:
        sys.path.remove(WD_DIR)
    args = build_parser().parse_args([])
    assert (args.global_batch_size, args.eval_batch_size, args.num_epochs, args.training_set_size) == (
        131072, 131072, 20, 59761827)
    assert (args.linear_learning_rate, args.deep_learning_rate, args.deep_warmup_epochs, args.deep_dropout) == (
        0.02, 0.00012, 6, 0.1)
    assert args.deep_hidden_units == [1024] * 5 and args.affinity == "socket_unique_interleaved"
    assert (args.benchmark_warmup_steps, args.benchmark_steps) == (500, 1000)
    assert (args.model_dir, args.results_dir, args.log_filename) == ("/outbrain/checkpoints", "/results", "log.json")


# ---- training ----

def test_one_process_learns_close_to_the_teacher_and_evaluate_reads_its_checkpoint(data, tmp_path):
    folder, (teacher_map, teacher_auc) = data
    result = wd(run_flags(folder, tmp_path, "--num_epochs", "3", "--global_batch_size", "4096"))
    assert_ok(result)
    last = final(str(tmp_path / "results"))
    assert last["exact_map_val"] > teacher_map - 0.03 and last["auc_val"] > teacher_auc - 0.03, (last, teacher_map)
    assert last["streaming_map_val"] == pytest.approx(last["exact_map_val"], abs=0.01)
    records = log_records(str(tmp_path / "results"))
    assert [r["step"] for r in records if r.get("type") == "LOG" and "auc_val" in r["data"]][:3] == [
        [25, 75], [50, 75], [75, 75]]  # 25 records, the short last one included
    assert json.load(open(tmp_path / "results" / "args.json"))["num_epochs"] == 3
    evaluated = wd(run_flags(folder, tmp_path, "--evaluate", "--use_checkpoint", "--results_dir",
                             str(tmp_path / "eval_results")))
    assert_ok(evaluated)
    again = final(str(tmp_path / "eval_results"))
    for key in ("exact_map_val", "streaming_map_val", "auc_val", "loss_val", "binary_accuracy_val"):
        assert again[key] == pytest.approx(last[key], abs=1e-6), key


def test_two_ranks_under_horovodrun_equal_one_process(tmp_path):
    """With the reference's dropout: a row's mask follows the row, not the rank, so two ranks train the
    weights of one process. Whole records only here: a step holding a short last record sums its rows
    in another order on one process than on two ranks, and RMSprop turns the rounding of a
    near-cancelling gradient into lr-sized differences (tests/test_wd_data.py checks that step without
    dropout)."""
    folder = str(tmp_path / "data")
    write_dataset(folder, train_rows=24 * 4096, eval_rows=6 * 4096 - 1000)
    common = ["--num_epochs", "1"]
    one = wd(run_flags(folder, tmp_path / "one", *common))
    assert_ok(one)
    two = wd(run_flags(folder, tmp_path / "two", *common), np_=2)
    assert_ok(two)
    a, b = weights(str(tmp_path / "one" / "ckpt")), weights(str(tmp_path / "two" / "ckpt"))
    assert a.keys() == b.keys()
    for name in a:  # rounding only (two ranks' summed losses against one process's), which RMSprop
        # turns into lr-sized relative differences where a gradient nearly cancels: a few elements
        np.testing.assert_allclose(a[name], b[name], rtol=2e-4, atol=1e-4, err_msg=name)
        assert np.abs(a[name] - b[name]).mean() < 2e-6, name
    m1, m2 = final(str(tmp_path / "one" / "results")), final(str(tmp_path / "two" / "results"))
    assert m1["exact_map_val"] == pytest.approx(m2["exact_map_val"], abs=1e-4)  # every row once over both ranks
    assert m1["auc_val"] == pytest.approx(m2["auc_val"], abs=1e-4)


def test_resume_after_sigint_equals_an_uninterrupted_run(data, tmp_path):
    folder, _ = data
    common = ["--num_epochs", "2"]
    whole = wd(run_flags(folder, tmp_path / "whole", *common))
    assert_ok(whole)
    flags = run_flags(folder, tmp_path / "cut", *common)
    process = subprocess.Popen([sys.executable, "main.py", *flags], cwd=WD_DIR, env=launch_env(),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    for line in process.stdout:
        seen.append(line)
        if line.startswith("checkpoint saved"):  # the first epoch's: the signal lands in the second
            process.send_signal(2)
            break
    output = "".join(seen) + process.communicate(timeout=200)[0]
    assert process.returncode == 130, output[-3000:]
    assert "stopped by SIGINT after step" in output
    stopped = int(output.split("stopped by SIGINT after step ")[1].split()[0])
    assert 12 <= stopped < 24
    resumed = wd(flags + ["--use_checkpoint"])
    assert_ok(resumed)
    a, b = weights(str(tmp_path / "whole" / "ckpt")), weights(str(tmp_path / "cut" / "ckpt"))
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=1e-5, atol=1e-6, err_msg=name)  # summation order only
    assert final(str(tmp_path / "whole" / "results")) == pytest.approx(final(str(tmp_path / "cut" / "results")),
                                                                      abs=1e-5)


def test_benchmark_training_and_evaluation(data, tmp_path):
    folder, _ = data
    bench = ["--benchmark", "--benchmark_warmup_steps", "2", "--benchmark_steps", "14"]  # crosses an epoch
    result = wd(run_flags(folder, tmp_path, *bench))
    assert_ok(result)
    assert final(str(tmp_path / "results"))["train_throughput"] > 0
    assert not (tmp_path / "ckpt").exists()  # no evaluation, no checkpoint
    records = log_records(str(tmp_path / "results"))
    assert len([r for r in records if "batch_samplesps" in r.get("data", {})]) == 12
    evaluated = wd(run_flags(folder, tmp_path, *bench, "--evaluate", "--results_dir", str(tmp_path / "ev")))
    assert_ok(evaluated)
    assert final(str(tmp_path / "ev"))["validation_throughput"] > 0


def _foreign_checkpoint(root):
    """A checkpoint of another model (a DLRM-like config) in `root`."""
    variable = tf.Variable(np.ones((3, 2), np.float32))
    state = checkpoint.TrainingState({"model": "dlrm"}, ["f0"], [], [], {"w": variable}, {},
                                     {checkpoint.STEP_COUNTER: tf.Variable(5, dtype=tf.int64)})
    checkpoint.save(str(root), 5, state, "foreign")


@pytest.mark.parametrize("extra, fragment", [
    ([], "holds checkpoints of another model"),
    (["--use_checkpoint"], "written for a different model"),
])
def test_model_dir_of_another_model_is_refused_untouched(data, tmp_path, extra, fragment):
    folder, _ = data
    _foreign_checkpoint(tmp_path / "ckpt")
    before = snapshot(tmp_path / "ckpt")
    result = wd(run_flags(folder, tmp_path, *extra))
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and fragment in errors[0] and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert snapshot(tmp_path / "ckpt") == before


def test_batch_not_dividing_into_two_ranks_is_one_error(data, tmp_path):
    folder, _ = data
    result = wd(run_flags(folder, tmp_path, "--global_batch_size", "12288"), np_=2)
    assert result.returncode != 0
    assert "--global_batch_size 12288 must divide into 2 rank(s)" in result.stderr + result.stdout
    assert ">:Traceback" not in result.stderr + result.stdout  # no rank's traceback (horovodrun prints its own)
