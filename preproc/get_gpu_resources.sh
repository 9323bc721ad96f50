#!/usr/bin/env bash
# Usage: get_gpu_resources.sh
#
# Spark's GPU discovery script (spark.worker/executor.resource.gpu.discoveryScript): prints the
# GPUs that nvidia-smi lists as {"name": "gpu", "addresses": ["0", "1", ...]}.
set -euo pipefail
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
    sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"
    exit 0
fi
command -v nvidia-smi >/dev/null || { echo "error: nvidia-smi not found: this host has no NVIDIA driver" >&2; exit 1; }
indices="$(nvidia-smi --query-gpu=index --format=csv,noheader)" || { echo "error: nvidia-smi failed to list the GPUs" >&2; exit 1; }
addresses="$(awk 'NF { printf "%s\"%s\"", (n++ ? ", " : ""), $1 }' <<<"$indices")"
echo "{\"name\": \"gpu\", \"addresses\": [$addresses]}"
