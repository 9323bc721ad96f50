"""The bring-your-own-data tools: prepare_synthetic_dataset.py, gen_csv.py and transcode.py (thin
commands over synthetic_data, csv_data and dataloading.transcribe's csv source)."""
import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import yaml

from recsys.data import data_errors
from recsys.data import split_binary
from recsys.data import synthetic_data
from recsys.data.csv_data import generate_csv
from dataloading.transcribe import transcribe
from recsys.data.feature_spec import CRITEO_VARIANTS, DEFAULT_SPEC_NAME, FeatureSpec, FeatureSpecError
from recsys.runtime.safe_io import OutputPathError
from transcode import TRANSCODE_FLAGS

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL_CSV_SPEC = os.path.join(REPO_ROOT, "tests", "transcoding", "small_csv.yaml")


def run_tool(script, *args):
    return subprocess.run([sys.executable, os.path.join(REPO_ROOT, script), *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300)


def transcode(input_dir, output_dir, chunk_size=65536, overwrite=False, feature_spec_out=DEFAULT_SPEC_NAME):
    """What transcode.py runs, in-process: the CSV dataset to split-binary; returns the written spec."""
    transcribe("csv", input_dir, output_dir, "tf_raw", dst_feature_spec=feature_spec_out, src_batch_size=chunk_size,
               overwrite=overwrite, names=TRANSCODE_FLAGS)
    return FeatureSpec.from_yaml(os.path.join(output_dir, feature_spec_out))


def tree(directory):
    """{relative path: bytes} of every file under `directory`."""
    found = {}
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, directory)] = f.read()
    return found


# ----------------------------------------------------------------- prepare_synthetic_dataset
def test_prepare_synthetic_dataset_writes_teacher_auc_and_refuses_to_overwrite(tmp_path):
    out = str(tmp_path / "synthetic")
    args = ["--synthetic_dataset_dir", out, "--synthetic_dataset_num_entries", "4000",
            "--synthetic_dataset_num_test_entries", "2000", "--synthetic_dataset_batch_size", "1000",
            "--num_numerical_features", "5", "--synthetic_dataset_table_sizes", "10,200,40000"]
    result = run_tool("prepare_synthetic_dataset.py", *args)
    assert result.returncode == 0, result.stderr
    spec = FeatureSpec.from_yaml(os.path.join(out, "feature_spec.yaml"))
    assert spec.cardinalities == [10, 200, 40000] and len(spec.numerical_names) == 5
    assert spec.check_files() == {"train": 4000, "test": 2000}
    assert f"teacher_auc {spec.metadata['teacher_auc']:.6f}" in result.stdout
    split_binary.validate_categorical_ids(spec, ["train", "test"])

    before = tree(out)
    again = run_tool("prepare_synthetic_dataset.py", *args, "--seed", "1")
    assert again.returncode != 0 and "refusing" in again.stderr and "--overwrite" in again.stderr
    assert tree(out) == before
    replaced = run_tool("prepare_synthetic_dataset.py", *args, "--seed", "1", "--overwrite")
    assert replaced.returncode == 0, replaced.stderr
    assert tree(out) != before and sorted(os.listdir(tmp_path)) == ["synthetic"]


def test_prepare_synthetic_dataset_rejects_a_bad_spec(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("feature_spec: {a: {dtype: float16}}\nsource_spec: {}\nchannel_spec: {}\n")
    result = run_tool("prepare_synthetic_dataset.py", "--feature_spec", str(bad),
                      "--synthetic_dataset_dir", str(tmp_path / "out"))
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1].startswith(f"error: {bad}")
    assert not (tmp_path / "out").exists() or not os.listdir(tmp_path / "out")


def test_criteo_variants_have_26_tables_and_the_reference_sizes():
    assert {name: len(c) for name, c in CRITEO_VARIANTS.items()} == {
        "criteo_t15_synthetic": 26, "criteo_t3_synthetic": 26, "criteo_t0_synthetic": 26}
    assert CRITEO_VARIANTS["criteo_t0_synthetic"][11] == 292775614
    with open(os.path.join(REPO_ROOT, "tests", "feature_specs", "criteo_f15.yaml")) as f:
        f15 = yaml.safe_load(f)
    assert CRITEO_VARIANTS["criteo_t15_synthetic"] == [
        f15["feature_spec"][name]["cardinality"] for name in f15["channel_spec"]["categorical"]]


def test_synthetic_dataset_from_a_variant_and_from_a_spec_with_odd_paths(tmp_path):
    from recsys.data.synthetic_data import output_spec
    variant = output_spec(str(tmp_path / "t3"), None, "criteo_t3_synthetic", 13, [])
    synthetic_data.write_synthetic_dataset(variant, 512, 256, seed=5)
    assert FeatureSpec.from_yaml(str(tmp_path / "t3" / "feature_spec.yaml")).cardinalities == \
        CRITEO_VARIANTS["criteo_t3_synthetic"]
    odd = output_spec(str(tmp_path / "odd"),
                      os.path.join(REPO_ROOT, "tests", "feature_specs", "different_paths.yaml"),
                      None, 13, [])
    synthetic_data.write_synthetic_dataset(odd, 512, 256, seed=5)
    written = FeatureSpec.from_yaml(str(tmp_path / "odd" / "feature_spec.yaml"))
    assert written.check_files() == {"train": 512, "test": 256}
    assert os.path.exists(written.file_of("test", written.label_name))
    assert "évaluation" in written.file_of("test", written.label_name)


# -------------------------------------------------------------------- gen_csv and transcode
@pytest.fixture
def csv_dir(tmp_path):
    directory = tmp_path / "csv"
    generate_csv(SMALL_CSV_SPEC, str(directory), 700, seed=4)
    return directory


def read_csv_columns(directory, mapping):
    """{feature: values} of a mapping of the small CSV spec, read back with pandas."""
    spec = FeatureSpec.from_yaml(str(directory / "feature_spec.yaml"))
    columns = {}
    for chunk in spec.source_spec[mapping]:
        frame = pd.read_csv(spec.resolve(chunk["files"][0]), header=None)
        columns.update({name: frame[i].to_numpy() for i, name in enumerate(chunk["features"])})
    return spec, columns


def test_gen_csv_labels_are_zero_and_one(tmp_path):
    directory = tmp_path / "csv"
    result = run_tool("gen_csv.py", "--feature_spec_in", SMALL_CSV_SPEC, "--output", str(directory),
                      "--size", "700")
    assert result.returncode == 0, result.stderr
    _, columns = read_csv_columns(directory, "train")
    assert set(np.unique(columns["label"])) == {0, 1}
    assert columns["cat_2.bin"].max() < 45000 and len(columns["num_0"]) == 700


def test_transcode_round_trip(csv_dir, tmp_path):
    out = tmp_path / "binary"
    result = run_tool("transcode.py", "--input", str(csv_dir), "--output", str(out),
                      "--chunk_size", "256")
    assert result.returncode == 0, result.stderr
    spec = FeatureSpec.from_yaml(str(out / "feature_spec.yaml"))
    spec.check_feature_spec()
    assert spec.cardinalities == [10, 23412, 45000, 100, 50, 127]
    assert [str(spec.dtype_of(n)) for n in spec.categorical_names] == \
        ["int8", "int16", "int32", "int8", "int8", "int16"]
    for mapping in ("train", "test"):
        csv_spec, columns = read_csv_columns(csv_dir, mapping)
        numerical = np.fromfile(spec.file_of(mapping, "num_0"), np.float16).reshape(-1, 3)
        expected = np.stack([columns[n] for n in csv_spec.numerical_names], 1).astype(np.float16)
        np.testing.assert_array_equal(numerical, expected)
        np.testing.assert_array_equal(np.fromfile(spec.file_of(mapping, "label"), bool),
                                      columns["label"].astype(bool))
        for name in spec.categorical_names:
            np.testing.assert_array_equal(np.fromfile(spec.file_of(mapping, name), spec.dtype_of(name)),
                                          columns[name])


def test_transcode_infers_auto_cardinality_and_refuses_existing_output(csv_dir, tmp_path):
    spec_path = csv_dir / "feature_spec.yaml"
    raw = yaml.safe_load(spec_path.read_text())
    for name in ("cat_0.bin", "cat_3.bin"):
        raw["feature_spec"][name]["cardinality"] = "auto"
    spec_path.write_text(yaml.safe_dump(raw))
    out = tmp_path / "binary"
    spec = transcode(str(csv_dir), str(out), chunk_size=100)
    _, train = read_csv_columns(csv_dir, "train")
    _, test = read_csv_columns(csv_dir, "test")
    assert spec.cardinalities[0] == max(train["cat_0.bin"].max(), test["cat_0.bin"].max()) + 1
    assert spec.cardinalities[3] == max(train["cat_3.bin"].max(), test["cat_3.bin"].max()) + 1
    assert spec.cardinalities[1] == 23412

    before = tree(out)
    result = run_tool("transcode.py", "--input", str(csv_dir), "--output", str(out))
    assert result.returncode != 0 and "refusing" in result.stderr
    assert tree(out) == before  # nothing appended
    transcode(str(csv_dir), str(out), chunk_size=1000, overwrite=True)
    assert tree(out) == before  # same input, same output: replaced, not appended


def _corrupt(csv_dir, relative, row, column, value):
    path = csv_dir / relative
    frame = pd.read_csv(path, header=None)
    frame[column] = frame[column].astype(object)
    frame.iloc[row, column] = value
    frame.to_csv(path, header=False, index=False)


@pytest.mark.parametrize("corruption, pattern", [
    (("train/label.csv", 5, 0, 2), "train/label.csv: line 6: feature 'label' value 2 is not a label 0 or 1"),
    (("test/catpart1.csv", 7, 0, -1), "test/catpart1.csv: line 8: feature 'cat_0.bin' value -1 is not an id"),
    (("train/catpart2.csv", 3, 1, 1.5), "train/catpart2.csv: line 4: feature 'cat_3.bin' value 1.5 is not an id"),
    (("train/catpart2.csv", 3, 1, 2 ** 31), "feature 'cat_3.bin' value 2147483648 is not an id in \\[0, 2147483645\\]"),
    (("train/numerical.csv", 2, 2, "abc"), "train/numerical.csv: line 3: feature 'num_2' value 'abc' is not a finite number"),
    (("test/catpart2.csv", 9, 1, 50), "'cat_4.bin' declares cardinality 50 but the data holds id 50"),
])
def test_transcode_rejects_bad_values_and_writes_nothing(csv_dir, tmp_path, corruption, pattern):
    _corrupt(csv_dir, *corruption)
    out = tmp_path / "binary"
    with pytest.raises(data_errors.DataError, match=pattern):
        transcode(str(csv_dir), str(out))
    assert sorted(os.listdir(tmp_path)) == ["csv"]  # no output, no temporary folder


def test_transcode_rejects_files_of_unequal_length(csv_dir, tmp_path):
    path = csv_dir / "test" / "label.csv"
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:-1]))
    with pytest.raises(data_errors.DataError, match="different numbers of rows"):
        transcode(str(csv_dir), str(tmp_path / "binary"))


def test_gen_csv_needs_integer_cardinalities_and_refuses_existing_files(csv_dir, tmp_path):
    spec_path = csv_dir / "feature_spec.yaml"
    with pytest.raises(OutputPathError, match="--output .* already holds .*refusing"):
        generate_csv(str(SMALL_CSV_SPEC), str(csv_dir), 10)
    raw = yaml.safe_load(spec_path.read_text())
    raw["feature_spec"]["cat_1.bin"]["cardinality"] = "auto"
    auto = tmp_path / "auto.yaml"
    auto.write_text(yaml.safe_dump(raw))
    with pytest.raises(FeatureSpecError, match="cat_1.bin.*integer cardinality"):
        generate_csv(str(auto), str(tmp_path / "other"), 10)


def test_gen_csv_refuses_an_external_file_without_naming_a_flag_it_lacks(tmp_path):
    """gen_csv.py has no flag to allow files outside --output: its error must not offer one."""
    spec = FeatureSpec.from_yaml(SMALL_CSV_SPEC)
    spec.source_spec["train"][0]["files"] = ["../outside.csv"]
    spec_path = spec.to_yaml(str(tmp_path / "spec.yaml"))
    result = run_tool("gen_csv.py", "--feature_spec_in", spec_path, "--output", str(tmp_path / "csv"))
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "lies outside the dataset folder" in result.stderr, result.stderr
    assert "this command reads only files inside it" in result.stderr and "allowed explicitly" not in result.stderr
    assert not (tmp_path / "csv").exists() and not (tmp_path / "outside.csv").exists()


def test_csv_is_a_transcribe_source_for_every_destination(csv_dir, tmp_path):
    """transcode.py's conversion is transcribe's csv source: to split-TFRecords (whole batches only)
    and back to split-binary, the first whole batches of the CSV files arrive unchanged."""
    records = tmp_path / "records"
    result = subprocess.run([sys.executable, "-m", "dataloading.transcribe", "--src_dataset_type", "csv",
                             "--src_dataset_path", str(csv_dir), "--dst_dataset_type", "split_tfrecords",
                             "--dst_dataset_path", str(records), "--src_batch_size", "256",
                             "--dst_prebatch_size", "256"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "wrote 2 train and 2 test batches of 256 samples (split_tfrecords)" in result.stdout
    binary = tmp_path / "binary"
    transcribe("split_tfrecords", str(records), str(binary), "tf_raw", src_batch_size=256)
    spec = FeatureSpec.from_yaml(str(binary / "feature_spec.yaml"))
    assert spec.check_files() == {"train": 512, "test": 512}
    _, columns = read_csv_columns(csv_dir, "train")
    np.testing.assert_array_equal(np.fromfile(spec.file_of("train", "cat_1.bin"), spec.dtype_of("cat_1.bin")),
                                  columns["cat_1.bin"][:512])


def test_transcode_checks_the_output_before_reading_the_data(csv_dir, tmp_path):
    """The first pass over the CSV files (values, `cardinality: auto`) runs only once the output is
    known to be writable: a bad output is reported, not the bad value a long scan would find."""
    _corrupt(csv_dir, "test/label.csv", 600, 0, 7)
    out = tmp_path / "binary"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    with pytest.raises(OutputPathError, match="refusing"):
        transcode(str(csv_dir), str(out))
    with pytest.raises(data_errors.DataError, match="value 7 is not a label"):
        transcode(str(csv_dir), str(tmp_path / "fresh"))
    assert sorted(os.listdir(tmp_path)) == ["binary", "csv"] and os.listdir(out) == ["mine.txt"]


def test_before_after_runs_two_commits_in_turns_and_reports_their_medians(tmp_path):
    """bench/before_after.py: each commit in its own worktree (its own files), alternating, medians and
    the ratio in the report; the worktrees are gone afterwards."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    report = tmp_path / "report.json"
    # the metric: how many lines the commit's README has, so the two sides differ when the commits do
    command = ["python", "-c", "import json; json.dump({'readme': {'lines': len(open('README.md').readlines())}}, "
                               "open('lines.json', 'w'))"]
    shallow = subprocess.run(["git", "rev-parse", "--verify", "HEAD~1"], cwd=repo, capture_output=True).returncode
    before = "HEAD" if shallow else "HEAD~1"  # a shallow clone has one commit: both sides are it
    done = subprocess.run([sys.executable, "-m", "bench.before_after", "--before", before, "--after", "HEAD",
                           "--rounds", "2", "--results", "lines.json", "--metric", "readme.lines",
                           "--output", str(report), "--", *command], cwd=repo, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(report.read_text())
    assert [len(v) for v in result["samples"]["before"].values()] == [2]
    for side, revision in (("before", before), ("after", "HEAD")):
        commit = subprocess.run(["git", "rev-parse", revision], cwd=repo, capture_output=True, text=True).stdout.strip()
        assert result["commits"][side] == commit
        readme = subprocess.run(["git", "show", f"{commit}:README.md"], cwd=repo, capture_output=True, text=True).stdout
        assert result["medians"][side]["readme.lines"] == len(readme.splitlines())
    assert "after/before" in done.stdout
    worktrees = subprocess.run(["git", "worktree", "list"], cwd=repo, capture_output=True, text=True).stdout
    assert "before_after_" not in worktrees
