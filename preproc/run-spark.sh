#!/usr/bin/env bash
# Usage: run-spark.sh <CPU|DGX2> INPUT_PATH OUTPUT_PATH FREQUENCY_LIMIT
#
# The name the reference's README gives the Spark launcher: runs run_spark.sh with the same arguments.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
    sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"
    exit 0
fi
exec "$HERE/run_spark.sh" "$@"
