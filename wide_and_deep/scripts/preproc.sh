#!/usr/bin/env bash
# Usage: bash scripts/preproc.sh [--strict] spark|duckdb [N]
#
# The Outbrain CSVs -> the Wide & Deep TFRecords (train/ and eval/ of 4096-row records, at most N
# files each, default 40), as the reference's `bash scripts/preproc.sh spark 40`. Both engines run
# the same SQL and write the same bytes; duckdb is embedded (one process, no JVM), spark is the
# reference's. The output folder is built beside itself and renamed into place: a failed run
# leaves nothing. Every input line is accounted for in OUTPUT/preproc_summary.json.
#
# Environment:
#   INPUT_DIR    folder of clicks_train.csv, events.csv, promoted_content.csv, documents_meta.csv,
#                documents_{categories,topics,entities}.csv (/outbrain/orig)
#   OUTPUT_DIR   new folder for the records (/outbrain/tfrecords); must not exist
#   SEED         seed of the train/eval split and of the train row order (0)
#   THREADS      engine threads (all cores)
#   STRICT=1     same as --strict: refuse malformed lines instead of counting and skipping them
#   PYTHON       interpreter with duckdb or pyspark, pyarrow, numpy, tensorflow (the repository's
#                .venv/bin/python if there, else python3)
#   SPARK_MASTER, SPARK_DRIVER_JAVA_OPTIONS  for spark (local[*] by default)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$HERE/../.." && pwd)"

die() {
    echo "error: $*" >&2
    exit 2
}

usage() {
    sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"
}

STRICT="${STRICT:-0}"
while [[ "${1:-}" == -* ]]; do
    case "$1" in
        -h | --help) usage; exit 0 ;;
        --strict) STRICT=1; shift ;;
        *) die "unknown option $1 (see --help)" ;;
    esac
done
[[ $# -ge 1 && $# -le 2 ]] || { usage >&2; exit 2; }
ENGINE="$1"
FILES="${2:-40}"
[[ "$ENGINE" == spark || "$ENGINE" == duckdb ]] || die "engine must be spark or duckdb, got '$ENGINE'"
[[ "$FILES" =~ ^[0-9]+$ && "$FILES" -ge 1 ]] || die "N (files per split) must be an integer >= 1, got '$FILES'"

if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$REPO_ROOT/.venv/bin/python" ]]; then PYTHON="$REPO_ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
args=(--engine "$ENGINE" --input "${INPUT_DIR:-/outbrain/orig}" --output "${OUTPUT_DIR:-/outbrain/tfrecords}"
      --num_train_files "$FILES" --num_eval_files "$FILES" --seed "${SEED:-0}")
[[ -n "${THREADS:-}" ]] && args+=(--threads "$THREADS")
[[ "$STRICT" == 1 ]] && args+=(--strict)
export PYTHONPATH="$REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
exec "$PYTHON" -m wide_and_deep.preprocessing "${args[@]}"
