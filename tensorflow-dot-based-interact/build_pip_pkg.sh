#!/usr/bin/env bash
# Builds the platform wheel of the op from the already built library (see the Makefile's `pkg`).
set -euo pipefail

usage() {
  cat <<USAGE
usage: $0 [--python PYTHON] [--output DIR]
Copies setup.py, MANIFEST.in and the Python package (with _dot_based_interact_ops.so and its
CUDA code record .json, without tests and caches) to a temporary directory and builds a wheel
into DIR (default: artifacts).
USAGE
}

python="python3"
output="artifacts"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --python) python="$2"; shift 2 ;;
    --output) output="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
  esac
done

package_root="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
library="${package_root}/tensorflow_dot_based_interact/_dot_based_interact_ops.so"
if [[ ! -f "${library}" ]]; then
  echo "error: ${library} is missing; run make cpu (or make gpu) first" >&2
  exit 1
fi

staging="$(mktemp -d)"
trap 'rm -rf "${staging}"' EXIT
cp "${package_root}/setup.py" "${package_root}/MANIFEST.in" "${staging}/"
mkdir -p "${staging}/tensorflow_dot_based_interact"
cp "${package_root}"/tensorflow_dot_based_interact/*.py "${library}" "${library%.so}.json" \
  "${staging}/tensorflow_dot_based_interact/"

mkdir -p "${output}"
output="$(cd "${output}" && pwd)"
"${python}" -m pip wheel --quiet --no-deps --no-build-isolation --wheel-dir "${output}" "${staging}"
echo "wheel in ${output}:"
ls "${output}"/*.whl
