#!/usr/bin/env bash
#SBATCH --job-name=dlrm_tf2
#SBATCH --signal=B:USR1@120
#
# Generic Slurm batch script: runs one command on every task of the allocation, one process per
# Slurm task (one per GPU on GPU nodes), wired together by PMIx so Horovod's MPI controller sees
# every rank. Two kinds of cluster:
#   * container clusters (enroot + pyxis): set `cont` (and `mounts`), each task runs in the image;
#   * bare metal: leave `cont` empty, each task runs `cmd` directly on the node.
#
# Environment variables read (sbatch exports the submitting shell's environment by default):
#   cmd         command run by every task, through `bash -c` (required)
#   cont        container image for pyxis `--container-image`; empty = bare metal
#   mounts      pyxis `--container-mounts` list, e.g. /data/dlrm:/data/dlrm (container mode only)
#   srun_flags  extra srun arguments, split on whitespace; they come after the defaults
#               (--mpi=pmix --kill-on-bad-exit=1), so e.g. srun_flags=--mpi=pmi2 overrides them
#   requeue     1: after a stop signal, requeue the job (`scontrol requeue`); the requeued job runs
#               the same cmd, which must carry --auto_resume to continue from its newest checkpoint
#
# Stopping: the script asks Slurm for SIGUSR1 120 s before the time limit (#SBATCH --signal above;
# override with `sbatch --signal=B:USR1@<seconds>`) and passes it, or a SIGTERM (preemption,
# scancel), on to every task through srun: main.py finishes its step, saves a checkpoint and exits
# with 128 + the signal's number (docs/slurm.md).
#
# Example: the full Criteo 1TB dataset with the 1.68 TB embedding configuration on 32 A100-80GB
# GPUs over 4 nodes, in the image built from this repository's Dockerfile:
#   cmd='numactl --interleave=all -- python -u main.py --dataset_path /data/dlrm/full_criteo_data \
#        --amp --xla --embedding_dim 512 --bottom_mlp_dims 512,256,512' \
#   cont=dlrm_tf_adam mounts=/data/dlrm:/data/dlrm \
#   sbatch -n 32 -N 4 --ntasks-per-node=8 --gpus-per-node=8 -t 00:20:00 slurm_multinode.sh
#
# Bare-metal example (a virtualenv on a shared filesystem, synthetic data, 2 ranks on one node):
#   cmd="$PWD/.venv/bin/python $PWD/main.py --dataset_type synthetic --cpu" \
#   sbatch -n 2 -N 1 --wait slurm_multinode.sh
#
# The job exits with srun's status: non-zero as soon as any rank fails (--kill-on-bad-exit=1
# ends the other ranks instead of leaving them waiting in a collective).
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: [cmd=...] [cont=IMAGE] [mounts=SRC:DST,...] [srun_flags='...'] [requeue=1] sbatch [SBATCH OPTIONS] slurm_multinode.sh
       slurm_multinode.sh --help

Runs `cmd` on every task of the Slurm allocation under `srun --mpi=pmix --kill-on-bad-exit=1`.
  cmd         command for every task, run with `bash -c` (required)
  cont        container image: run through pyxis --container-image (empty: bare metal)
  mounts      pyxis --container-mounts value (container mode only)
  srun_flags  extra srun arguments, appended after the defaults so they can override them
  requeue     1: requeue the job after a stop signal (cmd must carry --auto_resume to continue)

SIGUSR1 (sent 120 s before the time limit: #SBATCH --signal=B:USR1@120) and SIGTERM reach every
task through srun; main.py then saves a checkpoint and exits with 128 + the signal's number.

Example (bare metal, 2 ranks on one node):
  cmd="$PWD/.venv/bin/python $PWD/main.py --dataset_type synthetic --cpu" \
    sbatch -n 2 -N 1 --wait slurm_multinode.sh
USAGE
}

fail() {
  echo "slurm_multinode.sh: error: $*" >&2
  exit 2
}

if [[ "${1:-}" == "--help" || "${1:-}" == "-h" ]]; then
  usage
  exit 0
fi
if [[ $# -gt 0 ]]; then
  fail "unexpected argument '$1'; the script is configured through environment variables (see --help)"
fi

cmd="${cmd:-}"
cont="${cont:-}"
mounts="${mounts:-}"
srun_flags="${srun_flags:-}"
requeue="${requeue:-0}"

if [[ -z "${cmd//[[:space:]]/}" ]]; then
  fail "the environment variable 'cmd' is empty; set it to the command every task runs (see --help)"
fi
if [[ -z "${SLURM_JOB_ID:-}" ]]; then
  fail "not inside a Slurm allocation; submit with: sbatch [options] slurm_multinode.sh (see --help)"
fi
if [[ "${requeue}" != 0 && "${requeue}" != 1 ]]; then
  fail "requeue must be 0 or 1, got '${requeue}'"
fi
if [[ "${requeue}" == 1 && "${cmd}" != *--auto_resume* ]]; then
  fail "requeue=1 runs cmd again after a stop; add --auto_resume (and --save_checkpoint_path) to cmd so that it continues from its newest checkpoint instead of starting over"
fi
if [[ -n "${mounts}" && -z "${cont}" ]]; then
  fail "'mounts' is set but 'cont' is empty; container mounts need a container image"
fi
if [[ -n "${cont}" ]] && ! srun --help 2>&1 | grep -q -- '--container-image'; then
  fail "'cont' is set but this srun has no --container-image option (is the pyxis plugin installed?)"
fi

read -r -a extra_srun_flags <<< "${srun_flags}"
srun_command=(srun --mpi=pmix --kill-on-bad-exit=1 "${extra_srun_flags[@]}")
if [[ -n "${cont}" ]]; then
  srun_command+=(--container-image="${cont}")
  if [[ -n "${mounts}" ]]; then
    srun_command+=(--container-mounts="${mounts}")
  fi
fi
srun_command+=(/bin/bash -c "${cmd}")

runtime="bare metal"
if [[ -n "${cont}" ]]; then runtime="container ${cont}"; fi
echo "slurm_multinode.sh: job ${SLURM_JOB_ID}, ${SLURM_NTASKS:-?} task(s) on ${SLURM_JOB_NUM_NODES:-?}" \
     "node(s) (${SLURM_JOB_NODELIST:-?}), ${runtime}"
printf 'slurm_multinode.sh: running:'
printf ' %q' "${srun_command[@]}"
printf '\n'

# A stop signal for this script (the time-limit warning, scancel, preemption) goes on to the tasks;
# the script waits for srun to end, since the tasks are saving a checkpoint.
stop_signal=""
# shellcheck disable=SC2329  # invoked by the traps below
forward_signal() {
  stop_signal="$1"
  echo "slurm_multinode.sh: received SIG${stop_signal}, passing it to the tasks"
  kill -s "${stop_signal}" "${srun_pid}" 2>/dev/null || true
}
trap 'forward_signal USR1' USR1
trap 'forward_signal TERM' TERM
trap 'forward_signal INT' INT

"${srun_command[@]}" &
srun_pid=$!
srun_status=0
while true; do
  wait "${srun_pid}" && srun_status=0 || srun_status=$?
  if ! kill -0 "${srun_pid}" 2>/dev/null; then break; fi  # wait was cut short by a trapped signal
done
echo "slurm_multinode.sh: srun exited with status ${srun_status}"
if [[ -n "${stop_signal}" && "${requeue}" == 1 ]]; then
  echo "slurm_multinode.sh: stopped by SIG${stop_signal}; requeueing job ${SLURM_JOB_ID} (restart $(( ${SLURM_RESTART_COUNT:-0} + 1 )))"
  scontrol requeue "${SLURM_JOB_ID}"
fi
exit "${srun_status}"
