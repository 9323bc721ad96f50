"""Wide & Deep data on the registry of dataset formats: its formats listed for W&D only, the TFRecords'
errors as data_errors.DataError, and the split-binary layout (wide_and_deep/wd_split_binary.py): the
converter's files, the same batches as the TFRecords for the same record shares, the same weights
trained through main.py, and bad input as one error. Real files, real TensorFlow, real processes."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import yaml

from recsys.data import data_formats
from recsys.data import data_errors
from multiproc import REPO_ROOT, assert_ok, launch_env, snapshot
from test_wd_train import SMALL, SMALL_BUCKETS, _rows, _teacher, _write_split, final, log_records, wd, weights, write_dataset
from wide_and_deep import features as F
from wide_and_deep import wd_data

CONVERT = [sys.executable, "-m", "wide_and_deep.to_split_binary"]


def test_wide_and_deep_formats_are_listed_for_wide_and_deep_only():
    assert data_formats.names("training", "wide_and_deep") == ("tfrecords", "split_binary")
    for role in data_formats.ROLES:
        assert not {"tfrecords", "split_binary"} & set(data_formats.names(role))
    script = ("import sys; sys.path.insert(0, 'wide_and_deep'); import main; "
              "action = [a for a in main.build_parser()._actions if a.dest == 'dataset_type'][0]; "
              "print(action.choices, action.default, 'tensorflow' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert result.stdout.split() == ["('tfrecords',", "'split_binary')", "tfrecords", "False"], result.stderr[-2000:]


def test_tfrecords_errors_are_the_projects_data_error(tmp_path):
    (tmp_path / "metadata.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(data_errors.DataError, match=f"{tmp_path}/metadata.json: not a wide_and_deep-tfrecords"):
        wd_data.open_splits("tfrecords", str(tmp_path), {"train_data_pattern": ["x"], "eval_data_pattern": ["y"]})


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """TFRecords (a short last record in each split) and their split-binary conversion."""
    root = tmp_path_factory.mktemp("wd_formats")
    write_dataset(str(root / "tfrecords"), train_rows=8 * 4096 + 1000, eval_rows=3 * 4096 - 1000, files=3)
    result = subprocess.run([*CONVERT, "--transformed_metadata_path", str(root / "tfrecords"),
                             "--output_path", str(root / "binary")], cwd=REPO_ROOT, env=launch_env(),
                            capture_output=True, text=True, timeout=240)
    assert_ok(result)
    assert f"{8 * 4096 + 1000} train and {3 * 4096 - 1000} eval rows" in result.stdout
    return str(root / "tfrecords"), str(root / "binary")


def open_both(datasets):
    folder, binary = datasets
    options = {"train_data_pattern": [f"{folder}/train/part*"], "eval_data_pattern": [f"{folder}/eval/part*"]}
    return wd_data.open_splits("tfrecords", folder, options), wd_data.open_splits("split_binary", binary, {})


def test_split_binary_files_are_described_by_a_feature_spec(datasets):
    _, binary = datasets
    spec = yaml.safe_load(open(os.path.join(binary, "feature_spec.yaml")))
    assert spec["channel_spec"]["categorical"] == list(F.CATEGORICAL_NAMES)
    # the cardinalities are the source's buckets (the test data's metadata.json: SMALL_BUCKETS each)
    assert spec["feature_spec"]["event_platform"] == {"cardinality": SMALL_BUCKETS, "dtype": "int8"}
    assert spec["feature_spec"]["doc_event_id"] == {"cardinality": SMALL_BUCKETS, "dtype": "int8"}
    assert spec["metadata"] == {"wide_and_deep_display_id": {"train": "train/display_id.bin",
                                                             "test": "test/display_id.bin"}}
    rows = 8 * 4096 + 1000
    sizes = {name: os.path.getsize(os.path.join(binary, "train", name)) for name in os.listdir(os.path.join(binary, "train"))}
    assert sizes["label.bin"] == rows and sizes["numerical.bin"] == rows * 13 * 4 and sizes["display_id.bin"] == rows * 8
    assert sizes["cat_12.bin"] == rows and sizes["cat_0.bin"] == rows and len(sizes) == 16  # int8 ids


@pytest.mark.parametrize("world_size", [1, 2])
def test_split_binary_serves_the_tfrecords_batches_for_the_same_shares(datasets, world_size):
    (tf_train, tf_eval), (bin_train, bin_eval) = open_both(datasets)
    assert (len(bin_train), bin_train.rows, len(bin_eval), bin_eval.rows) == (9, 8 * 4096 + 1000, 3, 3 * 4096 - 1000)
    for rank in range(world_size):
        for epoch in range(2):
            shares = [list(wd_data.train_record_groups(len(tf_train), 2 * world_size, rank, world_size, 0, epoch, 0))
                      for _ in range(2)]
            pairs = list(zip(tf_train.dataset(iter(shares[0]), F.BUCKETS), bin_train.dataset(iter(shares[1]), F.BUCKETS),
                             strict=True))
            assert len(pairs) == 9 // (2 * world_size)
            for a, b in pairs:
                for key in a:
                    np.testing.assert_array_equal(a[key].numpy(), b[key].numpy(), err_msg=key)
                    assert a[key].dtype == b[key].dtype
        groups = [wd_data.eval_record_groups(len(tf_eval), 2, rank, world_size) for _ in range(2)]
        for a, b in zip(tf_eval.dataset(groups[0], F.BUCKETS), bin_eval.dataset(groups[1], F.BUCKETS), strict=True):
            for key in a:
                np.testing.assert_array_equal(a[key].numpy(), b[key].numpy(), err_msg=key)


def test_training_on_split_binary_gives_the_weights_of_the_tfrecords(datasets, tmp_path):
    folder, binary = datasets
    common = [*SMALL, "--num_epochs", "2"]
    from_records = wd(["--train_data_pattern", f"{folder}/train/part*", "--eval_data_pattern", f"{folder}/eval/part*",
                       "--transformed_metadata_path", folder, *common, "--model_dir", str(tmp_path / "a"),
                       "--results_dir", str(tmp_path / "ra")])
    assert_ok(from_records)
    from_binary = wd(["--dataset_type", "split_binary", "--transformed_metadata_path", binary, *common,
                      "--model_dir", str(tmp_path / "b"), "--results_dir", str(tmp_path / "rb")])
    assert_ok(from_binary)
    a, b = weights(str(tmp_path / "a")), weights(str(tmp_path / "b"))
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    assert final(str(tmp_path / "ra")) == final(str(tmp_path / "rb"))


def test_two_ranks_train_on_a_short_last_record_as_one_process(tmp_path):
    """6 records (the last of 1000 rows), one per rank and step: every epoch's 3 steps read them all, and
    the step holding the short record gives its rank a smaller batch (it hung before: wd_model.TrainStep)."""
    folder = str(tmp_path / "data")
    write_dataset(folder, train_rows=5 * 4096 + 1000, eval_rows=2 * 4096, files=2)
    flags = ["--train_data_pattern", f"{folder}/train/part*", "--eval_data_pattern", f"{folder}/eval/part*",
             "--transformed_metadata_path", folder, *SMALL, "--num_epochs", "2", "--deep_dropout", "0"]
    one = wd([*flags, "--model_dir", str(tmp_path / "one"), "--results_dir", str(tmp_path / "r1")])
    assert_ok(one)
    two = wd([*flags, "--model_dir", str(tmp_path / "two"), "--results_dir", str(tmp_path / "r2")], np_=2)
    assert_ok(two)
    evaluations = [r["step"] for r in log_records(str(tmp_path / "r2")) if "auc_val" in r.get("data", {})]
    assert evaluations[:2] == [[3, 6], [6, 6]]
    a, b = weights(str(tmp_path / "one")), weights(str(tmp_path / "two"))
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=2e-4, atol=2e-6, err_msg=name)


def _bad_copy(datasets, tmp_path, edit):
    _, binary = datasets
    copy = tmp_path / "binary"
    subprocess.run(["cp", "-r", binary, str(copy)], check=True)
    edit(copy)
    return copy


def _set_id(copy):
    with open(copy / "train" / "cat_11.bin", "r+b") as f:  # event_country: int8, SMALL_BUCKETS buckets
        f.seek(16389)  # in record 4, the first the seed's epoch order reads (record 1 waits for epoch 2)
        f.write(np.int8(SMALL_BUCKETS).tobytes())


def _set_cardinality(copy):
    spec = yaml.safe_load(open(copy / "feature_spec.yaml"))
    spec["feature_spec"]["event_country"]["cardinality"] = 70000  # int32 ids; its file holds int8
    yaml.safe_dump(spec, open(copy / "feature_spec.yaml", "w"))


def _cut_display_ids(copy):
    os.truncate(copy / "test" / "display_id.bin", 8)


@pytest.mark.parametrize("edit, words", [
    (_set_id, "train/cat_11.bin: feature 'event_country' (mapping 'train') has id 64 at sample 16389, outside [0, 64)"),
    (_set_cardinality, "feature_spec.yaml: cardinality 70000 of feature 'event_country' does not fit its dtype int8"),
    (_cut_display_ids, "test/display_id.bin: the display_id file of mapping 'test' must hold 11288 int64 values"),
])
def test_bad_split_binary_data_is_one_error_naming_the_file(datasets, tmp_path, edit, words):
    copy = _bad_copy(datasets, tmp_path, edit)
    result = wd(["--dataset_type", "split_binary", "--transformed_metadata_path", str(copy), *SMALL,
                 "--num_epochs", "1", "--model_dir", str(tmp_path / "ckpt"), "--results_dir", str(tmp_path / "r")])
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 2 and len(errors) == 1 and words in errors[0], result.stderr[-3000:]
    assert "Traceback" not in result.stderr


def test_the_shared_reader_checks_float32_numericals_naming_the_file(datasets, tmp_path):
    """W&D's split-binary files are read by DLRM's SplitBinaryReader: a NaN among the float32 numericals
    is DLRM's DataError naming file, feature and row; the split serves the error, not the rows."""
    def set_nan(copy):
        with open(copy / "train" / "numerical.bin", "r+b") as f:
            f.seek((4096 + 5) * 13 * 4 + 2 * 4)  # record 1, row 5, numerical 2
            f.write(np.float32(np.nan).tobytes())
    copy = _bad_copy(datasets, tmp_path, set_nan)
    train, _ = wd_data.open_splits("split_binary", str(copy), {})
    assert len(train.reader.read_batch(0)[0]) == 4096
    with pytest.raises(data_errors.DataError, match=f"{copy}/train/numerical.bin: numerical feature "
                       f"'{F.NUMERIC_FEATURES[2]}' \\(mapping 'train'\\) is nan at sample 4101"):
        train.reader.read_batch(1)
    *_, error = train.read(np.array([0, 1]), F.BUCKETS)
    assert error != 0


def test_a_flag_another_format_owns_is_refused(datasets, tmp_path):
    folder, binary = datasets
    result = wd(["--dataset_type", "split_binary", "--transformed_metadata_path", binary,
                 "--train_data_pattern", f"{folder}/train/part*", *SMALL, "--model_dir", str(tmp_path / "ckpt"),
                 "--results_dir", str(tmp_path / "r")])
    assert result.returncode == 2, result.stderr[-3000:]
    assert "error: --train_data_pattern describes --dataset_type tfrecords data, not split_binary" in result.stderr
    assert not (tmp_path / "ckpt").exists()


def test_the_converter_refuses_an_existing_output_and_bad_records(datasets, tmp_path):
    folder, binary = datasets
    before = snapshot(binary)
    result = subprocess.run([*CONVERT, "--transformed_metadata_path", folder, "--output_path", binary],
                            cwd=REPO_ROOT, env=launch_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "already exists; refusing to overwrite it" in result.stderr, result.stderr[-2000:]
    assert snapshot(binary) == before
    bad = tmp_path / "bad"
    columns, _, _ = _rows(4096, 0, np.random.default_rng(0), _teacher(0))
    columns["ad_id"][7] = F.BUCKETS["ad_id"]
    for split in ("train", "eval"):
        _write_split(str(bad / split), columns, 1)
    (bad / "metadata.json").write_text(json.dumps({"train_rows": 4096, "eval_rows": 4096, "prebatch_size": 4096,
                                                   "format": "wide_and_deep-tfrecords", "version": 1}))
    result = subprocess.run([*CONVERT, "--transformed_metadata_path", str(bad), "--output_path", str(tmp_path / "out")],
                            cwd=REPO_ROOT, env=launch_env(), capture_output=True, text=True, timeout=120)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 2 and len(errors) == 1, result.stderr[-3000:]
    assert f"{bad}/train/part-r-00000" in errors[0] and "feature 'ad_id': id beyond its 250000 buckets" in errors[0]
    assert not (tmp_path / "out").exists() and not [p for p in os.listdir(tmp_path) if p.startswith(".out")]


@pytest.fixture(scope="module")
def small_records(tmp_path_factory):
    """TFRecords of 4 train records in 2 files (2 per step at SMALL's batch: one epoch reads all) and 1 eval."""
    root = tmp_path_factory.mktemp("wd_small_records")
    write_dataset(str(root), train_rows=4 * 4096, eval_rows=4096, files=2)
    return root


def _rewrite_record(path, number, edit):
    """Rewrite TFRecord file `path` with record `number`'s tf.train.Example changed by `edit` (valid CRCs:
    the project's own framing)."""
    import tensorflow as tf
    from wide_and_deep.preprocessing.tfrecord import write_record
    records = list(tf.compat.v1.io.tf_record_iterator(str(path)))
    example = tf.train.Example.FromString(records[number])
    edit(example.features.feature)
    records[number] = example.SerializeToString()
    with open(path, "wb") as f:
        for record in records:
            write_record(f, record)


def _zero_bytes(copy):
    """1,000 zeroed bytes inside record 1's data (its CRCs untouched): TensorFlow's reader reports it."""
    path = copy / "train" / "part-r-00001"
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.seek(size - 4 - 60000)
        f.write(bytes(1000))


def _nan_numerical(copy):
    _rewrite_record(copy / "train" / "part-r-00001", 1,
                    lambda feature: feature[F.NUMERIC_FEATURES[3]].float_list.value.__setitem__(17, float("nan")))


def _int64_numerical(copy):
    def edit(feature):
        values = feature[F.NUMERIC_FEATURES[0]]
        values.int64_list.value.extend([1] * len(values.float_list.value))  # the oneof: now an int64 list
    _rewrite_record(copy / "train" / "part-r-00001", 1, edit)


@pytest.mark.parametrize("edit, words", [
    (_zero_bytes, "train/part-r-00001: record 1: corrupt or truncated TFRecord file (its data does not match its CRC)"),
    (_nan_numerical, f"train/part-r-00001: record 1: numerical feature '{F.NUMERIC_FEATURES[3]}' (mapping 'train') "
                     f"is nan at sample 17; numerical features must be finite"),
    (_int64_numerical, f"train/part-r-00001: record 1: key '{F.NUMERIC_FEATURES[0]}' is stored as int64 values; "
                       f"the reader expects float"),
], ids=["zeroed-bytes", "nan", "wrong-dtype"])
def test_bad_tfrecords_are_one_error_naming_file_record_and_feature(small_records, tmp_path, edit, words):
    """Damaged bytes (a CRC), a NaN numerical and a key of another dtype in a train record: main.py stops
    with one error line naming the file, the record and the feature before a step trains on it (exit 2,
    no checkpoint); the same data unedited trains (the fixture's other tests)."""
    copy = tmp_path / "records"
    subprocess.run(["cp", "-r", str(small_records), str(copy)], check=True)
    edit(copy)
    result = wd(["--train_data_pattern", f"{copy}/train/part*", "--eval_data_pattern", f"{copy}/eval/part*",
                 "--transformed_metadata_path", str(copy), *SMALL, "--num_epochs", "1",
                 "--model_dir", str(tmp_path / "ckpt"), "--results_dir", str(tmp_path / "r")])
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 2 and len(errors) == 1 and f"{copy}/{words}" in errors[0], result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert not list(tmp_path.rglob("*.npy"))  # no checkpoint of weights trained on it


def test_small_records_train_unedited(small_records, tmp_path):
    """The control of the bad-records test: the same records, unedited, train one epoch (exit 0)."""
    result = wd(["--train_data_pattern", f"{small_records}/train/part*", "--eval_data_pattern",
                 f"{small_records}/eval/part*", "--transformed_metadata_path", str(small_records), *SMALL,
                 "--num_epochs", "1", "--model_dir", str(tmp_path / "ckpt"), "--results_dir", str(tmp_path / "r")])
    assert_ok(result)
