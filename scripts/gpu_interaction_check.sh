#!/usr/bin/env bash
# The dot-interaction CUDA kernels checked and measured on this machine's GPU, in one command.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: scripts/gpu_interaction_check.sh [--output DIR] [--batch N] [--repeats N] [--reference DLE]
                                      [--no-sanitizer] [--profile]

On a machine with an NVIDIA GPU, nvcc and python3 (NumPy; no TensorFlow needed):
  1. builds the standalone harness (tensorflow-dot-based-interact/harness) for this GPU's
     compute capability (nvidia-smi), or for every architecture the Makefile lists (without
     make: one nvcc call for this GPU);
  2. runs every correctness case (fp32, TF32 and fp16; the op tests' shape sets, Criteo
     (2048, 27, 128), D = 255-257, F > 32, unaligned buffers) against the NumPy reference and
     times forward, backward and both at (N, 27, 128), N = 65536 by default, writing
     DIR/interaction_cuda.json (DIR defaults to bench/results) and printing a table;
     with --reference DLE (a copy of NVIDIA DeepLearningExamples, fetched at run time, never
     stored in this repository) it also builds the reference's TF2 DLRM_and_DCNv2 dot-interaction
     launchers (fp16, TF32, fp32) from that copy and times them in the same run, at the same
     shape, bytes, warm-up and repeats; the JSON then holds both, the speed-up per mode and
     direction and each one's fraction of the HBM peak;
  3. runs the correctness cases at batch <= 8 under compute-sanitizer memcheck, racecheck and synccheck
     (skipped with --no-sanitizer or when compute-sanitizer is absent), logs in DIR;
  4. with --profile, Nsight Compute (ncu) profiles the timed launches at (N, 27, 128), once each,
     ours and (with --reference) the reference's, and writes their speed-of-light, occupancy,
     launch, warp-state and memory sections as DIR/ncu_ours.csv and DIR/ncu_reference.csv.
Exit status: 0 when everything passed; 1 when a check failed; 3 when NumPy is missing (the JSON
then holds the bandwidth only); 2 for bad arguments or a missing tool.
Environment: NVCC (default nvcc), PYTHON (default python3), KERNEL_DEFINES (the kernels' build-time
choices, e.g. what bench/interaction_cuda_sweep.py --best-defines wrote; recorded in the JSON's command).
USAGE
}

die() {
  echo "gpu_interaction_check: $*" >&2
  exit 2
}

REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OP_DIR="${REPO_DIR}/tensorflow-dot-based-interact"
OUTPUT_DIR="${REPO_DIR}/bench/results"
BATCH=65536
REPEATS=50
SANITIZER=1
REFERENCE=""
PROFILE=0
ARGUMENTS="$*"
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h | --help) usage; exit 0 ;;
    --output) [[ $# -ge 2 ]] || die "--output needs a folder"; OUTPUT_DIR="$2"; shift 2 ;;
    --batch) [[ "${2:-}" =~ ^[1-9][0-9]*$ ]] || die "--batch needs a positive integer"; BATCH="$2"; shift 2 ;;
    --repeats) [[ "${2:-}" =~ ^[1-9][0-9]*$ ]] || die "--repeats needs a positive integer"; REPEATS="$2"; shift 2 ;;
    --reference) [[ -n "${2:-}" ]] || die "--reference needs a DeepLearningExamples folder"; REFERENCE="$2"; shift 2 ;;
    --no-sanitizer) SANITIZER=0; shift ;;
    --profile) PROFILE=1; shift ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
done

NVCC="${NVCC:-nvcc}"
PYTHON="${PYTHON:-python3}"
command -v "${NVCC}" >/dev/null || die "${NVCC} not found (the CUDA toolkit's compiler; set NVCC=)"
command -v "${PYTHON}" >/dev/null || die "${PYTHON} not found (set PYTHON=)"
if [[ "${PROFILE}" == 1 ]]; then
  command -v ncu >/dev/null || die "--profile: ncu (Nsight Compute) not found"
fi
if [[ -n "${REFERENCE}" ]]; then
  [[ -d "${REFERENCE}" ]] || die "--reference ${REFERENCE}: no such folder"
  REFERENCE="$(cd "${REFERENCE}" && pwd)"
  command -v make >/dev/null || die "make not found (it builds the reference peer)"
  # The op's Makefile knows where the reference's launchers lie in the copy.
  if ! refusal="$(make -s -C "${OP_DIR}" check-reference "REFERENCE=${REFERENCE}" 2>&1)"; then
    die "--reference: $(head -n 1 <<<"${refusal}")"
  fi
fi
mkdir -p "${OUTPUT_DIR}"
OUTPUT_DIR="$(cd "${OUTPUT_DIR}" && pwd)"
BUILD_DIR="$(mktemp -d)"
trap 'rm -rf "${BUILD_DIR}"' EXIT

# This GPU's architecture ("9.0" -> 90) when nvidia-smi says it; else the Makefile's list.
ARCHS=""
if command -v nvidia-smi >/dev/null; then
  nvidia-smi -L || true
  ARCHS="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' .')" || ARCHS=""
fi
"${NVCC}" --version | tail -n 1
HARNESS="${BUILD_DIR}/dbi_harness"
if command -v make >/dev/null; then
  make_arguments=(-s -C "${OP_DIR}" harness "BUILD=${BUILD_DIR}" "NVCC=${NVCC}" "PYTHON=${PYTHON}")
  if [[ -n "${ARCHS}" ]]; then make_arguments+=("CUDA_ARCHS=${ARCHS}"); fi
  make "${make_arguments[@]}"
else
  # No make: the harness target's two sources in one nvcc call, for this GPU.
  echo "make not found: building the harness with ${NVCC} directly"
  arch_flags=(-arch=native)
  if [[ -n "${ARCHS}" ]]; then arch_flags=(-gencode "arch=compute_${ARCHS},code=sm_${ARCHS}"); fi
  "${NVCC}" -std=c++17 -O3 -DNDEBUG --expt-relaxed-constexpr "${arch_flags[@]}" -I"${OP_DIR}/cc/kernels" \
    "${OP_DIR}/harness/dbi_harness.cu" "${OP_DIR}/cc/kernels/cuda/dot_based_interact.cu" -o "${HARNESS}"
fi

check_arguments=(--binary "${HARNESS}" --results "${OUTPUT_DIR}/interaction_cuda.json" --batch "${BATCH}"
  --repeats "${REPEATS}" --command "${KERNEL_DEFINES:+KERNEL_DEFINES=\"${KERNEL_DEFINES}\" }scripts/gpu_interaction_check.sh ${ARGUMENTS}")
if [[ -n "${REFERENCE}" ]]; then
  peer_arguments=(-s -C "${OP_DIR}" reference-peer "BUILD=${BUILD_DIR}" "NVCC=${NVCC}" "REFERENCE=${REFERENCE}")
  if [[ -n "${ARCHS}" ]]; then peer_arguments+=("CUDA_ARCHS=${ARCHS}"); fi
  make "${peer_arguments[@]}"
  check_arguments+=(--peer-binary "${BUILD_DIR}/reference_peer")
fi

status=0
"${PYTHON}" "${OP_DIR}/harness/check_harness.py" "${check_arguments[@]}" || status=$?

if [[ "${SANITIZER}" == 1 ]]; then
  if command -v compute-sanitizer >/dev/null; then
    for tool in memcheck racecheck synccheck; do
      scratch="$(mktemp -d -p "${BUILD_DIR}")"
      log="${OUTPUT_DIR}/sanitizer_${tool}.log"
      # synccheck tracks the mbarriers of each block (two per warp in the sm_90 kernels, set up through
      # inline PTX, which it does not count): with its default table, or room for 64, it overflows and
      # the kernel fails; 1024 ran clean on an H100 (2026-11-27).
      extra=()
      if [[ "${tool}" == synccheck ]]; then extra=(--num-cuda-barriers 1024); fi
      if compute-sanitizer --tool "${tool}" "${extra[@]}" --error-exitcode 9 "${HARNESS}" --quick --max-batch 8 --output "${scratch}" >"${log}" 2>&1; then
        echo "compute-sanitizer ${tool}: clean (${log})"
      else
        echo "compute-sanitizer ${tool}: FAILED, see ${log}" >&2
        tail -n 20 "${log}" >&2
        if [[ "${status}" == 0 ]]; then status=1; fi
      fi
    done
  else
    echo "compute-sanitizer not found: sanitizer runs skipped"
  fi
fi

# Each timed launch once (--repeats 1) under Nsight Compute, at the device's own clocks. The
# harness writes into a folder, the reference's peer a JSON file.
profile() {
  local name="$1" output="$2"
  shift 2
  local report="${BUILD_DIR}/ncu_${name}"
  if ncu --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats \
    --section WarpStateStats --section MemoryWorkloadAnalysis --export "${report}" \
    "$@" --repeats 1 --batch "${BATCH}" --output "${output}" >"${BUILD_DIR}/ncu_${name}.log" 2>&1 &&
    ncu --import "${report}.ncu-rep" --csv --page details >"${OUTPUT_DIR}/ncu_${name}.csv"; then
    echo "ncu ${name}: ${OUTPUT_DIR}/ncu_${name}.csv"
  else
    echo "ncu ${name}: FAILED" >&2
    tail -n 20 "${BUILD_DIR}/ncu_${name}.log" >&2
    if [[ "${status}" == 0 ]]; then status=1; fi
  fi
}
if [[ "${PROFILE}" == 1 ]]; then
  profile ours "$(mktemp -d -p "${BUILD_DIR}")" "${HARNESS}" --timing-only
  if [[ -n "${REFERENCE}" ]]; then profile reference "${BUILD_DIR}/peer_profiled.json" "${BUILD_DIR}/reference_peer"; fi
fi
exit "${status}"
