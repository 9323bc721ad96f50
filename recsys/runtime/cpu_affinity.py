"""Which CPU cores a rank runs on: the reference Wide & Deep's `--affinity` modes on a CPU machine.

The reference binds each rank to cores near its GPU. Here the rank's position among the ranks of its
machine (its local rank of the local size) plays the GPU's part, and the cores are those the process
may use (`os.sched_getaffinity`, so a launcher's or a container's binding narrows them first):

- ranks are spread over the sockets in contiguous blocks (ranks 0..n/S-1 on the first socket, ...);
- `socket`: every core of the rank's socket (shared by the ranks on it);
- `single`: the socket's first core (shared);
- `single_unique`: one core each, the k-th of the socket for the socket's k-th rank;
- `socket_unique_interleaved`: the socket's cores dealt out one by one (the k-th rank of n takes cores
  k, k + n, ...); `socket_unique_continuous`: the socket's cores cut into n contiguous blocks;
- `disabled`: the process keeps its cores;
- `auto` (DLRM's default): `socket_unique_continuous` when several ranks share the machine, no
  launcher has bound the process to fewer CPUs than the machine's and every rank gets a core of its
  own, else `disabled`. On a 2-core Zen 4, 2 ranks of the cpu-bench step ran 5% (fp32) and 13%
  (bf16) faster bound (docs/benchmarks.md).

A core is a physical core with all its hardware threads (`/sys/devices/system/cpu/cpuN/topology`:
`physical_package_id` is the socket, `core_id` the core in it). The unique modes give disjoint shares
while a socket has at least as many cores as ranks; with fewer, the socket's k-th rank shares core
k mod cores. The rule takes the topology as plain data (`choose_cpus`); `read_topology` and
`bind` are the machine's side.
"""
from __future__ import annotations

import os
from typing import Dict, Iterable, List, Mapping, Optional, Tuple

MODES = ("socket", "single", "single_unique", "socket_unique_interleaved", "socket_unique_continuous", "disabled")
AUTO = "auto"
SYSFS_CPU = "/sys/devices/system/cpu"

Topology = Mapping[int, Tuple[int, int]]  # logical CPU -> (socket, core id within the socket)


def read_topology(cpus: Iterable[int], root: str = SYSFS_CPU) -> Dict[int, Tuple[int, int]]:
    """(socket, core) of each logical CPU in `cpus` from `root`/cpuN/topology; a CPU whose files are
    missing or unreadable counts as a core of its own on socket 0."""
    topology = {}
    for cpu in cpus:
        folder = os.path.join(root, f"cpu{cpu}", "topology")
        try:
            with open(os.path.join(folder, "physical_package_id")) as f:
                socket = int(f.read())
            with open(os.path.join(folder, "core_id")) as f:
                core = int(f.read())
        except (OSError, ValueError):
            socket, core = 0, -1 - cpu  # a negative core id no real core has
        topology[cpu] = (socket, core)
    return topology


def _sockets(topology: Topology) -> List[List[List[int]]]:
    """The sockets in id order, each its cores in order of their lowest logical CPU, each core its
    logical CPUs (sorted)."""
    cores: Dict[Tuple[int, int], List[int]] = {}
    for cpu in sorted(topology):
        cores.setdefault(topology[cpu], []).append(cpu)
    by_socket: Dict[int, List[List[int]]] = {}
    for (socket, _), cpus in sorted(cores.items(), key=lambda item: (item[0][0], item[1][0])):
        by_socket.setdefault(socket, []).append(cpus)
    return [by_socket[s] for s in sorted(by_socket)]


def choose_cpus(mode: str, position: int, ranks: int, topology: Topology) -> Optional[List[int]]:
    """The logical CPUs, sorted, of the rank at `position` (0-based) of `ranks` ranks sharing the CPUs of
    `topology` under `mode` (one of MODES); None for `disabled` (the rank keeps its CPUs)."""
    if mode not in MODES:
        raise ValueError(f"affinity mode must be one of {', '.join(MODES)}, got {mode!r}")
    if not 0 <= position < ranks:
        raise ValueError(f"rank position {position} is outside 0..{ranks - 1}")
    if not topology:
        raise ValueError("no CPU to choose from")
    if mode == "disabled":
        return None
    sockets = _sockets(topology)
    socket = position * len(sockets) // ranks
    on_socket = [p for p in range(ranks) if p * len(sockets) // ranks == socket]
    k, n, cores = on_socket.index(position), len(on_socket), sockets[socket]
    if mode == "socket":
        chosen = cores
    elif mode == "single":
        chosen = cores[:1]
    elif mode == "single_unique" or len(cores) < n:
        chosen = [cores[k % len(cores)]]
    elif mode == "socket_unique_interleaved":
        chosen = cores[k::n]
    else:
        chosen = cores[k * len(cores) // n:(k + 1) * len(cores) // n]
    return sorted(cpu for core in chosen for cpu in core)


def bind(cpus: Iterable[int]) -> List[int]:
    """Bind every thread of this process (those that exist now; later ones inherit it) to `cpus`;
    returns the CPUs the calling thread may use afterwards, sorted."""
    wanted = set(cpus)
    for task in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(task), wanted)
        except ProcessLookupError:  # a thread that has ended since the listing
            continue
    return sorted(os.sched_getaffinity(0))


def describe(cpus: Iterable[int]) -> str:
    """CPU numbers as ranges: [0, 1, 2, 5] -> '0-2,5'."""
    ranges: List[List[int]] = []
    for cpu in sorted(cpus):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in ranges)


def resolve_auto(ranks: int, topology: Topology, machine_cpus: int) -> Tuple[str, str]:
    """The mode `auto` stands for on `topology` (the CPUs this process may use), and why: each of
    several ranks its own contiguous share of the cores, unless a launcher (mpirun --bind-to,
    Slurm's --cpu-bind, taskset) already narrowed the CPUs, or there are too few cores to give every
    rank one of its own (two ranks on one core would run at half the speed of the rest)."""
    if ranks <= 1:
        return "disabled", "one rank on this host"
    if len(topology) < machine_cpus:
        return "disabled", "a launcher bound it"
    shares = [set(choose_cpus("socket_unique_continuous", position, ranks, topology)) for position in range(ranks)]
    if sum(map(len, shares)) != len(set().union(*shares)):
        return "disabled", f"{ranks} ranks, too few cores for one each"
    return "socket_unique_continuous", f"{ranks} ranks share this host"


def apply_affinity(mode: str, position: int, ranks: int) -> str:
    """Bind this process by `mode` (one of MODES, or AUTO) as the rank at `position` of `ranks` on this
    machine, among the CPUs it may use now; returns the start-up line naming the CPUs it runs on."""
    allowed = sorted(os.sched_getaffinity(0))
    topology = read_topology(allowed)
    label = mode
    if mode == AUTO:
        mode, why = resolve_auto(ranks, topology, os.cpu_count() or len(allowed))
        label = f"auto ({mode}: {why})"
    chosen = choose_cpus(mode, position, ranks, topology)
    if chosen is None:
        return f"--affinity {label}: local rank {position} of {ranks} keeps CPUs {describe(allowed)}"
    return f"--affinity {label}: local rank {position} of {ranks} runs on CPUs {describe(bind(chosen))}"
