"""A cluster of 3 hosts on this machine (scripts/test_cluster.sh, tests/cluster.py): the script's verbs and
their bad input, then DLRM (Gloo and MPI) and Wide & Deep trained by horovodrun across the hosts. The
cluster is the session's (`cluster` fixture): up once, whole and unlimited for each test."""
import concurrent.futures
import contextlib
import glob
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from types import SimpleNamespace

import numpy as np
import psutil
import pytest

import test_preproc

from cluster import INTERFACE, RANK_HOST, SCRIPT, SUBNET, rank_hosts
from preproc import synthetic_criteo
from multiproc import (REPO_ROOT, assert_ok, assert_one_error, horovod_command, launch_env, require, run_horovod,
                       snapshot)
from recsys.training import checkpoint
from slurm_cluster import SlurmCluster, SlurmNode, SlurmStartError, missing_binaries
from test_main import SMALL, SMALL_MODEL, checkpoint_arrays
from test_slurm import TRAINING_ARGS as SLURM_TRAINING_ARGS
from test_slurm import warn_and_requeue
from test_wd_train import SMALL as WD_SMALL
from test_wd_train import WD_DIR, data_flags, final, write_dataset

STATE_DIR = "/run/dlrm-cluster"
SSH_DROPIN = "/etc/ssh/ssh_config.d/dlrm-cluster.conf"


def command(*args: str, check: bool = True) -> str:
    result = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert not check or result.returncode == 0, result.stderr
    return result.stdout


def machine_state() -> dict:
    """What the cluster is on this machine: its namespaces, links, rates, names, ssh settings and state files."""
    with open("/etc/hosts") as hosts:
        names = hosts.read()
    dropin = open(SSH_DROPIN).read() if os.path.exists(SSH_DROPIN) else None
    return {"netns": command("ip", "netns", "list"), "links": command("ip", "-br", "link"),
            "qdiscs": command("tc", "qdisc", "show"), "hosts": names, "ssh": dropin,
            "state": snapshot(STATE_DIR) if os.path.isdir(STATE_DIR) else None,
            "status": subprocess.run([SCRIPT, "status"], capture_output=True, text=True).stdout}


def ssh(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ssh", "-o", "ConnectTimeout=1", *args], capture_output=True, text=True, timeout=60)


# ---- the script ----

def test_up_again_changes_nothing_and_each_host_is_its_own_reachable_by_name(cluster):
    before = machine_state()
    again = cluster.script("up", "3")
    assert again.returncode == 0 and "already up" in again.stderr, again.stderr
    assert machine_state() == before
    assert [cluster.run(node, "hostname").stdout.strip() for node in cluster.hosts] == cluster.hosts
    assert cluster.run("dlrm-node2", "sh", "-c", "exit 7").returncode == 7
    # ssh by name: from the machine, and from one host to another (through the cluster's switch)
    assert ssh("dlrm-node2", "hostname").stdout.strip() == "dlrm-node2"
    hop = cluster.run("dlrm-node1", "ssh", "dlrm-node3", "hostname")
    assert hop.stdout.strip() == "dlrm-node3", hop.stderr
    # each host has its own interface and address, and no route off the cluster's subnet
    addresses = cluster.run("dlrm-node3", "ip", "-4", "-o", "addr", "show", INTERFACE).stdout
    assert f" {cluster.address('dlrm-node3')}/24 " in addresses, addresses
    assert "default" not in cluster.run("dlrm-node3", "ip", "route").stdout
    assert cluster.address("dlrm-node3").startswith(SUBNET.rsplit(".", 1)[0] + ".")
    assert socket.gethostbyname("dlrm-node3") == cluster.address("dlrm-node3")


def test_cut_makes_a_host_unreachable_and_heal_brings_it_back(cluster):
    cluster.cut("dlrm-node3")
    assert cluster.status()["dlrm-node3"]["link"] == "cut"
    assert ssh("dlrm-node3", "true").returncode != 0
    assert cluster.run("dlrm-node1", "ssh", "-o", "ConnectTimeout=1", "dlrm-node3", "true").returncode != 0
    assert cluster.run("dlrm-node1", "ssh", "dlrm-node2", "true").returncode == 0  # the others still talk
    cluster.heal("dlrm-node3")
    assert ssh("dlrm-node3", "hostname").stdout.strip() == "dlrm-node3"


def test_slow_limits_a_host_both_ways_and_zero_lifts_it(cluster):
    nbytes = 2_500_000  # 1 s at 20 Mbit/s
    cluster.slow("dlrm-node2", 20)
    assert cluster.status()["dlrm-node2"]["rate"] == "20Mbit"
    into, out_of = (cluster.throughput_mbit("dlrm-node1", "dlrm-node2", nbytes),
                    cluster.throughput_mbit("dlrm-node2", "dlrm-node3", nbytes))
    assert 14 < into < 22 and 14 < out_of < 22, (into, out_of)
    assert cluster.throughput_mbit("dlrm-node1", "dlrm-node3", nbytes) > 100  # the other links are not limited
    cluster.slow("dlrm-node2", 0)
    assert cluster.status()["dlrm-node2"]["rate"] == "unlimited"
    assert cluster.throughput_mbit("dlrm-node1", "dlrm-node2", nbytes) > 100


@pytest.mark.parametrize("args, fragment", [
    (["reboot"], "unknown verb 'reboot'"),
    (["cut", "dlrm-node9"], "no host 'dlrm-node9'"),
    (["run", "node1", "true"], "no host 'node1'"),
    (["slow", "dlrm-node1", "fast"], "got 'fast'"),
    (["slow", "dlrm-node1", "-5"], "got '-5'"),
    (["up", "0"], "got '0'"),
    (["up", "4"], f"a cluster of 3 hosts on {SUBNET} is up"),
])
def test_bad_input_is_one_line_and_changes_nothing(cluster, args, fragment):
    before = machine_state()
    assert_one_error(cluster.script(*args), fragment)
    assert machine_state() == before


def test_up_refuses_an_address_range_another_interface_uses(cluster):
    command("ip", "link", "add", "dlrm-taken", "type", "bridge")
    try:
        command("ip", "addr", "add", "10.213.58.7/24", "dev", "dlrm-taken")
        before = machine_state()
        refused = cluster.script("up", "3", env={"DLRM_CLUSTER_SUBNET": "10.213.58.0/24"})
        assert_one_error(refused, "10.213.58.0/24 is in use by interface dlrm-taken")
        assert machine_state() == before
    finally:
        command("ip", "link", "delete", "dlrm-taken")


def test_up_rebuilds_a_broken_cluster_and_down_leaves_nothing(cluster):
    with open(os.path.join(STATE_DIR, "sshd-dlrm-node2.pid")) as pid_file:
        os.kill(int(pid_file.read()), 9)  # a crashed host
    assert cluster.script("status").returncode == 1
    rebuilt = cluster.script("up", "3")
    assert rebuilt.returncode == 0 and "left behind" in rebuilt.stderr, rebuilt.stderr
    assert ssh("dlrm-node2", "hostname").stdout.strip() == "dlrm-node2"
    job = cluster.popen("dlrm-node1", "sleep", "600")  # a process left running on a host
    cluster.down()
    assert job.wait(timeout=10) != 0
    assert "dlrm-node" not in command("ip", "netns", "list")
    assert not {"dlrm0", "dlrm-v1", "dlrm-v2", "dlrm-v3"} & {line.split()[0].split("@")[0]
                                                            for line in command("ip", "-br", "link").splitlines()}
    with open("/etc/hosts") as hosts:
        assert not {"dlrm-cluster", "dlrm-node", "dlrm-head"} & set(re.findall(r"dlrm-[a-z]+", hosts.read()))
    assert not os.path.exists(SSH_DROPIN) and not os.path.exists(STATE_DIR)
    assert STATE_DIR not in command("ps", "-eo", "args")
    assert "no cluster was up" in cluster.script("down").stderr
    assert cluster.script("status").returncode == 1


# ---- jobs across the hosts ----

DLRM = [*SMALL, "--batch_size", "96", "--valid_batch_size", "96", "--deterministic", "--cpu", "--max_steps", "6",
        "--print_sharding_plan"]


@pytest.fixture(scope="module")
def one_host_checkpoint(tmp_path_factory):
    """The 3-process DLRM run on this machine alone: its checkpoint's arrays."""
    folder = tmp_path_factory.mktemp("one_host")
    assert_ok(run_horovod(["main.py", *DLRM, "--save_checkpoint_path", str(folder / "ckpt"),
                           "--log_path", str(folder / "log.json")], np=3))
    return checkpoint_arrays(folder / "ckpt")


@pytest.mark.parametrize("transport", ["gloo", "mpi"])
def test_dlrm_across_three_hosts_equals_three_processes_on_one(cluster, tmp_path, one_host_checkpoint, transport):
    job = cluster.run_horovod(["main.py", *DLRM, "--save_checkpoint_path", str(tmp_path / "ckpt"),
                               "--log_path", str(tmp_path / "log.json")], transport=transport)
    assert_ok(job)
    assert sorted(rank_hosts(job.stdout)) == cluster.hosts, job.stdout[-3000:]
    for rank in range(3):  # the tables are spread: every host holds some
        assert re.search(rf"rank {rank}: device .*: table \d", job.stdout), job.stdout[-3000:]
    across = checkpoint_arrays(tmp_path / "ckpt")
    assert across.keys() == one_host_checkpoint.keys()
    for name in across:
        np.testing.assert_allclose(across[name], one_host_checkpoint[name], rtol=1e-5, atol=1e-7, err_msg=name)


def test_wide_and_deep_trains_across_three_hosts(cluster, tmp_path):
    data = tmp_path / "data"
    write_dataset(str(data), 3 * 4096, 3 * 4096, files=3)
    job = cluster.run_horovod(["main.py", *data_flags(str(data)), *WD_SMALL, "--global_batch_size", "12288",
                               "--eval_batch_size", "12288", "--num_epochs", "1", "--model_dir", str(tmp_path / "ckpt"),
                               "--results_dir", str(tmp_path / "results")], cwd=WD_DIR)
    assert_ok(job)
    assert sorted(rank_hosts(job.stdout)) == cluster.hosts, job.stdout[-3000:]
    assert 0 < final(str(tmp_path / "results"))["exact_map_val"] <= 1


# ---- faults across the hosts: a cut link, a killed rank, a slow link ----

# Long enough to stop mid-run; short enough that resuming it takes seconds. TF op determinism stays
# on (conftest) so the resumed run can equal the reference.
FAULT_RUN = [*SMALL_MODEL, "--dataset_type", "synthetic", "--synthetic_dataset_cardinalities", "50,20,7,30",
             "--synthetic_dataset_num_numerical_features", "5", "--synthetic_dataset_train_batches", "100000",
             "--synthetic_dataset_valid_batches", "3", "--batch_size", "96", "--valid_batch_size", "96",
             "--learning_rate", "0.1", "--warmup_steps", "2", "--seed", "7", "--deterministic", "--cpu",
             "--print_freq", "10"]
FAULT_STEPS = ["--max_steps", "100"]
FAULT_ENV = {"DLRM_PEER_TIMEOUT": "8"}


@pytest.fixture(scope="module")
def uninterrupted_checkpoint(tmp_path_factory):
    """The fault tests' run never interrupted (3 processes on this machine, which equal 3 hosts): its
    checkpoint's arrays."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    assert_ok(run_horovod(["main.py", *FAULT_RUN, *FAULT_STEPS, "--save_checkpoint_path", str(folder / "ckpt")],
                          np=3))
    return checkpoint_arrays(folder / "ckpt")


def start_on_hosts(cluster, args, folder, transport="gloo", env=None):
    """A DLRM run under horovodrun across the hosts in the background (its own session), its output in
    `folder`/job.out; each rank also copies its stderr to `folder`/<host>.stderr (the shared file
    system), so what a rank on a cut-off host said can be read though its ssh session cannot deliver it."""
    copy_stderr = ["bash", "-c", f'echo "{RANK_HOST}$(hostname)"; exec "$@" 2> >(tee "{folder}/$(hostname).stderr" >&2)',
                   "bash"]
    command = horovod_command(["main.py", *args], np=cluster.nodes, transport=transport,
                              hosts=cluster.horovod_hosts(), interface=INTERFACE, program=copy_stderr)
    with open(folder / "job.out", "w") as out:
        return subprocess.Popen(command, cwd=REPO_ROOT, env=launch_env({**FAULT_ENV, **(env or {})}), stdout=out,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)


def ranks_of(folder):
    """The live rank processes (on any host: the hosts share this machine's process table) whose
    command line names `folder`."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        command = process.info["cmdline"] or []
        if "main.py" in command and any(str(folder) in word for word in command) \
                and process.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(process)
    return found


def wait_for_checkpoint(job, folder, timeout=240):
    """Wait until the job's first complete checkpoint exists in `folder`/ckpt (training is under way)."""
    deadline = time.time() + timeout
    while not checkpoint.list_checkpoints(str(folder / "ckpt")):
        assert time.time() < deadline and job.poll() is None, \
            "no checkpoint in time:\n" + (folder / "job.out").read_text()[-4000:]
        time.sleep(0.02)


def end_after_fault(job, folder, fault_at):
    """Wait for the job (the launcher) and every rank to end: their seconds after the fault, the ranks
    left after 2 minutes (killed then), the job's output."""
    try:
        job.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
    launcher_s = time.time() - fault_at
    while ranks_of(folder) and time.time() - fault_at < 120:
        time.sleep(0.2)
    ranks_s = time.time() - fault_at
    left = [(p.pid, p.info["cmdline"][-3:]) for p in ranks_of(folder)]
    for process in ranks_of(folder):
        process.kill()
    return launcher_s, ranks_s, left, (folder / "job.out").read_text()


def lost_lines(output):
    return [line for line in output.splitlines() if "error: lost" in line]


def assert_whole_checkpoints_resume_to_the_uninterrupted_weights(cluster, folder, reference, transport):
    saved = checkpoint.list_checkpoints(str(folder))
    assert saved and sorted(glob.glob(f"{folder}/step_*")) == saved, "a step folder without its manifest"
    resumed = cluster.run_horovod(["main.py", *FAULT_RUN, *FAULT_STEPS, "--auto_resume",
                                   "--save_checkpoint_path", str(folder)], transport=transport, env=FAULT_ENV)
    assert_ok(resumed)
    assert f"step_{checkpoint.read_manifest(saved[-1]).step:09d}" in resumed.stdout, resumed.stdout[-3000:]
    after = checkpoint_arrays(folder)
    assert after.keys() == reference.keys()
    for name in after:
        np.testing.assert_allclose(after[name], reference[name], rtol=1e-5, atol=1e-7, err_msg=name)


@pytest.mark.parametrize("transport", ["gloo", "mpi"])
def test_a_host_cut_off_mid_run_ends_every_rank_and_auto_resume_finishes_after_heal(
        cluster, tmp_path, uninterrupted_checkpoint, transport):
    """dlrm-node3's link goes down mid-run (a pulled cable: no reset, its connections silent): the
    ranks on dlrm-node1 and dlrm-node2 each end with one line naming dlrm-node3, the rank on
    dlrm-node3, which lost everyone, ends with one naming both other hosts, the launcher ends too
    (ssh's keepalive gives up on dlrm-node3), all within the minute; the folder holds only whole
    checkpoints, and after heal --auto_resume ends with the weights of a run never cut."""
    folder = tmp_path / "ckpt"
    job = start_on_hosts(cluster, [*FAULT_RUN, *FAULT_STEPS, "--checkpoint_every_n_steps", "10",
                                   "--save_checkpoint_path", str(folder)], tmp_path, transport)
    wait_for_checkpoint(job, tmp_path)
    cluster.cut("dlrm-node3")
    launcher_s, ranks_s, left, output = end_after_fault(job, tmp_path, time.time())
    print(f"cut ({transport}): launcher ended after {launcher_s:.1f} s, every rank after {ranks_s:.1f} s")
    assert job.returncode != 0 and not left and ranks_s < 60 and launcher_s < 60, \
        (launcher_s, ranks_s, left, output[-4000:])
    lost = lost_lines(output)
    assert len(lost) == 2 and all("on host dlrm-node3 (" in line and line.endswith("; stopping")
                                  for line in lost), output[-4000:]
    assert re.search(r"error: lost rank 2 on host dlrm-node3 \(no answer from 10\.\S+ for [0-9]+ s\)", output), lost
    assert "<stderr>:Traceback" not in output, output[-4000:]
    cut_off = lost_lines((tmp_path / "dlrm-node3.stderr").read_text())
    assert len(cut_off) == 1 and re.fullmatch(
        r"error: lost rank 0 on host dlrm-node1 \(no answer from \S+ for [0-9]+ s\), "
        r"rank 1 on host dlrm-node2 \(no answer from \S+ for [0-9]+ s\); stopping", cut_off[0]), cut_off
    # each line gives the silence it saw (a watch delayed by load checks late): at least the 8 s
    # timeout for the first peer lost, half of it for the others named with it
    assert all(int(s) >= 8 for s in re.findall(r"dlrm-node3 \(no answer from \S+ for (\d+) s", output)), lost
    assert sorted(int(s) for s in re.findall(r"for (\d+) s", cut_off[0]))[-1] >= 8 and \
        all(int(s) >= 4 for s in re.findall(r"for (\d+) s", cut_off[0])), cut_off
    cluster.heal("dlrm-node3")
    assert_whole_checkpoints_resume_to_the_uninterrupted_weights(cluster, folder, uninterrupted_checkpoint, transport)


def wait_for_progress(job, folder, timeout=240):
    """Wait until the job has printed a progress line (training is under way)."""
    deadline = time.time() + timeout
    while "step=" not in (folder / "job.out").read_text():
        assert time.time() < deadline and job.poll() is None, \
            "no progress line in time:\n" + (folder / "job.out").read_text()[-4000:]
        time.sleep(0.05)


def test_a_rank_killed_on_a_remote_host_ends_every_rank_within_a_minute(cluster, tmp_path):
    """SIGKILL to the rank on dlrm-node3: its connections close, so the ranks on dlrm-node1 and
    dlrm-node2 end at once, each with one line naming dlrm-node3, and the launcher ends."""
    job = start_on_hosts(cluster, [*FAULT_RUN, "--save_checkpoint_path", str(tmp_path / "ckpt")], tmp_path)
    wait_for_progress(job, tmp_path)
    victim = [p for p in ranks_of(tmp_path) if p.environ().get("HOROVOD_HOSTNAME") == "dlrm-node3"]
    assert len(victim) == 1, [p.info["cmdline"] for p in ranks_of(tmp_path)]
    victim[0].kill()
    launcher_s, ranks_s, left, output = end_after_fault(job, tmp_path, time.time())
    print(f"kill: launcher ended after {launcher_s:.1f} s, every rank after {ranks_s:.1f} s")
    assert job.returncode != 0 and not left and ranks_s < 60 and launcher_s < 60, \
        (launcher_s, ranks_s, left, output[-4000:])
    # each survivor's own stderr: horovodrun stops forwarding a rank's output once it ends the others
    for host in ("dlrm-node1", "dlrm-node2"):
        lost = lost_lines((tmp_path / f"{host}.stderr").read_text())
        assert len(lost) == 1 and lost[0].startswith("error: lost rank 2 on host dlrm-node3 (its connection closed: "
                                                     "the process ended)") and lost[0].endswith("; stopping"), \
            (host, lost, output[-4000:])
    assert lost_lines(output) and "<stderr>:Traceback" not in output, output[-4000:]


def comm_waits(output):
    """(comm_wait %, step_time ms) of a run's progress lines."""
    return [(float(share), float(ms)) for ms, share in
            re.findall(r"step_time=([0-9.]+) ms, .*comm_wait=([0-9.]+)%", output)]


def test_a_slow_link_shows_in_comm_wait(cluster, tmp_path):
    """With dlrm-node2's link at 1 Mbit/s the steps wait for their exchanges far longer than on an
    unlimited link: the progress lines' comm_wait share times the step time (the milliseconds a step
    waits) is several times longer; the run completes. The share alone is no measure here: on a loaded
    machine, where the hosts' ranks also wait for each other's CPU, it saturates near 90% on either link
    (CI saw 92% slow against 94% unlimited at 2 Mbit/s). (TF op determinism off: comm_wait needs its
    timestamps.)"""
    run = [word for word in FAULT_RUN if word != "--deterministic"] + ["--max_steps", "60"]
    env = {"TF_DETERMINISTIC_OPS": "0"}
    shares = {}
    for mbit in (1, 0):
        cluster.slow("dlrm-node2", mbit)
        started = time.time()
        job = cluster.run_horovod(["main.py", *run, "--log_path", str(tmp_path / f"{mbit}.json")], env=env)
        assert_ok(job)
        shares[mbit] = comm_waits(job.stdout)
        print(f"slow: {mbit or 'unlimited'} Mbit/s, (comm_wait %, step ms) {shares[mbit]}, {time.time() - started:.0f} s")
        assert len(shares[mbit]) >= 4, job.stdout[-3000:]
    slow_wait, fast_wait = [np.median([share * ms / 100 for share, ms in shares[mbit]]) for mbit in (1, 0)]
    # 2 Mbit/s gave 1.9x on CI's loaded machine (2.8x-3x+ elsewhere); 1 Mbit/s doubles the link's part
    assert slow_wait > 2 * fast_wait, shares


# ---- Slurm and Spark across the hosts (one slurmd per host; a Spark standalone cluster) ----

SLURM_RANKS = ["--batch_size", "96", "--valid_batch_size", "96", "--print_freq", "5", "--deterministic",
               "--seed", "3", "--learning_rate", "0.1", "--warmup_steps", "2"]


@pytest.fixture
def slurm_on_hosts(cluster):
    """A private Slurm cluster whose 3 nodes are the cluster's hosts: slurmctld on this machine (dlrm-head),
    each host's slurmd started inside it and reached at its address; torn down after the test."""
    missing = missing_binaries()
    require(not missing, f"Slurm/munge not installed ({', '.join(missing)}); Debian: slurmctld slurmd slurm-client munge")
    nodes = [SlurmNode(host, cluster.address(host), tuple(cluster.inside(host))) for host in cluster.hosts]
    slurm = SlurmCluster(cpus=1, nodes=nodes, controller_address=socket.gethostbyname("dlrm-head"))
    try:
        slurm.start()
    except SlurmStartError as error:
        require(False, f"a Slurm cluster on the hosts could not start: {error}")
    plugins = slurm.run_client(["srun", "--mpi=list"])
    try:
        require("pmix" in plugins.stdout + plugins.stderr, "Slurm has no pmix MPI plugin")
        yield slurm
    finally:
        slurm.stop()


def test_sbatch_on_three_hosts_trains_is_warned_requeued_and_resumes_by_itself(cluster, slurm_on_hosts, tmp_path):
    """`sbatch -N 3 slurm_multinode.sh`: one rank per host (srun --mpi=pmix across the hosts' slurmds). The
    time-limit warning (SIGUSR1 to the batch script) makes every rank save and stop, requeue=1 requeues the
    job, and its second run, again on the 3 hosts, resumes from that checkpoint and finishes training."""
    slurm, folder, output = slurm_on_hosts, tmp_path / "ckpt", tmp_path / "job.out"
    train = [sys.executable, os.path.join(REPO_ROOT, "main.py"), *SLURM_TRAINING_ARGS, *SLURM_RANKS,
             "--synthetic_dataset_train_batches", "100", "--auto_resume", "--save_checkpoint_path", str(folder)]
    cmd = f'echo "{RANK_HOST}$(hostname)"; exec {shlex.join(train)}'
    env = {**launch_env({"cmd": cmd, "requeue": "1"}), "SLURM_CONF": slurm.conf_path}
    returncode, report = warn_and_requeue(slurm, ["-N", "3", "-n", "3"], env, tmp_path, output)
    assert returncode == 0, report
    text = output.read_text(errors="replace")
    runs = text.split("requeueing job")
    assert len(runs) == 2 and "received SIGUSR1, passing it to the tasks" in runs[0], report
    for run in runs:  # each run: 3 tasks on 3 nodes, one rank on each host (the tasks' own lines)
        hosts = re.findall(rf"^{RANK_HOST}(\S+)$", run, re.MULTILINE)
        assert "3 task(s) on 3 node(s) (dlrm-node[1-3])" in run and sorted(hosts) == cluster.hosts, report
    stopped = [line for line in text.splitlines() if "stopped by SIGUSR1 after step" in line]
    assert len(stopped) == 1 and 0 < int(stopped[0].split(" after step ")[1].split()[0]) < 100, report
    assert "--auto_resume: resuming from the newest checkpoint" in runs[1] and "Traceback" not in text, report
    assert checkpoint.resolve(str(folder)).endswith("step_000000100"), report


SPARK_MASTER_HOST, SPARK_MASTER_PORT, SPARK_WORKER_PORT = "dlrm-node1", 7077, 7078  # each host has its own ports
SPARK_DAYS, SPARK_LINES_PER_DAY = 4, 1500


@contextlib.contextmanager
def spark_standalone(cluster, folder):
    """A Spark standalone cluster on the hosts: the master on dlrm-node1, a 1-core worker on each other host,
    every daemon inside its host and bound to its address (logs in folder/spark.log); yields the master URL."""
    require(test_preproc.HAVE_SPARK, "needs java and pyspark")
    daemons = []
    with open(folder / "spark.log", "w") as log:
        try:
            for node in cluster.hosts:
                role, port = ("Master", SPARK_MASTER_PORT) if node == SPARK_MASTER_HOST else ("Worker", SPARK_WORKER_PORT)
                env = test_preproc._environment(SPARK_LOCAL_IP=cluster.address(node), SPARK_LOG_DIR=str(folder / "logs"),
                                                SPARK_WORKER_DIR=str(folder / "work" / node),
                                                SPARK_LOCAL_DIRS=str(folder / "scratch" / node))
                worker_args = [] if role == "Master" else ["--cores", "1", "--memory", "1g",
                                                           f"spark://{SPARK_MASTER_HOST}:{SPARK_MASTER_PORT}"]
                daemons.append(test_preproc.spark_daemon(role, cluster.address(node), port, env, log, *worker_args,
                                                         inside=cluster.inside(node)))
            yield f"spark://{SPARK_MASTER_HOST}:{SPARK_MASTER_PORT}"
        finally:
            for daemon in reversed(daemons):
                test_preproc._stop_daemon(daemon)


def executor_log(folder, node: str) -> str:
    """What the executors on `node`'s worker wrote to stderr so far."""
    logs = sorted((folder / "work" / node).glob("app-*/*/stderr"))
    return "".join(log.read_text(errors="replace") for log in logs)


def prepare_on_the_cluster(cluster, folder, raw, master, **env: str):
    """prepare_dataset.sh CPU 2 of the days in `raw` with the Spark engine, its driver on the master's host, two
    1-core executors."""
    return test_preproc.run_prepare(str(folder), "CPU", "2", raw=str(raw),
                                    inside=cluster.inside(SPARK_MASTER_HOST), SPARK_MASTER=master,
                                    SPARK_LOCAL_IP=cluster.address(SPARK_MASTER_HOST), NUM_DAYS=str(SPARK_DAYS),
                                    TOTAL_CORES="2", NUM_EXECUTORS="2", EXECUTOR_CORES="1", EXECUTOR_MEMORY="768m",
                                    SHUFFLE_PARTITIONS="4", TEST_SHUFFLE_PARTITIONS="2",
                                    DRIVER_MEMORY="1g", **env)


@pytest.fixture(scope="module")
def criteo_days(tmp_path_factory):
    """Small synthetic Criteo days (in `.raw`) and the digest of the embedded engine's dataset of them (`.digest`)."""
    test_preproc.engine_available("duckdb")
    folder = tmp_path_factory.mktemp("criteo_days")
    synthetic_criteo.write_days(str(folder / "raw"), SPARK_DAYS, SPARK_LINES_PER_DAY, seed=21,
                                bad_lines={2: {5: "bad_label"}})
    local = test_preproc.run_prepare(str(folder / "local"), "--engine", "duckdb", "CPU", "2", raw=str(folder / "raw"),
                                     NUM_DAYS=str(SPARK_DAYS))
    assert local.returncode == 0, local.stderr[-3000:]
    return SimpleNamespace(raw=folder / "raw", digest=test_preproc.dataset_digest(str(folder / "local" / "final")))


def test_a_spark_workers_host_cut_mid_run_and_the_run_ends_on_the_other_with_the_same_bytes(cluster, tmp_path,
                                                                                          criteo_days):
    """SPARK_MASTER=spark://dlrm-node1:7077 with workers on dlrm-node2 and dlrm-node3, both running tasks;
    dlrm-node3's link is cut while its executor works (it holds results and shuffle output by then): after
    SPARK_NETWORK_TIMEOUT the driver counts that executor lost, dlrm-node2's executor recomputes what it held
    and runs the rest, and the run ends complete, its dataset byte for byte the local run's, with no partial
    folder left behind. (A run across the hosts without the cut is this one's first half: one test.)"""
    run = tmp_path / "spark"
    run.mkdir()
    with spark_standalone(cluster, run) as master, concurrent.futures.ThreadPoolExecutor(1) as pool:
        job = pool.submit(prepare_on_the_cluster, cluster, run, criteo_days.raw, master, SPARK_NETWORK_TIMEOUT="20")
        deadline = time.monotonic() + 300
        while executor_log(run, "dlrm-node3").count("Finished task") < 4 and not job.done():
            assert time.monotonic() < deadline, "dlrm-node3's executor finished no tasks in 300 s"
            time.sleep(0.2)
        assert not job.done(), f"the run ended before the cut: {job.result()}"
        cluster.cut("dlrm-node3")
        cut = time.monotonic()
        result = job.result(timeout=600)
        after_cut = time.monotonic() - cut
    report = f"exit {result.returncode} {after_cut:.0f} s after the cut\n{result.stdout[-3000:]}{result.stderr[-5000:]}"
    assert result.returncode == 0 and after_cut < 180, report
    assert "Lost executor" in result.stderr and "10.213.57.13" in result.stderr, report
    assert "Finished task" in executor_log(run, "dlrm-node2"), report  # both workers' hosts ran tasks
    assert test_preproc.dataset_digest(str(run / "final")) == criteo_days.digest, report
    assert not [path.name for path in run.iterdir() if path.name.endswith((".partial", ".halves"))], report
