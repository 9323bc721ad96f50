#!/usr/bin/env bash
# Usage: run_spark.sh <CPU|DGX2> INPUT_PATH OUTPUT_PATH FREQUENCY_LIMIT
#
# Runs the Criteo Spark jobs with run_spark_cpu.sh (CPU) or run_spark_gpu.sh (DGX2, RAPIDS).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/common.sh"
[[ "${1:-}" == "-h" || "${1:-}" == "--help" ]] && { print_usage "$0"; exit 0; }
[[ $# -eq 4 ]] || { print_usage "$0" >&2; exit 2; }

case "$1" in
    CPU) exec "$HERE/run_spark_cpu.sh" "$2" "$3" "$4" ;;
    DGX2) exec "$HERE/run_spark_gpu.sh" "$2" "$3" "$4" DGX2 ;;
    *) die "unknown platform '$1': use CPU or DGX2" ;;
esac
