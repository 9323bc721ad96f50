"""Bad stored values (label bytes other than 0/1, NaN/Inf numericals, ids outside [0, cardinality))
are caught by default where batches are read, by the up-front `validate_data` scan, by the served
SavedModel's signature, and end to end in main.py as one error line and exit 2."""
import json
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from recsys.data import data_errors
import datasets
from recsys.data import split_binary
from recsys.data import pipeline_errors
import saved_model
from recsys.data import synthetic_data
from recsys.data.batch import CATEGORICAL_KEY, NUMERICAL_KEY
from data_rank_worker import open_pipelines
from recsys.data.feature_spec import get_default_feature_spec
from factory import single_process_model
from recsys.training.model_config import DlrmConfig
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
        with pipeline_errors.surface_data_errors():
            for _ in dataset:
                batches += 1
    except data_errors.DataError as error:
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
    spec = datasets.load_feature_spec(dataset_path=str(data_dir))
    with pytest.raises(data_errors.DataError, match="byte 2 at sample 5"):
        split_binary.SplitBinaryReader(spec, "train", BATCH).read_batch(0)
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
    with pytest.raises(data_errors.DataError) as error:
        pipelines(data_dir, validate_data=True)
    assert str(error.value).startswith(f"{data_dir / 'train' / name}: ") and words in str(error.value)


def test_other_tensorflow_errors_pass_unchanged():
    with pytest.raises(tf.errors.InvalidArgumentError, match="unrelated"):
        with pipeline_errors.surface_data_errors():
            tf.debugging.Assert(False, ["unrelated"])


# --------------------------------------------------------------------------- SavedModel
def small_model():
    config = DlrmConfig(num_numerical_features=NUM_NUMERICAL, cardinalities=CARDINALITIES,
                        embedding_dim=(4,) * len(CARDINALITIES), bottom_mlp_dims=[8, 4], top_mlp_dims=[8, 1],
                        interaction="tensorflow")
    model = single_process_model(config)
    model.build_weights()
    return model


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return saved_model.export(small_model(), str(tmp_path_factory.mktemp("export") / "saved_model"))


@pytest.fixture(scope="module")
def loaded(exported):
    return tf.saved_model.load(exported)


@pytest.fixture(scope="module")
def serve(loaded):
    return loaded.signatures[saved_model.SIGNATURE]


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
    assert f"{pipeline_errors.SERVING_INPUT_ERROR} {words}" in error.value.message
    with pytest.raises(data_errors.DataError) as converted:
        with pipeline_errors.surface_data_errors():
            serve(numerical_features=numerical, categorical_features=categorical)
    assert str(converted.value).startswith(pipeline_errors.SERVING_INPUT_ERROR) and words in str(converted.value)
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


# Inputs of the wrong shape: (numerical shape, categorical shape, what the one error says).
SHAPE_ERRORS = {
    "numerical too wide": ((4, 3), (4, 3), "numerical_features has shape (4, 3), the model expects (B, 2)"),
    "numerical too narrow": ((4, 1), (4, 3), "numerical_features has shape (4, 1), the model expects (B, 2)"),
    "categorical too wide": ((4, 2), (4, 4), "categorical_features has shape (4, 4), the model expects (B, 3)"),
    "categorical too narrow": ((4, 2), (4, 2), "categorical_features has shape (4, 2), the model expects (B, 3)"),
    "numerical rank 1": ((2,), (4, 3), "numerical_features has shape (2,), the model expects (B, 2)"),
    "categorical rank 1": ((4, 2), (3,), "categorical_features has shape (3,), the model expects (B, 3)"),
    "numerical rank 3": ((4, 2, 1), (4, 3), "numerical_features has shape (4, 2, 1), the model expects (B, 2)"),
    "categorical rank 3": ((4, 2), (4, 3, 1), "categorical_features has shape (4, 3, 1), the model expects (B, 3)"),
    "batch sizes": ((5, 2), (4, 3), "numerical_features has 5 rows and categorical_features 4: both must have B rows"),
}


def shaped_inputs(numerical_shape, categorical_shape):
    return np.zeros(numerical_shape, np.float32), np.ones(categorical_shape, np.int32)


@pytest.mark.parametrize("case", SHAPE_ERRORS)
@pytest.mark.parametrize("call", ["signature", "serve"])
def test_the_serving_signature_names_the_input_and_both_shapes(loaded, serve, case, call):
    numerical_shape, categorical_shape, words = SHAPE_ERRORS[case]
    numerical, categorical = shaped_inputs(numerical_shape, categorical_shape)
    function = serve if call == "signature" else loaded.serve
    with pytest.raises(data_errors.DataError) as error:
        with pipeline_errors.surface_data_errors():
            function(numerical_features=numerical, categorical_features=categorical)
    assert str(error.value).startswith(f"{pipeline_errors.SERVING_INPUT_ERROR} {words}") and "\n" not in str(error.value)
    fine = shaped_inputs((4, 2), (4, 3))  # the same function serves a good batch
    assert function(numerical_features=fine[0], categorical_features=fine[1])["logits"].shape == (4, 1)


def pipeline_features(numerical_shape, *id_shapes):
    """A batch as a pipeline gives it: numericals, and each feature's ids (`[B]` for one-hot)."""
    return {NUMERICAL_KEY: tf.zeros(numerical_shape, tf.float32),
            CATEGORICAL_KEY: tuple(tf.ones(shape, tf.int32) for shape in id_shapes)}


GOOD_IDS = [(4,), (4,), (4,)]
# Batches load_predict_fn refuses: (numerical shape, each feature's id shape, what the one error says).
PREDICT_ERRORS = {
    "numerical too wide": ((4, 3), GOOD_IDS, SHAPE_ERRORS["numerical too wide"][2]),
    "numerical rank 1": ((2,), GOOD_IDS, SHAPE_ERRORS["numerical rank 1"][2]),
    "numerical rank 3": ((4, 2, 1), GOOD_IDS, SHAPE_ERRORS["numerical rank 3"][2]),
    "batch sizes": ((5, 2), GOOD_IDS, SHAPE_ERRORS["batch sizes"][2]),
    "a categorical feature too many": ((4, 2), GOOD_IDS + [(4,)],
                                       "the batch has 4 categorical features, the SavedModel serves 3 "
                                       "(hotness [1, 1, 1])"),
    "a categorical feature too few": ((4, 2), GOOD_IDS[:2], "the batch has 2 categorical features"),
    "ids wider than the hotness": ((4, 2), [(4, 2), (4,), (4,)],
                                   "categorical feature 0 has shape (4, 2), the SavedModel expects (B,) or (B, h) "
                                   "of h <= its hotness 1"),
    "ids of rank 3": ((4, 2), [(4,), (4, 1, 1), (4,)], "categorical feature 1 has shape (4, 1, 1)"),
    "ids of different rows": ((4, 2), [(4,), (4,), (5,)],
                              "the categorical features have [4, 4, 5] rows: each must have the batch's B rows"),
}


@pytest.mark.parametrize("case", PREDICT_ERRORS)
def test_load_predict_fn_names_what_is_wrong_with_a_batch(exported, case):
    numerical_shape, id_shapes, words = PREDICT_ERRORS[case]
    predict = saved_model.load_predict_fn(exported)
    with pytest.raises((data_errors.DataError, saved_model.ServingMismatchError)) as error:
        with pipeline_errors.surface_data_errors():
            predict(pipeline_features(numerical_shape, *id_shapes))
    assert words in str(error.value) and "\n" not in str(error.value)
    assert predict(pipeline_features((4, 2), *GOOD_IDS)).shape == (4, 1)


def write_version1_export(path, hotness_recorded):
    """An export as version 1 wrote it: the widths fixed in the signature, no names nor numerical
    count in the marker (and, before multi-hot, no hotness either)."""
    module = saved_model._Serving(small_model())
    fixed = tf.function(module._serve, input_signature=[
        tf.TensorSpec([None, NUM_NUMERICAL], tf.float32, name=NUMERICAL_KEY),
        tf.TensorSpec([None, len(CARDINALITIES)], tf.int32, name=CATEGORICAL_KEY)])
    tf.saved_model.save(module, str(path), signatures={saved_model.SIGNATURE: fixed})
    marker = {"format": saved_model.EXPORT_FORMAT, "version": 1} | ({"hotness": [1, 1, 1]} if hotness_recorded else {})
    (path / saved_model.EXPORT_MARKER).write_text(json.dumps(marker))
    return str(path)


DATASET = saved_model.ServedFeatures(["n0", "n1"], ["c0", "c1", "c2"], [1, 1, 1])


@pytest.mark.parametrize("hotness_recorded", [True, False])
def test_a_version1_export_loads_and_is_compared_by_its_widths(tmp_path, hotness_recorded):
    path = write_version1_export(tmp_path / "v1", hotness_recorded)
    predict = saved_model.load_predict_fn(path, DATASET)
    assert predict(pipeline_features((4, 2), *GOOD_IDS)).shape == (4, 1)
    for other, words in [(saved_model.ServedFeatures(["n0", "n1", "n2"], DATASET.categorical, [1, 1, 1]),
                          "numerical features ['n0', 'n1', 'n2']"),
                         (saved_model.ServedFeatures(DATASET.numerical, ["c0", "c1", "c2", "c3"], [1, 1, 1, 1]),
                          "categorical features ['c0', 'c1', 'c2', 'c3']")]:
        with pytest.raises(saved_model.ServingMismatchError) as error:
            saved_model.load_predict_fn(path, other)
        assert str(error.value) == (f"the SavedModel {path} serves 2 numerical and 3 categorical features (its marker "
                                    f"names none: an older export), but the dataset has {other.describe()}")
        assert words in str(error.value)


def test_an_export_with_names_refuses_another_dataset_naming_both_lists(tmp_path):
    path = saved_model.export(small_model(), str(tmp_path / "named"), features=DATASET)
    assert json.loads((tmp_path / "named" / saved_model.EXPORT_MARKER).read_text())["numerical_names"] == ["n0", "n1"]
    saved_model.load_predict_fn(path, DATASET)
    renamed = saved_model.ServedFeatures(["n0", "n1"], ["c0", "c1", "c9"], [1, 1, 1])
    with pytest.raises(saved_model.ServingMismatchError) as error:
        saved_model.load_predict_fn(path, renamed)
    assert str(error.value) == (f"the SavedModel {path} was exported for numerical features ['n0', 'n1'] and "
                                f"categorical features ['c0', 'c1', 'c2'], but the dataset has numerical features "
                                f"['n0', 'n1'] and categorical features ['c0', 'c1', 'c9'] (c9 only in the dataset; "
                                f"c2 only in the export)")
    with pytest.raises(ValueError, match="the model's 2 numerical features and hotness"):
        saved_model.export(small_model(), str(tmp_path / "wrong"),
                           features=saved_model.ServedFeatures(["n0"], ["c0"], [1]))
    assert not (tmp_path / "wrong").exists()
