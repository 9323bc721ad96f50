"""Issue 12 for the data tools: bad input is one error line and leaves the file system as it was;
outputs never overlap inputs and appear whole or not at all (transcode.py, gen_csv.py,
prepare_synthetic_dataset.py and the library code behind them, split_binary.SplitBinaryWriter,
safe_io.check_replaceable).

Subprocess cases (the real entry points) are grouped per tool; the many variants of one rule run
in-process against the same library functions the entry points call.
"""
import hashlib
import os
import shutil

import numpy as np
import pytest
import yaml

from recsys.data import data_errors
from recsys.data import split_binary
from recsys.data import synthetic_data
from recsys.data.csv_data import generate_csv
from recsys.data.feature_spec import FeatureSpec, FeatureSpecError
from multiproc import assert_one_error, run_python, snapshot
from recsys.runtime.safe_io import OutputPathError, check_replaceable
from test_tools import transcode

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL_CSV_SPEC = os.path.join(REPO_ROOT, "tests", "transcoding", "small_csv.yaml")


def tool(script, *args):
    return run_python([os.path.join(REPO_ROOT, script), *map(str, args)])


@pytest.fixture(scope="module")
def csv_dataset(tmp_path_factory):
    """A small CSV dataset (gen_csv), shared read-only; tests copy it before changing it."""
    directory = tmp_path_factory.mktemp("csv_source") / "csv"
    generate_csv(SMALL_CSV_SPEC, str(directory), 50, seed=1)
    return directory


@pytest.fixture
def csv_dir(csv_dataset, tmp_path):
    target = tmp_path / "csv"
    shutil.copytree(csv_dataset, target)
    return target


# ----------------------------------------------------------------------------------- transcode
@pytest.mark.parametrize("where, extra", [
    ("same", []), ("inside", ["--overwrite"]), ("containing", ["--overwrite"])])
def test_transcode_cli_refuses_output_overlapping_the_input(csv_dir, tmp_path, where, extra):
    output = {"same": csv_dir, "inside": csv_dir / "train", "containing": tmp_path}[where]
    before = snapshot(tmp_path)
    result = tool("transcode.py", "--input", csv_dir, "--output", output, *extra)
    assert_one_error(result, f"--output {output}", "refusing to write onto an input")
    assert snapshot(tmp_path) == before


def test_transcode_refuses_every_overlap_with_or_without_overwrite(csv_dir, tmp_path):
    outside = tmp_path / "elsewhere" / "label.csv"  # a CSV file reached through a link in --input
    outside.parent.mkdir()
    (csv_dir / "train" / "label.csv").rename(outside)
    (csv_dir / "train" / "label.csv").symlink_to(outside)
    before = snapshot(tmp_path)
    cases = [(csv_dir, "is --input"), (csv_dir / "test", "lies inside --input"),
             (tmp_path, "contains --input"), (outside.parent, "contains the data file of mapping 'train'"),
             (csv_dir / "feature_spec.yaml", "lies inside --input")]
    for output, relation in cases:
        for overwrite in (False, True):
            with pytest.raises(OutputPathError, match=relation):
                transcode(str(csv_dir), str(output), overwrite=overwrite)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("value, problem", [
    ("inf", "is not a finite number"), ("-inf", "is not a finite number"),
    ("nan", "is not a finite number"), ("1e400", "is not a finite number"),
    ("70000", "overflows float16"), ("-65520", "overflows float16")])
def test_transcode_refuses_numericals_float16_cannot_hold(csv_dir, tmp_path, value, problem):
    path = csv_dir / "test" / "numerical.csv"
    lines = path.read_text().splitlines()
    fields = lines[6].split(",")
    fields[1] = value
    lines[6] = ",".join(fields)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(data_errors.DataError,
                       match=f"{path}: line 7: feature 'num_1' value .*{problem}"):
        transcode(str(csv_dir), str(tmp_path / "out"))
    assert sorted(os.listdir(tmp_path)) == ["csv"]


def test_transcode_largest_float16_is_kept(csv_dir, tmp_path):
    path = csv_dir / "train" / "numerical.csv"
    lines = path.read_text().splitlines()
    lines[0] = "65504,-65519,0.5"  # -65519 rounds to -65504 in float16
    path.write_text("\n".join(lines) + "\n")
    spec = transcode(str(csv_dir), str(tmp_path / "out"))
    first = np.fromfile(spec.file_of("train", "num_0"), np.float16)[:3]
    np.testing.assert_array_equal(first, np.array([65504, -65504, 0.5], np.float16))


def test_transcode_cli_bad_values_and_empty_inputs(csv_dir, tmp_path):
    """Through the entry point: an infinite value, then an empty file, then an empty mapping."""
    numerical = csv_dir / "train" / "numerical.csv"
    original = numerical.read_text()
    numerical.write_text(original.replace(original.split(",", 1)[0], "inf", 1))
    before = snapshot(tmp_path)
    result = tool("transcode.py", "--input", csv_dir, "--output", tmp_path / "out")
    assert_one_error(result, f"{numerical}: line 1: feature 'num_0' value", "is not a finite number")
    assert snapshot(tmp_path) == before

    numerical.write_text(original)
    label = csv_dir / "test" / "label.csv"
    label.write_text("")
    before = snapshot(tmp_path)
    result = tool("transcode.py", "--input", csv_dir, "--output", tmp_path / "out")
    assert_one_error(result, f"{label}: empty CSV file")
    assert snapshot(tmp_path) == before

    for path in (csv_dir / "test").iterdir():  # a mapping with zero rows: every file empty
        path.write_text("\n")
    with pytest.raises(data_errors.DataError, match="empty CSV file"):
        transcode(str(csv_dir), str(tmp_path / "out"))
    assert sorted(os.listdir(tmp_path)) == ["csv"]


def test_transcode_output_path_problems_are_one_line(csv_dir, tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    before = snapshot(tmp_path)
    result = tool("transcode.py", "--input", csv_dir, "--output", a_file)
    assert_one_error(result, f"--output {a_file} exists and is not a directory")
    assert snapshot(tmp_path) == before
    with pytest.raises(OutputPathError, match="is a file, not a directory"):
        transcode(str(csv_dir), str(a_file / "out"))
    assert_one_error(tool("transcode.py", "--output", tmp_path / "out"), "--input is required")
    with pytest.raises(OutputPathError, match="plain file name"):
        transcode(str(csv_dir), str(tmp_path / "out"), feature_spec_out="../spec.yaml")
    assert snapshot(tmp_path) == before
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(OutputPathError, match="not writable"):
            transcode(str(csv_dir), str(locked / "out"))


def test_transcode_overwrite_replaces_only_its_own_dataset(csv_dir, tmp_path):
    out = tmp_path / "out"
    transcode(str(csv_dir), str(out))
    written = snapshot(out)
    (out / "notes.txt").write_text("mine")
    before = snapshot(tmp_path)
    with pytest.raises(OutputPathError, match="holds notes.txt, which the new output would not contain"):
        transcode(str(csv_dir), str(out), overwrite=True)
    assert snapshot(tmp_path) == before
    (out / "notes.txt").unlink()
    (out / "train" / "stale.bin").write_bytes(b"old")
    transcode(str(csv_dir), str(out), overwrite=True)
    assert snapshot(out) == written  # replaced whole: the stale file is gone
    assert sorted(os.listdir(tmp_path)) == ["csv", "out"]
    empty = tmp_path / "empty"
    empty.mkdir()
    transcode(str(csv_dir), str(empty))  # an empty folder is no output to protect
    assert snapshot(empty) == written


# ----------------------------------------------------------------------- SplitBinaryWriter
def small_spec(directory):
    return FeatureSpec.get_default_feature_spec(2, [5, 7], str(directory))


def append_rows(writer, mapping, n):
    writer.append(mapping, np.zeros((n, 2)), np.ones(n), [np.zeros(n, int), np.ones(n, int)])


@pytest.mark.parametrize("interruption", [KeyboardInterrupt, RuntimeError, None])
def test_writer_leaves_nothing_when_interrupted_or_not_committed(tmp_path, interruption):
    out = tmp_path / "out"
    with split_binary.SplitBinaryWriter(small_spec(out)) as writer:
        append_rows(writer, "train", 4)
        writer.commit()
    before = snapshot(tmp_path)
    raised = interruption or RuntimeError
    with pytest.raises(raised):
        with split_binary.SplitBinaryWriter(small_spec(out), overwrite=True) as writer:
            append_rows(writer, "train", 9)
            assert sorted(os.listdir(tmp_path)) == sorted(["out", f".out.tmp-{os.getpid()}"])
            if interruption:
                raise interruption()
        raise RuntimeError("left the block without commit")
    assert snapshot(tmp_path) == before


def test_writer_refuses_layouts_that_would_mix_or_escape(tmp_path):
    spec = small_spec(tmp_path / "out")
    spec.source_spec["test"][1]["files"] = ["train/label.bin"]  # test labels onto train labels
    with pytest.raises(FeatureSpecError, match="is also the file of"):
        split_binary.SplitBinaryWriter(spec)
    for escaping in ("../label.bin", "/tmp/label.bin"):
        spec = small_spec(tmp_path / "out")
        spec.source_spec["test"][1]["files"] = [escaping]
        with pytest.raises(FeatureSpecError, match="lies outside the dataset folder"):
            split_binary.SplitBinaryWriter(spec)
    with pytest.raises(OutputPathError, match="plain file name"):
        split_binary.SplitBinaryWriter(small_spec(tmp_path / "out"), spec_file_name="train")
    assert os.listdir(tmp_path) == []


def test_check_replaceable(tmp_path):
    final = tmp_path / "final"
    assert check_replaceable(str(final), "--x", ["a"], replace=False) is False
    final.mkdir()
    assert check_replaceable(str(final), "--x", ["a"], replace=False) is True
    (final / "a").write_text("1")
    with pytest.raises(OutputPathError, match="--x .*final already holds a; refusing .*--overwrite"):
        check_replaceable(str(final), "--x", ["a"], replace=False)
    assert check_replaceable(str(final), "--x", ["a", "b"], replace=True) is True
    with pytest.raises(OutputPathError, match="holds a, which the new output would not contain"):
        check_replaceable(str(final), "--x", ["b"], replace=True)
    link = tmp_path / "link"
    link.symlink_to(final)
    with pytest.raises(OutputPathError, match="is a symbolic link"):
        check_replaceable(str(link), "--x", ["a"], replace=True)


# ------------------------------------------------------------------------------------ gen_csv
def write_spec(path, mutate):
    raw = yaml.safe_load(open(SMALL_CSV_SPEC))
    mutate(raw)
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize("file_name", ["../escape.csv", "/tmp/escape.csv", "train/../../escape.csv"])
def test_gen_csv_keeps_every_file_inside_output(tmp_path, file_name):
    spec = write_spec(tmp_path / "spec.yaml",
                      lambda raw: raw["source_spec"]["test"][1].update(files=[file_name]))
    before = snapshot(tmp_path)
    result = tool("gen_csv.py", "--feature_spec_in", spec, "--output", tmp_path / "out")
    assert_one_error(result, str(spec), repr(file_name))
    assert snapshot(tmp_path) == before and not os.path.exists("/tmp/escape.csv")


def test_gen_csv_refuses_bad_output_paths_in_one_line(tmp_path):
    spec = write_spec(tmp_path / "spec.yaml", lambda raw: None)
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    inside = tmp_path / "data"
    inside.mkdir()
    spec_inside = write_spec(inside / "feature_spec.yaml", lambda raw: None)
    before = snapshot(tmp_path)
    cases = [(["--output", a_file], [f"--output {a_file} exists and is not a directory"]),
             (["--output", a_file / "sub"], ["is a file, not a directory"]),
             (["--output", tmp_path / "out", "--size", "0"], ["--size must be positive"]),
             (["--output", inside, "--overwrite"], [f"--output {inside} contains --feature_spec_in"])]
    for args, fragments in cases:
        chosen = spec_inside if inside in args else spec
        assert_one_error(tool("gen_csv.py", "--feature_spec_in", chosen, *args), *fragments)
    assert snapshot(tmp_path) == before


def test_gen_csv_failure_midway_leaves_nothing(tmp_path):
    """A file and a folder of the same name: the second write fails after the first succeeded."""
    def clash(raw):
        raw["source_spec"]["train"][0]["files"] = ["train"]
        raw["source_spec"]["train"][1]["files"] = ["train/label.csv"]
    spec = write_spec(tmp_path / "spec.yaml", clash)
    out = tmp_path / "out"
    out.mkdir()
    (out / "train").write_text("old")  # an earlier output, replaced only on success
    before = snapshot(tmp_path)
    assert_one_error(tool("gen_csv.py", "--feature_spec_in", spec, "--output", out, "--overwrite"))
    assert snapshot(tmp_path) == before


def test_gen_csv_overwrite_replaces_its_files_and_no_others(tmp_path):
    out = tmp_path / "out"
    generate_csv(SMALL_CSV_SPEC, str(out), 20, seed=1)
    generate_csv(SMALL_CSV_SPEC, str(out), 30, seed=2, overwrite=True)
    assert len((out / "train" / "label.csv").read_text().splitlines()) == 30
    (out / "notes.txt").write_text("mine")
    before = snapshot(tmp_path)
    with pytest.raises(OutputPathError, match="notes.txt"):
        generate_csv(SMALL_CSV_SPEC, str(out), 30, overwrite=True)
    spec = write_spec(tmp_path / "twice.yaml",
                      lambda raw: raw["source_spec"]["test"][0].update(files=["feature_spec.yaml"]))
    with pytest.raises(FeatureSpecError, match="a chunk's file is named 'feature_spec.yaml'"):
        generate_csv(str(spec), str(tmp_path / "other"), 5)
    assert snapshot(tmp_path) == before | {"twice.yaml": hashlib.sha256(spec.read_bytes()).hexdigest()}


# ----------------------------------------------------------------- prepare_synthetic_dataset
def test_synthetic_flags_main_py_cannot_train_are_refused_by_name():
    cases = [
        (lambda: synthetic_data.sample_counts(0, None, 10), "--synthetic_dataset_num_entries is 0"),
        (lambda: synthetic_data.sample_counts(100, 5, 10), "--synthetic_dataset_num_test_entries is 5"),
        (lambda: synthetic_data.sample_counts(100, None, 0), "--synthetic_dataset_batch_size must be at least 1"),
        (lambda: synthetic_data.parse_cardinalities([]), "--synthetic_dataset_table_sizes is empty"),
        (lambda: synthetic_data.parse_cardinalities(["4", "0"]), "--synthetic_dataset_table_sizes .* got 0"),
        (lambda: synthetic_data.parse_cardinalities(["2147483647"]), "table_sizes .* got 2147483647"),
        (lambda: synthetic_data.output_spec("/x", None, None, 0, ["3"]), "--num_numerical_features .* got 0"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
    assert synthetic_data.sample_counts(25, 12, 10) == (20, 10)
    assert synthetic_data.parse_cardinalities(["1", "2147483646"]) == [1, 2147483646]


def test_synthetic_cli_refuses_bad_sizes_specs_and_overlaps(tmp_path):
    no_numerical = FeatureSpec.get_default_feature_spec(0, [4, 5], str(tmp_path / "spec"))
    no_numerical.to_yaml()
    spec_path = tmp_path / "spec" / "feature_spec.yaml"
    out = tmp_path / "out"
    before = snapshot(tmp_path)
    cases = [
        (["--synthetic_dataset_num_entries", "10", "--synthetic_dataset_batch_size", "16"],
         ["--synthetic_dataset_num_entries is 10, less than one batch of --synthetic_dataset_batch_size 16"]),
        (["--synthetic_dataset_table_sizes", "10,0"], ["--synthetic_dataset_table_sizes", "got 0"]),
        (["--feature_spec", spec_path], [f"--feature_spec {spec_path} has no numerical features"]),
        (["--feature_spec", spec_path, "--synthetic_dataset_dir", tmp_path / "spec", "--overwrite"],
         [f"--synthetic_dataset_dir {tmp_path / 'spec'} contains --feature_spec"]),
    ]
    for args, fragments in cases:
        result = tool("prepare_synthetic_dataset.py", "--synthetic_dataset_dir", out,
                      "--synthetic_dataset_num_entries", "64", "--synthetic_dataset_batch_size", "16",
                      *args)
        assert_one_error(result, *fragments)
    assert snapshot(tmp_path) == before


def test_synthetic_dataset_into_a_file_or_over_foreign_files(tmp_path):
    spec = small_spec(tmp_path / "a_file")
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(OutputPathError, match="--synthetic_dataset_dir .*a_file exists and is not a directory"):
        synthetic_data.write_synthetic_dataset(spec, 8, 8, seed=0, output_name="--synthetic_dataset_dir")
    out = tmp_path / "out"
    synthetic_data.write_synthetic_dataset(small_spec(out), 8, 8, seed=0)
    (out / "train" / "extra.bin").write_bytes(b"1")
    (out / "README").write_text("mine")
    before = snapshot(tmp_path)
    with pytest.raises(OutputPathError, match="holds README"):
        synthetic_data.write_synthetic_dataset(small_spec(out), 8, 8, seed=1, overwrite=True)
    assert snapshot(tmp_path) == before


def test_transcode_reads_csv_files_outside_input_only_when_allowed(csv_dir, tmp_path):
    outside = tmp_path / "outside_numerical.csv"
    os.rename(csv_dir / "train" / "numerical.csv", outside)
    spec = csv_dir / "feature_spec.yaml"
    spec.write_text(spec.read_text().replace("train/numerical.csv", str(outside)))
    before = snapshot(tmp_path)
    assert_one_error(tool("transcode.py", "--input", csv_dir, "--output", tmp_path / "out"),
                     f"file '{outside}' lies outside the dataset folder")
    assert snapshot(tmp_path) == before
    assert tool("transcode.py", "--input", csv_dir, "--output", tmp_path / "out",
                "--allow_external_paths").returncode == 0
    assert (tmp_path / "out" / "train" / "numerical.bin").stat().st_size > 0
