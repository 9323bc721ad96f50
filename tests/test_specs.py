"""Feature specs that would read the wrong bytes: paths leaving the dataset folder, duplicate YAML
keys, paths that are folders, FIFOs or devices, one file serving two chunks; each is one error
naming the spec or file and the feature, in process and end to end through main.py."""
import os
from pathlib import Path

import numpy as np
import pytest
import yaml

import dataloader
import datasets
from recsys.data import synthetic_data
from recsys.data.feature_spec import FeatureSpec, FeatureSpecError, get_default_feature_spec
from test_main import SMALL_MODEL, main_py


@pytest.fixture
def data_dir(tmp_path):
    """A small valid dataset: 2 numerical, 2 categorical (cardinalities 7, 300), 100 + 40 samples."""
    directory = tmp_path / "data"
    synthetic_data.write_synthetic_dataset(get_default_feature_spec(2, [7, 300], str(directory)), 100, 40,
                                     seed=0)
    return directory


def spec_path(directory):
    return str(directory / "feature_spec.yaml")


def set_file(directory, mapping, feature, relative):
    """Point `feature`'s chunk of `mapping` at `relative` in the dataset's spec."""
    with open(spec_path(directory)) as f:
        raw = yaml.safe_load(f)
    chunk = next(c for c in raw["source_spec"][mapping] if feature in c["features"])
    chunk["files"] = [relative]
    with open(spec_path(directory), "w") as f:
        yaml.safe_dump(raw, f)


def load(directory, **kwargs):
    """The spec as main.py loads it, with its files checked as the pipelines check them."""
    spec = datasets.load_feature_spec(dataset_path=str(directory), **kwargs)
    spec.check_files()
    return spec


def refused(directory, *words, **kwargs):
    with pytest.raises(FeatureSpecError) as error:
        load(directory, **kwargs)
    message = str(error.value)
    assert "\n" not in message
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"
    return message


# --------------------------------------------------------------------- paths leaving the folder
@pytest.mark.parametrize("relative", ["../elsewhere/label.bin", "train/../../elsewhere/label.bin",
                                      "ABSOLUTE"])
def test_a_path_leaving_the_dataset_folder_is_refused_unless_allowed(data_dir, relative):
    outside = data_dir.parent / "elsewhere"
    outside.mkdir()
    os.replace(data_dir / "train" / "label.bin", outside / "label.bin")
    relative = str(outside / "label.bin") if relative == "ABSOLUTE" else relative
    set_file(data_dir, "train", "label", relative)
    message = refused(data_dir, spec_path(data_dir), "'train'", "label", repr(relative),
                      "outside the dataset folder")
    assert message.startswith(spec_path(data_dir))
    spec = load(data_dir, allow_external_paths=True)
    assert os.path.samefile(spec.file_of("train", "label"), outside / "label.bin")
    pipelines = dataloader.create_input_pipelines(spec, dataloader.PipelineConfig(train_batch_size=50,
                                                                                  eval_batch_size=40))
    labels = np.concatenate([labels.numpy().ravel() for _, labels in pipelines.train])
    np.testing.assert_array_equal(labels, np.fromfile(outside / "label.bin", dtype=bool))


def test_a_path_that_only_passes_through_a_parent_stays_inside(data_dir):
    set_file(data_dir, "test", "cat_1.bin", "train/../test/./cat_1.bin")
    assert load(data_dir).check_files() == {"train": 100, "test": 40}


# --------------------------------------------------------------------------- duplicate keys
SPEC_TEXT = """\
feature_spec:
  num_0: {dtype: float16}
  label: {dtype: bool}
  cat_0.bin: {dtype: int8, cardinality: 7}
channel_spec:
  numerical: [num_0]
  categorical: [cat_0.bin]
  label: [label]
source_spec:
  train:
  - {type: split_binary, features: [num_0], files: [train/numerical.bin]}
  - {type: split_binary, features: [label], files: [train/label.bin]}
  - {type: split_binary, features: [cat_0.bin], files: [train/cat_0.bin]}
  test:
  - {type: split_binary, features: [num_0], files: [test/numerical.bin]}
  - {type: split_binary, features: [label], files: [test/label.bin]}
  - {type: split_binary, features: [cat_0.bin], files: [test/cat_0.bin]}
"""


@pytest.mark.parametrize("edit, words", [
    (lambda text: text + "channel_spec:\n  numerical: []\n", ["'channel_spec'", "line 18",
                                                                "first defined at line 5"]),
    (lambda text: text.replace("  label: {dtype: bool}\n",
                               "  label: {dtype: bool}\n  num_0: {dtype: float32}\n"),
     ["'num_0'", "line 4", "first defined at line 2"]),
    (lambda text: text.replace("{dtype: int8, cardinality: 7}", "{dtype: int8, cardinality: 7, cardinality: 70}"),
     ["'cardinality'", "line 4", "first defined at line 4"]),
])
def test_a_duplicate_yaml_key_is_an_error_naming_the_key_and_lines(tmp_path, edit, words):
    path = tmp_path / "feature_spec.yaml"
    path.write_text(SPEC_TEXT)
    FeatureSpec.from_yaml(str(path)).check_feature_spec()  # the unedited text loads
    path.write_text(edit(SPEC_TEXT))
    with pytest.raises(FeatureSpecError) as error:
        FeatureSpec.from_yaml(str(path))
    message = str(error.value)
    assert message.startswith(f"{path}: ") and "duplicate key" in message and "\n" not in message
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"


def test_yaml_merge_keys_may_override(tmp_path):
    path = tmp_path / "feature_spec.yaml"
    path.write_text(SPEC_TEXT.replace("  cat_0.bin: {dtype: int8, cardinality: 7}\n",
                                      "  cat_0.bin: &cat {dtype: int8, cardinality: 7}\n"
                                      "  cat_1.bin: {<<: *cat, cardinality: 9}\n"))
    spec = FeatureSpec.from_yaml(str(path))
    assert spec.feature_spec["cat_1.bin"] == {"dtype": "int8", "cardinality": 9}


@pytest.mark.parametrize("content, words", [
    (b"feature_spec: {a: [1\n", ["YAML syntax error at line 2"]),
    (b"feature_spec: \xff\xfe\n", ["not UTF-8"]),
    (SPEC_TEXT.encode() + b"metadata: {teacher_auc: high}\n", ["'teacher_auc' must be a number", "'high'"]),
])
def test_unreadable_spec_text_is_one_line(tmp_path, content, words):
    path = tmp_path / "feature_spec.yaml"
    path.write_bytes(content)
    with pytest.raises(FeatureSpecError) as error:
        FeatureSpec.from_yaml(str(path))
    assert str(error.value).startswith(f"{path}: ") and "\n" not in str(error.value)
    for word in words:
        assert word in str(error.value)


# ------------------------------------------------------------- folders, FIFOs, devices, twins
def test_a_spec_path_that_is_a_folder_is_named_so(tmp_path):
    (tmp_path / "feature_spec.yaml").mkdir()
    with pytest.raises(FeatureSpecError, match="feature spec file is a directory, not a regular file"):
        FeatureSpec.from_yaml(str(tmp_path / "feature_spec.yaml"))


@pytest.mark.parametrize("kind, words", [("folder", "is a directory, not a regular file"),
                                         ("fifo", "is a FIFO (named pipe), not a regular file"),
                                         ("device", "is a character device, not a regular file")])
def test_a_data_path_that_is_not_a_regular_file_is_named_so(data_dir, kind, words):
    path = data_dir / "test" / "cat_0.bin"
    path.unlink()
    if kind == "folder":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)  # opening it would block: it must be refused without being opened
    else:
        path.symlink_to("/dev/null")
    refused(data_dir, f"{path}: file of feature(s) ['cat_0.bin'] (mapping 'test') {words}")


@pytest.mark.parametrize("mapping, feature, relative, owner", [
    ("train", "cat_1.bin", "train/./cat_0.bin", "features ['cat_0.bin'] of mapping 'train'"),
    ("test", "label", "train/label.bin", "features ['label'] of mapping 'train'"),  # test on train data
])
def test_one_file_for_two_chunks_is_refused(data_dir, mapping, feature, relative, owner):
    set_file(data_dir, mapping, feature, relative)
    message = refused(data_dir, spec_path(data_dir), f"features ['{feature}'] of mapping '{mapping}'",
                      owner, "every chunk of every mapping needs its own file")
    assert f"file {relative!r} of " in message or f"file {os.path.normpath(relative)!r} of " in message


@pytest.mark.parametrize("link", [os.link, os.symlink])
@pytest.mark.parametrize("twin", ["test/cat_0.bin", "train/cat_1.bin"])
def test_two_names_of_one_file_on_disk_are_refused(data_dir, link, twin):
    (data_dir / "test" / "cat_1.bin").unlink()
    link(data_dir / twin, data_dir / "test" / "cat_1.bin")
    refused(data_dir, f"{data_dir / 'test' / 'cat_1.bin'}: file of feature(s) ['cat_1.bin']",
            f"is the same file on disk as {data_dir / twin}")


def test_a_feature_name_yaml_reads_as_a_boolean_is_refused(tmp_path):
    path = tmp_path / "feature_spec.yaml"
    path.write_text(SPEC_TEXT.replace("  label: {dtype: bool}\n", "  label: {dtype: bool}\n  no: {dtype: float16}\n"))
    with pytest.raises(FeatureSpecError, match="feature name False is a bool, not a string .* quote it"):
        FeatureSpec.from_yaml(str(path))


# ------------------------------------------------------------------------------- main.py
@pytest.mark.parametrize("case", ["external path", "duplicate key"])
def test_main_refuses_the_spec_in_one_line(data_dir, tmp_path, case):
    if case == "external path":
        set_file(data_dir, "test", "label", "../../etc/label.bin")
        words = "file '../../etc/label.bin' lies outside the dataset folder"
        words += f" {data_dir}; pass --allow_external_data_paths to read it there"
    else:
        with open(spec_path(data_dir), "a") as f:
            f.write("metadata: {}\n")
        words = "duplicate key 'metadata'"
    before = {str(p): p.stat().st_mtime_ns for p in sorted(Path(data_dir).rglob("*"))}
    result = main_py(SMALL_MODEL + ["--dataset_path", str(data_dir), "--batch_size", "20",
                                    "--valid_batch_size", "20", "--log_path", str(tmp_path / "log.json"),
                                    "--save_checkpoint_path", str(tmp_path / "ckpt")])
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith(f"error: {spec_path(data_dir)}: "), result.stderr[-3000:]
    assert words in errors[0] and "Traceback" not in result.stderr
    assert {str(p): p.stat().st_mtime_ns for p in sorted(Path(data_dir).rglob("*"))} == before
    assert not (tmp_path / "ckpt").exists()


def test_main_reads_files_outside_the_dataset_folder_only_when_allowed(data_dir, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.rename(data_dir / "test" / "label.bin", elsewhere / "label.bin")
    set_file(data_dir, "test", "label", str(elsewhere / "label.bin"))
    args = SMALL_MODEL + ["--dataset_path", str(data_dir), "--batch_size", "20", "--valid_batch_size", "20",
                          "--log_path", str(tmp_path / "log.json")]
    refusal = main_py(args)
    assert refusal.returncode == 2 and "lies outside the dataset folder" in refusal.stderr
    allowed = main_py(args + ["--allow_external_data_paths"])
    assert allowed.returncode == 0, allowed.stderr[-3000:]
    assert "Evaluation completed" in allowed.stdout
