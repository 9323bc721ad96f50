"""Multi-hot end to end through the entry points: a multi-hot split-binary dataset trains, evaluates
and deploys with main.py; the same samples as ragged split-TFRecords give the same model; two ranks
under horovodrun equal one process (model-parallel, column- and row-sliced tables, data-parallel
input); and the MLPerf DLRM-DCNv2 recipe runs on the materialised stand-in."""
import numpy as np
import pytest

from recsys.data import synthetic_data
from dataloading import materialize_multihot, transcribe
from recsys.data.feature_spec import get_default_feature_spec
from multiproc import assert_ok, assert_one_error, run_horovod, run_python
from test_main import SMALL_MODEL, checkpoint_arrays, final_record, main_py

CARDINALITIES = [50, 400, 7, 30]
HOTNESS = [3, 1, 2, 5]
BATCH = 64
TRAIN, TEST = 12 * BATCH, 3 * BATCH
TRAINING = SMALL_MODEL + ["--batch_size", str(BATCH), "--valid_batch_size", str(BATCH), "--learning_rate", "0.5",
                          "--warmup_steps", "2", "--seed", "7", "--deterministic"]


@pytest.fixture(scope="module")
def binary(tmp_path_factory):
    """A multi-hot split-binary dataset: feature 3 mean-pooled, the others summed."""
    directory = tmp_path_factory.mktemp("multihot") / "binary"
    spec = get_default_feature_spec(3, CARDINALITIES, str(directory), hotness=HOTNESS)
    spec.feature_spec[spec.categorical_names[3]]["pooling"] = "mean"
    synthetic_data.write_synthetic_dataset(spec, TRAIN, TEST, seed=5)
    return directory


def test_a_multi_hot_dataset_trains_evaluates_and_deploys(binary, tmp_path):
    data = ["--dataset_path", str(binary)]
    assert_ok(main_py([*TRAINING, *data, "--epochs", "3", "--save_checkpoint_path", str(tmp_path / "c"),
                       "--log_path", str(tmp_path / "train.json")]))
    trained = final_record(tmp_path / "train.json")
    assert trained["auc"] > 0.6  # learns from pooled ids (chance is 0.5)
    assert_ok(main_py([*TRAINING, *data, "--mode", "eval", "--restore_checkpoint_path", str(tmp_path / "c"),
                       "--log_path", str(tmp_path / "eval.json")]))
    assert final_record(tmp_path / "eval.json")["auc"] == pytest.approx(trained["auc"], abs=1e-6)
    assert_ok(main_py([*TRAINING, *data, "--mode", "deploy", "--restore_checkpoint_path", str(tmp_path / "c"),
                       "--saved_model_output_path", str(tmp_path / "sm")]))
    assert_ok(main_py([*TRAINING, *data, "--mode", "eval", "--saved_model_input_path", str(tmp_path / "sm"),
                       "--log_path", str(tmp_path / "served.json")]))
    assert final_record(tmp_path / "served.json")["auc"] == pytest.approx(trained["auc"], abs=1e-5)


@pytest.fixture(scope="module")
def records(binary, tmp_path_factory):
    """The same samples as ragged split-TFRecords."""
    directory = tmp_path_factory.mktemp("multihot") / "records"
    transcribe.transcribe("tf_raw", str(binary), str(directory), src_batch_size=BATCH, dst_prebatch_size=BATCH)
    return directory


def test_ragged_split_tfrecords_train_the_same_model_as_split_binary(binary, records, tmp_path):
    runs = {}
    for name, data in (("binary", ["--dataset_path", str(binary)]),
                       ("records", ["--dataset_path", str(records), "--dataset_type", "split_tfrecords"])):
        assert_ok(main_py([*TRAINING, *data, "--save_checkpoint_path", str(tmp_path / f"{name}_checkpoint"),
                           "--log_path", str(tmp_path / f"{name}.json")]))
        runs[name] = checkpoint_arrays(tmp_path / f"{name}_checkpoint")
    assert runs["binary"].keys() == runs["records"].keys()
    for key in runs["binary"]:
        np.testing.assert_allclose(runs["records"][key], runs["binary"][key], rtol=1e-6, atol=1e-7, err_msg=key)
    assert final_record(tmp_path / "records.json")["auc"] == pytest.approx(
        final_record(tmp_path / "binary.json")["auc"], abs=1e-6)


@pytest.mark.parametrize("ragged, layout", [
    (False, ["--column_slice_threshold", "400", "--row_slice_threshold", "3000"]),
    (False, ["--data_parallel_input", "--row_slice_threshold", "1000", "--data_parallel_threshold", "100"]),
    (True, ["--data_parallel_input", "--micro_batches", "2"]),
], ids=["model-parallel input, column and row slices", "data-parallel input, row slices, replicas",
        "ragged ids, data-parallel input pipelined, micro-batches"])
def test_two_ranks_equal_one_process_on_multi_hot_data(binary, records, tmp_path, ragged, layout):
    """On two ranks the data-parallel input is pipelined (the default): the next batch's ids, ragged
    ones too (their row lengths, then the values), are exchanged during the step."""
    data = ["--dataset_path", str(records), "--dataset_type", "split_tfrecords"] if ragged \
        else ["--dataset_path", str(binary)]
    args = [*TRAINING, *data, "--max_steps", "6", *layout]
    assert_ok(main_py([*args, "--save_checkpoint_path", str(tmp_path / "one")]))
    assert_ok(run_horovod(["main.py", *args, "--save_checkpoint_path", str(tmp_path / "two")], np=2,
                          transport="gloo"))
    one, two = checkpoint_arrays(tmp_path / "one"), checkpoint_arrays(tmp_path / "two")
    assert one.keys() == two.keys()
    for key in one:
        np.testing.assert_allclose(two[key], one[key], rtol=1e-5, atol=1e-6, err_msg=key)


def test_the_mlperf_recipe_runs_on_the_materialised_standin(tmp_path):
    standin = materialize_multihot.write_standin(str(tmp_path / "standin"), 4 * 256, 256, seed=1)
    small = ["--embedding_dim", "16", "--bottom_mlp_dims", "32,16", "--top_mlp_dims", "32,1",
             "--cross_layer_projection_dim", "16", "--batch_size", "256", "--valid_batch_size", "256"]
    result = run_python(["dcnv2.py", "--preset", "mlperf_dcnv2", "--dataset_path", standin.base_directory, *small,
                         "--log_path", str(tmp_path / "log.json")])
    assert_ok(result)
    record = final_record(tmp_path / "log.json")
    assert record["evaluations"] == 1 and 0.0 < record["auc"] < 1.0
    one_hot = tmp_path / "one_hot"
    synthetic_data.write_synthetic_dataset(get_default_feature_spec(13, [100] * 26, str(one_hot)), 512, 256, seed=0)
    assert_one_error(run_python(["dcnv2.py", "--preset", "mlperf_dcnv2", "--dataset_path", str(one_hot), *small]),
                     "--preset mlperf_dcnv2 needs MLPerf's hotness", code=2)
