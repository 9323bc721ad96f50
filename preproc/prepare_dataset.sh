#!/usr/bin/env bash
# Usage: prepare_dataset.sh [--strict] [--engine duckdb|spark] <DGX2|CPU> <frequency_threshold>
#
# Criteo day files -> split-binary training data (feature_spec.yaml, train/, test/, validation/).
# First, for CPU, one line with the run's expected time, peak disk and peak memory (estimate.py).
# Two engines, same rules and the same bytes in every output file:
#   duckdb  embedded, one process, no JVM (default for CPU when SPARK_MASTER is unset and $PYTHON
#           has the duckdb package):
#           duckdb_pipeline.py writes final_output_dir directly (skipped when it holds a run with
#           the same input, NUM_DAYS, threshold and seed); spark_output_path is not used
#   spark   clusters and GPUs (default for DGX2 or when SPARK_MASTER is set):
#   1. verify_criteo_downloaded.sh: day_0 .. day_{NUM_DAYS-1} exist and are not empty
#   2. run_spark.sh: dictionaries + transform (skipped when spark_output_path already holds a
#      finished run with the same input, NUM_DAYS, threshold and seed)
#   3. parquet_to_binary.py + split_dataset.py into final_output_dir (skipped when it is newer
#      than the Spark output it was built from)
# The four folders below must not overlap, and the Spark output and final folders may only hold
# earlier outputs of this pipeline (both are checked before anything runs). Every step writes to
# a temporary folder and renames it into place, so a failed or interrupted run leaves no
# half-written output. frequency_threshold: N, or a comma list with col:N items (col = 14..39).
#
# Environment (defaults as the reference):
#   download_dir                 raw day files (/data/dlrm/criteo)
#   spark_output_path            Spark parquet output (/data/dlrm/spark/output)
#   conversion_intermediate_dir  scratch for the binary conversion (/data/dlrm/intermediate_binary)
#   final_output_dir             the dataset (/data/dlrm/binary_dataset)
#   NUM_DAYS                     number of day files (24); the last one becomes test + validation
#   STRICT=1                     same as --strict: stop at the first malformed line
#   PARALLEL_JOBS                parquet conversion processes (nproc)
#   PYTHON                       interpreter with duckdb or pyspark, pyarrow, numpy, pyyaml (python3)
#   ENGINE                       duckdb or spark (same as --engine)
#   RANDOM_SEED                  seed of the train shuffle (12345)
#   TOTAL_CORES                  threads of the duckdb engine (nproc)
#   DUCKDB_MEMORY_LIMIT          duckdb memory limit, e.g. 16GB (DuckDB's default: 80% of RAM);
#                                larger intermediate results spill to conversion_intermediate_dir
#   PROGRESS_INTERVAL            seconds between duckdb progress lines (10; 0: none)
#   and the resource variables of run_spark_cpu.sh / run_spark_gpu.sh (SPARK_MASTER, ...)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/common.sh"

while [[ "${1:-}" == -* ]]; do
    case "$1" in
        -h | --help) print_usage "$0"; exit 0 ;;
        --strict) STRICT=1; shift ;;
        --engine) [[ $# -ge 2 ]] || die "--engine needs a value: duckdb or spark"; ENGINE="$2"; shift 2 ;;
        --engine=*) ENGINE="${1#--engine=}"; shift ;;
        *) die "unknown option $1 (see --help)" ;;
    esac
done
[[ $# -eq 2 ]] || { print_usage "$0" >&2; exit 2; }
PLATFORM="$1"
FREQUENCY_THRESHOLD="$2"
[[ "$PLATFORM" == CPU || "$PLATFORM" == DGX2 ]] || die "unknown platform '$PLATFORM': use CPU or DGX2"
if [[ -z "${ENGINE:-}" ]]; then
    if [[ "$PLATFORM" == DGX2 || -n "${SPARK_MASTER:-}" ]]; then
        ENGINE=spark
    elif "$PYTHON" -c 'import duckdb' 2>/dev/null; then
        ENGINE=duckdb
    else
        ENGINE=spark
        echo "note: $PYTHON has no duckdb (pip install duckdb), so the Spark engine runs" >&2
    fi
fi
[[ "$ENGINE" == duckdb || "$ENGINE" == spark ]] || die "unknown engine '$ENGINE': use duckdb or spark"
[[ "$ENGINE" == spark || "$PLATFORM" == CPU ]] || die "the duckdb engine runs on CPUs only: use --engine spark with DGX2"
# duckdb_pipeline.py itself says when $PYTHON lacks duckdb (no second interpreter start here).

download_dir="${download_dir:-/data/dlrm/criteo}"
spark_output_path="${spark_output_path:-/data/dlrm/spark/output}"
conversion_intermediate_dir="${conversion_intermediate_dir:-/data/dlrm/intermediate_binary}"
final_output_dir="${final_output_dir:-/data/dlrm/binary_dataset}"
PARALLEL_JOBS="${PARALLEL_JOBS:-$(nproc)}"
export NUM_DAYS STRICT PYTHON

"$HERE/verify_criteo_downloaded.sh" "$download_dir"
"$PYTHON" "$HERE/check_paths.py" dataset "$download_dir" "$spark_output_path" "$conversion_intermediate_dir" \
    "$final_output_dir" || exit 2

# The run's expected time, peak disk and memory (preproc/estimate.py, from the measured rates), before it starts.
print_estimate() {
    local args=(--input_folder "$download_dir" --num_days "$NUM_DAYS" --engine "$ENGINE" --cores "${TOTAL_CORES:-$(nproc)}")
    [[ "$ENGINE" == duckdb && -n "${DUCKDB_MEMORY_LIMIT:-}" ]] && args+=(--memory_limit "$DUCKDB_MEMORY_LIMIT")
    if [[ "$ENGINE" == spark && -n "${SPARK_MASTER:-}" && "$SPARK_MASTER" != local* ]]; then
        args+=(--cluster_cores "$((${NUM_EXECUTORS:-1} * ${EXECUTOR_CORES:-${TOTAL_CORES:-$(nproc)}}))")
    fi
    "$PYTHON" "$HERE/estimate.py" "${args[@]}"
}
[[ "$PLATFORM" == CPU ]] && { require_num_days; print_estimate; }

# A fresh scratch folder inside conversion_intermediate_dir, removed at the end (and
# conversion_intermediate_dir and its parents too where this run created them).
make_scratch() {
    intermediate_created="$(first_missing_folder "$conversion_intermediate_dir")"
    mkdir -p "$conversion_intermediate_dir"
    scratch="$(mktemp -d "${conversion_intermediate_dir%/}/.conversion.XXXXXX")"
    on_exit remove_scratch
}
remove_scratch() {
    rm -rf "$scratch"
    remove_created_folders "$conversion_intermediate_dir" "$intermediate_created"
}

if [[ "$ENGINE" == duckdb ]]; then
    require_num_days
    make_scratch
    duckdb_args=(--input_folder "$download_dir" --num_days "$NUM_DAYS" --frequency_limit "$FREQUENCY_THRESHOLD"
                 --output "$final_output_dir" --scratch_dir "$scratch/duckdb" --random_seed "$RANDOM_SEED"
                 --threads "${TOTAL_CORES:-$(nproc)}" --progress_interval "${PROGRESS_INTERVAL:-10}" --overwrite
                 --reuse --params "engine=duckdb $(spark_params_stamp "$download_dir" "$FREQUENCY_THRESHOLD")")
    [[ "$STRICT" == 1 ]] && duckdb_args+=(--strict)
    [[ -n "${DUCKDB_MEMORY_LIMIT:-}" ]] && duckdb_args+=(--memory_limit "$DUCKDB_MEMORY_LIMIT")
    "$PYTHON" "$HERE/duckdb_pipeline.py" "${duckdb_args[@]}"
    echo "Dataset ready: $final_output_dir (rejected lines are counted in $final_output_dir/preprocessing_summary.json)"
    exit 0
fi

if spark_output_complete "$spark_output_path" "$(spark_params_stamp "$download_dir" "$FREQUENCY_THRESHOLD")"; then
    echo "Reusing the Spark output in $spark_output_path (same input, NUM_DAYS, threshold and seed)"
else
    "$HERE/run_spark.sh" "$PLATFORM" "$download_dir" "$spark_output_path" "$FREQUENCY_THRESHOLD"
fi

summary="$final_output_dir/preprocessing_summary.json"
if [[ -f "$final_output_dir/feature_spec.yaml" && "$summary" -nt "$spark_output_path/_PARAMS" ]]; then
    echo "Reusing the dataset in $final_output_dir (built from the current Spark output)"
    exit 0
fi

# split_dataset.py replaces final_output_dir only once the new dataset is complete.
make_scratch
"$PYTHON" "$HERE/parquet_to_binary.py" --parallel_jobs "$PARALLEL_JOBS" --src_dir "$spark_output_path" \
    --intermediate_dir "$scratch/parts" --dst_dir "$scratch/packed"
cp "$spark_output_path/model_size.json" "$scratch/packed/"
"$PYTHON" "$HERE/split_dataset.py" --dataset "$scratch/packed" --output "$final_output_dir" --overwrite \
    --spark_summary_dir "$spark_output_path/summary"
echo "Dataset ready: $final_output_dir (rejected lines are counted in $summary)"
