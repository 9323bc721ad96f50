"""precision.py: bf16 detection from /proc/cpuinfo text, and the precision each flag set runs in."""
import json
import os

import pytest
import tensorflow as tf

from recsys.runtime import cpu_settings
from recsys.runtime.precision import CpuBf16, choose_precision, cpu_bf16_support

# Abridged /proc/cpuinfo of two x86-64 processors; FLAGS is filled in per case.
X86_CPUINFO = """processor\t: {n}
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2 avx2 fma avx512f avx512bw {extra}
bogomips\t: 4000.00
"""
ARM_CPUINFO = """processor\t: 0
BogoMIPS\t: 2100.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics {extra}
CPU implementer\t: 0x41
"""


def x86(*extras: str) -> str:
    """One processor block per entry of `extras`, each with those extra flags."""
    return "\n".join(X86_CPUINFO.format(n=n, extra=extra) for n, extra in enumerate(extras))


@pytest.mark.parametrize("cpuinfo, machine, supported, evidence", [
    (x86("avx512_bf16 amx_tile amx_bf16", "avx512_bf16 amx_tile amx_bf16"), "x86_64", True,
     "the CPU has avx512_bf16 and amx_bf16"),
    (x86("avx512_bf16", "avx512_bf16"), "x86_64", True, "the CPU has avx512_bf16"),
    (x86("amx_bf16"), "AMD64", True, "the CPU has amx_bf16"),
    (x86("avx512_vnni", "avx512_vnni"), "x86_64", False, "the CPU's flags have none of avx512_bf16, amx_bf16"),
    (x86("avx512_bf16", "avx512_vnni"), "x86_64", False, "none of avx512_bf16"),  # one core without: none
    (ARM_CPUINFO.format(extra="bf16 i8mm sve"), "aarch64", True, "the CPU has bf16"),
    (ARM_CPUINFO.format(extra="sve"), "aarch64", False, "the CPU's features have none of bf16"),
    (x86("avx512_bf16"), "ppc64le", False, "not known for CPU architecture 'ppc64le'"),
    ("", "", False, "not known for CPU architecture 'unknown'"),
    ("processor\t: 0\n", "x86_64", False, "/proc/cpuinfo has no 'flags' line"),
])
def test_cpu_bf16_support_reads_the_flags(cpuinfo: str, machine: str, supported: bool, evidence: str) -> None:
    result = cpu_bf16_support(cpuinfo, machine)
    assert result.supported is supported
    assert evidence in result.evidence


def test_flag_names_match_whole_words() -> None:
    assert not cpu_bf16_support(x86("avx512_bf16x amx_bf16_extra"), "x86_64").supported


WITH_BF16 = CpuBf16(True, "the CPU has amx_bf16")
WITHOUT_BF16 = CpuBf16(False, "the CPU's flags have none of avx512_bf16, amx_bf16")


@pytest.mark.parametrize("amp, fp16, on_gpu, cpu_bf16, dtype, message", [
    (False, False, False, WITH_BF16, tf.float32, "precision: float32 (no --amp)"),
    (False, True, False, WITHOUT_BF16, tf.float16, "precision: float16 weights and compute (--fp16)"),
    (True, False, True, WITHOUT_BF16, tf.float16,
     "precision: --amp on a GPU: float16 compute, float32 weights, static loss scale 1024"),
    (True, False, False, WITH_BF16, tf.bfloat16,
     "precision: --amp on the CPU: bfloat16 compute, float32 weights, no loss scaling (the CPU has amx_bf16)"),
    (True, False, False, WITHOUT_BF16, tf.float32,
     "precision: float32: --amp on the CPU needs bf16 units and the CPU's flags have none of avx512_bf16, "
     "amx_bf16, so bfloat16 would be emulated, slower than float32"),
], ids=["fp32", "fp16", "amp-gpu", "amp-cpu-bf16", "amp-cpu-without-bf16"])
def test_choose_precision_says_which_and_why(amp: bool, fp16: bool, on_gpu: bool, cpu_bf16: CpuBf16,
                                             dtype: tf.DType, message: str) -> None:
    assert choose_precision(amp, fp16, on_gpu, 1024, cpu_bf16) == (dtype, message)


@pytest.mark.parametrize("flags, kind", [
    ("avx2 avx512f avx512_bf16 amx_tile amx_bf16", "amx"),
    ("avx2 avx512f avx512_bf16", "avx512_bf16"),
    ("avx2 avx512f avx512_vnni", "avx512"),
    ("avx2 fma", "avx2"),
    ("sse2", "other"),
])
def test_cpu_kind_comes_from_the_flags(flags: str, kind: str) -> None:
    cpuinfo = "".join(f"processor\t: {n}\nflags\t\t: fpu {flags}\n\n" for n in range(2))
    assert cpu_settings.cpu_kind(cpu_settings.common_cpuinfo_values(cpuinfo, "flags")) == kind


def test_onednn_choice_follows_the_user_then_the_measurement(monkeypatch) -> None:
    """The user's TF_ENABLE_ONEDNN_OPTS wins; else the kind's measurement (off where off was faster);
    else on. The choice is set in the environment given and stated in the start-up line."""
    environ = {"TF_ENABLE_ONEDNN_OPTS": "0"}
    line = cpu_settings.apply_onednn_choice(environ, ["avx512f", "avx512_bf16"])
    assert environ["TF_ENABLE_ONEDNN_OPTS"] == "0" and "oneDNN off (TF_ENABLE_ONEDNN_OPTS=0 as set)" in line
    environ = {}
    line = cpu_settings.apply_onednn_choice(environ, ["avx512f", "avx512_bf16"])
    assert environ["TF_ENABLE_ONEDNN_OPTS"] == "1"
    assert line.startswith("cpu: x86-64 with AVX-512 and AVX512-BF16 (avx512_bf16); oneDNN on (measured 1.13x")
    monkeypatch.setitem(cpu_settings.ONEDNN_MEASURED, "avx2", cpu_settings.OneDnnMeasurement(0.9, "a Zen 3"))
    environ = {}
    assert "oneDNN off (measured 0.90x the step rate of off on a Zen 3" in cpu_settings.apply_onednn_choice(environ, ["avx2"])
    assert environ["TF_ENABLE_ONEDNN_OPTS"] == "0"
    environ = {}
    assert "oneDNN on (not measured on this kind" in cpu_settings.apply_onednn_choice(environ, ["sse2"])


def test_onednn_measurements_are_the_benchmarks() -> None:
    """cpu_settings.ONEDNN_MEASURED holds bench/results/train.json's "onednn" entries, per CPU kind."""
    with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "results",
                           "train.json")) as f:
        recorded = json.load(f)["onednn"]
    assert set(recorded) == set(cpu_settings.ONEDNN_MEASURED)
    for kind, entry in recorded.items():
        assert entry["cpu"]["kind"] == kind
        assert cpu_settings.ONEDNN_MEASURED[kind].on_over_off == pytest.approx(entry["on_vs_off"], abs=5e-4)


def test_thread_choice_follows_the_flags_then_the_measurement(monkeypatch) -> None:
    """The measured setting of the CPU kind for one rank or several on the host (SHARE divides the
    machine's cores among them, or keeps a launcher's narrower binding); a given flag wins on its
    own; an unmeasured kind keeps TensorFlow's defaults for one rank and shares the cores for several."""
    setting = cpu_settings.ThreadSetting
    monkeypatch.setitem(cpu_settings.THREADS_MEASURED, "avx2", cpu_settings.ThreadMeasurement(
        setting(1, 0), 1.02, setting(1, cpu_settings.SHARE), 1.31, "a Zen 3"))
    one = cpu_settings.thread_choice("avx2", 1, 16, 16)
    assert (one.inter, one.intra) == (1, 0)
    assert one.line == ("threads: inter-op 1, intra-op TensorFlow's default (1 rank on this host; measured 1.02x "
                        "TensorFlow's defaults on a Zen 3, bench/results/train.json)")
    several = cpu_settings.thread_choice("avx2", 4, 16, 16)
    assert (several.inter, several.intra) == (1, 4) and "(4 ranks on this host; measured 1.31x" in several.line
    assert cpu_settings.thread_choice("avx2", 4, 3, 16).intra == 3  # bound by the launcher to 3 cores
    assert cpu_settings.thread_choice("avx2", 32, 16, 16).intra == 1
    given = cpu_settings.thread_choice("avx2", 4, 16, 16, given_intra=8)
    assert (given.inter, given.intra) == (1, 8)
    assert "--intra_op_parallelism as given; the rest measured 1.31x" in given.line
    both = cpu_settings.thread_choice("avx2", 1, 16, 16, given_inter=2, given_intra=8)
    assert (both.inter, both.intra) == (2, 8) and both.line.endswith(
        "(1 rank on this host; --inter_op_parallelism and --intra_op_parallelism as given)")
    unmeasured = [cpu_settings.thread_choice("other", ranks, 16, 16) for ranks in (1, 2)]
    assert [(c.inter, c.intra) for c in unmeasured] == [(0, 0), (0, 8)]
    assert "not measured on this kind" in unmeasured[0].line


def test_thread_measurements_are_the_benchmarks() -> None:
    """cpu_settings.THREADS_MEASURED holds bench/results/train.json's "thread_counts" entries, per CPU
    kind: the fastest setting with one rank and with two on the host, and its rate over the defaults."""
    with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "results",
                           "train.json")) as f:
        recorded = json.load(f)["thread_counts"]
    assert set(recorded) == set(cpu_settings.THREADS_MEASURED)
    for kind, entry in recorded.items():
        measured = cpu_settings.THREADS_MEASURED[kind]
        assert entry["cpu"]["kind"] == kind
        for setting, gain, best in ((measured.one_rank, measured.one_rank_over_default, entry["best_1_ranks"]),
                                    (measured.several_ranks, measured.several_ranks_over_default,
                                     entry["best_2_ranks"])):
            share = max(1, entry["cores"] // 2) if best is entry["best_2_ranks"] else None
            intra = share if setting.intra == cpu_settings.SHARE else setting.intra
            assert (setting.inter, intra) == (best["inter_op_threads"], best["intra_op_threads"])
            assert gain == pytest.approx(best["over_default"], abs=5e-3)
