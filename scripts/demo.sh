#!/usr/bin/env bash
# The demo `make demo` runs after setup: the pipeline a real user runs, small. Raw Criteo-format
# day files with learnable labels, preprocessing with preproc/prepare_dataset.sh (its default
# engine), 2-process Horovod training on the CPU with evaluations and TensorBoard scalars, an
# evaluation and inference from the checkpoint, a SavedModel export, a plot of the log, and the
# model exported to ONNX, served by Triton and scored over HTTP.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: scripts/demo.sh [--help]

Steps (outputs under $DEMO_DIR, default ./demo_output):
  1. synthetic_criteo.py writes 4 raw Criteo-format day files (tab-separated, 40 fields, a few
     malformed lines) whose labels come from a logistic "teacher" over the features;
  2. preproc/prepare_dataset.sh CPU 15 turns them into a split-binary dataset (days 0-2 train,
     day 3 test + validation; malformed lines counted and rejected);
  3. horovodrun -np 2 --gloo main.py --mode train (CPU): progress lines with ETA, 4 evaluations
     per epoch, a checkpoint, TensorBoard scalars in $DEMO_DIR/tensorboard;
  4. main.py --mode eval and --mode inference from that checkpoint (AUC; latency percentiles);
  5. main.py --mode deploy exports a SavedModel; scripts/plot_log.py draws the training log (the mean
     loss of each progress interval, about 30 per epoch; the test AUC beside the teacher's);
  6. python -m deployment.export writes the checkpoint as ONNX (checked against TensorFlow), and
     deployment.score serves it with Triton (.venv-serving), scores the test split over HTTP and
     stops the server: the served AUC beside the in-process one;
  7. prints a summary: the preprocessing's line counts, the trained AUC next to the teacher's,
     throughput and latency, the served AUC.
Environment: DEMO_DIR, DEMO_LINES_PER_DAY (default 250000, at least 21000), DEMO_EPOCHS (default 1),
DEMO_NP (default 2).
USAGE
}
if [[ "${1:-}" == "--help" || "${1:-}" == "-h" ]]; then usage; exit 0; fi

REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${REPO_DIR}"
# shellcheck source=scripts/demo_common.sh
source "${REPO_DIR}/scripts/demo_common.sh"
demo_environment "${REPO_DIR}"
DEMO_DIR="${DEMO_DIR:-${REPO_DIR}/demo_output}"
LINES_PER_DAY="${DEMO_LINES_PER_DAY:-250000}"
EPOCHS="${DEMO_EPOCHS:-1}"
NP="${DEMO_NP:-2}"
DAYS=4
THRESHOLD=15
BATCH=1024
RAW="${DEMO_DIR}/raw"
DATA="${DEMO_DIR}/data"
MANIFEST="${DEMO_DIR}/.dlrm_demo_output"  # what the demo wrote (demo_fresh_dir)
# inference times 20 batches of 512 from the test split, the first half of the last day
demo_require_integer DEMO_LINES_PER_DAY "${LINES_PER_DAY}" 21000
demo_fresh_dir "${DEMO_DIR}" "${MANIFEST}"

# shellcheck disable=SC2054  # the commas are inside flag values (64,16), not array separators
MODEL=(--embedding_dim 16 --bottom_mlp_dims 64,16 --top_mlp_dims 128,64,1 --optimizer adam
       --learning_rate 0.01 --warmup_steps 50 --decay_start_step 100000 --batch_size "${BATCH}"
       --valid_batch_size 4096 --dataset_path "${DATA}" --cpu)

echo "== 1/7 writing ${DAYS} raw Criteo-format day files of ${LINES_PER_DAY} lines in ${RAW}"
python preproc/synthetic_criteo.py --output "${RAW}" --days "${DAYS}" --lines_per_day "${LINES_PER_DAY}" --teacher \
  --malformed_per_day 2 --summary "${DEMO_DIR}/raw_summary.json"

echo "== 2/7 preprocessing: preproc/prepare_dataset.sh CPU ${THRESHOLD} (default engine) into ${DATA}"
NUM_DAYS="${DAYS}" download_dir="${RAW}" spark_output_path="${DEMO_DIR}/spark_output" \
  conversion_intermediate_dir="${DEMO_DIR}/intermediate" final_output_dir="${DATA}" PYTHON=python PROGRESS_INTERVAL=2 \
  preproc/prepare_dataset.sh CPU "${THRESHOLD}"

# about 30 progress lines per epoch (after the timer's warm-up of two intervals): each line's mean_loss,
# the mean over its interval, is a point of the plot's loss curve
PRINT_FREQ=$(( (DAYS - 1) * LINES_PER_DAY / BATCH / 30 ))
echo "== 3/7 training with horovodrun -np ${NP} (CPU, tables model parallel) for ${EPOCHS} epoch(s)"
horovodrun -np "${NP}" -H "localhost:${NP}" --gloo python main.py --mode train "${MODEL[@]}" \
  --epochs "${EPOCHS}" --evals_per_epoch 4 --print_freq "${PRINT_FREQ}" --save_checkpoint_path "${DEMO_DIR}/checkpoints" \
  --log_path "${DEMO_DIR}/train_log.json" --tensorboard_dir "${DEMO_DIR}/tensorboard"

echo "== 4/7 evaluation and inference from the checkpoint"
python main.py --mode eval "${MODEL[@]}" --restore_checkpoint_path "${DEMO_DIR}/checkpoints" \
  --log_path "${DEMO_DIR}/eval_log.json"
python main.py --mode inference "${MODEL[@]}" --valid_batch_size 512 --max_steps 20 \
  --restore_checkpoint_path "${DEMO_DIR}/checkpoints" --log_path "${DEMO_DIR}/inference_log.json"

echo "== 5/7 exporting a SavedModel; plotting the training log"
python main.py --mode deploy "${MODEL[@]}" --restore_checkpoint_path "${DEMO_DIR}/checkpoints" \
  --saved_model_output_path "${DEMO_DIR}/saved_model"
TEACHER_AUC="$(python -c 'import json, sys; print(json.load(open(sys.argv[1]))["teacher_auc"])' \
  "${DEMO_DIR}/raw_summary.json")"
python scripts/plot_log.py "${DEMO_DIR}/train_log.json" --output "${DEMO_DIR}/train_log.png" \
  --teacher_auc "${TEACHER_AUC}"

echo "== 6/7 serving: the checkpoint as ONNX (checked against TensorFlow), served by Triton, scored over HTTP"
python -m deployment.export --checkpoint "${DEMO_DIR}/checkpoints" --dataset_path "${DATA}" \
  --output "${DEMO_DIR}/onnx_export"
# .venv-serving (no TensorFlow): deployment.score starts deployment.serve on the export (127.0.0.1,
# free ports), sends the export's test samples over HTTP, scores the answers and stops the server
"${REPO_DIR}/.venv-serving/bin/python" -m deployment.score "${DEMO_DIR}/onnx_export" \
  --record "${DEMO_DIR}/served_score.json"

echo "== 7/7 summary"
python - "${DEMO_DIR}" <<'PY'
import json
import sys

from recsys.runtime.logger import read_dllogger_file


def final(path):
    return [r["data"] for r in read_dllogger_file(path) if r["type"] == "LOG" and r["step"] == []][-1]


demo = sys.argv[1]
train, evaluation = final(f"{demo}/train_log.json"), final(f"{demo}/eval_log.json")
inference = final(f"{demo}/inference_log.json")
teacher = json.load(open(f"{demo}/raw_summary.json"))["teacher_auc"]
prep = json.load(open(f"{demo}/data/preprocessing_summary.json"))
total = prep["total"]
reasons = {}
for split in prep["splits"].values():
    for reason, count in split["rejected_by_reason"].items():
        reasons[reason] = reasons.get(reason, 0) + count
print("\n== demo summary")
print(f"preprocessing ({prep['engine']}, frequency threshold {prep['frequency_limit']}): {total['input_lines']:,} "
      f"input lines = {total['rows']:,} rows + {total['rejected_lines']:,} rejected ("
      + ", ".join(f"{reason} {count}" for reason, count in reasons.items() if count) + ")")
print("  " + ", ".join(f"{name} {split['rows']:,} rows of {split['input_lines']:,} lines"
                       for name, split in prep["splits"].items()))
print(f"test AUC {evaluation['auc']:.4f} (best during training {train['auc']:.4f})   teacher AUC {teacher:.4f}   "
      f"gap {teacher - evaluation['auc']:.4f}")
print(f"training throughput {train['throughput']:.0f} samples/s ({train['mean_step_time_ms']:.2f} ms/step, "
      f"{train['evaluations']} evaluations)")
print(f"inference: {inference['mean_inference_throughput']:.0f} samples/s, "
      f"p99 latency {inference['p99_inference_latency'] * 1000:.2f} ms at batch 512")
served = json.load(open(f"{demo}/served_score.json"))
print(f"served by Triton over HTTP ({served['samples']:,} test samples): AUC {served['served']['auc']:.6f}, "
      f"in-process {served['in_process']['auc']:.6f} (max difference of a probability "
      f"{served['max_abs_diff']:.2g}); normalized entropy {served['served']['normalized_entropy']:.4f}, "
      f"calibration {served['served']['calibration']:.4f}")
print(f"checkpoints: {demo}/checkpoints   SavedModel: {demo}/saved_model   ONNX: {demo}/onnx_export")
print(f"training curves: {demo}/train_log.png   TensorBoard: tensorboard --logdir {demo}/tensorboard")
PY
