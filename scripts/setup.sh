#!/usr/bin/env bash
# Idempotent environment setup: Debian packages, the .venv from requirements.txt, and Horovod
# 0.28.1 built once from its PyPI sdist and cached as a wheel outside the repository.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: scripts/setup.sh [--help]

Installs only what is missing:
  * Debian packages (cmake g++ openmpi slurm munge openjdk-17) when running as root;
  * the virtualenv .venv from requirements.txt (pip is a no-op when the pins are met);
  * Horovod 0.28.1 with TensorFlow + Gloo + MPI (+ NCCL when nvcc and a GPU are present),
    built from the PyPI sdist once and cached under $DLRM_CACHE_DIR (default ~/.cache/dlrm-tf2).
  * the custom dot-interaction op (CPU kernels; CUDA kernels too on CUDA hosts).
Environment: PYTHON (default python3.11 or python3), DLRM_CACHE_DIR, DLRM_SKIP_APT=1.
USAGE
}
if [[ "${1:-}" == "--help" || "${1:-}" == "-h" ]]; then usage; exit 0; fi

REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${REPO_DIR}/.venv"
CACHE_DIR="${DLRM_CACHE_DIR:-${HOME}/.cache/dlrm-tf2}"
HOROVOD_VERSION="0.28.1"
APT_PACKAGES=(cmake g++ make openmpi-bin libopenmpi-dev openjdk-17-jre-headless
              slurmctld slurmd slurm-client munge)

log() { printf '[setup] %s\n' "$*"; }

install_debian_packages() {
  if [[ "${DLRM_SKIP_APT:-0}" == "1" ]]; then log "DLRM_SKIP_APT=1: skipping Debian packages"; return; fi
  if ! command -v dpkg-query >/dev/null; then log "not a Debian system: install ${APT_PACKAGES[*]} yourself"; return; fi
  local missing=()
  for pkg in "${APT_PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "${pkg}" 2>/dev/null | grep -q "install ok installed"; then
      missing+=("${pkg}")
    fi
  done
  if [[ ${#missing[@]} -eq 0 ]]; then log "Debian packages present"; return; fi
  if [[ "$(id -u)" != "0" ]]; then
    echo "[setup] error: missing Debian packages ${missing[*]}; run as root or install them" >&2; exit 1
  fi
  log "installing Debian packages: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

pick_python() {
  if [[ -n "${PYTHON:-}" ]]; then echo "${PYTHON}"; return; fi
  if command -v python3.11 >/dev/null; then echo python3.11; else echo python3; fi
}

create_venv() {
  if [[ ! -x "${VENV}/bin/python" ]]; then
    log "creating ${VENV}"
    "$(pick_python)" -m venv "${VENV}"
  fi
  local stamp="${VENV}/.requirements.sha256"
  local want
  want="$(sha256sum "${REPO_DIR}/requirements.txt" | cut -d' ' -f1)"
  if [[ -f "${stamp}" && "$(cat "${stamp}")" == "${want}" ]]; then
    log "Python requirements up to date"
  else
    log "installing Python requirements"
    "${VENV}/bin/pip" install -q --disable-pip-version-check -r "${REPO_DIR}/requirements.txt"
    echo "${want}" > "${stamp}"
  fi
}

have_cuda() { command -v nvcc >/dev/null && command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; }

install_horovod() {
  local py="${VENV}/bin/python"
  if "${py}" -c "import horovod.tensorflow" >/dev/null 2>&1 \
     && [[ "$("${py}" -c 'import horovod; print(horovod.__version__)')" == "${HOROVOD_VERSION}" ]]; then
    log "Horovod ${HOROVOD_VERSION} present"; return
  fi
  local tf_version flavour wheel_dir
  tf_version="$("${py}" -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null)"
  flavour="cpu"; if have_cuda; then flavour="nccl"; fi
  wheel_dir="${CACHE_DIR}/wheels/horovod-${HOROVOD_VERSION}-tf${tf_version}-${flavour}"
  if ! ls "${wheel_dir}"/horovod-*.whl >/dev/null 2>&1; then
    log "building Horovod ${HOROVOD_VERSION} from the sdist (about 6 minutes, once)"
    mkdir -p "${wheel_dir}"
    local gpu_env=()
    if [[ "${flavour}" == "nccl" ]]; then gpu_env=(HOROVOD_GPU_OPERATIONS=NCCL); fi
    env "${gpu_env[@]}" HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 \
        HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS="-j$(nproc)" \
        "${VENV}/bin/pip" wheel -q --no-build-isolation --no-deps --no-binary horovod \
        "horovod==${HOROVOD_VERSION}" -w "${wheel_dir}"
  else
    log "using cached Horovod wheel from ${wheel_dir}"
  fi
  "${VENV}/bin/pip" install -q --disable-pip-version-check --no-deps "${wheel_dir}"/horovod-*.whl
}

build_interaction_op() {
  local op_dir="${REPO_DIR}/tensorflow-dot-based-interact"
  if [[ -f "${op_dir}/Makefile" ]]; then
    log "building the dot-interaction op (CUDA kernels too when nvcc and a CUDA build of TF are present)"
    make -s -C "${op_dir}" PYTHON="${VENV}/bin/python"
  fi
}

install_debian_packages
create_venv
install_horovod
build_interaction_op
"${VENV}/bin/pip" check
log "done"
