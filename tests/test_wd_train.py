"""Wide & Deep training (wide_and_deep/main.py): flags and their errors, learning, TensorBoard events, 2 ranks
under real horovodrun and mpiexec against 1 process (and on disjoint CPUs), --amp and --xla against float32,
--evaluate --use_checkpoint, --benchmark, resume, bad input; MAP@12 against hand-computed cases. Data: small
TFRecords in the preprocessing's layout, labelled by a logistic teacher (one click per display, drawn from a
softmax of the teacher's scores), whose metadata.json sizes the tables at 64 rows (the teacher uses the first
40 ids): the reference's 85M-weight tables are built by one run only, the training benchmark. The runs that
several tests compare with are module fixtures (`baseline`, `trained`)."""
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections import defaultdict

import numpy as np
import pytest
import tensorflow as tf

from recsys.training import checkpoint
from recsys.runtime.metrics import exact_auc
from multiproc import REPO_ROOT, assert_ok, horovod_command, launch_env, require, snapshot
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


SMALL_BUCKETS = 64  # every table's rows in the test data's metadata.json (its ids lie below ID_RANGE)


def write_metadata(folder, train_rows, eval_rows, buckets=None):
    """metadata.json as the preprocessing writes it; `buckets` (a mapping) declares the tables' sizes."""
    meta = {"train_rows": train_rows, "eval_rows": eval_rows, "prebatch_size": F.PREBATCH_SIZE,
            "format": "wide_and_deep-tfrecords", "version": 1}
    if buckets is not None:
        meta["buckets"] = buckets
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "metadata.json"), "w") as f:
        json.dump(meta, f)


def write_dataset(folder, train_rows, eval_rows, seed=0, files=2):
    """TFRecords + metadata.json (SMALL_BUCKETS rows per table) as the preprocessing writes them; returns the
    teacher's eval MAP@12 and AUC."""
    rng, teacher = np.random.default_rng(seed), _teacher(seed)
    train, _, displays = _rows(train_rows, 0, rng, teacher)
    evaluation, score, _ = _rows(eval_rows, displays, rng, teacher)
    _write_split(os.path.join(folder, "train"), train, files)
    _write_split(os.path.join(folder, "eval"), evaluation, files)
    write_metadata(folder, train_rows, eval_rows, {n: SMALL_BUCKETS for n in F.CATEGORICAL_NAMES})
    labels, ids = evaluation[F.LABEL_KEY], evaluation[F.DISPLAY_ID_KEY]
    return wd_metrics.exact_map12(ids, labels, score), exact_auc(labels, score)


# Whole train records: a step holding a short last record sums its rows in another order on one process
# than on two ranks, and RMSprop (each gradient divided by its running RMS) turns the rounding of a
# near-cancelling gradient into lr-sized differences; tests/test_wd_data.py trains on a short train record
# (without dropout). The eval split ends with a short record, as the preprocessing's.
TRAIN_ROWS, EVAL_ROWS = 24 * 4096, 6 * 4096 - 1000


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("wd_data")
    teacher = write_dataset(str(folder), TRAIN_ROWS, EVAL_ROWS)
    return str(folder), teacher


SMALL = ["--deep_hidden_units", "32", "32", "--deep_learning_rate", "0.02", "--deep_warmup_epochs", "0",
         "--linear_learning_rate", "1.0", "--global_batch_size", "8192", "--eval_batch_size", "8192"]
# The run 2 ranks, --amp and --xla are compared with: one epoch of 12 steps at half SMALL's rates, with
# the reference's dropout (a row's mask follows the row, not the rank), and a progress record at every step
# (each step's loss). Longer or faster, RMSprop lets the summation order of 2 ranks' averaged gradients
# grow past 1e-4 in near-zero gradients.
BASELINE = ["--num_epochs", "1", "--deep_learning_rate", "0.01", "--linear_learning_rate", "0.5", "--print_freq", "1"]
# learning, --evaluate, TensorBoard, and the uninterrupted run of the resume test; a progress record every 6 steps
TRAINED = ["--num_epochs", "3", "--print_freq", "6"]


def data_flags(folder):
    return ["--train_data_pattern", f"{folder}/train/part*", "--eval_data_pattern", f"{folder}/eval/part*",
            "--transformed_metadata_path", folder]


def wd(args, np_=1, timeout=240, launcher="horovodrun", env=None):
    """`cd wide_and_deep && python main.py args`; np_ > 1: under horovodrun (Gloo) or Open MPI's mpiexec."""
    if np_ == 1:
        command = [sys.executable, "main.py", *args]
    elif launcher == "horovodrun":
        command = horovod_command(["main.py", *args], np=np_)
    else:
        require(shutil.which("mpiexec") is not None, "mpiexec not installed (Debian openmpi-bin)")
        command = ["mpiexec", "--oversubscribe", "-np", str(np_), sys.executable, "main.py", *args]  # any core count
    return subprocess.run(command, cwd=WD_DIR, env=launch_env(env), capture_output=True, text=True, timeout=timeout)


def run_flags(folder, tmp, *extra):
    return [*data_flags(folder), *SMALL, "--model_dir", str(tmp / "ckpt"), "--results_dir", str(tmp / "results"),
            *extra]


def one_process_run(data, tmp_path_factory, name, flags):
    folder, _ = data
    root = tmp_path_factory.mktemp(name)
    result = wd(run_flags(folder, root, *flags))
    assert_ok(result)
    return root, result


@pytest.fixture(scope="module")
def baseline(data, tmp_path_factory):
    """The BASELINE run on one process: its folder (ckpt/, results/) and its output."""
    return one_process_run(data, tmp_path_factory, "baseline", BASELINE)


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory):
    """The TRAINED run on one process: its folder (ckpt/, results/) and its output."""
    return one_process_run(data, tmp_path_factory, "trained", TRAINED)


def log_records(results):
    from recsys.runtime.logger import read_dllogger_file

    return list(read_dllogger_file(os.path.join(results, "log.json")))


def final(results):
    return [r for r in log_records(results) if r.get("type") == "LOG" and r["step"] == []][-1]["data"]


def weights(model_dir):
    path = checkpoint.resolve(model_dir)
    return {f: np.load(os.path.join(path, f)) for f in sorted(checkpoint.read_manifest(path).files)}


def affinity_lines(output):
    """Each rank's start-up line of --affinity: {local rank: its CPUs} (wherever it stands in a line: launchers
    prefix ranks' lines, and may join two ranks' output)."""
    found = re.findall(r"--affinity \S+: local rank (\d+) of \d+ runs on CPUs (\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*)", output)
    return {int(rank): cpus for rank, cpus in found}


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

def wd_main_module():
    """wide_and_deep/main.py as a module (its folder first on the path, as when run from there)."""
    sys.path.insert(0, WD_DIR)
    try:
        from wide_and_deep import main
    finally:
        sys.path.remove(WD_DIR)
    return main


@pytest.mark.parametrize("extra, fragment", [
    (["--global_batch_size", "5000"], "--global_batch_size 5000 must divide"),
    (["--eval_batch_size", "4097"], "--eval_batch_size 4097"),
    (["--benchmark", "--benchmark_warmup_steps", "10", "--benchmark_steps", "10"], "--benchmark_warmup_steps 10"),
    (["--benchmark", "--benchmark_warmup_steps", "0", "--benchmark_steps", "1"], "--benchmark_steps 1 leaves no step"),
    (["--deep_warmup_epochs", "30"], "--deep_warmup_epochs 30 exceeds --num_epochs 20"),
    (["--evaluate"], "--evaluate needs trained weights"),
    (["--deep_dropout", "1"], "--deep_dropout"),
    (["--print_freq", "0"], "--print_freq must be >= 1, got 0"),
])
def test_flag_rules(extra, fragment):
    main = wd_main_module()
    with pytest.raises(main.UsageError, match=re.escape(fragment)):
        main.validate(main.build_parser().parse_args(extra), 1)


@pytest.mark.parametrize("extra, fragment", [
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
    args = wd_main_module().build_parser().parse_args([])
    assert (args.global_batch_size, args.eval_batch_size, args.num_epochs, args.training_set_size) == (
        131072, 131072, 20, 59761827)
    assert (args.linear_learning_rate, args.deep_learning_rate, args.deep_warmup_epochs, args.deep_dropout) == (
        0.02, 0.00012, 6, 0.1)
    assert args.deep_hidden_units == [1024] * 5 and args.affinity == "socket_unique_interleaved"
    assert (args.benchmark_warmup_steps, args.benchmark_steps, args.print_freq) == (500, 1000, 100)
    assert (args.model_dir, args.results_dir, args.log_filename) == ("/outbrain/checkpoints", "/results", "log.json")


def test_options_hold_every_flag_in_the_parsers_order_and_which_were_given():
    """The job reads typed Options: the same flags and values as the parser's (args.json keeps its keys
    and order), and which flags the command line gave (a default value given explicitly counts)."""
    main = wd_main_module()
    argv = ["--num_epochs", "3", "--training_set_size=59761827", "--deep_hidden_units", "8", "4"]
    options, namespace = main.parse_options(argv), main.build_parser().parse_args(argv)
    assert list(options.flags().items()) == list(vars(namespace).items())
    assert options.given == {"num_epochs", "training_set_size", "deep_hidden_units"}


def test_the_reference_model_has_its_weight_count():
    from wide_and_deep import wd_model

    model = wd_model.WideAndDeep(wd_model.WideDeepConfig())
    model.build_all()
    assert sum(int(np.prod(v.shape)) for v in model.named_variables().values()) == 90_898_303  # README


def test_metadata_buckets(tmp_path):
    from wide_and_deep import wd_data

    write_metadata(str(tmp_path), 10, 5)
    assert wd_data.read_metadata(str(tmp_path)).buckets == F.BUCKETS  # absent: the reference's
    small = {n: 7 for n in F.CATEGORICAL_NAMES}
    write_metadata(str(tmp_path), 10, 5, small)
    assert wd_data.read_metadata(str(tmp_path)).buckets == small
    for bad in ({**small, "ad_id": 0}, {n: 7 for n in F.CATEGORICAL_NAMES[1:]}, [7] * 13):
        write_metadata(str(tmp_path), 10, 5, bad)
        with pytest.raises(wd_data.DataError, match=re.escape(f"{tmp_path}/metadata.json: 'buckets' must map")):
            wd_data.read_metadata(str(tmp_path))


# ---- training ----

def test_one_process_learns_close_to_the_teacher_and_evaluate_reads_its_checkpoint(data, trained, tmp_path):
    (folder, (teacher_map, teacher_auc)), (root, result) = data, trained
    last = final(str(root / "results"))
    assert last["exact_map_val"] > teacher_map - 0.03 and last["auc_val"] > teacher_auc - 0.03, (last, teacher_map)
    assert last["streaming_map_val"] == pytest.approx(last["exact_map_val"], abs=0.01)
    records = [r for r in log_records(str(root / "results")) if r.get("type") == "LOG" and r["step"]]
    evaluations = [r for r in records if "auc_val" in r["data"]]  # not the final repeat, whose step is []
    assert [r["step"] for r in evaluations] == [[12, 36], [24, 36], [36, 36]]
    progress = [r for r in records if "mean_loss" in r["data"]]  # --print_freq 6: the reference's keys, mean_loss
    assert [r["step"] for r in progress] == [[s, 36] for s in range(6, 37, 6)]
    assert all(set(r["data"]) == {"binary_accuracy", "auc", "loss", "mean_loss"} for r in progress)
    assert json.load(open(root / "results" / "args.json"))["num_epochs"] == 3
    assert list(affinity_lines(result.stdout)) == [0]  # one rank, one line

    # TensorBoard: each progress record's and evaluation's scalars, as logged
    (events,) = glob.glob(str(root / "results" / "event_files" / "events.out.tfevents.*"))
    scalars = defaultdict(dict)
    for event in tf.compat.v1.train.summary_iterator(events):
        for value in event.summary.value:
            scalars[value.tag][event.step] = float(tf.make_ndarray(value.tensor))
    assert set(scalars) == ({f"eval/{key}" for key in evaluations[0]["data"]}
                            | {f"train/{key}" for key in progress[0]["data"]})
    for group, logged in (("eval", evaluations), ("train", progress)):
        for record in logged:
            for key, value in record["data"].items():
                assert scalars[f"{group}/{key}"][record["step"][0]] == pytest.approx(value, rel=1e-6), key

    evaluated = wd(run_flags(folder, root, *TRAINED, "--evaluate", "--use_checkpoint", "--results_dir",
                             str(tmp_path / "eval_results")))
    assert_ok(evaluated)
    again = final(str(tmp_path / "eval_results"))
    for key in ("exact_map_val", "streaming_map_val", "auc_val", "loss_val", "binary_accuracy_val"):
        assert again[key] == pytest.approx(last[key], abs=1e-6), key


@pytest.mark.parametrize("launcher", ["horovodrun", "mpiexec"])
def test_two_ranks_equal_one_process(data, baseline, tmp_path, launcher):
    folder, _ = data
    two = wd(run_flags(folder, tmp_path, *BASELINE, "--print_freq", "4"), np_=2, launcher=launcher)
    assert_ok(two)
    # a progress record's mean_loss: the mean of the steps' losses since the previous record (the one
    # process's records, one a step, give each step's loss)
    losses = {r["step"][0]: r["data"]["loss"] for r in log_records(str(baseline[0] / "results"))
              if r.get("type") == "LOG" and "loss" in r["data"]}
    means = {r["step"][0]: r["data"]["mean_loss"] for r in log_records(str(tmp_path / "results"))
             if r.get("type") == "LOG" and "mean_loss" in r["data"]}
    assert sorted(losses) == list(range(1, 13)) and sorted(means) == [4, 8, 12]
    for step, mean in means.items():
        assert mean == pytest.approx(np.mean([losses[s] for s in range(step - 3, step + 1)]), abs=1e-4), step
        assert mean != pytest.approx(losses[step], abs=1e-3)  # not the last step's alone
    a, b = weights(str(baseline[0] / "ckpt")), weights(str(tmp_path / "ckpt"))
    assert a.keys() == b.keys()
    for name in a:  # rounding only (two ranks' summed losses against one process's), which RMSprop
        # turns into lr-sized relative differences where a gradient nearly cancels: a few elements
        np.testing.assert_allclose(a[name], b[name], rtol=2e-4, atol=1e-4, err_msg=name)
        assert np.abs(a[name] - b[name]).mean() < 2e-6, name
    m1, m2 = final(str(baseline[0] / "results")), final(str(tmp_path / "results"))
    assert m1["exact_map_val"] == pytest.approx(m2["exact_map_val"], abs=1e-4)  # every row once over both ranks
    assert m1["auc_val"] == pytest.approx(m2["auc_val"], abs=1e-4)
    # --affinity's default (socket_unique_interleaved): the two ranks run on disjoint CPUs
    cpus = affinity_lines(two.stdout)
    assert sorted(cpus) == [0, 1], two.stdout[-3000:]
    sets = [{int(c) for c in re.findall(r"\d+", cpus[rank])} for rank in (0, 1)]  # ranges like 0-1 hold both ends
    if len(os.sched_getaffinity(0)) >= 2:
        assert sets[0] and sets[1] and not sets[0] & sets[1], cpus


def test_amp_on_the_cpu_trains_as_float32_does(data, baseline, tmp_path):
    from recsys.runtime.precision import choose_precision, host_cpu_bf16_support

    folder, _ = data
    result = wd(run_flags(folder, tmp_path, *BASELINE, "--amp"))
    assert_ok(result)
    cpu = host_cpu_bf16_support()
    assert choose_precision(True, False, False, 0, cpu).message in result.stdout  # bfloat16 only with bf16 units
    fp32, amp = final(str(baseline[0] / "results")), final(str(tmp_path / "results"))
    for key in ("auc_val", "exact_map_val", "loss_val"):
        assert amp[key] == pytest.approx(fp32[key], abs=0.01), (key, amp, fp32)
    if cpu.supported:  # bfloat16 rounding shows in the weights
        trained, amp_weights = weights(str(baseline[0] / "ckpt")), weights(str(tmp_path / "ckpt"))
        assert any(np.abs(trained[n] - amp_weights[n]).max() > 1e-4 for n in trained)


def test_xla_compiles_the_step_and_trains_to_the_same_loss(data, baseline, tmp_path):
    folder, _ = data
    result = wd(run_flags(folder, tmp_path, *BASELINE, "--xla"), env={"TF_CPP_MIN_LOG_LEVEL": "0"})
    assert_ok(result)
    assert "Compiled cluster using XLA" in result.stderr  # TensorFlow's own line once XLA has compiled a program
    fp32, xla = final(str(baseline[0] / "results")), final(str(tmp_path / "results"))
    for key in ("auc_val", "exact_map_val", "loss_val"):
        assert xla[key] == pytest.approx(fp32[key], abs=2e-3), (key, xla, fp32)


def test_resume_after_sigint_equals_an_uninterrupted_run(data, trained, tmp_path):
    folder, _ = data
    flags = run_flags(folder, tmp_path, *TRAINED)
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
    # Two uninterrupted runs give the same bits, and so has a resumed run but once: at the reference's table
    # size on a loaded machine, one bias differed by 1.3e-5 (cause not found). RMSprop divides each gradient by
    # its running RMS, so such a difference in near-zero gradients grows; a resume that lost a slot, the step,
    # the schedule or the dropout masks moves weights by about the deep rate (5e-3) instead.
    a, b = weights(str(trained[0] / "ckpt")), weights(str(tmp_path / "ckpt"))
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=1e-4, atol=1e-4, err_msg=name)
    assert final(str(trained[0] / "results")) == pytest.approx(final(str(tmp_path / "results")), abs=1e-4)


def test_a_second_run_into_a_used_results_dir_is_refused_and_plot_log_never_stacks_two_runs(data, baseline,
                                                                                             trained, tmp_path):
    """A fresh run given another run's --results_dir once replaced its args.json and appended to its log
    and events; it is refused untouched (a resume continues them: the SIGINT resume test above). A log
    holding two runs (as such a run left) is not drawn stacked: plot_log asks which."""
    folder, _ = data
    shutil.copytree(baseline[0] / "results", tmp_path / "results")
    before = snapshot(tmp_path)
    result = wd(run_flags(folder, tmp_path, *BASELINE))
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: --results_dir/--log_filename {tmp_path / 'results' / 'log.json'} holds the record of "
                      f"another run; choose a new --results_dir (or move its files away), or resume that run with "
                      f"--use_checkpoint and its --model_dir"], result.stderr[-3000:]
    assert snapshot(tmp_path) == before

    two = tmp_path / "two.json"
    two.write_text("".join((root / "results" / "log.json").read_text() for root in (baseline[0], trained[0])))
    plot = [sys.executable, os.path.join(REPO_ROOT, "scripts", "plot_log.py"), str(two)]
    refused = subprocess.run(plot, env=launch_env(), capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "holds 2 runs" in refused.stderr and "--run 1..2" in refused.stderr
    chosen = subprocess.run(plot + ["--run", "2"], env=launch_env(), capture_output=True, text=True, timeout=120)
    assert_ok(chosen)
    assert "3 AUC points, 3 MAP@12 points" in chosen.stdout, chosen.stdout  # the TRAINED run's three epochs


def test_resume_with_another_global_batch_size_is_refused_untouched(data, baseline, tmp_path):
    """The step counts batches: resumed at another --global_batch_size, the schedule and the epoch's
    position would be read in the wrong unit (once: one step of a 5-epoch run, then a worse model)."""
    folder, _ = data
    shutil.copytree(baseline[0] / "ckpt", tmp_path / "ckpt")
    before = snapshot(tmp_path / "ckpt")
    result = wd(run_flags(folder, tmp_path, "--num_epochs", "3", "--use_checkpoint", "--global_batch_size", "4096"))
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "--global_batch_size 4096 differs from the 8192 of the checkpoint" in errors[0], errors
    assert snapshot(tmp_path / "ckpt") == before and not (tmp_path / "results" / "log.json").exists()


def test_use_checkpoint_with_a_missing_model_dir_is_one_error(data, tmp_path):
    """A mistyped --model_dir must not start a fresh full run; an existing empty folder still does."""
    folder, _ = data
    result = wd(run_flags(folder, tmp_path, "--use_checkpoint", "--model_dir", str(tmp_path / "typo")))
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: --use_checkpoint: --model_dir {tmp_path / 'typo'} does not exist (an existing "
                      f"empty folder starts fresh)"], result.stderr[-3000:]
    assert sorted(os.listdir(tmp_path)) == []


def test_sigint_during_evaluation_is_one_line_and_exit_130(data, tmp_path):
    """Ctrl-C outside training (here an evaluation: nothing worth finishing) stops at the next batch as one
    line and exit 130, never a traceback, exit 1, or an abort (StopNow raised inside a TensorFlow eager op
    once corrupted the heap); training's graceful stop: the resume test above."""
    folder, _ = data
    flags = run_flags(folder, tmp_path, "--evaluate", "--benchmark", "--benchmark_warmup_steps", "1",
                      "--benchmark_steps", "100000000")
    process = subprocess.Popen([sys.executable, "main.py", *flags], cwd=WD_DIR, env=launch_env(),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        seen = []
        for line in process.stdout:
            seen.append(line)
            if "batch_samplesps" in line:  # evaluation batches are being measured
                process.send_signal(signal.SIGINT)
                break
        output = "".join(seen) + process.communicate(timeout=120)[0]
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, output[-3000:]
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output[-3000:]
    assert output.count("stopped by SIGINT: the run ended before finishing") == 1, output[-3000:]


# `python main.py ARGS` (in wide_and_deep/) run by `python -c OPEN_COUNTER COUNTS ARGS`, which writes to COUNTS, as
# JSON, how many times the run opened each file (Python's audit hook sees every open() and os.open()).
OPEN_COUNTER = """
import atexit, collections, json, os, runpy, sys
counts, opened = sys.argv[1], collections.Counter()
sys.argv = ["main.py", *sys.argv[2:]]
sys.addaudithook(lambda event, args: event == "open" and isinstance(args[0], str)
                 and opened.update([os.path.abspath(args[0])]))
atexit.register(lambda: json.dump(dict(opened), open(counts, "w")))
runpy.run_path("main.py", run_name="__main__")
"""


def opens_of(args, counts):
    """`wd(args)` on one process, counting the files it opens: (its result, {path: times opened})."""
    result = subprocess.run([sys.executable, "-c", OPEN_COUNTER, str(counts), *args], cwd=WD_DIR, env=launch_env(),
                            capture_output=True, text=True, timeout=240)
    return result, json.loads(counts.read_text()) if counts.exists() else {}


def test_benchmarks_read_one_endless_dataset_and_train_at_the_reference_size(data, tmp_path):
    """--benchmark's steps cross epochs (training) and passes (--evaluate) in one endless dataset, as the
    reference's: a dataset built anew at each boundary stalled that step for about a second, a third to a
    half of the figure on small data. Every data file is opened once by the index and once by the one
    dataset's reader (once: once per epoch or pass). Training's benchmark is also the one run of the
    reference's tables: a metadata.json without `buckets` (as older preprocessing outputs) sizes them as
    the reference does."""
    folder, _ = data
    write_metadata(str(tmp_path / "meta"), TRAIN_ROWS, EVAL_ROWS)
    bench = ["--benchmark", "--benchmark_warmup_steps", "2", "--benchmark_steps", "14"]  # 12 steps an epoch
    result, opened = opens_of(run_flags(folder, tmp_path, *bench, "--transformed_metadata_path",
                                        str(tmp_path / "meta")), tmp_path / "train_opens.json")
    assert_ok(result)
    assert final(str(tmp_path / "results"))["train_throughput"] > 0
    assert not (tmp_path / "ckpt").exists()  # no evaluation, no checkpoint
    records = log_records(str(tmp_path / "results"))
    assert len([r for r in records if "batch_samplesps" in r.get("data", {})]) == 12
    train_files = sorted(glob.glob(f"{folder}/train/part*"))
    assert {path: opened.get(path) for path in train_files} == {path: 2 for path in train_files}
    evaluated, opened = opens_of(run_flags(folder, tmp_path, *bench, "--evaluate", "--results_dir",
                                           str(tmp_path / "ev")), tmp_path / "eval_opens.json")
    assert_ok(evaluated)
    assert final(str(tmp_path / "ev"))["validation_throughput"] > 0
    eval_files = sorted(glob.glob(f"{folder}/eval/part*"))  # 3 batches a pass: 14 are 5 passes
    assert {path: opened.get(path) for path in eval_files} == {path: 2 for path in eval_files}


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


# ---- the run shell (recsys/runtime/run_shell.py): the same start and refusals as DLRM's main.py ----


def test_a_lock_left_by_a_killed_run_is_taken_over_with_a_message(data, tmp_path):
    """As tests/test_stopping.py's DLRM counterpart: a --model_dir whose lock a dead run still names is
    taken over, and the run says so."""
    from recsys.runtime import folder_lock

    folder, _ = data
    model_dir = tmp_path / "ckpt"
    holder = subprocess.Popen([sys.executable, "-c", "import os, signal\nfrom recsys.runtime import folder_lock\n"
                               f"folder_lock.acquire({str(model_dir)!r}, '--model_dir')\n"
                               "os.kill(os.getpid(), signal.SIGKILL)"], cwd=REPO_ROOT, env=launch_env())
    assert holder.wait(timeout=60) == -signal.SIGKILL
    assert folder_lock.read_holder(str(model_dir / folder_lock.LOCK_NAME)).pid == holder.pid
    result = wd(run_flags(folder, tmp_path, *BASELINE))
    assert_ok(result)
    assert (f"--model_dir {model_dir} was held by a run that ended without giving it back "
            f"(host {os.uname().nodename}, pid {holder.pid}") in result.stdout, result.stdout[-3000:]
    assert checkpoint.resolve(str(model_dir)).endswith("step_000000012")
    assert not os.path.exists(model_dir / folder_lock.LOCK_NAME), "the lock is given back"


def test_a_refused_output_stops_every_rank_each_saying_why(data, tmp_path):
    """As tests/test_outputs.py's DLRM counterpart: rank 0's verdict on the outputs reaches every rank,
    and each rank prints the one error line before any exits (horovodrun kills the rest at the first exit)."""
    folder, _ = data
    results = tmp_path / "results"
    results.write_text("a file, not a folder")
    before = snapshot(tmp_path)
    result = wd(run_flags(folder, tmp_path), np_=2)
    assert result.returncode != 0
    assert "exit with status code 2" in result.stdout  # the first rank to exit; horovodrun then stops the other
    rank_lines = [line for line in result.stderr.splitlines() if line.startswith(("[0]", "[1]"))]
    message = f"error: --results_dir {results} exists and is not a directory"
    assert sorted(line for line in rank_lines if "error:" in line) == [f"[0]<stderr>:{message}",
                                                                       f"[1]<stderr>:{message}"]
    assert not any("Traceback" in line for line in rank_lines) and snapshot(tmp_path) == before
