#!/usr/bin/env bash
# Spark GPU discovery script: prints the visible GPUs as {"name": "gpu", "addresses": ["0", ...]}.
set -euo pipefail
addresses="$(nvidia-smi --query-gpu=index --format=csv,noheader | sed 's/.*/"&"/' | paste -sd, -)"
echo "{\"name\": \"gpu\", \"addresses\": [$addresses]}"
