"""FeatureSpec: the test specs, the default layout, YAML round trip and every validation error."""
import glob
import os

import pytest
import yaml

from recsys.data import synthetic_data
from recsys.data.feature_spec import (FeatureSpec, FeatureSpecError, get_categorical_feature_type,
                          get_default_feature_spec)

SPEC_DIR = os.path.join(os.path.dirname(__file__), "feature_specs")
SPEC_FILES = sorted(glob.glob(os.path.join(SPEC_DIR, "*.yaml")))
EXPECTED_SPECS = {"default", "10_num", "20_num", "13_num_10_cat", "13_num_26_cat", "13_num_30_cat",
                  "criteo_f15", "wider_dtypes", "different_feature_names", "different_paths"}


def test_the_reference_set_of_test_specs_is_present():
    assert {os.path.basename(p)[:-5] for p in SPEC_FILES} == EXPECTED_SPECS


@pytest.mark.parametrize("path", SPEC_FILES, ids=os.path.basename)
def test_test_specs_are_valid(path):
    spec = FeatureSpec.from_yaml(path)
    spec.check_feature_spec()
    assert spec.base_directory == os.path.dirname(os.path.abspath(path))
    assert len(spec.cardinalities) == len(spec.categorical_names) > 0


def test_test_spec_details():
    f15 = FeatureSpec.from_yaml(os.path.join(SPEC_DIR, "criteo_f15.yaml"))
    assert f15.cardinalities[0] == 7912889 and len(f15.cardinalities) == 26
    assert [str(f15.dtype_of(n)) for n in f15.categorical_names] == \
        [get_categorical_feature_type(c) for c in f15.cardinalities]
    wide = FeatureSpec.from_yaml(os.path.join(SPEC_DIR, "wider_dtypes.yaml"))
    assert wide.cardinalities == f15.cardinalities
    assert any(wide.dtype_of(n).itemsize > f15.dtype_of(n).itemsize for n in wide.categorical_names)
    ten = FeatureSpec.from_yaml(os.path.join(SPEC_DIR, "13_num_10_cat.yaml"))
    assert ten.cardinalities[-1] == 10009 and str(ten.dtype_of(ten.categorical_names[-1])) == "int16"
    names = FeatureSpec.from_yaml(os.path.join(SPEC_DIR, "different_feature_names.yaml"))
    assert names.label_name == "qwer"
    assert len(FeatureSpec.from_yaml(os.path.join(SPEC_DIR, "20_num.yaml")).numerical_names) == 20
    assert len(FeatureSpec.from_yaml(os.path.join(SPEC_DIR, "13_num_30_cat.yaml")).categorical_names) == 30


@pytest.mark.parametrize("cardinality, dtype", [(1, "int8"), (126, "int8"), (127, "int16"),
                                                (32766, "int16"), (32767, "int32"),
                                                (2147483646, "int32")])
def test_categorical_dtype_from_cardinality(cardinality, dtype):
    assert get_categorical_feature_type(cardinality) == dtype


def test_cardinality_beyond_int32_is_an_error():
    with pytest.raises(FeatureSpecError, match="2147483647"):
        get_categorical_feature_type(2147483647)


def test_default_spec_layout(tmp_path):
    spec = get_default_feature_spec(2, [5, 200], str(tmp_path))
    assert spec.numerical_names == ["num_0", "num_1"]
    assert spec.categorical_names == ["cat_0.bin", "cat_1.bin"]
    assert spec.label_name == "label"
    assert [str(spec.dtype_of(n)) for n in spec.categorical_names] == ["int8", "int16"]
    assert [c["files"] for c in spec.source_spec["test"]] == [
        ["test/numerical.bin"], ["test/label.bin"], ["test/cat_0.bin"], ["test/cat_1.bin"]]
    assert spec.metadata == {}
    spec.check_feature_spec()


def test_yaml_round_trip_keeps_sections_and_relative_paths(tmp_path):
    spec = get_default_feature_spec(3, [10, 1000, 100000], str(tmp_path))
    spec.metadata = {"teacher_auc": 0.8}
    path = spec.to_yaml()
    assert path == os.path.join(str(tmp_path), "feature_spec.yaml")
    loaded = FeatureSpec.from_yaml(path)
    assert loaded.to_dict() == spec.to_dict()
    assert loaded.file_of("train", "cat_2.bin") == os.path.join(str(tmp_path), "train", "cat_2.bin")


# ---------------------------------------------------------------- bad input, one error each
@pytest.fixture
def dataset_dir(tmp_path):
    """A small valid split-binary dataset: 2 numerical, 2 categorical, 100 + 40 samples."""
    spec = get_default_feature_spec(2, [7, 300], str(tmp_path))
    synthetic_data.write_synthetic_dataset(spec, 100, 40, seed=0)
    return tmp_path


def _edit_spec(directory, edit):
    path = os.path.join(str(directory), "feature_spec.yaml")
    with open(path) as f:
        raw = yaml.safe_load(f)
    edit(raw)
    with open(path, "w") as f:
        yaml.safe_dump(raw, f)
    return path


def _load_and_check(path):
    spec = FeatureSpec.from_yaml(path)
    spec.check_feature_spec()
    spec.check_files()


def _chunk_of(raw, mapping, feature):
    return next(c for c in raw["source_spec"][mapping] if feature in c["features"])


SPEC_ERRORS = {
    "unknown dtype": (lambda raw: raw["feature_spec"]["num_1"].update(dtype="float17"),
                      ["num_1", "float17"]),
    "missing channel": (lambda raw: raw["channel_spec"].pop("numerical"), ["numerical"]),
    "two labels": (lambda raw: raw["channel_spec"]["label"].append("num_1"), ["label", "num_1"]),
    "channel feature absent from feature_spec": (
        lambda raw: raw["channel_spec"]["categorical"].append("cat_9.bin"), ["cat_9.bin"]),
    "feature in no channel": (lambda raw: raw["channel_spec"]["numerical"].remove("num_1"),
                              ["num_1"]),
    "duplicate in a channel": (lambda raw: raw["channel_spec"]["categorical"].append("cat_0.bin"),
                               ["cat_0.bin"]),
    "categorical without cardinality": (lambda raw: raw["feature_spec"]["cat_1.bin"].pop("cardinality"),
                                        ["cat_1.bin", "cardinality"]),
    "cardinality does not fit dtype": (lambda raw: raw["feature_spec"]["cat_0.bin"].update(cardinality=1000),
                                       ["cat_0.bin", "int8"]),
    "float categorical": (lambda raw: raw["feature_spec"]["cat_1.bin"].update(dtype="float32"),
                          ["cat_1.bin", "float32"]),
    "numerical not float16": (lambda raw: raw["feature_spec"]["num_0"].update(dtype="float32"),
                              ["num_0", "float16"]),
    "label neither bool nor int8": (lambda raw: raw["feature_spec"]["label"].update(dtype="int16"),
                                    ["label", "bool or int8", "int16"]),
    "numerical chunk out of channel order": (
        lambda raw: _chunk_of(raw, "train", "num_0")["features"].reverse(), ["num_1", "num_0"]),
    "mapping other than train/test": (lambda raw: raw["source_spec"].update(valid=[]), ["valid"]),
    "chunk with two files": (lambda raw: _chunk_of(raw, "test", "cat_1.bin")["files"].append("x.bin"),
                             ["cat_1.bin", "x.bin"]),
    "chunk type not split_binary": (lambda raw: _chunk_of(raw, "train", "label").update(type="csv"),
                                    ["label", "csv"]),
    "feature missing from a mapping": (
        lambda raw: raw["source_spec"]["test"].remove(_chunk_of(raw, "test", "cat_1.bin")),
        ["test", "cat_1.bin"]),
    "feature twice in a mapping": (
        lambda raw: raw["source_spec"]["train"].append(dict(_chunk_of(raw, "train", "cat_0.bin"))),
        ["train", "cat_0.bin"]),
    "two categoricals in one chunk": (
        lambda raw: _chunk_of(raw, "train", "cat_0.bin")["features"].append("cat_1.bin"),
        ["cat_0.bin", "cat_1.bin"]),
}


@pytest.mark.parametrize("case", sorted(SPEC_ERRORS))
def test_spec_errors_name_the_file_and_feature(dataset_dir, case):
    edit, words = SPEC_ERRORS[case]
    path = _edit_spec(dataset_dir, edit)
    with pytest.raises(FeatureSpecError) as error:
        _load_and_check(path)
    message = str(error.value)
    assert path in message
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"


def test_missing_spec(tmp_path):
    with pytest.raises(FeatureSpecError, match="not found"):
        FeatureSpec.from_yaml(str(tmp_path / "feature_spec.yaml"))


def test_yaml_syntax_error(tmp_path):
    path = tmp_path / "feature_spec.yaml"
    path.write_text("feature_spec: {num_0: [dtype: float16\nchannel_spec:\n")
    with pytest.raises(FeatureSpecError, match="YAML syntax error") as error:
        FeatureSpec.from_yaml(str(path))
    assert str(path) in str(error.value)


def test_missing_section(tmp_path):
    path = tmp_path / "feature_spec.yaml"
    path.write_text("feature_spec: {}\nchannel_spec: {}\n")
    with pytest.raises(FeatureSpecError, match="source_spec"):
        FeatureSpec.from_yaml(str(path))


def test_missing_file(dataset_dir):
    os.remove(dataset_dir / "test" / "cat_1.bin")
    with pytest.raises(FeatureSpecError, match="not found") as error:
        _load_and_check(str(dataset_dir / "feature_spec.yaml"))
    assert "test/cat_1.bin" in str(error.value) and "cat_1.bin'" in str(error.value)


def test_truncated_file(dataset_dir):
    path = dataset_dir / "train" / "numerical.bin"
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(FeatureSpecError, match="truncated") as error:
        _load_and_check(str(dataset_dir / "feature_spec.yaml"))
    assert "train/numerical.bin" in str(error.value) and "num_0" in str(error.value)


def test_unequal_sample_counts(dataset_dir):
    path = dataset_dir / "train" / "cat_1.bin"  # int16: drop one whole record
    path.write_bytes(path.read_bytes()[:-2])
    with pytest.raises(FeatureSpecError, match="different numbers of samples") as error:
        _load_and_check(str(dataset_dir / "feature_spec.yaml"))
    assert "train/cat_1.bin=99" in str(error.value) and "train/label.bin=100" in str(error.value)


def test_check_files_returns_sample_counts(dataset_dir):
    counts = FeatureSpec.from_yaml(str(dataset_dir / "feature_spec.yaml")).check_files()
    assert counts == {"train": 100, "test": 40}
