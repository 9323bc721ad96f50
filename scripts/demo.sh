#!/usr/bin/env bash
# The demo `make demo` runs after setup: a small learnable synthetic dataset, 2-process Horovod
# training on the CPU, evaluation, a checkpoint, inference from it, and a SavedModel export.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: scripts/demo.sh [--help]

Steps (outputs under $DEMO_DIR, default ./demo_output):
  1. prepare_synthetic_dataset.py writes a learnable split-binary dataset (labels from a random
     "teacher" DLRM whose AUC is stored in the feature spec);
  2. horovodrun -np 2 --gloo main.py --mode train (CPU, data parallel) with evaluation and a checkpoint;
  3. main.py --mode inference from that checkpoint (latency percentiles, throughput, AUC);
  4. main.py --mode deploy exports a SavedModel;
  5. prints a summary: trained AUC next to the teacher's AUC, and throughput.
Environment: DEMO_DIR, DEMO_EPOCHS (default 3), DEMO_NP (default 2).
USAGE
}
if [[ "${1:-}" == "--help" || "${1:-}" == "-h" ]]; then usage; exit 0; fi

REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${REPO_DIR}"
export PATH="${REPO_DIR}/.venv/bin:${PATH}" PYTHONPATH="${REPO_DIR}" OMP_NUM_THREADS=1 TF_CPP_MIN_LOG_LEVEL=2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
DEMO_DIR="${DEMO_DIR:-${REPO_DIR}/demo_output}"
EPOCHS="${DEMO_EPOCHS:-3}"
NP="${DEMO_NP:-2}"
DATA="${DEMO_DIR}/data"
MARKER="${DEMO_DIR}/.dlrm_demo_output"
if [[ -e "${DEMO_DIR}" ]]; then  # replace only an earlier demo's output (or an empty folder)
  if [[ -f "${MARKER}" || -z "$(ls -A "${DEMO_DIR}")" ]]; then
    rm -rf "${DEMO_DIR}"
  else
    echo "error: DEMO_DIR ${DEMO_DIR} exists and is not an earlier demo's output; refusing to delete it" >&2
    exit 2
  fi
fi
mkdir -p "${DEMO_DIR}"
touch "${MARKER}"

# shellcheck disable=SC2054  # the commas are inside flag values (64,16), not array separators
MODEL=(--embedding_dim 16 --bottom_mlp_dims 64,16 --top_mlp_dims 128,64,1 --optimizer adam
       --learning_rate 0.01 --warmup_steps 50 --decay_start_step 100000 --batch_size 1024
       --valid_batch_size 4096 --dataset_path "${DATA}" --cpu)

echo "== 1/4 generating a learnable synthetic dataset in ${DATA}"
python prepare_synthetic_dataset.py --synthetic_dataset_dir "${DATA}" \
  --synthetic_dataset_table_sizes 100,100,80,80,60,60,50,50 --num_numerical_features 13 \
  --synthetic_dataset_num_entries 307200 --synthetic_dataset_num_test_entries 81920 \
  --synthetic_dataset_batch_size 1024

echo "== 2/4 training with horovodrun -np ${NP} (CPU, data parallel) for ${EPOCHS} epochs"
horovodrun -np "${NP}" -H "localhost:${NP}" --gloo python main.py --mode train "${MODEL[@]}" \
  --epochs "${EPOCHS}" --evals_per_epoch 1 --print_freq 100 \
  --save_checkpoint_path "${DEMO_DIR}/checkpoints" --log_path "${DEMO_DIR}/train_log.json"

echo "== 3/4 inference from the checkpoint"
python main.py --mode inference "${MODEL[@]}" --max_steps 20 \
  --restore_checkpoint_path "${DEMO_DIR}/checkpoints" --log_path "${DEMO_DIR}/inference_log.json"

echo "== 4/4 exporting a SavedModel"
python main.py --mode deploy "${MODEL[@]}" --restore_checkpoint_path "${DEMO_DIR}/checkpoints" \
  --saved_model_output_path "${DEMO_DIR}/saved_model"

python - "${DEMO_DIR}" <<'PY'
import sys
from utils import read_dllogger_file

def final(path):
    return [r["data"] for r in read_dllogger_file(path) if r["type"] == "LOG" and r["step"] == []][-1]

demo = sys.argv[1]
train, inference = final(f"{demo}/train_log.json"), final(f"{demo}/inference_log.json")
import yaml
teacher = yaml.safe_load(open(f"{demo}/data/feature_spec.yaml"))["metadata"]["teacher_auc"]
print("\n== demo summary")
print(f"test AUC {train['auc']:.4f}   teacher AUC {teacher:.4f}   gap {teacher - train['auc']:.4f}")
print(f"training throughput {train['throughput']:.0f} samples/s ({train['mean_step_time_ms']:.2f} ms/step, 2 ranks)")
print(f"inference: {inference['mean_inference_throughput']:.0f} samples/s, "
      f"p99 latency {inference['p99_inference_latency'] * 1000:.2f} ms, AUC {inference['auc']:.4f}")
print(f"checkpoints: {demo}/checkpoints   SavedModel: {demo}/saved_model")
PY
