"""Multi-hot data: split-binary [samples, h] files read as [b, h], split-TFRecords ragged folders
read as tf.RaggedTensor, per-rank slices, transcribe both ways, V5's power-law synthetic ids and the
pooling teacher, the MLPerf materialisation, and one clear error for each kind of bad input."""
import json
import os

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2

import dataloader
import datasets
from recsys.data import split_binary
from recsys.data import pipeline_errors
from recsys.data import split_tfrecords
from recsys.data import synthetic_data
from recsys.data.batch import CATEGORICAL_KEY, NUMERICAL_KEY, RaggedIds, TableReads
from recsys.data.data_errors import DataError
from dataloading import materialize_multihot, transcribe
from recsys.data.feature_spec import CSV, FeatureSpec, FeatureSpecError, get_default_feature_spec
from recsys.runtime.safe_io import OutputPathError

BATCH = 32
CARDINALITIES = [5, 300, 40000]
HOTNESS = [1, 3, 4]
BATCHES = {"train": 3, "test": 2}


def multi_hot_spec(directory):
    spec = get_default_feature_spec(2, CARDINALITIES, str(directory), hotness=HOTNESS)
    spec.feature_spec["cat_2.bin"]["pooling"] = "mean"
    return spec


def random_batch(rng, ragged=False):
    """One batch: numericals, labels, ids [B], [B, 3], [B, 4] (ragged: rows of 0..h ids instead)."""
    ids = [rng.integers(0, c, (BATCH, h) if h > 1 else BATCH) for c, h in zip(CARDINALITIES, HOTNESS)]
    if ragged:
        for i in (1, 2):
            lengths = rng.integers(0, HOTNESS[i] + 1, BATCH)
            ids[i] = RaggedIds(rng.integers(0, CARDINALITIES[i], int(lengths.sum())), lengths)
    return rng.random((BATCH, 2)).astype(np.float16), rng.integers(0, 2, BATCH).astype(bool), ids


def write_binary(directory, seed=3):
    """A multi-hot split-binary dataset; its spec and the batches written."""
    rng = np.random.default_rng(seed)
    written = {mapping: [random_batch(rng) for _ in range(count)] for mapping, count in BATCHES.items()}
    with split_binary.SplitBinaryWriter(multi_hot_spec(directory)) as writer:
        for mapping, batches in written.items():
            for batch in batches:
                writer.append(mapping, *batch)
        path = writer.commit()
    return FeatureSpec.from_yaml(path), written


def write_ragged(directory, seed=4):
    """A split-TFRecords dataset with ragged multi-hot features; its spec and the batches written."""
    rng = np.random.default_rng(seed)
    written = {mapping: [random_batch(rng, ragged=True) for _ in range(count)] for mapping, count in BATCHES.items()}
    with split_tfrecords.SplitTFRecordsWriter(multi_hot_spec(directory), str(directory), BATCH) as writer:
        for mapping, batches in written.items():
            for batch in batches:
                writer.append(mapping, *batch)
        path = writer.commit()
    return FeatureSpec.from_yaml(path), written


@pytest.fixture(scope="module")
def binary(tmp_path_factory):
    return write_binary(tmp_path_factory.mktemp("binary") / "data")


@pytest.fixture(scope="module")
def ragged(tmp_path_factory):
    return write_ragged(tmp_path_factory.mktemp("ragged") / "data")


def elements(dataset):
    with pipeline_errors.surface_data_errors():
        return [(labels.numpy(), features[NUMERICAL_KEY].numpy(), list(features[CATEGORICAL_KEY]))
                for features, labels in dataset]


def rows_of(ids, lo, hi):
    return ids.rows(lo, hi) if isinstance(ids, RaggedIds) else ids[lo:hi]


def assert_ragged_equal(tensor, expected):
    assert isinstance(tensor, tf.RaggedTensor) and tensor.row_splits.dtype == tf.int64
    assert tensor.values.dtype == tf.int32
    np.testing.assert_array_equal(tensor.row_lengths().numpy(), expected.row_lengths)
    np.testing.assert_array_equal(tensor.values.numpy(), expected.values)


# ------------------------------------------------------------------------------ split-binary
def test_split_binary_serves_b_h_tensors(binary):
    spec, written = binary
    assert spec.hotness == HOTNESS and spec.poolings == ["sum", "sum", "mean"]
    reader = split_binary.SplitBinaryReader(spec, "train", BATCH)
    for (labels, numerical, ids), (num, lab, expected) in zip(elements(reader.dataset()), written["train"]):
        assert [tuple(i.shape) for i in ids] == [(BATCH,), (BATCH, 3), (BATCH, 4)]
        assert all(i.dtype == tf.int32 for i in ids)
        for got, want in zip(ids, expected):
            np.testing.assert_array_equal(got.numpy(), want)
        np.testing.assert_array_equal(labels[:, 0], lab)
    numerical, labels, ids = reader.read_samples(2)
    for got, want in zip(ids, written["train"][2][2]):
        np.testing.assert_array_equal(got, want)
    split_binary.validate_data(spec, ("train", "test"))


@pytest.mark.parametrize("world_size, rank, reads", [
    (2, 1, None), (2, 0, TableReads((1, 2), global_batch=True)), (3, 2, TableReads((2,), global_batch=False))])
def test_split_binary_rank_slices(binary, world_size, rank, reads):
    spec, written = binary
    reads_or_all = reads or TableReads.every_table(3)
    reader = split_binary.SplitBinaryReader(spec, "test", BATCH, rank=rank, world_size=world_size, reads=reads,
                                        drop_remainder=False)
    for (labels, _, ids), (_, lab, expected) in zip(elements(reader.dataset()), written["test"]):
        lo, hi = reads_or_all.rows(BATCH, rank, world_size)
        assert len(ids) == len(reads_or_all.tables)
        for got, table in zip(ids, reads_or_all.tables):
            np.testing.assert_array_equal(got.numpy(), expected[table][lo:hi])


# ------------------------------------------------------------------------------ split-TFRecords
def test_split_tfrecords_ragged_layout(ragged):
    spec, written = ragged
    folder = os.path.join(spec.base_directory, "train", "categorical_1")
    with open(os.path.join(folder, "format.json")) as f:
        assert json.load(f) == {"format": "tfrecords", "dtype": "int32", "multihot": True, "feature_name": "data",
                                "num_features": 1, "batches_per_file": 3}
    record = next(iter(tf.data.TFRecordDataset(os.path.join(folder, "data_0.tfrecords"))))
    parsed = tf.io.parse_single_example(record, {key: tf.io.FixedLenFeature([], tf.string)
                                                 for key in ("data_values", "data_row_lengths")})
    lengths = tf.io.parse_tensor(parsed["data_row_lengths"], tf.int32)
    values = tf.io.parse_tensor(parsed["data_values"], tf.int32)
    expected = written["train"][0][2][1]
    np.testing.assert_array_equal(lengths, expected.row_lengths)
    np.testing.assert_array_equal(values, expected.values)
    with open(os.path.join(spec.base_directory, "train", "categorical_0", "format.json")) as f:
        assert json.load(f)["multihot"] is False


@pytest.mark.parametrize("world_size, rank, reads", [
    (1, 0, None), (2, 1, None), (2, 0, TableReads((0, 2), global_batch=True)), (2, 1, TableReads((1,)))])
def test_split_tfrecords_serves_ragged_tensors(ragged, world_size, rank, reads):
    spec, written = ragged
    reads_or_all = reads or TableReads.every_table(3)
    reader = split_tfrecords.SplitTFRecordsReader(spec, "train", BATCH, rank=rank, world_size=world_size,
                                                  reads=reads)
    batches = elements(reader.dataset())
    assert len(batches) == 3
    for (labels, _, ids), (_, lab, expected) in zip(batches, written["train"]):
        lo, hi = reads_or_all.rows(BATCH, rank, world_size)
        for got, table in zip(ids, reads_or_all.tables):
            if HOTNESS[table] > 1:
                assert_ragged_equal(got, expected[table].rows(lo, hi))
                assert got.shape.as_list() == [hi - lo, None]
            else:
                assert got.shape == (hi - lo,)
                np.testing.assert_array_equal(got.numpy(), expected[table][lo:hi])


# ------------------------------------------------------------------------------ transcribe
def test_transcribe_both_ways(binary, tmp_path):
    spec, _ = binary
    records, back = str(tmp_path / "records"), str(tmp_path / "back")
    transcribe.transcribe("tf_raw", spec.base_directory, records, src_batch_size=BATCH, dst_prebatch_size=BATCH)
    assert FeatureSpec.from_yaml(os.path.join(records, "feature_spec.yaml")).hotness == HOTNESS
    reader = split_tfrecords.SplitTFRecordsReader(FeatureSpec.from_yaml(os.path.join(records, "feature_spec.yaml")),
                                                  "train", BATCH)
    _, _, ids = next(reader.batches())
    assert isinstance(ids[1], RaggedIds) and (ids[1].row_lengths == 3).all()
    transcribe.transcribe("split_tfrecords", records, back, "tf_raw", src_batch_size=BATCH)
    again = FeatureSpec.from_yaml(os.path.join(back, "feature_spec.yaml"))
    assert again.hotness == HOTNESS and again.poolings == spec.poolings
    for mapping in ("train", "test"):
        for name in spec.categorical_names:
            with open(spec.file_of(mapping, name), "rb") as a, open(again.file_of(mapping, name), "rb") as b:
                assert a.read() == b.read()


def test_ragged_rows_shorter_than_hotness_do_not_become_split_binary(ragged, tmp_path):
    spec, _ = ragged
    with pytest.raises(DataError, match=r"feature 'cat_1.bin' has \d ids at sample \d+ .*split-binary stores "
                                        r"exactly its hotness 3 ids per sample and pads nothing"):
        transcribe.transcribe("split_tfrecords", spec.base_directory, str(tmp_path / "out"), "tf_raw",
                              src_batch_size=BATCH)
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------ synthetic data
def test_power_law_ids_stay_in_range_skew_with_alpha_and_repeat_with_the_seed():
    shares = []
    for alpha in (0.5, 1.0, 1.45, 2.5):
        ids = synthetic_data.power_law_ids(np.random.default_rng(7), 1000, alpha, (20000, 4))
        assert ids.shape == (20000, 4) and ids.min() >= 0 and ids.max() < 1000
        shares.append((ids < 10).mean())
        again = synthetic_data.power_law_ids(np.random.default_rng(7), 1000, alpha, (20000, 4))
        np.testing.assert_array_equal(ids, again)
    assert shares == sorted(shares) and shares[0] < 0.1 < 0.8 < shares[-1], shares
    other = synthetic_data.power_law_ids(np.random.default_rng(8), 1000, 1.45, (20000, 4))
    assert not np.array_equal(other, synthetic_data.power_law_ids(np.random.default_rng(7), 1000, 1.45, (20000, 4)))


@pytest.mark.parametrize("pooling", ["sum", "mean"])
def test_the_teacher_pools_multi_hot_ids(pooling):
    teacher = synthetic_data.SyntheticTeacher(2, [50, 70], seed=5, hotness=[1, 4], poolings=["sum", pooling])
    ids = np.random.default_rng(0).integers(0, 70, (100, 4))
    per_id = np.stack([teacher.feature_values(2, 1, ids[:, k], 4) for k in range(4)], axis=1)
    pooled = teacher.feature_values(2, 1, ids, 4)
    np.testing.assert_allclose(pooled, per_id.sum(1) if pooling == "sum" else per_id.mean(1), rtol=1e-6)
    numerical, labels, categoricals, probabilities = teacher.sample(4000, np.random.default_rng(1))
    assert categoricals[0].shape == (4000,) and categoricals[1].shape == (4000, 4)
    assert 0.65 < synthetic_data.exact_auc(labels, probabilities) < 0.95


def test_synthetic_multi_hot_data_is_deterministic_and_learnable(tmp_path):
    spec = datasets.load_feature_spec(dataset_type="synthetic", num_numerical_features=3,
                                        cardinalities=[40, 900, 25], hotness=[1, 5, 2])
    config = dataloader.PipelineConfig(dataset_type="synthetic", train_batch_size=64, eval_batch_size=64,
                                       rank=1, world_size=2, synthetic_train_batches=2, synthetic_eval_batches=1)
    first, second = (elements(dataloader.create_input_pipelines(spec, config).train) for _ in range(2))
    assert [tuple(i.shape) for i in first[0][2]] == [(32,), (32, 5), (32, 2)]
    for a, b in zip(first, second):
        for x, y in zip(a[2], b[2]):
            np.testing.assert_array_equal(x.numpy(), y.numpy())
    with pytest.raises(ValueError, match="--synthetic_dataset_hotness gives 2 values, but "
                                         "--synthetic_dataset_cardinalities 3 tables"):
        datasets.load_feature_spec(dataset_type="synthetic", cardinalities=[40, 900, 25], hotness=[1, 5])
    written = get_default_feature_spec(3, [40, 900, 25], str(tmp_path / "w"), hotness=[1, 5, 2])
    auc = synthetic_data.write_synthetic_dataset(written, 512, 512, seed=2)
    assert 0.65 < auc < 0.95
    stored = np.fromfile(written.file_of("train", "cat_1.bin"), np.int16).reshape(512, 5)
    assert stored.max() < 900 and (stored == 0).mean() > 0.1  # power-law skew towards small ids


# ------------------------------------------------------------------------------ MLPerf materialisation
@pytest.fixture(scope="module")
def one_hot(tmp_path_factory):
    spec = get_default_feature_spec(3, [7, 120, 5000], str(tmp_path_factory.mktemp("one_hot") / "data"))
    synthetic_data.write_synthetic_dataset(spec, 300, 100, seed=1)
    return FeatureSpec.from_yaml(os.path.join(spec.base_directory, "feature_spec.yaml"))


def test_materialisation_expands_capped_ids(one_hot, tmp_path):
    out = str(tmp_path / "multi")
    spec = materialize_multihot.materialize(one_hot.base_directory, out, hotness=[2, 1, 6], row_cap=1000,
                                            seed=9, chunk_samples=64)
    assert spec.hotness == [2, 1, 6] and spec.cardinalities == [7, 120, 1000]
    loaded = FeatureSpec.from_yaml(os.path.join(out, "feature_spec.yaml"))
    assert loaded.check_files() == {"train": 300, "test": 100}
    for mapping in ("train", "test"):
        for name, h, cap in zip(loaded.categorical_names, loaded.hotness, loaded.cardinalities):
            original = np.fromfile(one_hot.file_of(mapping, name), one_hot.dtype_of(name)).astype(np.int64)
            expanded = np.fromfile(loaded.file_of(mapping, name), loaded.dtype_of(name)).reshape(-1, h)
            np.testing.assert_array_equal(expanded[:, 0], original % cap)
            assert expanded.min() >= 0 and expanded.max() < cap
            # the same id always expands to the same ids
            for x in np.unique(expanded[:, 0])[:5]:
                assert len({tuple(row) for row in expanded[expanded[:, 0] == x]}) == 1
        np.testing.assert_array_equal(np.fromfile(loaded.file_of(mapping, "label"), np.uint8),
                                      np.fromfile(one_hot.file_of(mapping, "label"), np.uint8))
    split_binary.validate_data(loaded, ("train", "test"))
    # deterministic and independent of the chunking
    other = materialize_multihot.materialize(one_hot.base_directory, str(tmp_path / "other"), hotness=[2, 1, 6],
                                             row_cap=1000, seed=9, chunk_samples=1000)
    for name in loaded.categorical_names:
        with open(loaded.file_of("train", name), "rb") as a, open(other.file_of("train", name), "rb") as b:
            assert a.read() == b.read()
    with pytest.raises(OutputPathError, match="--dst_dataset_path"):
        materialize_multihot.materialize(one_hot.base_directory, out, hotness=[2, 1, 6], row_cap=1000)
    before = os.path.getmtime(loaded.file_of("train", "cat_2.bin"))
    materialize_multihot.materialize(one_hot.base_directory, out, hotness=[2, 1, 3], row_cap=1000, overwrite=True)
    assert FeatureSpec.from_yaml(os.path.join(out, "feature_spec.yaml")).hotness == [2, 1, 3]
    assert os.path.getmtime(loaded.file_of("train", "cat_2.bin")) >= before


def test_materialisation_cli_refusals_and_the_standin(one_hot, tmp_path, capsys):
    def run(*args):
        with pytest.raises(SystemExit) as exit:
            materialize_multihot.main([str(a) for a in args])
        return exit.value.code, capsys.readouterr().err

    code, err = run("--src_dataset_path", one_hot.base_directory, "--dst_dataset_path", tmp_path / "x")
    assert code == 2 and "--multihot_hotness gives 26 sizes, but" in err and "has 3 categorical features" in err
    code, err = run("--dst_dataset_path", tmp_path / "x")
    assert code == 2 and "give --src_dataset_path, or --standin" in err
    assert not (tmp_path / "x").exists()
    standin = materialize_multihot.write_standin(str(tmp_path / "standin"), 256, 64, seed=3)
    assert standin.hotness == list(materialize_multihot.MLPERF_HOTNESS)
    reader = split_binary.SplitBinaryReader(standin, "train", 128)
    _, _, ids = reader.read_samples(0)
    assert ids[20].shape == (128, 100) and ids[0].shape == (128, 3) and ids[2].shape == (128,)
    code, err = run("--src_dataset_path", standin.base_directory, "--dst_dataset_path", tmp_path / "y")
    assert code == 2 and "has hotness 3; the source must be one-hot" in err


# ------------------------------------------------------------------------------ bad input
def test_a_multi_hot_file_of_the_wrong_size_is_named(tmp_path):
    spec, _ = write_binary(tmp_path / "data")
    path = spec.file_of("train", "cat_1.bin")
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 2)
    with pytest.raises(FeatureSpecError) as error:
        split_binary.SplitBinaryReader(spec, "train", BATCH)
    assert str(error.value).startswith(f"{path}: size ") and "(3 ids per sample of int16)" in str(error.value)


def test_an_id_out_of_range_in_a_multi_hot_file_is_named(tmp_path):
    spec, _ = write_binary(tmp_path / "data")
    path = spec.file_of("train", "cat_2.bin")
    ids = np.fromfile(path, np.int32).reshape(-1, 4)
    ids[BATCH + 5, 2] = 40000
    ids.tofile(path)
    words = f"{path}: feature 'cat_2.bin' (mapping 'train') has id 40000 at sample {BATCH + 5} (id 3 of 4), outside"
    with pytest.raises(DataError, match=words.replace("(", r"\(").replace(")", r"\)")):
        elements(split_binary.SplitBinaryReader(spec, "train", BATCH).dataset())
    with pytest.raises(DataError, match="has id 40000 at sample"):
        split_binary.validate_data(spec, ("train",))


def _rewrite_ragged(path, index, values, lengths):
    records = list(tf.data.TFRecordDataset(path).as_numpy_iterator())
    example = tf.train.Example.FromString(records[index])
    for key, array in (("data_values", values), ("data_row_lengths", lengths)):
        if array is None:
            del example.features.feature[key]
        else:
            example.features.feature[key].bytes_list.value[0] = tf.io.serialize_tensor(array).numpy()
    records[index] = example.SerializeToString()
    with tf.io.TFRecordWriter(path) as writer:
        for record in records:
            writer.write(record)


def _bad_lengths(length, first):
    lengths = np.full(BATCH, 1, np.int32)
    lengths[0] = first
    return np.zeros(int(lengths.sum()), np.int32), lengths


RAGGED_DAMAGE = {
    "row longer than hotness": (lambda p: _rewrite_ragged(p, 1, *_bad_lengths(BATCH, 4)),
                                "batch 1 gives sample 0 4 ids; a sample holds 0 to the feature's hotness 3 ids"),
    "negative row length": (lambda p: _rewrite_ragged(p, 0, *_bad_lengths(BATCH, -1)), "gives sample 0 -1 ids"),
    "lengths not summing": (lambda p: _rewrite_ragged(p, 2, np.zeros(3, np.int32), np.ones(BATCH, np.int32)),
                            f"batch 2's row lengths sum to {BATCH}, but it holds 3 ids"),
    "short record": (lambda p: _rewrite_ragged(p, 0, np.zeros(3, np.int32), np.ones(3, np.int32)),
                     "batch 0 has 3 row lengths, not a prebatch of 32 samples"),
    "missing row lengths": (lambda p: _rewrite_ragged(p, 0, np.zeros(3, np.int32), None),
                            "record 0 has no single bytes value 'data_row_lengths'"),
    "corrupt record": (lambda p: open(p, "r+b").write(b"\xff" * 30), "corrupt or truncated TFRecord file"),
    "truncated file": (lambda p: os.truncate(p, os.path.getsize(p) - 5), "corrupt or truncated TFRecord file"),
}


@pytest.mark.parametrize("case", sorted(RAGGED_DAMAGE))
def test_bad_ragged_records_are_one_error_naming_the_file(tmp_path, case):
    damage, words = RAGGED_DAMAGE[case]
    spec, _ = write_ragged(tmp_path / "data")
    path = os.path.join(spec.base_directory, "train", "categorical_1", "data_0.tfrecords")
    damage(path)
    with pytest.raises(DataError) as error:
        elements(split_tfrecords.SplitTFRecordsReader(spec, "train", BATCH).dataset())
    assert str(error.value).startswith(f"{path}: ") and words in str(error.value), str(error.value)


def test_an_id_out_of_range_in_a_ragged_record_is_named(tmp_path):
    spec, written = write_ragged(tmp_path / "data")
    path = os.path.join(spec.base_directory, "train", "categorical_2", "data_0.tfrecords")
    rows = written["train"][0][2][2]
    values = rows.values.astype(np.int32)
    values[-1] = -2
    _rewrite_ragged(path, 0, values, rows.row_lengths.astype(np.int32))
    last = int(np.flatnonzero(rows.row_lengths)[-1])
    with pytest.raises(DataError, match=f"has id -2 at sample {last} \\(id {rows.row_lengths[last]} of "):
        elements(split_tfrecords.SplitTFRecordsReader(spec, "train", BATCH).dataset())


def test_a_folder_disagreeing_with_the_spec_hotness_is_refused(tmp_path):
    spec, _ = write_ragged(tmp_path / "data")
    spec.feature_spec["cat_1.bin"]["hotness"] = 1
    path = os.path.join(spec.base_directory, "train", "categorical_1", "format.json")
    with pytest.raises(DataError, match=f"{path}: a multi-hot \\(ragged\\) folder, but feature 'cat_1.bin' has "
                                        f"hotness 1 in the feature spec"):
        split_tfrecords.SplitTFRecordsReader(spec, "train", BATCH)
    spec.feature_spec["cat_1.bin"]["hotness"] = 3
    spec.feature_spec["cat_0.bin"]["hotness"] = 2
    path = os.path.join(spec.base_directory, "train", "categorical_0", "format.json")
    with pytest.raises(DataError, match=f"{path}: one id per sample \\(multihot false\\), but feature 'cat_0.bin' "
                                        f"has hotness 2"):
        split_tfrecords.SplitTFRecordsReader(spec, "train", BATCH)


def test_writers_refuse_ids_of_the_wrong_shape(tmp_path):
    rng = np.random.default_rng(0)
    numerical, labels, ids = random_batch(rng)
    with pytest.raises(ValueError, match=r"feature 'cat_2.bin' \(hotness 4\) needs ids of shape \[32, 4\], "
                                         r"got \[32, 3\]"):
        with split_binary.SplitBinaryWriter(multi_hot_spec(tmp_path / "b")) as writer:
            writer.append("train", numerical, labels, [ids[0], ids[1], ids[2][:, :3]])
    long_rows = RaggedIds(np.zeros(5 + BATCH - 1, np.int64), np.array([5] + [1] * (BATCH - 1)))
    with pytest.raises(ValueError, match="feature 'cat_1.bin' has a sample of 5 ids; its hotness 3 is the most"):
        with split_tfrecords.SplitTFRecordsWriter(multi_hot_spec(tmp_path / "s"), str(tmp_path / "r"), BATCH) as w:
            w.append("train", numerical, labels, [ids[0], long_rows, ids[2]])
    assert sorted(os.listdir(tmp_path)) == []


@pytest.mark.parametrize("key, value, words", [
    ("hotness", "3", "has hotness '3'; it must be a positive integer"),
    ("hotness", 2.5, "has hotness 2.5; it must be a positive integer"),
    ("hotnes", 3, "has unknown key 'hotnes' (did you mean 'hotness'?)"),
    ("pooling", "Mean", "has pooling 'Mean'; it must be one of ['sum', 'mean']"),
    ("poling", "sum", "has unknown key 'poling' (did you mean 'pooling'?)")])
def test_hotness_and_pooling_typos_are_named(tmp_path, key, value, words):
    spec = multi_hot_spec(tmp_path)
    spec.feature_spec["cat_1.bin"][key] = value
    path = spec.to_yaml()
    with pytest.raises(FeatureSpecError) as error:
        FeatureSpec.from_yaml(path).check_feature_spec()
    assert str(error.value) .startswith(f"{path}: categorical feature 'cat_1.bin' {words}"), str(error.value)


def test_a_csv_spec_cannot_be_multi_hot(tmp_path):
    spec = FeatureSpec.get_default_feature_spec(1, [10, 20], str(tmp_path))
    for chunks in spec.source_spec.values():
        for chunk in chunks:
            chunk["type"] = CSV
    spec.feature_spec["cat_1.bin"]["hotness"] = 4
    with pytest.raises(FeatureSpecError, match="categorical feature 'cat_1.bin' has hotness 4, but a CSV dataset "
                                               r"\(one column per feature\) holds one id per sample and feature"):
        spec.check_feature_spec(chunk_type=CSV)


def test_validate_data_covers_split_tfrecords_multi_hot(tmp_path):
    spec, _ = write_ragged(tmp_path / "data")
    path = os.path.join(spec.base_directory, "test", "categorical_1", "data_0.tfrecords")
    _rewrite_ragged(path, 1, *_bad_lengths(BATCH, 7))
    config = dataloader.PipelineConfig(dataset_type="split_tfrecords", train_batch_size=BATCH,
                                       eval_batch_size=BATCH, validate_data=True)
    with pytest.raises(DataError, match=f"{path}: batch 1 gives sample 0 7 ids"):
        dataloader.create_input_pipelines(spec, config)


def test_tensor_proto_of_ragged_values_is_what_v5_parses(ragged):
    spec, _ = ragged
    path = os.path.join(spec.base_directory, "test", "categorical_2", "data_0.tfrecords")
    record = next(iter(tf.data.TFRecordDataset(path).as_numpy_iterator()))
    feature = tf.train.Example.FromString(record).features.feature["data_values"].bytes_list.value[0]
    assert tensor_pb2.TensorProto.FromString(feature).dtype == tf.int32.as_datatype_enum
