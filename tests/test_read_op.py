"""The split-binary pipeline's compiled batch read (`ReadFileRows`, `SplitBinaryReader(read_op=True)`)
serves exactly the elements of the Python read, for every dtype, rank slice and the partial last
batch, and stops at a bad value or a short file with the very same DataError."""
import os

import numpy as np
import pytest
import tensorflow as tf

import datasets
from recsys.data import split_binary
from recsys.data import synthetic_data
from recsys.data.batch import TableReads
from recsys.runtime.custom_ops import op_package
from recsys.data.feature_spec import get_default_feature_spec
from test_data_values import BAD_VALUES, consume, corrupt

pytestmark = pytest.mark.skipif(not op_package.is_built(), reason="the op library is not built (make -C "
                                "tensorflow-dot-based-interact cpu)")

NUM_NUMERICAL = 3
CARDINALITIES = [100, 5000, 7, 70000, 300]  # int8, int16, int8, int32 and int16 files
HOTNESS = [1, 1, 1, 1, 3]  # the last feature is multi-hot: [samples, 3] ids
TRAIN, TEST = 500, 203
BATCH = 128


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    directory = tmp_path_factory.mktemp("read_op")
    spec = get_default_feature_spec(NUM_NUMERICAL, CARDINALITIES, str(directory), hotness=HOTNESS)
    synthetic_data.write_synthetic_dataset(spec, TRAIN, TEST, seed=3)
    return datasets.load_feature_spec(dataset_path=str(directory))


def elements(spec, read_op, mapping="train", **options):
    reader = split_binary.SplitBinaryReader(spec, mapping, BATCH, read_op=read_op, **options)
    return reader.dataset().element_spec, list(reader.dataset())


@pytest.mark.parametrize("options", [
    dict(),
    dict(numerical_dtype=tf.bfloat16),
    dict(numerical_dtype=tf.float16, rank=1, world_size=3),
    dict(rank=2, world_size=3, reads=TableReads((1, 3, 4), global_batch=True)),
    dict(drop_remainder=False, rank=1, world_size=2),
], ids=["one rank", "bf16 numericals", "f16, rank 1 of 3", "model-parallel rows", "partial last batch"])
def test_the_op_serves_the_python_reads_elements(spec, options):
    mapping = "test" if not options.get("drop_remainder", True) else "train"
    op_spec, op_elements = elements(spec, True, mapping, **options)
    python_spec, python_elements = elements(spec, False, mapping, **options)
    assert op_spec == python_spec
    assert len(op_elements) == len(python_elements) > 0
    for (op_features, op_labels), (py_features, py_labels) in zip(op_elements, python_elements):
        tf.nest.map_structure(lambda a, b: np.testing.assert_array_equal(a.numpy(), b.numpy()),
                              (op_features, op_labels), (py_features, py_labels))


@pytest.mark.parametrize("case", sorted(BAD_VALUES))
def test_a_bad_value_stops_both_reads_with_the_same_error(tmp_path, case):
    spec = get_default_feature_spec(2, [100, 5000, 7], str(tmp_path))
    synthetic_data.write_synthetic_dataset(spec, 500, 200, seed=0)
    mapping, name, dtype, width, sample, column, value, _ = BAD_VALUES[case]
    corrupt(tmp_path / mapping / name, dtype, width, sample, value, column)
    spec = datasets.load_feature_spec(dataset_path=str(tmp_path))
    outcomes = [consume(split_binary.SplitBinaryReader(spec, mapping, BATCH, read_op=read_op,
                                                   drop_remainder=mapping == "train").dataset())
                for read_op in (True, False)]
    assert outcomes[0] == outcomes[1] and outcomes[0][1] is not None


def test_a_file_cut_short_after_opening_is_named_with_the_byte_it_ends_at(spec, tmp_path):
    readers = {read_op: split_binary.SplitBinaryReader(spec, "train", BATCH, read_op=read_op) for read_op in (True, False)}
    path = spec.file_of("train", spec.categorical_names[3])
    original = open(path, "rb").read()
    try:
        with open(path, "r+b") as handle:
            handle.truncate(300 * 4 + 2)  # into sample 300 (batch 2) of an int32 file
        outcomes = [consume(readers[read_op].dataset()) for read_op in (True, False)]
    finally:
        with open(path, "wb") as handle:
            handle.write(original)
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][0] == 2 and outcomes[0][1] == (f"{path}: unexpected end of file at byte 1202; the file "
                                                      f"was truncated while reading")


def test_a_bad_id_of_a_multi_hot_sample_is_named_alike(spec, tmp_path):
    copy = get_default_feature_spec(NUM_NUMERICAL, CARDINALITIES, str(tmp_path), hotness=HOTNESS)
    synthetic_data.write_synthetic_dataset(copy, TRAIN, TEST, seed=3)
    corrupt(tmp_path / "train" / "cat_4.bin", np.int16, 3, 260, 300, column=2)
    copy = datasets.load_feature_spec(dataset_path=str(tmp_path))
    outcomes = [consume(split_binary.SplitBinaryReader(copy, "train", BATCH, read_op=read_op).dataset())
                for read_op in (True, False)]
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][0] == 2 and "has id 300 at sample 260 (id 3 of 3), outside [0, 300)" in outcomes[0][1]


def test_unchecked_reads_let_bad_values_through_alike(spec, tmp_path):
    copy = get_default_feature_spec(NUM_NUMERICAL, CARDINALITIES, str(tmp_path), hotness=HOTNESS)
    synthetic_data.write_synthetic_dataset(copy, TRAIN, TEST, seed=3)
    corrupt(tmp_path / "train" / "cat_3.bin", np.int32, 1, 7, 123456)
    copy = datasets.load_feature_spec(dataset_path=str(tmp_path))
    read = [elements(copy, read_op, check_values=False)[1][0][0]["categorical_features"][3].numpy()
            for read_op in (True, False)]
    assert read[0][7] == read[1][7] == 123456


def test_each_reader_words_its_own_errors(spec, tmp_path):
    # Two readers of different datasets fail in one process: each error names its own file.
    other = get_default_feature_spec(2, [100, 5000, 7], str(tmp_path))
    synthetic_data.write_synthetic_dataset(other, 500, 200, seed=0)
    corrupt(tmp_path / "train" / "cat_2.bin", np.int8, 1, 10, 9)
    other = datasets.load_feature_spec(dataset_path=str(tmp_path))
    good = split_binary.SplitBinaryReader(spec, "train", BATCH, read_op=True).dataset()
    bad = split_binary.SplitBinaryReader(other, "train", BATCH, read_op=True).dataset()
    assert consume(good) == (TRAIN // BATCH, None)
    _, message = consume(bad)
    assert message.startswith(os.path.join(str(tmp_path), "train", "cat_2.bin"))


@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16])
def test_every_finite_half_converts_as_tensorflow_casts_it(tmp_path, dtype):
    # Subnormals, signed zeros and the largest halves included; the vector path and its scalar tail.
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    halves = bits[(bits & 0x7FFF) < 0x7C00].view(np.float16)  # 63488 finite values
    spec = get_default_feature_spec(1, [10], str(tmp_path))
    for mapping in ("train", "test"):
        os.makedirs(tmp_path / mapping, exist_ok=True)
        halves.reshape(-1, 1).tofile(spec.file_of(mapping, spec.numerical_names[0]))
        np.zeros(halves.size, np.uint8).tofile(spec.file_of(mapping, spec.label_name))
        np.zeros(halves.size, np.int8).tofile(spec.file_of(mapping, spec.categorical_names[0]))
    spec.to_yaml(str(tmp_path / "feature_spec.yaml"))
    spec = datasets.load_feature_spec(dataset_path=str(tmp_path))
    reader = split_binary.SplitBinaryReader(spec, "train", 124, numerical_dtype=dtype, read_op=True)  # 4-value tails
    served = np.concatenate([features["numerical_features"].numpy() for features, _ in reader.dataset()])
    expected = tf.cast(tf.constant(halves.reshape(-1, 1)), dtype).numpy()
    np.testing.assert_array_equal(served.view(np.uint16 if dtype != tf.float32 else np.uint32),
                                  expected.view(np.uint16 if dtype != tf.float32 else np.uint32))
