#!/usr/bin/env bash
# The Wide & Deep demo `make demo-wd` runs after setup: the reference's workflow, small. Outbrain-format
# CSVs whose clicks a teacher decides, the preprocessing (wide_and_deep/scripts/preproc.sh, its default
# engine), 2-process Horovod training on the CPU, an evaluation from the checkpoint, a plot of the
# training log, and MAP@12 next to the teacher's.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: scripts/demo_wd.sh [--help]

Steps (outputs under $DEMO_DIR, default ./demo_output_wd):
  1. python -m wide_and_deep.outbrain_synthetic writes the seven Outbrain CSVs and teacher.json (the
     teacher's MAP@12 and AUC on the eval displays: the ceiling);
  2. wide_and_deep/scripts/preproc.sh duckdb 4 turns them into 4096-row TFRecords (train/, eval/);
  3. horovodrun -np 2 --gloo main.py (from wide_and_deep/, --cpu): the reference's model with a
     smaller deep part, the reference's log keys about 30 times a run (--print_freq; the reference:
     every 100 steps) and per epoch, with the mean loss of each interval, a checkpoint per epoch;
  4. main.py --evaluate --use_checkpoint from that checkpoint;
  5. scripts/plot_log.py draws the training log (the interval's mean loss; evaluation AUC and MAP@12
     beside the teacher's) as train_log.png;
  6. prints MAP@12 (the reference's and the exact one) and AUC next to the teacher's.
Environment: DEMO_DIR, DEMO_DISPLAYS (default 120000, at least 20000), DEMO_EPOCHS (default 3), DEMO_NP
(default 2).
USAGE
}
if [[ "${1:-}" == "--help" || "${1:-}" == "-h" ]]; then usage; exit 0; fi

REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${REPO_DIR}"
# shellcheck source=scripts/demo_common.sh
source "${REPO_DIR}/scripts/demo_common.sh"
demo_environment "${REPO_DIR}"
DEMO_DIR="${DEMO_DIR:-${REPO_DIR}/demo_output_wd}"
DISPLAYS="${DEMO_DISPLAYS:-120000}"
EPOCHS="${DEMO_EPOCHS:-3}"
NP="${DEMO_NP:-2}"
MANIFEST="${DEMO_DIR}/.wd_demo_output"  # what the demo wrote (demo_fresh_dir)
demo_require_integer DEMO_DISPLAYS "${DISPLAYS}" 20000
demo_require_integer DEMO_EPOCHS "${EPOCHS}" 1
demo_require_integer DEMO_NP "${NP}" 1
demo_fresh_dir "${DEMO_DIR}" "${MANIFEST}"
CSV="${DEMO_DIR}/outbrain"
RECORDS="${DEMO_DIR}/tfrecords"

echo "== 1. Outbrain-format CSVs, ${DISPLAYS} displays"
python -m wide_and_deep.outbrain_synthetic --output "${CSV}" --displays "${DISPLAYS}" --seed 1

echo "== 2. preprocessing (duckdb engine, 4 files per split)"
INPUT_DIR="${CSV}" OUTPUT_DIR="${RECORDS}" bash wide_and_deep/scripts/preproc.sh duckdb 4

# A batch of one 4096-row record per rank; a smaller deep part and faster rates than the reference's
# 20-epoch recipe, so that a few epochs on a laptop-sized set learn.
BATCH=$(( 4096 * NP ))
TRAIN=(--cpu --train_data_pattern "${RECORDS}/train/part*" --eval_data_pattern "${RECORDS}/eval/part*"
       --transformed_metadata_path "${RECORDS}" --model_dir "${DEMO_DIR}/checkpoints"
       --global_batch_size "${BATCH}" --eval_batch_size "${BATCH}" --num_epochs "${EPOCHS}"
       --deep_hidden_units 256 256 --deep_learning_rate 0.003 --deep_warmup_epochs 1
       --linear_learning_rate 0.2 --seed 1)

# about 30 progress records a run (an epoch is the whole steps its records fill, NP records a step), each a
# point of the plot's loss curve (the mean loss of its interval)
PRINT_FREQ="$(python - "${RECORDS}/metadata.json" "${NP}" "${EPOCHS}" <<'PY'
import json
import sys

records = -(-json.load(open(sys.argv[1]))["train_rows"] // 4096)
print(max(1, records // int(sys.argv[2]) * int(sys.argv[3]) // 30))
PY
)"

echo "== 3. training on ${NP} processes"
(cd wide_and_deep && horovodrun -np "${NP}" -H "localhost:${NP}" --gloo python main.py "${TRAIN[@]}" \
   --print_freq "${PRINT_FREQ}" --results_dir "${DEMO_DIR}/train_results")

echo "== 4. evaluation from the checkpoint"
(cd wide_and_deep && python main.py "${TRAIN[@]}" --evaluate --use_checkpoint --results_dir "${DEMO_DIR}/eval_results")

echo "== 5. plot of the training log"
read -r TEACHER_MAP TEACHER_AUC < <(python -c \
  'import json, sys; t = json.load(open(sys.argv[1])); print(t["map_at_12_eval"], t["auc_eval"])' "${CSV}/teacher.json")
python scripts/plot_log.py "${DEMO_DIR}/train_results/log.json" --output "${DEMO_DIR}/train_log.png" \
  --teacher_map "${TEACHER_MAP}" --teacher_auc "${TEACHER_AUC}"

echo "== 6. summary"
python - "${CSV}/teacher.json" "${DEMO_DIR}/eval_results/log.json" "${RECORDS}/preproc_summary.json" <<'PY'
import json
import sys

from recsys.runtime.logger import read_dllogger_file

teacher = json.load(open(sys.argv[1]))
final = [r["data"] for r in read_dllogger_file(sys.argv[2]) if r["type"] == "LOG" and r["step"] == []][-1]
summary = json.load(open(sys.argv[3]))
print(f"preprocessing: {json.dumps(summary.get('rows', summary.get('total', {})))}")
print(f"MAP@12: reference's {final['streaming_map_val']:.4f}, exact {final['exact_map_val']:.4f}; "
      f"teacher {teacher['map_at_12_eval']:.4f}")
print(f"AUC {final['auc_val']:.4f} (teacher {teacher['auc_eval']:.4f}), loss {final['loss_val']:.4f}, "
      f"accuracy {final['binary_accuracy_val']:.4f}")
PY
