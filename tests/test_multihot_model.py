"""Multi-hot features in the model: pooled lookups against NumPy in every embedding layer, sparse
updates of repeated ids against a dense reference (TensorFlow's ops and the fused op), a checkpoint
round trip, SavedModel serving with padded ids, and the --preset mlperf_dcnv2 recipe. The 2-rank
equivalence runs are in test_hybrid.py (its multihot cases)."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from absl import flags

from recsys.training import checkpoint
from recsys.runtime import custom_ops
import main
import saved_model
from recsys.data.batch import CATEGORICAL_KEY, NUMERICAL_KEY
from embedding import DualEmbeddingGroup, FusedEmbedding, MultiTableEmbedding
from recsys.sparse.tables import pooled_lookup
from factory import ModelOptions, build_trainer
from recsys.training.model_config import DlrmSettings, TrainingSettings
from recsys.sparse.hybrid_embedding import HybridEmbedding
from recsys.training.model_config import DlrmConfig, table_widths
from multiproc import require
from recsys.training.optimizers import SGD, Adagrad, Adam
from recsys.sparse.sharding import plan_sharding
from test_flags import run_in_process
from test_main import SMALL

CARDINALITIES = [11, 5, 9, 7, 13]
DIM = 4
POOLINGS = ["sum", "sum", "mean", "sum", "mean"]
HOTNESS = [1, 3, 4, 5, 2]
BATCH = 6


def id_forms(rng: np.random.Generator, batch: int = BATCH):
    """One id tensor per table in every form: [b]; [b, 3]; ragged (empty rows, repeats); ragged; [b, 2];
    and each sample's ids as lists, for the NumPy reference."""
    rows = []
    for table, (cardinality, hotness) in enumerate(zip(CARDINALITIES, HOTNESS)):
        if table in (2, 3):  # ragged: 0..hotness ids, repeats likely in small tables
            rows.append([list(rng.integers(0, cardinality, rng.integers(0, hotness + 1))) for _ in range(batch)])
            rows[-1][1] = []  # an empty row
            rows[-1][2] = [1, 1, 1] if hotness >= 3 else [1, 1]  # one id repeated within a sample
        else:
            rows.append([list(rng.integers(0, cardinality, hotness)) for _ in range(batch)])
    tensors = []
    for table, sample_ids in enumerate(rows):
        if table in (2, 3):
            tensors.append(tf.ragged.constant(sample_ids, dtype=tf.int32, ragged_rank=1))
        elif HOTNESS[table] == 1:
            tensors.append(tf.constant([ids[0] for ids in sample_ids], tf.int32))
        else:
            tensors.append(tf.constant(sample_ids, tf.int32))
    return tuple(tensors), rows


def numpy_pooled(tables, rows):
    """[b, sum of widths]: each sample's table rows summed, or averaged (an empty row: zeros)."""
    out = []
    for table, sample_ids, pooling in zip(tables, rows, POOLINGS):
        pooled = np.stack([table[ids].sum(axis=0) if ids else np.zeros(table.shape[1]) for ids in sample_ids])
        if pooling == "mean":
            pooled = pooled / np.maximum(1, np.array([len(ids) for ids in sample_ids]))[:, None]
        out.append(pooled)
    return np.concatenate(out, axis=1)


def layers():
    """Every layer type over the same tables: multitable, fused, the CPU tier, the hybrid layer."""
    plan = plan_sharding(CARDINALITIES, (DIM,) * len(CARDINALITIES), 1, hotness=HOTNESS, poolings=POOLINGS)
    return {"multitable": MultiTableEmbedding(CARDINALITIES, DIM, poolings=POOLINGS),
            "fused": FusedEmbedding(CARDINALITIES, DIM, poolings=POOLINGS),
            "cpu_tier": DualEmbeddingGroup(CARDINALITIES, (DIM,) * len(CARDINALITIES), host_tables=[1, 2],
                                           poolings=POOLINGS, device_embedding_type="fused",
                                           cpu_embedding_type="multitable"),
            "hybrid": HybridEmbedding(plan, 0, plan.reads(0))}


@pytest.mark.parametrize("kind", ["multitable", "fused", "cpu_tier", "hybrid"])
def test_every_layer_pools_like_numpy(kind):
    layer = layers()[kind]
    layer.build(None)
    rng = np.random.default_rng(0)
    tables = [rng.standard_normal((rows, DIM)).astype(np.float32) for rows in CARDINALITIES]
    views = layer.table_views() if hasattr(layer, "table_views") else layer.table_slices()
    for view, values in zip(views, tables):
        view.write_rows(0, view.rows, values)
    ids, rows = id_forms(rng)
    expected = numpy_pooled(tables, rows)
    np.testing.assert_allclose(layer(ids).numpy(), expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(tf.function(layer)(ids).numpy(), expected, rtol=1e-6, atol=1e-6)
    # The blocks the model reads: one per feature where the tables are in feature order (the CPU
    # tier's groups are not: their vectors come back as one block, reordered).
    blocks = layer(ids, as_blocks=True)
    assert len(blocks) == (1 if kind == "cpu_tier" else len(CARDINALITIES))
    np.testing.assert_allclose(tf.concat(blocks, axis=1).numpy(), expected, rtol=1e-6, atol=1e-6)


def test_one_hot_ids_take_a_plain_gather():
    table = tf.Variable(np.arange(12, dtype=np.float32).reshape(6, 2))
    graph = tf.function(lambda ids: pooled_lookup(table, ids, "mean")).get_concrete_function(
        tf.TensorSpec([None], tf.int32)).graph
    assert {op.type for op in graph.get_operations()} <= {"Placeholder", "ResourceGather", "Identity", "NoOp"}
    with pytest.raises(ValueError, match="pooling must be one of"):
        pooled_lookup(table, tf.constant([1]), "max")


def dense_reference(optimizer: str, table: np.ndarray, grads: list, rate: float) -> np.ndarray:
    """The table after one update per step, each touched row once with the sum of its gradients
    (SGD: every row; lazy Adam and Adagrad: only the touched rows)."""
    table, m, v, accumulator = table.astype(np.float64), np.zeros(table.shape), np.zeros(table.shape), \
        np.full(table.shape, 0.1)
    for step, (ids, values) in enumerate(grads, start=1):
        dense = np.zeros(table.shape)
        np.add.at(dense, ids, values)
        touched = np.unique(ids)
        g = dense[touched]
        if optimizer == "sgd":
            table -= rate * dense
        elif optimizer == "adam":
            m[touched] = 0.9 * m[touched] + 0.1 * g
            v[touched] = 0.999 * v[touched] + 0.001 * g * g
            step_size = rate * np.sqrt(1 - 0.999 ** step) / (1 - 0.9 ** step)
            table[touched] -= step_size * m[touched] / (np.sqrt(v[touched]) + 1e-7)
        else:
            accumulator[touched] += g * g
            table[touched] -= rate * g / (np.sqrt(accumulator[touched]) + 1e-7)
    return table


@pytest.mark.parametrize("fused", [False, True], ids=["tensorflow_ops", "fused_op"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adagrad"])
def test_repeated_ids_update_like_the_dense_reference(optimizer, fused):
    """Gradients of ids repeated within a sample and across samples, through the pooled lookups of
    a fused table (several features in one variable), accumulate; lazy Adam and Adagrad update each
    touched row once per step and leave the others alone."""
    if fused:
        require(custom_ops.op_package.is_built(), "the custom op library is not built")
    make = {"sgd": SGD, "adam": Adam, "adagrad": Adagrad}[optimizer]
    with tf.device("/CPU:0"):
        layer = FusedEmbedding(CARDINALITIES, DIM, poolings=POOLINGS)
        layer.build(None)
    start = layer.table.numpy()
    opt = make(fused_sparse_updates=fused)
    opt.build([layer.table])
    assert opt._fuses(layer.table) == fused
    rng = np.random.default_rng(5)
    recorded = []
    for _ in range(3):
        ids, _ = id_forms(rng)
        weights = tf.constant(rng.standard_normal((BATCH, len(CARDINALITIES) * DIM)).astype(np.float32))
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(ids) * weights)
        (grad,) = tape.gradient(loss, [layer.table])
        assert isinstance(grad, tf.IndexedSlices)
        recorded.append((grad.indices.numpy(), grad.values.numpy()))
        opt.apply([(grad, layer.table)], tf.constant(0.05))
    assert any(len(np.unique(ids)) < len(ids) for ids, _ in recorded)  # repeated ids did occur
    expected = dense_reference(optimizer, start, recorded, 0.05)
    np.testing.assert_allclose(layer.table.numpy(), expected, rtol=1e-5, atol=1e-6)
    untouched = np.setdiff1d(np.arange(start.shape[0]), np.concatenate([ids for ids, _ in recorded]))
    assert untouched.size and np.array_equal(layer.table.numpy()[untouched], start[untouched])


def test_the_plan_counts_hotness_in_memory_and_exchanged_ids():
    from recsys.sparse.comm_model import StepLayout, step_collectives
    from recsys.sparse.sharding import MemoryBudget

    budget = MemoryBudget(None, optimizer_slots=1, update_rows=64)
    plan = plan_sharding([1000, 1000], (8,) * 2, 2, "basic", budget=budget, hotness=[1, 5], poolings=["sum", "mean"])
    one_hot, multi_hot = (plan.item_footprint(p) for p in sorted(plan.pieces, key=lambda p: p.table))
    assert multi_hot - one_hot == (5 - 1) * 64 * 8 * 4 * 3  # the update transient of 5x the ids
    sent = {c.name: sum(map(sum, c.sends)) for c in step_collectives(plan, StepLayout(64, data_parallel_input=True))}
    assert sent["embeddings"] == 2 * 32 * 8 * 4  # one pooled vector per sample and table, whatever the hotness
    assert sent["ids"] == 32 * (1 + 5) * 4
    assert "multi-hot: table 1 (5 ids, mean)" in plan.describe()
    with pytest.raises(ValueError, match="one pooling of"):
        plan_sharding([10], (8,), 1, poolings=["max"])


def multihot_batch(rng: np.random.Generator, batch: int = BATCH):
    ids, _ = id_forms(rng, batch)
    features = {NUMERICAL_KEY: tf.constant(rng.random((batch, 3), dtype=np.float32)), CATEGORICAL_KEY: ids}
    return features, tf.constant((rng.random((batch, 1)) < 0.5).astype(np.float32))


def multihot_trainer(embedding_type: str = "fused"):
    plan = plan_sharding(CARDINALITIES, (DIM,) * len(CARDINALITIES), 1, hotness=HOTNESS, poolings=POOLINGS)
    return build_trainer(plan, 0, plan.reads(0), ModelOptions(
        num_numerical_features=3,
        model=DlrmSettings(bottom_mlp_dims=[8, DIM], top_mlp_dims=[8, 1], interaction="cross",
                           embedding_type=embedding_type),
        training=TrainingSettings(optimizer="adagrad", learning_rate=0.1, warmup_steps=0, decay_start_step=10**9,
                                  decay_steps=1)))


def test_checkpoint_round_trip_of_a_multihot_model(tmp_path):
    trainer = multihot_trainer()
    rng = np.random.default_rng(2)
    for _ in range(3):
        trainer.train_step(*multihot_batch(rng))
    names = [f"cat_{i}" for i in range(len(CARDINALITIES))]
    state = trainer.training_state(names, "adagrad")
    path = checkpoint.save(str(tmp_path), 3, state, "multihot", keep=1)
    restored = multihot_trainer("multitable")  # another layout: the checkpoint holds the global tables
    restored_state = restored.training_state(names, "adagrad")
    checkpoint.restore(checkpoint.open_checkpoint(path), restored_state)
    features, _ = multihot_batch(rng)
    np.testing.assert_allclose(restored.model(features).numpy(), trainer.model(features).numpy(), rtol=1e-6)
    for before, after in zip(state.table_slots, restored_state.table_slots):
        np.testing.assert_array_equal(after["accumulator"].read_rows(0, after["accumulator"].rows),
                                      before["accumulator"].read_rows(0, before["accumulator"].rows))
    assert "hotness" not in state.model_config  # the checkpoint format is unchanged


def test_saved_model_serves_padded_multihot_ids_like_the_training_model(tmp_path):
    trainer = multihot_trainer()
    rng = np.random.default_rng(3)
    trainer.train_step(*multihot_batch(rng))
    export = saved_model.export(trainer.model, str(tmp_path / "export"))
    predict = saved_model.load_predict_fn(export)
    features, _ = multihot_batch(rng, 7)
    expected = trainer.model(features).numpy()
    np.testing.assert_allclose(predict(features).numpy(), expected, rtol=1e-5, atol=1e-6)
    # the signature's own layout: one column per id, PAD_ID anywhere in a multi-hot feature is no id
    padded = saved_model.padded_serving_ids(features[CATEGORICAL_KEY], HOTNESS).numpy()
    assert padded.shape == (7, sum(HOTNESS)) and (padded == saved_model.PAD_ID).any()
    shuffled = np.concatenate([padded[:, :1], padded[:, 1:4], padded[:, 4:8][:, ::-1], padded[:, 8:]], axis=1)
    serve = tf.saved_model.load(export).signatures[saved_model.SIGNATURE]
    logits = serve(numerical_features=features[NUMERICAL_KEY], categorical_features=tf.constant(shuffled))["logits"]
    np.testing.assert_allclose(logits.numpy(), expected, rtol=1e-5, atol=1e-6)
    shuffled[0, 0] = saved_model.PAD_ID  # a one-hot feature takes no padding
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"row 0, column 0 has id -1, outside \[0, 11\)"):
        serve(numerical_features=features[NUMERICAL_KEY], categorical_features=tf.constant(shuffled))


def test_mlperf_dcnv2_preset_sets_the_recipe_under_explicit_flags():
    FLAGS = flags.FLAGS
    FLAGS(["main.py", "--preset", "mlperf_dcnv2", "--learning_rate", "0.01"])
    try:
        main.apply_preset(FLAGS)
        assert (FLAGS.embedding_dim, FLAGS.interaction, FLAGS.num_cross_layers, FLAGS.cross_layer_projection_dim,
                FLAGS.optimizer) == ("128", "cross", 3, 512, "adagrad")
        assert FLAGS.bottom_mlp_dims == ["512", "256", "128"]
        assert FLAGS.top_mlp_dims == ["1024", "1024", "512", "256", "1"]
        assert FLAGS.learning_rate == 0.01  # given explicitly: kept
        config = DlrmConfig(num_numerical_features=13, cardinalities=[40_000_000] * 26,
                            embedding_dim=table_widths(main.embedding_dims(FLAGS.embedding_dim), 26, cross=True,
                                                       bottom_mlp_width=int(FLAGS.bottom_mlp_dims[-1])),
                            bottom_mlp_dims=[int(v) for v in FLAGS.bottom_mlp_dims],
                            top_mlp_dims=[int(v) for v in FLAGS.top_mlp_dims], interaction=FLAGS.interaction,
                            num_cross_layers=FLAGS.num_cross_layers,
                            cross_layer_projection_dim=FLAGS.cross_layer_projection_dim,
                            hotness=list(main.MLPERF_HOTNESS))
        config.validate()
        assert config.cross and config.dims == [128] * 26 and sum(config.feature_hotness) == 214
    finally:
        FLAGS.unparse_flags()
    names = [f"cat_{i}" for i in range(26)]
    main.check_preset_dataset("mlperf_dcnv2", list(main.MLPERF_HOTNESS), [40_000_000] * 26, names)
    with pytest.raises(main.UsageError, match="caps tables at 40000000 rows; the dataset's feature cat_3 has"):
        main.check_preset_dataset("mlperf_dcnv2", list(main.MLPERF_HOTNESS), [10] * 3 + [40_000_001] + [10] * 22,
                                  names)


def test_a_dataset_that_is_not_the_recipes_is_one_error(tmp_path, capsys):
    code, stderr = run_in_process(SMALL + ["--preset", "mlperf_dcnv2", "--synthetic_dataset_hotness", "1",
                                           "--log_path", str(tmp_path / "log.json")], capsys)
    assert code == 2 and "Traceback" not in stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "--preset mlperf_dcnv2 needs 26 categorical features" in errors[0], stderr
