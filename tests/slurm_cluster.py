"""A throwaway Slurm cluster for tests: its own munged, slurmctld and one slurmd per node.

Everything lives in one private directory (config, munge key and socket, per-node spools, state,
logs) and the daemons listen on free ports, so a system cluster on the default paths is never
touched. By default there is one node, this machine; given `SlurmNode`s, each node's slurmd starts
through that node's launcher (e.g. `scripts/test_cluster.sh run dlrm-node2`, so the daemon and every
job step it starts live in that host's namespaces) and is reached at the node's address, while the
one munged serves them all through its socket on the shared file system. Client commands reach the
cluster through `SLURM_CONF` (see `SlurmCluster.env`). `stop()` cancels the jobs, stops the daemons
it started and ends any job process left behind, found by its `SLURM_CONF` pointing into this cluster.
"""
from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

DAEMON_BINARIES = ("munged", "mungekey", "slurmctld", "slurmd")
CLIENT_BINARIES = ("sbatch", "sinfo", "squeue", "scancel", "scontrol", "srun")
SBIN_DIRS = ("/usr/sbin", "/sbin", "/usr/local/sbin")
LOG_FILES = ("slurmctld.log", "slurmctld.out", "munge/munged.log")  # and each node's slurmd-<node>.{log,out}


class SlurmStartError(RuntimeError):
    """The cluster could not be brought up; the message names the cause and holds the log tails."""


def find_binary(name: str) -> Optional[str]:
    """Path of a Slurm or munge binary, looking in the sbin directories that PATH may lack."""
    search_path = os.pathsep.join([os.environ.get("PATH", ""), *SBIN_DIRS])
    return shutil.which(name, path=search_path)


def missing_binaries() -> List[str]:
    """Names of the daemons and client commands needed by the cluster that are not installed."""
    return [name for name in (*DAEMON_BINARIES, *CLIENT_BINARIES) if find_binary(name) is None]


def free_port() -> int:
    """A TCP port that is free now (the kernel's pick for an ephemeral bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass(frozen=True)
class SlurmNode:
    """One node of the cluster: its name, the address slurmctld and srun reach its slurmd at, and the
    words that run a command inside it (empty: on this machine)."""

    name: str
    address: str = "127.0.0.1"
    launcher: Tuple[str, ...] = ()


class SlurmCluster:
    """Nodes with `cpus` CPUs each in a single default partition; slurmctld runs on this machine,
    reached at `controller_address`. Without `nodes`, one node named after this machine."""

    def __init__(self, cpus: int = 2, partition: str = "debug", nodes: Optional[Sequence[SlurmNode]] = None,
                 controller_address: str = "127.0.0.1") -> None:
        self.cpus = cpus
        self.partition = partition
        self.host_name = socket.gethostname().split(".")[0]  # slurmctld insists on running on its host
        self.controller_address = controller_address
        self.nodes = list(nodes or [SlurmNode(self.host_name)])
        self.user = pwd.getpwuid(os.getuid()).pw_name
        self.base_dir = ""
        self.conf_path = ""
        self._daemons: Dict[str, subprocess.Popen] = {}

    def __enter__(self) -> "SlurmCluster":
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def env(self) -> Dict[str, str]:
        """The caller's environment with the client commands pointed at this cluster."""
        return {**os.environ, "SLURM_CONF": self.conf_path}

    def start(self, timeout_s: float = 60.0) -> None:
        """Start munged, slurmctld and slurmd; return once the node is idle. Cleans up on failure."""
        missing = missing_binaries()
        if missing:
            raise SlurmStartError(f"Slurm/munge binaries not installed: {', '.join(missing)}")
        # munged insists that every directory above its socket is searchable by everyone.
        self.base_dir = tempfile.mkdtemp(prefix="dlrm-slurm-")
        os.chmod(self.base_dir, 0o755)
        self.conf_path = os.path.join(self.base_dir, "slurm.conf")
        try:
            self._start_munge()
            self._write_config()
            self._start_daemon("slurmctld", [find_binary("slurmctld"), "-D", "-f", self.conf_path])
            for node in self.nodes:
                self._start_daemon(f"slurmd-{node.name}", [*node.launcher, find_binary("slurmd"), "-D",
                                                           "-f", self.conf_path, "-N", node.name])
            self._wait_until_idle(timeout_s)
        except Exception as error:
            logs = self.log_tail()
            self.stop()
            raise SlurmStartError(f"Slurm did not start: {error}\n{logs}") from error
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Cancel jobs, stop the daemons, end leftover job processes, remove the directory."""
        if not self.base_dir:
            return
        if self._alive("slurmctld"):
            self._cancel_jobs()
        for name in (*(f"slurmd-{node.name}" for node in self.nodes), "slurmctld", "munged"):
            daemon = self._daemons.pop(name, None)
            if daemon is not None:
                terminate(daemon)
        for pid in self._leftover_pids():
            kill_pid(pid)
        shutil.rmtree(self.base_dir, ignore_errors=True)
        self.base_dir = ""

    def run_client(self, args: List[str], timeout_s: float = 30.0) -> subprocess.CompletedProcess:
        """Run a Slurm client command against this cluster; output captured as text."""
        return subprocess.run(args, env=self.env, capture_output=True, text=True, timeout=timeout_s)

    def log_tail(self, lines: int = 30) -> str:
        """The last `lines` lines of every daemon log, for failure messages."""
        parts = []
        for name in (*LOG_FILES, *(f"slurmd-{node.name}.{kind}" for node in self.nodes for kind in ("log", "out"))):
            path = os.path.join(self.base_dir, name)
            if os.path.exists(path):
                with open(path, errors="replace") as log:
                    tail = log.readlines()[-lines:]
                parts.append(f"--- {name}\n{''.join(tail)}")
        return "\n".join(parts)

    def _path(self, *parts: str) -> str:
        return os.path.join(self.base_dir, *parts)

    def _start_munge(self) -> None:
        munge_dir = self._path("munge")
        os.makedirs(munge_dir, mode=0o755)
        os.chmod(munge_dir, 0o755)
        key_path = os.path.join(munge_dir, "munge.key")
        subprocess.run([find_binary("mungekey"), "--create", f"--keyfile={key_path}"], check=True,
                       capture_output=True, timeout=30)
        os.chmod(key_path, 0o400)
        self._start_daemon("munged", [find_binary("munged"), "--foreground", f"--socket={self._munge_socket}",
                                      f"--key-file={key_path}",
                                      f"--pid-file={os.path.join(munge_dir, 'munged.pid')}",
                                      f"--log-file={os.path.join(munge_dir, 'munged.log')}",
                                      f"--seed-file={os.path.join(munge_dir, 'munged.seed')}"])
        deadline = time.monotonic() + 15
        while not os.path.exists(self._munge_socket):
            if not self._alive("munged") or time.monotonic() > deadline:
                raise SlurmStartError("munged did not create its socket")
            time.sleep(0.1)

    @property
    def _munge_socket(self) -> str:
        return self._path("munge", "munge.socket")

    def _write_config(self) -> None:
        os.makedirs(self._path("state"))
        for node in self.nodes:
            os.makedirs(self._path("spool", node.name))
            os.makedirs(self._path("tmp", node.name))
        settings = [
            ("ClusterName", "dlrmtest"),
            ("SlurmctldHost", f"{self.host_name}({self.controller_address})"),
            ("SlurmctldPort", free_port()),
            ("SlurmdPort", free_port()),
            ("AuthType", "auth/munge"),
            ("AuthInfo", f"socket={self._munge_socket}"),
            ("CredType", "cred/munge"),
            ("SlurmUser", self.user),
            ("SlurmdUser", self.user),
            ("StateSaveLocation", self._path("state")),
            # slurmd expands %n to its node name: the nodes share this file system, not their files
            ("SlurmdSpoolDir", self._path("spool", "%n")),
            ("SlurmctldPidFile", self._path("slurmctld.pid")),
            ("SlurmdPidFile", self._path("slurmd-%n.pid")),
            ("SlurmctldLogFile", self._path("slurmctld.log")),
            ("SlurmdLogFile", self._path("slurmd-%n.log")),
            ("TmpFS", self._path("tmp", "%n")),  # where PMIx puts its per-step client folders
            ("SlurmdParameters", "config_overrides"),
            ("MailProg", "/bin/true"),
            ("ProctrackType", "proctrack/linuxproc"),
            ("TaskPlugin", "task/none"),
            ("JobAcctGatherType", "jobacct_gather/none"),
            ("SelectType", "select/cons_tres"),
            ("SelectTypeParameters", "CR_CPU"),
            ("MpiDefault", "none"),
            ("ReturnToService", 2),
            # The hosts' daemons share the test machine's cores with the suite's other worker: under
            # that load a slurmd answered a job launch after more than the default 10 s, and the
            # requeued run's MPI start-up on the nodes failed (a CI rehearsal of 2026-11-28).
            ("MessageTimeout", 60),
            *(("NodeName", f"{node.name} NodeAddr={node.address} CPUs={self.cpus} State=UNKNOWN")
              for node in self.nodes),
            ("PartitionName", f"{self.partition} Nodes={','.join(node.name for node in self.nodes)} Default=YES "
                              "MaxTime=INFINITE State=UP"),
        ]
        with open(self.conf_path, "w") as conf:
            conf.writelines(f"{key}={value}\n" for key, value in settings)
        # slurmd loads a cgroup plugin even where, as here (linuxproc, task/none), nothing uses it; its
        # autodetection fails where /sys/fs/cgroup is not mounted (a test cluster's host has a /sys of its
        # own), while the named plugin loads without mounts.
        with open(self._path("cgroup.conf"), "w") as conf:
            conf.write("CgroupPlugin=cgroup/v1\n")

    def _start_daemon(self, name: str, command: List[str]) -> None:
        with open(self._path(f"{name}.out"), "w") as output:
            self._daemons[name] = subprocess.Popen(command, env=self.env,
                                                   stdout=output, stderr=subprocess.STDOUT,
                                                   stdin=subprocess.DEVNULL, start_new_session=True)

    def _alive(self, name: str) -> bool:
        daemon = self._daemons.get(name)
        return daemon is not None and daemon.poll() is None

    def _wait_until_idle(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        names = [node.name for node in self.nodes]
        states: Dict[str, str] = {}
        while time.monotonic() < deadline:
            for name in ("slurmctld", *(f"slurmd-{node}" for node in names)):
                if not self._alive(name):
                    raise SlurmStartError(f"{name} exited with status {self._daemons[name].poll()}")
            result = self.run_client(["sinfo", "--noheader", "--Node", "--format=%N %T", f"--nodes={','.join(names)}"])
            states = dict(line.lower().split(None, 1) for line in result.stdout.splitlines() if line.strip())
            if sorted(states) == sorted(names) and set(states.values()) == {"idle"}:
                return
            stuck = [node for node, state in states.items() if state.startswith(("down", "drain"))]
            if stuck:
                self.run_client(["scontrol", "update", f"nodename={','.join(stuck)}", "state=resume"])
            time.sleep(0.5)
        raise SlurmStartError(f"nodes not idle after {timeout_s:.0f} s (states: {states or 'no answer'})")

    def _cancel_jobs(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            queue = self.run_client(["squeue", "--noheader", "--format=%i"])
            job_ids = queue.stdout.split()
            if queue.returncode != 0 or not job_ids:
                return
            self.run_client(["scancel", *job_ids])
            time.sleep(0.5)

    def _leftover_pids(self) -> List[int]:
        """Processes (slurmstepd, job tasks) whose environment points at this cluster's config."""
        marker = f"SLURM_CONF={self.conf_path}".encode()
        pids = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as environ:
                    if marker in environ.read().split(b"\0"):
                        pids.append(int(entry))
            except OSError:
                continue
        return pids


def terminate(process: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM a process this module started, SIGKILL it after `grace_s`, and reap it."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=grace_s)


def kill_pid(pid: int, grace_s: float = 5.0) -> None:
    """SIGTERM one leftover job process by id, then SIGKILL if it is still there after `grace_s`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if not os.path.exists(f"/proc/{pid}") or _is_zombie(pid):
                return
            time.sleep(0.1)


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
