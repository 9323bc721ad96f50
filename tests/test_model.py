"""Unit tests of the model pieces: metrics, LR schedule, optimizers, embeddings, the network."""
import math

import numpy as np
import pytest
import tensorflow as tf
from sklearn.metrics import log_loss, roc_auc_score

from recsys.sparse.tables import copy_table
from recsys.runtime import metrics
from lr_scheduler import LearningRateScheduler, learning_rate_at
from recsys.data.batch import CATEGORICAL_KEY, NUMERICAL_KEY
from factory import single_process_model
from model import Dlrm, dense_weight_count
from recsys.training.model_config import DlrmConfig
from recsys.training.optimizers import SGD, Adam, make_optimizers
from recsys.training.trainer import eval_points


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_exact_auc_matches_sklearn_with_ties(seed):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, 20000)
    scores = np.round(rng.normal(labels * 0.7, 1.0), 1).astype(np.float32)  # many ties
    assert abs(metrics.exact_auc(labels, scores) - roc_auc_score(labels, scores)) < 1e-6
    weights = rng.integers(1, 4, labels.size)
    assert abs(metrics.exact_auc(labels, scores, weights) - roc_auc_score(labels, scores, sample_weight=weights)) < 1e-6


def test_threshold_auc_and_log_loss():
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 2, 50000).astype(np.float32)
    logits = rng.normal(labels - 0.5, 1.0).astype(np.float32)
    exact = metrics.exact_auc(labels, logits)
    assert abs(metrics.threshold_auc(labels, logits, 8000) - exact) < 2e-3
    probabilities = 1 / (1 + np.exp(-logits.astype(np.float64)))
    assert abs(metrics.log_loss_from_logits(labels, logits) - log_loss(labels, probabilities)) < 1e-6
    assert math.isnan(metrics.exact_auc(np.ones(4), np.arange(4)))


def test_learning_rate_schedule_warmup_decay_and_clamp():
    def lr(step):
        return float(learning_rate_at(step, 24.0, warmup_steps=8000, decay_start_step=48000, decay_steps=24000))

    assert lr(0) == 0.0
    assert lr(4000) == pytest.approx(12.0)
    assert lr(8000) == pytest.approx(24.0) and lr(47999) == pytest.approx(24.0)
    assert lr(60000) == pytest.approx(24.0 * 0.25)
    assert lr(72000) == 0.0 and lr(90000) == 0.0  # the reference rose again here
    scheduler = LearningRateScheduler(1.0, 2, 4, 2)
    assert [float(scheduler.advance()) for _ in range(7)] == pytest.approx([0, 0.5, 1, 1, 1, 0.25, 0])
    assert int(scheduler.step.numpy()) == 7


def test_lazy_adam_updates_only_touched_rows_and_matches_dense_adam():
    table = tf.Variable(np.arange(12, dtype=np.float32).reshape(6, 2))
    dense_copy = tf.Variable(table.numpy())
    lazy, dense = Adam(name="lazy"), Adam(name="dense")
    lazy.build([table])
    dense.build([dense_copy])
    ids = tf.constant([1, 4, 1])
    with tf.GradientTape(persistent=True) as tape:
        loss = tf.reduce_sum(tf.gather(table, ids) ** 2)
        dense_loss = tf.reduce_sum(tf.gather(tf.convert_to_tensor(dense_copy), ids) ** 2)
    sparse_grad = tape.gradient(loss, table)
    assert isinstance(sparse_grad, tf.IndexedSlices)
    lazy.apply([(sparse_grad, table)], 0.1)
    dense.apply([(tape.gradient(dense_loss, dense_copy), dense_copy)], 0.1)
    before = np.arange(12, dtype=np.float32).reshape(6, 2)
    untouched = [0, 2, 3, 5]
    np.testing.assert_array_equal(table.numpy()[untouched], before[untouched])
    np.testing.assert_allclose(table.numpy()[[1, 4]], dense_copy.numpy()[[1, 4]], rtol=1e-6)
    assert not np.allclose(table.numpy()[[1, 4]], before[[1, 4]])


def test_sgd_sparse_and_dense_agree():
    a = tf.Variable(np.ones((4, 3), np.float32))
    b = tf.Variable(np.ones((4, 3), np.float32))
    sgd = SGD()
    grad = tf.IndexedSlices(tf.constant([[1.0, 2.0, 3.0]]), tf.constant([2]), tf.constant([4, 3]))
    sgd.apply([(grad, a), (tf.convert_to_tensor(grad), b)], 0.5)
    np.testing.assert_allclose(a.numpy(), b.numpy())
    shared_dense, shared_embedding = make_optimizers("sgd")
    assert shared_dense is shared_embedding
    dense_opt, embedding_opt = make_optimizers("adam")
    assert dense_opt is not embedding_opt


def _batch(config, batch=5, seed=0):
    rng = np.random.default_rng(seed)
    return {NUMERICAL_KEY: tf.constant(rng.random((batch, config.num_numerical_features)), tf.float32),
            CATEGORICAL_KEY: tuple(tf.constant(rng.integers(0, c, batch), tf.int32) for c in config.cardinalities)}


def _config(**overrides):
    base = dict(num_numerical_features=5, cardinalities=[7, 30, 3, 12], embedding_dim=(8,) * 4,
                bottom_mlp_dims=[16, 8], top_mlp_dims=[16, 1], interaction="tensorflow")
    base.update(overrides)
    return DlrmConfig(**base)


def _copy_weights(source: Dlrm, target: Dlrm) -> None:
    for s, t in zip(source.table_views(), target.table_views()):
        copy_table(s, t)
    targets = target.dense_weight_map()
    for name, variable in source.dense_weight_map().items():
        targets[name].assign(variable)


def test_embedding_implementations_and_cpu_offload_give_the_same_output():
    tf.keras.utils.set_random_seed(1)
    reference = single_process_model(_config(embedding_type="multitable"))
    reference.build_weights()
    batch = _batch(reference.config)
    expected = reference(batch).numpy()
    for overrides in ({"embedding_type": "fused"}, {"host_tables": [1]},
                      {"host_tables": [0, 1, 2, 3], "cpu_embedding_type": "fused"}):
        other = single_process_model(_config(**overrides))
        other.build_weights()
        _copy_weights(reference, other)
        np.testing.assert_allclose(other(batch).numpy(), expected, rtol=1e-6)
    split = single_process_model(_config(host_tables=[1]))
    assert split.embedding.placement() == ["device", "cpu", "device", "device"]


def test_network_shapes_initialisers_and_frozen_embeddings():
    tf.keras.utils.set_random_seed(2)
    model = single_process_model(_config(embedding_trainable=False))
    model.build_weights()
    assert model(_batch(model.config)).shape == (5, 1)
    assert model.embedding_variables == []
    first_bottom = model.bottom_mlp.dense_layers[0]
    assert first_bottom.kernel.shape == (8, 16)  # 5 numericals padded to 8
    first_top = model.top_mlp.dense_layers[0]
    assert first_top.kernel.shape == (8 + 10 + 6, 16)  # [bottom 8, 5*4/2 dots, padding to 24]
    assert model.top_mlp.dense_layers[-1].activation.__name__ == "linear"
    assert all(layer.activation.__name__ == "relu" for layer in model.bottom_mlp.dense_layers)
    for table in model.table_views():
        assert np.abs(table.read_rows(0, table.rows)).max() <= math.sqrt(1.0 / table.rows) + 1e-7


@pytest.mark.parametrize("overrides", [{}, {"interaction": "cross", "num_cross_layers": 2},
                                       {"interaction": "cross", "cross_layer_projection_dim": 4}])
def test_dense_weight_count_is_what_the_model_builds(overrides):
    """The arithmetic docs/scaling.md uses for configurations too large to build."""
    model = single_process_model(_config(**overrides))
    model.build_weights()
    assert dense_weight_count(model.config) == sum(v.shape.num_elements() for v in model.dense_variables)


def test_config_validation_names_the_flag():
    with pytest.raises(ValueError, match="--embedding_dim"):
        _config(bottom_mlp_dims=[16, 4]).validate()
    with pytest.raises(ValueError, match="--top_mlp_dims"):
        _config(top_mlp_dims=[16, 2]).validate()


def test_eval_points_spread_over_the_epoch():
    assert eval_points(10, 1) == [9]
    assert eval_points(10, 4) == [2, 4, 7, 9]
    assert eval_points(10, 0) == []



def test_non_finite_loss_is_read_at_print_points_and_before_checkpoints():
    """The step keeps the first NaN step on the device; the loop reads it only at progress lines,
    evaluations and checkpoints, and stops before saving anything after it."""
    from lr_scheduler import LearningRateScheduler
    from recsys.training.trainer import Evaluator, LoopConfig, NonFiniteLossError, Trainer, train_loop

    config = _config()
    model = single_process_model(config)
    model.build_weights()
    trainer = Trainer(model, *make_optimizers("sgd"), LearningRateScheduler(0.1, 0, 1000, 1000))
    features = _batch(config, batch=8)
    labels = [0.0, 0.0, float("nan"), 0.0, 0.0, 0.0, 0.0, 0.0]  # a NaN label makes step 2's loss NaN
    data = tf.data.Dataset.from_tensor_slices(labels).map(lambda label: (features, tf.fill([8, 1], label)))
    saved = []
    loop = LoopConfig(epochs=1, steps_per_epoch=len(labels), global_batch_size=8, evals_per_epoch=0,
                      print_freq=4, checkpoint_every_n_steps=2)
    with pytest.raises(NonFiniteLossError, match="NaN or Inf at step 2"):
        train_loop(trainer, Evaluator.for_model(model), data, data, loop, save_checkpoint=saved.append)
    assert saved == [2]  # the save after step 4 found the flag set; nothing after the NaN was written
    assert int(trainer.scheduler.step.numpy()) == 4  # no per-step read stopped it earlier than a check point


def test_adam_slots_are_created_without_a_full_size_temporary():
    """TensorFlow's allocator statistics (exact bytes, not RSS): building Adam's slots for a table
    peaks at the two slots themselves; a variable made from a computed tensor shows the temporary."""
    from recsys.training.optimizers import Adam

    def peak_growth(create) -> float:
        tf.config.experimental.reset_memory_stats("CPU:0")
        before = tf.config.experimental.get_memory_info("CPU:0")["current"]
        kept = create()
        growth = tf.config.experimental.get_memory_info("CPU:0")["peak"] - before
        del kept
        return growth / table_bytes

    table = tf.Variable(tf.zeros([1 << 18, 64]))  # 64 MiB
    table_bytes = 4 * (1 << 18) * 64
    optimizer = Adam()
    assert peak_growth(lambda: optimizer.build([table])) == pytest.approx(2.0, abs=0.01)  # m and v only
    assert peak_growth(lambda: tf.Variable(tf.zeros([1 << 18, 64]) + 1.0)) == pytest.approx(2.0, abs=0.01)


def test_reading_rows_of_a_sparsely_updated_table_copies_only_those_rows():
    """After a sparse update TensorFlow reads a table's whole value as a copy (copy-on-read mode);
    checkpoint reads go by rows (a gather), so a chunk costs its own bytes, not the table's."""
    from recsys.sparse.tables import TableSlice

    rows, dim = 1 << 18, 64  # 64 MiB
    table = tf.Variable(tf.zeros([rows, dim]))
    table.scatter_sub(tf.IndexedSlices(tf.ones([2, dim]), tf.constant([0, 1])))
    tf.config.experimental.reset_memory_stats("CPU:0")
    before = tf.config.experimental.get_memory_info("CPU:0")["current"]
    chunk = TableSlice(table, 0, rows).read_rows(0, 1024)
    growth = tf.config.experimental.get_memory_info("CPU:0")["peak"] - before
    np.testing.assert_array_equal(chunk[:2], -1.0)
    assert growth < 4 * 1024 * dim * 4, f"reading 1024 rows allocated {growth} bytes (the table is {rows * dim * 4})"


def test_relu_dense_backward_matches_keras_and_is_chosen_on_the_cpu():
    """The MLPs' CPU backward (model.ReluDense: the input gradient by Einsum, the ReLU + bias gradient
    by TensorFlow's ops or in one pass of the compiled kernel) gives Keras Dense's forward values and
    gradients: the same in float32 (to rounding), and in bfloat16 no farther from the float32
    gradients than TensorFlow's own ops (the kernel's bias sums run in float32)."""
    from factory import mlp_backward_here
    from model import Mlp
    from recsys.runtime.custom_ops import op_package

    if not op_package.relu_dropout_kernel_available():
        pytest.skip(f"the compiled op library is not built: {op_package.BUILD_HINT}")
    assert (mlp_backward_here(tf.bfloat16), mlp_backward_here(tf.float32)) == ("custom_cpu", "cpu")
    x = tf.random.stateless_normal([256, 16], [1, 2])

    def values_and_gradients(policy, backward):
        tf.keras.mixed_precision.set_global_policy(policy)
        try:
            mlp = Mlp([64, 32, 1], linear_last=True, name="mlp", seed=3, backward=backward)
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = tf.cast(mlp(x), tf.float32)
                loss = tf.reduce_sum(y * y)
            return y, [tf.cast(g, tf.float32) for g in tape.gradient(loss, mlp.trainable_variables + [x])]
        finally:
            tf.keras.mixed_precision.set_global_policy("float32")

    truth_y, truth = values_and_gradients("float32", "tensorflow")
    for backward in ("cpu", "custom_cpu"):
        cpu_y, cpu = values_and_gradients("float32", backward)
        np.testing.assert_allclose(cpu_y, truth_y, rtol=1e-6)
        for got, want in zip(cpu, truth):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(tf.reduce_max(tf.abs(want))),
                                       err_msg=backward)
    (_, keras_bf16), (_, fused_bf16) = values_and_gradients("mixed_bfloat16", "tensorflow"), \
        values_and_gradients("mixed_bfloat16", "custom_cpu")
    for keras_grad, fused_grad, want in zip(keras_bf16, fused_bf16, truth):
        scale = float(tf.reduce_max(tf.abs(want)))
        assert float(tf.reduce_max(tf.abs(fused_grad - want))) <= float(tf.reduce_max(tf.abs(keras_grad - want))) + 1e-3 * scale
