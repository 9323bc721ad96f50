#!/usr/bin/env bash
# Shared by scripts/demo.sh and scripts/demo_wd.sh (sourced): the demo environment and the rule that
# a demo replaces only its own earlier output.

# The demo environment: the repository's .venv and modules, one thread per process, Open MPI as root.
demo_environment() {
  local repo_dir="$1"
  export PATH="${repo_dir}/.venv/bin:${PATH}" PYTHONPATH="${repo_dir}" OMP_NUM_THREADS=1 TF_CPP_MIN_LOG_LEVEL=2
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
}

# An empty output folder DIR holding MARKER: an existing DIR is replaced only when it is an earlier
# demo's output (it holds MARKER) or empty; anything else is refused (exit 2).
demo_fresh_dir() {
  local dir="$1" marker="$2"
  if [[ -e "${dir}" ]]; then
    if [[ -f "${marker}" || -z "$(ls -A "${dir}")" ]]; then
      rm -rf "${dir}"
    else
      echo "error: DEMO_DIR ${dir} exists and is not an earlier demo's output; refusing to delete it" >&2
      exit 2
    fi
  fi
  mkdir -p "${dir}"
  touch "${marker}"
}

# NAME's VALUE as the demo uses it: an integer of at least MINIMUM, else one error line (exit 2).
demo_require_integer() {
  local name="$1" value="$2" minimum="$3"
  if [[ ! "${value}" =~ ^[0-9]+$ ]] || (( value < minimum )); then
    echo "error: ${name} must be an integer >= ${minimum}, got '${value}'" >&2
    exit 2
  fi
}
