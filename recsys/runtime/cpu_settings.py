"""oneDNN on or off, chosen per CPU kind from measurement, and the start-up line that says so.

TensorFlow 2.15 turns its oneDNN kernels on by itself only on CPUs with AVX-512. The run shell
decides instead, before TensorFlow's first import: the user's TF_ENABLE_ONEDNN_OPTS wins; else the
measured choice for this CPU kind (`python bench/train.py --only onednn`, recorded in
bench/results/train.json); else on, as on the measured kinds. No TensorFlow import here.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, Mapping, MutableMapping, Optional, Sequence, Set, Tuple

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
