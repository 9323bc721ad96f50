"""What a user watches during and after training: progress lines with the step out of the total,
the epoch, the mean loss of the interval and the ETA; evaluation progress; TensorBoard scalars
(--tensorboard_dir); and scripts/plot_log.py's PNG of loss and AUC from the dllogger log. All from one
real short run (and, for the interval's mean loss, its first steps again with a line at every step)."""
import glob
import json
import re
import struct
import subprocess
import sys
from collections import defaultdict

import numpy as np
import pytest
import tensorflow as tf

from multiproc import REPO_ROOT, assert_ok, launch_env
from test_main import SMALL_MODEL, main_py
from recsys.training.trainer import Evaluator, duration_text

STEPS_PER_EPOCH, EPOCHS, PRINT_FREQ = 40, 2, 5
PROGRESS = re.compile(r"^step=(\d+)/(\d+), epoch=(\d+)/(\d+), throughput=[\d.]+M, step_time=[\d.]+ ms, "
                      r"learning_rate=[\d.]+, loss=[\d.]+, mean_loss=[\d.]+, eta=(\d+):(\d\d):(\d\d)$")
# the short run's training: 2 epochs x 40 steps, 2 evaluations per epoch
RUN = [*SMALL_MODEL, "--dataset_type", "synthetic", "--synthetic_dataset_cardinalities", "50,20,7,30",
       "--synthetic_dataset_num_numerical_features", "5", "--synthetic_dataset_train_batches", str(STEPS_PER_EPOCH),
       "--synthetic_dataset_valid_batches", "3", "--batch_size", "64", "--valid_batch_size", "100",
       "--learning_rate", "0.1", "--warmup_steps", "2", "--epochs", str(EPOCHS), "--evals_per_epoch", "2"]


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    """One training run (RUN), a progress line every 5 steps."""
    root = tmp_path_factory.mktemp("run")
    result = main_py([*RUN, "--print_freq", str(PRINT_FREQ), "--log_path", str(root / "log.json"),
                      "--tensorboard_dir", str(root / "tb")])
    assert_ok(result)
    return root, result.stdout


def logged(log, key):
    """{global step: value} of `key` in the log's training records."""
    from recsys.runtime.logger import read_dllogger_file

    return {r["step"]: r["data"][key] for r in read_dllogger_file(str(log))
            if r["type"] == "LOG" and isinstance(r["step"], int) and key in r["data"]}


def test_progress_lines_show_step_of_total_epoch_and_eta(short_run):
    _, stdout = short_run
    lines = [line for line in stdout.splitlines() if line.startswith("step=")]
    parsed = [PROGRESS.match(line) for line in lines]
    assert lines and all(parsed), lines
    total = STEPS_PER_EPOCH * EPOCHS
    steps = [int(m.group(1)) for m in parsed]
    # the timer's warm-up is 2 x print_freq steps; then a line every print_freq steps to the end
    assert steps == list(range(3 * PRINT_FREQ, total + 1, PRINT_FREQ))
    for match, step in zip(parsed, steps):
        assert int(match.group(2)) == total and int(match.group(4)) == EPOCHS
        assert int(match.group(3)) == (step - 1) // STEPS_PER_EPOCH + 1
    etas = [int(m.group(5)) * 3600 + int(m.group(6)) * 60 + int(m.group(7)) for m in parsed]
    assert etas[-1] == 0  # nothing is left after the last step


def test_mean_loss_is_the_mean_of_the_losses_since_the_previous_line(short_run, tmp_path):
    """`mean_loss` (log, line, TensorBoard) averages the steps since the previous progress line, where
    `loss`, the reference's, is the last step's alone: the same run's first 4 intervals again with a line
    at every step (the same seed and data: the same losses) give each step's loss."""
    root, stdout = short_run
    every_step = main_py([*RUN, "--print_freq", "1", "--max_steps", str(4 * PRINT_FREQ),
                          "--log_path", str(tmp_path / "log.json")])
    assert_ok(every_step)
    losses, means = logged(tmp_path / "log.json", "loss"), logged(root / "log.json", "mean_loss")
    assert logged(tmp_path / "log.json", "mean_loss") == losses  # an interval of one step
    for step in (3 * PRINT_FREQ, 4 * PRINT_FREQ):  # the short run's first lines, after its timer's warm-up
        interval = [losses[s] for s in range(step - PRINT_FREQ + 1, step + 1)]
        assert means[step] == pytest.approx(sum(interval) / PRINT_FREQ, rel=1e-6), (step, interval)
        assert means[step] != pytest.approx(losses[step], rel=1e-3)  # not the last step's alone
        printed = re.search(rf"^step={step}/\d+, .*, mean_loss=([\d.]+),", stdout, re.M)
        assert float(printed.group(1)) == pytest.approx(means[step], abs=1e-8)


def test_duration_text():
    assert duration_text(0.4) == "0:00:00" and duration_text(3725.2) == "1:02:05"
    assert duration_text(90000) == "1 day, 1:00:00"


def test_tensorboard_holds_the_training_and_evaluation_scalars(short_run):
    root, stdout = short_run
    (events,) = glob.glob(str(root / "tb" / "events.out.tfevents.*"))
    scalars = defaultdict(dict)
    for event in tf.compat.v1.train.summary_iterator(events):
        for value in event.summary.value:
            scalars[value.tag][event.step] = float(tf.make_ndarray(value.tensor))
    assert set(scalars) == {"train/loss", "train/mean_loss", "train/learning_rate", "train/throughput",
                            "train/step_time_ms", "eval/auc", "eval/validation_loss"}
    progress_steps = [int(m) for m in re.findall(r"^step=(\d+)/", stdout, re.M)]
    for tag in ("train/loss", "train/mean_loss", "train/learning_rate", "train/throughput", "train/step_time_ms"):
        assert sorted(scalars[tag]) == progress_steps, tag
    printed = re.findall(r"^Evaluation completed, AUC: ([\d.]+), test_loss: ([\d.]+), step: (\d+)", stdout, re.M)
    assert len(printed) == EPOCHS * 2
    for auc, loss, step in printed:
        assert scalars["eval/auc"][int(step)] == pytest.approx(float(auc), abs=1e-6)
        assert scalars["eval/validation_loss"][int(step)] == pytest.approx(float(loss), abs=1e-6)
    line = re.search(r"^step=15/\d+, .* loss=([\d.]+), mean_loss=([\d.]+),", stdout, re.M)
    assert scalars["train/loss"][15] == pytest.approx(float(line.group(1)), abs=1e-7)
    assert scalars["train/mean_loss"][15] == pytest.approx(float(line.group(2)), abs=1e-7)


def png_size(path):
    """(width, height) from a PNG's IHDR chunk, after checking the signature and the chunk's name."""
    data = open(path, "rb").read(24)
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG signature"
    assert data[12:16] == b"IHDR", "the first chunk is not IHDR"
    return struct.unpack(">II", data[16:24])


def test_plot_log_draws_loss_and_auc_as_a_png(short_run, tmp_path):
    root, _ = short_run
    output = tmp_path / "plot.png"
    result = subprocess.run([sys.executable, "scripts/plot_log.py", str(root / "log.json"), "--output", str(output),
                             "--width", "900", "--height", "600", "--teacher_auc", "0.8"], cwd=REPO_ROOT,
                            env=launch_env(), capture_output=True, text=True, timeout=120)
    assert_ok(result)
    assert "14 loss points, 4 AUC points" in result.stdout  # a line every 5 steps from 15 to 80; 2 evals per epoch
    assert png_size(output) == (900, 600)
    assert output.stat().st_size > 10_000  # drawn, not a blank canvas


def test_plot_log_refuses_a_log_without_training_records(tmp_path):
    log = tmp_path / "eval.json"
    log.write_text('DLLL {"type": "LOG", "step": [], "data": {"auc": 0.7}}\n')
    result = subprocess.run([sys.executable, "scripts/plot_log.py", str(log)], cwd=REPO_ROOT, env=launch_env(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stderr.count("error:") == 1
    assert f"{log}: no training record with a loss or an AUC" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval.json"]
    result = subprocess.run([sys.executable, "scripts/plot_log.py", str(log), "--teacher_map", "nan"], cwd=REPO_ROOT,
                            env=launch_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stderr.strip() == "error: --teacher_map must be between 0 and 1, got nan"


def test_long_evaluation_prints_its_progress(capsys):
    features = {"x": np.arange(12, dtype=np.float32).reshape(6, 2)}
    dataset = tf.data.Dataset.from_tensor_slices((features, np.array([0, 1, 0, 1, 1, 0], np.float32))).batch(2)
    evaluator = Evaluator(lambda batch: tf.reduce_sum(batch["x"], axis=1), progress_interval_s=0.0)
    result = evaluator.evaluate(dataset)
    assert result.num_samples == 6
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" batches")[0] for line in lines] == ["evaluation: 1/3", "evaluation: 2/3", "evaluation: 3/3"]
    assert re.fullmatch(r"evaluation: 3/3 batches \(100%\), [\d.]+ batches/s, eta=0:00:00", lines[-1])
    quiet = Evaluator(lambda batch: tf.reduce_sum(batch["x"], axis=1))  # 30 s: a short test set prints nothing
    quiet.evaluate(dataset)
    assert capsys.readouterr().out == ""


def test_plot_log_draws_a_resumed_history_as_one_run_whose_rewind_replaces_the_abandoned_points(tmp_path):
    """A run killed after step 4 and resumed from its step-2 checkpoint (the same run_lineage) logged steps
    3 and 4 twice: the resumed values replace the abandoned ones; a third, fresh run makes the log one of
    two runs, which plot_log draws only when --run picks one."""
    def record(step, data):
        return "DLLL " + json.dumps({"type": "LOG", "step": step, "data": data}) + "\n"

    log = tmp_path / "log.json"
    first = [record("PARAMETER", {"run_lineage": "a"})] + [record(s, {"loss": 1.0 / s}) for s in (1, 2, 3, 4)]
    resumed = [record("PARAMETER", {"run_lineage": "a"})] + [record(s, {"loss": 0.5 / s}) for s in (3, 4, 5)]
    log.write_text("".join(first + resumed))
    plot = [sys.executable, "scripts/plot_log.py", str(log), "--output", str(tmp_path / "plot.png")]
    result = subprocess.run(plot, cwd=REPO_ROOT, env=launch_env(), capture_output=True, text=True, timeout=120)
    assert_ok(result)
    assert "(5 loss points" in result.stdout  # 1, 2, then the resumed 3, 4, 5

    log.write_text("".join(first + resumed + [record("PARAMETER", {"run_lineage": "b"}), record(1, {"loss": 1.0})]))
    result = subprocess.run(plot, cwd=REPO_ROOT, env=launch_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and f"{log}: holds 2 runs (starting at records 1, 10)" in result.stderr
    result = subprocess.run(plot + ["--run", "2"], cwd=REPO_ROOT, env=launch_env(), capture_output=True, text=True,
                            timeout=120)
    assert_ok(result)
    assert "(1 loss points" in result.stdout
