"""Which precision a run computes in, and the start-up line saying why.

`--amp` means float16 compute with static loss scaling on a GPU (the reference's AMP) and bfloat16
compute on a CPU with bf16 units (AVX512-BF16 or AMX on x86-64, the BF16 extension on aarch64).
A CPU without them would emulate bfloat16, slower than float32 and less accurate, so it runs
float32 and says so. Weights stay float32 under `--amp`; `--fp16` is pure float16.
"""
from __future__ import annotations

import platform
from typing import NamedTuple

import tensorflow as tf

from recsys.runtime.cpu_settings import CPUINFO_PATH, common_cpuinfo_values

X86_MACHINES = ("x86_64", "amd64")
ARM_MACHINES = ("aarch64", "arm64")
X86_BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # either gives TensorFlow's oneDNN fast bf16 kernels
ARM_BF16_FLAGS = ("bf16",)


class CpuBf16(NamedTuple):
    """Whether the CPU has bf16 units, and the evidence in words."""
    supported: bool
    evidence: str


class Precision(NamedTuple):
    """The dtype the layers compute in, and the start-up line saying which precision runs and why."""
    compute_dtype: tf.DType
    message: str


def cpu_bf16_support(cpuinfo: str, machine: str) -> CpuBf16:
    """bf16 support of a CPU from the text of its /proc/cpuinfo and its `platform.machine()`.

    x86-64: every processor's `flags` line lists avx512_bf16 or amx_bf16; aarch64: every `Features`
    line lists bf16. Another architecture, or no such line, counts as unsupported.
    """
    machine = machine.lower()
    if machine in X86_MACHINES:
        key, wanted = "flags", X86_BF16_FLAGS
    elif machine in ARM_MACHINES:
        key, wanted = "features", ARM_BF16_FLAGS
    else:
        return CpuBf16(False, f"bf16 support is not known for CPU architecture {machine or 'unknown'!r}")
    common = common_cpuinfo_values(cpuinfo, key)
    if common is None:
        return CpuBf16(False, f"{CPUINFO_PATH} has no '{key}' line to show bf16 support")
    found = [flag for flag in wanted if flag in common]
    if found:
        return CpuBf16(True, f"the CPU has {' and '.join(found)}")
    return CpuBf16(False, f"the CPU's {key} have none of {', '.join(wanted)}")


def host_cpu_bf16_support() -> CpuBf16:
    """cpu_bf16_support of this machine (unsupported, saying why, where /proc/cpuinfo cannot be read)."""
    try:
        with open(CPUINFO_PATH) as f:
            cpuinfo = f.read()
    except OSError as error:
        return CpuBf16(False, f"{CPUINFO_PATH} cannot be read ({error.strerror})")
    return cpu_bf16_support(cpuinfo, platform.machine())


def choose_precision(amp: bool, fp16: bool, on_gpu: bool, loss_scale: float, cpu_bf16: CpuBf16) -> Precision:
    """The compute precision of `--amp`/`--fp16` on a GPU (`on_gpu`) or a CPU with `cpu_bf16`."""
    if fp16:
        return Precision(tf.float16, "precision: float16 weights and compute (--fp16)")
    if not amp:
        return Precision(tf.float32, "precision: float32 (no --amp)")
    if on_gpu:
        return Precision(tf.float16, f"precision: --amp on a GPU: float16 compute, float32 weights, static loss "
                                     f"scale {loss_scale:g}")
    if cpu_bf16.supported:
        return Precision(tf.bfloat16, f"precision: --amp on the CPU: bfloat16 compute, float32 weights, no loss "
                                      f"scaling ({cpu_bf16.evidence})")
    return Precision(tf.float32, f"precision: float32: --amp on the CPU needs bf16 units and {cpu_bf16.evidence}, "
                                 f"so bfloat16 would be emulated, slower than float32")
