"""slurm_multinode.sh on a real one-node Slurm cluster: 2-rank Horovod training over PMIx, errors. The
requeue path (the warning signal, a checkpoint, requeue, auto-resume) is test_cluster.py's, across hosts."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import psutil
import pytest

from multiproc import REPO_ROOT, launch_env, require
from slurm_cluster import SlurmCluster, SlurmStartError, missing_binaries
from recsys.runtime.logger import read_dllogger_file

SCRIPT = os.path.join(REPO_ROOT, "slurm_multinode.sh")
TRAINING_ARGS = ["--mode", "train", "--dataset_type", "synthetic",
                 "--synthetic_dataset_cardinalities", "50,20,7,30",
                 "--synthetic_dataset_num_numerical_features", "5",
                 "--synthetic_dataset_train_batches", "12", "--synthetic_dataset_valid_batches", "3",
                 "--batch_size", "64", "--valid_batch_size", "100", "--embedding_dim", "8",
                 "--bottom_mlp_dims", "16,8", "--top_mlp_dims", "16,1",
                 "--dot_interaction", "tensorflow", "--cpu"]


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    """A private one-node cluster (2 CPUs) for this module, always torn down afterwards."""
    missing = missing_binaries()
    require(not missing, f"Slurm/munge not installed ({', '.join(missing)}); "
                         "Debian: slurmctld slurmd slurm-client munge")
    cluster = SlurmCluster(cpus=2)
    try:
        cluster.start()
    except SlurmStartError as error:
        require(False, f"a local Slurm cluster could not start: {error}")
    try:
        yield cluster
    finally:
        cluster.stop()


def run_script_directly(args: List[str], job_env: Dict[str, str]) -> subprocess.CompletedProcess:
    """Run the script outside any allocation with only `job_env` for its own variables."""
    env = {key: value for key, value in os.environ.items()
           if key not in ("cmd", "cont", "mounts", "srun_flags") and not key.startswith("SLURM_")}
    return subprocess.run(["bash", SCRIPT, *args], env={**env, **job_env}, capture_output=True,
                          text=True, timeout=30)


def submit_and_wait(cluster: SlurmCluster, job_env: Dict[str, str], output: Path,
                    timeout_s: int = 60) -> subprocess.CompletedProcess:
    """`sbatch -n 2 -N 1 --wait` the script; the job gets the rank environment plus `job_env`."""
    command = ["sbatch", "-n", "2", "-N", "1", "--time=5", "--wait", "--export=ALL",
               f"--output={output}", SCRIPT]
    env = {**launch_env(job_env), "SLURM_CONF": cluster.conf_path}
    try:
        return subprocess.run(command, env=env, cwd=output.parent, capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pytest.fail(f"job still running after {timeout_s} s\n{job_report(None, output, cluster)}")


def job_report(result: Optional[subprocess.CompletedProcess], output: Path,
               cluster: SlurmCluster) -> str:
    """sbatch's own output, the job's output file and the daemon logs, for assertion messages."""
    job_output = output.read_text(errors="replace")[-8000:] if output.exists() else "(no job output)"
    sbatch = f"sbatch exit {result.returncode}\n{result.stdout}{result.stderr}" if result else ""
    return f"{sbatch}\n--- job output\n{job_output}\n{cluster.log_tail()}"


def test_help_prints_usage() -> None:
    result = run_script_directly(["--help"], {})
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Usage:")
    for variable in ("cmd", "cont", "mounts", "srun_flags", "sbatch"):
        assert variable in result.stdout


def test_empty_cmd_is_a_clear_error() -> None:
    result = run_script_directly([], {"cmd": "  "})
    assert result.returncode == 2
    assert "'cmd' is empty" in result.stderr


def test_outside_an_allocation_is_a_clear_error() -> None:
    result = run_script_directly([], {"cmd": "true"})
    assert result.returncode == 2
    assert "not inside a Slurm allocation" in result.stderr


def test_empty_cmd_fails_the_job(slurm: SlurmCluster, tmp_path: Path) -> None:
    output = tmp_path / "job.out"
    result = submit_and_wait(slurm, {"cmd": ""}, output)
    assert result.returncode == 2, job_report(result, output, slurm)
    assert "'cmd' is empty" in output.read_text()


def test_a_failing_rank_ends_the_job_with_an_error(slurm: SlurmCluster, tmp_path: Path) -> None:
    """Rank 1 fails at once; rank 0 would sleep past the sbatch timeout unless srun ends it."""
    output = tmp_path / "job.out"
    failing_rank_one = 'if [ "$SLURM_PROCID" = 1 ]; then exit 3; fi; sleep 600'
    result = submit_and_wait(slurm, {"cmd": failing_rank_one}, output)
    report = job_report(result, output, slurm)
    assert result.returncode != 0, report
    job_output = output.read_text()
    assert "task 1: Exited with exit code 3" in job_output, report
    assert f"srun exited with status {result.returncode}" in job_output, report


def test_srun_flags_reach_srun(slurm: SlurmCluster, tmp_path: Path) -> None:
    output = tmp_path / "job.out"
    job_env = {"cmd": "echo rank=$SLURM_PROCID of $SLURM_NTASKS", "srun_flags": "--ntasks=1 --mpi=none"}
    result = submit_and_wait(slurm, job_env, output)
    job_output = output.read_text()
    assert result.returncode == 0, job_report(result, output, slurm)
    assert "rank=0 of 1" in job_output and "rank=1" not in job_output, job_output


def test_two_rank_training_under_srun_pmix(slurm: SlurmCluster, tmp_path: Path) -> None:
    mpi_plugins = slurm.run_client(["srun", "--mpi=list"])
    require("pmix" in mpi_plugins.stdout + mpi_plugins.stderr, "Slurm has no pmix MPI plugin")
    log_path = tmp_path / "log.json"
    output = tmp_path / "job.out"
    train = [sys.executable, os.path.join(REPO_ROOT, "main.py"), *TRAINING_ARGS,
             "--log_path", str(log_path)]
    result = submit_and_wait(slurm, {"cmd": shlex.join(train)}, output, timeout_s=150)
    report = job_report(result, output, slurm)
    assert result.returncode == 0, report
    job_output = output.read_text()
    assert "2 task(s) on 1 node(s)" in job_output and "srun exited with status 0" in job_output, report

    records = [r for r in read_dllogger_file(str(log_path)) if r["type"] == "LOG"]
    parameters = [r["data"] for r in records if r["step"] == "PARAMETER"]
    assert parameters and parameters[0]["world_size"] == 2, report
    final = [r["data"] for r in records if r["step"] == []]
    assert final and 0.0 <= final[-1]["auc"] <= 1.0, report


def start_requeued_job_now(slurm: SlurmCluster, job_id: str, output: Path, timeout_s: float = 150) -> None:
    """Slurm holds a requeued job back (its begin time lies minutes ahead); once the job is pending
    again, move its start to now so the test does not wait for that."""
    deadline = time.time() + timeout_s
    while time.time() < deadline and "requeueing job" not in output.read_text(errors="replace"):
        time.sleep(0.2)
    while time.time() < deadline:
        state = slurm.run_client(["squeue", "-h", "-j", job_id, "-o", "%T %r"]).stdout.split()
        if state == ["PENDING", "BeginTime"]:  # the first run is gone, the second waits for its begin time
            while time.time() < deadline and any(p.name() == "slurmstepd" for p in psutil.process_iter(["name"])):
                time.sleep(0.5)  # the first run's step daemons still clean up (its PMIx folder among others)
            slurm.run_client(["scontrol", "update", f"JobId={job_id}", "StartTime=now"])
            return
        if not state or state[0] in ("COMPLETED", "FAILED", "RUNNING"):
            return
        time.sleep(0.5)

def warn_and_requeue(slurm: SlurmCluster, placement: List[str], env: Dict[str, str], cwd, output) -> Tuple[int, str]:
    """Submit the multi-node script (`sbatch --wait`, `placement` such as `-N 3 -n 3`, requeue in `env`),
    send the batch script the time-limit warning (SIGUSR1) once training reports progress, start the
    requeued job at once, and wait for the end: sbatch's exit code and a report of the job's output."""
    job = subprocess.Popen(["sbatch", *placement, "--time=5", "--wait", "--export=ALL", f"--output={output}",
                            "--open-mode=append", "--parsable", SCRIPT],
                           env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        job_id = job.stdout.readline().strip().split(";")[0]
        deadline = time.time() + 150
        while time.time() < deadline and not (output.exists() and "step=" in output.read_text(errors="replace")):
            time.sleep(0.2)
        slurm.run_client(["scancel", "--batch", "--signal=USR1", job_id])
        start_requeued_job_now(slurm, job_id, output)
        _, errors = job.communicate(timeout=300)
    finally:
        if job.poll() is None:
            job.kill()
    return job.returncode, f"sbatch: {errors}\n" + job_report(None, output, slurm)
