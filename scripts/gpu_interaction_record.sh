#!/usr/bin/env bash
# One GPU record of the dot-interaction CUDA kernels: the tuning sweep, then the full check of the
# sweep's fastest choices beside the reference, in one command that fits a short GPU lease.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: scripts/gpu_interaction_record.sh --output DIR --reference DLE [--sweep-seconds N]
                                         [--check-seconds N] [--repeats N]

On a machine with an NVIDIA GPU, nvcc and python3 with NumPy, from the repository root:
  1. python3 bench/interaction_cuda_sweep.py: every variant of the kernels' build-time choices
     built, checked against NumPy and timed at (65536, 27, 128), the fastest candidate of each
     precision and direction written as -D flags (DIR/sweep/best_defines.txt);
  2. KERNEL_DEFINES=<those flags> scripts/gpu_interaction_check.sh --reference DLE --profile:
     the kernels as the sweep chose them, all correctness cases, timed beside the reference's
     kernels (DLE: a copy of NVIDIA DeepLearningExamples fetched at run time), compute-sanitizer
     memcheck, racecheck and synccheck, and Nsight Compute sections of every timed launch;
  3. DIR/interaction_cuda.json and DIR/interaction_cuda_sweep.json (the records to copy to
     bench/results/), and every log, sanitizer report and Nsight Compute CSV packed in
     DIR/raw.tar.gz (small text, for bench/results/gpu_runs/<date>-<device>/).
Each step runs under its own time limit (defaults: sweep 240 s, check 300 s), so that the
records made so far come back from a lease even when a step overruns.
Exit status: 0 when both steps passed; 1 when one failed or overran; 2 for bad arguments or no GPU.
USAGE
}

die() {
  echo "gpu_interaction_record: $*" >&2
  exit 2
}

OUTPUT_DIR=""
REFERENCE=""
SWEEP_SECONDS=240
CHECK_SECONDS=300
REPEATS=50
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h | --help) usage; exit 0 ;;
    --output) [[ -n "${2:-}" ]] || die "--output needs a folder"; OUTPUT_DIR="$2"; shift 2 ;;
    --reference) [[ -n "${2:-}" ]] || die "--reference needs a DeepLearningExamples folder"; REFERENCE="$2"; shift 2 ;;
    --sweep-seconds) [[ "${2:-}" =~ ^[1-9][0-9]*$ ]] || die "--sweep-seconds needs a positive integer"; SWEEP_SECONDS="$2"; shift 2 ;;
    --check-seconds) [[ "${2:-}" =~ ^[1-9][0-9]*$ ]] || die "--check-seconds needs a positive integer"; CHECK_SECONDS="$2"; shift 2 ;;
    --repeats) [[ "${2:-}" =~ ^[1-9][0-9]*$ ]] || die "--repeats needs a positive integer"; REPEATS="$2"; shift 2 ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
done
[[ -n "${OUTPUT_DIR}" ]] || die "--output is required"
[[ -n "${REFERENCE}" ]] || die "--reference is required (the record compares with the reference's kernels)"
[[ -d "${REFERENCE}" ]] || die "--reference ${REFERENCE}: no such folder"
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  die "no GPU here (nvidia-smi lists none): the record is made on a machine with an NVIDIA GPU"
fi

REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
mkdir -p "${OUTPUT_DIR}/sweep" "${OUTPUT_DIR}/check" 2>/dev/null || die "--output ${OUTPUT_DIR}: cannot write there"
OUTPUT_DIR="$(cd "${OUTPUT_DIR}" && pwd)"
export PYTHONUNBUFFERED=1
status=0

# A step that overran leaves no harness behind on the GPU for the next one.
stop_leftovers() {
  pkill -f dbi_harness || true
  pkill -f reference_peer || true
}

echo "== sweep (limit ${SWEEP_SECONDS} s)"
if ! timeout -k 10 "${SWEEP_SECONDS}" "${PYTHON}" "${REPO_DIR}/bench/interaction_cuda_sweep.py" \
  --output "${OUTPUT_DIR}/sweep" --repeats "${REPEATS}" --best-defines "${OUTPUT_DIR}/sweep/best_defines.txt" \
  2>&1 | tee "${OUTPUT_DIR}/sweep/sweep.log"; then
  echo "gpu_interaction_record: the sweep failed or overran; the check runs the header's defaults" >&2
  status=1
fi
stop_leftovers
best=""
if [[ -f "${OUTPUT_DIR}/sweep/best_defines.txt" ]]; then best="$(tr -d '\n' <"${OUTPUT_DIR}/sweep/best_defines.txt")"; fi

echo "== check of ${best:-the defaults} (limit ${CHECK_SECONDS} s)"
if ! KERNEL_DEFINES="${best}" timeout -k 10 "${CHECK_SECONDS}" "${REPO_DIR}/scripts/gpu_interaction_check.sh" \
  --output "${OUTPUT_DIR}/check" --reference "${REFERENCE}" --repeats "${REPEATS}" --profile \
  2>&1 | tee "${OUTPUT_DIR}/check/check.log"; then
  echo "gpu_interaction_record: the check failed or overran" >&2
  status=1
fi
stop_leftovers

for record in check/interaction_cuda.json sweep/interaction_cuda_sweep.json; do
  if [[ -f "${OUTPUT_DIR}/${record}" ]]; then mv "${OUTPUT_DIR}/${record}" "${OUTPUT_DIR}/"; fi
done
tar -czf "${OUTPUT_DIR}/raw.tar.gz" -C "${OUTPUT_DIR}" sweep check
rm -rf "${OUTPUT_DIR}/sweep" "${OUTPUT_DIR}/check"
echo "records: $(cd "${OUTPUT_DIR}" && ls)"
exit "${status}"
