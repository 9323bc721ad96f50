#!/usr/bin/env bash
# Usage: run_spark_cpu.sh [INPUT_PATH] [OUTPUT_PATH] [FREQUENCY_LIMIT]
#
# Runs the Criteo Spark jobs on CPUs: dictionaries over days 0..NUM_DAYS-1, then train (days
# 0..NUM_DAYS-2, shuffled) and test/validation (the two halves of the last day, in input order).
# Writes OUTPUT_PATH/{models,train,test,validation,summary,model_size.json}.
# Defaults: INPUT_PATH=/data/dlrm/criteo OUTPUT_PATH=/data/dlrm/spark/output FREQUENCY_LIMIT=15
#
# Environment (defaults suit local mode on a small machine):
#   SPARK_MASTER             master URL (default local[TOTAL_CORES]; e.g. spark://host:7077, yarn)
#   TOTAL_CORES              cores to use (default: nproc)
#   DRIVER_MEMORY            driver heap, the whole job in local mode (default 8g)
#   NUM_EXECUTORS, EXECUTOR_CORES, EXECUTOR_MEMORY   cluster only (defaults 1, TOTAL_CORES, 4g)
#   SHUFFLE_PARTITIONS       for the dictionary and train jobs (default 4 x TOTAL_CORES)
#   TEST_SHUFFLE_PARTITIONS  for the test and validation jobs (default TOTAL_CORES)
#   MAX_PARTITION_BYTES      input split size (default 1g; Spark still splits to use every core)
#   SPARK_LOCAL_DIRS         shuffle scratch space (default /data/dlrm/spark/tmp)
#   SPARK_DRIVER_JAVA_OPTIONS  extra JVM options of the driver (none; e.g. -XX:TieredStopAtLevel=1
#                            makes small local runs start faster)
#   SPARK_NETWORK_TIMEOUT    seconds before a silent executor counts as lost and its tasks run
#                            elsewhere (default 120, at least 20)
#   NUM_DAYS (24), STRICT (0), RANDOM_SEED (12345), BROADCAST_MAX_ROWS (1000000), PYTHON (python3)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
[[ "${1:-}" == "-h" || "${1:-}" == "--help" ]] && { print_usage "$0"; exit 0; }

INPUT_PATH="${1:-/data/dlrm/criteo}"
OUTPUT_PATH="${2:-/data/dlrm/spark/output}"
FREQUENCY_LIMIT="${3:-15}"

TOTAL_CORES="${TOTAL_CORES:-$(nproc)}"
DRIVER_MEMORY="${DRIVER_MEMORY:-8g}"
NUM_EXECUTORS="${NUM_EXECUTORS:-1}"
EXECUTOR_CORES="${EXECUTOR_CORES:-$TOTAL_CORES}"
EXECUTOR_MEMORY="${EXECUTOR_MEMORY:-4g}"
SPARK_MASTER="${SPARK_MASTER:-local[$TOTAL_CORES]}"
SHUFFLE_PARTITIONS="${SHUFFLE_PARTITIONS:-$((4 * TOTAL_CORES))}"
TEST_SHUFFLE_PARTITIONS="${TEST_SHUFFLE_PARTITIONS:-$TOTAL_CORES}"
MAX_PARTITION_BYTES="${MAX_PARTITION_BYTES:-1g}"
export SPARK_LOCAL_DIRS="${SPARK_LOCAL_DIRS:-/data/dlrm/spark/tmp}"

set_spark_submit_args
run_criteo_spark_jobs "$INPUT_PATH" "$OUTPUT_PATH" "$FREQUENCY_LIMIT"
