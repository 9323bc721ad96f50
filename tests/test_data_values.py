"""Bad stored values (label bytes other than 0/1, NaN/Inf numericals, ids outside [0, cardinality))
are caught by default where batches are read, by the up-front `validate_data` scan, by the served
SavedModel's signature, and end to end in main.py as one error line and exit 2."""
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import dataloader
import datasets
import synthetic_data
import saved_model
from data_rank_worker import open_pipelines
from feature_spec import get_default_feature_spec
from model import Dlrm, DlrmConfig
from test_main import SMALL_MODEL, main_py

NUM_NUMERICAL = 2
CARDINALITIES = [100, 5000, 7]  # int8, int16, int8 files; the last is the smallest table
TRAIN, TEST = 500, 200
BATCH = 128


@pytest.fixture
def data_dir(tmp_path):
    directory = tmp_path / "data"
    spec = get_default_feature_spec(NUM_NUMERICAL, CARDINALITIES, str(directory))
    synthetic_data.write_synthetic_dataset(spec, TRAIN, TEST, seed=0)
    return directory


def corrupt(path, dtype, width, sample, value, column=0):
    """Overwrite one stored value in place: sample `sample`, column `column` of `width`."""
    values = np.fromfile(path, dtype=dtype).reshape(-1, width)
    values[sample, column] = value
    values.tofile(path)


def pipelines(directory, **kwargs):
    return open_pipelines(str(directory), **(dict(train_batch_size=BATCH, eval_batch_size=BATCH) | kwargs))


def consume(dataset):
    """Batches read before the pipeline stopped, and the DataError it stopped with (or None)."""
    batches = 0
    try:
        with datasets.surface_data_errors():
            for _ in dataset:
                batches += 1
    except datasets.DataError as error:
        return batches, str(error)
    return batches, None


# (mapping, file, dtype, width, sample, column, value, words the message must hold)
BAD_VALUES = {
    "label byte 2": ("train", "label.bin", np.uint8, 1, 301, 0, 2,
                     ["label 'label' (mapping 'train') has byte 2 at sample 301"]),
    "label byte 255": ("test", "label.bin", np.uint8, 1, 199, 0, 255,
                       ["label 'label' (mapping 'test') has byte 255 at sample 199"]),
    "NaN numerical": ("train", "numerical.bin", np.float16, 2, 300, 1, np.nan,
                      ["numerical feature 'num_1' (mapping 'train') is nan at sample 300"]),
    "Inf numerical": ("test", "numerical.bin", np.float16, 2, 150, 0, np.inf,
                      ["numerical feature 'num_0' (mapping 'test') is inf at sample 150"]),
    "-Inf numerical": ("train", "numerical.bin", np.float16, 2, 260, 1, -np.inf,
                       ["'num_1'", "is -inf at sample 260"]),
    "negative id": ("train", "cat_0.bin", np.int8, 1, 290, 0, -1,
                    ["feature 'cat_0.bin' (mapping 'train') has id -1 at sample 290",
                     "outside [0, 100)"]),
    "id = cardinality": ("test", "cat_1.bin", np.int16, 1, 199, 0, 5000,
                         ["'cat_1.bin' (mapping 'test') has id 5000 at sample 199", "[0, 5000)"]),
    "id of a neighbouring table": ("train", "cat_2.bin", np.int8, 1, 330, 0, 9,
                                   ["'cat_2.bin'", "id 9 at sample 330", "[0, 7)"]),
}


@pytest.mark.parametrize("case", sorted(BAD_VALUES))
def test_the_pipeline_stops_at_the_bad_value_and_names_it(data_dir, case):
    mapping, name, dtype, width, sample, column, value, words = BAD_VALUES[case]
    path = data_dir / mapping / name
    corrupt(path, dtype, width, sample, value, column)
    built = pipelines(data_dir)
    batches, message = consume(getattr(built, mapping))
    assert message is not None, "the bad value went through"
    assert message.startswith(f"{path}: ") and "\n" not in message
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"
    assert batches == sample // BATCH  # every batch before the bad one was delivered
    other = built.test if mapping == "train" else built.train
    assert consume(other) == (len(other), None)


def test_read_batch_raises_and_the_opt_out_lets_the_value_through(data_dir):
    corrupt(data_dir / "train" / "label.bin", np.uint8, 1, 5, 2)
    spec = dataloader.load_feature_spec(dataset_path=str(data_dir))
    with pytest.raises(datasets.DataError, match="byte 2 at sample 5"):
        datasets.SplitBinaryReader(spec, "train", BATCH).read_batch(0)
    unchecked = pipelines(data_dir, check_values=False)
    _, labels = next(iter(unchecked.train))
    assert labels[5, 0] == 1.0  # what TensorFlow makes of byte 2 when nothing checks it


@pytest.mark.parametrize("world_size, rank, data_parallel", [(2, 0, True), (2, 1, True),
                                                             (2, 1, False)])
def test_each_rank_checks_what_it_reads_and_names_the_sample_in_the_file(data_dir, world_size, rank,
                                                                        data_parallel):
    # Sample 300 is in batch 2 (samples 256-383): rank 0's local half holds it, rank 1's does not;
    # a rank reading the global batch of a feature (model-parallel input) sees it.
    corrupt(data_dir / "train" / "cat_1.bin", np.int16, 1, 300, -7)
    built = pipelines(data_dir, rank=rank, world_size=world_size, owned=None if data_parallel else [1])
    batches, message = consume(built.train)
    if data_parallel and rank == 1:
        assert (batches, message) == (3, None)
    else:
        assert batches == 2 and "'cat_1.bin' (mapping 'train') has id -7 at sample 300" in message


@pytest.mark.parametrize("name, dtype, width, value, words", [
    ("label.bin", np.uint8, 1, 3, "byte 3 at sample 499"),
    ("numerical.bin", np.float16, 2, np.nan, "is nan at sample 499"),
    ("cat_0.bin", np.int8, 1, 100, "id 100 at sample 499"),
])
def test_validate_data_scans_what_training_would_drop(data_dir, name, dtype, width, value, words):
    corrupt(data_dir / "train" / name, dtype, width, TRAIN - 1, value)  # in the dropped remainder
    assert consume(pipelines(data_dir).train) == (TRAIN // BATCH, None)
    with pytest.raises(datasets.DataError) as error:
        pipelines(data_dir, validate_data=True)
    assert str(error.value).startswith(f"{data_dir / 'train' / name}: ") and words in str(error.value)


def test_other_tensorflow_errors_pass_unchanged():
    with pytest.raises(tf.errors.InvalidArgumentError, match="unrelated"):
        with datasets.surface_data_errors():
            tf.debugging.Assert(False, ["unrelated"])


# --------------------------------------------------------------------------- SavedModel
@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    config = DlrmConfig(num_numerical_features=NUM_NUMERICAL, cardinalities=CARDINALITIES,
                        embedding_dim=4, bottom_mlp_dims=[8, 4], top_mlp_dims=[8, 1],
                        interaction="tensorflow")
    model = Dlrm(config)
    model.build_weights()
    path = saved_model.export(model, str(tmp_path_factory.mktemp("export") / "saved_model"))
    return tf.saved_model.load(path).signatures[saved_model.SIGNATURE]


def serving_inputs():
    numerical = np.linspace(0, 1, 4 * NUM_NUMERICAL, dtype=np.float32).reshape(4, NUM_NUMERICAL)
    categorical = np.array([[c - 1 - row for c in CARDINALITIES] for row in range(4)], np.int32)
    return numerical, categorical


SERVING_ERRORS = [
    ("categorical", (2, 0), 100, "categorical_features row 2, column 0 has id 100, outside [0, 100)"),
    ("categorical", (1, 1), -1, "categorical_features row 1, column 1 has id -1, outside [0, 5000)"),
    ("categorical", (3, 2), 7, "categorical_features row 3, column 2 has id 7, outside [0, 7)"),
    ("numerical", (0, 1), np.nan, "numerical_features row 0, column 1 is nan"),
    ("numerical", (3, 0), -np.inf, "numerical_features row 3, column 0 is -inf"),
]


@pytest.mark.parametrize("which, where, value, words", SERVING_ERRORS)
def test_the_serving_signature_refuses_bad_inputs(serve, which, where, value, words):
    numerical, categorical = serving_inputs()
    assert np.isfinite(serve(numerical_features=numerical,
                             categorical_features=categorical)["probabilities"].numpy()).all()
    (numerical if which == "numerical" else categorical)[where] = value
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        serve(numerical_features=numerical, categorical_features=categorical)
    assert f"{datasets.SERVING_INPUT_ERROR} {words}" in error.value.message
    with pytest.raises(datasets.DataError) as converted:
        with datasets.surface_data_errors():
            serve(numerical_features=numerical, categorical_features=categorical)
    assert str(converted.value).startswith(datasets.SERVING_INPUT_ERROR) and words in str(converted.value)
    assert "\n" not in str(converted.value)


# ------------------------------------------------------------------------------ main.py
def snapshot(root):
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(Path(root).rglob("*"))}


@pytest.mark.parametrize("mapping, name, dtype, width, value, words", [
    ("train", "label.bin", np.uint8, 1, 2, "label 'label' (mapping 'train') has byte 2 at sample 70"),
    ("test", "numerical.bin", np.float16, 2, np.nan,  # found by the evaluation after the epoch
     "numerical feature 'num_0' (mapping 'test') is nan at sample 70"),
])
def test_main_reports_bad_data_in_one_line_and_writes_nothing(data_dir, tmp_path, mapping, name, dtype,
                                                              width, value, words):
    path = data_dir / mapping / name
    corrupt(path, dtype, width, 70, value)
    before = snapshot(data_dir)
    result = main_py(SMALL_MODEL + ["--dataset_path", str(data_dir), "--batch_size", "64",
                                    "--valid_batch_size", "64", "--log_path", str(tmp_path / "log.json"),
                                    "--save_checkpoint_path", str(tmp_path / "ckpt"),
                                    "--saved_model_output_path", str(tmp_path / "exported")])
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if "error:" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith(f"error: {path}: {words}"), result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "INVALID_ARGUMENT" not in result.stderr
    assert snapshot(data_dir) == before
    assert not (tmp_path / "ckpt").exists() and not (tmp_path / "exported").exists()
