"""TorchRec's day files (`day_<i>_{labels,dense,sparse}.npy`) and MLPerf's multi-hot archives
(`day_<i>_sparse_multi_hot.npz`), written here with NumPy in exactly that layout: served as the same
batches as split-binary holding the same samples (ids modulo TorchRec's table sizes), converted to
it, trained on (one process and `horovodrun -np 2`) to the same weights, and one clear error naming
the file for bad input."""
import math
import os

import numpy as np
import pytest

from recsys.data import data_errors
import dataloader
import datasets
from recsys.data import split_binary
from recsys.data import pipeline_errors
from recsys.data import torchrec_data
from recsys.data.batch import CATEGORICAL_KEY, NUMERICAL_KEY, TableReads
from dataloading import transcribe
from recsys.data.feature_spec import FeatureSpec
from multiproc import assert_one_error, assert_ok, run_horovod, snapshot
from test_dataloading import assert_same_tree, transcribe_here
from test_flags import assert_refused, run_in_process
from test_hugectr_data import assert_same_weights
from test_main import SMALL_MODEL, final_record, main_py

SIZES = [3, 200, 40000] + [7] * 23  # TorchRec's --num_embeddings_per_feature for Criteo's 26 features
MLPERF_HOTNESS = [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1]
DAY_SAMPLES = [100, 92, 120]  # train: days 0 and 1 (192 samples); evaluation: the first 60 of day 2
BATCH, EVAL_BATCH = 64, 32  # the second train batch spans days 0 and 1; the last eval batch is partial
SIZE_FLAG = ",".join(map(str, SIZES))


def known_day(samples, seed, hotness, reduced):
    """One day's labels [n, 1] int32, dense [n, 13] float32 (ln(x + 3) of integers) and ids per
    feature [n, h] int32: any int32 (negative too) unless `reduced`, then below the sizes."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, (samples, 1)).astype(np.int32)
    dense = np.log(rng.integers(0, 70000, (samples, 13)) + 3.0).astype(np.float32)
    ids = [rng.integers(-2 ** 31, 2 ** 31 - 1, (samples, h)).astype(np.int32) for h in hotness]
    if reduced:
        ids = [np.remainder(column, size).astype(np.int32) for column, size in zip(ids, SIZES)]
    return labels, dense, ids


def write_days(folder, days, multi_hot):
    """The days as TorchRec writes them (np.save), the ids as one [n, 26] array or an np.savez archive."""
    os.makedirs(folder)
    for day, (labels, dense, ids) in enumerate(days):
        np.save(os.path.join(folder, f"day_{day}_labels.npy"), labels)
        np.save(os.path.join(folder, f"day_{day}_dense.npy"), dense)
        if multi_hot:
            np.savez(os.path.join(folder, f"day_{day}_sparse_multi_hot.npz"), **{str(j): v for j, v in enumerate(ids)})
        else:
            np.save(os.path.join(folder, f"day_{day}_sparse.npy"), np.concatenate(ids, axis=1))


def write_split_binary(folder, days, hotness):
    """The same samples as split-binary: days 0 .. N-2 train, the first half of day N-1 test, ids
    modulo the sizes, dense values as float16."""
    spec = FeatureSpec.get_default_feature_spec(13, SIZES, folder, hotness)
    last = math.ceil(len(days[-1][0]) / 2)
    with split_binary.SplitBinaryWriter(spec) as writer:
        for mapping, parts in (("train", [(d, len(d[0])) for d in days[:-1]]), ("test", [(days[-1], last)])):
            for (labels, dense, ids), rows in parts:
                reduced = [np.remainder(v[:rows], size) for v, size in zip(ids, SIZES)]
                writer.append(mapping, dense[:rows].astype(np.float16), labels[:rows, 0],
                              [v[:, 0] if v.shape[1] == 1 else v for v in reduced])
        writer.commit()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Folders: `onehot` and `multihot` (any int32 ids, reduced by --num_embeddings_per_feature),
    `onehot_spec` (ids below the sizes, a V5 feature spec in the folder), and the split-binary
    folders holding their samples."""
    root = str(tmp_path_factory.mktemp("torchrec"))
    paths = {name: os.path.join(root, name) for name in ("onehot", "multihot", "onehot_spec", "onehot_binary",
                                                          "multihot_binary")}
    for name, hotness in (("onehot", [1] * 26), ("multihot", MLPERF_HOTNESS)):
        days = [known_day(n, seed, hotness, reduced=False) for seed, n in enumerate(DAY_SAMPLES)]
        write_days(paths[name], days, multi_hot=name == "multihot")
        write_split_binary(paths[f"{name}_binary"], days, hotness)
    reduced = [known_day(n, seed, [1] * 26, reduced=True) for seed, n in enumerate(DAY_SAMPLES)]
    write_days(paths["onehot_spec"], reduced, multi_hot=False)
    FeatureSpec.get_fileless_feature_spec(13, SIZES).to_yaml(os.path.join(paths["onehot_spec"], "feature_spec.yaml"))
    return paths


def load(paths, layout, **extra):
    if layout.endswith("_binary"):
        return datasets.load_feature_spec(dataset_type="tf_raw", dataset_path=paths[layout])
    sizes = {} if layout == "onehot_spec" else {"num_embeddings_per_feature": SIZES}
    return datasets.load_feature_spec(dataset_type="torchrec_npy", dataset_path=paths[layout], **{**sizes, **extra})


def pipelines(paths, layout, **config):
    dataset_type = "tf_raw" if layout.endswith("_binary") else "torchrec_npy"
    return dataloader.create_input_pipelines(load(paths, layout), dataloader.PipelineConfig(
        dataset_type=dataset_type, train_batch_size=BATCH, eval_batch_size=EVAL_BATCH, **config))


def elements(dataset):
    with pipeline_errors.surface_data_errors():
        return [(labels.numpy(), features[NUMERICAL_KEY].numpy(), [ids.numpy() for ids in features[CATEGORICAL_KEY]])
                for features, labels in dataset]


def assert_same_elements(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for u, v in zip([x[0], x[1], *x[2]], [y[0], y[1], *y[2]], strict=True):
            assert u.dtype == v.dtype and u.shape == v.shape
            np.testing.assert_array_equal(u, v)


@pytest.mark.parametrize("layout, binary", [("onehot", "onehot_binary"), ("onehot_spec", "onehot_binary"),
                                            ("multihot", "multihot_binary")])
@pytest.mark.parametrize("world_size, rank, reads", [
    (1, 0, None), (2, 1, TableReads((0, 2, 20, 25), global_batch=True)), (4, 3, TableReads((1, 20), global_batch=False))])
def test_days_serve_the_batches_of_the_same_samples_in_split_binary(data, layout, binary, world_size, rank, reads):
    config = dict(world_size=world_size, rank=rank, reads=reads)
    ours, theirs = pipelines(data, layout, validate_data=True, **config), pipelines(data, binary, **config)
    assert (ours.train_steps, ours.eval_steps) == (theirs.train_steps, theirs.eval_steps) == (3, 2)
    assert ours.feature_spec.cardinalities == SIZES and ours.feature_spec.hotness == theirs.feature_spec.hotness
    for mapping in ("train", "test"):
        assert_same_elements(elements(getattr(ours, mapping)), elements(getattr(theirs, mapping)))


def test_the_spec_comes_from_the_files_and_the_sizes(data):
    spec = load(data, "multihot")
    assert spec.hotness == MLPERF_HOTNESS and len(spec.numerical_names) == 13 and spec.source_spec is None
    assert torchrec_data.layout(spec) == torchrec_data.Layout(days=3, multi_hot=True, modulo=True)
    spec = load(data, "onehot_spec")
    assert torchrec_data.layout(spec) == torchrec_data.Layout(days=3, multi_hot=False, modulo=False)
    assert spec.cardinalities == SIZES and spec.alphas == [1.45] * 26  # the folder's spec's properties kept
    assert load(data, "onehot_spec", num_embeddings_per_feature=SIZES).cardinalities == SIZES  # both: agreeing
    # every array is a view of its file mapped whole, never a copy of the day: the 26 members of an
    # archive share one mapping (one descriptor, whatever the number of features)
    descriptors = len(os.listdir("/proc/self/fd"))
    day = torchrec_data.open_day(data["multihot"], 0, multi_hot=True)
    assert len(os.listdir("/proc/self/fd")) == descriptors + 3
    assert all(isinstance(member.array, np.memmap) for member in day.members)
    assert isinstance(torchrec_data.open_day(data["onehot"], 0, multi_hot=False).sparse.array, np.memmap)


def test_fortran_order_arrays_are_read_as_stored(tmp_path):
    folder, days = small_folder(tmp_path, multi_hot=True)
    np.save(os.path.join(folder, "day_1_dense.npy"), np.asfortranarray(days[1][1]))
    np.savez(os.path.join(folder, "day_1_sparse_multi_hot.npz"), **{str(j): np.asfortranarray(v)
                                                                     for j, v in enumerate(days[1][2])})
    day = torchrec_data.open_day(folder, 1, multi_hot=True)
    np.testing.assert_array_equal(day.dense.array, days[1][1])
    for member, ids in zip(day.members, days[1][2], strict=True):
        np.testing.assert_array_equal(member.array, ids)


def test_transcribe_converts_both_layouts_to_the_same_split_binary(data, tmp_path, capsys):
    written = transcribe.transcribe("torchrec_npy", data["onehot"], str(tmp_path / "onehot"), "tf_raw",
                                    src_batch_size=48, num_embeddings_per_feature=SIZES)
    assert written == {"train": 4, "test": 2}  # 192 and 60 samples: the last batch of each partial
    assert_same_tree(data["onehot_binary"], str(tmp_path / "onehot"))
    result = transcribe_here(capsys, "--src_dataset_type", "binary_multihot", "--src_dataset_path", data["multihot"],
                             "--num_embeddings_per_feature", SIZE_FLAG, "--src_batch_size", 48,
                             "--dst_dataset_type", "tf_raw", "--dst_dataset_path", tmp_path / "multihot")
    assert result.returncode == 0, result.stderr
    assert_same_tree(data["multihot_binary"], str(tmp_path / "multihot"))
    before = snapshot(tmp_path)
    result = transcribe_here(capsys, "--src_dataset_type", "binary_multihot", "--src_dataset_path", data["onehot"],
                             "--num_embeddings_per_feature", SIZE_FLAG, "--dst_dataset_type", "tf_raw",
                             "--dst_dataset_path", tmp_path / "refused")
    assert_one_error(result, "holds the one-hot day_<i>_sparse.npy: use --src_dataset_type torchrec_npy")
    assert snapshot(tmp_path) == before


# ---------------------------------------------------------------------------------------- training
TRAIN = SMALL_MODEL + ["--batch_size", str(BATCH), "--valid_batch_size", str(EVAL_BATCH), "--learning_rate", "0.1",
                       "--warmup_steps", "2", "--seed", "7", "--deterministic"]


def layout_args(paths, layout):
    if layout.endswith("_binary"):
        return ["--dataset_type", "tf_raw", "--dataset_path", paths[layout]]
    return ["--dataset_type", "torchrec_npy", "--dataset_path", paths[layout], "--num_embeddings_per_feature", SIZE_FLAG]


def test_training_eval_and_inference_read_the_days_in_place(data, tmp_path):
    for layout in ("onehot", "onehot_binary", "multihot", "multihot_binary"):
        assert_ok(main_py(TRAIN + layout_args(data, layout) + [
            "--save_checkpoint_path", str(tmp_path / layout), "--log_path", str(tmp_path / f"{layout}.json")]))
    for layout in ("onehot", "multihot"):
        assert_same_weights(tmp_path / layout, tmp_path / f"{layout}_binary")
        assert final_record(tmp_path / f"{layout}.json")["auc"] == final_record(tmp_path / f"{layout}_binary.json")["auc"]
    restore = ["--restore_checkpoint_path", str(tmp_path / "multihot")]
    assert_ok(main_py(TRAIN + layout_args(data, "multihot") + restore + ["--mode", "eval",
                                                                          "--log_path", str(tmp_path / "eval.json")]))
    assert final_record(tmp_path / "eval.json")["auc"] == final_record(tmp_path / "multihot_binary.json")["auc"]
    assert_ok(main_py(TRAIN + layout_args(data, "multihot") + restore + [
        "--mode", "inference", "--valid_batch_size", "4", "--max_steps", "15", "--log_path", str(tmp_path / "i.json")]))
    assert final_record(tmp_path / "i.json")["measured_batches"] == 5


def test_two_ranks_train_the_same_model_from_the_days_and_split_binary(data, tmp_path):
    for layout in ("multihot", "multihot_binary"):
        assert_ok(run_horovod(["main.py", *TRAIN, *layout_args(data, layout), "--save_checkpoint_path",
                               str(tmp_path / layout), "--log_path", str(tmp_path / f"{layout}.json")], timeout=600))
    assert_same_weights(tmp_path / "multihot", tmp_path / "multihot_binary")


# ------------------------------------------------------------------------------------------ bad input
def small_folder(tmp_path, multi_hot=False, reduced=True, days=None):
    """A fresh folder of known days (ids below the sizes) and the sizes to read it with."""
    hotness = MLPERF_HOTNESS if multi_hot else [1] * 26
    days = days or [known_day(n, seed, hotness, reduced) for seed, n in enumerate(DAY_SAMPLES)]
    folder = str(tmp_path / "days")
    write_days(folder, days, multi_hot)
    return folder, days


def refuse(folder, message_parts, sizes=None):
    """Loading and reading the folder (every value checked up front) raises ValueError naming the file;
    `sizes`: the table-size arguments (default: --num_embeddings_per_feature's)."""
    sizes = {"num_embeddings_per_feature": SIZES} if sizes is None else sizes
    with pytest.raises(ValueError) as error:
        spec = datasets.load_feature_spec(dataset_type="torchrec_npy", dataset_path=folder, **sizes)
        dataloader.create_input_pipelines(spec, dataloader.PipelineConfig(
            dataset_type="torchrec_npy", train_batch_size=BATCH, eval_batch_size=EVAL_BATCH, validate_data=True))
    for part in message_parts:
        assert part in str(error.value), str(error.value)


def test_a_truncated_npy_names_the_file(tmp_path):
    folder, _ = small_folder(tmp_path)
    path = os.path.join(folder, "day_1_dense.npy")
    os.truncate(path, os.path.getsize(path) - 8)
    refuse(folder, [path, "its header describes [92, 13] float32", "the file is truncated"])
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY")
    refuse(folder, [path, "not a NumPy .npy array"])


@pytest.mark.parametrize("part, array, words", [
    ("labels", np.zeros((92, 1), np.int64), ["dtype <i8 (int64); TorchRec's layout stores int32 (<i4)"]),
    ("dense", np.zeros((92, 13), np.float64), ["dtype <f8 (float64); TorchRec's layout stores float32"]),
    ("sparse", np.zeros((92, 26), np.int32).astype(">i4"), ["dtype >i4 (>i4); TorchRec's layout stores int32"]),
    ("dense", np.zeros(92 * 13, np.float32), ["shape [1196]; TorchRec's layout stores 2-D arrays"]),
    ("labels", np.zeros((92, 2), np.int32), ["shape [92, 2]; labels are [samples, 1]"]),
    ("dense", np.zeros((91, 13), np.float32), ["91 samples, but", "day_1_labels.npy holds 92"]),
    ("sparse", np.zeros((93, 26), np.int32), ["93 samples, but", "day_1_labels.npy holds 92"]),
    ("dense", np.zeros((92, 12), np.float32), ["12 dense values per sample, but day 0 has 13"]),
    ("sparse", np.zeros((92, 25), np.int32), ["25 features, but day 0 has 26"]),
], ids=["labels int64", "dense float64", "big endian ids", "1-D", "label width", "short dense", "long ids",
        "dense width", "feature count"])
def test_a_day_file_of_another_dtype_shape_or_length_names_the_file(tmp_path, part, array, words):
    folder, _ = small_folder(tmp_path)
    path = os.path.join(folder, f"day_1_{part}.npy")
    np.save(path, array)
    refuse(folder, [path] + words)


def test_multi_hot_archives_must_be_stored_whole_and_agree(tmp_path):
    folder, days = small_folder(tmp_path, multi_hot=True)
    path = os.path.join(folder, "day_2_sparse_multi_hot.npz")
    ids = {str(j): v for j, v in enumerate(days[2][2])}
    np.savez_compressed(path, **ids)
    refuse(folder, [f"{path} (member 0.npy): compressed (np.savez_compressed)"])
    np.savez(path, **{key: value for key, value in ids.items() if key != "25"})
    refuse(folder, [path, "must hold members 0.npy, 1.npy, ...", "missing ['25.npy']"])
    np.savez(path, **{**ids, "20": ids["20"][:, :99]})
    refuse(folder, [f"{path} (member 20.npy): 99 ids per sample of feature 20, but day 0 has 100"])
    np.savez(path, **{**ids, "3": ids["3"][:50]})
    refuse(folder, [f"{path} (member 3.npy): 50 samples, but", "day_2_labels.npy holds 120"])
    np.savez(path, **ids)
    os.truncate(path, os.path.getsize(path) - 100)
    refuse(folder, [path, "not a readable .npz archive"])


def test_ids_beyond_the_sizes_without_the_modulo_name_the_file_feature_and_sample(tmp_path):
    folder, days = small_folder(tmp_path, multi_hot=True)
    FeatureSpec.get_default_feature_spec(13, SIZES, hotness=MLPERF_HOTNESS).to_yaml(os.path.join(folder, "feature_spec.yaml"))
    spec = datasets.load_feature_spec(dataset_type="torchrec_npy", dataset_path=folder)
    days[1][2][20][5, 7] = 7
    np.savez(os.path.join(folder, "day_1_sparse_multi_hot.npz"), **{str(j): v for j, v in enumerate(days[1][2])})
    words = [os.path.join(folder, "day_1_sparse_multi_hot.npz") + " (member 20.npy)", "feature 'cat_20.bin'",
             "id 7 at sample 5 (id 8 of 100)", "outside [0, 7)"]
    refuse(folder, words, sizes={})
    with pytest.raises(data_errors.DataError, match=r"id 7 at sample 5 \(id 8 of 100\)"):  # checked as read, too
        elements(dataloader.create_input_pipelines(spec, dataloader.PipelineConfig(
            dataset_type="torchrec_npy", train_batch_size=BATCH, eval_batch_size=EVAL_BATCH)).train)
    # the same ids taken modulo the sizes, as TorchRec does, are served
    flagged = datasets.load_feature_spec(dataset_type="torchrec_npy", dataset_path=folder,
                                           num_embeddings_per_feature=SIZES)
    dataloader.create_input_pipelines(flagged, dataloader.PipelineConfig(
        dataset_type="torchrec_npy", train_batch_size=BATCH, eval_batch_size=EVAL_BATCH, validate_data=True))


def test_labels_and_dense_values_are_checked(tmp_path):
    folder, days = small_folder(tmp_path)
    days[0][0][3, 0] = 2
    np.save(os.path.join(folder, "day_0_labels.npy"), days[0][0])
    refuse(folder, [os.path.join(folder, "day_0_labels.npy"), "label (mapping 'train') is 2 at sample 3"])
    days[0][0][3, 0] = 1
    np.save(os.path.join(folder, "day_0_labels.npy"), days[0][0])
    days[2][1][7, 4] = np.nan
    np.save(os.path.join(folder, "day_2_dense.npy"), days[2][1])
    refuse(folder, [os.path.join(folder, "day_2_dense.npy"), "'num_4' (mapping 'test') is nan at sample 7"])


@pytest.mark.parametrize("change, words, sizes", [
    (lambda f: os.remove(os.path.join(f, "day_1_labels.npy")), ["day_1_labels.npy: not found, but day 2 is there"], None),
    (lambda f: [os.remove(os.path.join(f, f"day_{d}_labels.npy")) for d in (1, 2)],
     ["holds day 0 only; the last day is the evaluation data"], None),
    (lambda f: [os.remove(os.path.join(f, name)) for name in os.listdir(f)],
     ["no day_0_labels.npy; a torchrec_npy folder holds"], None),
    (lambda f: os.remove(os.path.join(f, "day_2_sparse.npy")), ["day_2_sparse.npy: the sparse file not found"], None),
    (lambda f: open(os.path.join(f, "day_0_sparse_multi_hot.npz"), "wb").close(),
     ["day 0 needs either day_0_sparse.npy (one-hot) or day_0_sparse_multi_hot.npz (multi-hot); found both"], None),
    (lambda f: None, ["holds 26 features, but --num_embeddings_per_feature gives 25 sizes"],
     {"num_embeddings_per_feature": SIZES[:25]}),
    (lambda f: None, ["a torchrec_npy folder needs its table sizes: --num_embeddings_per_feature"], {}),
    (lambda f: FeatureSpec.get_fileless_feature_spec(13, [5] * 26).to_yaml(os.path.join(f, "feature_spec.yaml")),
     ["feature_spec.yaml: cardinalities [5, 5,", "disagree with --num_embeddings_per_feature [3, 200"], None),
    (lambda f: FeatureSpec.get_default_feature_spec(13, SIZES, hotness=[2] + [1] * 25).to_yaml(
        os.path.join(f, "feature_spec.yaml")), ["feature 'cat_0.bin' has hotness 2, but", "holds 1 ids per sample"],
     None),
], ids=["gap", "one day", "no days", "missing ids", "both layouts", "size count", "no sizes", "spec disagrees",
        "spec hotness"])
def test_a_folder_that_is_not_the_layout_names_what_is_wrong(tmp_path, change, words, sizes):
    folder, _ = small_folder(tmp_path)
    change(folder)
    refuse(folder, [folder] + words, sizes)


def test_main_py_exits_non_zero_naming_a_truncated_day_file(tmp_path):
    folder, _ = small_folder(tmp_path / "data")
    path = os.path.join(folder, "day_0_sparse.npy")
    os.truncate(path, 1000)
    before = snapshot(tmp_path)
    result = main_py(TRAIN + ["--dataset_type", "torchrec_npy", "--dataset_path", folder,
                              "--num_embeddings_per_feature", SIZE_FLAG, "--log_path", str(tmp_path / "log.json")])
    assert_one_error(result, path, "the file is truncated", code=2)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("args, words", [
    (["--dataset_type", "tf_raw", "--num_embeddings_per_feature", "3,4"],
     "--num_embeddings_per_feature describes --dataset_type torchrec_npy data, not tf_raw"),
    (["--dataset_type", "torchrec_npy", "--num_embeddings_per_feature", "3,x"],
     "--num_embeddings_per_feature must be a comma-separated list of integers, got 3,x"),
    (["--dataset_type", "torchrec_npy"], "needs its table sizes: --num_embeddings_per_feature"),
], ids=["flag for tf_raw", "bad sizes", "no sizes"])
def test_main_refuses_bad_torchrec_flags_in_one_line(tmp_path, capsys, args, words):
    folder, _ = small_folder(tmp_path / "data")
    before = snapshot(tmp_path)
    code, stderr = run_in_process(TRAIN + args + ["--dataset_path", folder, "--log_path", str(tmp_path / "log.json")],
                                  capsys)
    assert_refused(code, stderr, words, tmp_path, before)
