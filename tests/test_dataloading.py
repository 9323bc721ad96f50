"""The V5 data commands: the spec generator, transcribe's quick start and round trips, and one error
line for bad input. The main paths run as users run them (`python -m dataloading...` from the
repository root); the further refusals call the same `main` in this process (no TensorFlow start-up
per case)."""
import filecmp
import os
import subprocess
import sys

import pytest
import yaml

from recsys.data import split_binary
from recsys.data import synthetic_data
from dataloading import transcribe
from recsys.data.feature_spec import CRITEO_VARIANTS, FeatureSpec, get_default_feature_spec

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_module(module, *args):
    return subprocess.run([sys.executable, "-m", f"dataloading.{module}", *map(str, args)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300)


def command_here(capsys, command_main, *args):
    """A `python -m dataloading.<command> ARGS`, run by its `main` in this process."""
    try:
        command_main([str(arg) for arg in args])
        status = 0
    except SystemExit as exit:
        status = exit.code
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(args, status, captured.out, captured.err)


def transcribe_here(capsys, *args):
    """`python -m dataloading.transcribe ARGS`, run by its `main` in this process."""
    return command_here(capsys, transcribe.main, *args)


def assert_one_error(result, *words):
    """Exit status 2 and one `error:` line on stderr holding `words`."""
    assert result.returncode == 2, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.stderr[-2000:]
    for word in words:
        assert str(word) in lines[0], lines[0]


def tree(directory):
    return sorted(os.path.relpath(os.path.join(root, name), directory)
                  for root, _, files in os.walk(directory) for name in files)


def assert_same_tree(a, b):
    assert tree(a) == tree(b)
    match, mismatch, errors = filecmp.cmpfiles(a, b, tree(a), shallow=False)
    assert mismatch == [] and errors == []


@pytest.mark.parametrize("variant", sorted(CRITEO_VARIANTS))
def test_generate_feature_spec_writes_the_v5_shape(tmp_path, variant):
    destination = tmp_path / "feature_spec.yaml"
    result = run_module("generate_feature_spec", "--variant", variant, "--dst", destination)
    assert result.returncode == 0, result.stderr
    raw = yaml.safe_load(destination.read_text())
    assert raw["source_spec"] is None
    assert raw["feature_spec"]["label"] == {"dtype": "int8"}
    assert raw["feature_spec"]["num_12"] == {"dtype": "float16"}
    assert [raw["feature_spec"][f"cat_{i}"]["cardinality"] for i in range(26)] == CRITEO_VARIANTS[variant]
    assert raw["feature_spec"]["cat_0"] | {"cardinality": 0} == {"cardinality": 0, "hotness": 1, "alpha": 1.45,
                                                                 "dtype": "int32"}
    assert raw["channel_spec"] == {"categorical": [f"cat_{i}" for i in range(26)],
                                   "numerical": [f"num_{i}" for i in range(13)], "label": ["label"]}
    assert os.listdir(tmp_path) == ["feature_spec.yaml"]


def test_generate_feature_spec_refuses_to_overwrite_unless_asked(tmp_path):
    destination = tmp_path / "feature_spec.yaml"
    destination.write_text("mine\n")
    assert_one_error(run_module("generate_feature_spec", "--variant", "criteo_t3_synthetic", "--dst", destination),
                     destination, "already exists", "--overwrite")
    assert destination.read_text() == "mine\n"
    assert_one_error(run_module("generate_feature_spec", "--variant", "criteo_t7", "--dst", destination),
                     "--variant", "criteo_t7")
    result = run_module("generate_feature_spec", "--variant", "criteo_t3_synthetic", "--dst", destination,
                        "--overwrite")
    assert result.returncode == 0, result.stderr
    assert FeatureSpec.from_yaml(str(destination)).cardinalities == CRITEO_VARIANTS["criteo_t3_synthetic"]
    assert sorted(os.listdir(tmp_path)) == ["feature_spec.yaml"]


def test_the_v5_quick_start_on_t15_and_on_to_split_tfrecords(tmp_path, capsys):
    source = tmp_path / "src"
    source.mkdir()
    assert run_module("generate_feature_spec", "--variant", "criteo_t15_synthetic",
                      "--dst", source / "feature_spec.yaml").returncode == 0
    raw = tmp_path / "preprocessed"
    result = run_module("transcribe", "--src_dataset_type", "synthetic", "--src_dataset_path", source,
                        "--dst_dataset_path", raw, "--max_batches_train", 3, "--max_batches_test", 2,
                        "--dst_dataset_type", "tf_raw", "--src_batch_size", 512)
    assert result.returncode == 0, result.stderr
    spec = FeatureSpec.from_yaml(str(raw / "feature_spec.yaml"))
    spec.check_feature_spec()
    assert spec.check_files() == {"train": 1536, "test": 1024}
    assert spec.cardinalities == CRITEO_VARIANTS["criteo_t15_synthetic"]
    assert 0.6 < spec.metadata["teacher_auc"] < 0.95
    split_binary.validate_data(spec, ("train", "test"))
    records = tmp_path / "records"
    result = transcribe_here(capsys, "--src_dataset_type", "synthetic", "--src_dataset_path", source,
                             "--dst_dataset_path", records, "--max_batches_train", 3, "--max_batches_test", 2,
                             "--src_batch_size", 512, "--dst_prebatch_size", 512)
    assert result.returncode == 0, result.stderr
    back = tmp_path / "back"
    result = transcribe_here(capsys, "--src_dataset_type", "split_tfrecords", "--src_dataset_path", records,
                             "--dst_dataset_path", back, "--dst_dataset_type", "tf_raw", "--src_batch_size", 512)
    assert result.returncode == 0, result.stderr
    assert_same_tree(raw, back)  # the same seed draws the same samples, whatever the destination


@pytest.fixture(scope="module")
def tf_raw_dataset(tmp_path_factory):
    """A small teacher-labelled split-binary dataset (2 x 128 train and 1 x 128 test samples)."""
    directory = tmp_path_factory.mktemp("raw") / "dataset"
    spec = get_default_feature_spec(3, [7, 1000, 70000], str(directory))
    synthetic_data.write_synthetic_dataset(spec, 256, 128, seed=1)
    return directory


def test_tf_raw_to_split_tfrecords_and_back_is_byte_identical(tf_raw_dataset, tmp_path, capsys):
    records, back = tmp_path / "records", tmp_path / "back"
    result = run_module("transcribe", "--src_dataset_path", tf_raw_dataset, "--dst_dataset_path", records,
                        "--src_batch_size", 128, "--dst_prebatch_size", 128)
    assert result.returncode == 0, result.stderr
    assert "wrote 2 train and 1 test batches" in result.stdout
    result = run_module("transcribe", "--src_dataset_type", "split_tfrecords", "--src_dataset_path", records,
                        "--dst_dataset_path", back, "--dst_dataset_type", "tf_raw", "--src_batch_size", 128)
    assert result.returncode == 0, result.stderr
    assert_same_tree(tf_raw_dataset, back)
    result = transcribe_here(capsys, "--src_dataset_type", "split_tfrecords", "--src_dataset_path", records,
                             "--dst_dataset_path", back, "--dst_dataset_type", "tf_raw", "--src_batch_size", 128,
                             "--overwrite", "--train_only", "--max_batches_train", 1)
    assert result.returncode == 0, result.stderr
    assert FeatureSpec.from_yaml(str(back / "feature_spec.yaml")).check_files() == {"train": 128, "test": 0}


def test_transcribe_refuses_bad_input_with_one_error_line(tf_raw_dataset, tmp_path, capsys):
    common = ("--src_dataset_path", tf_raw_dataset, "--src_batch_size", 128, "--dst_prebatch_size", 128)
    assert_one_error(run_module("transcribe", *common, "--dst_dataset_path", tf_raw_dataset / "train"),
                     "--dst_dataset_path", "lies inside --src_dataset_path", "refusing to write onto an input")
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "notes.txt").write_text("keep me")
    assert_one_error(transcribe_here(capsys, *common, "--dst_dataset_path", occupied),
                     "--dst_dataset_path", "already holds notes.txt")
    assert_one_error(transcribe_here(capsys, *common, "--dst_dataset_path", occupied, "--overwrite"),
                     "holds notes.txt, which the new output would not contain")
    assert os.listdir(occupied) == ["notes.txt"]
    assert_one_error(transcribe_here(capsys, "--src_dataset_path", tf_raw_dataset, "--src_batch_size", 128,
                                     "--dst_dataset_path", tmp_path / "x"),
                     "--dst_prebatch_size 65536 must equal --src_batch_size 128")
    assert_one_error(transcribe_here(capsys, "--src_dataset_type", "split_tfrecords", "--src_dataset_path",
                                     tf_raw_dataset, "--dst_dataset_path", tmp_path / "x"),
                     "train/length.json: the length file not found")
    assert not (tmp_path / "x").exists()


def test_transcribe_refuses_multi_hot_into_hugectr_raw_and_a_wrong_prebatch(tmp_path, capsys):
    spec = FeatureSpec.get_fileless_feature_spec(13, [10, 20], str(tmp_path / "src"))
    spec.feature_spec["cat_1"]["hotness"] = 20
    path = spec.to_yaml()
    assert_one_error(run_module("transcribe", "--src_dataset_type", "synthetic", "--src_dataset_path",
                                tmp_path / "src", "--dst_dataset_path", tmp_path / "out", "--dst_dataset_type",
                                "hugectr_raw"),
                     path, "'cat_1' has hotness 20, but a hugectr_raw destination holds one id per sample")
    assert not (tmp_path / "out").exists()
    result = transcribe_here(capsys, "--src_dataset_type", "synthetic", "--src_dataset_path", tmp_path / "src",
                             "--dst_dataset_path", tmp_path / "out", "--src_batch_size", 32,
                             "--dst_prebatch_size", 32, "--max_batches_train", 2, "--max_batches_test", 1)
    assert result.returncode == 0, result.stderr
    assert_one_error(transcribe_here(capsys, "--src_dataset_type", "split_tfrecords", "--src_dataset_path",
                                     tmp_path / "out", "--dst_dataset_path", tmp_path / "again",
                                     "--src_batch_size", 64, "--dst_prebatch_size", 64),
                     "label/data_0.tfrecords: the data is prebatched by 32 samples, so the global batch size "
                     "must be 32, got 64")
    assert not (tmp_path / "again").exists()


def test_transcribe_names_a_corrupt_source_file_and_writes_nothing(tmp_path, capsys):
    spec = FeatureSpec.get_fileless_feature_spec(1, [10], str(tmp_path / "src"))
    spec.to_yaml()
    assert transcribe_here(capsys, "--src_dataset_type", "synthetic", "--src_dataset_path", tmp_path / "src",
                           "--dst_dataset_path", tmp_path / "records", "--src_batch_size", 16,
                           "--dst_prebatch_size", 16, "--max_batches_train", 3, "--max_batches_test", 1
                           ).returncode == 0
    damaged = tmp_path / "records" / "train" / "categorical_0" / "data_0.tfrecords"
    data = bytearray(damaged.read_bytes())
    data[-3] ^= 0xFF
    damaged.write_bytes(bytes(data))
    assert_one_error(run_module("transcribe", "--src_dataset_type", "split_tfrecords", "--src_dataset_path",
                                tmp_path / "records", "--dst_dataset_path", tmp_path / "out",
                                "--dst_dataset_type", "tf_raw", "--src_batch_size", 16),
                     damaged, "corrupt or truncated TFRecord file")
    assert sorted(os.listdir(tmp_path)) == ["records", "src"]
    assert sorted(os.listdir(tmp_path / "records")) == ["feature_spec.yaml", "test", "train"]


def test_prepare_synthetic_dataset_takes_a_generated_spec(tmp_path):
    from recsys.data.synthetic_data import output_spec
    assert run_module("generate_feature_spec", "--variant", "criteo_t0_synthetic",
                      "--dst", tmp_path / "feature_spec.yaml").returncode == 0
    spec = output_spec(str(tmp_path / "out"), str(tmp_path / "feature_spec.yaml"), None, 13, [])
    assert spec.cardinalities == CRITEO_VARIANTS["criteo_t0_synthetic"]
    assert spec.file_of("test", spec.label_name) == str(tmp_path / "out" / "test" / "label.bin")
    spec.check_feature_spec()


def test_a_feature_spec_outside_the_dataset_folder_is_refused_unless_allowed(tf_raw_dataset, tmp_path):
    """Its files would be read relative to the spec's own folder, not --dataset_path: silently
    another dataset. Refused, naming both folders; --allow_external_data_paths reads them there."""
    from datasets import load_feature_spec

    elsewhere = tmp_path / "other"
    elsewhere.mkdir()
    spec_path = os.path.join(str(tf_raw_dataset), "feature_spec.yaml")
    with pytest.raises(ValueError) as refused:
        load_feature_spec(dataset_path=str(elsewhere), feature_spec_name=spec_path)
    message = str(refused.value)
    assert f"--feature_spec {spec_path} lies outside --dataset_path {elsewhere}" in message
    assert "--allow_external_data_paths" in message and str(tf_raw_dataset) in message
    spec = load_feature_spec(dataset_path=str(elsewhere), feature_spec_name=spec_path, allow_external_paths=True)
    assert spec.cardinalities == [7, 1000, 70000]
    inside = load_feature_spec(dataset_path=str(tf_raw_dataset), feature_spec_name=spec_path)
    assert inside.cardinalities == [7, 1000, 70000]
