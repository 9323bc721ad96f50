"""The fused sparse embedding updates (the compiled EmbeddingSparseSgd / Adam / Adagrad) against
TensorFlow's per-table ops, and EmbeddingSparseRmsprop / EmbeddingSparseFtrl against Keras's legacy
RMSprop and Ftrl on the same tables and slots (through Wide & Deep's adapters, which read the Keras
optimizer's hyper-parameters and slots): same values to float rounding, repeated ids included,
lazy Adam touching only the given rows, bad indices refused before anything is written."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from recsys.runtime import custom_ops
from multiproc import require
from recsys.training.optimizers import SGD, Adagrad, Adam
from wide_and_deep.wd_model import fused_ftrl_step, fused_rmsprop_step

SHAPES = [(50, 16), (7, 128), (1000, 8), (3, 4)]  # (rows, dim) of each table


@pytest.fixture(autouse=True)
def _op_built():
    require(custom_ops.op_package.is_built(), f"the custom op library is not built ({custom_ops.op_package.BUILD_HINT})")


def make_tables(seed: int):
    rng = np.random.default_rng(seed)
    return [tf.Variable(rng.standard_normal(shape).astype(np.float32)) for shape in SHAPES]


def gradients(step: int, index_dtype):
    """One IndexedSlices per table: many repeated ids (also within a step), some rows untouched."""
    rng = np.random.default_rng(100 + step)
    grads = []
    for rows, dim in SHAPES:
        count = 3 * rows if rows < 10 else rows // 2
        ids = rng.integers(0, max(1, rows // 2) if rows >= 10 else rows, count)
        grads.append(tf.IndexedSlices(tf.constant(rng.standard_normal((count, dim)).astype(np.float32)),
                                      tf.constant(ids.astype(index_dtype)), tf.constant([rows, dim])))
    return grads


def run(optimizer_factory, fused: bool, steps: int, index_dtype=np.int64):
    tables = make_tables(0)
    optimizer = optimizer_factory(fused)
    optimizer.build(tables)
    apply = tf.function(lambda grads, rate: optimizer.apply(list(zip(grads, tables)), rate))
    for step in range(steps):
        apply(gradients(step, index_dtype), tf.constant(0.05 * (step + 1)))
    return tables, optimizer


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_fused_sgd_equals_the_tensorflow_scatter(index_dtype):
    fused, optimizer = run(lambda f: SGD(fused_sparse_updates=f), True, 3, index_dtype)
    assert optimizer.fused_sparse_updates
    reference, _ = run(lambda f: SGD(fused_sparse_updates=f), False, 3, index_dtype)
    for a, b in zip(fused, reference):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-6)


def test_fused_lazy_adam_equals_the_tensorflow_ops_and_leaves_untouched_rows():
    factory = lambda f: Adam(0.8, 0.9, fused_sparse_updates=f)  # noqa: E731
    fused, fused_opt = run(factory, True, 4)
    reference, reference_opt = run(factory, False, 4)
    start = make_tables(0)
    for table, ref, initial, (rows, _) in zip(fused, reference, start, SHAPES):
        np.testing.assert_allclose(table.numpy(), ref.numpy(), rtol=2e-5, atol=2e-6)
        for slot in ("m", "v"):
            np.testing.assert_allclose(fused_opt.slot_variables(table)[slot].numpy(),
                                       reference_opt.slot_variables(ref)[slot].numpy(), rtol=2e-5, atol=1e-7)
        if rows >= 10:  # only ids below rows // 2 were ever given
            np.testing.assert_array_equal(table.numpy()[rows // 2:], initial.numpy()[rows // 2:])
            assert not np.array_equal(table.numpy()[:rows // 2], initial.numpy()[:rows // 2])


def test_fused_adagrad_equals_the_tensorflow_ops_and_leaves_untouched_rows():
    factory = lambda f: Adagrad(fused_sparse_updates=f)  # noqa: E731
    fused, fused_opt = run(factory, True, 4)
    reference, reference_opt = run(factory, False, 4)
    for table, ref, initial, (rows, _) in zip(fused, reference, make_tables(0), SHAPES):
        np.testing.assert_allclose(table.numpy(), ref.numpy(), rtol=2e-5, atol=2e-6)
        accumulator = fused_opt.slot_variables(table)["accumulator"].numpy()
        np.testing.assert_allclose(accumulator, reference_opt.slot_variables(ref)["accumulator"].numpy(), rtol=2e-5)
        if rows >= 10:
            np.testing.assert_array_equal(accumulator[rows // 2:], 0.1)  # untouched rows keep the initial value
            np.testing.assert_array_equal(table.numpy()[rows // 2:], initial.numpy()[rows // 2:])


def test_dense_adagrad_follows_the_keras_formula():
    variable = tf.Variable([1.0, -2.0])
    optimizer = Adagrad()
    optimizer.build([variable])
    for _ in range(2):
        optimizer.apply([(tf.constant([0.5, 1.0]), variable)], tf.constant(0.1))
    expected, accumulator = np.array([1.0, -2.0]), np.full(2, 0.1)
    for _ in range(2):
        accumulator += np.array([0.5, 1.0]) ** 2
        expected -= 0.1 * np.array([0.5, 1.0]) / (np.sqrt(accumulator) + 1e-7)
    np.testing.assert_allclose(variable.numpy(), expected, rtol=1e-6)


def test_a_large_table_split_over_threads_equals_the_serial_update():
    """Enough rows per table that the op cuts each into parts updated by several threads."""
    rng = np.random.default_rng(3)
    values = rng.standard_normal((20000, 64)).astype(np.float32)
    ids = tf.constant(rng.integers(0, 20000, 8192))
    grad = tf.IndexedSlices(tf.constant(rng.standard_normal((8192, 64)).astype(np.float32)), ids)
    results = []
    for fused in (True, False):
        table = tf.Variable(values)
        optimizer = Adam(fused_sparse_updates=fused)
        optimizer.build([table])
        optimizer.apply([(grad, table)], tf.constant(0.01))
        results.append(table.numpy())
    np.testing.assert_allclose(results[0], results[1], rtol=2e-5, atol=2e-6)


def test_an_index_out_of_range_is_refused_before_any_table_is_written():
    tables = make_tables(0)
    before = [t.numpy() for t in tables]
    grads = gradients(0, np.int64)
    bad = grads[2]
    grads[2] = tf.IndexedSlices(bad.values, tf.tensor_scatter_nd_update(bad.indices, [[1]], [1000]), bad.dense_shape)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"index 1000 \(position 1\) of table 2 is outside \[0, 1000\)"):
        custom_ops.op_package.sparse_sgd_update(tables, [g.indices for g in grads], [g.values for g in grads], 0.1)
    for table, initial in zip(tables, before):
        np.testing.assert_array_equal(table.numpy(), initial)


def test_mismatched_gradients_and_shared_variables_are_refused():
    tables = make_tables(0)
    ids = tf.constant([0, 1], tf.int64)
    with pytest.raises(tf.errors.InvalidArgumentError, match="table 0 .* do not match"):
        custom_ops.op_package.sparse_sgd_update(tables[:1], [ids], [tf.zeros([2, 3])], 0.1)
    with pytest.raises(tf.errors.InvalidArgumentError, match="the same variable is passed twice"):
        custom_ops.op_package.sparse_sgd_update([tables[0], tables[0]], [ids, ids], [tf.zeros([2, 16])] * 2, 0.1)


def test_tables_the_op_does_not_take_use_the_tensorflow_ops():
    """A bfloat16 table is not the op's (float32 only): the optimizer updates it with TF's scatter."""
    table = tf.Variable(tf.ones([4, 8], tf.bfloat16))
    optimizer = SGD()
    assert not optimizer._fuses(table)
    optimizer.apply([(tf.IndexedSlices(tf.ones([2, 8], tf.bfloat16), tf.constant([1, 1])), table)], tf.constant(0.5))
    np.testing.assert_array_equal(table.numpy().astype(np.float32)[:, 0], [1, 0, 1, 1])



def keras_and_fused(factory, fused_update, shapes, rates, slot_init=None):
    """The same tables and IndexedSlices (repeated ids, the upper half of each table never touched), one
    step per learning rate in `rates`, through a Keras legacy optimizer's apply_gradients and through
    `fused_update(optimizer, tables, grads)` with a second optimizer's own slots; `factory(rate)`
    builds an optimizer reading the variable `rate`. Returns both (optimizer, tables)."""
    rate = tf.Variable(rates[0])
    runs = []
    for _ in range(2):
        rng = np.random.default_rng(7)
        tables = [tf.Variable(rng.standard_normal(shape).astype(np.float32)) for shape in shapes]
        optimizer = factory(rate)
        optimizer._create_all_weights(tables)
        if slot_init is not None:
            for table in tables:
                slot_init(optimizer, table, np.random.default_rng(8))
        runs.append((optimizer, tables))
    (keras, keras_tables), (fused, fused_tables) = runs
    for step, value in enumerate(rates):
        rate.assign(value)
        rng = np.random.default_rng(200 + step)
        grads = []
        for rows, dim in shapes:
            count = max(3 * rows // 4, 4)
            ids = rng.integers(0, max(rows // 2, 2), count)  # rows from max(rows // 2, 2) on never touched
            grads.append(tf.IndexedSlices(tf.constant(rng.standard_normal((count, dim)).astype(np.float32)),
                                          tf.constant(ids), tf.constant([rows, dim], tf.int64)))
        keras.apply_gradients(zip(grads, keras_tables))
        fused_update(fused, fused_tables, grads)
    return runs


def assert_same_state(runs, slot_names):
    """Both runs' tables and slots equal within float32 rounding (relative to each array's largest
    value: FTRL's linear slot is a sum of terms that partly cancel)."""
    (keras, keras_tables), (fused, fused_tables) = runs
    for keras_table, fused_table in zip(keras_tables, fused_tables):
        pairs = [(fused_table, keras_table)] + [(fused.get_slot(fused_table, s), keras.get_slot(keras_table, s))
                                                for s in slot_names]
        for ours, reference in pairs:
            reference = reference.numpy()
            np.testing.assert_allclose(ours.numpy(), reference, rtol=2e-5, atol=2e-6 * max(1, np.abs(reference).max()))


def random_rms(optimizer, table, rng):
    """Non-zero rms slots, so that the decay of untouched rows shows."""
    optimizer.get_slot(table, "rms").assign(rng.random(table.shape).astype(np.float32))


RATES = [0.01, 0.003, 0.02]
LARGE = [(20000, 64), (300, 1)]  # the first cut into parts and decay blocks over several threads


@pytest.mark.parametrize("shapes", [SHAPES, LARGE], ids=["small", "large"])
def test_fused_rmsprop_equals_keras_legacy_rmsprop_untouched_rows_decaying(shapes):
    runs = keras_and_fused(lambda rate: tf.keras.optimizers.legacy.RMSprop(lambda: rate.read_value(), rho=0.5),
                           fused_rmsprop_step, shapes, RATES, random_rms)
    assert_same_state(runs, ["rms"])
    (_, _), (fused, tables) = runs
    for (rows, dim), table in zip(shapes, tables):  # untouched rows: rms decayed by rho three times
        touched = max(rows // 2, 2)
        start = np.random.default_rng(8).random((rows, dim)).astype(np.float32)
        np.testing.assert_array_equal(fused.get_slot(table, "rms").numpy()[touched:], start[touched:] * np.float32(0.125))


@pytest.mark.parametrize("shapes", [SHAPES, LARGE], ids=["small", "large"])
@pytest.mark.parametrize("settings", [{}, {"learning_rate_power": -0.7, "initial_accumulator_value": 0.3,
                                          "l1_regularization_strength": 0.01, "l2_regularization_strength": 0.1,
                                          "beta": 0.2}], ids=["wide_and_deep", "regularised"])
def test_fused_ftrl_equals_keras_legacy_ftrl(shapes, settings):
    runs = keras_and_fused(lambda rate: tf.keras.optimizers.legacy.Ftrl(lambda: rate.read_value(), **settings),
                           fused_ftrl_step, shapes, [0.02, 0.05, 0.01])
    assert_same_state(runs, ["accumulator", "linear"])


def test_rmsprop_and_ftrl_refuse_bad_slots_indices_and_rates_before_writing():
    table, rms = tf.Variable(tf.ones([10, 4])), tf.Variable(tf.ones([10, 4]))
    ids, grad = tf.constant([0, 3, 3], tf.int64), tf.ones([3, 4])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"slot 0 of table 0 must be a float32 variable of shape \[10,4\]"):
        custom_ops.op_package.sparse_rmsprop_update([table], [tf.Variable(tf.ones([10, 5]))], [ids], [grad],
                                                    0.1, 0.5, 1e-7)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"index 10 \(position 2\) of table 0 is outside \[0, 10\)"):
        custom_ops.op_package.sparse_rmsprop_update([table], [rms], [tf.constant([0, 3, 10], tf.int64)], [grad],
                                                    0.1, 0.5, 1e-7)
    np.testing.assert_array_equal(rms.numpy(), 1)  # not even decayed
    np.testing.assert_array_equal(table.numpy(), 1)
    accumulator, linear = tf.Variable(tf.fill([10, 4], 0.1)), tf.Variable(tf.zeros([10, 4]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="FTRL needs learning_rate > 0"):
        custom_ops.op_package.sparse_ftrl_update([table], [accumulator], [linear], [ids], [grad], -0.02, 0.0, 0.0, -0.5)
    with pytest.raises(tf.errors.InvalidArgumentError, match="slot 1 of table 0 must be a float32 variable"):
        custom_ops.op_package.sparse_ftrl_update([table], [accumulator], [tf.Variable(tf.zeros([9, 4]))], [ids], [grad],
                                                 0.02, 0.0, 0.0, -0.5)
    np.testing.assert_array_equal(table.numpy(), 1)


def test_keras_settings_the_fused_steps_do_not_compute_are_refused():
    table, grad = tf.Variable(tf.ones([4, 2])), tf.IndexedSlices(tf.ones([1, 2]), tf.constant([0], tf.int64))
    for optimizer, step in ((tf.keras.optimizers.legacy.RMSprop(momentum=0.9), fused_rmsprop_step),
                            (tf.keras.optimizers.legacy.RMSprop(centered=True), fused_rmsprop_step),
                            (tf.keras.optimizers.legacy.Ftrl(l2_shrinkage_regularization_strength=0.1), fused_ftrl_step)):
        optimizer._create_all_weights([table])
        with pytest.raises(ValueError, match="is not fused"):
            step(optimizer, [table], [grad])
    np.testing.assert_array_equal(table.numpy(), 1)
