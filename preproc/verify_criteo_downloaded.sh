#!/usr/bin/env bash
# Usage: verify_criteo_downloaded.sh [DOWNLOAD_DIR]
#
# Checks that DOWNLOAD_DIR (default /data/dlrm/criteo) holds the uncompressed, non-empty Criteo day
# files day_0 .. day_{NUM_DAYS-1} (NUM_DAYS defaults to 24). Reports every missing or empty file
# in one error and exits 1; prints nothing else but a one-line confirmation.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
[[ "${1:-}" == "-h" || "${1:-}" == "--help" ]] && { print_usage "$0"; exit 0; }

DOWNLOAD_DIR="${1:-/data/dlrm/criteo}"
require_num_days
[[ -d "$DOWNLOAD_DIR" ]] || die "download directory $DOWNLOAD_DIR does not exist"

problems=()
for ((day = 0; day < NUM_DAYS; day++)); do
    file="$DOWNLOAD_DIR/day_$day"
    if [[ ! -f "$file" ]]; then
        if [[ -f "$file.gz" ]]; then
            problems+=("$file is missing ($file.gz is there: decompress it with gunzip)")
        else
            problems+=("$file is missing")
        fi
    elif [[ ! -s "$file" ]]; then
        problems+=("$file is empty")
    fi
done
if ((${#problems[@]})); then
    printf -v listing '\n  %s' "${problems[@]}"
    die "Criteo input incomplete (NUM_DAYS=$NUM_DAYS, expecting day_0..day_$((NUM_DAYS - 1))):$listing"
fi
echo "Criteo input complete: day_0..day_$((NUM_DAYS - 1)) in $DOWNLOAD_DIR"
