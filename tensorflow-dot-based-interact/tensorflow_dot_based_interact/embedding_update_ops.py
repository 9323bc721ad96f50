"""Python wrappers of the fused sparse embedding updates (`EmbeddingSparseSgd`,
`EmbeddingSparseAdam`, `EmbeddingSparseAdagrad`, `EmbeddingSparseRmsprop`, `EmbeddingSparseFtrl`),
CPU kernels in the same library as the dot interaction.

Each call updates the touched rows of every given table in one op, spread over the intra-op
threads. Tables and slots are float32 resource variables [rows, dim] on the CPU; `indices` are one
vector per table (cast to int64 here) and `gradients` one [len(indices), dim] float32 tensor per
table.
"""
from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from tensorflow_dot_based_interact.dot_based_interact_ops import load_op_library


def _handles(variables: Sequence[tf.Variable]) -> list:
    return [variable.handle for variable in variables]


def _indices(indices: Sequence[tf.Tensor]) -> list:
    return [tf.cast(index, tf.int64) for index in indices]


def sparse_sgd_update(tables: Sequence[tf.Variable], indices: Sequence[tf.Tensor], gradients: Sequence[tf.Tensor],
                      learning_rate: tf.Tensor) -> tf.Operation:
    """tables[i][indices[i][j]] -= learning_rate * gradients[i][j], repeated rows once per index."""
    with tf.device("/CPU:0"):
        return load_op_library().embedding_sparse_sgd(
            tables=_handles(tables), indices=_indices(indices), gradients=list(gradients),
            learning_rate=tf.cast(learning_rate, tf.float32))


def sparse_adam_update(tables: Sequence[tf.Variable], first_moments: Sequence[tf.Variable],
                       second_moments: Sequence[tf.Variable], indices: Sequence[tf.Tensor],
                       gradients: Sequence[tf.Tensor], step_size: tf.Tensor, beta_1: float, beta_2: float,
                       epsilon: float) -> tf.Operation:
    """Lazy Adam on the touched rows (each distinct row once, with the sum of its gradients);
    `step_size` is the learning rate with Adam's bias correction."""
    with tf.device("/CPU:0"):
        return load_op_library().embedding_sparse_adam(
            tables=_handles(tables), first_moments=_handles(first_moments), second_moments=_handles(second_moments),
            indices=_indices(indices), gradients=list(gradients), step_size=tf.cast(step_size, tf.float32),
            beta_1=float(beta_1), beta_2=float(beta_2), epsilon=float(epsilon))


def sparse_adagrad_update(tables: Sequence[tf.Variable], accumulators: Sequence[tf.Variable],
                          indices: Sequence[tf.Tensor], gradients: Sequence[tf.Tensor], learning_rate: tf.Tensor,
                          epsilon: float) -> tf.Operation:
    """Adagrad on the touched rows (each distinct row once, with the sum of its gradients)."""
    with tf.device("/CPU:0"):
        return load_op_library().embedding_sparse_adagrad(
            tables=_handles(tables), accumulators=_handles(accumulators), indices=_indices(indices),
            gradients=list(gradients), learning_rate=tf.cast(learning_rate, tf.float32), epsilon=float(epsilon))


def sparse_rmsprop_update(tables: Sequence[tf.Variable], rms: Sequence[tf.Variable], indices: Sequence[tf.Tensor],
                          gradients: Sequence[tf.Tensor], learning_rate: tf.Tensor, rho: tf.Tensor,
                          epsilon: float) -> tf.Operation:
    """Keras legacy RMSprop's sparse step (no momentum, not centered): every row of every `rms` slot
    decays by `rho` (touched or not, as Keras does), then each distinct touched row is updated once
    with the sum of its gradients."""
    with tf.device("/CPU:0"):
        return load_op_library().embedding_sparse_rmsprop(
            tables=_handles(tables), rms=_handles(rms), indices=_indices(indices), gradients=list(gradients),
            learning_rate=tf.cast(learning_rate, tf.float32), rho=tf.cast(rho, tf.float32), epsilon=float(epsilon))


def sparse_ftrl_update(tables: Sequence[tf.Variable], accumulators: Sequence[tf.Variable],
                       linears: Sequence[tf.Variable], indices: Sequence[tf.Tensor], gradients: Sequence[tf.Tensor],
                       learning_rate: tf.Tensor, l1: tf.Tensor, l2: tf.Tensor,
                       learning_rate_power: tf.Tensor) -> tf.Operation:
    """FTRL-proximal (TensorFlow's ApplyFtrl) on the touched rows, each distinct row once with the sum
    of its gradients; `l2` includes any beta term (Keras adds beta / (2 learning_rate))."""
    with tf.device("/CPU:0"):
        return load_op_library().embedding_sparse_ftrl(
            tables=_handles(tables), accumulators=_handles(accumulators), linears=_handles(linears),
            indices=_indices(indices), gradients=list(gradients), learning_rate=tf.cast(learning_rate, tf.float32),
            l1=tf.cast(l1, tf.float32), l2=tf.cast(l2, tf.float32),
            learning_rate_power=tf.cast(learning_rate_power, tf.float32))
