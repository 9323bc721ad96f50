"""V5 transcribe's other sources: NVTabular parquet (`nvt`) and per-sample TFRecords
(`tfrecords_multihot`) written here with pyarrow and tf.io from known values, transcribed to
split-binary and compared with those values; bad files are one error naming the file; and
`--src_synthetic_dataset_use_feature_spec` is accepted."""
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from recsys.data.feature_spec import FeatureSpec
from multiproc import snapshot
from test_dataloading import assert_same_tree, transcribe_here

CARDINALITIES = [5, 300, 40]
HOTNESS = [1, 3, 1]
FILE_SAMPLES = {"train": [30, 20], "test": [20]}  # samples per file of each mapping


def known_values(samples, seed, ragged=False):
    """labels [n], dense [n, 2] (exact in float16), ids per feature: [n] or [n, 3] (ragged: lists of 0-3)."""
    rng = np.random.default_rng(seed)
    ids = [rng.integers(0, c, (samples, h)) for c, h in zip(CARDINALITIES, HOTNESS)]
    ids = [i[:, 0] if h == 1 else [list(row) for row in i] for i, h in zip(ids, HOTNESS)]
    if ragged:
        ids[1] = [row[:rng.integers(0, 4)] for row in ids[1]]
    return rng.integers(0, 2, samples), rng.integers(0, 400, (samples, 2)) / 4.0, ids


def spec_for(root):
    spec = FeatureSpec.get_default_feature_spec(2, CARDINALITIES, str(root), hotness=HOTNESS)
    spec.to_yaml()
    return spec


def write_parquet(path, spec, values):
    labels, dense, ids = values
    columns = {spec.label_name: pa.array(labels, pa.int64()),
               **{name: pa.array(dense[:, i], pa.float32()) for i, name in enumerate(spec.numerical_names)},
               **{name: pa.array(i, pa.list_(pa.int64()) if h > 1 else pa.int64())
                  for name, i, h in zip(spec.categorical_names, ids, HOTNESS)}}
    pq.write_table(pa.table(columns), path)


def write_tfrecords(path, spec, values):
    labels, dense, ids = values
    with tf.io.TFRecordWriter(str(path)) as writer:
        for row in range(len(labels)):
            feature = {spec.label_name: tf.train.Feature(int64_list=tf.train.Int64List(value=[labels[row]]))}
            for i, name in enumerate(spec.numerical_names):
                feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=[dense[row, i]]))
            for name, values_of_feature in zip(spec.categorical_names, ids):
                value = values_of_feature[row]
                feature[name] = tf.train.Feature(int64_list=tf.train.Int64List(
                    value=list(value) if isinstance(value, list) else [value]))
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


WRITERS = {"nvt": (write_parquet, "parquet"), "tfrecords_multihot": (write_tfrecords, "tfrecord")}


def write_dataset(root, dataset_type, ragged=False):
    """The source folder (spec, train/part_<k>, test/part_<k>) and each mapping's values in order."""
    spec = spec_for(root)
    write, extension = WRITERS[dataset_type]
    expected = {}
    for seed, (mapping, sizes) in enumerate(FILE_SAMPLES.items()):
        os.makedirs(root / mapping)
        parts = []
        for k, samples in enumerate(sizes):
            values = known_values(samples, seed * 10 + k, ragged)
            write(root / mapping / f"part_{k}.{extension}", spec, values)
            parts.append(values)
        if not ragged:
            expected[mapping] = (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
                                 [np.concatenate([np.asarray(p[2][f]) for p in parts]) for f in range(3)])
    return expected


def split_binary_values(root, mapping):
    """What a tf_raw destination holds: labels, numericals [n, 2], ids per feature ([n] or [n, 3])."""
    labels = np.fromfile(root / mapping / "label.bin", np.bool_)
    dense = np.fromfile(root / mapping / "numerical.bin", np.float16).reshape(-1, 2)
    spec = FeatureSpec.from_yaml(str(root / "feature_spec.yaml"))
    ids = [np.fromfile(root / mapping / f"cat_{i}.bin", spec.dtype_of(name)).reshape(len(labels), -1).squeeze(1)
           if h == 1 else np.fromfile(root / mapping / f"cat_{i}.bin", spec.dtype_of(name)).reshape(len(labels), h)
           for i, (name, h) in enumerate(zip(spec.categorical_names, HOTNESS))]
    return labels, dense, ids


@pytest.mark.parametrize("dataset_type", ["nvt", "tfrecords_multihot"])
def test_transcribes_to_split_binary_with_the_known_values(tmp_path, capsys, dataset_type):
    expected = write_dataset(tmp_path / "src", dataset_type)
    result = transcribe_here(capsys, "--src_dataset_type", dataset_type, "--src_dataset_path", tmp_path / "src",
                             "--src_batch_size", 16, "--dst_dataset_type", "tf_raw", "--dst_dataset_path",
                             tmp_path / "dst")
    assert result.returncode == 0, result.stderr
    assert "wrote 4 train and 2 test batches" in result.stdout  # 50 and 20 samples, the partial batches kept
    for mapping in ("train", "test"):
        labels, dense, ids = split_binary_values(tmp_path / "dst", mapping)
        np.testing.assert_array_equal(labels, expected[mapping][0] == 1)
        np.testing.assert_array_equal(dense, expected[mapping][1].astype(np.float16))
        for got, want in zip(ids, expected[mapping][2]):
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dataset_type", ["nvt", "tfrecords_multihot"])
def test_ragged_ids_reach_split_tfrecords_and_are_refused_by_split_binary(tmp_path, capsys, dataset_type):
    write_dataset(tmp_path / "src", dataset_type, ragged=True)
    common = ["--src_dataset_type", dataset_type, "--src_dataset_path", tmp_path / "src", "--src_batch_size", 10]
    result = transcribe_here(capsys, *common, "--dst_prebatch_size", 10, "--dst_dataset_path", tmp_path / "records")
    assert result.returncode == 0, result.stderr
    assert "wrote 5 train and 2 test batches" in result.stdout
    before = snapshot(tmp_path)
    result = transcribe_here(capsys, *common, "--dst_dataset_type", "tf_raw", "--dst_dataset_path", tmp_path / "bin")
    assert result.returncode == 2 and result.stderr.count("error:") == 1 and "cat_1.bin" in result.stderr
    assert snapshot(tmp_path) == before


def corrupt_missing_column(root, dataset_type):
    spec = FeatureSpec.from_yaml(str(root / "feature_spec.yaml"))
    values = known_values(5, 99)
    path = root / "train" / f"part_1.{WRITERS[dataset_type][1]}"
    if dataset_type == "nvt":
        write_parquet(path, spec, values)
        table = pq.read_table(path).drop(["num_1"])
        pq.write_table(table, path)
    else:
        path.write_bytes(b"this is not a TFRecord file at all")
    return path


def corrupt_bad_id(root, dataset_type):
    spec = FeatureSpec.from_yaml(str(root / "feature_spec.yaml"))
    labels, dense, ids = known_values(5, 98)
    ids[2] = np.array([0, 1, 40, 3, 4])  # 40 is outside [0, 40)
    path = root / "test" / f"part_0.{WRITERS[dataset_type][1]}"
    WRITERS[dataset_type][0](path, spec, (labels, dense, ids))
    return path


@pytest.mark.parametrize("dataset_type", ["nvt", "tfrecords_multihot"])
@pytest.mark.parametrize("corrupt, words", [(corrupt_missing_column, ()),
                                            (corrupt_bad_id, ("cat_2.bin", "id 40 at sample 2"))])
def test_a_bad_file_is_one_error_naming_it(tmp_path, capsys, dataset_type, corrupt, words):
    write_dataset(tmp_path / "src", dataset_type)
    path = corrupt(tmp_path / "src", dataset_type)
    before = snapshot(tmp_path)
    result = transcribe_here(capsys, "--src_dataset_type", dataset_type, "--src_dataset_path", tmp_path / "src",
                             "--src_batch_size", 16, "--dst_dataset_type", "tf_raw", "--dst_dataset_path",
                             tmp_path / "dst")
    assert result.returncode == 2 and result.stderr.count("error:") == 1, result.stderr
    assert str(path) in result.stderr and all(word in result.stderr for word in words), result.stderr
    if corrupt is corrupt_missing_column and dataset_type == "nvt":
        assert "num_1" in result.stderr
    assert snapshot(tmp_path) == before


def test_a_mapping_without_files_is_one_error(tmp_path, capsys):
    write_dataset(tmp_path / "src", "nvt")
    for name in os.listdir(tmp_path / "src" / "test"):
        os.remove(tmp_path / "src" / "test" / name)
    result = transcribe_here(capsys, "--src_dataset_type", "nvt", "--src_dataset_path", tmp_path / "src",
                             "--dst_dataset_path", tmp_path / "dst", "--dst_dataset_type", "tf_raw")
    assert result.returncode == 2 and "*.parquet" in result.stderr and str(tmp_path / "src" / "test") in result.stderr
    assert not os.path.exists(tmp_path / "dst")


def test_src_synthetic_dataset_use_feature_spec_is_accepted(tmp_path, capsys):
    spec_for(tmp_path / "spec")
    outputs = []
    for flag in ([], ["--src_synthetic_dataset_use_feature_spec"]):
        out = tmp_path / f"out{len(flag)}"
        result = transcribe_here(capsys, "--src_dataset_type", "synthetic", "--src_dataset_path", tmp_path / "spec",
                                 "--src_batch_size", 8, "--max_batches_train", 3, "--max_batches_test", 1,
                                 "--dst_dataset_type", "tf_raw", "--dst_dataset_path", out, *flag)
        assert result.returncode == 0, result.stderr
        outputs.append(out)
    assert_same_tree(*outputs)
