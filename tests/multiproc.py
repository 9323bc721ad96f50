"""Launch real multi-process jobs from tests (horovodrun over Gloo or MPI).

A component that is absent skips the test with the reason, except under CI (`CI=true` or
`DLRM_REQUIRE_ALL=1`), where CI has installed everything and a missing component is a failure.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from typing import Dict, List, Optional, Sequence

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRANSPORTS = ("gloo", "mpi")
# Across hosts, so that mpirun ends when a host drops off (docs/cluster.md): a rank's non-zero exit
# does not make mpirun abort the job (the peer watch has already ended every rank; an abort would
# wait on the lost host's daemon for as long as TCP retransmits, about 15 minutes), and keepalives
# on its control connections find the lost daemon after about 20 s: later than DLRM_PEER_TIMEOUT in
# tests, so the ranks' own lines come first.
MPI_LOST_HOST_ARGS = ("-mca orte_abort_on_non_zero_status 0 -mca oob_tcp_keepalive_time 5 "
                      "-mca oob_tcp_keepalive_intvl 5 -mca oob_tcp_keepalive_probes 3")


def require(condition: bool, reason: str) -> None:
    """Skip with `reason` when `condition` is false; fail instead when CI demands every component."""
    if condition:
        return
    if os.environ.get("DLRM_REQUIRE_ALL") == "1" or os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"required component missing in CI: {reason}")
    pytest.skip(reason)


def horovodrun_path() -> Optional[str]:
    venv_bin = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    return venv_bin if os.path.exists(venv_bin) else shutil.which("horovodrun")


def launch_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """Environment for launched ranks: one thread each, root allowed for Open MPI, repo importable."""
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "OMPI_ALLOW_RUN_AS_ROOT": "1",
                "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
                "PYTHONPATH": os.pathsep.join(filter(None, [REPO_ROOT, env.get("PYTHONPATH")]))})
    env.update(extra or {})
    return env


def horovod_command(args: List[str], np: int = 2, transport: str = "gloo", hosts: Optional[str] = None,
                    interface: Optional[str] = None, program: Sequence[str] = ()) -> List[str]:
    """The horovodrun command line that runs `python args...` in `np` processes.

    `hosts`: horovodrun's -H (default: all `np` on localhost). `interface`: the network interface the
    ranks talk over (horovodrun's --network-interfaces; for Open MPI its control channel too), needed
    where hosts have several. `program`: words put before `python` (a wrapper that execs it).
    """
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {TRANSPORTS}, got {transport!r}")
    launcher = horovodrun_path()
    require(launcher is not None, "horovodrun not installed (run `make setup`)")
    if transport == "gloo":
        mode = ["--gloo"]
    else:
        require(shutil.which("mpirun") is not None, "mpirun not installed (Debian openmpi-bin)")
        mpi_args = "--oversubscribe" + (f" -mca oob_tcp_if_include {interface} {MPI_LOST_HOST_ARGS}" if interface else "")
        mode = ["--mpi", f"--mpi-args={mpi_args}"]
    network = ["--network-interfaces", interface] if interface else []
    return [launcher, "-np", str(np), "-H", hosts or f"localhost:{np}", *mode, *network, *program,
            sys.executable, *args]


def run_horovod(args: List[str], np: int = 2, transport: str = "gloo", timeout: int = 300,
                env: Optional[Dict[str, str]] = None, cwd: str = REPO_ROOT, hosts: Optional[str] = None,
                interface: Optional[str] = None, program: Sequence[str] = ()) -> subprocess.CompletedProcess:
    """Run `python args...` under horovodrun (see horovod_command) from `cwd`; output is captured as text."""
    command = horovod_command(args, np=np, transport=transport, hosts=hosts, interface=interface, program=program)
    return subprocess.run(command, cwd=cwd, env=launch_env(env), capture_output=True, text=True, timeout=timeout)


def assert_ok(result: subprocess.CompletedProcess) -> None:
    """Fail with the tail of the job's output when it exited non-zero."""
    assert result.returncode == 0, (f"exit {result.returncode}\n--- stdout\n{result.stdout[-6000:]}"
                                    f"\n--- stderr\n{result.stderr[-6000:]}")


def run_python(args: List[str], timeout: int = 300, env: Optional[Dict[str, str]] = None,
               cwd: Optional[str] = None) -> subprocess.CompletedProcess:
    """Run `python args...` as one process (no launcher), from the repo root unless `cwd` is given."""
    return subprocess.run([sys.executable, *args], cwd=cwd or REPO_ROOT, env=launch_env(env),
                          capture_output=True, text=True, timeout=timeout)


def snapshot(root) -> Dict[str, Optional[str]]:
    """Every path under `root` (hidden ones too): None for a folder, else the sha256 of its bytes.

    Compared before and after a refused command, it shows the file system was left unchanged.
    """
    found: Dict[str, Optional[str]] = {}
    for folder, dirs, files in os.walk(str(root)):
        found.update({os.path.relpath(os.path.join(folder, d), str(root)): None for d in dirs})
        for name in files:
            with open(os.path.join(folder, name), "rb") as f:
                found[os.path.relpath(os.path.join(folder, name), str(root))] = hashlib.sha256(f.read()).hexdigest()
    return found


def assert_one_error(result: subprocess.CompletedProcess, *fragments: str, code: Optional[int] = None) -> None:
    """A refusal: non-zero exit (`code` if given), no traceback, one `error:` line holding every fragment."""
    assert result.returncode != 0 if code is None else result.returncode == code, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr[-3000:]
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
