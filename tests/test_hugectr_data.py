"""HugeCTR raw files and the SOK benchmark's split layout: written here from known values, read as
those values, converted to split-binary and back, trained on (one process and `horovodrun -np 2`) to
the same weights as the converted split-binary, and one clear error naming the file for bad input."""
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from recsys.data import data_errors
import dataloader
import datasets
from recsys.data import split_binary
from recsys.data import pipeline_errors
from recsys.data.batch import CATEGORICAL_KEY, NUMERICAL_KEY, TableReads
from dataloading import transcribe
from recsys.data.feature_spec import FeatureSpecError, get_categorical_feature_type
from multiproc import assert_one_error, assert_ok, run_horovod, snapshot
from test_dataloading import assert_same_tree, transcribe_here
from test_flags import assert_refused, run_in_process
from test_main import SMALL_MODEL, checkpoint_arrays, final_record, main_py

CARDINALITIES = [3, 200, 40000] + [7] * 23  # 26 features: HugeCTR's 160-byte records
SAMPLES = {"train": 256, "test": 160}
BATCH = 64
CONVERT_BATCH = 32  # divides both sample counts: the conversion copies every sample


def known_records(samples, seed):
    """[samples, 40] int32: label 0/1, 13 dense integers (with the clamped values -4..-1), ids."""
    rng = np.random.default_rng(seed)
    dense = rng.integers(-4, 70000, (samples, 13))
    dense[:8, :] = np.arange(-4, 4)[:, None]
    return np.column_stack([rng.integers(0, 2, samples), dense,
                            *[rng.integers(0, c, samples) for c in CARDINALITIES]]).astype("<i4")


def expected_dense(raw):
    """The project's rule written out: ln(max(x, -2) + 3) in float64, then float32, then float16."""
    return np.log(np.maximum(raw.astype(np.float64), -2.0) + 3.0).astype(np.float32).astype(np.float16)


def write_sok_metadata(folder, **overrides):
    metadata = {"vocab_sizes": CARDINALITIES, "label_raw_type": "int32", "dense_raw_type": "int32",
                "category_raw_type": "int32", "dense_log": True, **overrides}
    with open(os.path.join(folder, "metadata.json"), "w") as f:
        json.dump(metadata, f)


def write_layouts(root, records):
    """The records as HugeCTR raw, SOK split (category.bin) and SOK per-feature folders."""
    paths = {name: os.path.join(root, name) for name in ("raw", "sok", "sok_per_feature")}
    for name in paths.values():
        os.makedirs(name)
    for mapping, values in records.items():
        values.tofile(os.path.join(paths["raw"], f"{mapping}_data.bin"))
        sok = os.path.join(paths["sok"], mapping)
        os.makedirs(sok)
        values[:, 0].tofile(os.path.join(sok, "label.bin"))
        np.ascontiguousarray(values[:, 1:14]).tofile(os.path.join(sok, "dense.bin"))
        np.ascontiguousarray(values[:, 14:]).tofile(os.path.join(sok, "category.bin"))
        write_sok_metadata(sok)
        per_feature = os.path.join(paths["sok_per_feature"], mapping)
        os.makedirs(per_feature)
        values[:, 0].astype(bool).tofile(os.path.join(per_feature, "label.bin"))
        expected_dense(values[:, 1:14]).tofile(os.path.join(per_feature, "dense.bin"))
        for i, cardinality in enumerate(CARDINALITIES):
            values[:, 14 + i].astype(get_categorical_feature_type(cardinality)).tofile(
                os.path.join(per_feature, f"category_{i}.bin"))
        with open(os.path.join(per_feature, "metadata.json"), "w") as f:
            json.dump({"vocab_sizes": CARDINALITIES}, f)
    return paths


def known_layouts(tmp_path_factory, name):
    """(records per mapping, {layout: folder}): the known records of SAMPLES written in every layout."""
    root = str(tmp_path_factory.mktemp(name))
    records = {mapping: known_records(count, seed) for seed, (mapping, count) in enumerate(SAMPLES.items())}
    return records, write_layouts(root, records)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Known records in every layout, and the HugeCTR raw folder converted to split-binary."""
    records, paths = known_layouts(tmp_path_factory, "hugectr")
    root = os.path.dirname(paths["raw"])
    paths["binary"] = os.path.join(root, "binary")
    transcribe.transcribe("hugectr_raw", paths["raw"], paths["binary"], "tf_raw", src_batch_size=CONVERT_BATCH,
                          hugectr_cardinalities=CARDINALITIES)
    return records, paths


SPEC_ARGS = {"raw": ("hugectr_raw", {"hugectr_cardinalities": CARDINALITIES}), "sok": ("sok_split", {}),
             "sok_per_feature": ("sok_split", {}), "binary": ("tf_raw", {})}


def load(paths, layout):
    dataset_type, extra = SPEC_ARGS[layout]
    return datasets.load_feature_spec(dataset_type=dataset_type, dataset_path=paths[layout], **extra)


def elements(dataset):
    with pipeline_errors.surface_data_errors():
        return [(labels.numpy(), features[NUMERICAL_KEY].numpy(), [ids.numpy() for ids in features[CATEGORICAL_KEY]])
                for features, labels in dataset]


def pipelines(paths, layout, **config):
    dataset_type = SPEC_ARGS[layout][0]
    return dataloader.create_input_pipelines(load(paths, layout), dataloader.PipelineConfig(
        dataset_type=dataset_type, train_batch_size=BATCH, eval_batch_size=BATCH, **config))


@pytest.mark.parametrize("world_size, rank, reads", [
    (1, 0, None), (2, 1, None), (2, 0, TableReads((0, 2, 25), global_batch=True)),
    (4, 3, TableReads((1,), global_batch=False)), (2, 1, TableReads((), global_batch=True))])
def test_every_layout_serves_the_known_values_as_the_converted_split_binary(data, world_size, rank, reads):
    records, paths = data
    config = dict(world_size=world_size, rank=rank, reads=reads, validate_data=True)
    batches = {layout: pipelines(paths, layout, **config) for layout in SPEC_ARGS}
    tables = list(range(26)) if reads is None else list(reads.tables)
    for mapping in ("train", "test"):
        got = {layout: elements(getattr(p, mapping)) for layout, p in batches.items()}
        values = records[mapping]
        assert len(got["raw"]) == {"train": 4, "test": 3}[mapping]  # test: the last batch is partial
        for index, (labels, dense, ids) in enumerate(got["raw"]):
            start = index * BATCH
            size = min(BATCH, len(values) - start)
            lo, hi = start + rank * size // world_size, start + (rank + 1) * size // world_size
            id_lo, id_hi = (start, start + size) if reads is not None and reads.global_batch else (lo, hi)
            np.testing.assert_array_equal(labels[:, 0], values[lo:hi, 0])
            np.testing.assert_array_equal(dense, expected_dense(values[lo:hi, 1:14]).astype(np.float32))
            assert len(ids) == len(tables)
            for table, column in zip(tables, ids):
                np.testing.assert_array_equal(column, values[id_lo:id_hi, 14 + table])
        for layout in ("sok", "sok_per_feature", "binary"):
            assert len(got[layout]) == len(got["raw"])
            for a, b in zip(got[layout], got["raw"]):
                np.testing.assert_array_equal(a[0], b[0])
                np.testing.assert_array_equal(a[1], b[1])
                for x, y in zip(a[2], b[2], strict=True):
                    np.testing.assert_array_equal(x, y)


def test_conversions_agree_and_hugectr_raw_round_trips(data, tmp_path):
    records, paths = data
    for layout in ("sok", "sok_per_feature"):  # 48 divides neither count: the last partial batches arrive too
        transcribe.transcribe("sok_split", paths[layout], str(tmp_path / layout), "tf_raw", src_batch_size=48)
        assert_same_tree(paths["binary"], str(tmp_path / layout))
    spec = load(paths, "binary")
    assert spec.cardinalities == CARDINALITIES and spec.metadata == {}
    back = str(tmp_path / "raw_again")
    written = transcribe.transcribe("tf_raw", paths["binary"], back, "hugectr_raw", src_batch_size=CONVERT_BATCH)
    assert written == {"train": 8, "test": 5}
    with open(os.path.join(back, "metadata.json")) as f:
        assert json.load(f) == {"vocab_sizes": CARDINALITIES, "label_raw_type": "float32",
                                "dense_raw_type": "float32", "category_raw_type": "int32", "dense_log": False}
    for mapping, values in records.items():
        stored = np.fromfile(os.path.join(back, f"{mapping}_data.bin"), "<i4").reshape(-1, 40)
        np.testing.assert_array_equal(stored[:, 14:], values[:, 14:])
        np.testing.assert_array_equal(stored[:, 0].view("<f4"), values[:, 0])
        np.testing.assert_array_equal(stored[:, 1:14].view("<f4"), expected_dense(values[:, 1:14]))
    paths_again = {"raw": back, "binary": paths["binary"]}
    again, binary = (pipelines(paths_again, layout, world_size=2, rank=1) for layout in ("raw", "binary"))
    for mapping in ("train", "test"):
        for a, b in zip(elements(getattr(again, mapping)), elements(getattr(binary, mapping)), strict=True):
            for x, y in zip([a[0], a[1], *a[2]], [b[0], b[1], *b[2]], strict=True):
                np.testing.assert_array_equal(x, y)


def test_transcribe_command_line_reads_hugectr_raw_flags(data, tmp_path, capsys):
    _, paths = data
    raw = known_records(CONVERT_BATCH, 9)
    raw[:, 1:14] %= 60000  # within float16 without the log
    os.makedirs(tmp_path / "raw")
    for mapping in SAMPLES:
        raw.tofile(tmp_path / "raw" / f"{mapping}_data.bin")
    result = transcribe_here(capsys, "--src_dataset_type", "hugectr_raw", "--src_dataset_path", tmp_path / "raw",
                             "--hugectr_cardinalities", ",".join(map(str, CARDINALITIES)), "--no-hugectr_dense_log",
                             "--src_batch_size", CONVERT_BATCH, "--dst_dataset_type", "tf_raw",
                             "--dst_dataset_path", tmp_path / "out", "--train_only")
    assert result.returncode == 0, result.stderr
    reader = split_binary.SplitBinaryReader(load({"binary": str(tmp_path / "out")}, "binary"), "train", CONVERT_BATCH)
    numerical, _, _ = reader.read_samples(0)
    np.testing.assert_array_equal(numerical, raw[:, 1:14].astype(np.float32).astype(np.float16))  # no log
    before = snapshot(tmp_path)
    result = transcribe_here(capsys, "--src_dataset_type", "hugectr_raw", "--src_dataset_path", paths["raw"],
                             "--dst_dataset_path", tmp_path / "none")
    assert result.returncode == 2 and "needs its cardinalities" in result.stderr
    assert snapshot(tmp_path) == before


# ---------------------------------------------------------------------------------------- training
TRAIN = SMALL_MODEL + ["--batch_size", str(BATCH), "--valid_batch_size", str(BATCH), "--learning_rate", "0.1",
                       "--warmup_steps", "2", "--seed", "7", "--deterministic"]
LAYOUT_FLAGS = {"raw": ["--dataset_type", "hugectr_raw", "--hugectr_cardinalities", ",".join(map(str, CARDINALITIES))],
                "sok": ["--dataset_type", "sok_split"], "binary": ["--dataset_type", "tf_raw"]}


def layout_args(paths, layout):
    return LAYOUT_FLAGS[layout] + ["--dataset_path", paths[layout]]


def assert_same_weights(a, b):
    first, second = checkpoint_arrays(a), checkpoint_arrays(b)
    assert first.keys() == second.keys() and len(first) > 26
    for name, array in first.items():
        np.testing.assert_array_equal(array, second[name], err_msg=name)


def test_training_eval_and_inference_give_the_same_model_from_every_layout(data, tmp_path):
    _, paths = data
    for layout in LAYOUT_FLAGS:
        assert_ok(main_py(TRAIN + layout_args(paths, layout) + [
            "--save_checkpoint_path", str(tmp_path / layout), "--log_path", str(tmp_path / f"{layout}.json")]))
    for layout in ("raw", "sok"):  # SOK's per-feature variant is split-binary: same batches above
        assert_same_weights(tmp_path / layout, tmp_path / "binary")
        assert final_record(tmp_path / f"{layout}.json")["auc"] == final_record(tmp_path / "binary.json")["auc"]
    restore = ["--restore_checkpoint_path", str(tmp_path / "raw")]
    assert_ok(main_py(TRAIN + layout_args(paths, "raw") + restore + ["--mode", "eval",
                                                                      "--log_path", str(tmp_path / "eval.json")]))
    assert final_record(tmp_path / "eval.json")["auc"] == final_record(tmp_path / "binary.json")["auc"]
    result = main_py(TRAIN + layout_args(paths, "sok") + restore + [
        "--mode", "inference", "--valid_batch_size", "8", "--max_steps", "15", "--log_path", str(tmp_path / "i.json")])
    assert_ok(result)
    assert final_record(tmp_path / "i.json")["measured_batches"] == 5


def test_two_ranks_train_the_same_model_from_hugectr_raw_and_split_binary(data, tmp_path):
    _, paths = data
    for layout in ("raw", "binary"):
        assert_ok(run_horovod(["main.py", *TRAIN, *layout_args(paths, layout), "--save_checkpoint_path",
                               str(tmp_path / layout), "--log_path", str(tmp_path / f"{layout}.json")], timeout=600))
    assert_same_weights(tmp_path / "raw", tmp_path / "binary")


# ------------------------------------------------------------------------------------------ bad input
def copy_layouts(tmp_path, records=None):
    records = records or {mapping: known_records(count, 5) for mapping, count in SAMPLES.items()}
    return write_layouts(str(tmp_path), records)


def refuse(paths, layout, message_parts, validate=True):
    """Loading and reading the layout (every value checked up front) raises ValueError naming the file."""
    with pytest.raises((ValueError, FeatureSpecError)) as error:
        pipelines(paths, layout, validate_data=validate)
    for part in message_parts:
        assert part in str(error.value), str(error.value)


def test_a_size_that_is_not_a_whole_number_of_records_names_the_file(tmp_path):
    paths = copy_layouts(tmp_path)
    path = os.path.join(paths["raw"], "test_data.bin")
    with open(path, "ab") as f:
        f.write(b"\0" * 100)
    refuse(paths, "raw", [path, "is not a whole number of 160-byte records"])
    path = os.path.join(paths["sok"], "train", "dense.bin")
    os.truncate(path, os.path.getsize(path) - 4)
    refuse(paths, "sok", [path, "is not a whole number of 52-byte records"])


def test_ids_beyond_the_vocab_sizes_name_the_file_feature_and_sample(tmp_path):
    records = {mapping: known_records(count, 5) for mapping, count in SAMPLES.items()}
    records["train"][70, 14 + 2] = 40000
    paths = copy_layouts(tmp_path, records)
    for layout, name in (("raw", "train_data.bin"), ("sok", os.path.join("train", "category.bin"))):
        refuse(paths, layout, [os.path.join(paths[layout], name), "feature 'cat_2.bin'", "id 40000 at sample 70",
                               "outside [0, 40000)"])
        with pytest.raises(data_errors.DataError, match="id 40000 at sample 70"):  # checked as read, too
            elements(pipelines(paths, layout).train)
    records["train"][70, 14 + 2] = 0
    records["test"][3, 0] = 2
    paths = copy_layouts(tmp_path / "label", records)
    refuse(paths, "sok", [os.path.join(paths["sok"], "test", "label.bin"), "is 2 at sample 3",
                          "a label must be 0 or 1"])


@pytest.mark.parametrize("change, words", [
    (lambda sok: os.remove(os.path.join(sok, "train", "metadata.json")), ["train/metadata.json: metadata.json not found"]),
    (lambda sok: os.remove(os.path.join(sok, "test", "dense.bin")), ["test/dense.bin: the test data file not found"]),
    (lambda sok: write_sok_metadata(os.path.join(sok, "train"), vocab_sizes=CARDINALITIES[:25]),
     ["test/metadata.json: disagrees with", "train/metadata.json"]),
    (lambda sok: [write_sok_metadata(os.path.join(sok, m), vocab_sizes=CARDINALITIES[:25]) for m in ("train", "test")],
     ["train/category.bin", "not a whole number of 100-byte records (25 ids, one per vocab size in"]),
    (lambda sok: [write_sok_metadata(os.path.join(sok, m), dense_raw_type="float16") for m in ("train", "test")],
     ["train/metadata.json: dense_raw_type 'float16' cannot be read; it must be one of ['int32', 'float32']"]),
    (lambda sok: [write_sok_metadata(os.path.join(sok, m), category_raw_type="float32") for m in ("train", "test")],
     ["train/metadata.json: category_raw_type 'float32' cannot be read"]),
    (lambda sok: [write_sok_metadata(os.path.join(sok, m), vocab_sizes=[5, 0]) for m in ("train", "test")],
     ["train/metadata.json: vocab_sizes must be a non-empty list of integers"]),
    (lambda sok: os.truncate(os.path.join(sok, "train", "label.bin"), 4 * 200),
     ["train/label.bin: the train files hold different numbers of samples: label.bin=200, dense.bin=256, "
      "category.bin=256"]),
    (lambda sok: open(os.path.join(sok, "train", "category_0.bin"), "wb").close(),
     ["holds either category.bin or category_0.bin", "found both"]),
], ids=["no metadata", "missing file", "test metadata disagrees", "vocab count", "dense type", "id type",
        "bad vocab size", "sample counts", "both variants"])
def test_sok_metadata_that_disagrees_with_the_files_names_the_file(tmp_path, change, words):
    paths = copy_layouts(tmp_path)
    change(paths["sok"])
    refuse(paths, "sok", [paths["sok"]] + words)


def test_sok_per_feature_files_are_checked_as_split_binary(tmp_path):
    paths = copy_layouts(tmp_path)
    path = os.path.join(paths["sok_per_feature"], "test", "category_3.bin")
    os.remove(path)
    refuse(paths, "sok_per_feature", [path, "not found"])


def test_hugectr_raw_needs_its_cardinalities_once(tmp_path):
    paths = copy_layouts(tmp_path)
    with pytest.raises(ValueError, match="needs its cardinalities .*--hugectr_cardinalities, or a metadata.json"):
        datasets.load_feature_spec(dataset_type="hugectr_raw", dataset_path=paths["raw"])
    write_sok_metadata(paths["raw"])
    assert load(paths, "sok").cardinalities == datasets.load_feature_spec(
        dataset_type="hugectr_raw", dataset_path=paths["raw"]).cardinalities
    load(paths, "raw")  # the same cardinalities as metadata.json
    with pytest.raises(ValueError, match=r"metadata.json: vocab_sizes \[3, 200, .*\] disagree with --hugectr_car"):
        datasets.load_feature_spec(dataset_type="hugectr_raw", dataset_path=paths["raw"],
                                     hugectr_cardinalities=[3] * 26)
    with pytest.raises(ValueError, match="metadata.json: dense_log true disagrees with --nohugectr_dense_log"):
        datasets.load_feature_spec(dataset_type="hugectr_raw", dataset_path=paths["raw"], hugectr_dense_log=False)


@pytest.mark.parametrize("args, words", [
    (["--dataset_type", "hugectr_raw"], ["needs its cardinalities (slot_size_array): --hugectr_cardinalities"]),
    (["--dataset_type", "hugectr_raw", "--hugectr_cardinalities", "3,x"],
     ["--hugectr_cardinalities must be a comma-separated list of integers, got 3,x"]),
    (["--dataset_type", "sok_split", "--hugectr_cardinalities", "3,4"],
     ["--hugectr_cardinalities describes --dataset_type hugectr_raw data, not sok_split"]),
    (["--dataset_type", "tf_raw", "--nohugectr_dense_log"],
     ["--hugectr_dense_log describes --dataset_type hugectr_raw data, not tf_raw"]),
    (["--dataset_type", "sok_split"], ["train/metadata.json: metadata.json not found"]),
], ids=["no cardinalities", "bad cardinalities", "cardinalities for sok", "dense_log for tf_raw", "no metadata"])
def test_main_refuses_bad_hugectr_and_sok_input_in_one_line(tmp_path, capsys, args, words):
    paths = copy_layouts(tmp_path / "data")
    os.remove(os.path.join(paths["sok"], "train", "metadata.json"))
    path = paths["sok"] if args[1] == "sok_split" else paths["raw"]
    before = snapshot(tmp_path)
    code, stderr = run_in_process(TRAIN + args + ["--dataset_path", path, "--log_path", str(tmp_path / "log.json")],
                                  capsys)
    assert_refused(code, stderr, words[0], tmp_path, before)


def test_main_py_exits_non_zero_naming_a_truncated_raw_file(tmp_path):
    paths = copy_layouts(tmp_path / "data")
    path = os.path.join(paths["raw"], "train_data.bin")
    os.truncate(path, 160 * 100 + 8)
    before = snapshot(tmp_path)
    result = main_py(TRAIN + layout_args(paths, "raw") + ["--log_path", str(tmp_path / "log.json")])
    assert_one_error(result, path, "is not a whole number of 160-byte records", code=2)
    assert snapshot(tmp_path) == before


def test_the_dense_rule_is_the_preprocessings():
    from recsys.data.numerical_rule import transform_numericals

    raw = np.array([[-7, -3, -2, -1, 0, 1, 2, 1000, 2 ** 31 - 1]], np.int32)
    np.testing.assert_array_equal(transform_numericals(raw), expected_dense(raw))
    assert transform_numericals(raw)[0, :3].tolist() == [0.0, 0.0, 0.0]
    assert transform_numericals(np.array([70000.0]), take_log=False)[0] == np.inf  # the caller's check refuses it
    assert tf.as_dtype(transform_numericals(raw).dtype) == tf.float16
