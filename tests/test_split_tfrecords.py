"""Split-TFRecords: the stored form, per-rank batches equal to the split-binary reader's, the V5 spec
shape, and one clear DataError for every kind of bad folder, file or value (real TF, no mocks)."""
import json
import os

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2

from recsys.data import data_errors
import dataloader
import datasets
from recsys.data import split_binary
from recsys.data import pipeline_errors
from recsys.data import split_tfrecords
from recsys.data.batch import CATEGORICAL_KEY, NUMERICAL_KEY, TableReads
from recsys.data.feature_spec import FeatureSpec, FeatureSpecError, get_default_feature_spec

BATCH = 64
CARDINALITIES = [5, 300, 40000]


def write_pair(tmp_path, batches=None):
    """The same random samples as a split-binary and a split-TFRecords dataset; their specs."""
    batches = batches or {"train": 3, "test": 2}
    rng = np.random.default_rng(3)
    binary = get_default_feature_spec(2, CARDINALITIES, str(tmp_path / "binary"))
    with split_binary.SplitBinaryWriter(binary) as raw, \
            split_tfrecords.SplitTFRecordsWriter(binary, str(tmp_path / "records"), BATCH) as records:
        for mapping, count in batches.items():
            for _ in range(count):
                sample = (rng.random((BATCH, 2)).astype(np.float16), rng.integers(0, 2, BATCH).astype(bool),
                          [rng.integers(0, c, BATCH) for c in CARDINALITIES])
                raw.append(mapping, *sample)
                records.append(mapping, *sample)
        raw.commit()
        records.commit()
    return (FeatureSpec.from_yaml(str(tmp_path / "binary" / "feature_spec.yaml")),
            FeatureSpec.from_yaml(str(tmp_path / "records" / "feature_spec.yaml")))


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return write_pair(tmp_path_factory.mktemp("pair"))


def elements(dataset):
    out = []
    with pipeline_errors.surface_data_errors():
        for features, labels in dataset:
            out.append((labels.numpy(), features[NUMERICAL_KEY].numpy(),
                        [ids.numpy() for ids in features[CATEGORICAL_KEY]]))
    return out


def test_the_stored_form(pair):
    _, spec = pair
    root = spec.base_directory
    assert spec.source_spec is None
    assert [str(spec.dtype_of(n)) for n in spec.categorical_names] == ["int32"] * 3
    assert str(spec.dtype_of(spec.label_name)) == "int8"
    with open(os.path.join(root, "train", "length.json")) as f:
        assert json.load(f) == 3
    assert sorted(os.listdir(os.path.join(root, "train"))) == [
        "categorical_0", "categorical_1", "categorical_2", "label", "length.json", "numerical"]
    with open(os.path.join(root, "train", "numerical", "format.json")) as f:
        assert json.load(f) == {"format": "tfrecords", "dtype": "float16", "multihot": False,
                                "feature_name": "data", "num_features": 2, "batches_per_file": 3}
    path = os.path.join(root, "test", "categorical_1", "data_0.tfrecords")
    records = list(tf.data.TFRecordDataset(path).as_numpy_iterator())
    assert len(records) == 2
    parsed = tf.io.parse_single_example(records[0], {"data": tf.io.FixedLenFeature([], tf.string)})
    ids = tf.io.parse_tensor(parsed["data"], tf.int32)  # what V5's reader does
    assert ids.shape == (BATCH, 1)


@pytest.mark.parametrize("world_size, rank, reads", [
    (1, 0, None), (2, 1, None), (2, 0, TableReads((0, 2), global_batch=True)),
    (3, 2, TableReads((1,), global_batch=False))])
def test_rank_batches_equal_the_split_binary_readers(pair, world_size, rank, reads):
    binary, records = pair
    for mapping in ("train", "test"):
        kwargs = dict(rank=rank, world_size=world_size, reads=reads)
        expected = elements(split_binary.SplitBinaryReader(binary, mapping, BATCH, **kwargs).dataset())
        got = elements(split_tfrecords.SplitTFRecordsReader(records, mapping, BATCH, **kwargs).dataset())
        assert len(got) == len(expected) == {"train": 3, "test": 2}[mapping]
        for (labels, numerical, ids), (want_labels, want_numerical, want_ids) in zip(got, expected):
            np.testing.assert_array_equal(labels, want_labels)
            np.testing.assert_array_equal(numerical, want_numerical)
            assert len(ids) == len(want_ids)
            for a, b in zip(ids, want_ids):
                np.testing.assert_array_equal(a, b)


def test_create_input_pipelines_reads_split_tfrecords(pair):
    _, records = pair
    spec = datasets.load_feature_spec(dataset_type="split_tfrecords", dataset_path=records.base_directory)
    pipelines = dataloader.create_input_pipelines(spec, dataloader.PipelineConfig(
        dataset_type="split_tfrecords", train_batch_size=BATCH, eval_batch_size=BATCH, world_size=2, rank=1,
        validate_data=True))
    assert (pipelines.train_steps, pipelines.eval_steps) == (3, 2)
    features, labels = next(iter(pipelines.train))
    assert labels.shape == (BATCH // 2, 1) and labels.dtype == tf.float32
    assert features[NUMERICAL_KEY].shape == (BATCH // 2, 2)
    assert [ids.shape for ids in features[CATEGORICAL_KEY]] == [(BATCH // 2,)] * 3
    with pytest.raises(data_errors.DataError, match="global batch size must be 64, got 128"):
        dataloader.create_input_pipelines(spec, dataloader.PipelineConfig(
            dataset_type="split_tfrecords", train_batch_size=128, eval_batch_size=BATCH))
    with pytest.raises(ValueError, match="shuffle_batch_order is not available for split_tfrecords"):
        dataloader.create_input_pipelines(spec, dataloader.PipelineConfig(
            dataset_type="split_tfrecords", train_batch_size=BATCH, eval_batch_size=BATCH,
            shuffle_batch_order=True))


def test_a_v5_spec_with_an_int8_label_and_hotness_loads(tmp_path):
    spec = FeatureSpec.get_fileless_feature_spec(2, [10, 20], str(tmp_path))
    spec.to_yaml()
    loaded = datasets.load_feature_spec(dataset_type="synthetic", dataset_path=str(tmp_path),
                                          use_feature_spec=True)
    assert loaded.cardinalities == [10, 20] and loaded.feature_spec["cat_0"]["hotness"] == 1
    with pytest.raises(FeatureSpecError, match="source_spec is null"):
        datasets.load_feature_spec(dataset_type="tf_raw", dataset_path=str(tmp_path))


@pytest.mark.parametrize("key, value, words", [
    ("hotness", 0, "has hotness 0; it must be a positive integer"),
    ("pooling", "avg", "has pooling 'avg'; it must be one of ['sum', 'mean']"),
    ("hotnes", 3, "has unknown key 'hotnes' (did you mean 'hotness'?)"),
    ("alpha", "x", "has alpha 'x'; it must be a positive number")])
def test_a_spec_with_bad_hotness_pooling_or_alpha_is_refused(tmp_path, key, value, words):
    spec = FeatureSpec.get_fileless_feature_spec(1, [10, 20], str(tmp_path))
    spec.feature_spec["cat_1"][key] = value
    path = spec.to_yaml()
    with pytest.raises(FeatureSpecError) as error:
        FeatureSpec.from_yaml(path).check_feature_spec(chunk_type=None)
    assert str(error.value).startswith(f"{path}: categorical feature 'cat_1' {words}")


def _rewrite_record(path, index, transform):
    """Replace record `index` of a TFRecord file by `transform(array)`, re-serialized."""
    records = list(tf.data.TFRecordDataset(path).as_numpy_iterator())
    example = tf.train.Example.FromString(records[index])
    proto = tensor_pb2.TensorProto.FromString(example.features.feature["data"].bytes_list.value[0])
    array = transform(tf.make_ndarray(proto))
    example.features.feature["data"].bytes_list.value[0] = tf.io.serialize_tensor(array).numpy()
    records[index] = example.SerializeToString()
    with tf.io.TFRecordWriter(path) as writer:
        for record in records:
            writer.write(record)


def _flip_byte(path, offset):
    data = bytearray(open(path, "rb").read())
    data[offset] ^= 0xFF
    open(path, "wb").write(bytes(data))


def _zero_record_bytes(path, number, count):
    """`count` zeroed bytes inside record `number`'s data (its CRCs untouched), as W&D's test damages its files."""
    data, start = bytearray(open(path, "rb").read()), 0
    for _ in range(number):
        start += 12 + int.from_bytes(data[start:start + 8], "little") + 4
    length = int.from_bytes(data[start:start + 8], "little")
    assert length > count
    data[start + 12 + length // 2 - count // 2:start + 12 + length // 2 - count // 2 + count] = bytes(count)
    open(path, "wb").write(bytes(data))


def _truncate(path, size):
    data = open(path, "rb").read()
    open(path, "wb").write(data[:size])


BAD_DATA = {
    "corrupt file": ("train/categorical_2/data_0.tfrecords", lambda p: _flip_byte(p, 40),
                     "corrupt or truncated TFRecord file (corrupted record at"),
    "zeroed bytes": ("train/numerical/data_0.tfrecords", lambda p: _zero_record_bytes(p, 1, 100),
                     "record 1: corrupt or truncated TFRecord file (corrupted record at"),
    "truncated file": ("train/numerical/data_0.tfrecords", lambda p: _truncate(p, os.path.getsize(p) - 9),
                       "corrupt or truncated TFRecord file"),
    "missing record": ("train/label/data_0.tfrecords",
                       lambda p: _truncate(p, os.path.getsize(p) * 2 // 3),
                       "the folder holds 2 batches, but length.json gives 3"),
    "label 2": ("train/label/data_0.tfrecords",
                lambda p: _rewrite_record(p, 1, lambda a: np.where(np.arange(a.size).reshape(a.shape) == 5,
                                                                    2, a).astype(np.int8)),
                "label 'label' (mapping 'train') has byte 2 at sample 69"),
    "id out of range": ("train/categorical_0/data_0.tfrecords",
                        lambda p: _rewrite_record(p, 2, lambda a: np.full_like(a, 5)),
                        "feature 'cat_0.bin' (mapping 'train') has id 5 at sample 128, outside [0, 5)"),
    "nan numerical": ("train/numerical/data_0.tfrecords",
                      lambda p: _rewrite_record(p, 0, lambda a: np.full_like(a, np.nan)),
                      "numerical feature 'num_0' (mapping 'train') is nan at sample 0"),
    "short record": ("train/categorical_1/data_0.tfrecords",
                     lambda p: _rewrite_record(p, 1, lambda a: a[:10]),
                     "batch 1 holds 10 values, not a prebatch of 64 samples x 1 features"),
    "wrong dtype": ("train/categorical_1/data_0.tfrecords",
                    lambda p: _rewrite_record(p, 0, lambda a: a.astype(np.int64)),
                    "record 0 holds int64 values in 'data', but format.json says int32"),
}


@pytest.mark.parametrize("case", sorted(BAD_DATA))
def test_bad_data_is_one_error_naming_the_file(tmp_path, case):
    relative, damage, words = BAD_DATA[case]
    _, spec = write_pair(tmp_path)
    path = os.path.join(spec.base_directory, relative)
    damage(path)
    reader = split_tfrecords.SplitTFRecordsReader(spec, "train", BATCH)
    with pytest.raises(data_errors.DataError) as error:
        elements(reader.dataset())
    assert str(error.value).startswith(f"{path}: "), str(error.value)
    assert words in str(error.value)


@pytest.mark.parametrize("edit, words", [
    (lambda root: os.remove(os.path.join(root, "train", "length.json")), "train/length.json: the length file not found"),
    (lambda root: open(os.path.join(root, "train", "length.json"), "w").write("-1"),
     "train/length.json: must hold a non-negative integer"),
    (lambda root: json.dump({"format": "tfrecords", "dtype": "int32", "multihot": True, "feature_name": "data",
                             "num_features": 1, "batches_per_file": 3},
                            open(os.path.join(root, "train", "categorical_0", "format.json"), "w")),
     "categorical_0/format.json: a multi-hot (ragged) folder, but feature 'cat_0.bin' has hotness 1"),
    (lambda root: os.rename(os.path.join(root, "train", "categorical_2"), os.path.join(root, "train", "other")),
     "train/categorical_2: feature folder not found"),
    (lambda root: os.rename(os.path.join(root, "train", "label", "data_0.tfrecords"),
                            os.path.join(root, "train", "label", "data_1.tfrecords")),
     "data files must be data_0.tfrecords, data_1.tfrecords, ... without gaps"),
])
def test_a_bad_folder_is_refused_before_any_batch(tmp_path, edit, words):
    _, spec = write_pair(tmp_path)
    edit(spec.base_directory)
    with pytest.raises(data_errors.DataError, match=words.replace("(", r"\(").replace(")", r"\)")):
        split_tfrecords.SplitTFRecordsReader(spec, "train", BATCH)


def test_the_writer_is_all_or_nothing(tmp_path):
    spec = get_default_feature_spec(1, [4], str(tmp_path))
    destination = tmp_path / "out"
    with pytest.raises(ValueError, match="one prebatch of 8 samples, got 7"):
        with split_tfrecords.SplitTFRecordsWriter(spec, str(destination), 8) as writer:
            writer.append("train", np.zeros((8, 1)), np.zeros(8), [np.zeros(8)])
            writer.append("train", np.zeros((7, 1)), np.zeros(7), [np.zeros(7)])
    assert not destination.exists() and os.listdir(tmp_path) == []
