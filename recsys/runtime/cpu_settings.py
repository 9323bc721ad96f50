"""oneDNN on or off and TensorFlow's thread counts, chosen per CPU kind from measurement, and the
start-up lines that say so.

TensorFlow 2.15 turns its oneDNN kernels on by itself only on CPUs with AVX-512. The run shell
decides instead, before TensorFlow's first import: the user's TF_ENABLE_ONEDNN_OPTS wins; else the
measured choice for this CPU kind (`python bench/train.py --only onednn`, recorded in
bench/results/train.json); else on, as on the measured kinds.

TensorFlow sizes its inter- and intra-op thread pools to every core the process may use, so ranks
sharing a host oversubscribe it. The run shell asks `thread_choice` once Horovod says how many ranks
share the host: the user's --inter_op_parallelism / --intra_op_parallelism win; else the fastest setting
measured for this CPU kind (`python bench/train.py --only threads`); else TensorFlow's defaults for
one rank per host and the cores shared out among several. No TensorFlow import here.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, Mapping, MutableMapping, Optional, Sequence, Set, Tuple, Union

CPUINFO_PATH = "/proc/cpuinfo"
ONEDNN_VARIABLE = "TF_ENABLE_ONEDNN_OPTS"
# (kind, the flags that make it, in words), most specific first; the first whose flags the CPU
# has all of is its kind.
CPU_KINDS: Tuple[Tuple[str, Tuple[str, ...], str], ...] = (
    ("amx", ("amx_bf16",), "x86-64 with AMX"),
    ("avx512_bf16", ("avx512f", "avx512_bf16"), "x86-64 with AVX-512 and AVX512-BF16"),
    ("avx512", ("avx512f",), "x86-64 with AVX-512"),
    ("avx2", ("avx2",), "x86-64 with AVX2, no AVX-512"),
)
OTHER_KIND = "other"


@dataclass(frozen=True)
class OneDnnMeasurement:
    """fp32 cpu-bench training at batch 4096, samples/s with oneDNN on over off, on `cpu`."""
    on_over_off: float
    cpu: str


# bench/results/train.json "onednn" (tests/test_precision.py checks these against it).
ONEDNN_MEASURED: Dict[str, OneDnnMeasurement] = {
    "avx512_bf16": OneDnnMeasurement(on_over_off=1.131, cpu="AMD EPYC (Zen 4)"),
}


def common_cpuinfo_values(cpuinfo: str, key: str) -> Optional[Set[str]]:
    """The words every processor's `key` line of a /proc/cpuinfo text lists (x86-64: "flags",
    aarch64: "features"); None when no processor has such a line."""
    per_processor = [set(value.split()) for name, _, value in (line.partition(":") for line in cpuinfo.splitlines())
                     if name.strip().lower() == key]
    return set.intersection(*per_processor) if per_processor else None


def host_cpu_flags() -> Set[str]:
    """This machine's x86-64 CPU flags (none where /proc/cpuinfo cannot be read or has no flags)."""
    try:
        with open(CPUINFO_PATH) as f:
            return common_cpuinfo_values(f.read(), "flags") or set()
    except OSError:
        return set()


def cpu_model_name() -> str:
    """The CPU's model name from /proc/cpuinfo ("unknown" where it cannot be read), recorded with
    every benchmark result: results compare only within one machine."""
    try:
        with open(CPUINFO_PATH) as f:
            return next((line.partition(":")[2].strip() for line in f if line.startswith("model name")), "unknown")
    except OSError:
        return "unknown"


def cpu_kind(flags: Sequence[str]) -> str:
    """The CPU_KINDS entry a CPU with these /proc/cpuinfo flags belongs to, else OTHER_KIND."""
    present = set(flags)
    return next((kind for kind, needed, _ in CPU_KINDS if present.issuperset(needed)), OTHER_KIND)


def describe_kind(kind: str) -> str:
    """A CPU kind in words, for the start-up line."""
    return next((words for name, _, words in CPU_KINDS if name == kind), "a CPU of none of these kinds")


def onednn_choice(kind: str, environ: Mapping[str, str]) -> Tuple[str, str]:
    """(TF_ENABLE_ONEDNN_OPTS value, why) for a CPU of `kind` under `environ`."""
    given = environ.get(ONEDNN_VARIABLE)
    if given is not None:
        return given, f"{ONEDNN_VARIABLE}={given} as set"
    measured = ONEDNN_MEASURED.get(kind)
    if measured is None:
        return "1", "not measured on this kind; on, as on the measured kinds"
    value = "1" if measured.on_over_off >= 1.0 else "0"
    return value, (f"measured {measured.on_over_off:.2f}x the step rate of off on {measured.cpu}, "
                   f"bench/results/train.json")


def apply_onednn_choice(environ: Optional[MutableMapping[str, str]] = None,
                        flags: Optional[Sequence[str]] = None) -> str:
    """Set TF_ENABLE_ONEDNN_OPTS in `environ` (default os.environ) for this CPU, before TensorFlow's
    first import; returns the start-up line that states the choice."""
    environ = os.environ if environ is None else environ
    kind = cpu_kind(host_cpu_flags() if flags is None else flags)
    value, why = onednn_choice(kind, environ)
    environ[ONEDNN_VARIABLE] = value
    state = "off" if value.strip().lower() in ("0", "false", "off") else "on"
    return f"cpu: {describe_kind(kind)} ({kind}); oneDNN {state} ({why})"


SHARE = "share"  # an intra-op thread count: the host's cores divided among the ranks on it


@dataclass(frozen=True)
class ThreadSetting:
    """Inter- and intra-op thread counts: 0 leaves TensorFlow's default; intra SHARE divides the cores."""
    inter: int
    intra: Union[int, str]  # a count, or SHARE


@dataclass(frozen=True)
class ThreadMeasurement:
    """fp32 cpu-bench training at global batch 4096 on `cpu`: the fastest setting with one rank on the
    host and with two, each with its step rate over TensorFlow's defaults."""
    one_rank: ThreadSetting
    one_rank_over_default: float
    several_ranks: ThreadSetting
    several_ranks_over_default: float
    cpu: str


# bench/results/train.json "thread_counts" (tests/test_precision.py checks these against it).
THREADS_MEASURED: Dict[str, ThreadMeasurement] = {
    "avx512_bf16": ThreadMeasurement(one_rank=ThreadSetting(0, 0), one_rank_over_default=1.0,
                                     several_ranks=ThreadSetting(0, SHARE), several_ranks_over_default=1.028,
                                     cpu="AMD EPYC (Zen 4)"),
}
UNMEASURED_THREADS = (ThreadSetting(0, 0), ThreadSetting(0, SHARE))  # one rank, several ranks


@dataclass(frozen=True)
class ThreadChoice:
    """Thread counts to set (0: leave TensorFlow's default) and the start-up line that says why."""
    inter: int
    intra: int
    line: str


def share_of_cores(usable: int, machine: int, ranks_on_host: int) -> int:
    """A rank's intra-op threads when the host's cores are shared out: the cores it may use when a
    launcher has bound it to fewer than the machine's, else the machine's cores over the ranks."""
    if usable < machine:
        return max(1, usable)
    return max(1, machine // max(1, ranks_on_host))


def thread_choice(kind: str, ranks_on_host: int, usable_cores: int, machine_cores: int,
                  given_inter: Optional[int] = None, given_intra: Optional[int] = None) -> ThreadChoice:
    """The inter- and intra-op thread counts for a rank of a CPU run on a host of `kind` shared by
    `ranks_on_host` ranks: given counts (> 0) win, each on its own; else the measured setting."""
    measured = THREADS_MEASURED.get(kind)
    several = ranks_on_host > 1
    if measured is None:
        setting = UNMEASURED_THREADS[several]
        why = "not measured on this kind"
    else:
        setting = measured.several_ranks if several else measured.one_rank
        gain = measured.several_ranks_over_default if several else measured.one_rank_over_default
        why = f"measured {gain:.2f}x TensorFlow's defaults on {measured.cpu}, bench/results/train.json"
    intra = share_of_cores(usable_cores, machine_cores, ranks_on_host) if setting.intra == SHARE else setting.intra
    inter = setting.inter
    given = []
    if given_inter:
        inter = given_inter
        given.append("--inter_op_parallelism")
    if given_intra:
        intra = given_intra
        given.append("--intra_op_parallelism")
    if given:
        why = f"{' and '.join(given)} as given" + ("" if len(given) == 2 else f"; the rest {why}")

    def count(value: int) -> str:
        return str(value) if value else "TensorFlow's default"

    return ThreadChoice(inter, intra, f"threads: inter-op {count(inter)}, intra-op {count(intra)} "
                                      f"({ranks_on_host} rank{'s' if several else ''} on this host; {why})")


def host_thread_choice(ranks_on_host: int, given_inter: Optional[int] = None,
                       given_intra: Optional[int] = None) -> ThreadChoice:
    """thread_choice for this machine: its CPU kind, the cores this process may use and the machine's."""
    return thread_choice(cpu_kind(host_cpu_flags()), ranks_on_host, len(os.sched_getaffinity(0)), os.cpu_count() or 1,
                         given_inter, given_intra)
