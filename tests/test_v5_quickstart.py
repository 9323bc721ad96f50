"""NVIDIA's V5 (DLRM_and_DCNv2) Quick Start, command for command, with small batch counts.

The commands are docs/v5.md's (Quick Start) with the /data paths moved under the test's folder.
The t15 tables hold 15.6 GiB at width 128, more than a test machine can spare, so the generated
spec's cardinalities are capped at 1000 before the data is drawn; everything else is as written.
"""
import os
import shutil
import subprocess
import sys

import pytest
import yaml

from multiproc import REPO_ROOT, assert_ok, horovodrun_path, launch_env, require
from test_main import final_record

CARDINALITY_CAP = 1000


def shell(command: str, cwd) -> subprocess.CompletedProcess:
    """`command` in bash, with this interpreter's folder first on PATH (`python` is the project's)."""
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    return subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=str(cwd), env=launch_env({"PATH": path}),
                          capture_output=True, text=True, timeout=900)


def cap_cardinalities(spec_path) -> None:
    spec = yaml.safe_load(spec_path.read_text())
    for feature in spec["feature_spec"].values():
        if "cardinality" in feature:
            feature["cardinality"] = min(int(feature["cardinality"]), CARDINALITY_CAP)
    spec_path.write_text(yaml.safe_dump(spec))


def test_the_v5_quick_start_runs_as_written(tmp_path):
    require(shutil.which("numactl") is not None, "numactl not installed (`make setup`)")
    require(horovodrun_path() is not None, "horovodrun not installed (`make setup`)")
    data, checkpoint = tmp_path / "preprocessed", tmp_path / "checkpoint"
    assert_ok(shell("python -m dataloading.generate_feature_spec --variant criteo_t15_synthetic "
                    "--dst feature_spec.yaml", tmp_path))
    cap_cardinalities(tmp_path / "feature_spec.yaml")
    assert_ok(shell(f"python -m dataloading.transcribe --src_dataset_type synthetic --src_dataset_path . "
                    f"--dst_dataset_path {data} --max_batches_train 3 --max_batches_test 12 --dst_dataset_type tf_raw",
                    tmp_path))
    launch = f"{horovodrun_path()} -np 1 -H localhost:1 --mpi-args=--oversubscribe numactl --interleave=all -- "
    train = shell(launch + f"python -u dlrm.py --dataset_path {data} --amp --xla --save_checkpoint_path {checkpoint}/ "
                           f"--log_path {tmp_path / 'train.json'}", REPO_ROOT)
    assert_ok(train)
    assert "needs a GPU and none is visible" in train.stdout
    trained = final_record(tmp_path / "train.json")
    assert trained["train_loss"] > 0 and trained["evaluations"] == 1
    assert_ok(shell(launch + f"python -u dlrm.py --dataset_path {data} --amp --xla --restore_checkpoint_path "
                             f"{checkpoint} --mode eval --log_path {tmp_path / 'eval.json'}", REPO_ROOT))
    assert final_record(tmp_path / "eval.json")["auc"] == pytest.approx(trained["auc"], abs=1e-6)
    assert_ok(shell(launch + f"python -u dlrm.py --dataset_path {data} --amp --xla --restore_checkpoint_path "
                             f"{checkpoint} --mode inference --log_path {tmp_path / 'inference.json'}", REPO_ROOT))
    assert final_record(tmp_path / "inference.json")["measured_batches"] == 2
