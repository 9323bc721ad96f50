#!/usr/bin/env bash
# Idempotent environment setup for a CPU or a GPU host: Debian packages, the .venv from
# requirements.txt + requirements-dev.txt, Horovod 0.28.1 built once from its PyPI sdist and
# cached as a wheel outside the repository (one wheel per host kind), the dot-interaction op, and
# the serving environment .venv-serving from requirements-serving.txt (no TensorFlow).
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: scripts/setup.sh [--plan] [--help]

Installs only what is missing:
  * Debian packages (cmake g++ g++-11 openmpi slurm munge openjdk-17 numactl openssh) when running as root;
  * the virtualenv .venv from requirements.txt and requirements-dev.txt (skipped while their
    hash and the host kind match the last install); on a GPU host tensorflow[and-cuda]
    replaces tensorflow-cpu at the same version (never both: the other one is removed first);
  * Horovod 0.28.1 with TensorFlow + Gloo + MPI, and NCCL on a GPU host, built from the PyPI
    sdist once per host kind and cached under $DLRM_CACHE_DIR (default ~/.cache/dlrm-tf2);
    a fresh install is checked with `horovodrun --check-build` (NCCL must be listed on GPUs);
  * the custom dot-interaction op: `make cpu`, or `make gpu` (CUDA kernels) on a GPU host; a fresh
    clone copies the library an earlier setup built from the same sources and tools (cached under
    $DLRM_CACHE_DIR/op);
  * the project's packages (recsys/, wide_and_deep/) linked into the venv's site-packages, so that
    `cd wide_and_deep && python main.py` imports them; the repository root stays off the import path;
  * the serving virtualenv .venv-serving from requirements-serving.txt (Triton via nvidia-pytriton,
    ONNX Runtime, tritonclient; no TensorFlow), made from the Debian python3 whose libpython the
    Triton Python backend links (skipped while the file's hash matches the last install).

  --plan   print what would be installed for this host kind, change nothing

Environment:
  DLRM_GPU=1|0   treat the host as a GPU / CPU host (default: GPU when `nvidia-smi -L` lists one)
  PYTHON         interpreter for a new .venv (default python3.11, else python3)
  CUDA_HOME      CUDA 12 toolkit for the GPU Horovod build (default: the one of `nvcc` on PATH)
  DLRM_CACHE_DIR, DLRM_SKIP_APT=1
USAGE
}

PLAN=0
case "${1:-}" in
  -h | --help) usage; exit 0 ;;
  --plan) PLAN=1 ;;
  "") ;;
  *) echo "[setup] error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
esac

REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${REPO_DIR}/.venv"
CACHE_DIR="${DLRM_CACHE_DIR:-${HOME}/.cache/dlrm-tf2}"
HOROVOD_VERSION="0.28.1"
REQUIREMENT_FILES=("${REPO_DIR}/requirements.txt" "${REPO_DIR}/requirements-dev.txt")
APT_PACKAGES=(cmake g++ g++-11 make openmpi-bin libopenmpi-dev openjdk-17-jre-headless
              slurmctld slurmd slurm-client munge numactl openssh-server openssh-client
              python3 python3-venv libpython3.11)

log() { printf '[setup] %s\n' "$*"; }
die() { echo "[setup] error: $*" >&2; exit 1; }

host_kind() {
  case "${DLRM_GPU:-}" in
    1) echo gpu ;;
    0) echo cpu ;;
    "") if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then echo gpu; else echo cpu; fi ;;
    *) echo "[setup] error: DLRM_GPU must be 0 or 1, got '${DLRM_GPU}'" >&2; exit 2 ;;
  esac
}
KIND="$(host_kind)"

# The TensorFlow pin of requirements.txt, the one distribution this host kind must not have, and
# the requirement lines this host kind installs (the GPU build of TensorFlow at the same version).
TF_VERSION="$(sed -n 's/^tensorflow-cpu==//p' "${REPO_DIR}/requirements.txt")"
[[ -n "${TF_VERSION}" ]] || die "requirements.txt pins no tensorflow-cpu==VERSION"
if [[ "${KIND}" == gpu ]]; then OTHER_TF="tensorflow-cpu"; else OTHER_TF="tensorflow"; fi
requirement_lines() {
  local tensorflow="tensorflow-cpu"
  if [[ "${KIND}" == gpu ]]; then tensorflow="tensorflow[and-cuda]"; fi
  grep -hE '^[A-Za-z0-9]' "${REQUIREMENT_FILES[@]}" | sed "s/^tensorflow-cpu==/${tensorflow}==/"
}

missing_debian_packages() {
  command -v dpkg-query >/dev/null || { printf '%s\n' "${APT_PACKAGES[@]}"; return; }
  local pkg
  for pkg in "${APT_PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "${pkg}" 2>/dev/null | grep -q "install ok installed"; then echo "${pkg}"; fi
  done
}

install_debian_packages() {
  if [[ "${DLRM_SKIP_APT:-0}" == "1" ]]; then log "DLRM_SKIP_APT=1: skipping Debian packages"; return; fi
  if ! command -v dpkg-query >/dev/null; then log "not a Debian system: install ${APT_PACKAGES[*]} yourself"; return; fi
  local missing
  mapfile -t missing < <(missing_debian_packages)
  if [[ ${#missing[@]} -eq 0 ]]; then log "Debian packages present"; return; fi
  if [[ "$(id -u)" != "0" ]]; then die "missing Debian packages ${missing[*]}; run as root or install them"; fi
  log "installing Debian packages: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

pick_python() {
  if [[ -n "${PYTHON:-}" ]]; then echo "${PYTHON}"; return; fi
  if command -v python3.11 >/dev/null; then echo python3.11; else echo python3; fi
}

# What the last requirements install was made from: the host kind and the lines installed.
requirements_stamp() { { echo "${KIND}"; requirement_lines; } | sha256sum | cut -d' ' -f1; }

create_venv() {
  if [[ ! -x "${VENV}/bin/python" ]]; then
    log "creating ${VENV}"
    "$(pick_python)" -m venv "${VENV}"
  fi
  local stamp="${VENV}/.requirements.sha256" want
  want="$(requirements_stamp)"
  if [[ -f "${stamp}" && "$(cat "${stamp}")" == "${want}" ]]; then
    log "Python requirements up to date (${KIND} host)"
    return
  fi
  if "${VENV}/bin/pip" show -q "${OTHER_TF}" 2>/dev/null; then
    log "removing ${OTHER_TF}: a ${KIND} host uses the other TensorFlow build"
    "${VENV}/bin/pip" uninstall -q -y "${OTHER_TF}"
  fi
  log "installing Python requirements (${KIND} host)"
  "${VENV}/bin/pip" install -q --disable-pip-version-check -r <(requirement_lines)
  echo "${want}" > "${stamp}"
}

venv_site_packages() {
  if [[ -x "${VENV}/bin/python" ]]; then
    "${VENV}/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))'
  else
    echo "${VENV}/lib/python3.X/site-packages"
  fi
}

# The project's packages (INSTALLED_PACKAGES) linked into the venv's site-packages, so that an entry
# point run from a subfolder (`cd wide_and_deep && python main.py`) imports them, with no .pth and no
# sys.path edit; the root modules (main.py, datasets.py, ...) stay off every other program's path.
# The links point into this checkout, so an edit is live at once. An older setup's .pth naming the
# repository root is removed.
INSTALLED_PACKAGES=(recsys wide_and_deep)
OLD_REPO_PTH="dlrm_tf2_repo_root.pth"
link_packages() {
  local site package link
  site="$(venv_site_packages)"
  if [[ -e "${site}/${OLD_REPO_PTH}" ]]; then
    rm -f "${site}/${OLD_REPO_PTH}"
    log "removed ${OLD_REPO_PTH}: the repository root is no longer on the venv's import path"
  fi
  for package in "${INSTALLED_PACKAGES[@]}"; do
    link="${site}/${package}"
    if [[ -L "${link}" && "$(readlink "${link}")" == "${REPO_DIR}/${package}" ]]; then continue; fi
    [[ ! -e "${link}" || -L "${link}" ]] || die "${link} exists and is not a link to ${REPO_DIR}/${package}"
    ln -sfn "${REPO_DIR}/${package}" "${link}.tmp" && mv -T "${link}.tmp" "${link}"
    log "linked ${package} into the venv (${link} -> ${REPO_DIR}/${package})"
  done
}

# The CUDA 12 toolkit Horovod's NCCL build compiles against: CUDA_HOME, else the toolkit root
# that nvcc on PATH reports (also right when nvcc is a wrapper script or a link).
cuda_home() {
  if [[ -n "${CUDA_HOME:-}" ]]; then echo "${CUDA_HOME}"; return; fi
  local top=""
  if command -v nvcc >/dev/null; then
    top="$(nvcc --dryrun -c -x cu /dev/null 2>&1 | sed -n 's|^#\$ TOP=\(.*\)/bin/\.\.$|\1|p')"
  fi
  echo "${top:-<no nvcc on PATH: set CUDA_HOME>}"
}

# The serving environment: its own venv, from the system Python 3.11 (nvidia-pytriton's Python-backend
# stub links /usr/lib's libpython3.11; a venv of another 3.11 build fails inside the stub).
SERVING_VENV="${REPO_DIR}/.venv-serving"
SERVING_REQUIREMENTS="${REPO_DIR}/requirements-serving.txt"
SERVING_PYTHON="/usr/bin/python3.11"
create_serving_venv() {
  local stamp="${SERVING_VENV}/.requirements.sha256" want
  want="$(sha256sum "${SERVING_REQUIREMENTS}" | cut -d' ' -f1)"
  if [[ -f "${stamp}" && "$(cat "${stamp}")" == "${want}" ]]; then
    log "serving requirements up to date (${SERVING_VENV})"
    return
  fi
  [[ -x "${SERVING_PYTHON}" ]] || die "the serving environment needs ${SERVING_PYTHON} (Debian's python3, python3-venv, libpython3.11)"
  if [[ ! -x "${SERVING_VENV}/bin/python" ]]; then
    log "creating ${SERVING_VENV}"
    "${SERVING_PYTHON}" -m venv "${SERVING_VENV}"
  fi
  log "installing serving requirements into ${SERVING_VENV}"
  "${SERVING_VENV}/bin/pip" install -q --disable-pip-version-check -r "${SERVING_REQUIREMENTS}"
  "${SERVING_VENV}/bin/pip" check
  echo "${want}" > "${stamp}"
}

HOROVOD_FLAVOUR="cpu"
HOROVOD_CHECKS=(TensorFlow Gloo MPI)  # what `horovodrun --check-build` must list as built
if [[ "${KIND}" == gpu ]]; then HOROVOD_FLAVOUR="nccl"; HOROVOD_CHECKS+=(NCCL); fi
HOROVOD_WHEEL_DIR="${CACHE_DIR}/wheels/horovod-${HOROVOD_VERSION}-tf${TF_VERSION}-${HOROVOD_FLAVOUR}"
# The NCCL of the nvidia-nccl-cu12 wheel (TensorFlow's own): it ships libnccl.so.2 and no static
# archive or unversioned link, so the build links the shared library through a libnccl.so link
# made here, and the Horovod library finds it at run time through its RPATH.
NCCL_DIR="$(venv_site_packages)/nvidia/nccl"
NCCL_LINK_DIR="${CACHE_DIR}/nccl-link"

horovod_build_env() {
  HOROVOD_ENV=(HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_PYTORCH=1
               HOROVOD_WITHOUT_MXNET=1)
  if [[ "${HOROVOD_FLAVOUR}" == nccl ]]; then
    HOROVOD_ENV+=(HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_CUDA_HOME="$(cuda_home)" HOROVOD_NCCL_LINK=SHARED
                  HOROVOD_NCCL_INCLUDE="${NCCL_DIR}/include" HOROVOD_NCCL_LIB="${NCCL_LINK_DIR}"
                  LDFLAGS="-Wl,-rpath,${NCCL_DIR}/lib")
  fi
}

check_cuda_toolkit() {
  local home nvcc version
  home="$(cuda_home)"
  nvcc="${home}/bin/nvcc"
  [[ -x "${nvcc}" ]] || die "a GPU host builds Horovod with NCCL, which needs the CUDA 12 toolkit (nvcc): install it or set CUDA_HOME (looked in ${home})"
  version="$("${nvcc}" --version | sed -n 's/.*release \([0-9][0-9]*\)\..*/\1/p')"
  [[ "${version}" == 12 ]] || die "TensorFlow ${TF_VERSION} uses CUDA 12, but ${nvcc} is CUDA ${version:-?}: set CUDA_HOME to a CUDA 12 toolkit"
  [[ -f "${NCCL_DIR}/include/nccl.h" && -f "${NCCL_DIR}/lib/libnccl.so.2" ]] \
    || die "NCCL not found in ${NCCL_DIR} (it comes with tensorflow[and-cuda]==${TF_VERSION}: rerun setup)"
  mkdir -p "${NCCL_LINK_DIR}"
  ln -sfn "${NCCL_DIR}/lib/libnccl.so.2" "${NCCL_LINK_DIR}/libnccl.so"
}

# "VERSION FLAVOUR" of the installed Horovod, empty when it does not import.
installed_horovod() {
  "${VENV}/bin/python" -c 'import horovod, horovod.tensorflow as hvd; print(horovod.__version__, "nccl" if hvd.nccl_built() else "cpu")' 2>/dev/null || true
}

verify_horovod_build() {
  local report wanted
  report="$("${VENV}/bin/horovodrun" --check-build 2>/dev/null)"
  for wanted in "${HOROVOD_CHECKS[@]}"; do
    grep -qE "\[X\] ${wanted}[[:space:]]*\$" <<<"${report}" || die "horovodrun --check-build does not list ${wanted}:
${report}"
  done
  log "horovodrun --check-build lists ${HOROVOD_CHECKS[*]}"
}

install_horovod() {
  if [[ "$(installed_horovod)" == "${HOROVOD_VERSION} ${HOROVOD_FLAVOUR}" ]]; then
    log "Horovod ${HOROVOD_VERSION} (${HOROVOD_FLAVOUR}) present"; return
  fi
  if ! ls "${HOROVOD_WHEEL_DIR}"/horovod-*.whl >/dev/null 2>&1; then
    log "building Horovod ${HOROVOD_VERSION} (${HOROVOD_FLAVOUR}) from the sdist (about 6 minutes, once)"
    if [[ "${HOROVOD_FLAVOUR}" == nccl ]]; then check_cuda_toolkit; fi
    horovod_build_env
    mkdir -p "${HOROVOD_WHEEL_DIR}"
    env "${HOROVOD_ENV[@]}" MAKEFLAGS="-j$(nproc)" \
        "${VENV}/bin/pip" wheel -q --no-build-isolation --no-deps --no-binary horovod \
        "horovod==${HOROVOD_VERSION}" -w "${HOROVOD_WHEEL_DIR}"
  else
    log "using cached Horovod wheel from ${HOROVOD_WHEEL_DIR}"
  fi
  "${VENV}/bin/pip" install -q --disable-pip-version-check --no-deps --force-reinstall "${HOROVOD_WHEEL_DIR}"/horovod-*.whl
  verify_horovod_build
}

OP_TARGET="cpu"
if [[ "${KIND}" == gpu ]]; then OP_TARGET="gpu"; fi
OP_DIR="${REPO_DIR}/tensorflow-dot-based-interact"
OP_LIBRARY="tensorflow_dot_based_interact/_dot_based_interact_ops.so"
OP_RECORD="${OP_LIBRARY%.so}.json"

# What the built library depends on: its sources and Makefile, the compilers, TensorFlow and the target.
op_build_key() {
  {
    echo "${OP_TARGET} tf${TF_VERSION}"
    (cd "${OP_DIR}" && find cc Makefile -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)
    "${CXX:-g++}" --version | head -n 1
    if [[ "${OP_TARGET}" == gpu ]]; then { nvcc --version 2>/dev/null || echo "no nvcc"; } | tail -n 1; fi
  } | sha256sum | cut -d' ' -f1
}

# A fresh clone reuses the library an earlier setup built from the same sources with the same tools
# (cached under $DLRM_CACHE_DIR/op/KEY); otherwise it is built and then cached.
build_interaction_op() {
  [[ -f "${OP_DIR}/Makefile" ]] || return 0
  local cached
  cached="${CACHE_DIR}/op/$(op_build_key)"
  if [[ -f "${cached}/library.so" && -f "${cached}/record.json" ]]; then
    if cmp -s "${cached}/library.so" "${OP_DIR}/${OP_LIBRARY}"; then log "dot-interaction op up to date"; return; fi
    cp "${cached}/library.so" "${OP_DIR}/${OP_LIBRARY}"
    cp "${cached}/record.json" "${OP_DIR}/${OP_RECORD}"
    log "using the dot-interaction op built earlier from these sources (${cached})"
    return
  fi
  log "building the dot-interaction op (make ${OP_TARGET})"
  make -s -C "${OP_DIR}" "${OP_TARGET}" PYTHON="${VENV}/bin/python"
  mkdir -p "${cached}"
  cp "${OP_DIR}/${OP_LIBRARY}" "${cached}/library.so.tmp-$$"
  cp "${OP_DIR}/${OP_RECORD}" "${cached}/record.json"
  mv "${cached}/library.so.tmp-$$" "${cached}/library.so"
}

print_plan() {
  local missing
  missing="$(missing_debian_packages | tr '\n' ' ')"
  horovod_build_env
  echo "host kind: ${KIND} (DLRM_GPU=${DLRM_GPU:-auto})"
  echo "debian packages: ${APT_PACKAGES[*]} (missing: ${missing:-none})"
  echo "remove first: ${OTHER_TF} (if installed; never both TensorFlow builds)"
  echo "pip install into ${VENV}:"
  requirement_lines | sed 's/^/  /'
  echo "horovod ${HOROVOD_VERSION} (${HOROVOD_FLAVOUR}), wheel cached in ${HOROVOD_WHEEL_DIR}, built with:"
  printf '  %s\n' "${HOROVOD_ENV[@]}"
  if [[ "${HOROVOD_FLAVOUR}" == nccl ]]; then echo "  (${NCCL_LINK_DIR}/libnccl.so -> ${NCCL_DIR}/lib/libnccl.so.2)"; fi
  echo "horovod check: horovodrun --check-build lists ${HOROVOD_CHECKS[*]}"
  echo "dot-interaction op: make -C tensorflow-dot-based-interact ${OP_TARGET} (or the copy in ${CACHE_DIR}/op/$(op_build_key))"
  echo "import path: ${INSTALLED_PACKAGES[*]} linked into $(venv_site_packages) from ${REPO_DIR} (no .pth)"
  echo "serving venv ${SERVING_VENV} (${SERVING_PYTHON}) from requirements-serving.txt:"
  grep -E '^[A-Za-z0-9]' "${SERVING_REQUIREMENTS}" | sed 's/^/  /'
}

if [[ "${PLAN}" == 1 ]]; then print_plan; exit 0; fi
install_debian_packages
create_venv
link_packages
install_horovod
build_interaction_op
"${VENV}/bin/pip" check
create_serving_venv
log "done"
