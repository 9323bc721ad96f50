"""Python wrapper of `BiasReluDropout` (a dense layer's bias, ReLU and dropout in one CPU pass) and its
gradient, with the same computation written in TensorFlow ops for where the kernel is not available.

y[i, j] = relu(x[i, j] + bias[j]) / (1 - rate) where the element is kept, else 0. The mask is a hash
of (key, row_ids[i], j) (cc/kernels/relu_dropout_mask.h): no random state, no stored mask, and a row
gets the same mask whichever rank holds it, so a model trains the same on any number of ranks. The
gradient needs only the output: an element passed iff y > 0.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from tensorflow_dot_based_interact.dot_based_interact_ops import is_built, load_op_library

COLUMN_STRIDE = 0x9E3779B9
_WORD = 0xFFFFFFFF


def relu_dropout_kernel_available() -> bool:
    """True when the compiled CPU kernel can run this model: the library loads and no GPU is visible
    (the kernel is CPU-only; on a GPU the TensorFlow-ops form runs there instead)."""
    return is_built() and not tf.config.list_logical_devices("GPU")


def drop_threshold(rate: float) -> int:
    """An element is dropped when its 32-bit hash is below this: round(rate * 2^32) of the float32
    rate (the op's attribute), saturated."""
    return min(round(float(np.float32(rate)) * 2 ** 32), _WORD)


def keep_scale(rate: float) -> np.float32:
    """1 / (1 - rate) in float32 arithmetic, as the kernel computes it."""
    return np.float32(1) / (np.float32(1) - np.float32(rate))


def bias_relu_dropout(x: tf.Tensor, bias: tf.Tensor, key: tf.Tensor, row_ids: tf.Tensor, rate: float,
                      use_kernel: bool) -> tf.Tensor:
    """relu(x + bias) with dropout at `rate` (0: none) for x [rows, units]; key: two int64 words (the
    step's and the layer's), row_ids: int64 [rows], each row's identity in the global batch.
    `use_kernel`: the compiled CPU op (`relu_dropout_kernel_available()`), else the same values from TensorFlow ops."""
    if not 0 <= rate < 1:
        raise ValueError(f"dropout rate must be in [0, 1), got {rate}")
    bias = tf.cast(bias, x.dtype)
    key, row_ids = tf.cast(key, tf.int64), tf.cast(row_ids, tf.int64)
    if use_kernel:
        return load_op_library().bias_relu_dropout(x=x, bias=bias, key=key, row_ids=row_ids, rate=float(rate))
    return _in_tensorflow_ops(x, bias, key, row_ids, float(rate))


def bias_relu_grad(dy: tf.Tensor, y: tf.Tensor, rate: float = 0.0) -> tuple[tf.Tensor, tf.Tensor]:
    """The backward pass of y = relu(x + bias) with dropout at `rate` from its output alone, in one
    pass of the compiled kernel: (dx, dbias), dx = dy / (1 - rate) where y > 0 else 0, dbias its
    column sums (float32 inside). TensorFlow's ReluGrad and BiasAddGrad make two passes, the second
    a column sum that runs far below memory speed in bfloat16. Needs the compiled library
    (`relu_dropout_kernel_available`)."""
    return tuple(load_op_library().bias_relu_dropout_grad(dy=dy, y=y, rate=rate))


@tf.RegisterGradient("BiasReluDropout")
def _bias_relu_dropout_grad(op: tf.Operation, dy: tf.Tensor):
    dx, dbias = bias_relu_grad(dy, op.outputs[0], op.get_attr("rate"))
    return [dx, dbias, None, None]


def _mix(h: tf.Tensor) -> tf.Tensor:
    """MurmurHash3's 32-bit finaliser on uint32 tensors."""
    shift = tf.bitwise.right_shift
    h = tf.bitwise.bitwise_xor(h, shift(h, tf.constant(16, tf.uint32))) * tf.constant(0x85EBCA6B, tf.uint32)
    h = tf.bitwise.bitwise_xor(h, shift(h, tf.constant(13, tf.uint32))) * tf.constant(0xC2B2AE35, tf.uint32)
    return tf.bitwise.bitwise_xor(h, shift(h, tf.constant(16, tf.uint32)))


def _low_word(values: tf.Tensor) -> tf.Tensor:
    return tf.cast(tf.bitwise.bitwise_and(values, tf.constant(_WORD, tf.int64)), tf.uint32)


def keep_mask(key: tf.Tensor, row_ids: tf.Tensor, units: int, rate: float) -> tf.Tensor:
    """The kernel's mask in TensorFlow ops: bool [rows, units], True where an element is kept."""
    if rate == 0:
        return tf.ones([tf.shape(row_ids)[0], units], tf.bool)
    k0, k1 = _low_word(key[0]), _low_word(key[1])
    high = _low_word(tf.bitwise.right_shift(row_ids, tf.constant(32, tf.int64)))
    rows = tf.bitwise.bitwise_xor(_mix(tf.bitwise.bitwise_xor(_mix(tf.bitwise.bitwise_xor(_low_word(row_ids), k0)), high)),
                                  k1)
    columns = tf.cast(tf.range(units, dtype=tf.int64), tf.uint32) * tf.constant(COLUMN_STRIDE, tf.uint32)
    return _mix(rows[:, None] + columns[None, :]) >= tf.constant(drop_threshold(rate), tf.uint32)


def _in_tensorflow_ops(x: tf.Tensor, bias: tf.Tensor, key: tf.Tensor, row_ids: tf.Tensor, rate: float) -> tf.Tensor:
    """The kernel's values: float32 arithmetic, one rounding to x's dtype (NaN passes through relu)."""
    value = tf.cast(x, tf.float32) + tf.cast(bias, tf.float32)
    active = tf.where(value > 0, value * keep_scale(rate), tf.where(tf.math.is_nan(value), value, tf.zeros_like(value)))
    kept = keep_mask(key, row_ids, x.shape[1], rate)
    return tf.cast(tf.where(kept, active, tf.zeros_like(active)), x.dtype)
