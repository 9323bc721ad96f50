# shellcheck shell=bash
# Resources of one DGX-2 (80 cores, 16 GPUs, 800 GB usable), as in the reference; sourced by
# run_spark_gpu.sh. Every value can be overridden from the environment.
TOTAL_CORES="${TOTAL_CORES:-80}"
NUM_EXECUTORS="${NUM_EXECUTORS:-16}"
EXECUTOR_CORES="${EXECUTOR_CORES:-$((TOTAL_CORES / NUM_EXECUTORS))}"
TOTAL_MEMORY_GB="${TOTAL_MEMORY_GB:-800}"
DRIVER_MEMORY_GB="${DRIVER_MEMORY_GB:-32}"
EXECUTOR_MEMORY_GB="${EXECUTOR_MEMORY_GB:-$(((TOTAL_MEMORY_GB - DRIVER_MEMORY_GB) / NUM_EXECUTORS - 16))}"
