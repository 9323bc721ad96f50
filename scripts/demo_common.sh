#!/usr/bin/env bash
# Shared by scripts/demo.sh and scripts/demo_wd.sh (sourced): the demo environment and the rule that
# a demo replaces only its own earlier output (a manifest of what it wrote).

# The demo environment: the repository's .venv and modules, one thread per process, Open MPI as root.
demo_environment() {
  local repo_dir="$1"
  export PATH="${repo_dir}/.venv/bin:${PATH}" PYTHONPATH="${repo_dir}" OMP_NUM_THREADS=1 TF_CPP_MIN_LOG_LEVEL=2
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
}

# Every path below DIR but MANIFEST (and its temporary), relative, NUL-separated, sorted.
demo_listing() {
  local dir="$1" name
  name="$(basename "$2")"
  find "${dir}" -mindepth 1 -printf '%P\0' | { grep -zvxF -e "${name}" -e "${name}.tmp" || true; } | LC_ALL=C sort -z
}

# The first NUL-separated path of standard input ('' if none), read whole so that no writer gets SIGPIPE.
demo_first() {
  local first=""
  IFS= read -r -d '' first || true
  cat > /dev/null
  printf '%s' "${first}"
}

# The EXIT trap of demo_fresh_dir: MANIFEST lists every path below DIR, all of them this run's (DIR was
# empty when it began), whether the demo finished, failed or was stopped.
demo_write_manifest() {
  demo_listing "${DEMO_MANIFEST_DIR}" "${DEMO_MANIFEST}" > "${DEMO_MANIFEST}.tmp" \
    && mv -f "${DEMO_MANIFEST}.tmp" "${DEMO_MANIFEST}"
}

# An empty output folder DIR whose paths the demo records in MANIFEST when it exits. An existing DIR
# is emptied only of what an earlier run of this demo wrote (the paths its MANIFEST lists); a path
# it does not list (a copied checkpoint, notes) makes the demo refuse, naming it, with nothing
# deleted (one error line, exit 2); so does a non-empty DIR without MANIFEST.
demo_fresh_dir() {
  local dir="$1" manifest="$2" foreign entry
  if [[ -d "${dir}" && -n "$(ls -A "${dir}")" ]]; then
    if [[ ! -f "${manifest}" ]]; then
      foreign="$(find "${dir}" -mindepth 1 -maxdepth 1 -printf '%P\0' | LC_ALL=C sort -z | demo_first)"
      echo "error: DEMO_DIR ${dir} exists and is not an earlier demo's output; refusing to delete it (it holds" \
           "${dir}/${foreign}, and no $(basename "${manifest}") lists what a demo wrote there)" >&2
      exit 2
    fi
    foreign="$(LC_ALL=C comm -z -23 <(demo_listing "${dir}" "${manifest}") <(LC_ALL=C sort -z "${manifest}") \
               | demo_first)"
    if [[ -n "${foreign}" ]]; then
      echo "error: DEMO_DIR ${dir} holds ${dir}/${foreign}, which no earlier run of this demo wrote; refusing to" \
           "delete anything (move it away or choose another DEMO_DIR)" >&2
      exit 2
    fi
    while IFS= read -r -d '' entry; do  # every path below DIR is listed: remove the top-level ones
      if [[ "${entry}" != */* ]]; then rm -rf "${dir:?}/${entry}"; fi
    done < "${manifest}"
    rm -f "${manifest}"
  fi
  mkdir -p "${dir}"
  DEMO_MANIFEST_DIR="${dir}" DEMO_MANIFEST="${manifest}"
  trap demo_write_manifest EXIT
  # bash runs no EXIT trap when a signal kills it: a stop signal exits 128 + N instead (once the step
  # running finishes; it got the signal too), running the trap
  trap 'exit 129' HUP
  trap 'exit 130' INT
  trap 'exit 143' TERM
}

# NAME's VALUE as the demo uses it: an integer of at least MINIMUM, else one error line (exit 2).
demo_require_integer() {
  local name="$1" value="$2" minimum="$3"
  if [[ ! "${value}" =~ ^[0-9]+$ ]] || (( value < minimum )); then
    echo "error: ${name} must be an integer >= ${minimum}, got '${value}'" >&2
    exit 2
  fi
}
