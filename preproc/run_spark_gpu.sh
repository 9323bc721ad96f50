#!/usr/bin/env bash
# Usage: run_spark_gpu.sh [INPUT_PATH] [OUTPUT_PATH] [FREQUENCY_LIMIT] [HARDWARE_PLATFORM]
#
# The same Spark jobs as run_spark_cpu.sh, accelerated by the RAPIDS Accelerator for Apache Spark.
# As in the reference's DGX-2 setup, it starts a standalone Spark master on this host and one
# worker that holds every GPU, runs one executor per GPU (cores and memory split evenly, from
# dgx2_config.sh), and stops both when it ends, also on failure.
# HARDWARE_PLATFORM must be DGX2 (resources from dgx2_config.sh, each overridable by environment).
# Defaults: INPUT_PATH=/data/dlrm/criteo OUTPUT_PATH=/data/dlrm/spark/output FREQUENCY_LIMIT=15
#
# Environment:
#   RAPIDS_JAR        the rapids-4-spark jar (default: $SPARK_HOME/jars/rapids-4-spark_*.jar;
#                     the GPU preprocessing image, Dockerfile_spark_gpu, sets it)
#   SPARK_MASTER      unset: the standalone master and worker above; local[N]: local mode on one
#                     GPU (the first visible one); any other URL: an existing cluster whose
#                     workers offer GPUs (nothing is started or stopped)
#   NUM_GPUS          GPUs to use, one executor each (default: all that the discovery script lists)
#   GPU_DISCOVERY_SCRIPT  prints the GPUs as {"name": "gpu", "addresses": [...]} (default:
#                     get_gpu_resources.sh beside this script)
#   SPARK_MASTER_HOST ($(hostname)), SPARK_MASTER_PORT (7077), SPARK_MASTER_WEBUI_PORT (8080)
#   SPARK_LOG_DIR     master and worker logs (default: SPARK_LOCAL_DIRS/logs)
#   TOTAL_CORES (80), TOTAL_MEMORY_GB (800), DRIVER_MEMORY_GB (32), EXECUTOR_MEMORY_GB, and
#   SHUFFLE_PARTITIONS (600), TEST_SHUFFLE_PARTITIONS (30), SPARK_LOCAL_DIRS (/data/dlrm/spark/tmp),
#   SPARK_NETWORK_TIMEOUT    seconds before a silent executor counts as lost and its tasks run
#                            elsewhere (default 120, at least 20)
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

find_spark_home
SPARK_VERSION="$("$PYTHON" -c 'import pyspark; print(pyspark.__version__)' 2>/dev/null || echo '?')"
# The Scala build of this Spark (2.12 for Spark 3, 2.13 for Spark 4) names the plugin artifact.
SCALA_VERSION="$(compgen -G "$SPARK_HOME/jars/scala-library-*.jar" | head -n 1 | sed -n 's/.*scala-library-\([0-9]*\.[0-9]*\).*/\1/p' || true)"
if [[ -z "${RAPIDS_JAR:-}" ]]; then
    RAPIDS_JAR="$(compgen -G "$SPARK_HOME/jars/rapids-4-spark_*.jar" | head -n 1 || true)"
fi
[[ -n "$RAPIDS_JAR" && -f "$RAPIDS_JAR" ]] || die "the RAPIDS Accelerator for Apache Spark jar was not found.
Install rapids-4-spark_${SCALA_VERSION:-<scala>}-<version>.jar (Maven: com.nvidia:rapids-4-spark_${SCALA_VERSION:-<scala>}, a release that supports Spark $SPARK_VERSION)
into $SPARK_HOME/jars, or set RAPIDS_JAR to its path, or use the GPU preprocessing image (Dockerfile_spark_gpu);
or run the CPU pipeline: prepare_dataset.sh CPU <frequency_threshold>"

GPU_DISCOVERY_SCRIPT="${GPU_DISCOVERY_SCRIPT:-$HERE/get_gpu_resources.sh}"
if [[ "${SPARK_MASTER:-}" == local* ]]; then
    NUM_GPUS=1
else
    resources="$("$GPU_DISCOVERY_SCRIPT")" || die "GPU discovery failed: $GPU_DISCOVERY_SCRIPT"
    FOUND_GPUS="$("$PYTHON" -c 'import json, sys; print(len(json.load(sys.stdin)["addresses"]))' <<<"$resources")" \
        || die "$GPU_DISCOVERY_SCRIPT printed no Spark resource JSON: $resources"
    NUM_GPUS="${NUM_GPUS:-$FOUND_GPUS}"
    [[ "$NUM_GPUS" =~ ^[0-9]+$ && "$NUM_GPUS" -ge 1 && "$NUM_GPUS" -le "$FOUND_GPUS" ]] \
        || die "NUM_GPUS must be 1..$FOUND_GPUS (the GPUs $GPU_DISCOVERY_SCRIPT lists), got '$NUM_GPUS'"
fi
NUM_EXECUTORS="${NUM_EXECUTORS:-$NUM_GPUS}"
source "$HERE/dgx2_config.sh"

SHUFFLE_PARTITIONS="${SHUFFLE_PARTITIONS:-600}"
TEST_SHUFFLE_PARTITIONS="${TEST_SHUFFLE_PARTITIONS:-30}"
export SPARK_LOCAL_DIRS="${SPARK_LOCAL_DIRS:-/data/dlrm/spark/tmp}"
DRIVER_MEMORY="${DRIVER_MEMORY_GB}g"
EXECUTOR_MEMORY="${EXECUTOR_MEMORY_GB}g"
MAX_PARTITION_BYTES="${MAX_PARTITION_BYTES:-1g}"

# Standalone cluster of this host: the master, and one worker offering NUM_GPUS GPUs and the cores
# and memory of NUM_EXECUTORS executors. spark-daemon.sh ships with both the pyspark wheel and the
# Spark distribution.
export SPARK_LOG_DIR="${SPARK_LOG_DIR:-$SPARK_LOCAL_DIRS/logs}"
MASTER_CLASS=org.apache.spark.deploy.master.Master
WORKER_CLASS=org.apache.spark.deploy.worker.Worker
stop_cluster() {
    "$SPARK_HOME/sbin/spark-daemon.sh" stop "$WORKER_CLASS" 1 >/dev/null 2>&1 || true
    "$SPARK_HOME/sbin/spark-daemon.sh" stop "$MASTER_CLASS" 1 >/dev/null 2>&1 || true
}
start_cluster() {
    local host="${SPARK_MASTER_HOST:-$(hostname)}" port="${SPARK_MASTER_PORT:-7077}"
    SPARK_MASTER="spark://$host:$port"
    mkdir -p "$SPARK_LOG_DIR"
    trap stop_cluster EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    echo "starting $SPARK_MASTER with one worker: $NUM_GPUS GPUs, $NUM_EXECUTORS executors x $EXECUTOR_CORES cores, $EXECUTOR_MEMORY (logs in $SPARK_LOG_DIR)" >&2
    "$SPARK_HOME/sbin/spark-daemon.sh" start "$MASTER_CLASS" 1 --host "$host" --port "$port" \
        --webui-port "${SPARK_MASTER_WEBUI_PORT:-8080}" >&2
    SPARK_WORKER_OPTS="-Dspark.worker.resource.gpu.amount=$NUM_GPUS -Dspark.worker.resource.gpu.discoveryScript=$GPU_DISCOVERY_SCRIPT" \
        "$SPARK_HOME/sbin/spark-daemon.sh" start "$WORKER_CLASS" 1 --cores "$((NUM_EXECUTORS * EXECUTOR_CORES))" \
        --memory "$((NUM_EXECUTORS * EXECUTOR_MEMORY_GB))g" "$SPARK_MASTER" >&2
}

if [[ -z "${SPARK_MASTER:-}" ]]; then start_cluster; fi
set_spark_submit_args
SPARK_SUBMIT_ARGS+=(
    --jars "$RAPIDS_JAR"
    --conf "spark.plugins=com.nvidia.spark.SQLPlugin"
    --conf "spark.rapids.sql.concurrentGpuTasks=2"
    --conf "spark.rapids.sql.reader.batchSizeRows=4000000"
    --conf "spark.rapids.memory.pinnedPool.size=16g"
    --conf "spark.rapids.sql.incompatibleOps.enabled=true"
    --conf "spark.sql.autoBroadcastJoinThreshold=1g"
)
# Local mode has no executors: the plugin drives the first visible GPU from the driver.
if [[ "$SPARK_MASTER" != local* ]]; then
    SPARK_SUBMIT_ARGS+=(
        --conf "spark.executor.resource.gpu.amount=1"
        --conf "spark.executor.resource.gpu.discoveryScript=$GPU_DISCOVERY_SCRIPT"
        --conf "spark.task.resource.gpu.amount=0.01"
    )
fi
TRAIN_TRANSFORM_CONF="--conf spark.task.cpus=3"
# In a subshell: the jobs set their own EXIT trap (the staging folder), this one stops the cluster.
(run_criteo_spark_jobs "$INPUT_PATH" "$OUTPUT_PATH" "$FREQUENCY_LIMIT")
