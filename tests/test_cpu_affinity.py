"""cpu_affinity: the rule of each --affinity mode on topologies given as plain data (DLRM's `auto` too),
the sysfs reader, and binding a real process (every thread). The 2-rank runs printing disjoint CPUs
are in test_wd_train (--affinity given) and test_main (DLRM's default, auto)."""
import os
import subprocess
import sys
import textwrap

import pytest

from recsys.runtime.cpu_affinity import MODES, apply_affinity, choose_cpus, describe, read_topology, resolve_auto
from multiproc import REPO_ROOT

ONE_SOCKET = {cpu: (0, cpu) for cpu in range(4)}  # 4 cores, one thread each
# 2 sockets x 2 cores x 2 threads, numbered as Linux does: the second threads after all first ones
TWO_SOCKETS = {0: (0, 0), 1: (0, 1), 2: (1, 0), 3: (1, 1), 4: (0, 0), 5: (0, 1), 6: (1, 0), 7: (1, 1)}


def shares(mode, ranks, topology):
    return [choose_cpus(mode, position, ranks, topology) for position in range(ranks)]


@pytest.mark.parametrize("mode, expected", [
    ("socket", [[0, 1, 2, 3], [0, 1, 2, 3]]),
    ("single", [[0], [0]]),
    ("single_unique", [[0], [1]]),
    ("socket_unique_interleaved", [[0, 2], [1, 3]]),
    ("socket_unique_continuous", [[0, 1], [2, 3]]),
    ("disabled", [None, None]),
])
def test_two_ranks_on_one_socket(mode, expected):
    assert shares(mode, 2, ONE_SOCKET) == expected


@pytest.mark.parametrize("mode, expected", [
    ("socket", [[0, 1, 4, 5], [0, 1, 4, 5], [2, 3, 6, 7], [2, 3, 6, 7]]),
    ("single", [[0, 4], [0, 4], [2, 6], [2, 6]]),
    ("single_unique", [[0, 4], [1, 5], [2, 6], [3, 7]]),
    ("socket_unique_interleaved", [[0, 4], [1, 5], [2, 6], [3, 7]]),
    ("socket_unique_continuous", [[0, 4], [1, 5], [2, 6], [3, 7]]),
])
def test_four_ranks_over_two_sockets_take_whole_cores_with_their_threads(mode, expected):
    assert shares(mode, 4, TWO_SOCKETS) == expected


def test_fewer_ranks_than_sockets_and_fewer_cores_than_ranks():
    assert shares("socket", 1, TWO_SOCKETS) == [[0, 1, 4, 5]]  # rank 0 on the first socket
    eight = {cpu: (0, cpu) for cpu in range(8)}
    assert shares("socket_unique_interleaved", 3, eight) == [[0, 3, 6], [1, 4, 7], [2, 5]]
    assert shares("socket_unique_continuous", 3, eight) == [[0, 1], [2, 3, 4], [5, 6, 7]]
    two_cores = {0: (0, 0), 1: (0, 1)}
    for mode in ("single_unique", "socket_unique_interleaved", "socket_unique_continuous"):
        assert shares(mode, 3, two_cores) == [[0], [1], [0]], mode  # the third rank shares core 0


def test_unique_modes_are_disjoint_wherever_the_cores_suffice():
    for sockets, cores, threads in ((1, 6, 1), (2, 4, 2), (4, 3, 1)):
        topology = {}
        for s in range(sockets):
            for c in range(cores):
                for t in range(threads):
                    topology[t * sockets * cores + s * cores + c] = (s, c)
        for ranks in range(1, sockets * cores + 1):
            for mode in ("single_unique", "socket_unique_interleaved", "socket_unique_continuous"):
                if cores < -(-ranks // sockets):
                    continue
                chosen = [set(c) for c in shares(mode, ranks, topology)]
                assert all(chosen) and sum(map(len, chosen)) == len(set().union(*chosen)), (mode, ranks, chosen)


@pytest.mark.parametrize("ranks, topology, machine_cpus, expected", [
    (1, ONE_SOCKET, 4, ("disabled", "one rank on this host")),
    (2, ONE_SOCKET, 4, ("socket_unique_continuous", "2 ranks share this host")),
    (4, ONE_SOCKET, 4, ("socket_unique_continuous", "4 ranks share this host")),
    (2, {0: (0, 0), 1: (0, 1)}, 4, ("disabled", "a launcher bound it")),  # 2 of the machine's 4 CPUs
    (3, {0: (0, 0), 1: (0, 1)}, 2, ("disabled", "3 ranks, too few cores for one each")),
    (2, {0: (0, 0), 1: (0, 0)}, 2, ("disabled", "2 ranks, too few cores for one each")),  # one core's 2 threads
    (4, TWO_SOCKETS, 8, ("socket_unique_continuous", "4 ranks share this host")),
    (6, TWO_SOCKETS, 8, ("disabled", "6 ranks, too few cores for one each")),
])
def test_auto_gives_each_rank_a_core_of_its_own_or_leaves_the_cpus(ranks, topology, machine_cpus, expected):
    """auto binds only where it gives every rank cores of its own: never one rank, a launcher's binding,
    or more ranks than cores (two ranks on one core would run at half the speed of the others)."""
    assert resolve_auto(ranks, topology, machine_cpus) == expected


def test_bad_arguments():
    with pytest.raises(ValueError, match="affinity mode must be one of"):
        choose_cpus("nearby", 0, 1, ONE_SOCKET)
    with pytest.raises(ValueError, match="rank position 2 is outside 0..1"):
        choose_cpus("socket", 2, 2, ONE_SOCKET)
    assert set(MODES) == {"socket", "single", "single_unique", "socket_unique_interleaved",
                          "socket_unique_continuous", "disabled"}


def test_read_topology_from_sysfs_files(tmp_path):
    for cpu, (socket, core) in {0: (0, 0), 1: (1, 0), 2: (0, 0)}.items():
        folder = tmp_path / f"cpu{cpu}" / "topology"
        folder.mkdir(parents=True)
        (folder / "physical_package_id").write_text(f"{socket}\n")
        (folder / "core_id").write_text(f"{core}\n")
    topology = read_topology([0, 1, 2, 3], str(tmp_path))
    assert topology == {0: (0, 0), 1: (1, 0), 2: (0, 0), 3: (0, -4)}  # cpu3 has no files: a core of its own
    assert shares("socket_unique_interleaved", 2, topology) == [[0, 2, 3], [1]]  # one rank per socket
    assert shares("socket_unique_interleaved", 4, topology) == [[0, 2], [3], [1], [1]]  # 0 and 2: one core


def test_describe():
    assert describe([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8" and describe([3]) == "3"


def test_binding_a_process_binds_its_existing_threads():
    """A real process with a thread started before the binding: both end on the chosen CPU."""
    script = textwrap.dedent("""
        import os, threading
        from recsys.runtime.cpu_affinity import apply_affinity
        ready, done = threading.Event(), threading.Event()
        worker = threading.Thread(target=lambda: (ready.set(), done.wait()))
        worker.start()
        ready.wait()
        print(apply_affinity("single", 0, 1))
        print(sorted(os.sched_getaffinity(worker.native_id)))
        done.set()
    """)
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    first = min(os.sched_getaffinity(0))
    line, thread_cpus = result.stdout.splitlines()
    assert line == f"--affinity single: local rank 0 of 1 runs on CPUs {first}"
    assert thread_cpus == f"[{first}]"
    assert apply_affinity("disabled", 0, 1).startswith("--affinity disabled: local rank 0 of 1 keeps CPUs ")
