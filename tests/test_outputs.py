"""main.py outputs (log, checkpoints, SavedModel export) are checked before any work, never land on
an input, and an export replaces only an earlier export; final records say when no evaluation ran."""
import contextlib
import json
import os

import numpy as np
import pytest
import tensorflow as tf

import saved_model
from recsys.data.batch import CATEGORICAL_KEY, NUMERICAL_KEY
from factory import single_process_model
from recsys.training.model_config import DlrmConfig
from multiproc import assert_ok, launch_env, run_horovod, snapshot
from recsys.runtime.safe_io import OutputPathError
from test_flags import assert_refused, refused_in_process
from test_main import SMALL, final_record, main_py
from recsys.runtime.logger import DllLogger, check_log_file

STEP = "step_000000003"
MARKER = json.dumps({"format": saved_model.EXPORT_FORMAT, "version": saved_model.EXPORT_VERSION})
FILES = {  # what the refusals below must leave untouched
    "data/feature_spec.yaml": "feature_spec: {}\n",
    "data/" + saved_model.EXPORT_MARKER: MARKER,  # a marker cannot make an input replaceable
    f"ckpt/{STEP}/manifest.json": "{}",
    "notes.txt": "keep me\n",
    "full/a.txt": "mine\n",
    "a_file": "x",
    "old_export/saved_model.pb": "",
    "old_export/" + saved_model.EXPORT_MARKER: MARKER,
    "mixed_export/saved_model.pb": "",
    "mixed_export/" + saved_model.EXPORT_MARKER: MARKER,
    "mixed_export/notes.md": "mine\n",
}
DATA = ["--synthetic_dataset_use_feature_spec", "--dataset_path", "{t}/data"]
DEPLOY = ["--mode", "deploy", "--restore_checkpoint_path", "{t}/ckpt"]


@pytest.mark.parametrize("args, message", [
    (DATA + ["--log_path", "{t}/data/feature_spec.yaml"],
     "--log_path {t}/data/feature_spec.yaml lies inside --dataset_path {t}/data"),
    (["--mode", "eval", "--restore_checkpoint_path", "{t}/ckpt", "--log_path", f"{{t}}/ckpt/{STEP}/manifest.json"],
     f"--log_path {{t}}/ckpt/{STEP}/manifest.json lies inside a checkpoint of --restore_checkpoint_path {{t}}/ckpt"),
    (["--save_checkpoint_path", "{t}/ckpt", "--log_path", f"{{t}}/ckpt/{STEP}/log.json"],
     f"--log_path {{t}}/ckpt/{STEP}/log.json lies inside a checkpoint of --save_checkpoint_path {{t}}/ckpt"),
    (["--log_path", "{t}/notes.txt"], "--log_path {t}/notes.txt exists and is not a dllogger log"),
    (["--log_path", "{t}/full"], "--log_path {t}/full is a directory"),
    (["--log_path", "{t}/a_file/log.json"], "{t}/a_file is a file, not a directory"),
    (["--save_checkpoint_path", "{t}/a_file"], "--save_checkpoint_path {t}/a_file exists and is not a directory"),
    (DATA + ["--save_checkpoint_path", "{t}/data"], "--save_checkpoint_path {t}/data is --dataset_path"),
    (["--save_checkpoint_path", "{t}/run", "--log_path", "{t}/run"],
     "--log_path {t}/run would overwrite --save_checkpoint_path {t}/run"),
    (["--saved_model_output_path", "{t}/c", "--save_checkpoint_path", "{t}/c"],
     "--saved_model_output_path {t}/c is --save_checkpoint_path"),
    (DEPLOY + ["--saved_model_output_path", "{t}/full"],
     "--saved_model_output_path {t}/full is a non-empty directory without this project's export marker"),
    (["--tensorboard_dir", "{t}/a_file"], "--tensorboard_dir {t}/a_file exists and is not a directory"),
    (["--tensorboard_dir", "{t}/a_file/tb"], "--tensorboard_dir {t}/a_file/tb: {t}/a_file is a file, not a directory"),
    (DATA + ["--tensorboard_dir", "{t}/data/tb"], "--tensorboard_dir {t}/data/tb lies inside --dataset_path {t}/data"),
    (["--save_checkpoint_path", "{t}/ckpt", "--tensorboard_dir", f"{{t}}/ckpt/{STEP}/tb"],
     f"--tensorboard_dir {{t}}/ckpt/{STEP}/tb lies inside a checkpoint of --save_checkpoint_path {{t}}/ckpt"),
    (DEPLOY + ["--saved_model_output_path", "{t}/ckpt"], "--saved_model_output_path {t}/ckpt is --restore_checkpoint_path"),
    (DEPLOY + ["--saved_model_output_path", f"{{t}}/ckpt/{STEP}"], "lies inside --restore_checkpoint_path"),
    (DEPLOY + ["--saved_model_output_path", "{t}"], "--saved_model_output_path {t} contains --restore_checkpoint_path"),
    (DEPLOY + DATA + ["--saved_model_output_path", "{t}/data"], "--saved_model_output_path {t}/data is --dataset_path"),
    (DEPLOY + ["--saved_model_output_path", "{t}/a_file"], "{t}/a_file exists and is not a directory"),
    (DEPLOY + ["--saved_model_output_path", "{t}/old_export", "--log_path", "{t}/old_export/log.json"],
     "--saved_model_output_path {t}/old_export contains --log_path"),
    (DEPLOY + ["--saved_model_output_path", "{t}/mixed_export"], "--saved_model_output_path {t}/mixed_export holds notes.md"),
], ids=lambda v: v if isinstance(v, str) else " ".join(v)[-60:])
def test_output_refused_before_any_work(tmp_path, capsys, args, message):
    for relative, text in FILES.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text)
    fill = lambda s: s.replace("{t}", str(tmp_path))  # noqa: E731
    refused_in_process([fill(a) for a in args], fill(message), tmp_path, capsys)
    for relative, text in FILES.items():
        assert (tmp_path / relative).read_text() == text


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
@pytest.mark.parametrize("flag", ["--log_path", "--save_checkpoint_path", "--saved_model_output_path",
                                  "--tensorboard_dir"])
def test_output_in_a_read_only_folder_is_refused(tmp_path, capsys, flag):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        refused_in_process([flag, str(locked / "out")], f"{flag} {locked / 'out'}", tmp_path, capsys)
    finally:
        locked.chmod(0o700)


def test_logger_creates_its_file_at_the_first_record_and_appends_only_to_logs(tmp_path):
    path = tmp_path / "logs" / "run.json"
    DllLogger(str(path)).close()
    assert not (tmp_path / "logs").exists()
    logger = DllLogger(str(path))
    logger.log_parameters({"a": 1})
    logger.close()
    check_log_file(str(path), "--log_path")  # an earlier log may be appended to
    (tmp_path / "empty").write_text("")
    check_log_file(str(tmp_path / "empty"), "--log_path")
    (tmp_path / "spec.yaml").write_text("feature_spec: {}\n")
    with pytest.raises(OutputPathError, match="spec.yaml exists and is not a dllogger log"):
        check_log_file(str(tmp_path / "spec.yaml"), "--log_path")


def _tiny_model():
    model = single_process_model(DlrmConfig(num_numerical_features=3, cardinalities=[11, 5], embedding_dim=(4, 4),
                            bottom_mlp_dims=[8, 4], top_mlp_dims=[8, 1], interaction="tensorflow"))
    model.build_weights()
    return model


def test_export_writes_a_marker_and_replaces_only_its_own_exports(tmp_path, monkeypatch):
    model = _tiny_model()
    target = tmp_path / "exports" / "model"
    target.mkdir(parents=True)  # an empty folder may be used
    saved_model.export(model, str(target))
    marker = json.loads((target / saved_model.EXPORT_MARKER).read_text())
    assert marker == {"format": saved_model.EXPORT_FORMAT, "version": saved_model.EXPORT_VERSION, "hotness": [1, 1],
                      "num_numerical_features": 3}
    for table in model.table_views():
        table.write_rows(0, table.rows, np.full((table.rows, table.dim), 0.25, np.float32))
    saved_model.export(model, str(target))  # an earlier export is replaced whole
    assert os.listdir(tmp_path / "exports") == ["model"]
    features = {NUMERICAL_KEY: tf.constant(np.ones((2, 3), np.float32)),
                CATEGORICAL_KEY: (tf.constant([1, 10]), tf.constant([0, 4]))}
    np.testing.assert_allclose(saved_model.load_predict_fn(str(target))(features).numpy(),
                               model(features, training=False).numpy(), rtol=1e-6)

    real_save = tf.saved_model.save

    def save_then_fail(*args, **kwargs):
        real_save(*args, **kwargs)
        raise OSError("disk full")

    before = snapshot(tmp_path)
    monkeypatch.setattr(tf.saved_model, "save", save_then_fail)
    with pytest.raises(OutputPathError, match="model: cannot write the SavedModel: disk full"):
        saved_model.export(model, str(target))
    assert snapshot(tmp_path) == before  # the previous export intact, no temporary left
    monkeypatch.undo()
    (target / "notes.md").write_text("mine")
    before = snapshot(tmp_path)
    with pytest.raises(OutputPathError, match="export path .*model holds notes.md"):
        saved_model.export(model, str(target))
    assert snapshot(tmp_path) == before


@pytest.fixture(scope="module")
def stopped_early(tmp_path_factory):
    """A 3-step run of a 12-step epoch (its evaluation would be at step 12): checkpoint and log."""
    root = tmp_path_factory.mktemp("stopped_early")
    result = main_py(SMALL + ["--max_steps", "3", "--save_checkpoint_path", str(root / "ckpt"),
                              "--log_path", str(root / "log.json")])
    assert_ok(result)
    return root, result


def test_run_stopped_before_any_evaluation_says_so(stopped_early):
    root, result = stopped_early
    record = final_record(root / "log.json")
    assert record["evaluations"] == 0 and "auc" not in record and "validation_loss" not in record, record
    assert record["train_loss"] > 0
    assert "no evaluation ran before training ended (--max_steps 3" in result.stdout


def test_training_exports_then_deploy_replaces_that_export(stopped_early, tmp_path):
    root, _ = stopped_early
    exported = tmp_path / "exports" / "model"
    exported.mkdir(parents=True)
    assert_ok(main_py(SMALL + ["--restore_checkpoint_path", str(root / "ckpt"), "--saved_model_output_path",
                               str(exported), "--log_path", str(tmp_path / "log.json")]))
    record = final_record(tmp_path / "log.json")
    assert record["evaluations"] == 1 and 0.0 < record["auc"] < 1.0 and record["validation_loss"] > 0, record
    assert (exported / saved_model.EXPORT_MARKER).is_file()
    trained = (exported / "saved_model.pb").stat().st_mtime_ns
    result = main_py(SMALL + ["--mode", "deploy", "--restore_checkpoint_path", str(root / "ckpt"),
                              "--saved_model_output_path", str(exported), "--log_path", str(tmp_path / "log.json")])
    assert_ok(result)
    assert f"deployed to: {exported}" in result.stdout
    assert (exported / "saved_model.pb").stat().st_mtime_ns != trained
    assert (exported / saved_model.EXPORT_MARKER).is_file() and os.listdir(tmp_path / "exports") == ["model"]


def test_inference_shorter_than_its_warmup_is_refused(stopped_early):
    root, _ = stopped_early
    before = snapshot(root)
    result = main_py(SMALL + ["--mode", "inference", "--restore_checkpoint_path", str(root / "ckpt"),
                              "--log_path", str(root / "inference.json")])
    assert_refused(result.returncode, result.stderr,
                   "after 10 warm-up batches but would run only 3: --max_steps -1, and the test data has 3 "
                   "batches of --valid_batch_size 100", root, before)


def test_bad_log_path_stops_every_rank_of_a_horovod_job(tmp_path):
    before = snapshot(tmp_path)
    result = run_horovod(["main.py", *SMALL, "--log_path", str(tmp_path)], np=2)
    assert result.returncode != 0
    assert "exit with status code 2" in result.stdout  # the first rank to exit; horovodrun then stops the other
    rank_lines = [line for line in result.stderr.splitlines() if line.startswith(("[0]", "[1]"))]
    message = f"error: --log_path {tmp_path} is a directory; a file path is expected"
    assert sorted(line for line in rank_lines if "error:" in line) == [f"[0]<stderr>:{message}", f"[1]<stderr>:{message}"]
    # horovodrun itself raises when a rank fails; the ranks print no traceback
    assert not any("Traceback" in line for line in rank_lines) and snapshot(tmp_path) == before


def test_log_beside_the_checkpoints_of_its_run(tmp_path):
    run = tmp_path / "run1"
    args = SMALL + ["--save_checkpoint_path", str(run), "--log_path", str(run / "log.json")]
    assert_ok(main_py(args + ["--max_steps", "2"]))
    assert_ok(main_py(args + ["--max_steps", "4", "--restore_checkpoint_path", str(run)]))
    assert sorted(os.listdir(run)) == ["log.json", "step_000000002", "step_000000004"]
    assert final_record(run / "log.json")["evaluations"] == 0


def test_demo_never_deletes_a_folder_it_did_not_write(tmp_path):
    import subprocess

    (tmp_path / "thesis.tex").write_text("years of work\n")
    result = subprocess.run(["bash", "scripts/demo.sh"], cwd=os.path.dirname(os.path.dirname(__file__)),
                            env=dict(os.environ, DEMO_DIR=str(tmp_path)), capture_output=True, text=True)
    assert result.returncode == 2 and "is not an earlier demo's output; refusing to delete it" in result.stderr
    assert os.listdir(tmp_path) == ["thesis.tex"]


def test_demo_runs_the_pipeline_from_raw_criteo_days(tmp_path):
    """scripts/demo.sh at a small size: raw days -> prepare_dataset.sh -> 2-rank training -> eval,
    inference, export, plot, the ONNX export served by Triton and scored over HTTP; the summary reports
    the preprocessing's line accounting and the served AUC."""
    import re
    import subprocess

    from test_progress import png_size

    demo = tmp_path / "demo"
    result = subprocess.run(["bash", "scripts/demo.sh"], cwd=os.path.dirname(os.path.dirname(__file__)),
                            env=dict(os.environ, DEMO_DIR=str(demo), DEMO_LINES_PER_DAY="30000"),
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-3000:])
    for day in range(4):
        lines = (demo / "raw" / f"day_{day}").read_text().splitlines()
        assert len(lines) == 30000 and sum(line.count("\t") == 39 for line in lines) >= 29998
    summary = json.loads((demo / "data" / "preprocessing_summary.json").read_text())
    assert summary["engine"] == "duckdb"
    assert summary["total"] == {"rows": 119992, "input_lines": 120000, "rejected_lines": 8}
    out = result.stdout
    assert ("preprocessing (duckdb, frequency threshold 15): 120,000 input lines = 119,992 rows + 8 rejected "
            "(wrong_field_count 2, bad_label 2, non_integer_numerical 2, non_hex_categorical 2)") in out
    splits = summary["splits"]
    assert ", ".join(f"{name} {splits[name]['rows']:,} rows of {splits[name]['input_lines']:,} lines"
                     for name in ("train", "test", "validation")) in out
    assert splits["train"]["input_lines"] == 90000 and splits["test"]["input_lines"] == 15000
    assert re.search(r"^\[0\]<stdout>:step=\d+/87, epoch=1/1, .* eta=\d+:\d\d:\d\d$", out, re.M)
    auc, teacher = map(float, re.search(r"^test AUC ([\d.]+) .* teacher AUC ([\d.]+)", out, re.M).groups())
    assert 0.7 < auc < teacher  # learned from the raw lines; the teacher's labels bound it
    assert len(list((demo / "tensorboard").glob("events.out.tfevents.*"))) == 1  # rank 0 only
    assert png_size(demo / "train_log.png") == (1200, 800)
    # a curve, not a few points: a progress line (its mean loss) about every 30th of the epoch; 4 evaluations
    points = re.search(r"^plot written to .*train_log.png \((\d+) loss points, 4 AUC points\)$", out, re.M)
    assert points and int(points.group(1)) >= 20, out[-3000:]
    assert (demo / "saved_model" / "saved_model.pb").is_file()
    # served by Triton and scored over HTTP: the served AUC is the in-process one, which is main.py's eval
    served = re.search(r"^served by Triton over HTTP \(([\d,]+) test samples\): AUC ([\d.]+), in-process ([\d.]+) ",
                       out, re.M)
    assert served and served.group(2) == served.group(3), out[-3000:]
    assert abs(float(served.group(2)) - auc) < 1e-4


def test_wide_and_deep_demo_runs_from_csvs_to_the_plot(tmp_path):
    """scripts/demo_wd.sh (make demo-wd) at its smallest: Outbrain-format CSVs -> preproc.sh -> 2-rank
    training -> evaluation from the checkpoint -> the log's plot -> MAP@12 and AUC beside the teacher's."""
    import re
    import subprocess

    from test_progress import png_size

    demo = tmp_path / "demo"
    result = subprocess.run(["bash", "scripts/demo_wd.sh"], cwd=os.path.dirname(os.path.dirname(__file__)),
                            env=dict(os.environ, DEMO_DIR=str(demo), DEMO_DISPLAYS="20000", DEMO_EPOCHS="1"),
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-3000:])
    out = result.stdout
    model_map, teacher_map = map(float, re.search(r"^MAP@12: reference's [\d.]+, exact ([\d.]+); teacher ([\d.]+)$",
                                                  out, re.M).groups())
    auc, teacher_auc = map(float, re.search(r"^AUC ([\d.]+) \(teacher ([\d.]+)\)", out, re.M).groups())
    assert 0.5 < model_map < teacher_map + 0.01 and 0.5 < auc < teacher_auc + 0.01  # learned; the teacher bounds it
    assert png_size(demo / "train_log.png") == (1200, 800)
    # a progress record (its mean loss) at each of the 7 steps: the demo asks for about 30 a run
    assert re.search(r"^plot written to .*train_log.png \(7 loss points, 1 AUC points, 1 MAP@12 points\)$", out, re.M)


def test_a_full_disk_during_deploy_is_one_line_and_leaves_nothing(tmp_path):
    import resource
    import signal
    import subprocess
    import sys

    from multiproc import REPO_ROOT, assert_one_error, launch_env

    ckpt, exported = tmp_path / "ckpt", tmp_path / "exported"
    assert_ok(main_py(SMALL + ["--max_steps", "2", "--save_checkpoint_path", str(ckpt),
                               "--log_path", str(tmp_path / "t.json")]))
    before = snapshot(tmp_path)

    def limit_file_size():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (2000, 2000))  # the SavedModel's files are larger

    result = subprocess.run([sys.executable, "main.py", *SMALL, "--mode", "deploy", "--restore_checkpoint_path",
                             str(ckpt), "--saved_model_output_path", str(exported), "--log_path", ""],
                            cwd=REPO_ROOT, env=launch_env({"PYTHONDONTWRITEBYTECODE": "1", "PMIX_MCA_gds": "hash"}),
                            capture_output=True, text=True, timeout=300, preexec_fn=limit_file_size)
    assert_one_error(result, f"{exported}: cannot write the SavedModel:", code=2)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("script", ["scripts/demo.sh", "scripts/demo_wd.sh"])
def test_a_demo_rerun_removes_only_what_it_wrote(tmp_path, script):
    """A demo records what it wrote (its manifest, written when it exits, here on SIGTERM); a rerun refuses,
    naming the file and deleting nothing, while DEMO_DIR holds a file it did not write (a copied checkpoint
    in one of its folders), and once that is gone removes the earlier run's output and starts afresh."""
    import signal
    import subprocess
    import sys
    import time

    demo = tmp_path / "demo"
    env = dict(os.environ, DEMO_DIR=str(demo), DEMO_LINES_PER_DAY="21000", DEMO_DISPLAYS="20000",
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def run(stop_after_first_step):
        process = subprocess.Popen(["bash", script], cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, start_new_session=True)
        if stop_after_first_step:  # as step 2 begins: step 1's folder is whole
            seen, stopping = [], False
            for line in process.stdout:
                seen.append(line)
                # a signal that reaches bash as it forks the step's process can go unanswered (seen on a
                # loaded machine): a user presses Ctrl-C again, and so does this test at the next step
                if line.startswith("== 2") or (stopping and line.startswith("== ")):
                    with contextlib.suppress(ProcessLookupError):  # the line may outlive the demo in the pipe
                        os.killpg(process.pid, signal.SIGTERM)
                    stopping = True
            if not stopping:  # the demo ended without starting step 2 where this test could see it
                raise AssertionError(f"no '== 2' line in the demo's output:\n{''.join(seen)[-3000:]}")
        out, err = process.communicate(timeout=600)  # generous: a loaded machine slows the demo, not the check
        return process.returncode, err

    returncode, err = run(stop_after_first_step=True)
    assert returncode == 143 and not [line for line in err.splitlines() if line.startswith("error:")], err[-3000:]
    manifest = [p for p in demo.iterdir() if p.name.endswith("_demo_output")]
    assert len(manifest) == 1 and manifest[0].read_bytes()
    folder = sorted(p for p in demo.iterdir() if p.is_dir())[0]
    (folder / "copied_checkpoint.npy").write_bytes(b"mine")
    before = snapshot(demo)
    returncode, err = run(stop_after_first_step=False)
    assert returncode == 2 and err.splitlines() == [
        f"error: DEMO_DIR {demo} holds {folder}/copied_checkpoint.npy, which no earlier run of this demo wrote; "
        f"refusing to delete anything (move it away or choose another DEMO_DIR)"], err[-3000:]
    assert snapshot(demo) == before
    os.remove(folder / "copied_checkpoint.npy")
    started = time.time()
    returncode, err = run(stop_after_first_step=True)
    old = [str(p) for p in demo.rglob("*") if p.is_file() and p.stat().st_mtime < started]
    assert returncode == 143 and not old, (old, err[-3000:])


def test_a_second_run_never_mixes_into_another_runs_log_or_events_and_a_resume_continues_them(tmp_path):
    """A --log_path or --tensorboard_dir holding another run's record is refused before anything is
    written (W&D's --results_dir answers the same, tests/test_wd_train.py); the run resumed from that
    run's checkpoint continues both, and the log plots as one run."""
    import subprocess
    import sys

    from multiproc import REPO_ROOT, assert_one_error
    from recsys.runtime.logger import read_dllogger_file

    log, events = tmp_path / "log.json", tmp_path / "tb"
    first = ["--save_checkpoint_path", str(tmp_path / "ckpt"), "--tensorboard_dir", str(events), "--print_freq", "1"]
    assert_ok(main_py(SMALL + first + ["--max_steps", "6", "--log_path", str(log)]))
    before = snapshot(tmp_path)
    fresh = ["--save_checkpoint_path", str(tmp_path / "other"), "--max_steps", "6"]
    result = main_py(SMALL + fresh + ["--log_path", str(log)])
    assert_one_error(result, f"--log_path {log} holds the record of another run; choose another --log_path", code=2)
    result = main_py(SMALL + fresh + ["--log_path", str(tmp_path / "new.json"), "--tensorboard_dir", str(events)])
    assert_one_error(result, f"--tensorboard_dir {events} holds the record of another run", code=2)
    assert snapshot(tmp_path) == before

    assert_ok(main_py(SMALL + first + ["--max_steps", "10", "--log_path", str(log),
                                       "--restore_checkpoint_path", str(tmp_path / "ckpt")]))
    records = list(read_dllogger_file(str(log)))
    parameters = [r["data"] for r in records if r.get("step") == "PARAMETER"]
    assert len(parameters) == 2 and parameters[0]["run_lineage"] == parameters[1]["run_lineage"]
    losses = [r["step"] for r in records if "loss" in r.get("data", {})]
    assert losses == sorted(losses) and losses[-1] > 6, losses  # both runs' progress, one step sequence
    plotted = subprocess.run([sys.executable, "scripts/plot_log.py", str(log)], cwd=REPO_ROOT, env=launch_env(),
                             capture_output=True, text=True, timeout=120)
    assert_ok(plotted)
    assert f"({len(losses)} loss points" in plotted.stdout, plotted.stdout
