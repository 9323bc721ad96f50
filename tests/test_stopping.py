"""A shared cluster: one run per save folder (folder_lock), SIGINT/SIGTERM/SIGUSR1 ending a run
cleanly with a checkpoint it resumes from (stop_signals), and a rank that stops answering ending the
job (peer_watch), with real processes and real horovodrun. The Slurm path (warning signal, requeue,
resume by itself) is in test_slurm.py; a killed rank is in test_hybrid.py."""
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

from recsys.training import checkpoint
from recsys.runtime import folder_lock
from multiproc import REPO_ROOT, assert_ok, horovod_command, launch_env, require, run_horovod, run_python

MODEL = ["--embedding_dim", "8", "--bottom_mlp_dims", "16,8", "--top_mlp_dims", "16,1", "--dot_interaction",
         "tensorflow", "--dataset_type", "synthetic", "--synthetic_dataset_cardinalities", "50,20,7,30",
         "--synthetic_dataset_num_numerical_features", "5", "--synthetic_dataset_valid_batches", "3",
         "--batch_size", "64", "--valid_batch_size", "100", "--learning_rate", "0.1", "--warmup_steps", "2",
         "--seed", "7", "--deterministic", "--print_freq", "200"]
LONG = MODEL + ["--synthetic_dataset_train_batches", "1000000"]  # runs until a signal stops it


def start(args, np=1, env=None):
    """A training run in the background (np > 1: under horovodrun), its output in a pipe."""
    command = [sys.executable, "main.py", *args] if np == 1 else horovod_command(["main.py", *args], np=np)
    return subprocess.Popen(command, cwd=REPO_ROOT, env=launch_env(env), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def rank_processes(job):
    """The python processes of a horovodrun job's ranks, by rank."""
    found = {}
    for process in psutil.Process(job.pid).children(recursive=True):
        command = process.cmdline()
        if "main.py" in command and command[0].endswith(("python", "python3", os.path.basename(sys.executable))):
            found[int(process.environ()["HOROVOD_RANK"])] = process
    return found


def wait_for_steps(process, timeout=240):
    """Read the run's output until its first progress line (training is under way); returns it."""
    seen = []
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = process.stdout.readline()
        if not line:
            pytest.fail("the run ended before training:\n" + "".join(seen[-40:]))
        seen.append(line)
        if "step=" in line:
            return "".join(seen)
    pytest.fail("no progress line in time:\n" + "".join(seen[-40:]))


def finish(process, timeout=120):
    """The run's exit code and its whole output."""
    try:
        rest, _ = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
    return process.returncode, rest


def stopped_step(output):
    for line in output.splitlines():
        if "stopped by " in line and " after step " in line:
            return int(line.split(" after step ")[1].split()[0])
    pytest.fail("no 'stopped by ... after step N' line:\n" + output[-4000:])


def arrays(root):
    path = checkpoint.resolve(str(root))
    return {os.path.relpath(f, path): np.load(f) for f in sorted(glob.glob(f"{path}/*/*.npy"))}


def test_second_run_on_a_held_folder_is_refused_and_sigint_stops_the_first_with_a_resumable_checkpoint(tmp_path):
    folder = tmp_path / "ckpt"
    first = start(LONG + ["--save_checkpoint_path", str(folder), "--log_path", str(tmp_path / "a.json")])
    try:
        output = wait_for_steps(first)
        second = run_python(["main.py", *LONG, "--save_checkpoint_path", str(folder),
                             "--log_path", str(tmp_path / "b.json")])
        assert second.returncode == 2, second.stderr[-3000:]
        assert "Traceback" not in second.stderr
        errors = [line for line in second.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and str(folder) in errors[0] and "in use by another run" in errors[0], errors
        assert f"pid {first.pid}" in errors[0] and "host " in errors[0]
        first.send_signal(signal.SIGINT)
        code, rest = finish(first)
    finally:
        if first.poll() is None:
            first.kill()
    output += rest
    assert code == 128 + signal.SIGINT, output[-4000:]
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output[-4000:]
    step = stopped_step(output)
    assert "--restore_checkpoint_path" in output and "--auto_resume" in output
    assert checkpoint.resolve(str(folder)).endswith(f"step_{step:09d}")
    assert not os.path.exists(folder / folder_lock.LOCK_NAME), "the lock is given back"
    assert not (tmp_path / "b.json").exists()

    # The interrupted run, resumed by --auto_resume, ends where an uninterrupted one does, bit for bit.
    end = ["--max_steps", str(step + 30)]
    assert_ok(run_python(["main.py", *LONG, *end, "--auto_resume", "--save_checkpoint_path", str(folder)]))
    assert_ok(run_python(["main.py", *LONG, *end, "--save_checkpoint_path", str(tmp_path / "whole")]))
    resumed, whole = arrays(folder), arrays(tmp_path / "whole")
    assert resumed.keys() == whole.keys()
    for name in whole:
        np.testing.assert_array_equal(resumed[name], whole[name], err_msg=name)


def test_a_lock_left_by_a_killed_run_is_taken_over_with_a_message(tmp_path):
    folder = tmp_path / "ckpt"
    killed = start(LONG + ["--save_checkpoint_path", str(folder)])
    try:
        wait_for_steps(killed)
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=30)
    finally:
        if killed.poll() is None:
            killed.kill()
    assert folder_lock.read_holder(str(folder / folder_lock.LOCK_NAME)).pid == killed.pid
    result = run_python(["main.py", *MODEL, "--synthetic_dataset_train_batches", "4",
                         "--save_checkpoint_path", str(folder)])
    assert_ok(result)
    assert f"ended without giving it back (host {os.uname().nodename}, pid {killed.pid}" in result.stdout
    assert checkpoint.resolve(str(folder)).endswith("step_000000004")


def test_sigterm_to_one_rank_stops_both_ranks_at_the_same_step(tmp_path):
    """What Slurm or Kubernetes do to one node's process: the other rank learns of it through the
    step's allreduce, both save one checkpoint together and leave with SIGTERM's code, rank 0 after
    giving the save folder's lock back (horovodrun reports the first exit and may end the other
    rank itself, so it reports one or both)."""
    folder = tmp_path / "ckpt"
    job = start(LONG + ["--save_checkpoint_path", str(folder), "--cpu"], np=2)
    try:
        wait_for_steps(job)
        ranks = rank_processes(job)
        assert sorted(ranks) == [0, 1], ranks
        ranks[1].send_signal(signal.SIGTERM)
        code, output = finish(job)
    finally:
        if job.poll() is None:
            os.killpg(os.getpgid(job.pid), signal.SIGKILL)
    assert code != 0
    exits = [line for line in output.splitlines() if "exit with status code" in line]
    assert exits and all(line.endswith(f"code {128 + signal.SIGTERM}.") for line in exits), output[-4000:]
    assert not (folder / folder_lock.LOCK_NAME).exists(), output[-4000:]
    assert not [line for line in output.splitlines() if line.startswith(("[0]", "[1]")) and "Traceback" in line]
    assert output.count("received SIGTERM") == 1, output[-4000:]
    step = stopped_step(output)
    assert [os.path.basename(p) for p in checkpoint.list_checkpoints(str(folder))] == [f"step_{step:09d}"]
    assert int(np.load(f"{checkpoint.resolve(str(folder))}/state/lr_schedule_step.npy")) == step


def test_a_frozen_rank_ends_the_job_within_a_minute_and_auto_resume_finishes_its_training(tmp_path):
    """A cut link, on one host: SIGSTOP freezes rank 1 in the middle of a checkpoint save (its
    sockets stay open and its kernel still accepts connections, but nothing answers, as across a
    link that stalls). Rank 0's peer watch ends the job within the minute with one line naming the
    rank and host; the folder holds whole checkpoints and the save's hidden temporary, which the
    relaunch with --auto_resume removes before it trains on to the weights of a run never stopped."""
    # Rank 1 holds the 3M-row table (basic strategy): rank 0 writes it from 12 chunk collectives.
    args = [a.replace("50,20,7,30", "50,3000000,7,30") for a in LONG] + ["--dist_strategy", "basic"]
    folder = tmp_path / "ckpt"
    job = start(args + ["--save_checkpoint_path", str(folder), "--checkpoint_every_n_steps", "5",
                        "--keep_checkpoints", "1"], np=2, env={"DLRM_PEER_TIMEOUT": "5"})
    try:
        deadline = time.time() + 240
        while not (checkpoint.list_checkpoints(str(folder))
                   and glob.glob(f"{folder}/.step_*.tmp-*/embeddings/feature_1.npy")):
            assert time.time() < deadline and job.poll() is None, "no save in progress was seen"
            time.sleep(0.01)
        rank_processes(job)[1].send_signal(signal.SIGSTOP)
        frozen_at = time.time()
        code, output = finish(job, timeout=90)
        took = time.time() - frozen_at
    finally:
        if job.poll() is None:
            os.killpg(os.getpgid(job.pid), signal.SIGKILL)
    assert code != 0 and took < 60, (took, output[-4000:])
    lost = [line for line in output.splitlines() if "error: lost" in line]
    assert len(lost) == 1, output[-4000:]
    assert re.search(r"^\[0\]<stderr>:error: lost rank 1 on host localhost \(no answer from 127\.0\.0\.1:[0-9]+ "
                     r"for [0-9]+ s\); stopping$", lost[0]), lost
    assert not [line for line in output.splitlines() if line.startswith(("[0]", "[1]")) and "Traceback" in line]
    saved = checkpoint.list_checkpoints(str(folder))
    assert sorted(glob.glob(f"{folder}/step_*")) == saved, "a step folder without its manifest"
    half_written = glob.glob(f"{folder}/.step_*.tmp-*")
    assert half_written, "the freeze should have interrupted a save"

    end = ["--max_steps", str(checkpoint.read_manifest(saved[-1]).step + 5)]
    resumed = run_horovod(["main.py", *args, *end, "--auto_resume", "--save_checkpoint_path", str(folder)])
    assert_ok(resumed)
    assert f"removed what a run that ended mid-write left half-written: {os.path.basename(half_written[0])}" \
        in resumed.stdout, resumed.stdout[-3000:]
    assert not glob.glob(f"{folder}/.step_*.tmp-*")
    assert_ok(run_horovod(["main.py", *args, *end, "--save_checkpoint_path", str(tmp_path / "whole")]))
    after, whole = arrays(folder), arrays(tmp_path / "whole")
    assert after.keys() == whole.keys()
    for name in whole:
        np.testing.assert_array_equal(after[name], whole[name], err_msg=name)


def test_evaluation_stopped_by_sigterm_says_so_in_one_line(tmp_path):
    """Outside training nothing is worth finishing: the first signal ends the run at once."""
    folder = tmp_path / "ckpt"
    assert_ok(run_python(["main.py", *MODEL, "--synthetic_dataset_train_batches", "2",
                          "--save_checkpoint_path", str(folder)]))
    evaluation = start(MODEL + ["--synthetic_dataset_train_batches", "2", "--mode", "inference", "--max_steps",
                                "100000000", "--synthetic_dataset_valid_batches", "100000000",
                                "--restore_checkpoint_path", str(folder)])
    try:
        while "restored" not in evaluation.stdout.readline():
            pass
        time.sleep(2)
        evaluation.send_signal(signal.SIGTERM)
        code, output = finish(evaluation)
    finally:
        if evaluation.poll() is None:
            evaluation.kill()
    assert code == 128 + signal.SIGTERM, output[-3000:]
    assert "Traceback" not in output and "stopped by SIGTERM" in output, output[-3000:]


def test_a_stop_that_a_library_turns_into_its_own_error_still_ends_as_the_stop():
    """DuckDB answers the StopNow a signal raises inside its query with its own "Query interrupted"
    error: run_stopping_at_once still reports the signal (one line, 128 + N), not a traceback."""
    script = ("import os, signal, sys\n"
              "from recsys.runtime.stop_signals import StopNow, run_stopping_at_once\n"
              "def body():\n"
              "    try:\n"
              "        os.kill(os.getpid(), signal.SIGTERM)\n"
              "    except StopNow:\n"
              "        raise RuntimeError('Query interrupted')\n"
              "    return 0\n"
              "sys.exit(run_stopping_at_once(body))\n")
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 128 + signal.SIGTERM, result.stderr
    assert result.stderr.splitlines() == [line for line in result.stderr.splitlines() if line.startswith("stopped by SIGTERM")]
    assert len(result.stderr.splitlines()) == 1


def test_error_lines_stay_whole_under_mpiruns_tagged_output():
    """mpirun tags each write it reads from a rank: the one-line messages (cli.stderr_line) go out in
    one write, so no line ends in a bare `[1,0]<stderr>:` tag (print's second write for the newline
    did this to a lost-rank line in CI, about one line in six when checked)."""
    require(shutil.which("mpirun") is not None, "mpirun not installed (Debian openmpi-bin)")
    script = ("import time\n"
              "from recsys.runtime.cli import stderr_line\n"
              "for number in range(200):\n"
              "    stderr_line(f'error: line {number}')\n"
              "    time.sleep(0.001)\n")
    result = subprocess.run(["mpirun", "-np", "2", "--oversubscribe", "--tag-output", sys.executable, "-c", script],
                            cwd=REPO_ROOT, env=launch_env(), capture_output=True, text=True, timeout=120)
    assert_ok(result)
    lines = (result.stdout + result.stderr).splitlines()
    whole = [line for line in lines if re.fullmatch(r"\[1,[01]\]<stderr>:error: line [0-9]+", line)]
    assert len(whole) == 400 == len(lines), [line for line in lines if line not in whole][:5]
