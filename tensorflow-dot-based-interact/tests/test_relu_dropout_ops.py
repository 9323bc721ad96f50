"""BiasReluDropout: the CPU kernel against NumPy and against its TensorFlow-ops form, the mask's
statistics and identity rule, NaN, and bad arguments."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_dot_based_interact as dbi
from tensorflow_dot_based_interact import relu_dropout_ops as rdo

pytestmark = pytest.mark.skipif(not dbi.is_built(), reason="op library not built: run `make cpu`")
BFLOAT16 = tf.bfloat16.as_numpy_dtype
KEY = tf.constant([1234567890123, 7], tf.int64)


def _inputs(rows: int, units: int, dtype, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = tf.constant(rng.normal(size=(rows, units)).astype(np.float32).astype(dtype))
    bias = tf.constant((rng.normal(size=units) * 0.3).astype(np.float32).astype(dtype))
    row_ids = tf.constant(rng.integers(0, 2 ** 40, rows), tf.int64)
    return x, bias, row_ids


def _forward_and_grads(x, bias, row_ids, rate, use_kernel, upstream):
    with tf.GradientTape() as tape:
        tape.watch([x, bias])
        y = dbi.bias_relu_dropout(x, bias, KEY, row_ids, rate, use_kernel)
        loss = tf.reduce_sum(tf.cast(y, tf.float32) * upstream)
    dx, dbias = tape.gradient(loss, [x, bias])
    return [tf.cast(t, tf.float32).numpy() for t in (y, dx, dbias)]


@pytest.mark.parametrize("dtype", [np.float32, BFLOAT16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("rate", [0.0, 0.1, 0.5])
def test_kernel_matches_numpy_and_its_tensorflow_ops_form(dtype, rate):
    """Forward and dx equal bit for bit between the kernel and the TF-ops form (float32 arithmetic, one
    rounding); both equal NumPy's relu(x + b) * mask / (1 - rate) with the mask keep_mask draws; the
    bias gradient is dx's column sum."""
    x, bias, row_ids = _inputs(300, 257, dtype)
    upstream = tf.constant(np.random.default_rng(1).normal(size=(300, 257)).astype(np.float32))
    kernel = _forward_and_grads(x, bias, row_ids, rate, True, upstream)
    ops = _forward_and_grads(x, bias, row_ids, rate, False, upstream)
    np.testing.assert_array_equal(kernel[0], ops[0])
    np.testing.assert_array_equal(kernel[1], ops[1])
    mask = rdo.keep_mask(KEY, row_ids, 257, rate).numpy()
    pre = tf.cast(x, tf.float32).numpy() + tf.cast(bias, tf.float32).numpy()
    expected = np.where(mask & (pre > 0), pre * rdo.keep_scale(rate), 0).astype(np.float32)
    np.testing.assert_array_equal(kernel[0], tf.cast(tf.cast(expected, x.dtype), tf.float32).numpy())
    dy = tf.cast(tf.cast(upstream, x.dtype), tf.float32).numpy()  # the gradient reaching y, in y's dtype
    expected_dx = np.where(kernel[0] > 0, dy * rdo.keep_scale(rate), 0).astype(np.float32)
    np.testing.assert_array_equal(kernel[1], tf.cast(tf.cast(expected_dx, x.dtype), tf.float32).numpy())
    column_sums = kernel[1].astype(np.float64).sum(axis=0)
    tolerance = 1e-4 if dtype == np.float32 else 8e-3
    np.testing.assert_allclose(kernel[2], column_sums, rtol=tolerance, atol=tolerance)


def test_mask_keeps_the_rate_and_depends_on_key_and_row_id_only():
    """Kept fraction within 5 sigma of 1 - rate overall, per row and per column; a row's mask follows
    its id wherever the row sits in the batch; another key draws another mask."""
    rows, units, rate = 4096, 512, 0.1
    row_ids = tf.range(1000, 1000 + rows, dtype=tf.int64)
    mask = rdo.keep_mask(KEY, row_ids, units, rate).numpy()
    sigma = np.sqrt(rate * (1 - rate))
    assert abs(mask.mean() - (1 - rate)) < 5 * sigma / np.sqrt(mask.size)
    assert np.abs(mask.mean(axis=0) - (1 - rate)).max() < 5 * sigma / np.sqrt(rows)
    assert np.abs(mask.mean(axis=1) - (1 - rate)).max() < 5.5 * sigma / np.sqrt(units)
    neighbours = (mask[:, :-1] & mask[:, 1:]).mean()  # adjacent columns independent: P = (1 - rate)^2
    assert abs(neighbours - (1 - rate) ** 2) < 0.005
    x = tf.ones([rows, units])
    y = dbi.bias_relu_dropout(x, tf.zeros([units]), KEY, row_ids, rate, True).numpy()
    reversed_rows = dbi.bias_relu_dropout(x, tf.zeros([units]), KEY, row_ids[::-1], rate, True).numpy()
    np.testing.assert_array_equal(y[::-1], reversed_rows)
    other = rdo.keep_mask(tf.constant([1234567890124, 7], tf.int64), row_ids, units, rate).numpy()
    assert (other != mask).mean() > 0.1


def test_nan_passes_and_bad_arguments_are_refused():
    """A NaN pre-activation stays NaN (a diverged model is not silently zeroed); a rate outside [0, 1)
    and a bias of the wrong width are errors naming them."""
    x = tf.constant([[np.nan, 1.0, -1.0]])
    y = dbi.bias_relu_dropout(x, tf.zeros([3]), KEY, tf.constant([0], tf.int64), 0.0, True).numpy()
    assert np.isnan(y[0, 0]) and y[0, 1] == 1.0 and y[0, 2] == 0.0
    with pytest.raises(ValueError, match="rate must be in"):
        dbi.bias_relu_dropout(x, tf.zeros([3]), KEY, tf.constant([0], tf.int64), 1.0, True)
    with pytest.raises(tf.errors.InvalidArgumentError, match="bias must be"):
        dbi.bias_relu_dropout(x, tf.zeros([4]), KEY, tf.constant([0], tf.int64), 0.1, True)
