"""The SOK DLRM benchmark's commands: `split_bin.py` (dataloading.split_bin, and transcribe's sok_split
destination), its main.py flags as aliases (each announced, a contradiction one error), --eval_in_last,
--early_stop, --target_auc, --fp16_allreduce under real `horovodrun -np 2 --gloo`, and SOK's command
line run as written."""
import json
import os

import numpy as np
import pytest

from dataloading import split_bin, transcribe
from multiproc import assert_ok, run_horovod, snapshot
from test_dataloading import command_here, transcribe_here
from test_flags import assert_refused, run_in_process
from recsys.data.hugectr_data import RecordReader, load_spec
from test_hugectr_data import BATCH, CARDINALITIES, SAMPLES, known_layouts
from test_main import SMALL, SMALL_MODEL, checkpoint_arrays, final_record, main_py


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    """Known records as a HugeCTR raw folder and as the SOK split folder SOK's split_bin.py makes."""
    return known_layouts(tmp_path_factory, "sok")


def read_all(dataset_type, path, mapping, **options):
    """Every sample of one mapping, 32 at a time, as the project's reader serves them."""
    reader = RecordReader(load_spec(dataset_type, str(path), **options), mapping, 32, drop_remainder=False)
    return [reader.read_samples(i) for i in range(len(reader))]


def assert_same_samples(a, b):
    assert len(a) == len(b) > 0
    for (numerical_a, labels_a, ids_a), (numerical_b, labels_b, ids_b) in zip(a, b):
        np.testing.assert_array_equal(numerical_a, numerical_b)
        np.testing.assert_array_equal(labels_a, labels_b)
        np.testing.assert_array_equal(np.asarray(ids_a), np.asarray(ids_b))


def split_bin_here(capsys, *args):
    result = command_here(capsys, split_bin.main, *args)
    return result.returncode, result


def test_split_bin_makes_a_sok_folder_serving_the_raw_files_batches(raw, tmp_path, capsys):
    records, paths = raw
    data = tmp_path / "data"
    for mapping in ("train", "test"):
        status, out = split_bin_here(capsys, os.path.join(paths["raw"], f"{mapping}_data.bin"), data / mapping,
                                     "--slot_size_array", str(CARDINALITIES), "--batch_size", "100")
        assert status == 0, out.stderr
        assert f"wrote {SAMPLES[mapping]} samples" in out.stdout
        metadata = json.loads((data / mapping / "metadata.json").read_text())
        assert metadata["vocab_sizes"] == CARDINALITIES and metadata["dense_log"] is False
        np.testing.assert_array_equal(np.fromfile(data / mapping / "category.bin", "<i4").reshape(-1, 26),
                                      records[mapping][:, 14:])
    for mapping in ("train", "test"):
        assert_same_samples(read_all("sok_split", data, mapping), read_all("sok_split", paths["sok"], mapping))


def test_split_bin_refuses_bad_input_in_one_line_and_writes_nothing(raw, tmp_path, capsys):
    records, paths = raw
    bad = tmp_path / "bad"
    bad.mkdir()
    cut = records["train"].tobytes()[:-4]  # the last record truncated
    (bad / "train_data.bin").write_bytes(cut)
    (bad / "day0.bin").write_bytes(records["train"].tobytes())
    before = snapshot(tmp_path)
    status, out = split_bin_here(capsys, bad / "train_data.bin", tmp_path / "out", "--slot_size_array",
                                 ",".join(map(str, CARDINALITIES)))
    assert status == 2 and out.stderr.count("error:") == 1 and "train_data.bin" in out.stderr and "size" in out.stderr
    status, out = split_bin_here(capsys, bad / "train_data.bin", tmp_path / "out")
    assert status == 2 and "cardinalities" in out.stderr
    status, out = split_bin_here(capsys, bad / "day0.bin", tmp_path / "out", "--slot_size_array", "3,4")
    assert status == 2 and "day0.bin" in out.stderr and "train_data.bin or test_data.bin" in out.stderr
    assert snapshot(tmp_path) == before


def test_transcribe_writes_a_sok_split_dataset(raw, tmp_path, capsys):
    """--dst_dataset_type sok_split: both mappings from split-binary; read back, the same batches."""
    records, paths = raw
    binary, sok = tmp_path / "binary", tmp_path / "sok"
    transcribe.transcribe("hugectr_raw", paths["raw"], str(binary), "tf_raw", src_batch_size=32,
                          hugectr_cardinalities=CARDINALITIES)
    result = transcribe_here(capsys, "--src_dataset_path", binary, "--src_batch_size", 32, "--dst_dataset_type",
                             "sok_split", "--dst_dataset_path", sok)
    assert result.returncode == 0, result.stderr
    assert sorted(os.listdir(sok)) == ["test", "train"]
    for mapping in ("train", "test"):
        assert_same_samples(read_all("sok_split", sok, mapping), read_all("sok_split", paths["sok"], mapping))


# ------------------------------------------------------------------------------ main.py's SOK flags
def test_sok_aliases_are_announced_and_mapped(tmp_path):
    log = tmp_path / "log.json"
    result = main_py([*SMALL_MODEL[:6], "--dataset_type", "synthetic", "--synthetic_dataset_cardinalities",
                      "50,20,7,30", "--synthetic_dataset_num_numerical_features", "5",
                      "--synthetic_dataset_train_batches", "12", "--synthetic_dataset_valid_batches", "3",
                      "--global_batch_size", "64", "--custom_interact", "--early_stop", "5", "--eval_in_last",
                      "--compress", "--log_path", str(log)])
    assert_ok(result)
    out = result.stdout
    assert "--global_batch_size 64 (SOK): --batch_size 64 --valid_batch_size 64" in out
    assert "--custom_interact (SOK): --dot_interaction custom_cpu" in out
    assert "--early_stop 5 (SOK): --max_steps 5" in out
    assert "--eval_in_last (SOK): --evals_per_epoch 0" in out
    assert "--compress (SOK): " in out
    assert "dot interaction: custom_cpu" in out
    assert out.count("Evaluation completed") == 1 and "step: 5," in out  # once, after the last step
    data = final_record(log)
    assert data["evaluations"] == 1


@pytest.mark.parametrize("args, message", [
    (["--global_batch_size", "32"], "--global_batch_size 32 (SOK) means --batch_size 32, but --batch_size 64"),
    (["--early_stop", "3", "--max_steps", "4"], "--early_stop 3 (SOK) means --max_steps 3, but --max_steps 4"),
    (["--eval_in_last", "--evals_per_epoch", "2"], "--eval_in_last (SOK) means --evals_per_epoch 0"),
    (["--custom_interact"], "--custom_interact (SOK) means --dot_interaction custom_cpu, but --dot_interaction "
                            "tensorflow"),
    (["--data_dir", "/x", "--dataset_type", "synthetic"], "--data_dir /x (SOK) means --dataset_type sok_split"),
    (["--target_auc", "1.5"], "--target_auc must be in (0, 1], got 1.5"),
    (["--target_auc", "0.7", "--evals_per_epoch", "0"], "--target_auc stops training at an evaluation"),
])
def test_a_contradicted_alias_is_one_error(tmp_path, capsys, args, message):
    before = snapshot(tmp_path)
    code, stderr = run_in_process(SMALL + ["--log_path", str(tmp_path / "log.json")] + args, capsys)
    assert_refused(code, stderr, message, tmp_path, before)


def test_target_auc_stops_after_the_evaluation_that_reaches_it(tmp_path):
    log, ckpt = tmp_path / "log.json", tmp_path / "ckpt"
    result = main_py(SMALL + ["--evals_per_epoch", "6", "--epochs", "3", "--target_auc", "0.01",
                              "--save_checkpoint_path", str(ckpt), "--log_path", str(log)])
    assert_ok(result)
    assert result.stdout.count("Evaluation completed") == 1
    assert "target AUC 0.01 reached at step 3 " in result.stdout  # the first evaluation point of 12 steps
    data = final_record(log)
    assert data["target_auc_step"] == 3 and data["evaluations"] == 1
    assert os.listdir(ckpt) == ["step_000000003"]  # saved at the stop, as at the end


def test_fp16_allreduce_trains_close_but_not_equal_weights(tmp_path):
    """2 ranks under horovodrun: the same run with and without float16 gradients in the allreduce."""
    weights = {}
    for fp16 in (False, True):
        ckpt = tmp_path / f"ckpt_{fp16}"
        args = ["main.py", *SMALL, "--max_steps", "6", "--save_checkpoint_path", str(ckpt), "--deterministic",
                "--log_path", str(tmp_path / f"log_{fp16}.json")] + (["--fp16_allreduce"] if fp16 else [])
        assert_ok(run_horovod(args, np=2, timeout=300))
        weights[fp16] = checkpoint_arrays(ckpt)
    dense = [name for name in weights[False] if "embedding" not in name and "feature" not in name]
    assert dense
    differ = False
    for name in weights[False]:
        np.testing.assert_allclose(weights[True][name], weights[False][name], rtol=0, atol=2e-3)
        differ |= not np.array_equal(weights[True][name], weights[False][name])
    assert differ


def test_the_sok_command_line_runs_as_written(raw, tmp_path):
    """SOK's split_bin then `horovodrun -np 2 python3 main.py --data_dir=... --global_batch_size=...
    --xla --amp --compress --custom_interact --eval_in_last --early_stop N` (small batch)."""
    records, paths = raw
    data = tmp_path / "data"
    for mapping in ("train", "test"):
        split_bin.main([os.path.join(paths["raw"], f"{mapping}_data.bin"), str(data / mapping),
                        "--slot_size_array", str(CARDINALITIES)])
    log = tmp_path / "log.json"
    result = run_horovod(["main.py", f"--data_dir={data}", f"--global_batch_size={BATCH}", "--xla", "--amp",
                          "--compress", "--custom_interact", "--eval_in_last", "--early_stop", "3",
                          "--embedding_dim", "8", "--bottom_mlp_dims", "16,8", "--top_mlp_dims", "16,1",
                          "--log_path", str(log)], np=2, timeout=600)
    assert_ok(result)
    out = result.stdout
    assert f"--data_dir {data} (SOK): --dataset_type sok_split --dataset_path {data}" in out
    assert out.count("Evaluation completed") == 1 and "step: 3," in out
    data_record = final_record(log)
    assert data_record["evaluations"] == 1 and np.isfinite(data_record["auc"])
