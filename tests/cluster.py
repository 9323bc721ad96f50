"""A cluster of hosts on this machine for tests: scripts/test_cluster.sh driven from Python.

Each host (dlrm-node1..N) is a network and UTS namespace with its own address, hostname and sshd,
reachable by name over ssh from the machine and from every host, sharing the machine's file system
(docs/cluster.md). `Cluster` runs the script's verbs and launches Horovod jobs across the hosts.
The `cluster` fixture (tests/conftest.py) brings one cluster up once per test session and hands it
to each test whole, every link up and unlimited; the session's end takes it down.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from typing import Dict, List, Optional

from multiproc import REPO_ROOT, require, run_horovod

SCRIPT = os.path.join(REPO_ROOT, "scripts", "test_cluster.sh")
SUBNET = os.environ.get("DLRM_CLUSTER_SUBNET", "10.213.57.0/24")  # the cluster's /24 (the script's default)
NODE_PREFIX = "dlrm-node"
INTERFACE = "dlrm0"  # every host's interface on the cluster network, and the machine's bridge
RANK_HOST = "dlrm-rank-host="
# Put before `python` in a job's command: each process says which host it runs on, then becomes python.
RANK_HOST_PROBE = ["sh", "-c", f'echo "{RANK_HOST}$(hostname)" && exec "$@"', "sh"]


class ClusterError(RuntimeError):
    """A verb of scripts/test_cluster.sh failed; the message holds its output."""


def require_cluster() -> None:
    """Skip (fail under CI) unless this process can make the cluster: root, sshd and ssh, iproute2."""
    require(os.geteuid() == 0, "the test cluster needs root (network namespaces, /etc/hosts)")
    require(os.path.exists("/usr/sbin/sshd") and shutil.which("ssh") is not None,
            "sshd or ssh not installed (Debian openssh-server, openssh-client; `make setup`)")
    missing = [tool for tool in ("ip", "tc", "nsenter", "unshare", "flock") if shutil.which(tool) is None]
    require(not missing, f"not installed: {', '.join(missing)} (Debian iproute2, util-linux)")
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    require(probe.returncode == 0, f"`ip netns` does not work here: {probe.stderr.strip()}")


def rank_hosts(output: str) -> List[str]:
    """The host of every process of a job started with RANK_HOST_PROBE, in the order they said it."""
    return re.findall(rf"{RANK_HOST}(\S+)", output)


class Cluster:
    """Hosts dlrm-node1..dlrm-node<nodes> made by scripts/test_cluster.sh."""

    def __init__(self, nodes: int = 3) -> None:
        self.nodes = nodes

    @property
    def hosts(self) -> List[str]:
        return [f"{NODE_PREFIX}{k}" for k in range(1, self.nodes + 1)]

    def script(self, *args: str, env: Optional[Dict[str, str]] = None,
               timeout: float = 120) -> subprocess.CompletedProcess:
        """Run the script with `args` as it is (no check); output captured as text."""
        return subprocess.run([SCRIPT, *args], env={**os.environ, **(env or {})}, capture_output=True, text=True,
                              timeout=timeout)

    def _verb(self, *args: str) -> str:
        result = self.script(*args)
        if result.returncode != 0:
            raise ClusterError(f"scripts/test_cluster.sh {' '.join(args)}: exit {result.returncode}\n"
                               f"{result.stdout}{result.stderr}")
        return result.stdout

    def up(self) -> None:
        """Make the hosts; a whole cluster of this size is left as it is, a broken one rebuilt."""
        self._verb("up", str(self.nodes))

    def down(self) -> None:
        """Remove the cluster and everything it left on the machine."""
        self._verb("down")

    def status(self) -> Dict[str, Dict[str, str]]:
        """Each host's `address`, `link` (up or cut), `rate` (unlimited or tc's rate, e.g. 20Mbit) and `sshd`."""
        lines = self._verb("status").splitlines()
        fields = [name.lower() for name in lines[0].split()[1:]]
        return {line.split()[0]: dict(zip(fields, line.split(None, len(fields))[1:])) for line in lines[1:]}

    def address(self, node: str) -> str:
        """`node`'s address on the cluster network."""
        return self.status()[node]["address"]

    def cut(self, node: str) -> None:
        self._verb("cut", node)

    def heal(self, node: str) -> None:
        self._verb("heal", node)

    def slow(self, node: str, mbit: int) -> None:
        """Limit `node`'s link to `mbit` Mbit/s both ways; 0 lifts the limit."""
        self._verb("slow", node, str(mbit))

    def reset(self) -> None:
        """The cluster whole (up), every link up and unlimited."""
        self.up()
        for node, host in self.status().items():
            if host["link"] != "up":
                self.heal(node)
            if host["rate"] != "unlimited":
                self.slow(node, 0)

    def run(self, node: str, *command: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """Run `command` inside `node` (this process's environment and folder); output captured as text."""
        return self.script("run", node, *command, timeout=timeout)

    def popen(self, node: str, *command: str) -> subprocess.Popen:
        """Start `command` inside `node`; stdout is a text pipe."""
        return subprocess.Popen([*self.inside(node), *command], stdout=subprocess.PIPE, text=True)

    def inside(self, node: str) -> List[str]:
        """The words that run a command inside `node` (put before it; the command's exit code is theirs)."""
        return [SCRIPT, "run", node]

    def horovod_hosts(self, slots: int = 1) -> str:
        """horovodrun's -H for `slots` processes on every host."""
        return ",".join(f"{node}:{slots}" for node in self.hosts)

    def run_horovod(self, args: List[str], transport: str = "gloo", cwd: str = REPO_ROOT, timeout: int = 300,
                    env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
        """`python args...` under horovodrun, one process per host over the cluster network; each process's
        host is in the output (rank_hosts)."""
        return run_horovod(args, np=self.nodes, transport=transport, timeout=timeout, env=env, cwd=cwd,
                           hosts=self.horovod_hosts(), interface=INTERFACE, program=RANK_HOST_PROBE)

    def throughput_mbit(self, sender: str, receiver: str, nbytes: int) -> float:
        """Mbit/s of `nbytes` sent over TCP from host `sender` to host `receiver`, timed by the receiver
        from the connection to the sender's end."""
        listen = ("import socket, sys, time\n"
                  "server = socket.create_server(('0.0.0.0', 0)); print(server.getsockname()[1], flush=True)\n"
                  "peer, _ = server.accept(); start, got = time.perf_counter(), 0\n"
                  "while chunk := peer.recv(1 << 16): got += len(chunk)\n"
                  "print(got, time.perf_counter() - start, flush=True)\n")
        send = ("import socket, sys\n"
                "with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=60) as s:\n"
                "    s.sendall(bytes(int(sys.argv[3])))\n")
        server = self.popen(receiver, sys.executable, "-c", listen)
        try:
            port = server.stdout.readline().strip()
            sent = self.run(sender, sys.executable, "-c", send, receiver, port, str(nbytes), timeout=90)
            if sent.returncode != 0:
                raise ClusterError(f"sending from {sender} to {receiver} failed: {sent.stderr}")
            got, seconds = server.communicate(timeout=90)[0].split()
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()
        assert int(got) == nbytes, (got, nbytes)
        return nbytes * 8 / float(seconds) / 1e6
