"""The registry of dataset formats (`data_formats`): main.py's choices read without TensorFlow,
every format registered once by its own module, options one format owns refused for the others, and
a toy format added in one module (tests/toy_npy_format.py) that trains through the loader and
that transcribe lists and reads."""
import subprocess
import sys

import numpy as np
import pytest

from recsys.data import data_formats
import dataloader
import datasets
from recsys.data.batch import CATEGORICAL_KEY, NUMERICAL_KEY
from dataloading import transcribe
from factory import ModelOptions, build_trainer
from recsys.training.model_config import DlrmSettings, TrainingSettings
from recsys.data.pipeline_errors import surface_data_errors
from recsys.sparse.sharding import plan_sharding
from test_dataloading import REPO_ROOT, transcribe_here

TRAINING = ("tf_raw", "hugectr_raw", "sok_split", "split_tfrecords", "synthetic", "torchrec_npy")
SOURCES = ("nvt", "tfrecords_multihot", "csv", "tf_raw", "hugectr_raw", "sok_split", "split_tfrecords", "synthetic",
           "torchrec_npy", "binary_multihot")
DESTINATIONS = ("tf_raw", "hugectr_raw", "sok_split", "split_tfrecords")
CARDINALITIES = [5, 40, 300]
BATCH = 32


def test_main_reads_the_formats_from_the_registry_without_tensorflow():
    script = ("import sys, main; from recsys.data import data_formats; "
              "assert 'tensorflow' not in sys.modules, 'TensorFlow was imported'; "
              "print(main.FLAGS['dataset_type'].parser.enum_values); "
              "print([data_formats.names(r) for r in data_formats.ROLES]); "
              "print('tensorflow' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    choices, roles, tensorflow_loaded = result.stdout.splitlines()
    assert choices == str(list(TRAINING))
    assert roles == str([TRAINING, SOURCES, DESTINATIONS])
    assert tensorflow_loaded == "False"


def test_transcribe_lists_every_registered_source_and_destination():
    assert set(SOURCES) <= set(transcribe.source_types())
    assert set(transcribe.destination_types()) == set(DESTINATIONS)
    assert set(TRAINING) <= set(datasets.dataset_types())


def test_each_format_is_registered_by_the_module_that_reads_it():
    modules = {name: declaration.module for name, declaration in data_formats.declarations().items()}
    assert {name: modules[name] for name in SOURCES + DESTINATIONS} == {name: "recsys.data." + module for name, module in {
        "tf_raw": "split_binary", "split_tfrecords": "split_tfrecords", "synthetic": "synthetic_data",
        "hugectr_raw": "hugectr_data", "sok_split": "hugectr_data", "torchrec_npy": "torchrec_data",
        "binary_multihot": "torchrec_data", "nvt": "column_data", "tfrecords_multihot": "column_data",
        "csv": "csv_data"}.items()}
    for name in TRAINING:
        assert data_formats.get(name, "training").declaration == data_formats.declarations()[name]


@pytest.mark.parametrize("name, options, words", [
    ("tf_raw", {"hugectr_cardinalities": [3]}, "--hugectr_cardinalities describes --dataset_type hugectr_raw data, not tf_raw"),
    ("sok_split", {"hugectr_dense_log": False}, "--hugectr_dense_log describes --dataset_type hugectr_raw data, not sok_split"),
    ("synthetic", {"num_embeddings_per_feature": [3]},
     "--num_embeddings_per_feature describes --dataset_type torchrec_npy data, not synthetic")])
def test_an_option_another_format_owns_is_refused(name, options, words):
    with pytest.raises(ValueError, match=words):
        datasets.load_feature_spec(dataset_type=name, dataset_path="/nonexistent", **options)
    data_formats.check_options(name, {key: None for key in options})  # not given: nothing to refuse


def test_an_unknown_format_names_the_choices():
    with pytest.raises(ValueError, match=r"dataset_type must be one of \['tf_raw', .*got 'csv'"):
        datasets.load_feature_spec(dataset_type="csv", dataset_path="/nonexistent")
    with pytest.raises(ValueError, match=r"--dst_dataset_type must be one of .*got 'torchrec_npy'"):
        data_formats.get("torchrec_npy", "destination")


def test_a_name_registered_twice_or_roles_that_are_not_literal_are_refused(tmp_path):
    with pytest.raises(ValueError, match="format 'tf_raw' is registered twice: by recsys.data.split_binary and by"):
        data_formats.register_format("tf_raw", training=True, load_spec=lambda *_: None, reader=object)
    bad = tmp_path / "bad_format.py"
    bad.write_text("from recsys.data import data_formats\nROLE = True\n"
                   "data_formats.register_format('bad', training=ROLE, load_spec=None, reader=None)\n")
    with pytest.raises(ValueError, match=r"bad_format.py:3: register_format's training must be a literal"):
        data_formats._declared_in(str(bad), "bad_format")


def test_the_model_a_format_feeds_is_read_from_source_and_keeps_the_lists_apart(tmp_path):
    plug_in = tmp_path / "other_model_format.py"
    plug_in.write_text("from recsys.data import data_formats\n"
                       "data_formats.register_format('other_npy', training=True, model='other', load_spec=None, "
                       "reader=None)\n")
    (declared,) = data_formats._declared_in(str(plug_in), "other_model_format")
    assert (declared.name, declared.model, declared.training) == ("other_npy", "other", True)
    assert {d.model for name, d in data_formats.declarations().items() if name in TRAINING} == {"dlrm"}
    with pytest.raises(ValueError, match=r"dataset_type must be one of \[\], got 'tf_raw'"):
        data_formats.get("tf_raw", "training", model="other")


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """A toy_npy dataset (train: 4 batches, test: 2.5) and the toy format registered by importing its module."""
    import toy_npy_format

    rng = np.random.default_rng(0)
    splits = {}
    for mapping, samples in (("train", 4 * BATCH), ("test", 5 * BATCH // 2)):
        ids = np.column_stack([rng.integers(0, c, samples) for c in CARDINALITIES]).astype(np.int32)
        splits[mapping] = (rng.random(samples) < 0.4, rng.normal(size=(samples, 3)).astype(np.float16), ids)
    folder = str(tmp_path_factory.mktemp("toy") / "data")
    toy_npy_format.write_toy(folder, CARDINALITIES, splits)
    return folder, splits


def pipelines(dataset_type, path):
    spec = datasets.load_feature_spec(dataset_type=dataset_type, dataset_path=path)
    return dataloader.create_input_pipelines(spec, dataloader.PipelineConfig(
        dataset_type=dataset_type, train_batch_size=BATCH, eval_batch_size=BATCH, validate_data=True))


def elements(dataset):
    with surface_data_errors():
        return [(labels.numpy(), features[NUMERICAL_KEY].numpy(), [ids.numpy() for ids in features[CATEGORICAL_KEY]])
                for features, labels in dataset]


def train(dataset, steps=4):
    plan = plan_sharding(CARDINALITIES, (4,) * len(CARDINALITIES), 1)
    trainer = build_trainer(plan, 0, plan.reads(0), ModelOptions(
        num_numerical_features=3, model=DlrmSettings(bottom_mlp_dims=[8, 4], top_mlp_dims=[8, 1], seed=3),
        training=TrainingSettings(learning_rate=0.5, warmup_steps=0, decay_start_step=10**9, decay_steps=1)))
    losses = [float(trainer.train_step(features, labels)[0]) for features, labels in dataset.take(steps)]
    return losses, [v.numpy() for v in trainer.model.trainable_variables]


def test_a_toy_format_in_one_module_trains_through_the_loader(toy):
    folder, splits = toy
    assert "toy_npy" in datasets.dataset_types()
    served = pipelines("toy_npy", folder)
    assert (served.train_steps, served.eval_steps) == (4, 3)  # the test data's last partial batch is served
    train_elements = elements(served.train)
    labels, numerical, ids = splits["train"]
    for index, (batch_labels, batch_numerical, batch_ids) in enumerate(train_elements):
        rows = slice(index * BATCH, (index + 1) * BATCH)
        np.testing.assert_array_equal(batch_labels[:, 0], labels[rows].astype(np.float32))
        np.testing.assert_array_equal(batch_numerical, numerical[rows].astype(np.float32))
        for table, table_ids in enumerate(batch_ids):
            np.testing.assert_array_equal(table_ids, ids[rows, table])
    losses, weights = train(served.train)
    assert all(np.isfinite(losses)) and len(losses) == 4
    initial = train(served.train, steps=0)[1]
    assert not all(np.array_equal(a, b) for a, b in zip(weights, initial, strict=True))


def test_transcribe_lists_and_reads_the_toy_format_and_the_copy_trains_alike(toy, tmp_path, capsys):
    folder, _ = toy
    copy = tmp_path / "copy"
    result = transcribe_here(capsys, "--src_dataset_type", "toy_npy", "--src_dataset_path", folder,
                             "--dst_dataset_type", "tf_raw", "--dst_dataset_path", copy, "--src_batch_size", BATCH)
    assert result.returncode == 0, result.stderr
    assert "wrote 4 train and 3 test batches" in result.stdout
    toy_served, copy_served = pipelines("toy_npy", folder), pipelines("tf_raw", str(copy))
    for split in ("train", "test"):
        for a, b in zip(elements(getattr(toy_served, split)), elements(getattr(copy_served, split)), strict=True):
            np.testing.assert_array_equal(a[0], b[0])
            np.testing.assert_array_equal(a[1], b[1])
            for ids_a, ids_b in zip(a[2], b[2], strict=True):
                np.testing.assert_array_equal(ids_a, ids_b)
    toy_weights, copy_weights = train(toy_served.train)[1], train(copy_served.train)[1]
    for a, b in zip(toy_weights, copy_weights, strict=True):
        np.testing.assert_array_equal(a, b)


def test_bad_toy_data_is_one_data_error_naming_the_file(toy, tmp_path):
    folder, splits = toy
    broken = str(tmp_path / "broken")
    labels, numerical, ids = (array.copy() for array in splits["train"])
    ids[70, 1] = 40
    import toy_npy_format

    toy_npy_format.write_toy(broken, CARDINALITIES, {"train": (labels, numerical, ids), "test": splits["test"]})
    with pytest.raises(ValueError, match=r"train_ids.npy: feature 'cat_1.bin' \(mapping 'train'\) has id 40 at sample 70"):
        pipelines("toy_npy", broken)  # --validate_data scans every batch through the format's reader
