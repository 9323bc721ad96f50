# shellcheck shell=bash
# Shared by the preprocessing scripts (sourced, not run): settings, spark-submit lookup and the
# sequence of Spark jobs that both run_spark_cpu.sh and run_spark_gpu.sh perform.

PREPROC_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON="${PYTHON:-python3}"
NUM_DAYS="${NUM_DAYS:-24}"
STRICT="${STRICT:-0}"
RANDOM_SEED="${RANDOM_SEED:-12345}"
BROADCAST_MAX_ROWS="${BROADCAST_MAX_ROWS:-1000000}"

# Bad input or a missing prerequisite: one error line, exit 2 (the convention of cli.py).
die() {
    echo "error: $*" >&2
    exit 2
}

# Prints the usage block: the leading comment of the calling script, without the '# '.
print_usage() {
    sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$1"
}

require_num_days() {
    [[ "$NUM_DAYS" =~ ^[0-9]+$ && "$NUM_DAYS" -ge 2 ]] \
        || die "NUM_DAYS must be an integer >= 2 (days 0..N-2 train, day N-1 test/validation), got '$NUM_DAYS'"
}

# One line that identifies a run (input, NUM_DAYS, threshold, seed): a finished output with the same line can be reused.
spark_params_stamp() {
    local input_path="$1" frequency_limit="$2"
    echo "input=$(cd "$input_path" && pwd) num_days=$NUM_DAYS frequency_limit=$frequency_limit seed=$RANDOM_SEED"
}

spark_output_complete() {
    local output_path="$1" stamp="$2" split
    for split in train validation test; do
        [[ -f "$output_path/$split/_SUCCESS" ]] || return 1
    done
    [[ -f "$output_path/_PARAMS" && "$(cat "$output_path/_PARAMS")" == "$stamp" ]]
}

# SPARK_HOME from the environment, else the pyspark package of $PYTHON.
find_spark_home() {
    if [[ -z "${SPARK_HOME:-}" ]]; then
        SPARK_HOME="$("$PYTHON" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))' 2>/dev/null)" \
            || die "no Spark found: set SPARK_HOME or install pyspark for $PYTHON (pip install pyspark)"
    fi
    [[ -x "$SPARK_HOME/bin/spark-submit" ]] || die "$SPARK_HOME/bin/spark-submit not found (check SPARK_HOME)"
    export SPARK_HOME
}

# The generated code of one Criteo row (40 fields, the shuffle key, 26 dictionary joins) is one Java
# method of more than 8,000 bytecodes, which HotSpot by default leaves to the interpreter: about half
# the Spark engine's time on 2.4M lines. Driver and executors compile it.
HUGE_METHOD_JIT="-XX:-DontCompileHugeMethods"

# Sets SPARK_SUBMIT_ARGS from the resource variables both pipelines define (SPARK_MASTER,
# DRIVER_MEMORY, NUM_EXECUTORS, EXECUTOR_CORES, EXECUTOR_MEMORY, MAX_PARTITION_BYTES, SPARK_LOCAL_DIRS)
# and SPARK_NETWORK_TIMEOUT: how long the driver waits for a silent executor (no heartbeat, a shuffle
# fetch or an RPC without answer) before it counts the executor lost and runs its tasks elsewhere.
# A worker whose host drops off the network then costs that long, not a hung job.
set_spark_submit_args() {
    local network_timeout="${SPARK_NETWORK_TIMEOUT:-120}"
    if [[ ! "$network_timeout" =~ ^[0-9]{1,6}$ ]] || (( 10#$network_timeout < 20 )); then
        die "SPARK_NETWORK_TIMEOUT must be whole seconds, at least 20 (twice the executors' 10 s heartbeat), got '$network_timeout'"
    fi
    SPARK_SUBMIT_ARGS=(
        --master "$SPARK_MASTER"
        --driver-memory "$DRIVER_MEMORY"
        --conf "spark.executor.instances=$NUM_EXECUTORS"
        --conf "spark.executor.cores=$EXECUTOR_CORES"
        --conf "spark.executor.memory=$EXECUTOR_MEMORY"
        --conf "spark.executor.extraJavaOptions=$HUGE_METHOD_JIT"
        --conf "spark.cores.max=$((NUM_EXECUTORS * EXECUTOR_CORES))"
        --conf "spark.local.dir=$SPARK_LOCAL_DIRS"
        --conf "spark.sql.files.maxPartitionBytes=$MAX_PARTITION_BYTES"
        --conf "spark.driver.maxResultSize=2g"
        --conf "spark.locality.wait=0s"
        --conf "spark.network.timeout=$((10#$network_timeout))s"
        --conf "spark.network.timeoutInterval=10s"
        --conf "spark.ui.showConsoleProgress=false"
        --conf "spark.log.level=${SPARK_LOG_LEVEL:-WARN}"
    )
}

# Runs spark_data_utils.py (one Spark application for the whole run) with SPARK_SUBMIT_ARGS plus
# the extra spark-submit args in TRAIN_TRANSFORM_CONF (one string, optional).
spark_job() {
    local extra_args=()
    [[ -n "${TRAIN_TRANSFORM_CONF:-}" ]] && read -r -a extra_args <<<"$TRAIN_TRANSFORM_CONF"
    extra_args+=(--driver-java-options "$HUGE_METHOD_JIT${SPARK_DRIVER_JAVA_OPTIONS:+ $SPARK_DRIVER_JAVA_OPTIONS}")
    echo "+ spark-submit ... spark_data_utils.py $*" >&2
    PYSPARK_PYTHON="${PYSPARK_PYTHON:-$PYTHON}" PYSPARK_DRIVER_PYTHON="${PYSPARK_DRIVER_PYTHON:-$PYTHON}" \
        "$SPARK_HOME/bin/spark-submit" "${SPARK_SUBMIT_ARGS[@]}" \
        --conf "spark.sql.shuffle.partitions=$SHUFFLE_PARTITIONS" "${extra_args[@]}" \
        "$PREPROC_DIR/spark_data_utils.py" --write_mode overwrite "$@"
}

# Splits a day file by line count: the first floor(lines/2) lines and the rest.
split_last_day() {
    local day_file="$1" first_half="$2" second_half="$3" lines half
    lines="$(awk 'END { print NR }' "$day_file")"
    [[ "$lines" -ge 2 ]] || die "$day_file has $lines line(s); the last day needs at least 2 to split into test and validation"
    half=$((lines / 2))
    head -n "$half" "$day_file" >"$first_half"
    tail -n "+$((half + 1))" "$day_file" >"$second_half"
    echo "split $day_file: $half lines -> test, $((lines - half)) lines -> validation" >&2
}

# Replaces the folder $1 by the complete folder $2 (same file system): the old one is moved aside,
# the new one renamed in, then the old one deleted; if the rename fails, the old one is put back.
replace_folder() {
    local final="$1" staging="$2" old="$2.old"
    rm -rf "$old"
    if [[ -e "$final" ]]; then
        mv "$final" "$old"
    fi
    if ! mv "$staging" "$final"; then
        [[ -e "$old" ]] && mv "$old" "$final"
        echo "error: could not move $staging to $final" >&2
        exit 1
    fi
    rm -rf "$old"
}

# The topmost of folder $1 and its parents that does not exist yet (empty when $1 exists): what
# `mkdir -p "$1"` creates, for remove_created_folders.
first_missing_folder() {
    local path top=""
    path="$(realpath -m "$1")"
    while [[ ! -e "$path" ]]; do
        top="$path"
        path="$(dirname "$path")"
    done
    echo "$top"
}

# Removes folder $1 and its parents up to $2 (first_missing_folder's answer; none when empty)
# while they are empty: a run leaves no folder it created for nothing.
remove_created_folders() {
    local dir top="$2"
    [[ -n "$top" ]] || return 0
    dir="$(realpath -m "$1")"
    while [[ "$dir" == "$top" || "$dir" == "$top"/* ]] && rmdir "$dir" 2>/dev/null; do
        dir="$(dirname "$dir")"
    done
}

# Sets an EXIT trap that runs the command string $1, and makes Ctrl-C and TERM exit through it.
on_exit() {
    # shellcheck disable=SC2064
    trap "$1" EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
}

# The Spark run (reference §5.2: dictionaries over all days, train, then the last day's halves as
# test and validation) in one Spark application, written to OUTPUT.partial and renamed into place.
# Needs SPARK_SUBMIT_ARGS, SHUFFLE_PARTITIONS, TEST_SHUFFLE_PARTITIONS; TRAIN_TRANSFORM_CONF optional.
run_criteo_spark_jobs() {
    local input_path="$1" output_path="$2" frequency_limit="$3"
    require_num_days
    find_spark_home
    "$PYTHON" "$PREPROC_DIR/check_paths.py" spark "$input_path" "$output_path" || exit 2
    local last_day=$((NUM_DAYS - 1))
    local staging="${output_path%/}.partial" halves="${output_path%/}.halves"
    local strict_flag=() parent created
    [[ "$STRICT" == 1 ]] && strict_flag=(--strict)
    rm -rf "$staging" "$halves"
    parent="$(dirname "$staging")"
    created="$(first_missing_folder "$parent")"
    on_exit "rm -rf '$staging' '$halves'; remove_created_folders '$parent' '$created'"
    mkdir -p "$staging" "$halves/test" "$halves/validation" "${SPARK_LOCAL_DIRS:?}"

    split_last_day "$input_path/day_$last_day" "$halves/test/day_$last_day" "$halves/validation/day_$last_day"
    spark_job --input_folder "$input_path" --num_days "$NUM_DAYS" --halves_folder "$halves" \
        --output_folder "$staging" --frequency_limit "$frequency_limit" --random_seed "$RANDOM_SEED" \
        --broadcast_max_rows "$BROADCAST_MAX_ROWS" --partitions "$SHUFFLE_PARTITIONS" \
        --test_partitions "$TEST_SHUFFLE_PARTITIONS" --progress_interval "${PROGRESS_INTERVAL:-10}" "${strict_flag[@]}"
    rm -rf "$halves"
    spark_params_stamp "$input_path" "$frequency_limit" >"$staging/_PARAMS"
    replace_folder "$output_path" "$staging"
    trap - EXIT INT TERM
    echo "Spark output complete: $output_path" >&2
}
