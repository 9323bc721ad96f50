#!/usr/bin/env bash
# Run the whole pytest suite in .venv; print the summary line with the skip count and reasons.
set -euo pipefail

if [[ "${1:-}" == "--help" || "${1:-}" == "-h" ]]; then
  cat <<'USAGE'
Usage: scripts/run_tests.sh [pytest args...]

Runs pytest over tests/ and tensorflow-dot-based-interact/tests/ with the project's .venv. Skipped tests are listed with their reasons
(-rs). Under CI (CI=true) a missing component fails its test instead of skipping it.
Test files run on TEST_WORKERS pytest-xdist workers (default 2; each file whole on one worker, so a file's
fixtures are built once and the tests that share a machine-wide resource, such as the network-namespace
cluster of tests/test_cluster.py, stay in one file); TEST_WORKERS=0 runs them in this process.
USAGE
  exit 0
fi

REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${REPO_DIR}"
export PATH="${REPO_DIR}/.venv/bin:${PATH}"
export TF_CPP_MIN_LOG_LEVEL=2
if [[ "${CI:-}" == "true" ]]; then export DLRM_REQUIRE_ALL=1; fi

WORKERS="${TEST_WORKERS:-2}"
if [[ ! "${WORKERS}" =~ ^[0-9]+$ ]]; then
  echo "error: TEST_WORKERS must be a whole number (0: no workers), got '${WORKERS}'" >&2
  exit 2
fi
set +e
python -m pytest tests tensorflow-dot-based-interact/tests -rs -p no:cacheprovider --durations=15 \
  -n "${WORKERS}" --dist loadfile "$@"
status=$?
set -e
if [[ ${status} -eq 5 ]]; then
  echo "error: pytest collected no tests" >&2
fi
exit "${status}"
