#!/usr/bin/env bash
# Usage: run_spark_gpu.sh [INPUT_PATH] [OUTPUT_PATH] [FREQUENCY_LIMIT] [HARDWARE_PLATFORM]
#
# The same Spark jobs as run_spark_cpu.sh, accelerated by the RAPIDS Accelerator for Apache Spark.
# HARDWARE_PLATFORM must be DGX2 (resources from dgx2_config.sh, each overridable by environment).
# Defaults: INPUT_PATH=/data/dlrm/criteo OUTPUT_PATH=/data/dlrm/spark/output FREQUENCY_LIMIT=15
#
# Environment:
#   RAPIDS_JAR        the rapids-4-spark jar (default: $SPARK_HOME/jars/rapids-4-spark_*.jar)
#   SPARK_MASTER      master URL (default local[TOTAL_CORES])
#   GPU_DISCOVERY_SCRIPT  prints the visible GPUs (default: get_gpu_resources.sh beside this script)
#   SHUFFLE_PARTITIONS (600), TEST_SHUFFLE_PARTITIONS (30), SPARK_LOCAL_DIRS (/data/dlrm/spark/tmp),
#   NUM_DAYS (24), STRICT (0), RANDOM_SEED (12345), BROADCAST_MAX_ROWS (1000000), PYTHON (python3)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/common.sh"
[[ "${1:-}" == "-h" || "${1:-}" == "--help" ]] && { print_usage "$0"; exit 0; }

INPUT_PATH="${1:-/data/dlrm/criteo}"
OUTPUT_PATH="${2:-/data/dlrm/spark/output}"
FREQUENCY_LIMIT="${3:-15}"
HARDWARE_PLATFORM="${4:-DGX2}"
[[ "$HARDWARE_PLATFORM" == DGX2 ]] || die "unsupported hardware platform '$HARDWARE_PLATFORM' (only DGX2)"
source "$HERE/dgx2_config.sh"

find_spark_home
if [[ -z "${RAPIDS_JAR:-}" ]]; then
    RAPIDS_JAR="$(compgen -G "$SPARK_HOME/jars/rapids-4-spark_*.jar" | head -n 1 || true)"
fi
[[ -n "$RAPIDS_JAR" && -f "$RAPIDS_JAR" ]] || die "the RAPIDS Accelerator for Apache Spark jar was not found.
Install rapids-4-spark_2.13-<version>.jar (Maven: com.nvidia:rapids-4-spark_2.13, matching Spark $("$PYTHON" -c 'import pyspark; print(pyspark.__version__)' 2>/dev/null || echo '?') and your CUDA)
into $SPARK_HOME/jars, or set RAPIDS_JAR to its path; or run the CPU pipeline: prepare_dataset.sh CPU <frequency_threshold>"

SPARK_MASTER="${SPARK_MASTER:-local[$TOTAL_CORES]}"
SHUFFLE_PARTITIONS="${SHUFFLE_PARTITIONS:-600}"
TEST_SHUFFLE_PARTITIONS="${TEST_SHUFFLE_PARTITIONS:-30}"
GPU_DISCOVERY_SCRIPT="${GPU_DISCOVERY_SCRIPT:-$HERE/get_gpu_resources.sh}"
export SPARK_LOCAL_DIRS="${SPARK_LOCAL_DIRS:-/data/dlrm/spark/tmp}"

DRIVER_MEMORY="${DRIVER_MEMORY_GB}g"
EXECUTOR_MEMORY="${EXECUTOR_MEMORY_GB}g"
MAX_PARTITION_BYTES="${MAX_PARTITION_BYTES:-1g}"
set_spark_submit_args
SPARK_SUBMIT_ARGS+=(
    --jars "$RAPIDS_JAR"
    --conf "spark.plugins=com.nvidia.spark.SQLPlugin"
    --conf "spark.rapids.sql.concurrentGpuTasks=2"
    --conf "spark.rapids.sql.reader.batchSizeRows=4000000"
    --conf "spark.rapids.memory.pinnedPool.size=16g"
    --conf "spark.rapids.sql.incompatibleOps.enabled=true"
    --conf "spark.sql.autoBroadcastJoinThreshold=1g"
    --conf "spark.executor.resource.gpu.amount=1"
    --conf "spark.executor.resource.gpu.discoveryScript=$GPU_DISCOVERY_SCRIPT"
    --conf "spark.driver.resource.gpu.amount=1"
    --conf "spark.driver.resource.gpu.discoveryScript=$GPU_DISCOVERY_SCRIPT"
    --conf "spark.task.resource.gpu.amount=0.01"
)
TRAIN_TRANSFORM_CONF="--conf spark.task.cpus=3"
run_criteo_spark_jobs "$INPUT_PATH" "$OUTPUT_PATH" "$FREQUENCY_LIMIT"
