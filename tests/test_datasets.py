"""Split-binary reading, per-rank slicing, bad data and the synthetic datasets, with real TF."""
import glob
import os

import numpy as np
import pytest
import tensorflow as tf

from recsys.data import batch
from recsys.data import data_errors
import datasets
from recsys.data import split_binary
from recsys.data import synthetic_data
from data_rank_worker import collect_epoch, open_pipelines
from recsys.data.feature_spec import FeatureSpec, FeatureSpecError, get_default_feature_spec
from multiproc import assert_ok, run_horovod

SPEC_FILES = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "feature_specs", "*.yaml")))


def write_known_dataset(spec, counts, seed=0):
    """Random data for `spec` written through SplitBinaryWriter; returns what was written."""
    rng = np.random.default_rng(seed)
    written = {}
    with split_binary.SplitBinaryWriter(spec) as writer:
        for mapping, n in counts.items():
            arrays = {"numerical": rng.random((n, len(spec.numerical_names))).astype(np.float16),
                      "labels": rng.integers(0, 2, n).astype(bool),
                      "categorical": [rng.integers(0, c, n) for c in spec.cardinalities]}
            writer.append(mapping, arrays["numerical"], arrays["labels"], arrays["categorical"])
            written[mapping] = arrays
        writer.commit()
    return written


def spec_in(path, directory):
    """The spec at `path`, re-rooted so its files live under `directory`."""
    spec = FeatureSpec.from_yaml(path)
    spec.base_directory, spec.path = str(directory), None
    return spec


def pipelines_for(directory, **kwargs):
    return open_pipelines(str(directory), **(dict(train_batch_size=128, eval_batch_size=128) | kwargs))


def assert_epoch_equals(epoch, arrays, rows, cat_rows=None, categorical_ids=None):
    """`epoch` (from collect_epoch) holds rows `rows` of the written `arrays`."""
    cat_rows = rows if cat_rows is None else cat_rows
    ids = range(len(arrays["categorical"])) if categorical_ids is None else categorical_ids
    np.testing.assert_array_equal(epoch["numerical"],
                                  arrays["numerical"][rows].astype(np.float32))
    np.testing.assert_array_equal(epoch["labels"], arrays["labels"][rows, None].astype(np.float32))
    for position, feature in enumerate(ids):
        np.testing.assert_array_equal(epoch[f"categorical_{position}"],
                                      arrays["categorical"][feature][cat_rows])


@pytest.mark.parametrize("path", SPEC_FILES, ids=os.path.basename)
def test_every_spec_reads_back_what_was_written(tmp_path, path):
    spec = spec_in(path, tmp_path)
    written = write_known_dataset(spec, {"train": 1000, "test": 300})
    pipelines = pipelines_for(tmp_path)
    assert (pipelines.train_steps, pipelines.eval_steps) == (7, 3)
    train, test = collect_epoch(pipelines.train), collect_epoch(pipelines.test)
    assert_epoch_equals(train, written["train"], slice(0, 7 * 128))   # last partial batch dropped
    assert_epoch_equals(test, written["test"], slice(0, 300))         # every test sample
    features, labels = next(iter(pipelines.train))
    assert features["numerical_features"].dtype == tf.float32 and labels.dtype == tf.float32
    assert all(ids.dtype == tf.int32 for ids in features["categorical_features"])
    assert features["numerical_features"].shape == (128, len(spec.numerical_names))


@pytest.mark.parametrize("path", SPEC_FILES, ids=os.path.basename)
def test_every_spec_generates_teacher_labelled_data(tmp_path, path):
    spec = spec_in(path, tmp_path)
    teacher_auc = synthetic_data.write_synthetic_dataset(spec, 2048, 1024, seed=3)
    loaded = FeatureSpec.from_yaml(str(tmp_path / "feature_spec.yaml"))
    loaded.check_feature_spec()
    assert loaded.check_files() == {"train": 2048, "test": 1024}
    assert loaded.metadata["teacher_auc"] == teacher_auc and 0.65 < teacher_auc < 0.95
    split_binary.validate_data(loaded, ["train", "test"])
    labels = np.fromfile(loaded.file_of("train", loaded.label_name), dtype=bool)
    assert 0.2 < labels.mean() < 0.8


@pytest.mark.parametrize("data_parallel", [False, True])
def test_rank_slices_together_equal_the_global_batch(tmp_path, data_parallel):
    spec = get_default_feature_spec(3, [5, 200, 70000, 9], str(tmp_path))
    written = write_known_dataset(spec, {"train": 400, "test": 250})
    world, owned = 3, {0: [0, 3], 1: [1], 2: [2]}
    epochs = {r: pipelines_for(tmp_path, train_batch_size=96, eval_batch_size=96, rank=r,
                               world_size=world, owned=None if data_parallel else owned[r])
              for r in range(world)}
    assert {(p.train_steps, p.eval_steps) for p in epochs.values()} == {(4, 3)}
    for split, total in (("train", 384), ("test", 250)):
        batches = [(start, min(96, total - start)) for start in range(0, total, 96)]
        for r, pipelines in epochs.items():
            epoch = collect_epoch(getattr(pipelines, split))
            local = np.concatenate([np.arange(start + (r * b) // world, start + ((r + 1) * b) // world)
                                    for start, b in batches])
            if data_parallel:
                assert_epoch_equals(epoch, written[split], local)
            else:
                assert_epoch_equals(epoch, written[split], local, np.arange(total), owned[r])


def test_float16_compute_dtype_and_no_numerical_features(tmp_path):
    spec = get_default_feature_spec(0, [10, 20], str(tmp_path))
    write_known_dataset(spec, {"train": 256, "test": 200})
    pipelines = pipelines_for(tmp_path, compute_dtype=tf.float16)
    features, labels = next(iter(pipelines.train))
    assert features["numerical_features"].shape == (128, 0)
    assert features["numerical_features"].dtype == tf.float16
    assert labels.shape == (128, 1)


def test_batch_order_shuffling_is_seeded_and_reshuffles_each_epoch(tmp_path):
    spec = get_default_feature_spec(1, [1000], str(tmp_path))
    written = write_known_dataset(spec, {"train": 16 * 64, "test": 64})

    def batch_order(dataset):
        firsts = [int(f["categorical_features"][0][0]) for f, _ in dataset]
        return [next(i for i in range(16) if written["train"]["categorical"][0][i * 64] == x)
                for x in firsts]

    plain = pipelines_for(tmp_path, train_batch_size=64, eval_batch_size=64)
    assert batch_order(plain.train) == list(range(16))
    first = pipelines_for(tmp_path, train_batch_size=64, eval_batch_size=64,
                          shuffle_batch_order=True, seed=7)
    second = pipelines_for(tmp_path, train_batch_size=64, eval_batch_size=64,
                           shuffle_batch_order=True, seed=7)
    epoch_1, epoch_2 = batch_order(first.train), batch_order(first.train)
    assert sorted(epoch_1) == list(range(16)) and epoch_1 != list(range(16))
    assert epoch_2 != epoch_1
    assert batch_order(second.train) == epoch_1


# ------------------------------------------------------------------------------- bad input
@pytest.fixture
def small_dataset(tmp_path):
    spec = get_default_feature_spec(2, [100, 5000], str(tmp_path))
    write_known_dataset(spec, {"train": 500, "test": 200})
    return tmp_path


@pytest.mark.parametrize("file_name, dtype, bad_value", [("cat_0.bin", np.int8, 100),
                                                         ("cat_0.bin", np.int8, -3),
                                                         ("cat_1.bin", np.int16, 5000)])
def test_validate_data_reports_an_id_outside_the_cardinality(small_dataset, file_name, dtype,
                                                             bad_value):
    path = small_dataset / "test" / file_name
    ids = np.fromfile(path, dtype=dtype)
    ids[123] = bad_value
    ids.tofile(path)
    pipelines_for(small_dataset)  # without the pass, the bad id goes unnoticed
    with pytest.raises(data_errors.DataError) as error:
        pipelines_for(small_dataset, validate_data=True)
    message = str(error.value)
    assert str(path) in message and f"'{file_name}'" in message
    assert f"id {bad_value} at sample 123" in message


@pytest.mark.parametrize("kwargs, pattern", [
    (dict(train_batch_size=512), "train batch size 512 is larger than the 500 samples"),
    (dict(eval_batch_size=256), "test batch size 256 is larger than the 200 samples"),
])
def test_batch_larger_than_the_dataset(small_dataset, kwargs, pattern):
    with pytest.raises(data_errors.DataError, match=pattern):
        pipelines_for(small_dataset, **kwargs)


@pytest.mark.parametrize("kwargs, pattern", [
    (dict(train_batch_size=100, world_size=3), r"--batch_size\) 100 .* divisible .* 3"),
    (dict(train_batch_size=99, eval_batch_size=100, world_size=3), r"--valid_batch_size\) 100"),
    (dict(rank=2, world_size=2), r"rank 2 is not in \[0, world_size=2\)"),
    (dict(owned=[1, 0]), "strictly increasing"),
    (dict(owned=[2]), r"\[0, 2\)"),
    (dict(dataset_type="parquet"), "dataset_type"),
])
def test_bad_partitioning_arguments(small_dataset, kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        pipelines_for(small_dataset, **kwargs)


def test_dataset_path_with_a_broken_spec_fails_before_reading(small_dataset):
    os.remove(small_dataset / "train" / "label.bin")
    with pytest.raises(FeatureSpecError, match="label.bin"):
        pipelines_for(small_dataset)
    with pytest.raises(ValueError, match="dataset_path is required"):
        datasets.load_feature_spec(dataset_type="tf_raw", dataset_path=None)


# ------------------------------------------------------------------------------ synthetic
def synthetic(spec_arguments=None, **kwargs):
    """Synthetic pipelines of three tables, or of the spec `load_feature_spec(**spec_arguments)` reads."""
    spec = datasets.load_feature_spec(**(spec_arguments or dict(
        dataset_type="synthetic", cardinalities=[30, 700, 9], num_numerical_features=4)))
    return open_pipelines(spec=spec, **(dict(dataset_type="synthetic", train_batch_size=512, eval_batch_size=256,
                                              synthetic_train_batches=6, synthetic_eval_batches=3, seed=11) | kwargs))


def test_synthetic_pipelines_are_learnable_shaped_and_deterministic():
    pipelines = synthetic()
    assert (pipelines.train_steps, pipelines.eval_steps) == (6, 3)
    assert 0.7 < pipelines.teacher_auc < 0.9
    assert pipelines.feature_spec.cardinalities == [30, 700, 9]
    train = collect_epoch(pipelines.train)
    assert train["numerical"].shape == (6 * 512, 4) and train["labels"].shape == (6 * 512, 1)
    assert 0.2 < train["labels"].mean() < 0.8
    assert train["categorical_1"].max() < 700 and len(np.unique(train["categorical_1"])) > 600
    again = collect_epoch(synthetic().train)
    for name in train:
        np.testing.assert_array_equal(train[name], again[name])
    other_seed = collect_epoch(synthetic(seed=12).train)
    assert not np.array_equal(train["labels"], other_seed["labels"])


def test_synthetic_rank_slices_match_the_global_batch():
    whole = collect_epoch(synthetic().test)
    parts = [collect_epoch(synthetic(rank=r, world_size=2, owned=[r]).test)
             for r in range(2)]
    batches = whole["labels"].reshape(3, 256, 1)
    np.testing.assert_array_equal(np.concatenate([p["labels"].reshape(3, 128, 1) for p in parts], 1),
                                  batches)
    for r, part in enumerate(parts):
        np.testing.assert_array_equal(part["categorical_0"], whole[f"categorical_{r}"])


def test_synthetic_pool_cycles_when_the_batches_do_not_fit():
    teacher = synthetic_data.SyntheticTeacher(2, [50, 60], seed=1)
    sample_bytes = 2 * 2 + 1 + 4 * 2
    split = synthetic_data.make_synthetic_split(teacher, 100, 7, np.random.default_rng(0),
                                          max_pool_bytes=3 * 100 * sample_bytes)
    assert split.labels.shape == (3, 100) and split.num_batches == 7
    epoch = collect_epoch(synthetic_data.synthetic_dataset(split, batch.TableReads((0, 1)), 0, 1, tf.float32))
    assert len(epoch["labels"]) == 700
    np.testing.assert_array_equal(epoch["categorical_1"][:300], epoch["categorical_1"][300:600])
    np.testing.assert_array_equal(epoch["categorical_1"][600:], epoch["categorical_1"][:100])


def test_synthetic_dimensions_from_a_feature_spec(tmp_path):
    get_default_feature_spec(2, [40, 50], str(tmp_path)).to_yaml()
    pipelines = synthetic(dict(dataset_type="synthetic", dataset_path=str(tmp_path), use_feature_spec=True))
    assert pipelines.feature_spec.cardinalities == [40, 50]
    features, _ = next(iter(pipelines.train))
    assert features["numerical_features"].shape == (512, 2)
    assert len(features["categorical_features"]) == 2


# --------------------------------------------------------------------------- two ranks
def merge_rank_slices(per_rank, batch_sizes):
    """Global rows rebuilt from each rank's concatenated local slices of every batch."""
    world = len(per_rank)
    taken, pieces = [0] * world, []
    for size in batch_sizes:
        for r in range(world):
            lo, hi = batch.local_slice(size, r, world)
            pieces.append(per_rank[r][taken[r]:taken[r] + hi - lo])
            taken[r] += hi - lo
    assert taken == [len(a) for a in per_rank]
    return np.concatenate(pieces)


def test_two_horovod_ranks_read_slices_that_make_up_the_global_batch(tmp_path):
    data, out = tmp_path / "data", tmp_path / "out"
    spec = get_default_feature_spec(3, [5, 200, 70000, 9], str(data))
    write_known_dataset(spec, {"train": 1000, "test": 250})
    out.mkdir()
    assert_ok(run_horovod([os.path.join("tests", "data_rank_worker.py"), str(data), str(out),
                           "100", "100"], np=2))
    reference = pipelines_for(data, train_batch_size=100, eval_batch_size=100)
    for split, dataset, sizes in (("train", reference.train, [100] * 10),
                                  ("test", reference.test, [100, 100, 50])):
        whole = collect_epoch(dataset)
        for mode in ("data_parallel", "model_parallel"):
            ranks = [dict(np.load(out / f"{mode}_{split}_rank{r}.npz")) for r in range(2)]
            for name in ("numerical", "labels"):
                np.testing.assert_array_equal(merge_rank_slices([a[name] for a in ranks], sizes),
                                              whole[name])
            for feature in range(4):
                if mode == "model_parallel":  # rank feature % 2 owns it, as its (feature // 2)-th
                    read = ranks[feature % 2][f"categorical_{feature // 2}"]
                else:
                    read = merge_rank_slices([a[f"categorical_{feature}"] for a in ranks], sizes)
                np.testing.assert_array_equal(read, whole[f"categorical_{feature}"])
